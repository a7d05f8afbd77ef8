// amp-rematerialize alone: residuals of the backward pass (values of the
// forward pass that ops derived from the loss seed read) that elementwise
// ops make from kept residuals, matrix multiply results, small values or
// constants are recomputed before their first backward reader, from leaves
// held by an optimization barrier, when every backward reader fuses the
// recomputation (an elementwise op, a reduction, a transpose); anything
// else is kept.
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-rematerialize)' | FileCheck %s
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-rematerialize{max-ops=1})' | FileCheck %s --check-prefix=ONEOP
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-rematerialize{min-elements=100000})' | FileCheck %s --check-prefix=LARGE
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-rematerialize{max-ops=0})' 2>&1 | FileCheck %s --check-prefix=BADOPT
// BADOPT: error: invalid option 'max-ops': must be at least 1
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-rematerialize{for=memory})' | FileCheck %s --check-prefix=MEMORY
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-rematerialize{for=fast})' 2>&1 | FileCheck %s --check-prefix=BADFOR
// BADFOR: error: invalid option 'for': unknown goal 'fast' (accepted: speed, memory)

// A GELU-like pair: the backward pass reads u (a matrix multiply's result:
// kept), t = tanh(u) and g = u * t. t and g share their recomputation from
// u, made once before the first backward reader of either; the forward
// pass keeps its own.

// CHECK-LABEL: func.func public @gelu(
// CHECK: %[[U:.*]] = stablehlo.dot_general
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[U]]
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %[[U]], %[[T]]
// CHECK-NEXT: %[[Y:.*]] = stablehlo.dot_general %[[G]]
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[U]] : tensor<64x128xf32>
// CHECK-NEXT: %[[T2:.*]] = stablehlo.tanh %[[HELD]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[HELD]], %[[T2]]
// CHECK-NEXT: stablehlo.multiply %{{.*}}, %[[G2]]
// CHECK-NEXT: stablehlo.multiply %{{.*}}, %[[T2]]
// CHECK-NEXT: stablehlo.multiply %{{.*}}, %[[U]]
// CHECK-NEXT: return %[[Y]]

// With max-ops=1 g's recomputation (tanh and multiply) is too long: g is
// kept, t (one op) is still recomputed.
// ONEOP-LABEL: func.func public @gelu(
// ONEOP: %[[G:.*]] = stablehlo.multiply %{{.*}}, %{{.*}}
// ONEOP: stablehlo.multiply %{{.*}}, %[[G]]
// ONEOP-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier
// ONEOP-NEXT: %[[T2:.*]] = stablehlo.tanh %[[HELD]]
// ONEOP-NEXT: stablehlo.multiply %{{.*}}, %[[T2]]

// LARGE-LABEL: func.func public @gelu(
// LARGE-NOT: stablehlo.optimization_barrier
// LARGE: return
func.func public @gelu(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %v: tensor<128x64xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x64xf32>, tensor<64x128xf32>) {
  %u = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %t = stablehlo.tanh %u : tensor<64x128xf32>
  %g = stablehlo.multiply %u, %t : tensor<64x128xf32>
  %y = stablehlo.dot_general %g, %v, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x64xf32>) -> tensor<64x64xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.multiply %dy, %g : tensor<64x128xf32>
  %b = stablehlo.multiply %a, %t : tensor<64x128xf32>
  %c = stablehlo.multiply %b, %u : tensor<64x128xf32>
  return %y, %c : tensor<64x64xf32>, tensor<64x128xf32>
}

// -----

// Softmax written out, as jax.nn.softmax is: p = e / sum(e), with the
// backward pass of p (jax.vjp's), which reads e, the row sums s and
// 1 / s^2 (made in the forward pass for it alone). p is kept (a matrix
// multiply reads it from memory, as attention's p^T dy does). Softmax is
// shift-invariant: the backward pass reads p / sum(p) for e and 1 for s,
// the same derivative, and neither the logits d nor the sums are kept.

