//===- TrainingStep.h - The state a training step carries -------*- C++ -*-===//
//
// A training step returns the new value of some of its arguments (its
// parameters and optimizer state): result R is argument N's new value when
// it is marked `amp.state_of = N`, or when a pass's `state-results=R:N`
// option says so. amp-round-state and amp-loss-scale check such pairs the
// same way.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_TRAININGSTEP_H
#define STABLEHLO_AMP_TRAININGSTEP_H

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::amp {

/// Whether result `result` of `main` can be the new value of argument `arg`:
/// both exist, and they have the same type, or the same shape with float
/// elements (a parameter passed in bf16 may come back in f32). Emits the
/// error on `main` otherwise.
LogicalResult verifyStateResult(func::FuncOp main, unsigned result,
                                unsigned arg);

/// Appends to `main` the argument of a state role (one of stateRoles()),
/// marked with the role: `value` is the marker's value (unit, or the
/// parameter argument of a per-parameter role). Null when it cannot be
/// inserted.
BlockArgument appendStateArgument(func::FuncOp main, Type type,
                                  StringRef role, Attribute value);
/// Appends `next`, the role's value after the step, as a result marked like
/// its argument (number `argument`). A role kept on a skipped step also
/// marks it `amp.state_of` that argument, so amp-loss-scale returns the old
/// value on such a step.
LogicalResult appendStateResult(func::FuncOp main, Value next,
                                StringRef role, Attribute value,
                                unsigned argument);
/// Appends `value`, a measurement of the step (one of measurements()), as a
/// result marked with it: returned, never given back.
LogicalResult appendMeasurement(func::FuncOp main, Value value,
                                StringRef measurement);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_TRAININGSTEP_H
