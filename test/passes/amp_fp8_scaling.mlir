// amp-fp8-gemms alone with the finer scalings: rowwise (one scale per row of
// the non-contracting dimensions, broadcast over the result's rows and
// columns), mxfp8 (E4M3 blocks of 32 along the contraction, power-of-two
// E8M0 scales) as the xla.scaled_dot composite and as a dequantized dot, the
// shape filter (min-size) and the operands it counts as quantized already,
// a contraction MXFP8 cannot block, a partitioned program (dequantized
// whatever mx-form says), GEMMs kept out of FP8 by place (keep-gemms), and
// bad options.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: amp-opt %t/dot.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8 scaling=rowwise})' | FileCheck %s --check-prefix=ROWWISE
// RUN: amp-opt %t/dot.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8 scaling=mxfp8})' | FileCheck %s --check-prefix=MX
// RUN: amp-opt %t/dot.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8 scaling=mxfp8 mx-form=dequantize})' | FileCheck %s --check-prefix=MXDQ
// RUN: amp-opt %t/f32.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 min-size=886 report=true})' | FileCheck %s --check-prefix=SMALL
// RUN: amp-opt %t/f32.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 scaling=mxfp8 report=true})' | FileCheck %s --check-prefix=BLOCK48
// RUN: amp-opt %t/shared.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 min-size=886 report=true})' | FileCheck %s --check-prefix=SHARED
// RUN: amp-opt %t/shared.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 min-size=886 scaling=rowwise report=true})' | FileCheck %s --check-prefix=UNSHARED
// RUN: amp-opt %t/shared.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 min-size=886 keep-gemms=0 report=true})' | FileCheck %s --check-prefix=KEPT
// RUN: not amp-opt %t/shared.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32},amp-fp8-gemms{gemm=f8 keep-gemms=4})' 2>&1 | FileCheck %s --check-prefix=BADKEEP
// RUN: amp-opt %t/sharded.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true},amp-fp8-gemms{gemm=f8 scaling=mxfp8 mx-form=composite report=true})' | FileCheck %s --check-prefix=SHARDED
// RUN: not amp-opt %t/dot.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{min-size=-1})' 2>&1 | FileCheck %s --check-prefix=BADSIZE
// RUN: not amp-opt %t/dot.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{scaling=mxfp8 mx-form=cudnn})' 2>&1 | FileCheck %s --check-prefix=BADFORM
// RUN: not amp-opt %t/dot.mlir --pass-pipeline='builtin.module(amp-fp8-gemms{gemm=f8e5m2 scaling=mxfp8})' 2>&1 | FileCheck %s --check-prefix=BADMX

// BADKEEP: error: invalid option 'keep-gemms': no low-precision dot 4 (the module has 4, numbered 0 to 3; the report's gemm_index)
// BADSIZE: error: invalid option 'min-size': must be at least 0, got -1
// BADFORM: error: invalid option 'mx-form': unknown value 'cudnn' (accepted: composite, dequantize)
// BADMX: error: invalid option 'scaling': mxfp8 stores E4M3 data; use gemm=f8 or gemm=f8e4m3fn with it

//--- dot.mlir

