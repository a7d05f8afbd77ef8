//===- Mxfp8.h - MXFP8 GEMMs: blocks of 32 with E8M0 scales -----*- C++ -*-===//
//
// The pieces of amp-fp8-gemms' `scaling=mxfp8`: an operand as a matrix,
// its E4M3 codes in blocks of kMxBlock along the contraction with
// power-of-two scales, and the GEMM of two such operands.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_MXFP8_H
#define STABLEHLO_AMP_MXFP8_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

namespace mlir::amp {

/// An operand in FP8 and the f32 scale it was divided by: a scalar (per
/// tensor), the operand's free dimensions (rowwise: its batch dimensions,
/// each of one, left out), or the operand's shape with the block
/// dimension divided by kMxBlock (mxfp8).
struct Fp8Operand {
  Value value;
  Value scale;
};

namespace mxfp8 {

/// `value`, an operand of a dot with `contracting` and `batch` (each of
/// one) dimensions, as the matrix [free, contraction]: its free dimensions
/// then its contracting ones in their listed order (the order both
/// operands share), flattened. An MXFP8 GEMM's operands are such matrices
/// (XLA's scaled-dot takes one free and one contracting dimension each).
Value asMatrix(OpBuilder &builder, Location loc, Value value,
               llvm::ArrayRef<int64_t> contracting,
               llvm::ArrayRef<int64_t> batch);

/// `wide` (f32) as E4M3 codes in blocks of kMxBlock along `blockDim`, each
/// block with the smallest power-of-two scale that keeps it within 448
/// (f32 holding the power of two; NaN for a block holding inf or NaN).
Fp8Operand quantizeBlocks(OpBuilder &builder, Location loc, Value wide,
                          int64_t blockDim);

/// Replaces `dot` with the GEMM of the MXFP8 matrices `lhs` and `rhs`
/// (asMatrix, quantizeBlocks along dimension 1): with `composite` an
/// `xla.scaled_dot` composite (what `jax.lax.scaled_dot` emits, JAX >=
/// 0.9.1) whose decomposition is added to `module`, else a dot of the
/// dequantized operands. The result is reshaped back to `dot`'s; the GEMM
/// carries the FP8 survival marker `marker`.
void replaceWithBlockScaledDot(OpBuilder &builder, ModuleOp module,
                               Operation *dot, const Fp8Operand &lhs,
                               const Fp8Operand &rhs, bool composite,
                               int64_t marker);

} // namespace mxfp8
} // namespace mlir::amp

#endif // STABLEHLO_AMP_MXFP8_H
