// --help lists the options, the policy grammar and the passes; --version
// names the package and MLIR versions. Both exit 0 and need no input.

// RUN: amp-opt --help | FileCheck %s --check-prefix=HELP
// HELP: usage: amp-opt
// HELP: exit status: 0 success, 1 invalid IR (or a failed rewrite), 2 bad usage or policy
// HELP: --policy POLICY
// HELP: --level {O0,O1,O2,O3}
// HELP: --target {cpu,gpu,tpu}
// HELP: --storage {f32,compute}
// HELP: --emit {pretty,generic,bytecode,portable}
// HELP: policy grammar:
// HELP-NEXT: p=DTYPE,c=DTYPE,o=DTYPE[,gemm=GEMM]: keys p|param|params (parameters), c|compute, o|output, gemm (matrix-multiply operands); missing keys cascade {{.*}}; dtypes f32|float32|full, bf16|bfloat16, f16|float16|half, f64|float64; GEMM dtypes compute, f8|fp8, f8e4m3fn|float8_e4m3fn, f8e5m2|float8_e5m2 {{.*}}
// HELP: amp-insert-converts
// HELP: -policy
// HELP: -keep-f32
// HELP: -force-compute
// HELP: amp-simplify-converts

// RUN: amp-opt --version | FileCheck %s --check-prefix=VERSION
// VERSION: amp-opt (stablehlo-amp) {{[0-9]+\.[0-9]+[^,]*}}, MLIR 22.{{[0-9]+}}.{{[0-9]+}}
// VERSION-EMPTY:
