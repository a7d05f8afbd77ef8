// A float constant at f32's largest finite magnitude (finfo(f32).min, the
// fill of an attention mask) becomes the compute dtype's largest finite
// value without a warning: that is what it means. Others that do not fit
// still warn (warnings.mlir).

// RUN: amp-opt %s --target gpu --policy p=f32,c=bf16,o=f32 -o %t.mlir 2>&1 | FileCheck %s --allow-empty --check-prefix=QUIET
// QUIET-NOT: warning
// RUN: FileCheck %s --input-file %t.mlir
// CHECK: stablehlo.constant dense<-3.389530e+38> : tensor<4x8xbf16>

func.func public @masked(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>, %mask: tensor<4x8xi1>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %cst = stablehlo.constant dense<-3.40282347E+38> : tensor<4x8xf32>
  %1 = stablehlo.select %mask, %0, %cst : tensor<4x8xi1>, tensor<4x8xf32>
  %2 = stablehlo.dot_general %1, %arg2, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
