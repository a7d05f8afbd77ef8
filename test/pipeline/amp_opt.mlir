// amp-opt's own pipeline (amp-insert-converts, then amp-simplify-converts,
// then jaxlib's verifier) on StableHLO as JAX prints it. Each pass alone is
// tested in test/passes. Default policy p=f32,c=bf16,o=f32 on gpu; each
// other option has its own RUN line and prefix.
//
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --policy p=f32,c=bf16,o=f32 | FileCheck %s
// RUN: amp-opt %s --split-input-file --target cpu --level O2 --policy p=f32,c=bf16,o=f32 | FileCheck %s --check-prefix=CPU
// The cpu target's default level is O1 (XLA:CPU computes low-precision
// elementwise arithmetic in f32 anyway): dots only.
// RUN: amp-opt %s --split-input-file --target cpu --policy p=f32,c=bf16,o=f32 | FileCheck %s --check-prefix=CPU-O1
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --level O1 | FileCheck %s --check-prefix=O1
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --level O3 | FileCheck %s --check-prefix=O3
// RUN: amp-opt %s --split-input-file --target gpu --dot-result compute | FileCheck %s --check-prefix=DOTC
// On gpu a bf16 policy's GEMMs write bf16 by default: the same as DOTC.
// RUN: amp-opt %s --split-input-file --target gpu | FileCheck %s --check-prefix=DOTC
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --keep-f32 tanh | FileCheck %s --check-prefix=KEEP
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --force-compute exponential | FileCheck %s --check-prefix=FORCE
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --policy p=bf16,c=bf16,o=bf16 | FileCheck %s --check-prefix=BF16
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --policy p=f32,c=f16,o=f32 | FileCheck %s --check-prefix=F16
//
// --level O0 changes nothing: its output is the input as jaxlib prints it
// (an empty pipeline), converts in the input included (@explicit_round_trip).
// O0 is the identity: not even amp-simplify-converts runs, so the round trip
// in @explicit_round_trip survives.
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module()' -o %t.input.mlir
// RUN: amp-opt %s --split-input-file --target gpu --dot-result f32 --level O0 -o %t.o0.mlir
// RUN: diff %t.input.mlir %t.o0.mlir

// Plain matmul: operands converted once each, f32 accumulation.

// CHECK-LABEL: func.func public @matmul(
// CHECK-SAME: %[[W:[^:]*]]: tensor<8x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-DAG: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK: %[[D:.*]] = stablehlo.dot_general %[[XB]], %[[WB]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: return %[[D]] : tensor<4x8xf32>

// On cpu (XLA:CPU) the dot becomes NT-canonical [B, M, K] x [B, N, K]:
// batch dimensions first, one contracting dimension, last on both operands,
// precision config kept, no transpose feeding the dot directly (the CPU-NOT
// lines run up to the `batching_dims` of the dot, so they cover its
// operands), result reshaped back.
// CPU-LABEL: func.func public @matmul(
// CPU-SAME: %[[W:[^:]*]]: tensor<8x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>) -> tensor<4x8xf32>
// CPU-DAG: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CPU-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CPU-DAG: %[[WT:.*]] = stablehlo.transpose %[[WB]], dims = [1, 0] : (tensor<8x8xbf16>) -> tensor<8x8xbf16>
// CPU-NOT: {{stablehlo.dot_general (%[^,]+, )?}}%[[WT]],
// CPU: batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x8xbf16>, tensor<1x8x8xbf16>) -> tensor<1x4x8xf32>
// CPU-NEXT: %[[R:.*]] = stablehlo.reshape %{{.*}} : (tensor<1x4x8xf32>) -> tensor<4x8xf32>
// CPU-NOT: stablehlo.convert
// CPU: return %[[R]] : tensor<4x8xf32>

// O1-LABEL: func.func public @matmul(
// O1-DAG: %[[WB:.*]] = stablehlo.convert %{{.*}} : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// O1-DAG: %[[XB:.*]] = stablehlo.convert %{{.*}} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// O1: stablehlo.dot_general %[[XB]], %[[WB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>

// DOTC-LABEL: func.func public @matmul(
// DOTC: %[[D:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>
// DOTC: %[[DF:.*]] = stablehlo.convert %[[D]] : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// DOTC: return %[[DF]] : tensor<4x8xf32>

// Params in bf16: the signature changes, arguments feed the dot directly.
// BF16-LABEL: func.func public @matmul(
// BF16-SAME: %[[W:[^:]*]]: tensor<8x8xbf16>, %[[X:[^:]*]]: tensor<4x8xbf16>) -> tensor<4x8xbf16>
// BF16-NOT: stablehlo.convert
// BF16: %[[D:.*]] = stablehlo.dot_general %[[X]], %[[W]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// BF16: %[[DB:.*]] = stablehlo.convert %[[D]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// BF16: return %[[DB]] : tensor<4x8xbf16>

