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

/// Appends `value` to `main`'s results, marked with `markers`.
static LogicalResult appendResult(func::FuncOp main, Value value,
                                  ArrayRef<NamedAttribute> markers) {
  if (failed(main.insertResult(main.getNumResults(), value.getType(),
                               DictionaryAttr::get(main.getContext(),
                                                   markers))))
    return failure();
  Operation *terminator = main.front().getTerminator();
  SmallVector<Value> operands(terminator->getOperands());
  operands.push_back(value);
  terminator->setOperands(operands);
  return success();
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
  return appendResult(main, next, markers);
}

LogicalResult mlir::amp::appendMeasurement(func::FuncOp main, Value value,
                                           StringRef measurement) {
  MLIRContext *context = main.getContext();
  assert(llvm::any_of(measurements(),
                      [&](const Measurement &known) {
                        return known.attribute == measurement;
                      }) &&
         "not a measurement of the contract");
  return appendResult(main, value,
                      {NamedAttribute(StringAttr::get(context, measurement),
                                      UnitAttr::get(context))});
}
