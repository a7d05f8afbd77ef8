// amp-fp8-gemms alone, on dots amp-insert-converts lowered (bf16 operands):
// per-tensor current scaling, the saturating clamp, e4m3fn forward and e5m2
// for gradient operands (derived from the loss seed), what is not eligible,
// delayed scaling's amax history, and bad options.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: amp-opt %t/dots.mlir --split-input-file --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8})' | FileCheck %s
// RUN: amp-opt %t/dots.mlir --split-input-file --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8e5m2})' | FileCheck %s --check-prefix=E5M2
// RUN: amp-opt %t/dots.mlir --split-input-file --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8 report=true})' --emit generic | FileCheck %s --check-prefix=NOREPORT
// RUN: amp-opt %t/f32.mlir --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 report=true})' | FileCheck %s --check-prefix=REPORT
// RUN: amp-opt %t/main.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8 scaling=delayed amax-history=4})' | FileCheck %s --check-prefix=DELAYED
// RUN: not amp-opt %t/main.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=bf16})' 2>&1 | FileCheck %s --check-prefix=BADGEMM
// RUN: not amp-opt %t/main.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{scaling=late})' 2>&1 | FileCheck %s --check-prefix=BADSCALING
// RUN: not amp-opt %t/main.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{scaling=delayed amax-history=0})' 2>&1 | FileCheck %s --check-prefix=BADHISTORY

// BADGEMM: error: invalid option 'gemm': 'bf16' is not an FP8 format (accepted: f8, f8e4m3fn, f8e5m2)
// BADSCALING: error: invalid option 'scaling': unknown fp8_scaling 'late' (accepted: current, delayed, rowwise, mxfp8)
// BADHISTORY: error: invalid option 'amax-history': must be at least 1, got 0

// Without amp-insert-converts there is no decision to add the FP8 one to.
// NOREPORT-NOT: amp.decision
// NOREPORT: "stablehlo.dot_general"
// NOREPORT-NOT: amp.decision

//--- dots.mlir

// Each operand is quantized: amax in f32, scale = max(amax / 448, FLT_MIN),
// x / scale clamped to [-448, 448], converted to f8E4M3FN. The dot takes the
// FP8 values themselves (no convert back: XLA:GPU would fold a chain of
// converts), accumulates in f32, and its result is multiplied by the
// product of the two scales.

// CHECK-LABEL: func.func public @forward(
// CHECK-SAME: %[[X:[^:]*]]: tensor<32x64xbf16>, %[[W:[^:]*]]: tensor<64x16xbf16>
// CHECK: %[[XF:.*]] = stablehlo.convert %[[X]] : (tensor<32x64xbf16>) -> tensor<32x64xf32>
// CHECK-NEXT: %[[ABS:.*]] = stablehlo.abs %[[XF]] : tensor<32x64xf32>
// CHECK-NEXT: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[AMAX:.*]] = stablehlo.reduce(%[[ABS]] init: %[[ZERO]]) applies stablehlo.maximum across dimensions = [0, 1]
// CHECK-NEXT: %[[FMAX:.*]] = stablehlo.constant dense<4.480000e+02> : tensor<f32>
// CHECK-NEXT: %[[RATIO:.*]] = stablehlo.divide %[[AMAX]], %[[FMAX]] : tensor<f32>
// CHECK-NEXT: %[[FLOOR:.*]] = stablehlo.constant dense<1.17549435E-38> : tensor<f32>
// CHECK-NEXT: %[[SCALE:.*]] = stablehlo.maximum %[[RATIO]], %[[FLOOR]] : tensor<f32>
// CHECK-NEXT: %[[SB:.*]] = stablehlo.broadcast_in_dim %[[SCALE]], dims = [] : (tensor<f32>) -> tensor<32x64xf32>
// CHECK-NEXT: %[[SCALED:.*]] = stablehlo.divide %[[XF]], %[[SB]] : tensor<32x64xf32>
// CHECK-NEXT: %[[HI:.*]] = stablehlo.constant dense<4.480000e+02> : tensor<f32>
// CHECK-NEXT: %[[LO:.*]] = stablehlo.constant dense<-4.480000e+02> : tensor<f32>
// CHECK-NEXT: %[[CLAMPED:.*]] = stablehlo.clamp %[[LO]], %[[SCALED]], %[[HI]] : (tensor<f32>, tensor<32x64xf32>, tensor<f32>) -> tensor<32x64xf32>
// CHECK-NEXT: %[[Q:.*]] = stablehlo.convert %[[CLAMPED]] : (tensor<32x64xf32>) -> tensor<32x64xf8E4M3FN>
// CHECK: %[[WSCALE:.*]] = stablehlo.maximum %{{.*}}, %{{.*}} : tensor<f32>
// CHECK: %[[QW:.*]] = stablehlo.convert %{{.*}} : (tensor<64x16xf32>) -> tensor<64x16xf8E4M3FN>
// CHECK-NEXT: %[[DOT:.*]] = stablehlo.dot_general %[[Q]], %[[QW]], contracting_dims = [1] x [0] {mhlo.frontend_attributes = {amp_fp8 = "0"}} : (tensor<32x64xf8E4M3FN>, tensor<64x16xf8E4M3FN>) -> tensor<32x16xf32>
// CHECK-NEXT: %[[BOTH:.*]] = stablehlo.multiply %[[SCALE]], %[[WSCALE]] : tensor<f32>
// CHECK-NEXT: %[[BB:.*]] = stablehlo.broadcast_in_dim %[[BOTH]], dims = [] : (tensor<f32>) -> tensor<32x16xf32>
// CHECK-NEXT: %[[OUT:.*]] = stablehlo.multiply %[[DOT]], %[[BB]] : tensor<32x16xf32>
// CHECK-NEXT: return %[[OUT]]