// F16-LABEL: func.func public @matmul(
// F16-DAG: %[[WB:.*]] = stablehlo.convert %{{.*}} : (tensor<8x8xf32>) -> tensor<8x8xf16>
// F16-DAG: %[[XB:.*]] = stablehlo.convert %{{.*}} : (tensor<4x8xf32>) -> tensor<4x8xf16>
// F16: %[[D:.*]] = stablehlo.dot_general %[[XB]], %[[WB]], {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf32>
// F16-NOT: stablehlo.convert
// F16: return %[[D]] : tensor<4x8xf32>
func.func public @matmul(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// An MLP: everything between the two dots computes in bf16; the bias is
// converted before it is broadcast (the convert lands on the small tensor);
// the relu zero is re-encoded, not converted; the first dot's f32 result is
// rounded once.

// CHECK-LABEL: func.func public @mlp(
// CHECK-SAME: %[[W1:[^:]*]]: tensor<8x16xf32>, %[[B:[^:]*]]: tensor<16xf32>, %[[W2:[^:]*]]: tensor<16x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-DAG: %[[W1B:.*]] = stablehlo.convert %[[W1]] : (tensor<8x16xf32>) -> tensor<8x16xbf16>
// CHECK-DAG: %[[BB:.*]] = stablehlo.convert %[[B]] : (tensor<16xf32>) -> tensor<16xbf16>
// CHECK-DAG: %[[W2B:.*]] = stablehlo.convert %[[W2]] : (tensor<16x8xf32>) -> tensor<16x8xbf16>
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK: %[[H:.*]] = stablehlo.dot_general %[[XB]], %[[W1B]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
// CHECK-DAG: %[[HB:.*]] = stablehlo.convert %[[H]] : (tensor<4x16xf32>) -> tensor<4x16xbf16>
// CHECK-DAG: %[[B1:.*]] = stablehlo.broadcast_in_dim %[[BB]], dims = [1] : (tensor<16xbf16>) -> tensor<1x16xbf16>
// CHECK-DAG: %[[B2:.*]] = stablehlo.broadcast_in_dim %[[B1]], dims = [0, 1] : (tensor<1x16xbf16>) -> tensor<4x16xbf16>
// CHECK: %[[A:.*]] = stablehlo.add %[[HB]], %[[B2]] : tensor<4x16xbf16>
// CHECK: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
// CHECK: %[[ZEROS:.*]] = stablehlo.broadcast_in_dim %[[ZERO]], dims = [] : (tensor<bf16>) -> tensor<4x16xbf16>
// CHECK: %[[R:.*]] = stablehlo.maximum %[[A]], %[[ZEROS]] : tensor<4x16xbf16>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[O:.*]] = stablehlo.dot_general %[[R]], %[[W2B]], contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x16xbf16>, tensor<16x8xbf16>) -> tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: return %[[O]] : tensor<4x8xf32>

// The second dot's lhs comes from `maximum` through a reshape only.
// CPU-LABEL: func.func public @mlp(
// CPU: %[[R:.*]] = stablehlo.maximum %{{.*}}, %{{.*}} : tensor<4x16xbf16>
// CPU-DAG: stablehlo.reshape %[[R]] : (tensor<4x16xbf16>) -> tensor<1x4x16xbf16>
// CPU-DAG: %[[WT:.*]] = stablehlo.transpose %{{.*}}, dims = [1, 0] : (tensor<16x8xbf16>) -> tensor<8x16xbf16>
// CPU-NOT: {{stablehlo.dot_general (%[^,]+, )?}}%[[WT]],
// CPU: batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} : (tensor<1x4x16xbf16>, tensor<1x8x16xbf16>) -> tensor<1x4x8xf32>
// CPU-NEXT: %[[O:.*]] = stablehlo.reshape %{{.*}} : (tensor<1x4x8xf32>) -> tensor<4x8xf32>
// CPU-NEXT: return %[[O]] : tensor<4x8xf32>

// O1 lowers the dots only: bias add and relu stay f32.
// O1-LABEL: func.func public @mlp(
// O1: %[[H:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
// O1-NOT: stablehlo.convert
// O1: %[[A:.*]] = stablehlo.add %[[H]], %{{.*}} : tensor<4x16xf32>
// O1: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// O1: %[[R:.*]] = stablehlo.maximum %[[A]], %{{.*}} : tensor<4x16xf32>
// O1: %[[RB:.*]] = stablehlo.convert %[[R]] : (tensor<4x16xf32>) -> tensor<4x16xbf16>
// O1: stablehlo.dot_general %[[RB]], %{{.*}} : (tensor<4x16xbf16>, tensor<16x8xbf16>) -> tensor<4x8xf32>

// DOTC-LABEL: func.func public @mlp(
// DOTC: %[[H:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xbf16>
// DOTC-NOT: stablehlo.convert
// DOTC: stablehlo.add %[[H]], %{{.*}} : tensor<4x16xbf16>
// DOTC: %[[O:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x16xbf16>, tensor<16x8xbf16>) -> tensor<4x8xbf16>
// DOTC: %[[OF:.*]] = stablehlo.convert %[[O]] : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// DOTC: return %[[OF]] : tensor<4x8xf32>

// BF16-LABEL: func.func public @mlp(
// BF16-SAME: %[[W1:[^:]*]]: tensor<8x16xbf16>, %[[B:[^:]*]]: tensor<16xbf16>, %[[W2:[^:]*]]: tensor<16x8xbf16>, %[[X:[^:]*]]: tensor<4x8xbf16>) -> tensor<4x8xbf16>
// BF16: %[[H:.*]] = stablehlo.dot_general %[[X]], %[[W1]], {{.*}} : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
// BF16: %[[HB:.*]] = stablehlo.convert %[[H]] : (tensor<4x16xf32>) -> tensor<4x16xbf16>
// BF16: %[[B1:.*]] = stablehlo.broadcast_in_dim %[[B]], dims = [1] : (tensor<16xbf16>) -> tensor<1x16xbf16>
// BF16: stablehlo.add %[[HB]], %{{.*}} : tensor<4x16xbf16>
// BF16: %[[R:.*]] = stablehlo.maximum %{{.*}}, %{{.*}} : tensor<4x16xbf16>
// BF16: %[[O:.*]] = stablehlo.dot_general %[[R]], %[[W2]], {{.*}} : (tensor<4x16xbf16>, tensor<16x8xbf16>) -> tensor<4x8xf32>
// BF16: %[[OB:.*]] = stablehlo.convert %[[O]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// BF16: return %[[OB]] : tensor<4x8xbf16>

// F16-LABEL: func.func public @mlp(
// F16-DAG: %[[BB:.*]] = stablehlo.convert %{{.*}} : (tensor<16xf32>) -> tensor<16xf16>
// F16: %[[H:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x8xf16>, tensor<8x16xf16>) -> tensor<4x16xf32>
// F16: %[[HB:.*]] = stablehlo.convert %[[H]] : (tensor<4x16xf32>) -> tensor<4x16xf16>
// F16: stablehlo.add %[[HB]], %{{.*}} : tensor<4x16xf16>
// F16: stablehlo.constant dense<0.000000e+00> : tensor<f16>
// F16: %[[R:.*]] = stablehlo.maximum %{{.*}}, %{{.*}} : tensor<4x16xf16>
// F16: stablehlo.dot_general %[[R]], %{{.*}} : (tensor<4x16xf16>, tensor<16x8xf16>) -> tensor<4x8xf32>
// CPU-O1-LABEL: func.func public @mlp(
// CPU-O1: stablehlo.dot_general {{.*}} : (tensor<1x4x8xbf16>, tensor<1x16x8xbf16>) -> tensor<1x4x16xf32>
// CPU-O1: %[[A:.*]] = stablehlo.add %{{.*}}, %{{.*}} : tensor<4x16xf32>
// CPU-O1: %[[R:.*]] = stablehlo.maximum %[[A]], %{{.*}} : tensor<4x16xf32>
// CPU-O1: stablehlo.convert %[[R]] : (tensor<4x16xf32>) -> tensor<4x16xbf16>
// CPU-O1: batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} : (tensor<1x4x16xbf16>, tensor<1x8x16xbf16>) -> tensor<1x4x8xf32>
func.func public @mlp(%arg0: tensor<8x16xf32>, %arg1: tensor<16xf32>, %arg2: tensor<16x8xf32>, %arg3: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg3, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %1 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<16xf32>) -> tensor<1x16xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1] : (tensor<1x16xf32>) -> tensor<4x16xf32>
  %3 = stablehlo.add %0, %2 : tensor<4x16xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %4 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
  %5 = stablehlo.maximum %3, %4 : tensor<4x16xf32>
  %6 = stablehlo.dot_general %5, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %6 : tensor<4x8xf32>
}

