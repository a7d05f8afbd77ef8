// amp-numerics{collect=provenance} alone: the format a region lists is the
// one its checked values were last rounded to, so that an infinity an f16
// rounding made is reported as an f16 overflow. A value stored in f16 and
// read back in f32 (`convert`, `optimization_barrier`, `convert`: what
// storage precision writes) is checked as the f32 value its region hands
// on, and lists f16; a value that was never narrower lists its own format.
//
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s

// CHECK-LABEL: func.func public @main
// CHECK-SAME: amp.nonfinite_regions = [
// CHECK-SAME: {format = "f32", inputs = [], loc = "", primitives = [], values = 1 : i64},
// CHECK-SAME: {format = "f16", inputs = [0], loc = "{{.*}}transpose(jvp())/add_any{{.*}}", primitives = ["add_any"], values = 1 : i64},
// CHECK-SAME: {format = "f32", inputs = [1, 0], loc = "{{.*}}transpose(jvp(Model))/Dense_0/mul{{.*}}", primitives = ["mul"], values = 1 : i64}]
// The stored value's f32 copy is what the region hands on, and is checked.
// CHECK: %[[SUM:.*]] = stablehlo.add %arg0, %arg0 : tensor<4x8xf32>
// CHECK-NEXT: %[[LOW:.*]] = stablehlo.convert %[[SUM]] : (tensor<4x8xf32>) -> tensor<4x8xf16>
// CHECK-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[LOW]]
// CHECK-NEXT: %[[BACK:.*]] = stablehlo.convert %[[HELD]] : (tensor<4x8xf16>) -> tensor<4x8xf32>
// CHECK: stablehlo.reduce(%[[BACK]] init: {{.*}}), (%[[BACK]] init:

func.func public @main(%g: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %s = stablehlo.add %g, %g : tensor<4x8xf32> loc(#loss)
  %low = stablehlo.convert %s : (tensor<4x8xf32>) -> tensor<4x8xf16> loc(#loss)
  %held = stablehlo.optimization_barrier %low : tensor<4x8xf16> loc(#loss)
  %back = stablehlo.convert %held : (tensor<4x8xf16>) -> tensor<4x8xf32> loc(#loss)
  %m = stablehlo.multiply %back, %g : tensor<4x8xf32> loc(#grad)
  return %m : tensor<4x8xf32>
}
#loss = loc("jit(step)/transpose(jvp())/add_any"("model.py":20:3))
#grad = loc("jit(step)/transpose(jvp(Model))/Dense_0/mul"("model.py":10:1))
