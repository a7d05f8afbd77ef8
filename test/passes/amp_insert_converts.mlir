// amp-insert-converts alone (amp-opt --pass-pipeline runs exactly the given
// pipeline; jaxlib verifies the result). The default pipeline, with
// amp-simplify-converts, is tested in test/pipeline/amp_opt.mlir.
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32})' | FileCheck %s
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 storage=f32})' | FileCheck %s --check-prefix=STORE-F32
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=cpu})' | FileCheck %s --check-prefix=CPU
// The defaults of dot-result and decisions (the RUN lines above pin
// dot-result=f32, whose checks come first in this file):
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu})' | FileCheck %s --check-prefix=GATE
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu decisions=exact})' | FileCheck %s --check-prefix=EXACT
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu policy=p=f32,c=f16,o=f32})' | FileCheck %s --check-prefix=F16
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{decisions=route})' 2>&1 | FileCheck %s --check-prefix=BADDECISIONS
// BADDECISIONS: invalid option 'decisions': unknown decisions 'route' (accepted: exact, gate)
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 report=true})' | FileCheck %s --check-prefix=REPORT
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 keep-groups=0})' | FileCheck %s --check-prefix=GROUPS
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 level=O3 strict=true})' | FileCheck %s --check-prefix=STRICT
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 storage-min-elements=8192})' | FileCheck %s --check-prefix=MIN-AT
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 storage-min-elements=8193})' | FileCheck %s --check-prefix=MIN-ABOVE
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{storage-min-elements=0})' 2>&1 | FileCheck %s --check-prefix=MIN-BAD
// MIN-BAD: error: invalid option 'storage-min-elements': must be at least 1, got 0
//
// Unknown op names in keep-f32/force-compute are errors naming the nearest
// known ops.
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{keep-f32=tahn})' 2>&1 | FileCheck %s --check-prefix=BADNAME
// BADNAME: error: invalid option 'keep-f32': unknown op 'tahn' (nearest: stablehlo.tanh, stablehlo.tan, stablehlo.case)
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{force-compute=exp})' 2>&1 | FileCheck %s --check-prefix=BADNAME2
// BADNAME2: error: invalid option 'force-compute': unknown op 'exp' (nearest: stablehlo.exponential
// A compute dtype that is FP8 is rejected, pointing to the gemm key.
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{policy=c=f8e4m3fn})' 2>&1 | FileCheck %s --check-prefix=FP8C
// FP8C: error: invalid policy: FP8 dtype 'f8e4m3fn' cannot be the compute dtype: FP8 is a GEMM operand format; keep compute in bf16/f16/f32 and add gemm=f8 (for example p=f32,c=bf16,o=f32,gemm=f8)

// Storage: a large f32 result of f32 arithmetic that is read again across a
// matrix multiply is rounded to bf16 right after it is made (the convert
// carries the XLA frontend attribute that finds it in the compiled program)
// and read back in f32 through an optimization barrier, which XLA never
// folds; with storage=f32 it stays f32. The second dot's result, read once
// right away, is not stored.

// CHECK-LABEL: func.func public @storage(
// CHECK: %[[D1:.*]] = stablehlo.dot_general {{.*}} -> tensor<64x128xf32>
// CHECK-NEXT: %[[E:.*]] = stablehlo.exponential %[[D1]] : tensor<64x128xf32>
// CHECK-NEXT: %[[LOW:.*]] = stablehlo.convert %[[E]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}} : (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[LOW]] : tensor<64x128xbf16>
// CHECK-NEXT: %[[BACK:.*]] = stablehlo.convert %[[HELD]] : (tensor<64x128xbf16>) -> tensor<64x128xf32>
// CHECK-NEXT: %[[D2:.*]] = stablehlo.dot_general {{.*}} -> tensor<64x128xf32>
// CHECK-NEXT: stablehlo.multiply %[[BACK]], %[[D2]] : tensor<64x128xf32>

