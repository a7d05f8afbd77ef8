// amp-numerics alone: per low-precision GEMM operand, the amax and the
// counts (nonzero, underflow, saturated) of the value its rounding reads,
// appended to main as amp.gemm_amax f32[G, 2] and amp.gemm_counts
// i32[G, 2, 3]. A bf16 rounding (unclamped: saturated means rounded to inf,
// |x| >= 2^128 * (1 - 2^-9)); an FP8 quantization (clamped: saturated means
// above 448; amax of the operand before scaling); an operand computed in
// bf16 (amax and nonzero only); a rounding read by two GEMMs measured once;
// GEMMs in a loop accumulated over its iterations, a loop-invariant
// rounding measured once outside; collect=none; bad options; no main.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: amp-opt %t/bf16.mlir --pass-pipeline='builtin.module(amp-numerics{collect=stats})' | FileCheck %s --check-prefix=BF16 --implicit-check-not='is_finite %arg1'
// RUN: amp-opt %t/bf16.mlir --pass-pipeline='builtin.module(amp-numerics{collect=stats})' | FileCheck %s --check-prefix=ONCE
// RUN: amp-opt %t/fp8.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8e4m3fn},amp-numerics{collect=stats})' | FileCheck %s --check-prefix=FP8
// RUN: amp-opt %t/fp8.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8e5m2 scaling=rowwise},amp-numerics{collect=stats})' | FileCheck %s --check-prefix=E5M2
// RUN: amp-opt %t/product.mlir --pass-pipeline='builtin.module(amp-numerics{collect=stats})' | FileCheck %s --check-prefix=PRODUCT
// RUN: amp-opt %t/loop.mlir --pass-pipeline='builtin.module(amp-numerics{collect=stats})' | FileCheck %s --check-prefix=LOOP
// RUN: amp-opt %t/bf16.mlir --pass-pipeline='builtin.module(amp-numerics{collect=none})' | FileCheck %s --check-prefix=NONE
// RUN: not amp-opt %t/bf16.mlir --pass-pipeline='builtin.module(amp-numerics{collect=provenanse})' 2>&1 | FileCheck %s --check-prefix=BADOPTION
// RUN: not amp-opt %t/nomain.mlir --pass-pipeline='builtin.module(amp-numerics{collect=stats})' 2>&1 | FileCheck %s --check-prefix=NOMAIN
// RUN: not amp-opt %t/twice.mlir --pass-pipeline='builtin.module(amp-numerics{collect=stats})' 2>&1 | FileCheck %s --check-prefix=TWICE

// BADOPTION: error: invalid option 'collect': unknown numerics 'provenanse' (accepted: none, stats, provenance)
// NOMAIN: error: amp-numerics: no function 'main' to return its measurements from
// TWICE: error: amp-numerics: main already returns what it measures (amp.gemm_amax)

//--- bf16.mlir

