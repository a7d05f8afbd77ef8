// amp-opt --fp8-scaling mxfp8 for target gpu, under a JAX without
// jax.lax.scaled_dot (its XLA knows no xla.scaled_dot composite): the
// dequantized operands feed the dot.
// UNSUPPORTED: mx-composite

// RUN: amp-opt %s --target gpu --dot-result f32 --fp8-min-size 0 --policy p=f32,c=bf16,o=f32,gemm=f8 --fp8-scaling mxfp8 | FileCheck %s
// CHECK-NOT: composite
// CHECK: stablehlo.convert {{.*}} -> tensor<32x2x32xf8E4M3FN>
// CHECK: stablehlo.dot_general {{.*}} : (tensor<32x64xbf16>, tensor<16x64xbf16>) -> tensor<32x16xf32>

func.func public @main(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return %d : tensor<32x16xf32>
}
