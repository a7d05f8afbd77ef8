// Per-layer control: amp-insert-converts{scopes=PATTERN=CHOICE} and
// amp-fp8-gemms{scopes=...} by the scope path of an op's name (the name JAX
// gives it, without the primitive, the leading jit(f) and JAX's wrappers:
// `transpose(jvp(Net))/head` is the backward pass of `Net/head`), and the
// precision a dot asks for itself.
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 scopes=head=f32})' | FileCheck %s --check-prefix=F32
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu scopes=(mlp|head)=compute,Net/head=f32})' | FileCheck %s --check-prefix=LONGEST
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32})' | FileCheck %s --check-prefix=HIGHEST
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true scopes=head=f32})' | FileCheck %s --check-prefix=REPORT
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 policy=p=f32,c=bf16,o=f32,gemm=f8 scopes=mlp=f8},amp-fp8-gemms{scopes=mlp=f8})' | FileCheck %s --check-prefix=F8
//
// Bad entries are errors naming what is wrong.
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{scopes=hed=f32})' 2>&1 | FileCheck %s --check-prefix=NOMATCH
// NOMATCH: error: invalid option 'scopes': pattern 'hed' matches no scope (nearest: Net/head, Net/mlp)
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{scopes=head=f32,hea.=compute})' 2>&1 | FileCheck %s --check-prefix=TIE
// TIE: error: invalid option 'scopes': 'head' and 'hea.' match scope 'Net/head' equally (the longest match wins): make one of them longer
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{scopes=he(ad=f32})' 2>&1 | FileCheck %s --check-prefix=REGEX
// REGEX: error: invalid option 'scopes': pattern 'he(ad' is not a regular expression: parentheses not balanced
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{scopes=head=bf16})' 2>&1 | FileCheck %s --check-prefix=CHOICE
// CHOICE: error: invalid option 'scopes': unknown choice 'bf16' for 'head' (accepted: f32, compute, f8)
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{scopes=mlp=f8})' 2>&1 | FileCheck %s --check-prefix=NOF8
// NOF8: error: invalid option 'scopes': f8 puts a scope's GEMMs in FP8, and policy p=f32,c=bf16,o=f32 has none: add gemm=f8 to the policy

// The head's forward dot and its backward dot stay f32; the mlp's go low.
// F32-LABEL: func.func public @main(
// F32-SAME: %[[X:[^:]*]]: tensor<16x32xf32>, %[[W1:[^:]*]]: tensor<32x32xf32>, %[[W2:[^:]*]]: tensor<32x32xf32>, %[[G:[^:]*]]: tensor<16x32xf32>)
// F32: %[[H:.*]] = stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xf32>
// F32: %[[T:.*]] = stablehlo.tanh %[[H]] : tensor<16x32xf32>
// F32: stablehlo.dot_general %[[T]], %[[W2]], {{.*}}: (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// F32: stablehlo.dot_general %[[G]], %[[W2]], {{.*}}: (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// F32: stablehlo.dot_general %{{.*}}, %{{.*}}, {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xf32>

// Net/head matches both entries, Net/head by more characters: f32; the mlp
// takes the regex over the two scopes and computes in bf16.
// LONGEST-LABEL: func.func public @main(
// LONGEST: stablehlo.dot_general {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xbf16>
// LONGEST: stablehlo.tanh %{{.*}} : tensor<16x32xbf16>
// LONGEST: stablehlo.dot_general {{.*}}: (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// LONGEST: stablehlo.dot_general {{.*}}: (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// LONGEST: stablehlo.dot_general {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xbf16>

// REPORT-LABEL: func.func public @main(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {group = 0 : i64, precision = "low", reason = "matrix_multiply"}
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {detail = "head", group = {{[0-9]+}} : i64, precision = "f32", reason = "scope_f32"}
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {detail = "head", group = {{[0-9]+}} : i64, precision = "f32", reason = "scope_f32"}

// Only the mlp's GEMMs go FP8: the head's stay bf16.
// F8-LABEL: func.func public @main(
// F8: stablehlo.dot_general {{.*}}: (tensor<16x32xf8E4M3FN>, tensor<32x32xf8E4M3FN>) -> tensor<16x32xf32>
// F8: stablehlo.dot_general {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xf32>
// F8: stablehlo.dot_general {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xf32>
// F8: stablehlo.dot_general {{.*}}: (tensor<16x32xf8E4M3FN>, tensor<32x32xf8E4M3FN>) -> tensor<16x32xf32>
module @jit_step {
  func.func public @main(%x: tensor<16x32xf32>, %w1: tensor<32x32xf32>, %w2: tensor<32x32xf32>, %g: tensor<16x32xf32>) -> (tensor<16x32xf32>, tensor<16x32xf32>) {
    %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/jvp(Net)/mlp/dot_general")
    %t = stablehlo.tanh %h : tensor<16x32xf32> loc("jit(step)/jvp(Net)/mlp/tanh")
    %y = stablehlo.dot_general %t, %w2, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/jvp(Net)/head/dot_general")
    %dt = stablehlo.dot_general %g, %w2, contracting_dims = [1] x [1] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/transpose(jvp(Net))/head/dot_general")
    %dx = stablehlo.dot_general %dt, %w1, contracting_dims = [1] x [1] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/transpose(jvp(Net))/mlp/dot_general")
    return %y, %dx : tensor<16x32xf32>, tensor<16x32xf32>
  }
}

// -----

// A dot that asks for precision=HIGHEST (or HIGH) stays f32 with no option;
// the other goes low.
// HIGHEST-LABEL: func.func public @highest(
// HIGHEST: stablehlo.dot_general {{.*}}precision = [HIGHEST, HIGHEST] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// HIGHEST: stablehlo.dot_general {{.*}}precision = [DEFAULT, HIGH] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// HIGHEST: stablehlo.dot_general {{.*}}: (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xf32>
module @jit_highest {
  func.func public @highest(%x: tensor<16x32xf32>, %w: tensor<32x32xf32>) -> (tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>) {
    %a = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(f)/Net/head/dot_general")
    %b = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0], precision = [DEFAULT, HIGH] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(f)/Net/mlp/dot_general")
    %c = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(f)/Net/mlp/dot_general")
    return %a, %b, %c : tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>
  }
}
