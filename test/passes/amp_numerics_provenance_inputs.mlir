// amp-numerics{collect=provenance} alone: the input regions. Region 0 is
// main's arguments that have no name (and those that are not floats);
// each argument tree JAX named (the root of the argument's name location:
// `params`, `batch`) is an input region of its own, or each of its leaves
// where the tree has at most 16, so that a NaN in the batch is reported as
// the batch's, with the leaf's path. An input is checked before any
// rounding: here the batch's f16 rounding, which carries the argument's
// own name and so is in no region, does not hide the batch from its check.
//
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s

// CHECK-LABEL: func.func public @main
// CHECK-SAME: amp.nonfinite_regions = [
// CHECK-SAME: {format = "", inputs = [], loc = "", primitives = [], values = 0 : i64},
// CHECK-SAME: {format = "f32", inputs = [], loc = "loc(\22params['w']\22)", primitives = [], values = 1 : i64},
// CHECK-SAME: {format = "f32", inputs = [], loc = "loc(\22batch[0]\22)", primitives = [], values = 1 : i64},
// CHECK-SAME: {format = "f32", inputs = [], loc = "loc(\22batch[1]\22)", primitives = [], values = 1 : i64},
// CHECK-SAME: {format = "f32", inputs = [2, 1, 3], loc = "{{.*}}jvp(Model)/Dense_0/dot_general{{.*}}", primitives = ["dot_general"], values = 1 : i64}]
// The unused scale is not checked (it is not handed on). The batch's first
// leaf is checked as the f32 argument, not its rounding; the dense reads
// it through the rounding, which is of the batch's region (above, its
// inputs).
// CHECK-NOT: stablehlo.reduce(%arg0
// CHECK-DAG: stablehlo.reduce(%arg3 init: {{.*}}), (%arg3 init:
// CHECK-DAG: stablehlo.reduce(%arg2 init: {{.*}}), (%arg2 init:
// CHECK-DAG: stablehlo.reduce(%arg1 init: {{.*}}), (%arg1 init:
// CHECK-NOT: stablehlo.reduce(%arg0
// The masks: bit r for a check of region r (params 1, batch 2 and 3, the
// dense 4).
// CHECK: stablehlo.constant dense<{{\[\[}}2], [4], [8], [16]]> : tensor<4x1xi32>

func.func public @main(%scale: tensor<f32>, %w: tensor<8x8xf32> loc("params['w']"), %x: tensor<4x8xf32> loc("batch[0]"), %y: tensor<4x8xf32> loc("batch[1]"), %n: tensor<i32> loc("batch[2]")) -> tensor<4x8xf32> {
  %xl = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xf16> loc("batch[0]")
  %xw = stablehlo.convert %xl : (tensor<4x8xf16>) -> tensor<4x8xf32> loc("batch[0]")
  %d = stablehlo.dot_general %xw, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32> loc(#dense)
  %s = stablehlo.add %d, %y : tensor<4x8xf32> loc(#dense)
  return %s : tensor<4x8xf32>
}
#dense = loc("jit(step)/jvp(Model)/Dense_0/dot_general"("model.py":10:1))
