// amp-numerics{collect=provenance} alone: main's body split into regions
// (name scope and transformation; the line too where no scope of the
// user's is left without JAX's wrappers), every float value a region hands
// on checked for NaN and infinity next to the op that makes it (one
// variadic reduction), the bits appended as amp.nonfinite i32[2, words],
// the regions listed on main. Region 0 is main's arguments; an op with no
// location joins its first operand's region; constants are in none; a loop
// is one op of its region; FP8 (no infinity) gets only the NaN check. A
// value whose non-finite elements surely reach another checked value of
// its region (through a widening or a rounding convert) is not checked.
//
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s --check-prefix=REGIONS
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=none})' | FileCheck %s --check-prefix=NONE

// The regions, in the order of their first op: the inputs; forward of
// Model/Dense_0 (scoped: one region for both lines); the loss's own forward
// ops (`jvp(loss)` is no scope: by line); the backward of Model/Dense_0 (a
// different transformation); the loop.
// REGIONS: amp.nonfinite_regions = [
// REGIONS-SAME: {format = "bf16", inputs = [], loc = "", primitives = [], values = 2 : i64},
// REGIONS-SAME: {format = "bf16", inputs = [0], loc = "{{.*}}jvp(Model)/Dense_0/dot_general{{.*}}", primitives = ["dot_general", "tanh"], values = 1 : i64},
// REGIONS-SAME: {format = "f32", inputs = [1], loc = "{{.*}}jvp(loss)/reduce_sum{{.*}}", primitives = ["reduce_sum"], values = 1 : i64},
// REGIONS-SAME: {format = "f8e4m3fn", inputs = [2, 0], loc = "{{.*}}transpose(jvp(Model))/Dense_0/mul{{.*}}", primitives = ["mul"], values = 1 : i64},
// REGIONS-SAME: {format = "f8e4m3fn", inputs = [3], loc = "{{.*}}jvp(loss)/while{{.*}}", primitives = ["while"], values = 1 : i64}]

// CHECK-LABEL: func.func public @main
// CHECK-SAME: -> (tensor<f32>, tensor<4x8xbf16>, tensor<4x8xf8E4M3FN>, tensor<2x1xi32> {amp.nonfinite})
// The inputs, checked at the top: NaN (x != x) and infinity (|x| == inf),
// one variadic reduction each.
// CHECK: %[[ANAN:.*]] = stablehlo.compare NE, %arg1, %arg1
// CHECK: %[[ABS:.*]] = stablehlo.abs %arg1
// CHECK: %[[AINF:.*]] = stablehlo.compare EQ, %[[ABS]]
// CHECK: stablehlo.reduce(%[[ANAN]] init: {{.*}}), (%[[AINF]] init: {{.*}}) across dimensions = [0, 1]
// CHECK: stablehlo.or
// CHECK: stablehlo.compare NE, %arg0, %arg0
// The dot's value stays inside its region (read by tanh, same region): not
// checked. tanh's value leaves it: checked right after tanh.
// CHECK: %[[DOT:.*]] = stablehlo.dot_general
// CHECK-NOT: stablehlo.compare NE, %[[DOT]]
// CHECK: %[[TANH:.*]] = stablehlo.tanh %[[DOT]]
// CHECK-NEXT: stablehlo.compare NE, %[[TANH]], %[[TANH]]
// The constant is in no region; the convert without a location joins its
// operand's region (the loss's). The sum leaves the region too, but its
// widening, returned, is checked and has its non-finite values: the sum
// is not checked itself. So for the product, returned, and its FP8
// rounding (same location, same region).
// CHECK: %[[SUM:.*]] = stablehlo.reduce(%[[TANH]] init:
// CHECK-NOT: stablehlo.compare NE, %[[SUM]], %[[SUM]]
// CHECK: %[[WIDE:.*]] = stablehlo.convert %[[SUM]]
// CHECK-NEXT: stablehlo.compare NE, %[[WIDE]], %[[WIDE]]
// CHECK: %[[MUL:.*]] = stablehlo.multiply
// CHECK-NOT: stablehlo.compare NE, %[[MUL]], %[[MUL]]
// FP8 has no infinity: only the NaN check.
// CHECK: %[[Q:.*]] = stablehlo.convert %[[MUL]]
// CHECK-NEXT: %[[QNAN:.*]] = stablehlo.compare NE, %[[Q]], %[[Q]]
// CHECK: stablehlo.reduce(%[[QNAN]] init: {{.*}}) applies stablehlo.or
// CHECK: %[[LOOP:.*]]:2 = stablehlo.while
// CHECK: stablehlo.compare NE, %[[LOOP]]#1, %[[LOOP]]#1
// CHECK-NOT: stablehlo.abs %[[LOOP]]#1
// Bits: region r at bit r of row 0 (NaN) and row 1 (infinity).
// CHECK: stablehlo.shift_left
// CHECK: %[[BITS:.*]] = stablehlo.concatenate {{.*}}, dim = 0 : (tensor<1x1xi32>, tensor<1x1xi32>) -> tensor<2x1xi32>
// CHECK: return {{.*}}, %[[BITS]] :

// NONE: func.func public @main({{.*}}) -> (tensor<f32>, tensor<4x8xbf16>, tensor<4x8xf8E4M3FN>) {

func.func public @main(%x: tensor<4x8xbf16>, %w: tensor<8x8xbf16>) -> (tensor<f32>, tensor<4x8xbf16>, tensor<4x8xf8E4M3FN>) {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16> loc(#dense)
  %t = stablehlo.tanh %d : tensor<4x8xbf16> loc(#dense_tanh)
  %zero = stablehlo.constant dense<0.0> : tensor<bf16>
  %s = stablehlo.reduce(%t init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8xbf16>, tensor<bf16>) -> tensor<bf16> loc(#loss)
  %wide = stablehlo.convert %s : (tensor<bf16>) -> tensor<f32> loc(#convert)
  %sb = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<bf16>) -> tensor<4x8xbf16> loc(#grad)
  %g = stablehlo.multiply %sb, %x : tensor<4x8xbf16> loc(#grad)
  %q = stablehlo.convert %g : (tensor<4x8xbf16>) -> tensor<4x8xf8E4M3FN> loc(#grad)
  %i0 = stablehlo.constant dense<0> : tensor<i32>
  %r:2 = stablehlo.while(%i = %i0, %v = %q) : tensor<i32>, tensor<4x8xf8E4M3FN>
    cond {
      %n = stablehlo.constant dense<2> : tensor<i32>
      %c = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %one = stablehlo.constant dense<1> : tensor<i32>
      %j = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %j, %v : tensor<i32>, tensor<4x8xf8E4M3FN>
    } loc(#loop)
  return %wide, %g, %r#1 : tensor<f32>, tensor<4x8xbf16>, tensor<4x8xf8E4M3FN>
}
#dense = loc("jit(step)/jvp(Model)/Dense_0/dot_general"(callsite("f"("flax/linen/linear.py":280:3) at "g"("model.py":10:1))))
#dense_tanh = loc("jit(step)/jvp(Model)/Dense_0/tanh"("model.py":11:3))
#loss = loc("jit(step)/jvp(loss)/reduce_sum"("model.py":12:3))
#convert = loc(unknown)
#grad = loc("jit(step)/transpose(jvp(Model))/Dense_0/mul"("model.py":10:1))
#loop = loc("jit(step)/jvp(loss)/while"("model.py":14:1))