// Three GEMMs: %x's rounding feeds the first and the third (measured once),
// %w is computed in bf16 (no rounding at its GEMM), %h's and %v's roundings
// feed the second.
// BF16-LABEL: func.func @main
// BF16-SAME: -> (tensor<4x16xf32>, tensor<8x8xf32>, tensor<3x2xf32> {amp.gemm_amax}, tensor<3x2x3xi32> {amp.gemm_counts})
// %w: its amax and nonzero count only.
// BF16: %[[WABS:.*]] = stablehlo.abs %arg1 : tensor<8x8xbf16>
// BF16: stablehlo.compare GT, %[[WABS]]
// %x: nonzero, underflow (|x| <= 2^-134), saturated (finite, |x| >=
// 2^128 * (1 - 2^-9)), amax, from one |x|.
// BF16: %[[XABS:.*]] = stablehlo.abs %arg0 : tensor<4x8xf32>
// BF16: stablehlo.compare GT, %[[XABS]]
// BF16: stablehlo.constant dense<4.591770e-41> : tensor<f32>
// BF16: stablehlo.compare LE, %[[XABS]]
// BF16: stablehlo.is_finite %arg0
// BF16: stablehlo.constant dense<3.39617753E+38> : tensor<f32>
// BF16: stablehlo.compare GE, %[[XABS]]
// One pass over the elements: a variadic reduction of |x| (maximum) and
// the three indicators (add).
// BF16: stablehlo.reduce(%[[XABS]] init: {{.*}}), ({{.*}}), ({{.*}}), ({{.*}}) across dimensions = [0, 1] : (tensor<4x8xf32>, tensor<4x8xi32>, tensor<4x8xi32>, tensor<4x8xi32>, tensor<f32>, tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<f32>, tensor<i32>, tensor<i32>, tensor<i32>)
// BF16-NEXT: reducer
// BF16-NEXT: stablehlo.maximum
// BF16-COUNT-3: stablehlo.add
// BF16: %[[XB:.*]] = stablehlo.convert %arg0 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// BF16: %[[G1:.*]] = stablehlo.dot_general %[[XB]], %arg1
// Its result waits for the measurements of both its operands: it is
// `g1 - min(count %w, count %x, 0)`, exactly g1, so XLA cannot put them
// off to the end of the step. The next GEMM's operand is that value.
// BF16-NEXT: %[[NIL:.*]] = stablehlo.constant dense<0> : tensor<i32>
// BF16-NEXT: %[[LEAST1:.*]] = stablehlo.minimum %{{.*}}#1, %[[NIL]] : tensor<i32>
// BF16-NEXT: %[[LEAST:.*]] = stablehlo.minimum %{{.*}}#1, %[[LEAST1]] : tensor<i32>
// BF16-NEXT: %[[ZERO:.*]] = stablehlo.convert %[[LEAST]] : (tensor<i32>) -> tensor<f32>
// BF16-NEXT: %[[ZEROS:.*]] = stablehlo.broadcast_in_dim %[[ZERO]], dims = [] : (tensor<f32>) -> tensor<4x8xf32>
// BF16-NEXT: %[[H:.*]] = stablehlo.subtract %[[G1]], %[[ZEROS]] : tensor<4x8xf32>
// BF16-NEXT: stablehlo.abs %[[H]]
// BF16: stablehlo.convert %[[H]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// BF16: %[[AMAX:.*]] = stablehlo.concatenate {{.*}} : (tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<6xf32>
// BF16: stablehlo.reshape %[[AMAX]] : (tensor<6xf32>) -> tensor<3x2xf32>
// BF16: stablehlo.concatenate {{.*}} -> tensor<18xi32>
// BF16: return {{.*}} : tensor<4x16xf32>, tensor<8x8xf32>, tensor<3x2xf32>, tensor<3x2x3xi32>
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xbf16>, %v: tensor<8x16xf32>) -> (tensor<4x16xf32>, tensor<8x8xf32>) {
  %xb = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %h = stablehlo.dot_general %xb, %w, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
  %hb = stablehlo.convert %h : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %vb = stablehlo.convert %v : (tensor<8x16xf32>) -> tensor<8x16xbf16>
  %y = stablehlo.dot_general %hb, %vb, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
  %g = stablehlo.dot_general %xb, %hb, contracting_dims = [0] x [0] : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<8x8xf32>
  return %y, %g : tensor<4x16xf32>, tensor<8x8xf32>
}

// ONCE-COUNT-1: stablehlo.is_finite %arg0
// ONCE-NOT: stablehlo.is_finite %arg0

// NONE-LABEL: func.func @main
// NONE-SAME: -> (tensor<4x16xf32>, tensor<8x8xf32>) {
// NONE-NOT: stablehlo.reduce

//--- fp8.mlir

// The quantization's clamped input is measured: saturated above 448
// (e4m3fn's largest), underflow at |x| <= 2^-10 (half its smallest
// subnormal, 2^-9); the amax is the operand's before the scale divides it.
// FP8-LABEL: func.func @main
// FP8-SAME: tensor<1x2xf32> {amp.gemm_amax}, tensor<1x2x3xi32> {amp.gemm_counts}
// FP8: %[[SCALED:.*]] = stablehlo.divide %[[WIDE:.*]], %{{.*}} : tensor<16x32xf32>
// FP8: %[[ABS:.*]] = stablehlo.abs %[[SCALED]] : tensor<16x32xf32>
// FP8: stablehlo.constant dense<9.765625E-4> : tensor<f32>
// FP8: stablehlo.compare LE, %[[ABS]]
// FP8: stablehlo.is_finite %[[SCALED]]
// FP8: stablehlo.constant dense<4.480000e+02> : tensor<f32>
// FP8: stablehlo.compare GT, %[[ABS]]
// FP8: stablehlo.abs %[[WIDE]] : tensor<16x32xf32>
// FP8: stablehlo.clamp {{.*}}, %[[SCALED]], {{.*}} -> tensor<16x32xf32>
// FP8: stablehlo.dot_general {{.*}} : (tensor<16x32xf8E4M3FN>, tensor<32x64xf8E4M3FN>)

// e5m2, rowwise: underflow at |x| <= 2^-17, saturated above 57344.
// E5M2: stablehlo.constant dense<7.62939453E-6> : tensor<f32>
// E5M2: stablehlo.constant dense<5.734400e+04> : tensor<f32>
// E5M2: stablehlo.dot_general {{.*}} : (tensor<16x32xf8E5M2>, tensor<32x64xf8E5M2>)
func.func @main(%x: tensor<16x32xf32>, %w: tensor<32x64xf32>) -> tensor<16x64xf32> {
  %xb = stablehlo.convert %x : (tensor<16x32xf32>) -> tensor<16x32xbf16>
  %wb = stablehlo.convert %w : (tensor<32x64xf32>) -> tensor<32x64xbf16>
  %y = stablehlo.dot_general %xb, %wb, contracting_dims = [1] x [0] : (tensor<16x32xbf16>, tensor<32x64xbf16>) -> tensor<16x64xf32>
  return %y : tensor<16x64xf32>
}

