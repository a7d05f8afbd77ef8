// The scopes option inside stock mlir-opt, through the plugin, on
// generic-form StableHLO with the names JAX gives ops.

// RUN: mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --pass-pipeline='builtin.module(amp-insert-converts{policy=p=f32,c=bf16,o=f32 target=gpu dot-result=f32 scopes=head=f32})' | FileCheck %s
// RUN: not mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --pass-pipeline='builtin.module(amp-insert-converts{scopes=hed=f32})' 2>&1 | FileCheck %s --check-prefix=NOMATCH
// NOMATCH: error: invalid option 'scopes': pattern 'hed' matches no scope (nearest: Net/head, Net/mlp)

// The mlp's dot goes low; the head's, forward and backward, stays f32.
// CHECK-LABEL: func.func public @main(
// CHECK: "stablehlo.dot_general"{{.*}} : (tensor<16x32xbf16>, tensor<32x32xbf16>) -> tensor<16x32xf32>
// CHECK: "stablehlo.dot_general"{{.*}} : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
// CHECK: "stablehlo.dot_general"{{.*}} : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
module @jit_step {
  func.func public @main(%x: tensor<16x32xf32>, %w1: tensor<32x32xf32>, %w2: tensor<32x32xf32>, %g: tensor<16x32xf32>) -> (tensor<16x32xf32>, tensor<16x32xf32>) {
    %h = "stablehlo.dot_general"(%x, %w1) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}> : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/jvp(Net)/mlp/dot_general")
    %t = "stablehlo.tanh"(%h) : (tensor<16x32xf32>) -> tensor<16x32xf32> loc("jit(step)/jvp(Net)/mlp/tanh")
    %y = "stablehlo.dot_general"(%t, %w2) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}> : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/jvp(Net)/head/dot_general")
    %dt = "stablehlo.dot_general"(%g, %w2) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>}> : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32> loc("jit(step)/transpose(jvp(Net))/head/dot_general")
    "func.return"(%y, %dt) : (tensor<16x32xf32>, tensor<16x32xf32>) -> ()
  }
}