// -----

// Softmax stays f32 (max, subtract, exp, sum, divide); its result is
// converted once where it enters the dot.

// CHECK-LABEL: func.func public @softmax(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[V:[^:]*]]: tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK-DAG: %[[VB:.*]] = stablehlo.convert %[[V]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[NEG_INF:.*]] = stablehlo.constant dense<0xFF800000> : tensor<f32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[M:.*]] = stablehlo.reduce(%[[X]] init: %[[NEG_INF]]) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[S:.*]] = stablehlo.subtract %[[X]], %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[SUM:.*]] = stablehlo.reduce(%[[E]] init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[P:.*]] = stablehlo.divide %[[E]], %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: %[[PB:.*]] = stablehlo.convert %[[P]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[O:.*]] = stablehlo.dot_general %[[PB]], %[[VB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[O]] : tensor<4x8xf32>

// O1-LABEL: func.func public @softmax(
// O1: stablehlo.exponential %{{.*}} : tensor<4x8xf32>
// O1: %[[P:.*]] = stablehlo.divide %{{.*}}, %{{.*}} : tensor<4x8xf32>
// O1: %[[PB:.*]] = stablehlo.convert %[[P]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>

// O3 lowers every float op, exp and sum included.
// O3-LABEL: func.func public @softmax(
// O3-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[V:[^:]*]]: tensor<8x8xf32>) -> tensor<4x8xf32>
// O3-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// O3-DAG: %[[NEG_INF:.*]] = stablehlo.constant dense<0xFF80> : tensor<bf16>
// O3: stablehlo.reduce(%[[XB]] init: %[[NEG_INF]]) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xbf16>, tensor<bf16>) -> tensor<4xbf16>
// O3: %[[S:.*]] = stablehlo.subtract %[[XB]], %{{.*}} : tensor<4x8xbf16>
// O3: %[[E:.*]] = stablehlo.exponential %[[S]] : tensor<4x8xbf16>
// O3: stablehlo.reduce(%[[E]] init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<4x8xbf16>, tensor<bf16>) -> tensor<4xbf16>
// O3: %[[P:.*]] = stablehlo.divide %[[E]], %{{.*}} : tensor<4x8xbf16>
// O3-NOT: stablehlo.convert
// O3: %[[O:.*]] = stablehlo.dot_general %[[P]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// O3: return %[[O]] : tensor<4x8xf32>

// force-compute puts exp in bf16; its consumers stay f32 and share one
// convert back.
// FORCE-LABEL: func.func public @softmax(
// FORCE: %[[S:.*]] = stablehlo.subtract %{{.*}}, %{{.*}} : tensor<4x8xf32>
// FORCE: %[[SB:.*]] = stablehlo.convert %[[S]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// FORCE: %[[E:.*]] = stablehlo.exponential %[[SB]] : tensor<4x8xbf16>
// FORCE: %[[EF:.*]] = stablehlo.convert %[[E]] : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// FORCE-NOT: stablehlo.convert %[[E]]
// FORCE: stablehlo.reduce(%[[EF]] init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
// FORCE-NOT: stablehlo.convert %[[E]]
// FORCE: stablehlo.divide %[[EF]], %{{.*}} : tensor<4x8xf32>
func.func public @softmax(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %3 = stablehlo.subtract %arg0, %2 : tensor<4x8xf32>
  %4 = stablehlo.exponential %3 : tensor<4x8xf32>
  %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %5 = stablehlo.reduce(%4 init: %cst_0) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %6 = stablehlo.broadcast_in_dim %5, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
  %7 = stablehlo.broadcast_in_dim %6, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %8 = stablehlo.divide %4, %7 : tensor<4x8xf32>
  %9 = stablehlo.dot_general %8, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %9 : tensor<4x8xf32>
}

// -----

// Layer norm before a dot: the statistics (sums, mean, variance, rsqrt) and
// the normalisation stay f32; one convert where the result enters the dot.

// CHECK-LABEL: func.func public @layer_norm(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[G:[^:]*]]: tensor<8xf32>, %[[W:[^:]*]]: tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x16xf32>) -> tensor<8x16xbf16>
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.reduce(%[[X]] init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[C:.*]] = stablehlo.subtract %[[X]], %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: %[[SQ:.*]] = stablehlo.multiply %[[C]], %[[C]] : tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.reduce(%[[SQ]] init: %{{.*}}) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.constant dense<9.99999974E-6> : tensor<f32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[RS:.*]] = stablehlo.rsqrt %{{.*}} : tensor<4x1xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[N:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: stablehlo.broadcast_in_dim %[[G]], dims = [1] : (tensor<8xf32>) -> tensor<1x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[Y:.*]] = stablehlo.multiply %[[N]], %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: %[[YB:.*]] = stablehlo.convert %[[Y]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[O:.*]] = stablehlo.dot_general %[[YB]], %[[WB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
// CHECK-NEXT: return %[[O]] : tensor<4x16xf32>
func.func public @layer_norm(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>, %arg2: tensor<8x16xf32>) -> tensor<4x16xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
  %cst_0 = stablehlo.constant dense<8.000000e+00> : tensor<f32>
  %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
  %3 = stablehlo.divide %1, %2 : tensor<4x1xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %5 = stablehlo.subtract %arg0, %4 : tensor<4x8xf32>
  %6 = stablehlo.multiply %5, %5 : tensor<4x8xf32>
  %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %7 = stablehlo.reduce(%6 init: %cst_1) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %8 = stablehlo.broadcast_in_dim %7, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
  %cst_2 = stablehlo.constant dense<8.000000e+00> : tensor<f32>
  %9 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
  %10 = stablehlo.divide %8, %9 : tensor<4x1xf32>
  %11 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %12 = stablehlo.subtract %arg0, %11 : tensor<4x8xf32>
  %cst_3 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
  %13 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
  %14 = stablehlo.add %10, %13 : tensor<4x1xf32>
  %15 = stablehlo.rsqrt %14 : tensor<4x1xf32>
  %16 = stablehlo.broadcast_in_dim %15, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %17 = stablehlo.multiply %12, %16 : tensor<4x8xf32>
  %18 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<8xf32>) -> tensor<1x8xf32>
  %19 = stablehlo.broadcast_in_dim %18, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<4x8xf32>
  %20 = stablehlo.multiply %17, %19 : tensor<4x8xf32>
  %21 = stablehlo.dot_general %20, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  return %21 : tensor<4x16xf32>
}