// Rowwise: the lhs's scale per row, the max over its contracting dimension
// 1 of |x| / 448 from FLT_MIN (one reduction, no elementwise step after
// it); the rhs's per column (over dimension 0); the FP8 dot's f32 result
// times the rows' scales, then the columns'.
// ROWWISE-LABEL: func.func public @main
// ROWWISE: %[[X:.*]] = stablehlo.convert %arg0 : (tensor<32x64xbf16>) -> tensor<32x64xf32>
// ROWWISE: %[[M:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<32x64xf32>
// ROWWISE: %[[FLOOR:.*]] = stablehlo.constant dense<1.17549435E-38> : tensor<f32>
// ROWWISE: %[[SX:.*]] = stablehlo.reduce(%[[M]] init: %[[FLOOR]]) applies stablehlo.maximum across dimensions = [1] : (tensor<32x64xf32>, tensor<f32>) -> tensor<32xf32>
// ROWWISE: %[[SXB:.*]] = stablehlo.broadcast_in_dim %[[SX]], dims = [0] : (tensor<32xf32>) -> tensor<32x64xf32>
// ROWWISE: stablehlo.divide %[[X]], %[[SXB]] : tensor<32x64xf32>
// ROWWISE: %[[QX:.*]] = stablehlo.convert %{{.*}} : (tensor<32x64xf32>) -> tensor<32x64xf8E4M3FN>
// ROWWISE: %[[SW:.*]] = stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.maximum across dimensions = [0] : (tensor<64x16xf32>, tensor<f32>) -> tensor<16xf32>
// ROWWISE: %[[QW:.*]] = stablehlo.convert %{{.*}} : (tensor<64x16xf32>) -> tensor<64x16xf8E4M3FN>
// ROWWISE: %[[P:.*]] = stablehlo.dot_general %[[QX]], %[[QW]], contracting_dims = [1] x [0] {mhlo.frontend_attributes = {amp_fp8 = "0"}} : (tensor<32x64xf8E4M3FN>, tensor<64x16xf8E4M3FN>) -> tensor<32x16xf32>
// ROWWISE-NEXT: %[[R:.*]] = stablehlo.broadcast_in_dim %[[SX]], dims = [0] : (tensor<32xf32>) -> tensor<32x16xf32>
// ROWWISE-NEXT: %[[PR:.*]] = stablehlo.multiply %[[P]], %[[R]] : tensor<32x16xf32>
// ROWWISE-NEXT: %[[C:.*]] = stablehlo.broadcast_in_dim %[[SW]], dims = [1] : (tensor<16xf32>) -> tensor<32x16xf32>
// ROWWISE-NEXT: %[[Y:.*]] = stablehlo.multiply %[[PR]], %[[C]] : tensor<32x16xf32>
// ROWWISE-NEXT: return %[[Y]]

// A bf16 result (a stored value on gpu): the GEMM writes bf16 and is
// scaled there, by the scales rounded to bf16.
// ROWWISE-LABEL: func.func public @bf16_result
// ROWWISE: %[[P:.*]] = stablehlo.dot_general %{{.*}}, %{{.*}} -> tensor<32x16xbf16>
// ROWWISE-NEXT: %[[R:.*]] = stablehlo.convert %{{.*}} : (tensor<32xf32>) -> tensor<32xbf16>
// ROWWISE-NEXT: %[[RB:.*]] = stablehlo.broadcast_in_dim %[[R]], dims = [0] : (tensor<32xbf16>) -> tensor<32x16xbf16>
// ROWWISE-NEXT: %[[PR:.*]] = stablehlo.multiply %[[P]], %[[RB]] : tensor<32x16xbf16>
// ROWWISE-NEXT: %[[C:.*]] = stablehlo.convert %{{.*}} : (tensor<16xf32>) -> tensor<16xbf16>
// ROWWISE-NEXT: %[[CB:.*]] = stablehlo.broadcast_in_dim %[[C]], dims = [1] : (tensor<16xbf16>) -> tensor<32x16xbf16>
// ROWWISE-NEXT: %[[Y:.*]] = stablehlo.multiply %[[PR]], %[[CB]] : tensor<32x16xbf16>
// ROWWISE-NEXT: return %[[Y]]

