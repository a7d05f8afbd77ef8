// amp-numerics{collect=provenance} alone: which readers wait for a check
// of a value that XLA may compute from a donated input in the check's
// kernel. The output that takes the input's buffer is written in place, so
// what writes it must come after every such check, or XLA copies the
// input.
// - An input: only its readers on the way to the return (here the update
//   of the parameter, an elementwise op) read it after the inputs' check,
//   as `p - any(largest < 0)`. The parameter's cast for the forward pass
//   and the GEMMs read it directly: held, they would start only after
//   every input's check, and XLA would store `p - 0` for a GEMM.
// - A value made from an input by elementwise ops (the cast, the update):
//   all its readers read it after its own check, the GEMM too (which
//   stores the cast anyway). The update then waits for the cast's check
//   through the GEMM.
// - An input read inside a conditional whose result is returned: the
//   conditional writes the output, so its readers inside wait too.
// - Any other value of at least 64 MiB: its first elementwise reader waits
//   for its check, through `select(all(x == x or x != x), x, -x)`, the
//   third result of the check's reduction; smaller values are not held.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: amp-opt %t/plain.mlir --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s
// RUN: amp-opt %t/nested.mlir --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s --check-prefix=NESTED
// RUN: amp-opt %t/large.mlir --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s --check-prefix=LARGE

//--- plain.mlir

// CHECK-LABEL: func.func public @main
// The inputs' checks, then the one flag they share.
// CHECK: stablehlo.reduce
// CHECK: stablehlo.reduce
// CHECK: %[[BELOW:.*]] = stablehlo.compare LT
// CHECK: %[[NEVER:.*]] = stablehlo.reduce(%[[BELOW]] init: {{.*}}) applies stablehlo.or
// CHECK: %[[FLAG:.*]] = stablehlo.convert %[[NEVER]] : (tensor<i1>) -> tensor<f32>
// CHECK: %[[ZERO:.*]] = stablehlo.broadcast_in_dim %[[FLAG]]
// CHECK: %[[HELD:.*]] = stablehlo.subtract %arg0, %[[ZERO]] : tensor<8x8xf32>
// CHECK-NOT: stablehlo.subtract %arg
// CHECK: %[[CAST:.*]] = stablehlo.convert %arg0 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK: %[[CASTHELD:.*]] = stablehlo.subtract %[[CAST]], %{{.*}} : tensor<8x8xbf16>
// CHECK: %[[Y:.*]] = stablehlo.dot_general %arg1, %[[CASTHELD]]
// CHECK: stablehlo.dot_general %[[Y]], %arg1
// CHECK: %[[NEW:.*]] = stablehlo.subtract %[[HELD]], %{{.*}} : tensor<8x8xf32>
// CHECK: stablehlo.reduce(%[[NEW]] init: {{.*}}), (%[[NEW]] init: {{.*}})
// CHECK: %[[NEWHELD:.*]] = stablehlo.subtract %[[NEW]], %{{.*}} : tensor<8x8xf32>
// CHECK: return %[[NEWHELD]], {{.*}} : tensor<8x8xf32>, tensor<2x1xi32>

