// amp-opt --numerics stats: main returns, after its own results, the
// statistics of each low-precision GEMM operand (amp.gemm_amax f32[G, 2],
// amp.gemm_counts i32[G, 2, 3]); --numerics provenance: the non-finite
// bits of each region (amp.nonfinite i32[2, words]) and main lists the
// regions; a bad value names the accepted ones.

// RUN: amp-opt %s --target gpu --dot-result f32 --policy p=f32,c=bf16,o=f32 --numerics stats | FileCheck %s
// CHECK: func.func public @main({{.*}}) -> (tensor<32x16xf32>, tensor<1x2xf32> {amp.gemm_amax}, tensor<1x2x3xi32> {amp.gemm_counts})
// CHECK: stablehlo.dot_general {{.*}} : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>

// RUN: amp-opt %s --target gpu --dot-result f32 --policy p=f32,c=bf16,o=f32 --numerics provenance | FileCheck %s --check-prefix=PROVENANCE
// PROVENANCE: func.func public @main({{.*}}) -> (tensor<32x16xf32>, tensor<2x1xi32> {amp.nonfinite}) attributes {amp.nonfinite_regions = [{format = "f32", inputs = [], loc = "", primitives = [], values = 2 : i64}
// PROVENANCE: stablehlo.dot_general {{.*}} : (tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<32x16xf32>

// RUN: amp-opt %s --target gpu --dot-result f32 --policy p=f32,c=bf16,o=f32 --numerics none | FileCheck %s --check-prefix=NONE
// NONE: func.func public @main({{.*}}) -> tensor<32x16xf32>

// RUN: not amp-opt %s --numerics stat 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: amp-opt: error: {{.*}}numerics{{.*}}accepted: none, stats, provenance

func.func public @main(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return %d : tensor<32x16xf32>
}