// gemm=f8e5m2 gives every operand e5m2 (fmax 57344).
// E5M2-LABEL: func.func public @forward(
// E5M2: stablehlo.constant dense<5.734400e+04> : tensor<f32>
// E5M2: stablehlo.convert %{{.*}} : (tensor<32x64xf32>) -> tensor<32x64xf8E5M2>
// E5M2: stablehlo.convert %{{.*}} : (tensor<64x16xf32>) -> tensor<64x16xf8E5M2>
// E5M2: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] {{.*}} : (tensor<32x64xf8E5M2>, tensor<64x16xf8E5M2>) -> tensor<32x16xf32>
// E5M2-NOT: f8E4M3FN
func.func public @forward(%x: tensor<32x64xbf16>, %w: tensor<64x16xbf16>) -> tensor<32x16xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}

// -----

// A dot whose result is in the compute dtype (dot-result=compute, the gpu
// target's storage, reduce-dtype=compute) accumulates in f32 and writes the
// compute dtype, scaled there: where XLA splits a GEMM along its
// contraction it reduces the partial sums in the dtype the GEMM writes (an
// f32 product made FSDP x TP gemm=f8 move 972 MiB of f32 reduce-scatters
// per device), and the bf16 rounding before the scale is 2^-9 against
// E4M3 operands' 2^-4.

// CHECK-LABEL: func.func public @bf16_result(
// CHECK: %[[DOT:.*]] = stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] {mhlo.frontend_attributes = {amp_fp8 = "0"}} : (tensor<32x64xf8E4M3FN>, tensor<64x16xf8E4M3FN>) -> tensor<32x16xbf16>
// CHECK: %[[SCALE:.*]] = stablehlo.convert %{{.*}} : (tensor<f32>) -> tensor<bf16>
// CHECK: %[[SCALES:.*]] = stablehlo.broadcast_in_dim %[[SCALE]], dims = [] : (tensor<bf16>) -> tensor<32x16xbf16>
// CHECK-NEXT: %[[OUT:.*]] = stablehlo.multiply %[[DOT]], %[[SCALES]] : tensor<32x16xbf16>
// CHECK-NEXT: return %[[OUT]]
func.func public @bf16_result(%x: tensor<32x64xbf16>, %w: tensor<64x16xbf16>) -> tensor<32x16xbf16> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xbf16>
  return %0 : tensor<32x16xbf16>
}

// -----