// CHECK-LABEL: func.func public @softmax(
// CHECK: %[[D:.*]] = stablehlo.dot_general
// CHECK: %[[E:.*]] = stablehlo.exponential %[[D]]
// CHECK: %[[P:.*]] = stablehlo.divide %[[E]], %{{.*}}
// CHECK: stablehlo.dot_general %[[P]], %{{.*}}
// CHECK-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[P]] : tensor<64x128xf32>
// CHECK-NEXT: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00>
// CHECK-NEXT: %[[PS:.*]] = stablehlo.reduce(%[[HELD]] init: %[[ZERO]]) applies stablehlo.add across dimensions = [1]
// CHECK-NEXT: %[[PSB:.*]] = stablehlo.broadcast_in_dim %[[PS]], dims = [0]
// CHECK-NEXT: %[[E2:.*]] = stablehlo.divide %[[HELD]], %[[PSB]]
// CHECK-NEXT: %[[ONE:.*]] = stablehlo.constant dense<1.000000e+00>
// CHECK-NEXT: %[[S2:.*]] = stablehlo.broadcast_in_dim %[[ONE]], dims = [] : (tensor<f32>) -> tensor<64xf32>
// CHECK-NOT: stablehlo.exponential
// CHECK: %[[SB2:.*]] = stablehlo.broadcast_in_dim %[[S2]], dims = [0]
// CHECK: stablehlo.multiply %[[S2]], %[[S2]]
// CHECK: stablehlo.divide %{{.*}}, %[[SB2]]
// CHECK: stablehlo.multiply %{{.*}}, %[[E2]]
// CHECK: stablehlo.multiply %{{.*}}, %[[E2]]
// CHECK-NOT: %[[D]]
// CHECK: return

// for=memory: the same; p is kept for the backward pass to read.
// MEMORY-LABEL: func.func public @softmax(
// MEMORY: %[[E:.*]] = stablehlo.exponential
// MEMORY: %[[P:.*]] = stablehlo.divide %[[E]], %{{.*}}
// MEMORY: stablehlo.optimization_barrier %[[P]] : tensor<64x128xf32>
// MEMORY-NOT: stablehlo.optimization_barrier
// MEMORY: return
func.func public @softmax(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<128x128xf32>, tensor<64x128xf32>) {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %e = stablehlo.exponential %d : tensor<64x128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %p = stablehlo.divide %e, %sb : tensor<64x128xf32>
  %s2 = stablehlo.multiply %s, %s : tensor<64xf32>
  %one = stablehlo.constant dense<1.0> : tensor<64xf32>
  %inv = stablehlo.divide %one, %s2 : tensor<64xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.dot_general %p, %dy, contracting_dims = [0] x [0] : (tensor<64x128xf32>, tensor<64x128xf32>) -> tensor<128x128xf32>
  %de1 = stablehlo.divide %dy, %sb : tensor<64x128xf32>
  %ib = stablehlo.broadcast_in_dim %inv, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %t = stablehlo.multiply %dy, %ib : tensor<64x128xf32>
  %te = stablehlo.multiply %t, %e : tensor<64x128xf32>
  %r = stablehlo.reduce(%te init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %nr = stablehlo.negate %r : tensor<64xf32>
  %nrb = stablehlo.broadcast_in_dim %nr, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %de = stablehlo.add %de1, %nrb : tensor<64x128xf32>
  %dd = stablehlo.multiply %de, %e : tensor<64x128xf32>
  return %p, %a, %dd : tensor<64x128xf32>, tensor<128x128xf32>, tensor<64x128xf32>
}

// -----

// A bf16 softmax: the probabilities' rows are summed, and divided, in f32.

// CHECK-LABEL: func.func public @softmax_bf16(
// CHECK: %[[P:.*]] = stablehlo.divide %{{.*}}, %{{.*}} : tensor<64x128xbf16>
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[P]] : tensor<64x128xbf16>
// CHECK-NEXT: %[[WIDE:.*]] = stablehlo.convert %[[HELD]] : (tensor<64x128xbf16>) -> tensor<64x128xf32>
// CHECK: %[[PS:.*]] = stablehlo.reduce(%[[WIDE]] init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
// CHECK: %[[Q:.*]] = stablehlo.divide %[[WIDE]], %{{.*}} : tensor<64x128xf32>
// CHECK-NEXT: %[[E2:.*]] = stablehlo.convert %[[Q]] : (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK-NOT: stablehlo.exponential
// CHECK: stablehlo.multiply %{{.*}}, %[[E2]] : tensor<64x128xbf16>
func.func public @softmax_bf16(%d: tensor<64x128xbf16>, %seed: tensor<bf16> {amp.loss_seed}) -> (tensor<128x128xbf16>, tensor<64x128xbf16>) {
  %e = stablehlo.exponential %d : tensor<64x128xbf16>
  %zero = stablehlo.constant dense<0.0> : tensor<bf16>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xbf16>, tensor<bf16>) -> tensor<64xbf16>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<64xbf16>) -> tensor<64x128xbf16>
  %p = stablehlo.divide %e, %sb : tensor<64x128xbf16>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<bf16>) -> tensor<64x128xbf16>
  %a = stablehlo.dot_general %p, %dy, contracting_dims = [0] x [0] : (tensor<64x128xbf16>, tensor<64x128xbf16>) -> tensor<128x128xbf16>
  %de = stablehlo.divide %dy, %sb : tensor<64x128xbf16>
  %dd = stablehlo.multiply %de, %e : tensor<64x128xbf16>
  return %a, %dd : tensor<128x128xbf16>, tensor<64x128xbf16>
}
// -----