func.func public @main(%p: tensor<8x8xf32>, %x: tensor<4x8xbf16>) -> tensor<8x8xf32> {
  %w = stablehlo.convert %p : (tensor<8x8xf32>) -> tensor<8x8xbf16> loc(#cast)
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16> loc(#dense)
  %g = stablehlo.dot_general %y, %x, contracting_dims = [0] x [0] : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<8x8xbf16> loc(#grad)
  %gw = stablehlo.convert %g : (tensor<8x8xbf16>) -> tensor<8x8xf32> loc(#grad)
  %new = stablehlo.subtract %p, %gw : tensor<8x8xf32> loc(#update)
  return %new : tensor<8x8xf32>
}

#cast = loc("jit(step)/convert_element_type"("train.py":3:1))
#dense = loc("jit(step)/jvp(Model)/Dense_0/dot_general"("model.py":10:1))
#grad = loc("jit(step)/transpose(jvp(Model))/Dense_0/dot_general"("model.py":10:1))
#update = loc("jit(step)/sub"("optax/_src/update.py":40:1))

//--- nested.mlir

// NESTED-LABEL: func.func public @main
// NESTED: %[[HELD:.*]] = stablehlo.subtract %arg0, %{{.*}} : tensor<8xf32>
// NESTED: "stablehlo.if"
// NESTED: stablehlo.multiply %[[HELD]], %[[HELD]] : tensor<8xf32>
// NESTED: stablehlo.return %[[HELD]] : tensor<8xf32>

func.func public @main(%p: tensor<8xf32>, %n: tensor<i32>) -> tensor<8xf32> {
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %c = stablehlo.compare GT, %n, %zero : (tensor<i32>, tensor<i32>) -> tensor<i1> loc(#cond)
  %r = "stablehlo.if"(%c) ({
    %a = stablehlo.multiply %p, %p : tensor<8xf32> loc(#square)
    stablehlo.return %a : tensor<8xf32>
  }, {
    stablehlo.return %p : tensor<8xf32>
  }) : (tensor<i1>) -> tensor<8xf32> loc(#cond)
  return %r : tensor<8xf32>
}

#cond = loc("jit(step)/cond"("train.py":5:1))
#square = loc("jit(step)/cond/mul"("train.py":6:1))

//--- large.mlir

// LARGE-LABEL: func.func public @main
// LARGE: %[[BIG:.*]] = stablehlo.dot_general {{.*}} -> tensor<4096x4096xf32>
// LARGE: %[[BOTH:.*]] = stablehlo.or
// LARGE: %[[BIGCHECK:.*]]:3 = stablehlo.reduce(%[[BIG]] init: {{.*}}), (%[[BIG]] init: {{.*}}), (%[[BOTH]] init: {{.*}}) across dimensions = [0, 1]
// LARGE: %[[ALL:.*]] = stablehlo.broadcast_in_dim %[[BIGCHECK]]#2, dims = [] : (tensor<i1>) -> tensor<4096x4096xi1>
// LARGE-NEXT: %[[NEG:.*]] = stablehlo.negate %[[BIG]]
// LARGE-NEXT: %[[HELD:.*]] = stablehlo.select %[[ALL]], %[[BIG]], %[[NEG]]
// LARGE: %[[SMALL:.*]] = stablehlo.dot_general {{.*}} -> tensor<2048x4096xf32>
// LARGE: stablehlo.reduce(%[[SMALL]] init: {{.*}}), (%[[SMALL]] init: {{.*}}) across dimensions = [0, 1]
// LARGE-NOT: stablehlo.select
// LARGE: stablehlo.exponential %[[HELD]]
// LARGE-NOT: stablehlo.select
// LARGE: stablehlo.exponential %[[SMALL]]

func.func public @main(%x: tensor<4096x8xf32>, %y: tensor<8x4096xf32>, %z: tensor<2048x8xf32>) -> (tensor<4096x4096xf32>, tensor<2048x4096xf32>) {
  %big = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0] : (tensor<4096x8xf32>, tensor<8x4096xf32>) -> tensor<4096x4096xf32> loc(#dense)
  %small = stablehlo.dot_general %z, %y, contracting_dims = [1] x [0] : (tensor<2048x8xf32>, tensor<8x4096xf32>) -> tensor<2048x4096xf32> loc(#dense)
  %e = stablehlo.exponential %big : tensor<4096x4096xf32> loc(#act)
  %f = stablehlo.exponential %small : tensor<2048x4096xf32> loc(#act)
  return %e, %f : tensor<4096x4096xf32>, tensor<2048x4096xf32>
}

#dense = loc("jit(step)/jvp(Model)/Dense_0/dot_general"("model.py":10:1))
#act = loc("jit(step)/jvp(Model)/exp"("model.py":11:1))