// -----

// A sum reduction between two dots stays f32 (its body too); the convert
// lands on the reduced tensor, before the broadcast.

// CHECK-LABEL: func.func public @reduce_sum(
// CHECK: %[[D:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK: %[[SUM:.*]] = stablehlo.reduce(%[[D]] init: %[[ZERO]]) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
// CHECK-NEXT: %[[SUMB:.*]] = stablehlo.convert %[[SUM]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[BC:.*]] = stablehlo.broadcast_in_dim %[[SUMB]], dims = [0] : (tensor<4xbf16>) -> tensor<4x8xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[BC]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
func.func public @reduce_sum(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %3 = stablehlo.dot_general %2, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %3 : tensor<4x8xf32>
}

// -----

// A max reduction between two dots runs in bf16: operand, init (re-encoded
// -inf) and body all bf16 (the compact `applies` form is only printed when
// the body's types match the operands').

// CHECK-LABEL: func.func public @reduce_max(
// CHECK: %[[D:.*]] = stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[DB:.*]] = stablehlo.convert %[[D]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[NEG_INF:.*]] = stablehlo.constant dense<0xFF80> : tensor<bf16>
// CHECK-NEXT: %[[M:.*]] = stablehlo.reduce(%[[DB]] init: %[[NEG_INF]]) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xbf16>, tensor<bf16>) -> tensor<4xbf16>
// CHECK-NEXT: %[[BC:.*]] = stablehlo.broadcast_in_dim %[[M]], dims = [0] : (tensor<4xbf16>) -> tensor<4x8xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[BC]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>

// O1-LABEL: func.func public @reduce_max(
// O1: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>

// F16-LABEL: func.func public @reduce_max(
// F16: %[[NEG_INF:.*]] = stablehlo.constant dense<0xFC00> : tensor<f16>
// F16: stablehlo.reduce(%{{.*}} init: %[[NEG_INF]]) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf16>, tensor<f16>) -> tensor<4xf16>
func.func public @reduce_max(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %cst) across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
   reducer(%a: tensor<f32>, %b: tensor<f32>)  {
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }
  %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %3 = stablehlo.dot_general %2, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %3 : tensor<4x8xf32>
}

// -----

// Float constants feeding bf16 ops are re-encoded, never wrapped in a
// convert; a constant also used in f32 keeps its f32 original.

