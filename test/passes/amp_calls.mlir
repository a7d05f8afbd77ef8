// Rules follow calls: amp-insert-converts specialises each call of a private
// function in its caller's context, so a program that calls a function
// (`jnp.var`, `jax.nn.relu`, a nested jit) and the same program with the
// function's body written inline get the same decisions. Each program below
// comes in both forms; their rewritten modules, decisions included, must be
// identical, and the checks say what those decisions are.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: amp-opt %t/call.mlir --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu report=true},amp-fp8-gemms{gemm=f8 report=true})' -o %t/call.out
// RUN: amp-opt %t/inline.mlir --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu report=true},amp-fp8-gemms{gemm=f8 report=true})' -o %t/inline.out
// RUN: diff %t/call.out %t/inline.out
// RUN: FileCheck %s --input-file=%t/call.out
//
// Callees are erased once inlined; a private function nothing called stays,
// and so does a call that carries attributes of its own (Shardy's
// manual-computation bodies travel as such calls).
// RUN: amp-opt %t/kept.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu})' | FileCheck %s --check-prefix=KEPT
//
// An inlined op takes its call site's name path with its own appended (its
// scope and phase are the call's: jnp.var's body is named `mul`, not
// `jit(f)/jvp()/var/mul`) and its frames called from the call's frames, so
// the report's `where` is the user's line even for library code.
// RUN: amp-opt %t/locations.mlir --debug-info --pass-pipeline='builtin.module(amp-insert-converts{target=gpu})' | FileCheck %s --check-prefix=LOC
// RUN: amp-opt %t/kept.mlir --pass-pipeline='builtin.module(amp-insert-converts{target=gpu level=O0})' | FileCheck %s --check-prefix=O0

// Storage. The variance comes from a call: it is a statistic all the same,
// so the normalised data (x - mean) * rsqrt(var + eps), read again after the
// second matrix multiply, is not stored in bf16 (batch norm's backward pass
// cancels across it); the exponential it is made from is not stored either.
// CHECK-LABEL: func.func public @storage(
// CHECK-NOT: func.call
// CHECK: stablehlo.rsqrt
// CHECK: %[[N:.*]] = stablehlo.multiply {{.*}} : tensor<64x128xf32>
// CHECK-NOT: amp_stored
// CHECK: stablehlo.multiply %[[N]], %{{.*}} : tensor<64x128xf32>
// CHECK-NOT: func.func private @var

// jnp.var's specialised body divides by `N - ddof`, a convert of the
// integer it is called with: arithmetic on constants is a constant, so the
// variance is a statistic, x̂ is not stored, and neither is the centred
// residual 2 (x - mean) the body returns for the backward pass.
// CHECK-LABEL: func.func public @storage_ddof(
// CHECK-NOT: func.call
// CHECK-NOT: amp_stored
// CHECK: return
// CHECK-NOT: func.func private @var_ddof

// A function called from two contexts is decided in each: between two
// matrix multiplies its multiply is bf16, after an exponential it is f32.
// CHECK-LABEL: func.func public @two_contexts(
// CHECK: stablehlo.multiply %{{.*}}, %{{.*}} {amp.decision = {{{.*}}precision = "low", reason = "between_low_ops"}} : tensor<64x128xbf16>
// CHECK: stablehlo.multiply %{{.*}}, %{{.*}} {amp.decision = {{{.*}}precision = "f32", reason = "consumes_sensitive"}} : tensor<64x128xf32>
// CHECK-NOT: func.func private @affine

// FP8: the loss seed reaches a dot inside a called function; that dot's
// gradient operand is e5m2, as if written inline.
// CHECK-LABEL: func.func public @fp8_gradient(
// CHECK: stablehlo.convert %{{.*}} : (tensor<32x16xf32>) -> tensor<32x16xf8E5M2>
// CHECK: stablehlo.dot_general {{.*}}gemm = "f8e4m3fn x f8e5m2, current scaling"
// CHECK-NOT: func.func private @grad_w

// Decisions: a comparison that picks integers, of a called function's dot
// result, keeps that dot in f32.
// CHECK-LABEL: func.func public @decision(
// CHECK: stablehlo.dot_general %arg0, %arg1, {{.*}}precision = "f32", reason = "gates_decision"{{.*}} : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
// CHECK-NOT: func.func private @logits