// STORE-F32-LABEL: func.func public @storage(
// STORE-F32: %[[E:.*]] = stablehlo.exponential
// STORE-F32-NOT: stablehlo.convert %[[E]]
// STORE-F32: stablehlo.multiply %[[E]], %{{.*}} : tensor<64x128xf32>

// CPU-LABEL: func.func public @storage(
// CPU: %[[E:.*]] = stablehlo.exponential
// CPU-NEXT: %[[LOW:.*]] = stablehlo.convert %[[E]] {mhlo.frontend_attributes = {amp_stored = "0"}} : (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CPU-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[LOW]] : tensor<64x128xbf16>
// CPU-NEXT: stablehlo.convert %[[HELD]] : (tensor<64x128xbf16>) -> tensor<64x128xf32>

// REPORT-LABEL: func.func public @storage(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {group = 0 : i64, precision = "low", reason = "matrix_multiply"}
// REPORT: stablehlo.exponential {{.*}}amp.decision = {detail = "transcendental or statistic", precision = "f32", reason = "numerically_sensitive", stored = 0 : i64}

// storage-min-elements: exp's 64x128 = 8192 elements are stored at a
// threshold of 8192 and kept f32 above it.
// MIN-AT-LABEL: func.func public @storage(
// MIN-AT: %[[E:.*]] = stablehlo.exponential
// MIN-AT-NEXT: stablehlo.convert %[[E]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}} : (tensor<64x128xf32>) -> tensor<64x128xbf16>
// MIN-ABOVE-LABEL: func.func public @storage(
// MIN-ABOVE: %[[E:.*]] = stablehlo.exponential
// MIN-ABOVE-NOT: amp_stored
// MIN-ABOVE: stablehlo.multiply %[[E]], %{{.*}} : tensor<64x128xf32>

// GROUPS-LABEL: func.func public @storage(
// GROUPS: stablehlo.dot_general %arg0, %arg1, {{.*}} : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
// GROUPS: stablehlo.dot_general %{{.*}}, %{{.*}}, {{.*}} : (tensor<64x64xbf16>, tensor<64x128xbf16>) -> tensor<64x128xf32>
func.func public @storage(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %1 = stablehlo.exponential %0 : tensor<64x128xf32>
  %2 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %3 = stablehlo.multiply %1, %2 : tensor<64x128xf32>
  return %3 : tensor<64x128xf32>
}

// -----

// exp(x) is read across the second dot, and stored; exp(x) * 2, read
// across it too, is a cheap elementwise result of a stored value and a
// constant: not stored again, XLA rebuilds it in its readers from the
// stored copy.

// CHECK-LABEL: func.func public @rebuilt_not_stored(
// CHECK: %[[E:.*]] = stablehlo.exponential
// CHECK-NEXT: %[[LOW:.*]] = stablehlo.convert %[[E]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}} : (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[LOW]] : tensor<64x128xbf16>
// CHECK-NEXT: %[[BACK:.*]] = stablehlo.convert %[[HELD]] : (tensor<64x128xbf16>) -> tensor<64x128xf32>
// CHECK: %[[S:.*]] = stablehlo.multiply %[[BACK]], %{{.*}} : tensor<64x128xf32>
// CHECK-NOT: stablehlo.convert %[[S]]
// CHECK: stablehlo.multiply %[[S]], %{{.*}} : tensor<64x128xf32>

// REPORT-LABEL: func.func public @rebuilt_not_stored(
// REPORT: stablehlo.exponential {{.*}}stored = 0 : i64}
// REPORT: stablehlo.multiply {{.*}}amp.decision = {precision = "f32", reason = "consumes_sensitive"}} : tensor<64x128xf32>
func.func public @rebuilt_not_stored(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %1 = stablehlo.exponential %0 : tensor<64x128xf32>
  %two = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %2 = stablehlo.multiply %1, %two : tensor<64x128xf32>
  %3 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %4 = stablehlo.multiply %2, %3 : tensor<64x128xf32>
  %5 = stablehlo.add %4, %1 : tensor<64x128xf32>
  return %5 : tensor<64x128xf32>
}