// Where the forward pass reads the sums other than through p (here
// log(s), as a log-softmax or a z-loss does), the loss depends on them
// directly, and the frame of p would change its derivative: e is
// recomputed from d, as without a matrix multiply reading p.

// CHECK-LABEL: func.func public @softmax_sum_in_loss(
// CHECK: %[[D:.*]] = stablehlo.dot_general
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[D]] : tensor<64x128xf32>
// CHECK-NEXT: %[[E2:.*]] = stablehlo.exponential %[[HELD]]
func.func public @softmax_sum_in_loss(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<64xf32>, tensor<128x128xf32>, tensor<64x128xf32>) {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %e = stablehlo.exponential %d : tensor<64x128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %p = stablehlo.divide %e, %sb : tensor<64x128xf32>
  %logs = stablehlo.log %s : tensor<64xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.dot_general %p, %dy, contracting_dims = [0] x [0] : (tensor<64x128xf32>, tensor<64x128xf32>) -> tensor<128x128xf32>
  %de = stablehlo.divide %dy, %sb : tensor<64x128xf32>
  %dd = stablehlo.multiply %de, %e : tensor<64x128xf32>
  return %p, %logs, %a, %dd : tensor<64x128xf32>, tensor<64xf32>, tensor<128x128xf32>, tensor<64x128xf32>
}

// -----

// Divided by the sums of other rows (broadcast along the wrong dimension),
// e / s is no softmax and has no frame: e is recomputed from d.

// CHECK-LABEL: func.func public @not_its_rows(
// CHECK: %[[D:.*]] = stablehlo.dot_general
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[D]] : tensor<128x128xf32>
// CHECK-NEXT: %[[E2:.*]] = stablehlo.exponential %[[HELD]]
func.func public @not_its_rows(%x: tensor<128x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<128x128xf32>, tensor<128x128xf32>, tensor<128x128xf32>) {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<128x64xf32>, tensor<64x128xf32>) -> tensor<128x128xf32>
  %e = stablehlo.exponential %d : tensor<128x128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<128x128xf32>, tensor<f32>) -> tensor<128xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<128xf32>) -> tensor<128x128xf32>
  %p = stablehlo.divide %e, %sb : tensor<128x128xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
  %a = stablehlo.dot_general %p, %dy, contracting_dims = [0] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
  %de = stablehlo.divide %dy, %sb : tensor<128x128xf32>
  %dd = stablehlo.multiply %de, %e : tensor<128x128xf32>
  return %p, %a, %dd : tensor<128x128xf32>, tensor<128x128xf32>, tensor<128x128xf32>
}

