// amp-opt's FP8 scaling flags: rowwise scales per row and column; mxfp8 is
// a dot of dequantized operands for target cpu (for gpu:
// fp8_mxfp8_gpu.mlir); the shape filter of target gpu keeps this small GEMM
// out of FP8, and says why, unless --fp8-min-size 0.

// RUN: amp-opt %s --target gpu --fp8-min-size 0 --policy p=f32,c=bf16,o=f32,gemm=f8 --fp8-scaling rowwise | FileCheck %s --check-prefix=ROWWISE
// ROWWISE: stablehlo.reduce({{.*}}) applies stablehlo.maximum across dimensions = [1] : (tensor<32x64xf32>, tensor<f32>) -> tensor<32xf32>
// ROWWISE: stablehlo.reduce({{.*}}) applies stablehlo.maximum across dimensions = [0] : (tensor<64x16xf32>, tensor<f32>) -> tensor<16xf32>
// ROWWISE: stablehlo.dot_general {{.*}} : (tensor<32x64xf8E4M3FN>, tensor<64x16xf8E4M3FN>)

// RUN: amp-opt %s --target cpu --policy p=f32,c=bf16,o=f32,gemm=f8 --fp8-scaling mxfp8 | FileCheck %s --check-prefix=MXCPU
// MXCPU-NOT: composite
// MXCPU: stablehlo.convert {{.*}} -> tensor<32x2x32xf8E4M3FN>
// MXCPU: stablehlo.dot_general {{.*}} : (tensor<32x64xbf16>, tensor<16x64xbf16>) -> tensor<32x16xf32>

// RUN: amp-opt %s --target gpu --policy p=f32,c=bf16,o=f32,gemm=f8 --report -o %t.mlir 2>&1 | FileCheck %s --check-prefix=SMALL
// SMALL: kept in bf16, not FP8: too small: quantizing its operands would cost more than FP8 saves (fp8_min_size): 1 op
// SMALL-NEXT: 32x64x16 GEMM, M*N/(M+N) = 10 < 886: FP8 would be slower: 1 op

// No argument is marked as the loss seed: no operand is known to be a
// gradient, and the report says why none is e5m2.
// RUN: amp-opt %s --target gpu --fp8-min-size 0 --policy p=f32,c=bf16,o=f32,gemm=f8 --report -o %t.mlir 2>&1 | FileCheck %s --check-prefix=NOSEED
// NOSEED: FP8 GEMMs: 1 op (f8e4m3fn x f8e4m3fn, current scaling: 1)
// NOSEED-NEXT: every FP8 operand is f8e4m3fn: gemm=f8 makes gradients f8e5m2, and a gradient is a value derived from an argument marked amp.loss_seed or amp.cotangent, which this module has none of

func.func public @main(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return %d : tensor<32x16xf32>
}
