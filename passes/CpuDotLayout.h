//===- CpuDotLayout.h - The one mixed-precision dot form XLA:CPU runs -----===//

#ifndef STABLEHLO_AMP_CPUDOTLAYOUT_H
#define STABLEHLO_AMP_CPUDOTLAYOUT_H

#include "mlir/IR/Operation.h"

namespace mlir::amp {

/// Rewrites a mixed-precision dot_general into the one form XLA:CPU runs
/// natively (YNNPACK) and never rejects: lhs [B, M, K], rhs [B, N, K], one
/// contracting dimension last on both, batch dimensions leading. The
/// canonical operands go through an optimization barrier: otherwise XLA folds
/// the transposes (and unit-dimension reshapes) back into the dot, and the
/// dot it ends up with has no XLA:CPU kernel for mixed precision. One
/// exception: a function argument that needs only the unit batch dimension
/// (a bf16 weight, p=bf16) stays out of the barrier while the other operand
/// is in it; through the barrier XLA:CPU copies it into a buffer of its own
/// (2 bytes per weight, live from the forward pass to the backward one).
///
/// Returns the new dot (the old one is erased), or null if `dot` has dynamic
/// shapes or dimensions it cannot read (it is then left as it is).
Operation *canonicalizeDotForCpu(Operation *dot);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_CPUDOTLAYOUT_H