// MXFP8: each operand as a matrix [free, contraction] (the rhs transposed:
// XLA's scaled-dot takes one free and one contracting dimension each), in
// blocks [rows, 2, 32] (its contraction split), the amax of each block, its
// scale from the amax's bits (exponent - 135, plus one when the mantissa is
// above 1.75's), clamped to [-126, 127]; the codes E4M3; the scales
// converted to E8M0 for the composite, whose decomposition is the
// dequantized dot.
// MX-LABEL: func.func public @main
// MX: %[[BX:.*]] = stablehlo.reshape %{{.*}} : (tensor<32x64xf32>) -> tensor<32x2x32xf32>
// MX: %[[AX:.*]] = stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.maximum across dimensions = [2] : (tensor<32x2x32xf32>, tensor<f32>) -> tensor<32x2xf32>
// MX: %[[BITS:.*]] = stablehlo.bitcast_convert %[[AX]] : (tensor<32x2xf32>) -> tensor<32x2xi32>
// MX: stablehlo.shift_right_logical %[[BITS]]
// MX: stablehlo.and %[[BITS]]
// MX: stablehlo.constant dense<6291456> : tensor<i32>
// MX: stablehlo.constant dense<135> : tensor<i32>
// MX: stablehlo.clamp %{{.*}}, %{{.*}}, %{{.*}} : (tensor<i32>, tensor<32x2xi32>, tensor<i32>) -> tensor<32x2xi32>
// MX: stablehlo.shift_left
// MX: stablehlo.is_finite %[[AX]]
// MX: %[[SX:.*]] = stablehlo.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<32x2xi1>, tensor<32x2xf32>
// MX: stablehlo.broadcast_in_dim %[[SX]], dims = [0, 1] : (tensor<32x2xf32>) -> tensor<32x2x32xf32>
// MX: stablehlo.convert %{{.*}} : (tensor<32x2x32xf32>) -> tensor<32x2x32xf8E4M3FN>
// MX: %[[QX:.*]] = stablehlo.reshape %{{.*}} : (tensor<32x2x32xf8E4M3FN>) -> tensor<32x64xf8E4M3FN>
// MX: stablehlo.transpose %{{.*}}, dims = [1, 0] : (tensor<64x16xf32>) -> tensor<16x64xf32>
// MX: stablehlo.reshape %{{.*}} : (tensor<16x64xf32>) -> tensor<16x2x32xf32>
// MX: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.maximum across dimensions = [2] : (tensor<16x2x32xf32>, tensor<f32>) -> tensor<16x2xf32>
// MX: %[[SW:.*]] = stablehlo.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x2xi1>, tensor<16x2xf32>
// MX: %[[QW:.*]] = stablehlo.reshape %{{.*}} : (tensor<16x2x32xf8E4M3FN>) -> tensor<16x64xf8E4M3FN>
// The lhs scale carries the GEMM's survival marker too (XLA's block-scaled
// GEMM keeps none of the composite's).
// MX: %[[EX:.*]] = stablehlo.convert %[[SX]] {mhlo.frontend_attributes = {amp_fp8 = "0"}} : (tensor<32x2xf32>) -> tensor<32x2xf8E8M0FNU>
// MX: %[[EW:.*]] = stablehlo.convert %[[SW]] : (tensor<16x2xf32>) -> tensor<16x2xf8E8M0FNU>
// MX: %[[Y:.*]] = stablehlo.composite "xla.scaled_dot" %[[QX]], %[[QW]], %[[EX]], %[[EW]] {composite_attributes = {dimension_numbers = {{\[\[\[1\], \[1\]\], \[\[\], \[\]\]\]}}, preferred_element_type = f32}, decomposition = @xla.scaled_dot, mhlo.frontend_attributes = {amp_fp8 = "0"}} : (tensor<32x64xf8E4M3FN>, tensor<16x64xf8E4M3FN>, tensor<32x2xf8E8M0FNU>, tensor<16x2xf8E8M0FNU>) -> tensor<32x16xf32>
// MX: return %[[Y]]
// MX: func.func private @xla.scaled_dot(%[[A:.*]]: tensor<32x64xf8E4M3FN>, %[[B:.*]]: tensor<16x64xf8E4M3FN>, %[[SA:.*]]: tensor<32x2xf8E8M0FNU>, %[[SB:.*]]: tensor<16x2xf8E8M0FNU>) -> tensor<32x16xf32>
// MX: stablehlo.broadcast_in_dim %[[SA]], dims = [0, 1] : (tensor<32x2xf8E8M0FNU>) -> tensor<32x2x32xf8E8M0FNU>
// MX: %[[DA:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<32x64xbf16>
// MX: %[[DB:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<16x64xbf16>
// MX: %[[D:.*]] = stablehlo.dot_general %[[DA]], %[[DB]], contracting_dims = [1] x [1] : (tensor<32x64xbf16>, tensor<16x64xbf16>) -> tensor<32x16xf32>
// MX-NEXT: return %[[D]]

// The dequantized form: the same codes, held by a barrier (XLA:GPU would
// fold the FP8 convert into the bf16 one), times their f32 scales, in the
// dot's own bf16 (exact), into the original dot; no composite.
// MXDQ-LABEL: func.func public @main
// MXDQ-NOT: composite
// MXDQ: %[[HX:.*]] = stablehlo.optimization_barrier %{{.*}} : tensor<32x64xf8E4M3FN>
// MXDQ: stablehlo.convert %[[HX]] : (tensor<32x64xf8E4M3FN>) -> tensor<32x64xbf16>
// MXDQ: %[[DX:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} {mhlo.frontend_attributes = {amp_fp8 = "0"}} : tensor<32x64xbf16>
// MXDQ: %[[DW:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<16x64xbf16>
// MXDQ: %[[Y:.*]] = stablehlo.dot_general %[[DX]], %[[DW]], contracting_dims = [1] x [1] {mhlo.frontend_attributes = {amp_fp8 = "0"}} : (tensor<32x64xbf16>, tensor<16x64xbf16>) -> tensor<32x16xf32>
// MXDQ-NEXT: return %[[Y]]
// MXDQ-NOT: xla.scaled_dot

