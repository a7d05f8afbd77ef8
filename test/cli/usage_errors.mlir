// Usage errors exit with status 2, print one `amp-opt: error:` line that says
// what is accepted, and print no module.

// RUN: sh -c 'amp-opt %s --target gpu --policy q=f32; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=KEY
// KEY-NOT: module
// KEY: amp-opt: error: unknown policy key 'q' (accepted: p|param|params, c|compute, o|output, gemm)
// KEY-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --target gpu --policy p=f32,c=bf17; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=DTYPE
// DTYPE-NOT: module
// DTYPE: amp-opt: error: unknown dtype 'bf17' for key 'c' (accepted: f32, float32, full, bf16, bfloat16, f16, float16, half, f64, float64){{$}}
// DTYPE-NEXT: exit=2

// The FP8 formats are not listed where they are refused; an FP8 name says
// where FP8 goes.
// RUN: sh -c 'amp-opt %s --target gpu --policy p=f32,c=f8; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=FP8
// FP8-NOT: module
// FP8: amp-opt: error: unknown dtype 'f8' for key 'c' (accepted: f32, float32, full, bf16, bfloat16, f16, float16, half, f64, float64); FP8 is a GEMM operand format, not a compute dtype: keep compute in bf16/f16/f32 and add gemm=f8 (for example p=f32,c=bf16,o=f32,gemm=f8)
// FP8-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --target gpu --policy p=f32,c=bf16,c=f16; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=TWICE
// TWICE: amp-opt: error: policy key 'c' given twice
// TWICE-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --target gpu --level O4; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=LEVEL
// LEVEL: amp-opt: error: unknown level 'O4' (accepted: O0, O1, O2, O3)
// LEVEL-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --target xpu; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=TARGET
// TARGET: amp-opt: error: unknown target 'xpu' (accepted: cpu, gpu, tpu)
// TARGET-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --reduce-dtype int8; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=REDUCE
// REDUCE: amp-opt: error: unknown reduce-dtype 'int8' (accepted: f32, compute, or the compute dtype: bf16, f16)
// REDUCE-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --policy p=f32,c=bf16,o=f32 --reduce-dtype f16; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=REDUCE-POLICY
// REDUCE-POLICY: amp-opt: error: reduce_dtype='f16' is neither f32 nor the compute dtype of policy p=f32,c=bf16,o=f32 (bf16): use 'f32', 'bf16' or 'compute'
// REDUCE-POLICY-NEXT: exit=2

// Delayed scaling keeps an amax history that only amp.train_step carries;
// the other scalings, and a bad one, through their flag.
// RUN: sh -c 'amp-opt %s --policy p=f32,c=bf16,o=f32,gemm=f8 --fp8-scaling delayed; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=DELAYED
// DELAYED-NOT: module
// DELAYED: amp-opt: error: fp8_scaling='delayed' keeps state across steps, which only amp.train_step carries; here use current, rowwise, mxfp8
// DELAYED-NEXT: exit=2
// RUN: sh -c 'amp-opt %s --policy p=f32,c=bf16,o=f32,gemm=f8 --fp8-scaling rowise; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=SCALING
// SCALING: amp-opt: error: unknown fp8_scaling 'rowise' (accepted: current, delayed, rowwise, mxfp8)
// SCALING-NEXT: exit=2
// RUN: sh -c 'amp-opt %s --policy p=f32,c=bf16,o=f32,gemm=f8e5m2 --fp8-scaling mxfp8; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=MXE5M2
// MXE5M2: amp-opt: error: fp8_scaling='mxfp8' stores E4M3 data and policy p=f32,c=bf16,o=f32,gemm=f8e5m2 asks for e5m2 operands: use gemm=f8 or gemm=f8e4m3fn with it
// MXE5M2-NEXT: exit=2
// RUN: sh -c 'amp-opt %s --fp8-min-size -1; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=MINSIZE
// MINSIZE: amp-opt: error: fp8_min_size must be an integer of at least 0, got -1
// MINSIZE-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --no-such-flag; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=FLAG
// FLAG: amp-opt: error: unrecognized arguments: --no-such-flag
// FLAG-NEXT: exit=2

// RUN: sh -c 'amp-opt %s.missing; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: amp-opt: error: cannot read {{.*}}usage_errors.mlir.missing: No such file or directory
// MISSING-NEXT: exit=2

// RUN: sh -c 'amp-opt %s --split-input-file --emit bytecode; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=SPLITBC
// SPLITBC: amp-opt: error: --emit=bytecode cannot be combined with --split-input-file
// SPLITBC-NEXT: exit=2

// Naming one op in both --keep-f32 and --force-compute is a usage error:
// exit 2 with an `amp-opt: error:` line.
// RUN: sh -c 'amp-opt %s --target gpu --keep-f32 tanh --force-compute stablehlo.tanh; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=CONFLICT
// CONFLICT-NOT: loc(
// CONFLICT: amp-opt: error: ops named in both keep_f32 and force_compute: stablehlo.tanh
// CONFLICT-NOT: loc(
// CONFLICT: exit=2

// A pass diagnostic seen through amp-opt carries the input's file name like
// jaxlib's diagnostics do, not `loc("-":0:0)`.
// RUN: not amp-opt %s --pass-pipeline='builtin.module(amp-insert-converts{policy=c=bf17})' 2>&1 | FileCheck %s --check-prefix=PASSDIAG
// PASSDIAG-NOT: loc(
// PASSDIAG: usage_errors.mlir{{(:[0-9]+:[0-9]+)?}}: error: invalid policy: unknown dtype 'bf17' for key 'c'

func.func public @main(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.tanh %0 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