// An operand that is a rounding of an f32 value is quantized from the f32
// value (XLA would fold f32 -> bf16 -> f32 anyway); one stored low by
// amp-insert-converts (rounded, held by a barrier, read back) is quantized
// from its read-back, so the f32 original is not kept for the quantizer.

// CHECK-LABEL: func.func public @rounded_operands(
// CHECK-SAME: %[[A:[^:]*]]: tensor<32x64xf32>, %[[B:[^:]*]]: tensor<64x16xf32>
// CHECK: %[[BACK:.*]] = stablehlo.convert %{{.*}} : (tensor<64x16xbf16>) -> tensor<64x16xf32>
// CHECK: stablehlo.abs %[[A]] : tensor<32x64xf32>
// CHECK: stablehlo.divide %[[A]], %{{.*}} : tensor<32x64xf32>
// CHECK: stablehlo.abs %[[BACK]] : tensor<64x16xf32>
// CHECK: stablehlo.divide %[[BACK]], %{{.*}} : tensor<64x16xf32>
func.func public @rounded_operands(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %x = stablehlo.convert %a : (tensor<32x64xf32>) -> tensor<32x64xbf16>
  %low = stablehlo.convert %b {mhlo.frontend_attributes = {amp_stored = "0"}} : (tensor<64x16xf32>) -> tensor<64x16xbf16>
  %held = stablehlo.optimization_barrier %low : tensor<64x16xbf16>
  %back = stablehlo.convert %held : (tensor<64x16xbf16>) -> tensor<64x16xf32>
  %0 = stablehlo.dot_general %x, %low, contracting_dims = [1] x [0] : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>
  %1 = stablehlo.add %0, %0 : tensor<32x16xf32>
  return %1 : tensor<32x16xf32>
}

// -----

// In the backward pass (derived from the loss seed), the gradient operand is
// e5m2 and the forward one e4m3fn.

// CHECK-LABEL: func.func public @backward(
// CHECK: stablehlo.convert %{{.*}} : (tensor<32x64xf32>) -> tensor<32x64xf8E4M3FN>
// CHECK: stablehlo.constant dense<5.734400e+04> : tensor<f32>
// CHECK: stablehlo.constant dense<-5.734400e+04> : tensor<f32>
// CHECK: stablehlo.convert %{{.*}} : (tensor<32x16xf32>) -> tensor<32x16xf8E5M2>
// CHECK-NEXT: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [0] x [0] {{.*}} : (tensor<32x64xf8E4M3FN>, tensor<32x16xf8E5M2>) -> tensor<64x16xf32>
func.func public @backward(%x: tensor<32x64xbf16>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x16xf32> {
  %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<32x16xf32>
  %dy = stablehlo.convert %b : (tensor<32x16xf32>) -> tensor<32x16xbf16>
  %0 = stablehlo.dot_general %x, %dy, contracting_dims = [0] x [0] : (tensor<32x64xbf16>, tensor<32x16xbf16>) -> tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

// Not eligible, left in bf16: sizes that are not multiples of 16, batched
// products; and dots in f32 (not lowered by amp-insert-converts).

// CHECK-LABEL: func.func public @not_eligible(
// CHECK-NOT: f8E
// CHECK: return
func.func public @not_eligible(%x: tensor<30x64xbf16>, %w: tensor<64x16xbf16>, %a: tensor<4x32x64xbf16>, %b: tensor<4x64x16xbf16>, %f: tensor<32x64xf32>, %g: tensor<64x16xf32>) -> (tensor<30x16xf32>, tensor<4x32x16xf32>, tensor<32x16xf32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<30x64xbf16>, tensor<64x16xbf16>) -> tensor<30x16xf32>
  %1 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x32x64xbf16>, tensor<4x64x16xbf16>) -> tensor<4x32x16xf32>
  %2 = stablehlo.dot_general %f, %g, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return %0, %1, %2 : tensor<30x16xf32>, tensor<4x32x16xf32>, tensor<32x16xf32>
}

//--- f32.mlir

// With report=true each lowered dot's decision says what the FP8 lane did.

