//===- TrainingStep.cpp - The state a training step carries ---------------===//

#include "TrainingStep.h"

#include "Contract.h"

#include "mlir/IR/BuiltinAttributes.h"

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

BlockArgument mlir::amp::appendStateArgument(func::FuncOp main, Type type,
                                             StringRef role,
                                             Attribute value) {
  MLIRContext *context = main.getContext();
  unsigned index = main.getNumArguments();
  NamedAttribute marker(StringAttr::get(context, role), value);
  if (failed(main.insertArgument(index, type,
                                 DictionaryAttr::get(context, {marker}),
                                 main.getLoc())))
    return {};
  return main.getArgument(index);
}

LogicalResult mlir::amp::appendStateResult(func::FuncOp main, Value next,
                                           StringRef role, Attribute value,
                                           unsigned argument) {
  MLIRContext *context = main.getContext();
  SmallVector<NamedAttribute, 2> markers{
      NamedAttribute(StringAttr::get(context, role), value)};
  if (stateRole(role).keptOnSkip)
    markers.push_back(NamedAttribute(
        StringAttr::get(context, attr::kStateOf),
        IntegerAttr::get(IntegerType::get(context, 64), argument)));
  if (failed(main.insertResult(main.getNumResults(), next.getType(),
                               DictionaryAttr::get(context, markers))))
    return failure();
  Operation *terminator = main.front().getTerminator();
  SmallVector<Value> operands(terminator->getOperands());
  operands.push_back(next);
  terminator->setOperands(operands);
  return success();
}