// -----

// Normalised data (x - mean, read again across a matrix multiply) made from
// f32 arithmetic is not stored low: batch norm's backward pass cancels
// across it. Centred data from a low-precision dot was rounded already, and
// is stored.

// CHECK-LABEL: func.func public @normalised_not_stored(
// CHECK: %[[E:.*]] = stablehlo.exponential
// CHECK-NOT: stablehlo.convert
// CHECK: %[[C:.*]] = stablehlo.subtract %[[E]], %{{.*}} : tensor<64x128xf32>
// CHECK-NOT: stablehlo.convert %[[C]]
// CHECK: stablehlo.multiply %[[C]], %{{.*}} : tensor<64x128xf32>

// REPORT-LABEL: func.func public @normalised_not_stored(
// REPORT: stablehlo.subtract {{.*}}reason = "consumes_sensitive"}} : tensor<64x128xf32>
func.func public @normalised_not_stored(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %1 = stablehlo.exponential %0 : tensor<64x128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%1 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %n = stablehlo.constant dense<128.0> : tensor<64xf32>
  %mean = stablehlo.divide %sum, %n : tensor<64xf32>
  %b = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %1, %b : tensor<64x128xf32>
  %2 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %3 = stablehlo.multiply %c, %2 : tensor<64x128xf32>
  return %3 : tensor<64x128xf32>
}

// CHECK-LABEL: func.func public @rounded_data_centred_stored(
// CHECK: %[[C:.*]] = stablehlo.subtract %{{.*}}, %{{.*}} : tensor<64x128xf32>
// CHECK-NEXT: %[[LOW:.*]] = stablehlo.convert %[[C]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}} : (tensor<64x128xf32>) -> tensor<64x128xbf16>
// CHECK-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[LOW]] : tensor<64x128xbf16>
// CHECK-NEXT: %[[BACK:.*]] = stablehlo.convert %[[HELD]] : (tensor<64x128xbf16>) -> tensor<64x128xf32>
// CHECK: stablehlo.multiply %[[BACK]], %{{.*}} : tensor<64x128xf32>
func.func public @rounded_data_centred_stored(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%0 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %n = stablehlo.constant dense<128.0> : tensor<64xf32>
  %mean = stablehlo.divide %sum, %n : tensor<64xf32>
  %b = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %0, %b : tensor<64x128xf32>
  %2 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %3 = stablehlo.multiply %c, %2 : tensor<64x128xf32>
  return %3 : tensor<64x128xf32>
}

// -----

// Discrete decisions: what feeds them stays f32 back through its producers,
// dots included. The router logits of top_k:

// CHECK-LABEL: func.func public @top_k(
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.dot_general %arg0, %arg1, {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: chlo.top_k

// REPORT-LABEL: func.func public @top_k(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {detail = "top_k", group = 0 : i64, precision = "f32", reason = "gates_decision"}
func.func public @top_k(%x: tensor<16x32xf32>, %wr: tensor<32x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) {
  %0 = stablehlo.dot_general %x, %wr, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %values, %indices = chlo.top_k(%0, k = 2) : tensor<16x8xf32> -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %values, %indices : tensor<16x2xf32>, tensor<16x2xi32>
}

// -----

// An argmax in a private function (as jnp.argmax lowers): the call is
// specialised to its call site (rules follow calls, amp_calls.mlir) and the
// decision keeps the dot feeding it in f32.

// CHECK-LABEL: func.func public @argmax_in_a_call(
// CHECK: stablehlo.dot_general %arg0, %arg1, {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
// CHECK-NOT: call @argmax
// CHECK-NOT: func.func private @argmax

// REPORT-LABEL: func.func public @argmax_in_a_call(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {detail = "argmax/argmin", group = 0 : i64, precision = "f32", reason = "gates_decision"}
func.func public @argmax_in_a_call(%x: tensor<16x32xf32>, %w: tensor<32x8xf32>) -> tensor<16xi32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %1 = call @argmax(%0) : (tensor<16x8xf32>) -> tensor<16xi32>
  return %1 : tensor<16xi32>
}
func.func private @argmax(%arg0: tensor<16x8xf32>) -> tensor<16xi32> {
  %0 = stablehlo.iota dim = 1 : tensor<16x8xi32>
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %1:2 = stablehlo.reduce(%arg0 init: %cst), (%0 init: %c) across dimensions = [1] : (tensor<16x8xf32>, tensor<16x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<16xf32>, tensor<16xi32>)
   reducer(%a: tensor<f32>, %c1: tensor<f32>) (%b: tensor<i32>, %d: tensor<i32>)  {
    %2 = stablehlo.compare  GT, %a, %c1,  FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %3 = stablehlo.select %2, %a, %c1 : tensor<i1>, tensor<f32>
    %4 = stablehlo.select %2, %b, %d : tensor<i1>, tensor<i32>
    stablehlo.return %3, %4 : tensor<f32>, tensor<i32>
  }
  return %1#1 : tensor<16xi32>
}