// -----

// Without a loss seed (or cotangent) there is no backward pass: unchanged.

// CHECK-LABEL: func.func public @no_seed(
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: return
func.func public @no_seed(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %s: tensor<f32>) -> tensor<64x128xf32> {
  %u = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %t = stablehlo.tanh %u : tensor<64x128xf32>
  %dy = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.multiply %dy, %t : tensor<64x128xf32>
  %b = stablehlo.multiply %a, %u : tensor<64x128xf32>
  return %b : tensor<64x128xf32>
}

// -----

// A residual made from a large value that its own kernel writes anyway (a
// matrix multiply's result, read only by the forward pass) is recomputed
// from it: keeping u instead of t costs the same bytes, and t is never
// written.

// CHECK-LABEL: func.func public @needs_unkept(
// CHECK: %[[U:.*]] = stablehlo.dot_general
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[U]]
// CHECK-NEXT: stablehlo.tanh %[[HELD]]
func.func public @needs_unkept(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x128xf32> {
  %u = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %t = stablehlo.tanh %u : tensor<64x128xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.multiply %dy, %t : tensor<64x128xf32>
  return %a : tensor<64x128xf32>
}

// -----

// A residual made from arguments alone (a parameter's compute-dtype copy,
// read again by the backward pass's dot) is kept: a barrier on the argument
// costs XLA a copy and saves nothing.

// CHECK-LABEL: func.func public @argument_cast(
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: return
func.func public @argument_cast(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<64x64xf32>) {
  %wl = stablehlo.convert %w : (tensor<64x128xf32>) -> tensor<64x128xbf16>
  %xl = stablehlo.convert %x : (tensor<64x64xf32>) -> tensor<64x64xbf16>
  %u = stablehlo.dot_general %xl, %wl, contracting_dims = [1] x [0] : (tensor<64x64xbf16>, tensor<64x128xbf16>) -> tensor<64x128xf32>
  %dyf = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %dy = stablehlo.convert %dyf : (tensor<64x128xf32>) -> tensor<64x128xbf16>
  %dx = stablehlo.dot_general %dy, %wl, contracting_dims = [1] x [1] : (tensor<64x128xbf16>, tensor<64x128xbf16>) -> tensor<64x64xf32>
  return %u, %dx : tensor<64x128xf32>, tensor<64x64xf32>
}

// -----

// A residual read by the backward pass's matrix multiply (a weight
// gradient) is kept, though u is written anyway: the matrix multiply does
// not fuse its recomputation, which would be a kernel of its own.

// CHECK-LABEL: func.func public @dot_reader(
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: return
func.func public @dot_reader(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %v: tensor<128x64xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x64xf32>, tensor<128x64xf32>) {
  %u = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %t = stablehlo.tanh %u : tensor<64x128xf32>
  %y = stablehlo.dot_general %t, %v, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x64xf32>) -> tensor<64x64xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x64xf32>
  %dv = stablehlo.dot_general %t, %dy, contracting_dims = [0] x [0] : (tensor<64x128xf32>, tensor<64x64xf32>) -> tensor<128x64xf32>
  return %y, %dv : tensor<64x64xf32>, tensor<128x64xf32>
}

// -----

// A residual made from a reduction's result (a mean subtracted, read by an
// elementwise op of the backward pass) is kept: XLA fuses the reduction
// and its readers into one kernel, which a barrier on the mean would split.

