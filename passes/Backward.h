//===- Backward.h - Which values of a training step are the backward pass -===//
//
// A training step lowered with the loss cotangent seed as an argument (or a
// derived vjp program with cotangent arguments) computes its backward pass
// from those arguments: every value derived from them is a gradient or on
// the way to one. amp-fp8-gemms picks e5m2 for such operands;
// amp-rematerialize finds what the backward pass reads of the forward pass.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_BACKWARD_H
#define STABLEHLO_AMP_BACKWARD_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::amp {

/// Values derived from an argument of a public function marked
/// `amp.loss_seed` or `amp.cotangent`: results of ops that read one, and the
/// block arguments of their regions. An optimization barrier passes each
/// operand through to its own result only.
llvm::DenseSet<Value> backwardValues(ModuleOp module);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_BACKWARD_H
