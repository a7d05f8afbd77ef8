// amp-insert-converts: a gradient that a matrix multiply wrote in the
// compute dtype stays in it while forward values scale it (layer norm's
// backward pass: dy * gamma * rstd). The products XLA would write in f32
// between its kernels are made in bf16; reductions and sums that read them
// stay f32. Not for a scalar factor (a loss scale, an optimizer's
// coefficient) or an f32 gradient, not with f16 (its range is not f32's),
// not where the GEMM writes f32 (dot-result=f32), not on cpu.
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu report=true})' | FileCheck %s
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=tpu})' | FileCheck %s --check-prefix=TPU
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32})' | FileCheck %s --check-prefix=F32
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu policy=p=f32,c=f16,o=f32})' | FileCheck %s --check-prefix=F32
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=cpu dot-result=compute})' | FileCheck %s --check-prefix=F32

// CHECK-LABEL: func.func public @layer_norm_backward(
// CHECK: %[[DY:.*]] = stablehlo.dot_general {{.*}} -> tensor<64x128xbf16>
// CHECK: %[[GB:.*]] = stablehlo.convert %{{.*}} {{.*}}: (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK: %[[T1:.*]] = stablehlo.multiply %[[DY]], %[[GB]] {amp.decision = {precision = "low", reason = "scales_low_gradient"}} : tensor<64x128xbf16>
// CHECK: %[[T2:.*]] = stablehlo.multiply %[[T1]], %{{.*}} {amp.decision = {precision = "low", reason = "scales_low_gradient"}} : tensor<64x128xbf16>
// The sum reads the product in f32.
// CHECK: %[[WIDE:.*]] = stablehlo.convert %[[T2]] {{.*}}: (tensor<64x128xbf16>) -> tensor<64x128xf32>
// CHECK: stablehlo.reduce(%[[WIDE]] init: %{{.*}}) applies stablehlo.add
// An f32 gradient, and a scalar factor: f32.
// CHECK: stablehlo.multiply %{{.*}}, %{{.*}} {amp.decision = {precision = "f32", {{.*}}}} : tensor<64x128xf32>
// CHECK: stablehlo.multiply %{{.*}}, %{{.*}} {amp.decision = {precision = "f32", {{.*}}}} : tensor<64x128xf32>

// TPU-LABEL: func.func public @layer_norm_backward(
// TPU-COUNT-2: stablehlo.multiply {{.*}} : tensor<64x128xbf16>
// TPU-NOT: stablehlo.multiply {{.*}} : tensor<64x128xbf16>

// F32-LABEL: func.func public @layer_norm_backward(
// F32-NOT: stablehlo.multiply {{.*}} : tensor<64x128x{{bf16|f16}}>

func.func public @layer_norm_backward(%w: tensor<128x128xf32>, %gamma: tensor<128xf32>, %rstd: tensor<64x1xf32>, %g: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64xf32>, tensor<64x128xf32>, tensor<64x128xf32>) {
  %s = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %ds = stablehlo.multiply %g, %s : tensor<64x128xf32>
  %dy = stablehlo.dot_general %ds, %w, contracting_dims = [1] x [1] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %gb = stablehlo.broadcast_in_dim %gamma, dims = [1] : (tensor<128xf32>) -> tensor<64x128xf32>
  %t1 = stablehlo.multiply %dy, %gb : tensor<64x128xf32>
  %rb = stablehlo.broadcast_in_dim %rstd, dims = [0, 1] : (tensor<64x1xf32>) -> tensor<64x128xf32>
  %t2 = stablehlo.multiply %t1, %rb : tensor<64x128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%t2 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %sq = stablehlo.multiply %dy, %ds : tensor<64x128xf32>
  %half = stablehlo.constant dense<0.5> : tensor<64x128xf32>
  %scaled = stablehlo.multiply %dy, %half : tensor<64x128xf32>
  return %sum, %sq, %scaled : tensor<64xf32>, tensor<64x128xf32>, tensor<64x128xf32>
}

// -----

// A forward value stored low that the backward pass reads in f32 (through
// its barrier) and in bf16: the bf16 reader reads the held copy too, so the
// rounding before the barrier is not kept beside it (or recomputed).
// CHECK-LABEL: func.func public @stored_read_backward(
// CHECK: %[[E:.*]] = stablehlo.exponential
// CHECK-NEXT: %[[LOW:.*]] = stablehlo.convert %[[E]] {{.*}}amp_stored = "{{[0-9]+}}"
// CHECK-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[LOW]] : tensor<64x128xbf16>
// CHECK-NEXT: %[[BACK:.*]] = stablehlo.convert %[[HELD]]
// CHECK-NOT: %[[LOW]]
// CHECK: stablehlo.multiply %{{.*}}, %[[HELD]] {{.*}}: tensor<64x128xbf16>
// CHECK: stablehlo.add %{{.*}}, %[[BACK]] {{.*}}: tensor<64x128xf32>
// TPU-LABEL: func.func public @stored_read_backward(
// F32-LABEL: func.func public @stored_read_backward(
func.func public @stored_read_backward(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<128x128xf32>, %g: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %e = stablehlo.exponential %0 : tensor<64x128xf32>
  %s = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %ds = stablehlo.multiply %g, %s : tensor<64x128xf32>
  %dy = stablehlo.dot_general %ds, %w2, contracting_dims = [1] x [1] : (tensor<64x128xf32>, tensor<128x128xf32>) -> tensor<64x128xf32>
  %t = stablehlo.multiply %dy, %e : tensor<64x128xf32>
  %u = stablehlo.add %ds, %e : tensor<64x128xf32>
  return %t, %u : tensor<64x128xf32>, tensor<64x128xf32>
}
