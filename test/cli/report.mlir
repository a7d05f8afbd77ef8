// --report prints the decisions to standard error; the module goes to -o.

// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --report -o %t.mlir 2>&1 | FileCheck %s
// RUN: FileCheck %s --check-prefix=MODULE --input-file %t.mlir
// MODULE: func.func public @mlp
// MODULE: func.func public @softmax

// CHECK-NOT: module
// CHECK: amp-insert-converts: policy p=f32,c=bf16,o=f32, level O2, target gpu
// CHECK-NEXT: lowered to bf16: {{[0-9]+}} ops ({{.*}}dot_general 2{{.*}})
// CHECK-NEXT: kept f32: 0 ops
// CHECK-NEXT: converts inserted: 5 (module has 5)
func.func public @mlp(%arg0: tensor<8x16xf32>, %arg1: tensor<16xf32>, %arg2: tensor<16x8xf32>, %arg3: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg3, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %1 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<16xf32>) -> tensor<4x16xf32>
  %2 = stablehlo.add %0, %1 : tensor<4x16xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
  %4 = stablehlo.maximum %2, %3 : tensor<4x16xf32>
  %5 = stablehlo.dot_general %4, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %5 : tensor<4x8xf32>
}

// -----

// CHECK: amp-insert-converts: policy p=f32,c=bf16,o=f32, level O2, target gpu
// CHECK-NEXT: lowered to bf16: 1 op (dot_general 1)
// CHECK-NEXT: kept f32: {{[0-9]+}} ops
// CHECK-DAG: numerically sensitive op (transcendental or statistic): 1 (exponential 1)
// CHECK-DAG: numerically sensitive op (sum reduction): 1 (reduce 1)
// CHECK: converts inserted: 2 (module has 2)
// CHECK-NOT: module
func.func public @softmax(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.subtract %arg0, %1 : tensor<4x8xf32>
  %3 = stablehlo.exponential %2 : tensor<4x8xf32>
  %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %4 = stablehlo.reduce(%3 init: %cst_0) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %5 = stablehlo.broadcast_in_dim %4, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %6 = stablehlo.divide %3, %5 : tensor<4x8xf32>
  %7 = stablehlo.dot_general %6, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %7 : tensor<4x8xf32>
}