// CHECK-LABEL: func.func public @constants(
// CHECK-DAG: %[[C:.*]] = stablehlo.constant dense<1.000000e-01> : tensor<4x8xf32>
// CHECK-DAG: %[[CB:.*]] = stablehlo.constant dense<1.000980e-01> : tensor<4x8xbf16>
// CHECK-DAG: %[[HALF:.*]] = stablehlo.constant dense<1.500000e+00> : tensor<4x8xbf16>
// CHECK-NOT: stablehlo.convert %[[C]]
// CHECK: %[[D:.*]] = stablehlo.dot_general {{.*}} -> tensor<4x8xf32>
// CHECK-NEXT: %[[DB:.*]] = stablehlo.convert %[[D]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[M1:.*]] = stablehlo.multiply %[[DB]], %[[CB]] : tensor<4x8xbf16>
// CHECK-NEXT: %[[M2:.*]] = stablehlo.multiply %[[M1]], %[[HALF]] : tensor<4x8xbf16>
// CHECK-NEXT: %[[O:.*]] = stablehlo.dot_general %[[M2]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[E:.*]] = stablehlo.exponential %[[C]] : tensor<4x8xf32>
// CHECK-NEXT: return %[[O]], %[[E]] : tensor<4x8xf32>, tensor<4x8xf32>
func.func public @constants(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %cst = stablehlo.constant dense<1.000000e-01> : tensor<4x8xf32>
  %cst_0 = stablehlo.constant dense<1.500000e+00> : tensor<4x8xf32>
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.multiply %0, %cst : tensor<4x8xf32>
  %2 = stablehlo.multiply %1, %cst_0 : tensor<4x8xf32>
  %3 = stablehlo.dot_general %2, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %4 = stablehlo.exponential %cst : tensor<4x8xf32>
  return %3, %4 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// Integer and boolean values are never touched: iota, compare and the mask
// keep i32/i1 while the select between the dots goes bf16.

// CHECK-LABEL: func.func public @integer_mask(
// CHECK: %[[D:.*]] = stablehlo.dot_general {{.*}} -> tensor<4x8xf32>
// CHECK-NEXT: %[[DB:.*]] = stablehlo.convert %[[D]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[I:.*]] = stablehlo.iota dim = 1 : tensor<4x8xi32>
// CHECK-NEXT: %[[FOUR:.*]] = stablehlo.constant dense<4> : tensor<4x8xi32>
// CHECK-NEXT: %[[MASK:.*]] = stablehlo.compare LT, %[[I]], %[[FOUR]], SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
// CHECK-NEXT: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<4x8xbf16>
// CHECK-NEXT: %[[SEL:.*]] = stablehlo.select %[[MASK]], %[[DB]], %[[ZERO]] : tensor<4x8xi1>, tensor<4x8xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[SEL]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
func.func public @integer_mask(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.iota dim = 1 : tensor<4x8xi32>
  %c = stablehlo.constant dense<4> : tensor<4x8xi32>
  %2 = stablehlo.compare LT, %1, %c, SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
  %3 = stablehlo.select %2, %0, %cst : tensor<4x8xi1>, tensor<4x8xf32>
  %4 = stablehlo.dot_general %3, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %4 : tensor<4x8xf32>
}

// -----

// An integer-to-float convert only materialises a float: feeding a bf16 op
// it converts straight to bf16 (no i32 -> f32 -> bf16 chain).

// CHECK-LABEL: func.func public @int_to_float(
// CHECK: %[[I:.*]] = stablehlo.iota dim = 1 : tensor<4x8xi32>
// CHECK-NEXT: %[[IB:.*]] = stablehlo.convert %[[I]] : (tensor<4x8xi32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[M:.*]] = stablehlo.multiply %{{.*}}, %[[IB]] : tensor<4x8xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[M]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
func.func public @int_to_float(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.iota dim = 1 : tensor<4x8xi32>
  %2 = stablehlo.convert %1 : (tensor<4x8xi32>) -> tensor<4x8xf32>
  %3 = stablehlo.multiply %0, %2 : tensor<4x8xf32>
  %4 = stablehlo.dot_general %3, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %4 : tensor<4x8xf32>
}

// -----

// A custom call keeps its exact types: its bf16 operand is converted back to
// f32 (once), its f32 result is used as f32.

// CHECK-LABEL: func.func public @custom_call(
// CHECK: %[[A:.*]] = stablehlo.add %{{.*}}, %{{.*}} : tensor<4x8xbf16>
// CHECK-DAG: %[[AF:.*]] = stablehlo.convert %[[A]] : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// CHECK-DAG: %[[D:.*]] = stablehlo.dot_general %[[A]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK: %[[K:.*]] = stablehlo.custom_call @my_kernel(%[[AF]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[S:.*]] = stablehlo.add %[[D]], %[[K]] : tensor<4x8xf32>
// CHECK-NEXT: return %[[S]] : tensor<4x8xf32>

// Even at O3 the custom call keeps f32 operands and results.
// O3-LABEL: func.func public @custom_call(
// O3: %[[AF:.*]] = stablehlo.convert %{{.*}} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// O3: %[[K:.*]] = stablehlo.custom_call @my_kernel(%[[AF]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// O3: %[[KB:.*]] = stablehlo.convert %[[K]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// O3: stablehlo.add %{{.*}}, %[[KB]] : tensor<4x8xbf16>
func.func public @custom_call(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.add %0, %0 : tensor<4x8xf32>
  %2 = stablehlo.dot_general %1, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %3 = stablehlo.custom_call @my_kernel(%1) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %4 = stablehlo.add %2, %3 : tensor<4x8xf32>
  return %4 : tensor<4x8xf32>
}

// -----

// while: the loop-carried types stay as they are; the dot inside the body is
// lowered.

// CHECK-LABEL: func.func public @while_loop(
// CHECK: %[[L:[[:alnum:]_]+]]:3 = stablehlo.while(%[[W:[[:alnum:]_]+]] = %{{[[:alnum:]_]+}}, %{{[[:alnum:]_]+}} = %{{[[:alnum:]_]+}}, %[[X:[[:alnum:]_]+]] = %{{[[:alnum:]_]+}}) : tensor<8x8xf32>, tensor<i32>, tensor<4x8xf32>
// CHECK: } do {
// CHECK-DAG: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK: %[[D:.*]] = stablehlo.dot_general %[[XB]], %[[WB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]] : tensor<4x8xf32>
// CHECK: stablehlo.return %[[W]], %{{.*}}, %[[T]] : tensor<8x8xf32>, tensor<i32>, tensor<4x8xf32>
// CHECK: return %[[L]]#2 : tensor<4x8xf32>

// CPU-LABEL: func.func public @while_loop(
// CPU: } do {
// CPU: stablehlo.dot_general %{{.*}}, %{{.*}}, batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} : (tensor<1x4x8xbf16>, tensor<1x8x8xbf16>) -> tensor<1x4x8xf32>
// CPU: stablehlo.return %{{.*}} : tensor<8x8xf32>, tensor<i32>, tensor<4x8xf32>

// bf16 params: the loop still carries f32, converted on the way in and out.
// BF16-LABEL: func.func public @while_loop(
// BF16-SAME: %[[W:[^:]*]]: tensor<8x8xbf16>, %[[X:[^:]*]]: tensor<4x8xbf16>) -> tensor<4x8xbf16>
// BF16-DAG: %[[WF:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xbf16>) -> tensor<8x8xf32>
// BF16-DAG: %[[XF:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// BF16: %[[L:.*]]:3 = stablehlo.while(%{{.*}} = %[[WF]], %{{.*}} = %{{.*}}, %{{.*}} = %[[XF]]) : tensor<8x8xf32>, tensor<i32>, tensor<4x8xf32>
// BF16: %[[R:.*]] = stablehlo.convert %[[L]]#2 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// BF16: return %[[R]] : tensor<4x8xbf16>
func.func public @while_loop(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c = stablehlo.constant dense<0> : tensor<i32>
  %0:3 = stablehlo.while(%iterArg = %arg0, %iterArg_0 = %c, %iterArg_1 = %arg1) : tensor<8x8xf32>, tensor<i32>, tensor<4x8xf32>
  cond {
    %c_2 = stablehlo.constant dense<3> : tensor<i32>
    %1 = stablehlo.compare LT, %iterArg_0, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  } do {
    %1 = stablehlo.dot_general %iterArg_1, %iterArg, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %2 = stablehlo.tanh %1 : tensor<4x8xf32>
    %c_2 = stablehlo.constant dense<1> : tensor<i32>
    %3 = stablehlo.add %iterArg_0, %c_2 : tensor<i32>
    stablehlo.return %iterArg, %3, %2 : tensor<8x8xf32>, tensor<i32>, tensor<4x8xf32>
  }
  return %0#2 : tensor<4x8xf32>
}

// -----

// A value used by a dot before a loop and by a dot inside the loop body is
// converted once, outside the loop.

// CHECK-LABEL: func.func public @loop_invariant_weight(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[W:[^:]*]]: tensor<8x8xf32>)
// CHECK-DAG: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK: %[[D:.*]] = stablehlo.dot_general %[[XB]], %[[WB]], {{.*}} -> tensor<4x8xf32>
// CHECK: stablehlo.while(%{{[[:alnum:]_]+}} = %{{[[:alnum:]_]+}}, %[[H:[[:alnum:]_]+]] = %[[D]]) : tensor<i32>, tensor<4x8xf32>
// CHECK: } do {
// CHECK-NOT: stablehlo.convert %[[W]]
// CHECK: %[[HB:.*]] = stablehlo.convert %[[H]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NOT: stablehlo.convert %[[W]]
// CHECK: stablehlo.dot_general %[[HB]], %[[WB]], {{.*}} -> tensor<4x8xf32>
func.func public @loop_invariant_weight(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %c = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1:2 = stablehlo.while(%iterArg = %c, %iterArg_0 = %0) : tensor<i32>, tensor<4x8xf32>
  cond {
    %c_1 = stablehlo.constant dense<3> : tensor<i32>
    %2 = stablehlo.compare LT, %iterArg, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %2 : tensor<i1>
  } do {
    %2 = stablehlo.dot_general %iterArg_0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %c_1 = stablehlo.constant dense<1> : tensor<i32>
    %3 = stablehlo.add %iterArg, %c_1 : tensor<i32>
    stablehlo.return %3, %2 : tensor<i32>, tensor<4x8xf32>
  }
  return %1#1 : tensor<4x8xf32>
}

// -----

// stablehlo.case keeps its result types; the dot in a branch is lowered.

// CHECK-LABEL: func.func public @case(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[W1:[^:]*]]: tensor<8x8xf32>, %[[W2:[^:]*]]: tensor<8x8xf32>)
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-DAG: %[[W1B:.*]] = stablehlo.convert %[[W1]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK: stablehlo.reduce(%[[X]] init: %{{.*}}) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<f32>
// CHECK: %[[C:.*]] = "stablehlo.case"(%{{.*}}) ({
// CHECK-NEXT: stablehlo.return %[[X]] : tensor<4x8xf32>
// CHECK: stablehlo.dot_general %[[XB]], %[[W1B]], {{.*}} -> tensor<4x8xf32>
// CHECK: }) : (tensor<i32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[CB:.*]] = stablehlo.convert %[[C]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[CB]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
func.func public @case(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<f32>
  %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %1 = stablehlo.compare GT, %0, %cst_0, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %2 = stablehlo.convert %1 : (tensor<i1>) -> tensor<i32>
  %3 = "stablehlo.case"(%2) ({
    stablehlo.return %arg0 : tensor<4x8xf32>
  }, {
    %5 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    stablehlo.return %5 : tensor<4x8xf32>
  }) : (tensor<i32>) -> tensor<4x8xf32>
  %4 = stablehlo.dot_general %3, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %4 : tensor<4x8xf32>
}

// -----

// func.call into a private function: the call is specialised to its call
// site (rules follow calls), so the body is painted in the caller's context
// and the callee, now unused, is gone.

// CHECK-LABEL: func.func public @call(
// CHECK-SAME: %[[W:[^:]*]]: tensor<8x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-DAG: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK: %[[D:.*]] = stablehlo.dot_general %[[XB]], %[[WB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]] : tensor<4x8xf32>
// CHECK-NEXT: return %[[T]] : tensor<4x8xf32>
// CHECK-NOT: func.func private @closed_call

// bf16 params: the public signature is bf16, the dot takes them directly.
// BF16-LABEL: func.func public @call(
// BF16-SAME: %[[W:[^:]*]]: tensor<8x8xbf16>, %[[X:[^:]*]]: tensor<4x8xbf16>) -> tensor<4x8xbf16>
// BF16-NEXT: %[[D:.*]] = stablehlo.dot_general %[[X]], %[[W]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// BF16-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]] : tensor<4x8xf32>
// BF16-NEXT: %[[RB:.*]] = stablehlo.convert %[[T]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// BF16-NEXT: return %[[RB]] : tensor<4x8xbf16>
// BF16-NOT: func.func private @closed_call

// KEEP-LABEL: func.func public @call(
// KEEP: %[[T:.*]] = stablehlo.tanh %{{.*}} : tensor<4x8xf32>
func.func public @call(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = func.call @closed_call(%arg0, %arg1) : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func private @closed_call(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.tanh %0 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// -----

// One value used by two dots is converted once.

// CHECK-LABEL: func.func public @shared_operand(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[W1:[^:]*]]: tensor<8x8xf32>, %[[W2:[^:]*]]: tensor<8x8xf32>)
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-DAG: %[[W1B:.*]] = stablehlo.convert %[[W1]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[W2B:.*]] = stablehlo.convert %[[W2]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[D1:.*]] = stablehlo.dot_general %[[XB]], %[[W1B]], {{.*}} -> tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[D2:.*]] = stablehlo.dot_general %[[XB]], %[[W2B]], {{.*}} -> tensor<4x8xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: return %[[D1]], %[[D2]] : tensor<4x8xf32>, tensor<4x8xf32>
func.func public @shared_operand(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.dot_general %arg0, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %0, %1 : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// dot_general with batch dimensions.

// CHECK-LABEL: func.func public @batched(
// CHECK-SAME: %[[A:[^:]*]]: tensor<2x4x8xf32>, %[[B:[^:]*]]: tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
// CHECK-DAG: %[[AB:.*]] = stablehlo.convert %[[A]] : (tensor<2x4x8xf32>) -> tensor<2x4x8xbf16>
// CHECK-DAG: %[[BB:.*]] = stablehlo.convert %[[B]] : (tensor<2x8x16xf32>) -> tensor<2x8x16xbf16>
// CHECK: %[[D:.*]] = stablehlo.dot_general %[[AB]], %[[BB]], batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x4x8xbf16>, tensor<2x8x16xbf16>) -> tensor<2x4x16xf32>
// CHECK-NEXT: return %[[D]] : tensor<2x4x16xf32>

// On cpu, batch dims lead, the rhs is transposed to [B, N, K] and reshaped (no
// transpose feeds the dot), one contracting dimension, last on both.
// CPU-LABEL: func.func public @batched(
// (A leading unit batch dimension, [1, B, M, K] x [1, B, N, K], is an
// accepted variant of the same form.)
// CPU-DAG: %[[AB:.*]] = stablehlo.convert %{{.*}} : (tensor<2x4x8xf32>) -> tensor<2x4x8xbf16>
// CPU-DAG: %[[BB:.*]] = stablehlo.convert %{{.*}} : (tensor<2x8x16xf32>) -> tensor<2x8x16xbf16>
// CPU-DAG: %[[BT:.*]] = stablehlo.transpose %[[BB]], dims = [0, 2, 1] : (tensor<2x8x16xbf16>) -> tensor<2x16x8xbf16>
// CPU-NOT: {{stablehlo.dot_general (%[^,]+, )?}}%[[BT]],
// CPU: batching_dims = {{\[}}[[BATCH:0(, 1)?]]{{\]}} x {{\[}}[[BATCH]]{{\]}}, contracting_dims = {{\[}}[[K:[23]]]{{\]}} x {{\[}}[[K]]{{\]}}, precision = [DEFAULT, DEFAULT] : (tensor<[[UNIT:(1x)?]]2x4x8xbf16>, tensor<[[UNIT]]2x16x8xbf16>) -> tensor<[[UNIT]]2x4x16xf32>
// CPU-NOT: stablehlo.convert
// CPU: return %{{.*}} : tensor<2x4x16xf32>
func.func public @batched(%arg0: tensor<2x4x8xf32>, %arg1: tensor<2x8x16xf32>) -> tensor<2x4x16xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x4x8xf32>, tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
  return %0 : tensor<2x4x16xf32>
}

// -----

// On cpu, an lhs contracting on its first dimension: both operands transposed.

// CHECK-LABEL: func.func public @dot_tn(
// CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [0] x [0]{{.*}} : (tensor<8x4xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>

// CPU-LABEL: func.func public @dot_tn(
// CPU-DAG: %[[AB:.*]] = stablehlo.convert %{{.*}} : (tensor<8x4xf32>) -> tensor<8x4xbf16>
// CPU-DAG: %[[BB:.*]] = stablehlo.convert %{{.*}} : (tensor<8x16xf32>) -> tensor<8x16xbf16>
// CPU-DAG: %[[AT:.*]] = stablehlo.transpose %[[AB]], dims = [1, 0] : (tensor<8x4xbf16>) -> tensor<4x8xbf16>
// CPU-DAG: %[[BT:.*]] = stablehlo.transpose %[[BB]], dims = [1, 0] : (tensor<8x16xbf16>) -> tensor<16x8xbf16>
// CPU-NOT: {{stablehlo.dot_general (%[^,]+, )?}}%[[AT]],
// CPU-NOT: {{stablehlo.dot_general (%[^,]+, )?}}%[[BT]],
// CPU: batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} : (tensor<1x4x8xbf16>, tensor<1x16x8xbf16>) -> tensor<1x4x16xf32>
// CPU-NEXT: %[[R:.*]] = stablehlo.reshape %{{.*}} : (tensor<1x4x16xf32>) -> tensor<4x16xf32>
// CPU-NEXT: return %[[R]] : tensor<4x16xf32>
func.func public @dot_tn(%arg0: tensor<8x4xf32>, %arg1: tensor<8x16xf32>) -> tensor<4x16xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x4xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}

// -----

// Two contracting dimensions: kept as they are on gpu; on cpu they collapse
// into one by a reshape.

// CHECK-LABEL: func.func public @dot_two_contracting(
// CHECK: stablehlo.dot_general %{{.*}}, %{{.*}}, contracting_dims = [1, 2] x [0, 1]{{.*}} : (tensor<4x2x8xbf16>, tensor<2x8x16xbf16>) -> tensor<4x16xf32>

// CPU-LABEL: func.func public @dot_two_contracting(
// CPU-DAG: %[[AB:.*]] = stablehlo.convert %{{.*}} : (tensor<4x2x8xf32>) -> tensor<4x2x8xbf16>
// CPU-DAG: %[[BB:.*]] = stablehlo.convert %{{.*}} : (tensor<2x8x16xf32>) -> tensor<2x8x16xbf16>
// CPU-DAG: stablehlo.reshape %[[AB]] : (tensor<4x2x8xbf16>) -> tensor<1x4x16xbf16>
// CPU-DAG: %[[BT:.*]] = stablehlo.transpose %[[BB]], dims = [2, 0, 1] : (tensor<2x8x16xbf16>) -> tensor<16x2x8xbf16>
// CPU-DAG: stablehlo.reshape %[[BT]] : (tensor<16x2x8xbf16>) -> tensor<1x16x16xbf16>
// CPU-NOT: {{stablehlo.dot_general (%[^,]+, )?}}%[[BT]],
// CPU: batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} : (tensor<1x4x16xbf16>, tensor<1x16x16xbf16>) -> tensor<1x4x16xf32>
// CPU-NEXT: %[[R:.*]] = stablehlo.reshape %{{.*}} : (tensor<1x4x16xf32>) -> tensor<4x16xf32>
// CPU-NEXT: return %[[R]] : tensor<4x16xf32>
func.func public @dot_two_contracting(%arg0: tensor<4x2x8xf32>, %arg1: tensor<2x8x16xf32>) -> tensor<4x16xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1, 2] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<4x2x8xf32>, tensor<2x8x16xf32>) -> tensor<4x16xf32>
  return %0 : tensor<4x16xf32>
}

