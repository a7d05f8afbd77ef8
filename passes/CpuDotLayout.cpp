//===- CpuDotLayout.cpp - The one mixed-precision dot form XLA:CPU runs ---===//

#include "CpuDotLayout.h"
#include "StableHLO.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;
using namespace mlir::amp;

namespace {

/// One operand's dimensions in canonical order ([batch..., free...,
/// contracting...]) and the sizes of the three collapsed dimensions.
struct CanonicalLayout {
  llvm::SmallVector<int64_t> permutation;
  int64_t batch = 1, free = 1, contracting = 1;
};

CanonicalLayout layoutOf(RankedTensorType type, llvm::ArrayRef<int64_t> batch,
                         llvm::ArrayRef<int64_t> contracting) {
  CanonicalLayout layout;
  for (int64_t d : batch) {
    layout.permutation.push_back(d);
    layout.batch *= type.getDimSize(d);
  }
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (!llvm::is_contained(batch, d) && !llvm::is_contained(contracting, d)) {
      layout.permutation.push_back(d);
      layout.free *= type.getDimSize(d);
    }
  for (int64_t d : contracting) {
    layout.permutation.push_back(d);
    layout.contracting *= type.getDimSize(d);
  }
  return layout;
}

/// `operand` transposed to `layout` and collapsed to [batch, free, contract].
Value canonicalOperand(OpBuilder &builder, Location loc, Value operand,
                       const CanonicalLayout &layout) {
  bool identity = llvm::all_of(llvm::enumerate(layout.permutation),
                               [](auto pair) {
                                 return static_cast<int64_t>(pair.index()) ==
                                        pair.value();
                               });
  if (!identity)
    operand = shlo::buildTranspose(builder, loc, operand, layout.permutation);
  llvm::SmallVector<int64_t> shape = {layout.batch, layout.free,
                                      layout.contracting};
  if (cast<RankedTensorType>(operand.getType()).getShape() !=
      llvm::ArrayRef<int64_t>(shape))
    operand = shlo::buildReshape(builder, loc, operand, shape);
  return operand;
}

/// `value`, or what it is a round trip of: convert(convert(x)) with x of
/// `value`'s type widened exactly in between (a bf16 argument read in f32
/// and lowered again), which amp-simplify-converts folds to x.
Value throughWidening(Value value) {
  Operation *narrow = value.getDefiningOp();
  if (!narrow || !shlo::isConvert(narrow))
    return value;
  Operation *widen = narrow->getOperand(0).getDefiningOp();
  if (!widen || !shlo::isConvert(widen) ||
      widen->getOperand(0).getType() != value.getType() ||
      !shlo::isExactWidening(value.getType(), widen->getResult(0).getType()))
    return value;
  return widen->getOperand(0);
}

} // namespace

Operation *mlir::amp::canonicalizeDotForCpu(Operation *dot) {
  std::optional<shlo::DotDimensions> dims = shlo::getDotDimensions(dot);
  auto lhsType = dyn_cast<RankedTensorType>(dot->getOperand(0).getType());
  auto rhsType = dyn_cast<RankedTensorType>(dot->getOperand(1).getType());
  auto resultType = dyn_cast<RankedTensorType>(dot->getResult(0).getType());
  if (!dims || !lhsType || !rhsType || !resultType ||
      !lhsType.hasStaticShape() || !rhsType.hasStaticShape())
    return nullptr;
  CanonicalLayout lhs = layoutOf(lhsType, dims->lhsBatch, dims->lhsContracting);
  CanonicalLayout rhs = layoutOf(rhsType, dims->rhsBatch, dims->rhsContracting);
  if (lhs.batch != rhs.batch || lhs.contracting != rhs.contracting)
    return nullptr;

  OpBuilder builder(dot);
  Location loc = dot->getLoc();
  Value lhsValue = canonicalOperand(builder, loc, dot->getOperand(0), lhs);
  Value rhsValue = canonicalOperand(builder, loc, dot->getOperand(1), rhs);
  // An argument of the function already in canonical order (a bf16
  // weight, p=bf16) stays out of the barrier, held by the other operand:
  // through the barrier, XLA:CPU copies the argument into a buffer of its
  // own, computed early and kept until the backward pass reads it.
  auto argumentAsIs = [&](Value operand, Value canonical) {
    Operation *reshape = canonical.getDefiningOp();
    return reshape && shlo::is(reshape, "reshape") &&
           reshape->getOperand(0) == operand &&
           isa<BlockArgument>(throughWidening(operand));
  };
  bool holdLhs = !argumentAsIs(dot->getOperand(0), lhsValue);
  bool holdRhs = !argumentAsIs(dot->getOperand(1), rhsValue);
  if (!holdLhs && !holdRhs)
    holdLhs = holdRhs = true;
  llvm::SmallVector<Value> held;
  if (holdLhs)
    held.push_back(lhsValue);
  if (holdRhs)
    held.push_back(rhsValue);
  Operation *barrier = shlo::buildOptimizationBarrier(builder, loc, held);
  if (holdLhs)
    lhsValue = barrier->getResult(0);
  if (holdRhs)
    rhsValue = barrier->getResult(holdLhs ? 1 : 0);
  shlo::DotDimensions canonicalDims;
  canonicalDims.lhsBatch = canonicalDims.rhsBatch = {0};
  canonicalDims.lhsContracting = canonicalDims.rhsContracting = {2};
  Type canonicalResult = RankedTensorType::get(
      {lhs.batch, lhs.free, rhs.free}, resultType.getElementType());
  Value result = shlo::buildDotGeneral(builder, dot, lhsValue, rhsValue,
                                       canonicalDims, canonicalResult);
  Operation *newDot = result.getDefiningOp();
  if (canonicalResult != resultType)
    result = shlo::buildReshape(builder, loc, result, resultType.getShape());
  dot->getResult(0).replaceAllUsesWith(result);
  dot->erase();
  return newDot;
}