// KEPT-LABEL: func.func public @main(
// KEPT: call @body(%{{.*}}) {mhlo.frontend_attributes = {xla.sdy.manual_axes = "x"}}
// KEPT-NOT: call @twice
// KEPT: func.func private @unused(
// KEPT: func.func private @body(
// KEPT-NOT: func.func private @twice

// LOC-LABEL: func.func public @main(
// LOC: stablehlo.multiply {{.*}} loc(#[[MUL:loc[0-9]*]])
// LOC: stablehlo.add {{.*}} loc(#[[ADD:loc[0-9]*]])
// LOC-DAG: #[[USER:loc[0-9]*]] = loc("model.py":7:3)
// LOC-DAG: #[[HELPER:loc[0-9]*]] = loc("helper.py":2:5)
// LOC-DAG: #[[MUL]] = loc("jit(f)/transpose(jvp(block))/var/mul"(#[[USER]]))
// LOC-DAG: #[[CALLSITE:loc[0-9]*]] = loc(callsite(#[[HELPER]] at #[[USER]]))
// LOC-DAG: #[[ADD]] = loc("jit(f)/transpose(jvp(block))/var/inner/add"(#[[CALLSITE]]))

// O0: call @twice
// O0: func.func private @twice(

//--- call.mlir
func.func public @storage(%x: tensor<64x128xf32>, %w1: tensor<128x128xf32>, %w2: tensor<128x128xf32>) -> tensor<64x128xf32> {
  %h = stablehlo.exponential %x : tensor<64x128xf32>
  %v = func.call @var(%h) : (tensor<64x128xf32>) -> tensor<128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m = stablehlo.divide %s, %count : tensor<128xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %h, %mb : tensor<64x128xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<128xf32>
  %ve = stablehlo.add %v, %eps : tensor<128xf32>
  %r = stablehlo.rsqrt %ve : tensor<128xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %n = stablehlo.multiply %c, %rb : tensor<64x128xf32>
  %y = stablehlo.dot_general %n, %w1, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %y2 = stablehlo.dot_general %y, %w2, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %o = stablehlo.multiply %n, %y2 : tensor<64x128xf32>
  return %o : tensor<64x128xf32>
}
func.func private @var(%h: tensor<64x128xf32>) -> tensor<128xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m = stablehlo.divide %s, %count : tensor<128xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %d = stablehlo.subtract %h, %mb : tensor<64x128xf32>
  %sq = stablehlo.multiply %d, %d : tensor<64x128xf32>
  %ss = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %v = stablehlo.divide %ss, %count : tensor<128xf32>
  return %v : tensor<128xf32>
}

// -----

func.func public @storage_ddof(%x: tensor<64x128xf32>, %w1: tensor<128x128xf32>, %w2: tensor<128x128xf32>) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %h = stablehlo.exponential %x : tensor<64x128xf32>
  %ddof = stablehlo.constant dense<0> : tensor<i32>
  %v:2 = func.call @var_ddof(%h, %ddof) : (tensor<64x128xf32>, tensor<i32>) -> (tensor<128xf32>, tensor<64x128xf32>)
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m = stablehlo.divide %s, %count : tensor<128xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %h, %mb : tensor<64x128xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<128xf32>
  %ve = stablehlo.add %v#0, %eps : tensor<128xf32>
  %r = stablehlo.rsqrt %ve : tensor<128xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %n = stablehlo.multiply %c, %rb : tensor<64x128xf32>
  %y = stablehlo.dot_general %n, %w1, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %y2 = stablehlo.dot_general %y, %w2, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %o = stablehlo.multiply %n, %y2 : tensor<64x128xf32>
  %g = stablehlo.multiply %v#1, %y2 : tensor<64x128xf32>
  return %o, %g : tensor<64x128xf32>, tensor<64x128xf32>
}
func.func private @var_ddof(%h: tensor<64x128xf32>, %ddof: tensor<i32>) -> (tensor<128xf32>, tensor<64x128xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m = stablehlo.divide %s, %count : tensor<128xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %d = stablehlo.subtract %h, %mb : tensor<64x128xf32>
  %sq = stablehlo.multiply %d, %d : tensor<64x128xf32>
  %two = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %d2 = stablehlo.multiply %two, %d : tensor<64x128xf32>
  %ss = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %ddoff = stablehlo.convert %ddof : (tensor<i32>) -> tensor<f32>
  %n = stablehlo.constant dense<64.0> : tensor<f32>
  %nd = stablehlo.subtract %n, %ddoff : tensor<f32>
  %ndb = stablehlo.broadcast_in_dim %nd, dims = [] : (tensor<f32>) -> tensor<128xf32>
  %v = stablehlo.divide %ss, %ndb : tensor<128xf32>
  return %v, %d2 : tensor<128xf32>, tensor<64x128xf32>
}