func.func public @main(%x: tensor<32x64xbf16>, %w: tensor<64x16xbf16>) -> tensor<32x16xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>
  return %d : tensor<32x16xf32>
}

func.func public @bf16_result(%x: tensor<32x64xbf16>, %w: tensor<64x16xbf16>) -> tensor<32x16xbf16> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xbf16>
  return %d : tensor<32x16xbf16>
}

//--- f32.mlir

// min-size=886 (the H100's roofline): this 32x48x16 GEMM, M*N/(M+N) = 10,
// stays in bf16 and says why; mxfp8 cannot block a contraction of 48.
// SMALL: stablehlo.dot_general {{.*}}gemm = "not eligible: too small: quantizing its operands would cost more than FP8 saves (fp8_min_size) (32x48x16 GEMM, M*N/(M+N) = 10 < 886: FP8 would be slower)", gemm_detail = "32x48x16 GEMM, M*N/(M+N) = 10 < 886: FP8 would be slower", gemm_index = 0 : i64, gemm_reason = "too_small"
// SMALL-NOT: f8E4M3FN
// BLOCK48: stablehlo.dot_general {{.*}}gemm = "not eligible: mxfp8 needs a contraction that is a multiple of its 32-element blocks (contraction of 48)", gemm_detail = "contraction of 48", gemm_index = 0 : i64, gemm_reason = "contraction_not_multiple_of_32"
// BLOCK48-NOT: composite

func.func public @main(%x: tensor<32x48xf32>, %w: tensor<48x16xf32>) -> tensor<32x16xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x48xf32>, tensor<48x16xf32>) -> tensor<32x16xf32>
  return %d : tensor<32x16xf32>
}

//--- shared.mlir

// %x is quantized for the first GEMM, which pays on its own (2048x1024x4096,
// M*N/(M+N) = 1365). The second GEMM contracts %x over its 2048 rows, as a
// weight gradient does: with %x's FP8 copy made anyway, only %g costs
// quantizing, and FP8 pays when %x's free size, 1024, is at least 886. The
// fourth reads %y the same way, whose free size 512 is too small for what
// quantizing %h costs. (With %g for %h both operands would be quantized
// already, and FP8 would be free.)
// The two share %x's quantization: one FP8 copy, one scale.
// SHARED: %[[XQ:.*]] = stablehlo.convert %{{.*}} : (tensor<2048x1024xf32>) -> tensor<2048x1024xf8E4M3FN>
// SHARED: stablehlo.dot_general %[[XQ]], {{.*}}gemm = "f8e4m3fn x f8e4m3fn, current scaling"{{.*}} -> tensor<2048x4096xf32>
// SHARED-NOT: tensor<2048x1024xf8E4M3FN>
// SHARED: stablehlo.dot_general %[[XQ]], %{{.*}}, contracting_dims = [0] x [0] {{.*}}gemm = "f8e4m3fn x f8e4m3fn, current scaling"{{.*}} -> tensor<1024x64xf32>
// SHARED: stablehlo.dot_general {{.*}}gemm = "f8e4m3fn x f8e4m3fn, current scaling"{{.*}} -> tensor<2048x4096xf32>
// SHARED: gemm_detail = "512x2048x64 GEMM, M*N/N = 512 < 886 (its lhs is quantized for another FP8 GEMM): FP8 would be slower", gemm_index = 3 : i64, gemm_reason = "too_small"
// Rowwise scales run along each GEMM's own contraction: nothing is shared.
// UNSHARED: gemm = "f8e4m3fn x f8e4m3fn, rowwise scaling"{{.*}} -> tensor<2048x4096xf32>
// UNSHARED: gemm_detail = "1024x2048x64 GEMM, M*N/(M+N) = 60 < 886: FP8 would be slower", gemm_index = 1 : i64, gemm_reason = "too_small"
// UNSHARED: gemm = "f8e4m3fn x f8e4m3fn, rowwise scaling"{{.*}} -> tensor<2048x4096xf32>
// UNSHARED: gemm_detail = "512x2048x64 GEMM, M*N/(M+N) = 56 < 886: FP8 would be slower", gemm_index = 3 : i64, gemm_reason = "too_small"

