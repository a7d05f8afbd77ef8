// amp-insert-converts{reduce-dtype}: the result dtype of the backward
// pass's matrix multiplies (the values derived from the loss seed), whose
// partial sums XLA's SPMD partitioner reduces across devices when it splits
// their contraction (a weight gradient summed over a batch split across
// devices). f32 by default; compute (or the compute dtype by its name)
// makes the GEMM write the compute dtype, converted back where f32 readers
// need it. Forward matrix multiplies keep their f32 results either way
// (with dot-result=f32; on gpu bf16 GEMMs write bf16 by default).
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32})' | FileCheck %s --check-prefix=F32
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 reduce-dtype=compute})' | FileCheck %s --check-prefix=COMPUTE
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 reduce-dtype=bfloat16})' | FileCheck %s --check-prefix=COMPUTE
// On cpu the weight gradient, made in bf16, is no mixed dot: it keeps its
// form (XLA:CPU runs it upcast), where the forward GEMM takes the
// NT-canonical one.
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=cpu reduce-dtype=bf16})' | FileCheck %s --check-prefix=CPU
// An FP8 GEMM of the backward pass writes the compute dtype too, its
// scales multiplied there.
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=gpu dot-result=f32 reduce-dtype=compute policy=p=f32,c=bf16,o=f32,gemm=f8},amp-fp8-gemms{gemm=f8})' | FileCheck %s --check-prefix=FP8
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{reduce-dtype=f64})' 2>&1 | FileCheck %s --check-prefix=BAD-F64
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{reduce-dtype=int8})' 2>&1 | FileCheck %s --check-prefix=BAD-INT
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{reduce-dtype=f16})' 2>&1 | FileCheck %s --check-prefix=BAD-F16

// F32-LABEL: func.func public @main(
// F32: stablehlo.dot_general %{{.*}} : (tensor<64x128xbf16>, tensor<128x256xbf16>) -> tensor<64x256xf32>
// F32: stablehlo.dot_general %{{.*}} : (tensor<64x128xbf16>, tensor<64x256xbf16>) -> tensor<128x256xf32>

// COMPUTE-LABEL: func.func public @main(
// The forward GEMM: f32, as without the option.
// COMPUTE: stablehlo.dot_general %{{.*}} : (tensor<64x128xbf16>, tensor<128x256xbf16>) -> tensor<64x256xf32>
// The weight gradient: written in bf16, widened for the f32 gradient.
// COMPUTE: %[[GRAD:.*]] = stablehlo.dot_general %{{.*}} : (tensor<64x128xbf16>, tensor<64x256xbf16>) -> tensor<128x256xbf16>
// COMPUTE: %[[WIDE:.*]] = stablehlo.convert %[[GRAD]] : (tensor<128x256xbf16>) -> tensor<128x256xf32>
// COMPUTE: return %{{.*}}, %[[WIDE]]

// CPU-LABEL: func.func public @main(
// CPU: stablehlo.optimization_barrier
// CPU: %[[GRAD:.*]] = stablehlo.dot_general %{{.*}}, contracting_dims = [0] x [0] : (tensor<64x128xbf16>, tensor<64x256xbf16>) -> tensor<128x256xbf16>
// CPU: stablehlo.convert %[[GRAD]] : (tensor<128x256xbf16>) -> tensor<128x256xf32>

// FP8-LABEL: func.func public @main(
// FP8: stablehlo.dot_general %{{.*}} : (tensor<64x128xf8E4M3FN>, tensor<128x256xf8E4M3FN>) -> tensor<64x256xf32>
// FP8: %[[PRODUCT:.*]] = stablehlo.dot_general %{{.*}} : (tensor<64x128xf8E4M3FN>, tensor<64x256xf8E5M2>) -> tensor<128x256xbf16>
// FP8: %[[SCALE:.*]] = stablehlo.convert %{{.*}} : (tensor<f32>) -> tensor<bf16>
// FP8: %[[SCALES:.*]] = stablehlo.broadcast_in_dim %[[SCALE]], dims = [] : (tensor<bf16>) -> tensor<128x256xbf16>
// FP8: stablehlo.multiply %[[PRODUCT]], %[[SCALES]] : tensor<128x256xbf16>

// BAD-F64: error: invalid option 'reduce-dtype': reduce-dtype 'f64': gradients are reduced in f32 or a compute dtype (accepted: f32, compute, or the compute dtype: bf16, f16)
// BAD-INT: error: invalid option 'reduce-dtype': unknown reduce-dtype 'int8' (accepted: f32, compute, or the compute dtype: bf16, f16)
// BAD-F16: error: invalid option 'reduce-dtype': reduce-dtype 'f16' is neither f32 nor the policy's compute dtype (bf16): use f32, bf16 or compute

func.func public @main(%x: tensor<64x128xf32>, %w: tensor<128x256xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<64x256xf32>, tensor<128x256xf32>) {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
  %dy = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x256xf32>
  %dw = stablehlo.dot_general %x, %dy, contracting_dims = [0] x [0] : (tensor<64x128xf32>, tensor<64x256xf32>) -> tensor<128x256xf32>
  return %y, %dw : tensor<64x256xf32>, tensor<128x256xf32>
}