// -----

// A compare whose result picks integers is a decision; one whose result
// picks floats (a ReLU mask) is not: that dot is lowered.

// CHECK-LABEL: func.func public @compare_picks_integers(
// CHECK: %[[D1:.*]] = stablehlo.dot_general %arg0, %arg1, {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
// CHECK: stablehlo.compare GT, %[[D1]]
// CHECK: %[[D2:.*]] = stablehlo.dot_general {{.*}} : (tensor<16x32xbf16>, tensor<32x8xbf16>) -> tensor<16x8xf32>
func.func public @compare_picks_integers(%x: tensor<16x32xf32>, %w: tensor<32x8xf32>, %w2: tensor<32x8xf32>) -> (tensor<16x8xi32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<16x8xf32>
  %1 = stablehlo.compare GT, %0, %zero : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xi1>
  %one = stablehlo.constant dense<1> : tensor<16x8xi32>
  %none = stablehlo.constant dense<0> : tensor<16x8xi32>
  %2 = stablehlo.select %1, %one, %none : tensor<16x8xi1>, tensor<16x8xi32>
  %3 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %4 = stablehlo.compare GT, %3, %zero : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xi1>
  %5 = stablehlo.select %4, %3, %zero : tensor<16x8xi1>, tensor<16x8xf32>
  return %2, %5 : tensor<16x8xi32>, tensor<16x8xf32>
}

// -----

// floor then a float-to-integer convert (an index computed from a value).

// CHECK-LABEL: func.func public @float_to_int(
// CHECK-NOT: stablehlo.convert %arg
// CHECK: stablehlo.dot_general %arg0, %arg1, {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
func.func public @float_to_int(%x: tensor<16x32xf32>, %w: tensor<32x8xf32>) -> tensor<16x8xi32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %1 = stablehlo.floor %0 : tensor<16x8xf32>
  %2 = stablehlo.convert %1 : (tensor<16x8xf32>) -> tensor<16x8xi32>
  return %2 : tensor<16x8xi32>
}

// -----

// Linear algebra: the operands of cholesky (and of the LAPACK, cuSOLVER and
// cuBLAS custom calls jaxlib emits) stay f32 back through their producers.

// CHECK-LABEL: func.func public @cholesky(
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.dot_general %arg0, %arg0, {{.*}} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>

