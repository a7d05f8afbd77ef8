// amp-numerics{collect=provenance} alone: main's body split into regions
// (name scope and transformation; the line too where no scope of the
// user's is left without JAX's wrappers), every float value a region hands
// on checked for NaN and infinity next to the op that makes it (one
// variadic reduction), the bits appended as amp.nonfinite i32[2, words],
// the regions listed on main. Region 0 is main's arguments; an op with no
// location joins its first operand's region; constants are in none; a loop
// is one op of its region. A
// value whose non-finite elements surely reach another checked value of
// its region (through a widening or a rounding convert) is not checked.
//
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s --check-prefix=REGIONS
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=none})' | FileCheck %s --check-prefix=NONE

// The regions, in the order of their first op: the inputs; forward of
// Model/Dense_0 (scoped: one region for both lines); the loss's own forward
// ops (`jvp(loss)` is no scope: by line); the backward of Model/Dense_0 (a
// different transformation); the loop. A region's format is the one its
// values were last rounded to: the loss's sum is checked as its widening to
// f32, and it was computed, and could overflow, in bf16.
// REGIONS: amp.nonfinite_regions = [
// REGIONS-SAME: {format = "bf16", inputs = [], loc = "", primitives = [], values = 2 : i64},
// REGIONS-SAME: {format = "bf16", inputs = [0], loc = "{{.*}}jvp(Model)/Dense_0/dot_general{{.*}}", primitives = ["dot_general", "tanh"], values = 1 : i64},
// REGIONS-SAME: {format = "bf16", inputs = [1], loc = "{{.*}}jvp(loss)/reduce_sum{{.*}}", primitives = ["reduce_sum"], values = 1 : i64},
// REGIONS-SAME: {format = "f8e4m3fn", inputs = [2, 0], loc = "{{.*}}transpose(jvp(Model))/Dense_0/mul{{.*}}", primitives = ["mul"], values = 1 : i64},
// REGIONS-SAME: {format = "f8e4m3fn", inputs = [3], loc = "{{.*}}jvp(loss)/while{{.*}}", primitives = ["while"], values = 1 : i64}]

// CHECK-LABEL: func.func public @main
// CHECK-SAME: -> (tensor<f32>, tensor<4x8xbf16>, tensor<4x8xf8E4M3FN>, tensor<2x1xi32> {amp.nonfinite})
// The inputs, checked at the top: each one's largest and smallest elements
// from 0 (in f32: a widening keeps NaN and infinities), one variadic
// reduction that reads it once (a NaN stays in the largest, an infinity is
// the largest or the smallest). Their readers that may write over them
// (here the multiply, an elementwise op) read them after every input's
// check, as `x - any(largest < 0)`: exactly x, which XLA cannot compute
// sooner (it would copy a donated input the step overwrites). The GEMM
// reads them as they are: a hold would make XLA materialize `x - 0`.
// CHECK: %[[A1W:.*]] = stablehlo.convert %arg1 : (tensor<8x8xbf16>) -> tensor<8x8xf32>
// CHECK: %[[A1:.*]]:2 = stablehlo.reduce(%[[A1W]] init: {{.*}}), (%[[A1W]] init: {{.*}}) across dimensions = [0, 1]
// CHECK: stablehlo.maximum
// CHECK: stablehlo.minimum
// CHECK: %[[A0W:.*]] = stablehlo.convert %arg0
// CHECK: %[[A0:.*]]:2 = stablehlo.reduce(%[[A0W]] init: {{.*}}), (%[[A0W]] init: {{.*}}) across dimensions = [0, 1]
// CHECK: %[[BELOW:.*]] = stablehlo.compare LT
// CHECK: %[[NEVER:.*]] = stablehlo.reduce(%[[BELOW]] init: {{.*}}) applies stablehlo.or
// CHECK: %[[X:.*]] = stablehlo.subtract %arg0
// CHECK-NOT: stablehlo.subtract %arg1
// The dot's value stays inside its region (read by tanh, same region): not
// checked. tanh's value leaves it: checked right after tanh.
// CHECK: %[[DOT:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NOT: stablehlo.convert %[[DOT]]
// CHECK: %[[TANH:.*]] = stablehlo.tanh %[[DOT]]
// CHECK-NEXT: %[[TW:.*]] = stablehlo.convert %[[TANH]]
// CHECK: stablehlo.reduce(%[[TW]] init: {{.*}}), (%[[TW]] init:
// The constant is in no region; the convert without a location joins its
// operand's region (the loss's). The sum leaves the region too, but its
// widening, returned, is checked and has its non-finite values: the sum
// is not checked itself. So for the product, returned, and its FP8
// rounding (same location, same region).
// CHECK: %[[SUM:.*]] = stablehlo.reduce(%[[TANH]] init: {{.*}}) applies stablehlo.add
// CHECK: %[[WIDE:.*]] = stablehlo.convert %[[SUM]] : (tensor<bf16>) -> tensor<f32>
// CHECK-NEXT: stablehlo.constant
// CHECK-NEXT: stablehlo.constant
// CHECK-NEXT: stablehlo.reduce(%[[WIDE]] init: {{.*}}), (%[[WIDE]] init: {{.*}}) across dimensions = []
// CHECK: %[[MUL:.*]] = stablehlo.multiply {{.*}}, %[[X]]
// CHECK: %[[Q:.*]] = stablehlo.convert %[[MUL]]
// CHECK-NEXT: %[[QW:.*]] = stablehlo.convert %[[Q]] : (tensor<4x8xf8E4M3FN>) -> tensor<4x8xf32>
// CHECK: stablehlo.reduce(%[[QW]] init: {{.*}}), (%[[QW]] init:
// The rounding is made from an input by elementwise ops, which XLA computes
// in the check's kernel: its reader (the loop) waits for the check too.
// CHECK: stablehlo.compare LT
// CHECK: %[[QHELD:.*]] = stablehlo.subtract %[[Q]]
// CHECK: %[[LOOP:.*]]:2 = stablehlo.while({{.*}}, %{{.*}} = %[[QHELD]])
// CHECK: stablehlo.convert %[[LOOP]]#1
// Bits: the checks' extremes as one vector, compared there (NaN: x != x;
// infinity: largest == inf or smallest == -inf), region r at bit r of row
// 0 (NaN) and row 1 (infinity): the inputs are region 0, tanh 1, the
// widening 2, the rounding 3, the loop 4.
// CHECK: %[[LARGEST:.*]] = stablehlo.concatenate {{.*}} -> tensor<6xf32>
// CHECK: %[[SMALLEST:.*]] = stablehlo.concatenate {{.*}} -> tensor<6xf32>
// CHECK: %[[MASKS:.*]] = stablehlo.constant dense<{{\[\[}}1], [1], [2], [4], [8], [16]]> : tensor<6x1xi32>
// CHECK: %[[NAN:.*]] = stablehlo.compare NE, %[[LARGEST]], %[[LARGEST]]
// CHECK: stablehlo.compare EQ, %[[LARGEST]]
// CHECK: stablehlo.compare EQ, %[[SMALLEST]]
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
