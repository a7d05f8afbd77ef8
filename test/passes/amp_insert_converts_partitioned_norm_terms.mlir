// amp-insert-converts: in a program XLA's SPMD partitioner splits
// (`mhlo.num_partitions` > 1), a normalisation's backward terms that
// multiply centred forward data by a per-row gradient statistic
// ((x - mean) * dvar) are made in bf16: the partitioner moves them between
// devices before the input gradient sums them. The sum stays f32, and so
// does softmax's p * sum(p dp), whose p is not centred. In a program
// without partitions the term stays f32 (it fuses into the sum) and the
// module says that a decision depends on the partition count. Not with
// f16, not on cpu.
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu report=true})' | FileCheck %s
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=tpu})' | FileCheck %s --check-prefix=TPU
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu policy=p=f32,c=f16,o=f32})' | FileCheck %s --check-prefix=NONE
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=cpu dot-result=compute})' | FileCheck %s --check-prefix=NONE

// CHECK-LABEL: module attributes {mhlo.num_partitions = 8 : i32}
// CHECK-LABEL: func.func public @norm_backward(
// CHECK: %[[C:.*]] = stablehlo.subtract %arg0, %{{.*}} {amp.decision = {precision = "f32", {{.*}}}} : tensor<64x128xf32>
// CHECK-NEXT: %[[CL:.*]] = stablehlo.convert %[[C]] {{.*}}: (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK: %[[DB:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [0] {{.*}}: (tensor<64xf32>) -> tensor<64x128xf32>
// CHECK-NEXT: %[[DBL:.*]] = stablehlo.convert %[[DB]] {{.*}}: (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK: %[[T:.*]] = stablehlo.multiply %[[CL]], %[[DBL]] {amp.decision = {precision = "low", reason = "partitioned_norm_term"}} : tensor<64x128xbf16>
// The sum reads the term in f32.
// CHECK: %[[WIDE:.*]] = stablehlo.convert %[[T]] {{.*}}: (tensor<64x128xbf16>) -> tensor<64x128xf32>
// CHECK: stablehlo.subtract %{{.*}}, %[[WIDE]] {amp.decision = {precision = "f32", {{.*}}}} : tensor<64x128xf32>
// Softmax's p * sum(p dp): f32.
// CHECK: stablehlo.divide
// CHECK-NOT: reason = "partitioned_norm_term"
// CHECK: return

// TPU-LABEL: module attributes {mhlo.num_partitions = 8 : i32}
// TPU-COUNT-1: stablehlo.multiply {{.*}} : tensor<64x128xbf16>
// TPU-NOT: stablehlo.multiply {{.*}} : tensor<64x128xbf16>

// NONE-NOT: amp.partition_dependent
// NONE-NOT: stablehlo.multiply {{.*}} : tensor<64x128x{{bf16|f16}}>

module attributes {mhlo.num_partitions = 8 : i32} {
func.func public @norm_backward(%x: tensor<64x128xf32>, %g: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x128xf32>, tensor<64x128xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %n = stablehlo.constant dense<0.0078125> : tensor<64xf32>
  %mean = stablehlo.multiply %sum, %n : tensor<64xf32>
  %mb = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %x, %mb : tensor<64x128xf32>
  %s = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %ds = stablehlo.multiply %g, %s : tensor<64x128xf32>
  %p = stablehlo.multiply %ds, %c : tensor<64x128xf32>
  %dvar = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %db = stablehlo.broadcast_in_dim %dvar, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %term = stablehlo.multiply %c, %db : tensor<64x128xf32>
  %dx = stablehlo.subtract %ds, %term : tensor<64x128xf32>
  %e = stablehlo.exponential %c : tensor<64x128xf32>
  %se = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %seb = stablehlo.broadcast_in_dim %se, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %sm = stablehlo.divide %e, %seb : tensor<64x128xf32>
  %pdp = stablehlo.multiply %sm, %ds : tensor<64x128xf32>
  %r = stablehlo.reduce(%pdp init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %t = stablehlo.multiply %sm, %rb : tensor<64x128xf32>
  %dsm = stablehlo.subtract %pdp, %t : tensor<64x128xf32>
  return %dx, %dsm : tensor<64x128xf32>, tensor<64x128xf32>
}
}

// -----

// The same program without partitions: the term stays f32, and the module
// says a partitioned lowering would decide it differently.
// CHECK-LABEL: module attributes {amp.partition_dependent}
// CHECK-LABEL: func.func public @norm_backward_one_device(
// CHECK-NOT: tensor<64x128xbf16>
// CHECK: return
// TPU-LABEL: module attributes {amp.partition_dependent}
// TPU-NOT: tensor<64x128xbf16>
func.func public @norm_backward_one_device(%x: tensor<64x128xf32>, %g: tensor<64x128xf32>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x128xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %n = stablehlo.constant dense<0.0078125> : tensor<64xf32>
  %mean = stablehlo.multiply %sum, %n : tensor<64xf32>
  %mb = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %x, %mb : tensor<64x128xf32>
  %s = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %ds = stablehlo.multiply %g, %s : tensor<64x128xf32>
  %p = stablehlo.multiply %ds, %c : tensor<64x128xf32>
  %dvar = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %db = stablehlo.broadcast_in_dim %dvar, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %term = stablehlo.multiply %db, %c : tensor<64x128xf32>
  %dx = stablehlo.subtract %ds, %term : tensor<64x128xf32>
  return %dx : tensor<64x128xf32>
}