// -----

// A dynamically shaped dot is lowered on gpu; on cpu it stays f32 (only a
// static NT-canonical mixed dot is safe on XLA:CPU).

// CHECK-LABEL: func.func public @dynamic_dot(
// CHECK: stablehlo.dot_general %{{.*}}, %{{.*}} : (tensor<?x8xbf16>, tensor<8x8xbf16>) -> tensor<?x8xf32>

// CPU-LABEL: func.func public @dynamic_dot(
// CPU-SAME: %[[X:[^:]*]]: tensor<?x8xf32>, %[[W:[^:]*]]: tensor<8x8xf32>)
// CPU-NOT: stablehlo.convert
// CPU: %[[D:.*]] = stablehlo.dot_general %[[X]], %[[W]], {{.*}} : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
// CPU-NEXT: return %[[D]]
func.func public @dynamic_dot(%arg0: tensor<?x8xf32>, %arg1: tensor<8x8xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}

// -----

// Convolution: lowered on gpu (f32 accumulation), kept f32 on cpu.

// CHECK-LABEL: func.func public @conv(
// CHECK-SAME: %[[X:[^:]*]]: tensor<1x3x8x8xf32>, %[[K:[^:]*]]: tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32>
// CHECK-DAG: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<1x3x8x8xf32>) -> tensor<1x3x8x8xbf16>
// CHECK-DAG: %[[KB:.*]] = stablehlo.convert %[[K]] : (tensor<4x3x3x3xf32>) -> tensor<4x3x3x3xbf16>
// CHECK: %[[C:.*]] = stablehlo.convolution(%[[XB]], %[[KB]]) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], {{.*}} : (tensor<1x3x8x8xbf16>, tensor<4x3x3x3xbf16>) -> tensor<1x4x8x8xf32>
// CHECK-NEXT: return %[[C]] : tensor<1x4x8x8xf32>

