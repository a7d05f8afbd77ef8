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
//
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-numerics{collect=provenance})' | FileCheck %s

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