// REPORT-LABEL: func.func public @main(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {fp8 = 0 : i64, gemm = "f8e4m3fn x f8e4m3fn, current scaling", gemm_index = 0 : i64, group = 0 : i64, precision = "low", reason = "matrix_multiply"}
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {gemm = "not eligible: a size is not a multiple of 16 (cuBLASLt's FP8 requirement) (shape 30x64 * 64x16)", gemm_detail = "shape 30x64 * 64x16", gemm_index = 1 : i64, gemm_reason = "size_not_multiple_of_16", group = 1 : i64, precision = "low", reason = "matrix_multiply"}
func.func public @main(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>, %y: tensor<30x64xf32>) -> (tensor<32x16xf32>, tensor<30x16xf32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.dot_general %y, %w, contracting_dims = [1] x [0] : (tensor<30x64xf32>, tensor<64x16xf32>) -> tensor<30x16xf32>
  return %0, %1 : tensor<32x16xf32>, tensor<30x16xf32>
}

//--- main.mlir

// Delayed scaling: one f32[4] amax history per operand, appended to main's
// arguments and results; the scale comes from the history's max (this
// step's amax while the history is all zeros, or when this step's amax is
// not finite: an overflow is not clamped away), and the new history is this
// step's amax followed by the first three.

// DELAYED-LABEL: func.func public @main(
// DELAYED-SAME: %[[X:[^:]*]]: tensor<32x64xbf16>, %[[W:[^:]*]]: tensor<64x16xbf16>, %[[HX:[^:]*]]: tensor<4xf32> {amp.amax_history}, %[[HW:[^:]*]]: tensor<4xf32> {amp.amax_history}) -> (tensor<32x16xf32>, tensor<4xf32> {amp.amax_history, amp.state_of = 2 : i64}, tensor<4xf32> {amp.amax_history, amp.state_of = 3 : i64})
// DELAYED: %[[AMAX:.*]] = stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.maximum across dimensions = [0, 1] : (tensor<32x64xf32>, tensor<f32>) -> tensor<f32>
// DELAYED: %[[PAST:.*]] = stablehlo.reduce(%[[HX]] init: %{{.*}}) applies stablehlo.maximum across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
// DELAYED: %[[HAVE:.*]] = stablehlo.compare GT, %[[PAST]], %{{.*}} : (tensor<f32>, tensor<f32>) -> tensor<i1>
// DELAYED-NEXT: %[[FROM:.*]] = stablehlo.select %[[HAVE]], %[[PAST]], %[[AMAX]] : tensor<i1>, tensor<f32>
// DELAYED-NEXT: %[[FINITE:.*]] = stablehlo.is_finite %[[AMAX]] : (tensor<f32>) -> tensor<i1>
// DELAYED-NEXT: %[[REF:.*]] = stablehlo.select %[[FINITE]], %[[FROM]], %[[AMAX]] : tensor<i1>, tensor<f32>
// DELAYED-NEXT: %[[NEWEST:.*]] = stablehlo.reshape %[[AMAX]] : (tensor<f32>) -> tensor<1xf32>
// DELAYED-NEXT: %[[OLDER:.*]] = stablehlo.slice %[[HX]] [0:3] : (tensor<4xf32>) -> tensor<3xf32>
// DELAYED-NEXT: %[[ROLLED:.*]] = stablehlo.concatenate %[[NEWEST]], %[[OLDER]], dim = 0 : (tensor<1xf32>, tensor<3xf32>) -> tensor<4xf32>
// DELAYED-NEXT: %[[FMAX:.*]] = stablehlo.constant dense<4.480000e+02> : tensor<f32>
// DELAYED-NEXT: stablehlo.divide %[[REF]], %[[FMAX]] : tensor<f32>
// DELAYED: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1] x [0] {{.*}} : (tensor<32x64xf8E4M3FN>, tensor<64x16xf8E4M3FN>) -> tensor<32x16xf32>
// DELAYED: return %{{[^,]*}}, %[[ROLLED]], %{{[^ ]*}} : tensor<32x16xf32>, tensor<4xf32>, tensor<4xf32>
func.func public @main(%x: tensor<32x64xbf16>, %w: tensor<64x16xbf16>) -> tensor<32x16xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}