//--- product.mlir

// A bf16 product of a rounded value is an operand of its own (no rounding
// at the GEMM): measured itself, not as %x's rounding.
// PRODUCT-LABEL: func.func @main
// PRODUCT-NOT: stablehlo.is_finite %arg0
// PRODUCT: %[[P:.*]] = stablehlo.multiply
// PRODUCT: stablehlo.abs %[[P]] : tensor<4x8xbf16>
// PRODUCT: stablehlo.dot_general %[[P]], %arg2
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xbf16>, %w: tensor<8x8xbf16>) -> tensor<4x8xf32> {
  %xb = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %p = stablehlo.multiply %xb, %y : tensor<4x8xbf16>
  %d = stablehlo.dot_general %p, %w, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
  return %d : tensor<4x8xf32>
}

//--- loop.mlir

// A GEMM in a loop body is measured there and accumulated over the
// iterations in values the loop carries from zeros (the larger amax, the
// counts summed); both operands of the first are one value, carried once; the loop's
// results after its own are the totals. The stacked %w the loop carries
// unchanged and rounds whole on every iteration is measured once, before
// the loop: its rounding reads the same values each time.
// LOOP-LABEL: func.func @main
// LOOP-SAME: tensor<2x2xf32> {amp.gemm_amax}, tensor<2x2x3xi32> {amp.gemm_counts}
// LOOP: %[[WABS:.*]] = stablehlo.abs %arg2 : tensor<3x4x4xf32>
// LOOP: stablehlo.reduce(%[[WABS]] init: {{.*}}) across dimensions = [0, 1, 2]
// Carried: the loop's own three, then the amax and nonzero count of %a
// and of %d (computed in bf16: no rounding, zero counts, not carried).
// LOOP: %[[LOOP:.*]]:7 = stablehlo.while(%{{.*}} = %{{.*}}, %{{.*}} = %arg0, %{{.*}} = %arg2, %[[AMAX:[a-zA-Z0-9_]+]] = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}})
// LOOP: do {
// LOOP: stablehlo.abs %iterArg_{{[0-9]+}} : tensor<4x4xbf16>
// LOOP: %[[ONE:.*]]:2 = stablehlo.reduce
// LOOP: stablehlo.dot_general
// LOOP: %[[NEXT:.*]] = stablehlo.maximum %[[AMAX]], %[[ONE]]#0 : tensor<f32>
// LOOP: stablehlo.return {{.*}}, %[[NEXT]], {{.*}} : tensor<i32>, tensor<4x4xbf16>, tensor<3x4x4xf32>, tensor<f32>, tensor<i32>, tensor<f32>, tensor<i32>
// LOOP: stablehlo.reshape %[[LOOP]]#3 : (tensor<f32>) -> tensor<1xf32>
// LOOP: stablehlo.reshape %[[LOOP]]#3 : (tensor<f32>) -> tensor<1xf32>
func.func @main(%x: tensor<4x4xbf16>, %n: tensor<i32>, %w: tensor<3x4x4xf32>) -> tensor<4x4xbf16> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %c0, %a = %x, %ws = %w) : tensor<i32>, tensor<4x4xbf16>, tensor<3x4x4xf32>
    cond {
      %lt = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %d = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<4x4xbf16>, tensor<4x4xbf16>) -> tensor<4x4xbf16>
      %wb = stablehlo.convert %ws : (tensor<3x4x4xf32>) -> tensor<3x4x4xbf16>
      %z = stablehlo.constant dense<0> : tensor<i32>
      %layer = stablehlo.dynamic_slice %wb, %i, %z, %z, sizes = [1, 4, 4] : (tensor<3x4x4xbf16>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xbf16>
      %wl = stablehlo.reshape %layer : (tensor<1x4x4xbf16>) -> tensor<4x4xbf16>
      %e = stablehlo.dot_general %d, %wl, contracting_dims = [1] x [0] : (tensor<4x4xbf16>, tensor<4x4xbf16>) -> tensor<4x4xbf16>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %j = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %j, %e, %ws : tensor<i32>, tensor<4x4xbf16>, tensor<3x4x4xf32>
    }
  return %r#1 : tensor<4x4xbf16>
}

//--- nomain.mlir

func.func @step(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

//--- twice.mlir

func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<0x2xf32> {amp.gemm_amax}) {
  %z = stablehlo.constant dense<0.0> : tensor<0x2xf32>
  return %x, %z : tensor<4xf32>, tensor<0x2xf32>
}