// CPU-LABEL: func.func public @conv(
// CPU-SAME: %[[X:[^:]*]]: tensor<1x3x8x8xf32>, %[[K:[^:]*]]: tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32>
// CPU-NOT: stablehlo.convert
// CPU: %[[C:.*]] = stablehlo.convolution(%[[X]], %[[K]]) {{.*}} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32>
// CPU-NEXT: return %[[C]] : tensor<1x4x8x8xf32>

// DOTC-LABEL: func.func public @conv(
// DOTC: %[[C:.*]] = stablehlo.convolution({{.*}} : (tensor<1x3x8x8xbf16>, tensor<4x3x3x3xbf16>) -> tensor<1x4x8x8xbf16>
// DOTC-NEXT: %[[CF:.*]] = stablehlo.convert %[[C]] : (tensor<1x4x8x8xbf16>) -> tensor<1x4x8x8xf32>
// DOTC-NEXT: return %[[CF]] : tensor<1x4x8x8xf32>
func.func public @conv(%arg0: tensor<1x3x8x8xf32>, %arg1: tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32> {
  %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32>
  return %0 : tensor<1x4x8x8xf32>
}

// -----

// Existing f32 -> bf16 converts in the input are used as they are: no second
// convert of the same value.

// CHECK-LABEL: func.func public @existing_convert(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xf32>, %[[W:[^:]*]]: tensor<8x8xf32>)
// CHECK-NEXT: %[[XB:.*]] = stablehlo.convert %[[X]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %[[XB]], %[[WB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[D]] : tensor<4x8xf32>
func.func public @existing_convert(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %arg0 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %1 = stablehlo.convert %arg1 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
  %2 = stablehlo.dot_general %0, %1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}

// -----

// A bf16 argument widened to f32 in the input feeds the dot directly: the
// bf16 -> f32 -> bf16 round trip disappears.

// CHECK-LABEL: func.func public @bf16_argument(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4x8xbf16>, %[[W:[^:]*]]: tensor<8x8xf32>)
// CHECK-NEXT: %[[WB:.*]] = stablehlo.convert %[[W]] : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %[[X]], %[[WB]], {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[D]] : tensor<4x8xf32>
func.func public @bf16_argument(%arg0: tensor<4x8xbf16>, %arg1: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.convert %arg0 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %1 = stablehlo.dot_general %0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// -----

// tanh between two dots goes bf16, unless keep-f32 names it.

// CHECK-LABEL: func.func public @tanh_between(
// CHECK: %[[D:.*]] = stablehlo.dot_general {{.*}} -> tensor<4x8xf32>
// CHECK-NEXT: %[[DB:.*]] = stablehlo.convert %[[D]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[DB]] : tensor<4x8xbf16>
// CHECK-NEXT: stablehlo.dot_general %[[T]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>

// KEEP-LABEL: func.func public @tanh_between(
// KEEP: %[[D:.*]] = stablehlo.dot_general {{.*}} -> tensor<4x8xf32>
// KEEP-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]] : tensor<4x8xf32>
// KEEP-NEXT: %[[TB:.*]] = stablehlo.convert %[[T]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// KEEP-NEXT: stablehlo.dot_general %[[TB]], %{{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
func.func public @tanh_between(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.tanh %0 : tensor<4x8xf32>
  %2 = stablehlo.dot_general %1, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}

// -----

// Converts already in the input that round-trip exactly are removed at the
// default level; at O0 (the diff RUN line above) they stay.

// CHECK-LABEL: func.func public @explicit_round_trip(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xbf16>) -> tensor<4xbf16>
// CHECK-NEXT: %[[A:.*]] = stablehlo.add %[[X]], %[[X]] : tensor<4xbf16>
// CHECK-NEXT: return %[[A]] : tensor<4xbf16>
func.func public @explicit_round_trip(%arg0: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
  %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xbf16>
  %2 = stablehlo.add %1, %1 : tensor<4xbf16>
  return %2 : tensor<4xbf16>
}

// -----

// On cpu, a bf16 argument already in canonical order (a bf16 weight read by
// the backward pass, [N, K]) stays out of the barrier, which holds the other
// operand: through the barrier XLA:CPU would copy the argument into a buffer
// of its own, computed early and kept until the dot reads it.
// CPU-LABEL: func.func public @bf16_weight(
// CPU-SAME: %[[X:[^:]*]]: tensor<4x16xf32>, %[[W:[^:]*]]: tensor<8x16xbf16>,
// CPU: %[[T:.*]] = stablehlo.convert %{{.*}} : (tensor<4x16xf32>) -> tensor<4x16xbf16>
// CPU-NEXT: %[[TR:.*]] = stablehlo.reshape %[[T]] : (tensor<4x16xbf16>) -> tensor<1x4x16xbf16>
// CPU-NEXT: %[[WR:.*]] = stablehlo.reshape %[[W]] : (tensor<8x16xbf16>) -> tensor<1x8x16xbf16>
// CPU-NEXT: %[[HELD:.*]] = stablehlo.optimization_barrier %[[TR]] : tensor<1x4x16xbf16>
// CPU-NEXT: stablehlo.dot_general %[[HELD]], %[[WR]], batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} -> tensor<1x4x8xf32>
// Both operands arguments: both held, as before.
// CPU: %[[AR:.*]] = stablehlo.reshape %{{.*}} : (tensor<4x8xbf16>) -> tensor<1x4x8xbf16>
// CPU-NEXT: %[[BR:.*]] = stablehlo.reshape %{{.*}} : (tensor<16x8xbf16>) -> tensor<1x16x8xbf16>
// CPU-NEXT: %[[BOTH:.*]]:2 = stablehlo.optimization_barrier %[[AR]], %[[BR]] : tensor<1x4x8xbf16>, tensor<1x16x8xbf16>
// CPU-NEXT: stablehlo.dot_general %[[BOTH]]#0, %[[BOTH]]#1, batching_dims = [0] x [0], contracting_dims = [2] x [2]{{.*}} -> tensor<1x4x16xf32>
func.func public @bf16_weight(%x: tensor<4x16xf32>, %w: tensor<8x16xbf16>, %a: tensor<4x8xbf16>, %b: tensor<16x8xbf16>) -> (tensor<4x8xf32>, tensor<4x16xf32>) {
  %t = stablehlo.tanh %x : tensor<4x16xf32>
  %wf = stablehlo.convert %w : (tensor<8x16xbf16>) -> tensor<8x16xf32>
  %0 = stablehlo.dot_general %t, %wf, contracting_dims = [1] x [1] : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %af = stablehlo.convert %a : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %bf = stablehlo.convert %b : (tensor<16x8xbf16>) -> tensor<16x8xf32>
  %1 = stablehlo.dot_general %af, %bf, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  return %0, %1 : tensor<4x8xf32>, tensor<4x16xf32>
}
