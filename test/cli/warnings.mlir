// The pass warns when a float constant does not fit the compute dtype and is
// saturated; amp-opt prints the warning on standard error, with the input's
// file name, and still succeeds.

// RUN: amp-opt %s --target gpu --policy p=f32,c=f16,o=f32 -o %t.mlir 2>&1 | FileCheck %s
// CHECK: warnings.mlir{{.*}}: warning: float constants out of range of f16 were saturated to its largest finite value
// RUN: FileCheck %s --check-prefix=MODULE --input-file %t.mlir
// MODULE: stablehlo.constant dense<{{.*}}> : tensor<4x8xf16>

func.func public @clamp(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %cst = stablehlo.constant dense<1.000000e+06> : tensor<4x8xf32>
  %1 = stablehlo.minimum %0, %cst : tensor<4x8xf32>
  %2 = stablehlo.dot_general %1, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
