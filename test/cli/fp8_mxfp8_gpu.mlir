// amp-opt --fp8-scaling mxfp8 for target gpu, under a JAX that has
// jax.lax.scaled_dot: the xla.scaled_dot composite, which XLA:GPU makes a
// block-scaled GEMM.
// REQUIRES: mx-composite

// RUN: amp-opt %s --target gpu --fp8-min-size 0 --policy p=f32,c=bf16,o=f32,gemm=f8 --fp8-scaling mxfp8 | FileCheck %s
// CHECK: stablehlo.composite "xla.scaled_dot"
// CHECK: func.func private @xla.scaled_dot

func.func public @main(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return %d : tensor<32x16xf32>
}