// REPORT-LABEL: func.func public @cholesky(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {detail = "cholesky", group = 0 : i64, precision = "f32", reason = "linear_algebra"}
func.func public @cholesky(%x: tensor<8x16xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.dot_general %x, %x, contracting_dims = [1] x [1] : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
  %1 = stablehlo.cholesky %0, lower = true : tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// -----

// CHECK-LABEL: func.func public @lapack_call(
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.dot_general %arg0, %arg0, {{.*}} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>

// REPORT-LABEL: func.func public @lapack_call(
// REPORT: stablehlo.dot_general {{.*}}amp.decision = {detail = "lapack_spotrf_ffi", group = 0 : i64, precision = "f32", reason = "linear_algebra"}
func.func public @lapack_call(%x: tensor<8x16xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.dot_general %x, %x, contracting_dims = [1] x [1] : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
  %1:2 = stablehlo.custom_call @lapack_spotrf_ffi(%0) {mhlo.backend_config = {uplo = 76 : ui8}, operand_layouts = [dense<[0, 1]> : tensor<2xindex>], result_layouts = [dense<[0, 1]> : tensor<2xindex>, dense<> : tensor<0xindex>]} : (tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<i32>)
  return %1#0 : tensor<8x8xf32>
}

// -----

// An f64 module (a cumulative logsumexp, whose reduce_window body calls a
// private function, as JAX emits it) comes out unchanged and valid.

// CHECK-LABEL: func.func public @cumulative_logsumexp_f64(
// CHECK-NOT: stablehlo.convert
// CHECK: func.call @logaddexp(%{{.*}}, %{{.*}}) : (tensor<f64>, tensor<f64>) -> tensor<f64>
// CHECK: func.func private @logaddexp
// CHECK-NOT: stablehlo.convert
// CHECK: return
func.func public @cumulative_logsumexp_f64(%x: tensor<8xf64>) -> tensor<8xf64> {
  %init = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>
  %0 = "stablehlo.reduce_window"(%x, %init) <{padding = dense<[[7, 0]]> : tensor<1x2xi64>, window_dimensions = array<i64: 8>}> ({
  ^bb0(%a: tensor<f64>, %b: tensor<f64>):
    %1 = func.call @logaddexp(%a, %b) : (tensor<f64>, tensor<f64>) -> tensor<f64>
    stablehlo.return %1 : tensor<f64>
  }) : (tensor<8xf64>, tensor<f64>) -> tensor<8xf64>
  return %0 : tensor<8xf64>
}
func.func private @logaddexp(%a: tensor<f64>, %b: tensor<f64>) -> tensor<f64> {
  %0 = stablehlo.maximum %a, %b : tensor<f64>
  %1 = stablehlo.subtract %a, %b : tensor<f64>
  %2 = stablehlo.abs %1 : tensor<f64>
  %3 = stablehlo.negate %2 : tensor<f64>
  %4 = stablehlo.exponential %3 : tensor<f64>
  %5 = stablehlo.log_plus_one %4 : tensor<f64>
  %6 = stablehlo.add %0, %5 : tensor<f64>
  return %6 : tensor<f64>
}

// -----

// strict=true: what elementwise ops compute in the compute dtype stays f32,
// rounded by reduce_precision right after it is made (each value once);
// their f32 inputs are rounded where they are read, data movement of
// rounded values needs no rounding, and matrix multiplies take real bf16
// operands (a convert of a rounded value: exact). XLA drops a rounding
// between bf16 ops it computes in f32; it never drops a reduce_precision.

// STRICT-LABEL: func.func public @strict(
// STRICT-SAME: %[[X:[^:]*]]: tensor<64x128xf32>, %[[Y:[^:]*]]: tensor<64x128xf32>, %[[W:[^:]*]]: tensor<128x128xf32>
// STRICT-DAG: %[[RY:.*]] = stablehlo.reduce_precision %[[Y]], format = e8m7 : tensor<64x128xf32>
// STRICT-DAG: %[[RX:.*]] = stablehlo.reduce_precision %[[X]], format = e8m7 : tensor<64x128xf32>
// STRICT: %[[M:.*]] = stablehlo.multiply %[[RX]], %[[RY]] : tensor<64x128xf32>
// STRICT-NEXT: %[[RM:.*]] = stablehlo.reduce_precision %[[M]], format = e8m7 : tensor<64x128xf32>
// STRICT-NEXT: %[[T:.*]] = stablehlo.transpose %[[RM]], dims = [1, 0]
// STRICT-NEXT: %[[H:.*]] = stablehlo.tanh %[[T]] : tensor<128x64xf32>
// STRICT-NEXT: %[[RH:.*]] = stablehlo.reduce_precision %[[H]], format = e8m7 : tensor<128x64xf32>
// STRICT: %[[LOW:.*]] = stablehlo.convert %[[RH]] : (tensor<128x64xf32>) -> tensor<128x64xbf16>
// STRICT: stablehlo.dot_general %[[LOW]]
func.func public @strict(%x: tensor<64x128xf32>, %y: tensor<64x128xf32>, %w: tensor<128x128xf32>) -> tensor<128x128xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<64x128xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<64x128xf32>) -> tensor<128x64xf32>
  %2 = stablehlo.tanh %1 : tensor<128x64xf32>
  %3 = stablehlo.dot_general %2, %x, contracting_dims = [1] x [0] : (tensor<128x64xf32>, tensor<64x128xf32>) -> tensor<128x128xf32>
  return %3 : tensor<128x128xf32>
}

