//===- TrainingStep.cpp - The state a training step carries ---------------===//

#include "TrainingStep.h"

using namespace mlir;

LogicalResult mlir::amp::verifyStateResult(func::FuncOp main, unsigned result,
                                           unsigned arg) {
  if (result >= main.getNumResults() || arg >= main.getNumArguments())
    return main.emitError() << "state result #" << result << " of argument #"
                            << arg << " does not exist";
  auto resultType = dyn_cast<ShapedType>(main.getResultTypes()[result]);
  auto argType = dyn_cast<ShapedType>(main.getArgumentTypes()[arg]);
  bool convertible = resultType && argType && resultType.hasRank() &&
                     argType.hasRank() &&
                     resultType.getShape() == argType.getShape() &&
                     isa<FloatType>(resultType.getElementType()) &&
                     isa<FloatType>(argType.getElementType());
  if (resultType != argType && !convertible)
    return main.emitError() << "state result #" << result << " ("
                            << main.getResultTypes()[result]
                            << ") does not have the type of argument #" << arg
                            << " (" << main.getArgumentTypes()[arg] << ")";
  return success();
}