// CHECK-LABEL: func.func public @statistic_leaf(
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: return

// for=memory recomputes it from x and the mean.
// MEMORY-LABEL: func.func public @statistic_leaf(
// MEMORY: %[[S:.*]] = stablehlo.reduce
// MEMORY: stablehlo.optimization_barrier %{{.*}}, %[[S]] : tensor<64x128xf32>, tensor<64xf32>
func.func public @statistic_leaf(%x: tensor<64x128xf32>, %w: tensor<128x64xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x64xf32>, tensor<64x128xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %x, %sb : tensor<64x128xf32>
  %y = stablehlo.dot_general %c, %w, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x64xf32>) -> tensor<64x64xf32>
  %dyf = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %dc = stablehlo.multiply %dyf, %c : tensor<64x128xf32>
  return %y, %dc : tensor<64x64xf32>, tensor<64x128xf32>
}

// -----

// One row's statistic (tensor<1xf32>) is still a row reduction, not a whole
// tensor's: XLA fuses it with its readers, so the residual is kept.

// CHECK-LABEL: func.func public @one_row_statistic_leaf(
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: return
func.func public @one_row_statistic_leaf(%x: tensor<1x4096xf32>, %w: tensor<4096x64xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<1x64xf32>, tensor<1x4096xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1x4096xf32>, tensor<f32>) -> tensor<1xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<1xf32>) -> tensor<1x4096xf32>
  %c = stablehlo.subtract %x, %sb : tensor<1x4096xf32>
  %y = stablehlo.dot_general %c, %w, contracting_dims = [1] x [0] : (tensor<1x4096xf32>, tensor<4096x64xf32>) -> tensor<1x64xf32>
  %dyf = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<1x4096xf32>
  %dc = stablehlo.multiply %dyf, %c : tensor<1x4096xf32>
  return %y, %dc : tensor<1x64xf32>, tensor<1x4096xf32>
}

// -----

// An FP8 GEMM's scaled result: t = tanh(u * amax(|x|) / 448). The amax is a
// maximum over the whole of x, no softmax's row max: it is written by a
// kernel of its own anyway, so t is recomputed from u and the amax alone,
// and the amax is not recomputed (one reduction).

// CHECK-LABEL: func.func public @fp8_scale_leaf(
// CHECK: %[[M:.*]] = stablehlo.reduce
// CHECK: %[[U:.*]] = stablehlo.dot_general
// CHECK: %[[HELD:.*]]:2 = stablehlo.optimization_barrier %[[M]], %[[U]] : tensor<f32>, tensor<64x128xf32>
// CHECK-NOT: stablehlo.reduce
// CHECK: %[[S2:.*]] = stablehlo.divide %[[HELD]]#0
// CHECK: %[[T2:.*]] = stablehlo.tanh
// CHECK-NEXT: stablehlo.multiply %{{.*}}, %[[T2]]
func.func public @fp8_scale_leaf(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %fmax = stablehlo.constant dense<448.0> : tensor<f32>
  %ax = stablehlo.abs %x : tensor<64x64xf32>
  %m = stablehlo.reduce(%ax init: %ninf) applies stablehlo.maximum across dimensions = [0, 1] : (tensor<64x64xf32>, tensor<f32>) -> tensor<f32>
  %s = stablehlo.divide %m, %fmax : tensor<f32>
  %u = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %v = stablehlo.multiply %u, %sb : tensor<64x128xf32>
  %t = stablehlo.tanh %v : tensor<64x128xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %g = stablehlo.multiply %dy, %t : tensor<64x128xf32>
  return %t, %g : tensor<64x128xf32>, tensor<64x128xf32>
}

// -----

// A softmax's stabilised exponential e = exp(d - max(d)): a row max is
// recomputed with it (a maximum equals the forward pass's bit for bit in any
// order), so e is recomputed from d alone (and its constants), and the
// forward softmax stays one fused kernel.