// -----

// The defaults on gpu: a GEMM accumulates in f32 and rounds once as it
// writes, so a bf16 policy's GEMMs write bf16 (dot-result=compute) and
// their f32 readers widen it. f16 keeps f32 results: f16 has less range
// than f32 (the F16 prefix); so does cpu (the CPU prefix, which has no such
// GEMM).
// decisions=gate (the default) keeps the gating computation of a discrete
// decision f32: the router's matrix multiply and what follows it up to
// top_k, not what the router reads (here the tanh of another GEMM's
// result). decisions=exact keeps everything upstream f32 too, so the
// choices equal f32's.

// GATE-LABEL: func.func public @router(
// GATE: %[[H:.*]] = stablehlo.dot_general {{.*}} : (tensor<16x64xbf16>, tensor<64x32xbf16>) -> tensor<16x32xbf16>
// GATE: stablehlo.dot_general {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
// GATE: chlo.top_k

// EXACT-LABEL: func.func public @router(
// EXACT-NOT: bf16
// EXACT: stablehlo.dot_general %arg0, %arg1, {{.*}} : (tensor<16x64xf32>, tensor<64x32xf32>) -> tensor<16x32xf32>
// EXACT-NOT: bf16
// EXACT: chlo.top_k

// F16-LABEL: func.func public @router(
// F16: stablehlo.dot_general {{.*}} : (tensor<16x64xf16>, tensor<64x32xf16>) -> tensor<16x32xf32>
func.func public @router(%x: tensor<16x64xf32>, %w: tensor<64x32xf32>, %wr: tensor<32x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<16x64xf32>, tensor<64x32xf32>) -> tensor<16x32xf32>
  %1 = stablehlo.tanh %0 : tensor<16x32xf32>
  %2 = stablehlo.dot_general %1, %wr, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %values, %indices = chlo.top_k(%2, k = 2) : tensor<16x8xf32> -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %values, %indices : tensor<16x2xf32>, tensor<16x2xi32>
}

// -----

// A hidden state made in f32 (here by an exponential, as a layer norm
// makes one) that the experts' GEMM reads in the compute dtype: the gate
// reads that rounding too, widened, so the hidden state is written once,
// in the compute dtype. The barrier keeps XLA from folding the round trip
// back into the f32 original. decisions=exact reads the f32 original.

// GATE-LABEL: func.func public @router_hidden_state(
// GATE: %[[H:.*]] = stablehlo.exponential %arg0 : tensor<16x32xf32>
// GATE-NEXT: %[[L:.*]] = stablehlo.convert %[[H]] : (tensor<16x32xf32>) -> tensor<16x32xbf16>
// GATE-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[L]] : tensor<16x32xbf16>
// GATE-NEXT: %[[W:.*]] = stablehlo.convert %[[HELD]] : (tensor<16x32xbf16>) -> tensor<16x32xf32>
// GATE: stablehlo.dot_general %[[L]], {{.*}} : (tensor<16x32xbf16>, tensor<32x64xbf16>) -> tensor<16x64xbf16>
// GATE: stablehlo.dot_general %[[W]], %arg2, {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>