// -----

func.func public @two_contexts(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<128x128xf32>) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %a = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %sa = func.call @affine(%a) : (tensor<64x128xf32>) -> tensor<64x128xf32>
  %b = stablehlo.dot_general %sa, %w2, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %e = stablehlo.exponential %a : tensor<64x128xf32>
  %se = func.call @affine(%e) : (tensor<64x128xf32>) -> tensor<64x128xf32>
  return %b, %se : tensor<64x128xf32>, tensor<64x128xf32>
}
func.func private @affine(%v: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %two = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %r = stablehlo.multiply %v, %two : tensor<64x128xf32>
  return %r : tensor<64x128xf32>
}

// -----

func.func public @fp8_gradient(%x: tensor<32x64xf32>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x16xf32> {
  %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<32x16xf32>
  %g = func.call @grad_w(%x, %b) : (tensor<32x64xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
  return %g : tensor<64x16xf32>
}
func.func private @grad_w(%x: tensor<32x64xf32>, %dy: tensor<32x16xf32>) -> tensor<64x16xf32> {
  %0 = stablehlo.dot_general %x, %dy, contracting_dims = [0] x [0] : (tensor<32x64xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

func.func public @decision(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xi32> {
  %l = func.call @logits(%x, %w) : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<32x16xf32>
  %p = stablehlo.compare GT, %l, %zero, FLOAT : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xi1>
  %one = stablehlo.constant dense<1> : tensor<32x16xi32>
  %none = stablehlo.constant dense<0> : tensor<32x16xi32>
  %i = stablehlo.select %p, %one, %none : tensor<32x16xi1>, tensor<32x16xi32>
  return %i : tensor<32x16xi32>
}
func.func private @logits(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  return %0 : tensor<32x16xf32>
}

//--- inline.mlir
func.func public @storage(%x: tensor<64x128xf32>, %w1: tensor<128x128xf32>, %w2: tensor<128x128xf32>) -> tensor<64x128xf32> {
  %h = stablehlo.exponential %x : tensor<64x128xf32>
  %zero0 = stablehlo.constant dense<0.0> : tensor<f32>
  %s0 = stablehlo.reduce(%h init: %zero0) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count0 = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m0 = stablehlo.divide %s0, %count0 : tensor<128xf32>
  %mb0 = stablehlo.broadcast_in_dim %m0, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %d = stablehlo.subtract %h, %mb0 : tensor<64x128xf32>
  %sq = stablehlo.multiply %d, %d : tensor<64x128xf32>
  %ss = stablehlo.reduce(%sq init: %zero0) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %v = stablehlo.divide %ss, %count0 : tensor<128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m = stablehlo.divide %s, %count : tensor<128xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %h, %mb : tensor<64x128xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<128xf32>
  %ve = stablehlo.add %v, %eps : tensor<128xf32>
  %r = stablehlo.rsqrt %ve : tensor<128xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %n = stablehlo.multiply %c, %rb : tensor<64x128xf32>
  %y = stablehlo.dot_general %n, %w1, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %y2 = stablehlo.dot_general %y, %w2, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %o = stablehlo.multiply %n, %y2 : tensor<64x128xf32>
  return %o : tensor<64x128xf32>
}

// -----

func.func public @storage_ddof(%x: tensor<64x128xf32>, %w1: tensor<128x128xf32>, %w2: tensor<128x128xf32>) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %h = stablehlo.exponential %x : tensor<64x128xf32>
  %ddof = stablehlo.constant dense<0> : tensor<i32>
  %zero0 = stablehlo.constant dense<0.0> : tensor<f32>
  %s0 = stablehlo.reduce(%h init: %zero0) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count0 = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m0 = stablehlo.divide %s0, %count0 : tensor<128xf32>
  %mb0 = stablehlo.broadcast_in_dim %m0, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %d = stablehlo.subtract %h, %mb0 : tensor<64x128xf32>
  %sq = stablehlo.multiply %d, %d : tensor<64x128xf32>
  %two = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %d2 = stablehlo.multiply %two, %d : tensor<64x128xf32>
  %ss = stablehlo.reduce(%sq init: %zero0) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %ddoff = stablehlo.convert %ddof : (tensor<i32>) -> tensor<f32>
  %n0 = stablehlo.constant dense<64.0> : tensor<f32>
  %nd = stablehlo.subtract %n0, %ddoff : tensor<f32>
  %ndb = stablehlo.broadcast_in_dim %nd, dims = [] : (tensor<f32>) -> tensor<128xf32>
  %v = stablehlo.divide %ss, %ndb : tensor<128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x128xf32>, tensor<f32>) -> tensor<128xf32>
  %count = stablehlo.constant dense<64.0> : tensor<128xf32>
  %m = stablehlo.divide %s, %count : tensor<128xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %h, %mb : tensor<64x128xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<128xf32>
  %ve = stablehlo.add %v, %eps : tensor<128xf32>
  %r = stablehlo.rsqrt %ve : tensor<128xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %n = stablehlo.multiply %c, %rb : tensor<64x128xf32>
  %y = stablehlo.dot_general %n, %w1, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %y2 = stablehlo.dot_general %y, %w2, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %o = stablehlo.multiply %n, %y2 : tensor<64x128xf32>
  %g = stablehlo.multiply %d2, %y2 : tensor<64x128xf32>
  return %o, %g : tensor<64x128xf32>, tensor<64x128xf32>
}

// -----

func.func public @two_contexts(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<128x128xf32>) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %a = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %two0 = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %sa = stablehlo.multiply %a, %two0 : tensor<64x128xf32>
  %b = stablehlo.dot_general %sa, %w2, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %e = stablehlo.exponential %a : tensor<64x128xf32>
  %two1 = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %se = stablehlo.multiply %e, %two1 : tensor<64x128xf32>
  return %b, %se : tensor<64x128xf32>, tensor<64x128xf32>
}

// -----

func.func public @fp8_gradient(%x: tensor<32x64xf32>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x16xf32> {
  %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<32x16xf32>
  %0 = stablehlo.dot_general %x, %b, contracting_dims = [0] x [0] : (tensor<32x64xf32>, tensor<32x16xf32>) -> tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// -----

func.func public @decision(%x: tensor<32x64xf32>, %w: tensor<64x16xf32>) -> tensor<32x16xi32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<32x64xf32>, tensor<64x16xf32>) -> tensor<32x16xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<32x16xf32>
  %p = stablehlo.compare GT, %0, %zero, FLOAT : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xi1>
  %one = stablehlo.constant dense<1> : tensor<32x16xi32>
  %none = stablehlo.constant dense<0> : tensor<32x16xi32>
  %i = stablehlo.select %p, %one, %none : tensor<32x16xi1>, tensor<32x16xi32>
  return %i : tensor<32x16xi32>
}

//--- kept.mlir
func.func public @main(%x: tensor<64x128xf32>) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %0 = func.call @twice(%x) : (tensor<64x128xf32>) -> tensor<64x128xf32>
  %1 = func.call @body(%x) {mhlo.frontend_attributes = {xla.sdy.manual_axes = "x"}} : (tensor<64x128xf32>) -> tensor<64x128xf32>
  return %0, %1 : tensor<64x128xf32>, tensor<64x128xf32>
}
func.func private @unused(%v: tensor<64x128xf32>) -> tensor<64x128xf32> {
  return %v : tensor<64x128xf32>
}
func.func private @body(%v: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %r = stablehlo.add %v, %v : tensor<64x128xf32>
  return %r : tensor<64x128xf32>
}
func.func private @twice(%v: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %r = stablehlo.add %v, %v : tensor<64x128xf32>
  return %r : tensor<64x128xf32>
}

//--- locations.mlir
func.func public @main(%x: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %0 = func.call @var(%x) : (tensor<64x128xf32>) -> tensor<64x128xf32> loc(#call)
  return %0 : tensor<64x128xf32>
}
func.func private @var(%v: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %m = stablehlo.multiply %v, %v : tensor<64x128xf32> loc("mul")
  %r = stablehlo.add %m, %v : tensor<64x128xf32> loc("inner/add"("helper.py":2:5))
  return %r : tensor<64x128xf32>
}
#call = loc("jit(f)/transpose(jvp(block))/var"("model.py":7:3))