// CHECK-LABEL: func.func public @row_max(
// CHECK: %[[D:.*]] = stablehlo.dot_general
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[D]] : tensor<64x128xf32>
// CHECK: %[[M:.*]] = stablehlo.reduce(%[[HELD]] init: %{{.*}}) applies stablehlo.maximum
// CHECK-NEXT: %[[MB:.*]] = stablehlo.broadcast_in_dim %[[M]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.subtract %[[HELD]], %[[MB]]
// CHECK-NEXT: %[[E2:.*]] = stablehlo.exponential %[[C]]
// CHECK-NEXT: stablehlo.multiply %{{.*}}, %[[E2]]
func.func public @row_max(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %m = stablehlo.reduce(%d init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %d, %mb : tensor<64x128xf32>
  %e = stablehlo.exponential %c : tensor<64x128xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.multiply %dy, %e : tensor<64x128xf32>
  return %e, %a : tensor<64x128xf32>, tensor<64x128xf32>
}

// -----

// The backward pass of e / sum(e) (jax.nn.softmax's) reads the row sums
// too. They are recomputed with e from d, in the backward kernel that
// reads them, as XLA does in a hand-cast step: kept, they would be
// written by a forward kernel of their own, which splits the softmax's.

// CHECK-LABEL: func.func public @softmax_sum(
// CHECK: %[[D:.*]] = stablehlo.dot_general
// CHECK: %[[HELD:.*]] = stablehlo.optimization_barrier %[[D]] : tensor<4096x8xf32>
// CHECK-NEXT: %[[E2:.*]] = stablehlo.exponential %[[HELD]]
// CHECK: %[[S2:.*]] = stablehlo.reduce(%[[E2]] init: %{{.*}}) applies stablehlo.add
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: stablehlo.divide %{{.*}}, %[[S2]] : tensor<4096xf32>
// CHECK: stablehlo.multiply %{{.*}}, %[[E2]] : tensor<4096x8xf32>

// for=memory keeps the sums (a reduction's result is no cone's op there).
// MEMORY-LABEL: func.func public @softmax_sum(
// MEMORY: %[[S:.*]] = stablehlo.reduce
// MEMORY-NOT: stablehlo.reduce
// MEMORY: stablehlo.divide %{{.*}}, %[[S]] : tensor<4096xf32>
func.func public @softmax_sum(%x: tensor<4096x64xf32>, %w: tensor<64x8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<4096x8xf32>, tensor<4096xf32>, tensor<4096x8xf32>) {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4096x64xf32>, tensor<64x8xf32>) -> tensor<4096x8xf32>
  %e = stablehlo.exponential %d : tensor<4096x8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4096x8xf32>, tensor<f32>) -> tensor<4096xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4096xf32>) -> tensor<4096x8xf32>
  %p = stablehlo.divide %e, %sb : tensor<4096x8xf32>
  %dys = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<4096xf32>
  %ds = stablehlo.divide %dys, %s : tensor<4096xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<4096x8xf32>
  %de = stablehlo.multiply %dy, %e : tensor<4096x8xf32>
  return %p, %ds, %de : tensor<4096x8xf32>, tensor<4096xf32>, tensor<4096x8xf32>
}

// -----

// A sharding annotation is a custom call that writes nothing: a residual
// made from what it annotates is kept, as it would be from any value no
// kernel writes anyway.

// CHECK-LABEL: func.func public @sharding_root(
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: return
func.func public @sharding_root(%x: tensor<64x64xf32>, %w: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x128xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %u = stablehlo.custom_call @Sharding(%d) {mhlo.sharding = "{replicated}"} : (tensor<64x128xf32>) -> tensor<64x128xf32>
  %t = stablehlo.tanh %u : tensor<64x128xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %a = stablehlo.multiply %dy, %t : tensor<64x128xf32>
  return %a : tensor<64x128xf32>
}