// keep-gemms=0 keeps the first GEMM (gemm_index 0) in bf16: no FP8 copy
// of %x is made for it, so the second GEMM, which shared that copy, now
// pays for quantizing %x as well, and is too small. The places stay those
// of the dots in program order, FP8 or not.
// KEPT: stablehlo.dot_general {{.*}}gemm = "kept in the compute dtype by keep_gemms (or fp8_fallback)", gemm_index = 0 : i64, gemm_reason = "kept"{{.*}} : (tensor<2048x1024xbf16>, tensor<1024x4096xbf16>) -> tensor<2048x4096xf32>
// KEPT-NOT: tensor<2048x1024xf8E4M3FN>
// KEPT: stablehlo.dot_general {{.*}}gemm_detail = "1024x2048x64 GEMM, M*N/(M+N) = 60 < 886: FP8 would be slower", gemm_index = 1 : i64, gemm_reason = "too_small"
// KEPT: stablehlo.dot_general {{.*}}gemm = "f8e4m3fn x f8e4m3fn, current scaling", gemm_index = 2 : i64{{.*}} -> tensor<2048x4096xf32>
// KEPT: stablehlo.dot_general {{.*}}gemm_index = 3 : i64, gemm_reason = "too_small"

func.func public @main(%x: tensor<2048x1024xf32>, %w: tensor<1024x4096xf32>, %y: tensor<2048x512xf32>, %v: tensor<512x4096xf32>, %g: tensor<2048x64xf32>, %h: tensor<2048x64xf32>) -> (tensor<2048x4096xf32>, tensor<1024x64xf32>, tensor<2048x4096xf32>, tensor<512x64xf32>) {
  %a = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2048x1024xf32>, tensor<1024x4096xf32>) -> tensor<2048x4096xf32>
  %b = stablehlo.dot_general %x, %g, contracting_dims = [0] x [0] : (tensor<2048x1024xf32>, tensor<2048x64xf32>) -> tensor<1024x64xf32>
  %c = stablehlo.dot_general %y, %v, contracting_dims = [1] x [0] : (tensor<2048x512xf32>, tensor<512x4096xf32>) -> tensor<2048x4096xf32>
  %d = stablehlo.dot_general %y, %h, contracting_dims = [0] x [0] : (tensor<2048x512xf32>, tensor<2048x64xf32>) -> tensor<512x64xf32>
  return %a, %b, %c, %d : tensor<2048x4096xf32>, tensor<1024x64xf32>, tensor<2048x4096xf32>, tensor<512x64xf32>
}

//--- sharded.mlir

// A program XLA's SPMD partitioner splits 8 ways: XLA cannot partition the
// xla.scaled_dot composite ("failed to legalize operation 'mhlo.unknown'"),
// so mx-form=composite gets the dequantized form, says so, and the
// arguments keep their shardings.
// SHARDED: module attributes {mhlo.num_partitions = 8 : i32
// SHARDED: func.func public @main(%arg0: tensor<32x64xf32> {mhlo.sharding = "{devices=[8,1]<=[8]}"}, %arg1: tensor<64x16xf32> {mhlo.sharding = "{replicated}"})
// SHARDED-NOT: composite
// SHARDED: stablehlo.optimization_barrier %{{.*}} : tensor<32x64xf8E4M3FN>
// SHARDED: stablehlo.multiply {{.*}}amp_fp8 = "0"{{.*}} : tensor<32x64xbf16>
// SHARDED: stablehlo.dot_general {{.*}}gemm = "f8e4m3fn x f8e4m3fn, mxfp8 (blocks of 32, E8M0 scales, dequantized: XLA does not partition xla.scaled_dot)"
// SHARDED-NOT: xla.scaled_dot

module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<32x64xf32> {mhlo.sharding = "{devices=[8,1]<=[8]}"}, %w: tensor<64x16xf32> {mhlo.sharding = "{replicated}"}) -> tensor<32x16xf32> {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
    return %d : tensor<32x16xf32>
  }
}