// EXACT-LABEL: func.func public @router_hidden_state(
// EXACT: %[[H:.*]] = stablehlo.exponential %arg0 : tensor<16x32xf32>
// EXACT-NOT: stablehlo.optimization_barrier
// EXACT: stablehlo.dot_general %[[H]], %arg2, {{.*}} : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
func.func public @router_hidden_state(%x: tensor<16x32xf32>, %we: tensor<32x64xf32>, %wr: tensor<32x8xf32>) -> (tensor<16x64xf32>, tensor<16x2xi32>) {
  %h = stablehlo.exponential %x : tensor<16x32xf32>
  %e = stablehlo.dot_general %h, %we, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x64xf32>) -> tensor<16x64xf32>
  %r = stablehlo.dot_general %h, %wr, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x8xf32>) -> tensor<16x8xf32>
  %values, %indices = chlo.top_k(%r, k = 2) : tensor<16x8xf32> -> (tensor<16x2xf32>, tensor<16x2xi32>)
  return %e, %indices : tensor<16x64xf32>, tensor<16x2xi32>
}

// -----

// Softmax's exponential, divided by its own sum and read again across a
// matrix multiply. On gpu, over rows of a power-of-two length (128 here),
// XLA fuses the sum and the division with the exponential into one Triton
// kernel, which storing the exponential would split: the quotient is
// stored instead. Over 100-long rows XLA splits the softmax anyway, and on
// cpu there is no such kernel: the exponential is stored.

// CHECK-LABEL: func.func public @softmax_rows(
// CHECK: %[[E:.*]] = stablehlo.exponential
// CHECK-NOT: stablehlo.convert %[[E]]
// CHECK: %[[P:.*]] = stablehlo.divide %[[E]], %{{.*}} : tensor<64x128xf32>
// CHECK-NEXT: stablehlo.convert %[[P]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}}
// CHECK: %[[E2:.*]] = stablehlo.exponential
// CHECK-NEXT: stablehlo.convert %[[E2]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}} : (tensor<64x100xf32>) -> tensor<64x100xbf16>

// CPU-LABEL: func.func public @softmax_rows(
// CPU: %[[E:.*]] = stablehlo.exponential
// CPU-NEXT: stablehlo.convert %[[E]] {mhlo.frontend_attributes = {amp_stored = "{{[0-9]+}}"}} : (tensor<64x128xf32>) -> tensor<64x128xbf16>
func.func public @softmax_rows(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<64x128xf32>, %v1: tensor<64x100xf32>, %v2: tensor<64x100xf32>) -> (tensor<64x128xf32>, tensor<64x100xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %1 = stablehlo.exponential %0 : tensor<64x128xf32>
  %2 = stablehlo.reduce(%1 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %4 = stablehlo.divide %1, %3 : tensor<64x128xf32>
  %5 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %6 = stablehlo.multiply %4, %5 : tensor<64x128xf32>
  %7 = stablehlo.multiply %6, %1 : tensor<64x128xf32>
  %10 = stablehlo.dot_general %x, %v1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x100xf32>) -> tensor<64x100xf32>
  %11 = stablehlo.exponential %10 : tensor<64x100xf32>
  %12 = stablehlo.reduce(%11 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x100xf32>, tensor<f32>) -> tensor<64xf32>
  %13 = stablehlo.broadcast_in_dim %12, dims = [0] : (tensor<64xf32>) -> tensor<64x100xf32>
  %14 = stablehlo.divide %11, %13 : tensor<64x100xf32>
  %15 = stablehlo.dot_general %x, %v2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x100xf32>) -> tensor<64x100xf32>
  %16 = stablehlo.multiply %14, %15 : tensor<64x100xf32>
  %17 = stablehlo.multiply %16, %11 : tensor<64x100xf32>
  return %7, %17 : tensor<64x128xf32>, tensor<64x100xf32>
}
