// --debug-info prints locations: the original ones (file, line, column of
// the input) on the original ops.

// Locations name the input file (jaxlib parses text under the name "-").
// RUN: amp-opt %s --target gpu --debug-info | FileCheck %s
// CHECK: stablehlo.dot_general {{.*}} loc(#[[DOT:loc[0-9]*]])
// CHECK: #[[DOT]] = loc("{{[^"]*}}debug_info.mlir":[[@LINE+3]]:8)

func.func public @main(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
