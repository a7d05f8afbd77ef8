//===- LossScale.cpp - Loss scaling fused into the training step ----------===//
//
// The scale multiplies the loss cotangent seed, so it enters the backward pass
// where autodiff starts; gradients are unscaled once, checked once, and the
// dynamic update and the skip of an overflowed step happen in the graph: a
// training step needs no host round trip.
//
//===----------------------------------------------------------------------===//

#include "Passes.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

#include <cmath>

namespace mlir::amp {
#define GEN_PASS_DEF_AMPLOSSSCALEPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

// Markers the Python driver (or a user of amp-opt) sets on `main`.
constexpr llvm::StringLiteral kLossSeedAttr = "amp.loss_seed";
constexpr llvm::StringLiteral kGradientAttr = "amp.gradient";
constexpr llvm::StringLiteral kStateOfAttr = "amp.state_of";
// Markers the pass sets on what it adds.
constexpr llvm::StringLiteral kLossScaleAttr = "amp.loss_scale";
constexpr llvm::StringLiteral kCounterAttr = "amp.loss_scale_counter";
constexpr llvm::StringLiteral kFiniteAttr = "amp.grads_finite";

enum class Mode { Dynamic, Static, None };

class LossScalePass final
    : public amp::impl::AmpLossScalePassBase<LossScalePass> {
public:
  using AmpLossScalePassBase::AmpLossScalePassBase;

  LogicalResult initialize(MLIRContext *context) override {
    auto fail = [&](const llvm::Twine &message) {
      optionError = message.str();
      return success(); // reported with a location in runOnOperation
    };
    if (mode == "dynamic")
      parsedMode = Mode::Dynamic;
    else if (mode == "static")
      parsedMode = Mode::Static;
    else if (mode == "none")
      parsedMode = Mode::None;
    else
      return fail("invalid option 'mode': unknown value '" + mode +
                  "' (accepted: dynamic, static, none)");
    if (growthInterval < 1)
      return fail("invalid option 'growth-interval': must be at least 1");
    if (!(growthFactor >= 1.0))
      return fail("invalid option 'growth-factor': must be at least 1");
    if (!(backoffFactor > 0.0 && backoffFactor <= 1.0))
      return fail("invalid option 'backoff-factor': must be in (0, 1]");
    if (!(minScale > 0.0) || !(maxScale >= minScale) || std::isinf(minScale))
      return fail("invalid options 'min-scale'/'max-scale': need "
                  "0 < min-scale <= max-scale");
    for (const std::string &pair : stateResults) {
      auto [result, arg] = llvm::StringRef(pair).split(':');
      unsigned resultIndex, argIndex;
      if (result.trim().getAsInteger(10, resultIndex) ||
          arg.trim().getAsInteger(10, argIndex))
        return fail("invalid option 'state-results': '" + pair +
                    "' is not RESULT:ARG");
      statePairs.push_back({resultIndex, argIndex});
    }
    return success();
  }

  void runOnOperation() override;

private:
  Mode parsedMode = Mode::Dynamic;
  llvm::SmallVector<std::pair<unsigned, unsigned>> statePairs;
  std::string optionError;
};

void LossScalePass::runOnOperation() {
  ModuleOp module = getOperation();
  if (!optionError.empty()) {
    module.emitError() << optionError;
    return signalPassFailure();
  }
  auto func = module.lookupSymbol<func::FuncOp>("main");
  if (!func || func.isExternal() || !func.isPublic()) {
    module.emitError() << "amp-loss-scale needs a public function 'main'";
    return signalPassFailure();
  }
  Block &entry = func.front();
  auto returnOp = cast<func::ReturnOp>(entry.getTerminator());
  MLIRContext *context = module.getContext();
  Location loc = func.getLoc();
  Type f32 = Float32Type::get(context);
  Type i32 = IntegerType::get(context, 32);
  auto scalarF32 = RankedTensorType::get({}, f32);
  auto scalarI32 = RankedTensorType::get({}, i32);

  // Which argument is the seed, which values are gradients, which results are
  // new values of which arguments.
  int seedIndex = seedArg;
  for (unsigned i = 0, e = func.getNumArguments(); i < e && seedIndex < 0; ++i)
    if (func.getArgAttr(i, kLossSeedAttr))
      seedIndex = i;
  llvm::SmallVector<unsigned> gradientIndices(gradientResults.begin(),
                                              gradientResults.end());
  llvm::SmallVector<std::pair<unsigned, unsigned>> states(statePairs);
  for (unsigned i = 0, e = func.getNumResults(); i < e; ++i) {
    if (func.getResultAttr(i, kGradientAttr) &&
        !llvm::is_contained(gradientIndices, i))
      gradientIndices.push_back(i);
    if (auto arg = func.getResultAttrOfType<IntegerAttr>(i, kStateOfAttr))
      states.push_back({i, static_cast<unsigned>(arg.getInt())});
  }
  llvm::SmallVector<Operation *> markers;
  module.walk([&](Operation *op) {
    if (shlo::isGradientsMarker(op))
      markers.push_back(op);
  });

  if (parsedMode != Mode::None) {
    if (seedIndex < 0 || seedIndex >= static_cast<int>(func.getNumArguments())) {
      func.emitError() << "no loss seed argument: mark the loss cotangent "
                          "argument with 'amp.loss_seed' or pass seed-arg=N";
      return signalPassFailure();
    }
    auto seedType =
        dyn_cast<RankedTensorType>(func.getArgument(seedIndex).getType());
    if (!seedType || seedType.getRank() != 0 ||
        !isa<FloatType>(seedType.getElementType())) {
      func.emitError() << "loss seed argument #" << seedIndex
                       << " must be a float scalar, got "
                       << func.getArgument(seedIndex).getType();
      return signalPassFailure();
    }
  }
  if (gradientIndices.empty() && markers.empty()) {
    func.emitError() << "no gradients: mark gradient results with "
                        "'amp.gradient', pass gradient-results=..., or wrap "
                        "them in a custom_call @"
                     << shlo::kGradientsMarker;
    return signalPassFailure();
  }
  for (unsigned index : gradientIndices)
    if (index >= func.getNumResults()) {
      func.emitError() << "gradient result #" << index << " does not exist";
      return signalPassFailure();
    }
  for (auto [result, arg] : states) {
    if (result >= func.getNumResults() || arg >= func.getNumArguments()) {
      func.emitError() << "state result #" << result << " of argument #"
                       << arg << " does not exist";
      return signalPassFailure();
    }
    // A parameter passed in bf16 may come back in f32 (p= and o= differ):
    // the old value is converted for the select, which is exact.
    auto resultType = dyn_cast<ShapedType>(func.getResultTypes()[result]);
    auto argType = dyn_cast<ShapedType>(func.getArgumentTypes()[arg]);
    bool sameShape = resultType && argType && resultType.hasRank() &&
                     argType.hasRank() &&
                     resultType.getShape() == argType.getShape();
    bool convertible = sameShape &&
                       isa<FloatType>(resultType.getElementType()) &&
                       isa<FloatType>(argType.getElementType());
    if (resultType != argType && !convertible) {
      func.emitError() << "state result #" << result << " ("
                       << func.getResultTypes()[result]
                       << ") does not have the type of argument #" << arg
                       << " (" << func.getArgumentTypes()[arg] << ")";
      return signalPassFailure();
    }
  }

  // New arguments: the scale and, for dynamic scaling, the counter; each
  // carries a unit attribute naming what it is.
  OpBuilder builder(context);
  auto markedAttrs = [&](llvm::StringRef name) {
    return builder.getDictionaryAttr(
        {builder.getNamedAttr(name, builder.getUnitAttr())});
  };
  auto appendArgument = [&](Type type, llvm::StringRef name) -> Value {
    unsigned index = func.getNumArguments();
    if (failed(func.insertArgument(index, type, markedAttrs(name), loc)))
      return {};
    return func.getArgument(index);
  };
  Value scale, counter, inverse;
  if (parsedMode != Mode::None && !(scale = appendArgument(scalarF32,
                                                           kLossScaleAttr)))
    return signalPassFailure();
  if (parsedMode == Mode::Dynamic &&
      !(counter = appendArgument(scalarI32, kCounterAttr)))
    return signalPassFailure();

  // The seed becomes seed * scale; 1 / scale is computed once, in f32.
  if (parsedMode != Mode::None) {
    builder.setInsertionPointToStart(&entry);
    Value seed = func.getArgument(seedIndex);
    Type seedElement = cast<ShapedType>(seed.getType()).getElementType();
    Value factor = seedElement == f32
                       ? scale
                       : shlo::buildConvert(builder, loc, scale, seedElement);
    Value scaled = shlo::buildElementwise(builder, loc, "multiply",
                                          {seed, factor});
    seed.replaceAllUsesExcept(scaled, scaled.getDefiningOp());
    Value one = shlo::buildScalar(builder, loc, f32, 1.0);
    inverse = shlo::buildElementwise(builder, loc, "divide", {one, scale});
  }

  // Unscale each gradient and check it, reading it once.
  llvm::SmallVector<Value> finiteFlags;
  bool badGradient = false;
  auto unscale = [&](Value gradient) -> Value {
    auto type = dyn_cast<RankedTensorType>(gradient.getType());
    auto element = type ? dyn_cast<FloatType>(type.getElementType()) : nullptr;
    if (!element) {
      // Integer or opaque leaves (step counters) have no gradient to scale.
      return gradient;
    }
    Location gradLoc = gradient.getLoc();
    Value value = element == f32
                      ? gradient
                      : shlo::buildConvert(builder, gradLoc, gradient, f32);
    if (inverse)
      value = shlo::buildElementwise(
          builder, gradLoc, "multiply",
          {value, shlo::buildBroadcastScalar(
                      builder, gradLoc, inverse,
                      cast<RankedTensorType>(value.getType()))});
    finiteFlags.push_back(shlo::buildReduceAll(
        builder, gradLoc, shlo::buildIsFinite(builder, gradLoc, value)));
    return element == f32 ? value
                          : shlo::buildConvert(builder, gradLoc, value, element);
  };
  for (Operation *marker : markers) {
    if (marker->getParentOp() != func.getOperation()) {
      marker->emitError() << "gradients must be marked in the body of 'main', "
                             "not inside a region or another function";
      badGradient = true;
      continue;
    }
    builder.setInsertionPointAfter(marker);
    for (auto [operand, result] :
         llvm::zip(marker->getOperands(), marker->getResults()))
      result.replaceAllUsesWith(unscale(operand));
    marker->erase();
  }
  if (badGradient)
    return signalPassFailure();
  builder.setInsertionPoint(returnOp);
  for (unsigned index : gradientIndices)
    returnOp->setOperand(index, unscale(returnOp->getOperand(index)));
  if (finiteFlags.empty()) {
    func.emitError() << "no float gradients to check";
    return signalPassFailure();
  }
  Value finite = finiteFlags.front();
  for (Value flag : llvm::drop_begin(finiteFlags))
    finite = shlo::buildElementwise(builder, loc, "and", {finite, flag});

  // An overflowed step keeps the old parameters and optimizer state.
  for (auto [result, arg] : states) {
    Value updated = returnOp->getOperand(result);
    Value old = func.getArgument(arg);
    if (old.getType() != updated.getType())
      old = shlo::buildConvert(
          builder, loc, old,
          cast<ShapedType>(updated.getType()).getElementType());
    returnOp->setOperand(result,
                         shlo::buildSelect(builder, loc, finite, updated, old));
  }

  llvm::SmallVector<std::pair<Value, llvm::StringLiteral>> extraResults = {
      {finite, kFiniteAttr}};
  if (parsedMode == Mode::Dynamic) {
    auto constF32 = [&](double v) { return shlo::buildScalar(builder, loc, f32, v); };
    auto constI32 = [&](int64_t v) {
      return shlo::buildScalar(builder, loc, i32, static_cast<double>(v));
    };
    Value grownCounter = shlo::buildElementwise(builder, loc, "add",
                                                {counter, constI32(1)});
    Value atInterval = shlo::buildCompare(builder, loc, grownCounter,
                                          constI32(growthInterval), "GE");
    Value grown = shlo::buildElementwise(builder, loc, "multiply",
                                         {scale, constF32(growthFactor)});
    Value canGrow = shlo::buildElementwise(
        builder, loc, "and",
        {shlo::buildIsFinite(builder, loc, grown),
         shlo::buildCompare(builder, loc, grown, constF32(maxScale), "LE")});
    Value grow = shlo::buildElementwise(builder, loc, "and",
                                        {atInterval, canGrow});
    Value finiteScale = shlo::buildSelect(builder, loc, grow, grown, scale);
    Value finiteCounter =
        shlo::buildSelect(builder, loc, atInterval, constI32(0), grownCounter);
    Value backedOff = shlo::buildElementwise(
        builder, loc, "maximum",
        {shlo::buildElementwise(builder, loc, "multiply",
                                {scale, constF32(backoffFactor)}),
         constF32(minScale)});
    extraResults.push_back(
        {shlo::buildSelect(builder, loc, finite, finiteScale, backedOff),
         kLossScaleAttr});
    extraResults.push_back(
        {shlo::buildSelect(builder, loc, finite, finiteCounter, constI32(0)),
         kCounterAttr});
  }

  llvm::SmallVector<Value> operands(returnOp->getOperands());
  for (auto [value, attr] : extraResults) {
    unsigned index = func.getNumResults();
    func.insertResult(index, value.getType(), markedAttrs(attr));
    operands.push_back(value);
  }
  returnOp->setOperands(operands);

  // The markers are consumed.
  for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
    func.removeArgAttr(i, kLossSeedAttr);
  for (unsigned i = 0, e = func.getNumResults(); i < e; ++i) {
    func.removeResultAttr(i, StringAttr::get(context, kGradientAttr));
    func.removeResultAttr(i, StringAttr::get(context, kStateOfAttr));
  }
}

} // namespace
