//===- LossScale.cpp - Loss scaling fused into the training step ----------===//
//
// amp-loss-scale: the scale multiplies the loss cotangent seed, so it enters
// the backward pass where autodiff starts; gradients are unscaled once,
// checked once, and the dynamic update and the skip of an overflowed step
// happen in the graph: a training step needs no host round trip. What the
// pass appends to `main`, and in which order, is the contract's
// lossScaleLayout.
//
//===----------------------------------------------------------------------===//

#include "Contract.h"
#include "PassSupport.h"
#include "Passes.h"
#include "StableHLO.h"
#include "TrainingStep.h"

#include "mlir/Analysis/TopologicalSortUtils.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPLOSSSCALEPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// What the pass found in `main`.
struct TrainingStep {
  func::FuncOp main;
  int seedIndex = -1;
  llvm::SmallVector<unsigned> gradientResults;
  /// (result, argument): the result is the new value of the argument.
  llvm::SmallVector<std::pair<unsigned, unsigned>> states;
  llvm::SmallVector<Operation *> gradientCalls;
};

/// The state the pass appended: the scale (and counter) arguments, and 1/scale.
struct ScaleState {
  Value scale, counter, inverse;
};

class LossScalePass final
    : public amp::impl::AmpLossScalePassBase<LossScalePass> {
public:
  using AmpLossScalePassBase::AmpLossScalePassBase;

  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;

private:
  LossScaleConfig config;
  llvm::SmallVector<std::pair<unsigned, unsigned>> statePairs;
  OptionCheck options;

  /// A loss scale's skip and update read the check; without one, only
  /// check-grads or check-state ask for it.
  bool checksGradients() const {
    return config.mode != LossScaleMode::None || checkGrads || checkState;
  }

  llvm::Error parseOptions();
  FailureOr<TrainingStep> findTrainingStep(ModuleOp module);
  LogicalResult validate(const TrainingStep &step);
  FailureOr<ScaleState> appendArguments(TrainingStep &step);
  void scaleSeed(TrainingStep &step, ScaleState &state);
  FailureOr<Value> unscaleAndCheck(TrainingStep &step,
                                   const ScaleState &state);
  Value buildStateCheck(TrainingStep &step);
  void keepOldStateUnlessFinite(TrainingStep &step, Value finite);
  void readSelectedState(TrainingStep &step,
                         llvm::ArrayRef<std::pair<Value, Value>> selected);
  llvm::SmallVector<std::pair<Value, llvm::StringRef>>
  buildScaleUpdate(OpBuilder &builder, Location loc, const ScaleState &state,
                   Value finite);
  LogicalResult appendResults(TrainingStep &step, const ScaleState &state,
                              Value finite, Value stateFinite);
};

//===----------------------------------------------------------------------===//
// Options
//===----------------------------------------------------------------------===//

llvm::Error LossScalePass::parseOptions() {
  if (llvm::Error error =
          readOption("mode", parseLossScaleMode(mode), config.mode))
    return error;
  config.growthInterval = growthInterval;
  config.growthFactor = growthFactor;
  config.backoffFactor = backoffFactor;
  config.minScale = minScale;
  config.maxScale = maxScale;
  if (llvm::Error error = validateLossScale(config))
    return error;
  return parseStateResults(stateResults).moveInto(statePairs);
}

LogicalResult LossScalePass::initialize(MLIRContext *context) {
  options.keep(parseOptions());
  return success();
}

//===----------------------------------------------------------------------===//
// Finding and validating the seed, the gradients and the state
//===----------------------------------------------------------------------===//

FailureOr<TrainingStep> LossScalePass::findTrainingStep(ModuleOp module) {
  FailureOr<func::FuncOp> entry = requireEntryFunction(
      module, "amp-loss-scale needs a public function 'main'");
  if (failed(entry))
    return failure();
  func::FuncOp main = *entry;
  TrainingStep step;
  step.main = main;
  step.seedIndex = seedArg;
  for (unsigned i = 0, e = main.getNumArguments(); i < e && step.seedIndex < 0;
       ++i)
    if (main.getArgAttr(i, attr::kLossSeed))
      step.seedIndex = i;
  step.gradientResults.assign(gradientResults.begin(), gradientResults.end());
  step.states = statePairs;
  for (unsigned i = 0, e = main.getNumResults(); i < e; ++i) {
    if (main.getResultAttr(i, attr::kGradient) &&
        !llvm::is_contained(step.gradientResults, i))
      step.gradientResults.push_back(i);
    if (auto arg = main.getResultAttrOfType<IntegerAttr>(i, attr::kStateOf))
      step.states.push_back({i, static_cast<unsigned>(arg.getInt())});
  }
  module.walk([&](Operation *op) {
    if (shlo::customCallTarget(op) == attr::kGradientsCall)
      step.gradientCalls.push_back(op);
  });
  return step;
}

LogicalResult LossScalePass::validate(const TrainingStep &step) {
  func::FuncOp main = step.main;
  if (config.mode != LossScaleMode::None) {
    if (step.seedIndex < 0 ||
        step.seedIndex >= static_cast<int>(main.getNumArguments()))
      return main.emitError() << "no loss seed argument: mark the loss "
                                 "cotangent argument with '"
                              << attr::kLossSeed << "' or pass seed-arg=N";
    auto seedType = dyn_cast<RankedTensorType>(
        main.getArgument(step.seedIndex).getType());
    if (!seedType || seedType.getRank() != 0 ||
        !isa<FloatType>(seedType.getElementType()))
      return main.emitError()
             << "loss seed argument #" << step.seedIndex
             << " must be a float scalar, got "
             << main.getArgument(step.seedIndex).getType();
  }
  if (step.gradientResults.empty() && step.gradientCalls.empty())
    return main.emitError()
           << "no gradients: mark gradient results with '" << attr::kGradient
           << "', pass gradient-results=..., or wrap them in a custom_call @"
           << attr::kGradientsCall;
  for (unsigned index : step.gradientResults)
    if (index >= main.getNumResults())
      return main.emitError() << "gradient result #" << index
                              << " does not exist";
  for (Operation *call : step.gradientCalls)
    if (call->getParentOp() != main.getOperation())
      return call->emitError() << "gradients must be marked in the body of "
                                  "'main', not inside a region or another "
                                  "function";
  for (auto [result, arg] : step.states)
    if (failed(verifyStateResult(main, result, arg)))
      return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Building
//===----------------------------------------------------------------------===//

FailureOr<ScaleState> LossScalePass::appendArguments(TrainingStep &step) {
  MLIRContext *context = &getContext();
  OpBuilder builder(context);
  ScaleState state;
  for (llvm::StringRef role :
       lossScaleLayout(config.mode, checksGradients()).arguments) {
    Type type = role == attr::kLossScaleCounter
                    ? RankedTensorType::get({}, builder.getI32Type())
                    : RankedTensorType::get({}, builder.getF32Type());
    unsigned index = step.main.getNumArguments();
    DictionaryAttr attrs = builder.getDictionaryAttr(
        {builder.getNamedAttr(role, builder.getUnitAttr())});
    if (failed(step.main.insertArgument(index, type, attrs,
                                        step.main.getLoc())))
      return failure();
    (role == attr::kLossScaleCounter ? state.counter : state.scale) =
        step.main.getArgument(index);
  }
  return state;
}

/// The seed becomes seed * scale; 1 / scale is computed once, in f32.
void LossScalePass::scaleSeed(TrainingStep &step, ScaleState &state) {
  if (!state.scale)
    return;
  Location loc = step.main.getLoc();
  OpBuilder builder = OpBuilder::atBlockBegin(&step.main.front());
  Value seed = step.main.getArgument(step.seedIndex);
  Type seedElement = cast<ShapedType>(seed.getType()).getElementType();
  Value factor = seedElement == builder.getF32Type()
                     ? state.scale
                     : shlo::buildConvert(builder, loc, state.scale,
                                          seedElement);
  Value scaled =
      shlo::buildElementwise(builder, loc, "multiply", {seed, factor});
  seed.replaceAllUsesExcept(scaled, scaled.getDefiningOp());
  Value one = shlo::buildScalar(builder, loc, builder.getF32Type(), 1.0);
  state.inverse =
      shlo::buildElementwise(builder, loc, "divide", {one, state.scale});
}

/// Unscales each gradient (in f32, reading it once) and ANDs `is_finite` of
/// all of them into one predicate.
/// Whether every element of `value` is finite (i1 scalar).
static Value allFinite(OpBuilder &builder, Location loc, Value value) {
  return shlo::buildReduceAll(
      builder, loc, shlo::buildIsFinite(builder, loc, value), "and", 1.0);
}

FailureOr<Value> LossScalePass::unscaleAndCheck(TrainingStep &step,
                                                const ScaleState &state) {
  OpBuilder builder(&getContext());
  Type f32 = builder.getF32Type();
  llvm::SmallVector<Value> finiteFlags;
  auto unscale = [&](Value gradient) -> Value {
    auto type = dyn_cast<RankedTensorType>(gradient.getType());
    auto element = type ? dyn_cast<FloatType>(type.getElementType()) : nullptr;
    if (!element)
      return gradient; // integer leaves (step counters) have no gradient
    if (!checksGradients())
      return gradient; // mode=none: nothing to unscale, nothing asked
    Location loc = gradient.getLoc();
    // Unscaled and checked in f32, or in the gradient's own dtype if wider
    // (f64 under x64 keeps its precision).
    Type wide = element.getWidth() > 32 ? Type(element) : f32;
    Value value = element == wide
                      ? gradient
                      : shlo::buildConvert(builder, loc, gradient, wide);
    if (state.inverse) {
      Value inverse = wide == f32 ? state.inverse
                                  : shlo::buildConvert(builder, loc,
                                                       state.inverse, wide);
      value = shlo::buildElementwise(
          builder, loc, "multiply",
          {value, shlo::buildBroadcastScalar(
                      builder, loc, inverse,
                      cast<RankedTensorType>(value.getType()))});
    }
    if (checksGradients())
      finiteFlags.push_back(allFinite(builder, loc, value));
    return element == wide ? value
                           : shlo::buildConvert(builder, loc, value, element);
  };
  for (Operation *call : step.gradientCalls) {
    builder.setInsertionPointAfter(call);
    for (auto [operand, result] :
         llvm::zip(call->getOperands(), call->getResults()))
      result.replaceAllUsesWith(unscale(operand));
    call->erase();
  }
  Operation *returnOp = step.main.front().getTerminator();
  builder.setInsertionPoint(returnOp);
  for (unsigned index : step.gradientResults)
    returnOp->setOperand(index, unscale(returnOp->getOperand(index)));
  if (!checksGradients())
    return Value();
  if (finiteFlags.empty()) {
    step.main.emitError() << "no float gradients to check";
    return failure();
  }
  return shlo::buildCombineScalars(builder, step.main.getLoc(), finiteFlags,
                                   "and", /*empty=*/true);
}

/// ANDs `is_finite` of every float state result (its new value) into one
/// predicate (true where there is none).
Value LossScalePass::buildStateCheck(TrainingStep &step) {
  Operation *returnOp = step.main.front().getTerminator();
  OpBuilder builder(returnOp);
  Location loc = step.main.getLoc();
  llvm::SmallVector<Value> flags;
  for (auto [result, arg] : step.states) {
    Value updated = returnOp->getOperand(result);
    if (!shlo::getFloatElementType(updated.getType()))
      continue; // integer state (counters, encoded f8 blocks)
    flags.push_back(allFinite(builder, loc, updated));
  }
  return shlo::buildCombineScalars(builder, loc, flags, "and",
                                   /*empty=*/true);
}

/// An overflowed step keeps the old parameters and optimizer state: each
/// state result becomes select(finite, new, old).
void LossScalePass::keepOldStateUnlessFinite(TrainingStep &step,
                                             Value finite) {
  Operation *returnOp = step.main.front().getTerminator();
  OpBuilder builder(returnOp);
  Location loc = step.main.getLoc();
  llvm::SmallVector<std::pair<Value, Value>> selected; // (new value, select)
  for (auto [result, arg] : step.states) {
    Value updated = returnOp->getOperand(result);
    Value old = step.main.getArgument(arg);
    if (old.getType() != updated.getType())
      old = shlo::buildConvert(
          builder, loc, old,
          cast<ShapedType>(updated.getType()).getElementType());
    Value select = shlo::buildSelect(builder, loc, finite, updated, old);
    returnOp->setOperand(result, select);
    selected.push_back({updated, select});
  }
  readSelectedState(step, selected);
}

/// Ops that compute only state results (Adam's update reads its new moments)
/// read the selected values instead of the unselected ones. Otherwise the
/// new moment has two readers, XLA recomputes it into both, and with the
/// state donated it must copy every moment buffer to keep the old values for
/// the second reader. Exact: when gradients are finite the select is the new
/// value; when they are not, these ops only feed results that are replaced
/// by the old values anyway.
void LossScalePass::readSelectedState(
    TrainingStep &step,
    llvm::ArrayRef<std::pair<Value, Value>> selected) {
  Block &entry = step.main.front();
  llvm::DenseSet<Operation *> selects, stateOnly;
  for (auto [updated, select] : selected)
    selects.insert(select.getDefiningOp());
  // Backwards: an op is state-only if it is plain StableHLO arithmetic and
  // every reader is a state select (as its new value) or state-only.
  for (Operation &op : llvm::reverse(entry)) {
    if (selects.contains(&op) || op.use_empty() || op.getNumRegions() ||
        !shlo::isStableHLO(&op) || shlo::isCustomCall(&op))
      continue;
    bool onlyState = llvm::all_of(op.getUses(), [&](OpOperand &use) {
      Operation *user = use.getOwner();
      return (selects.contains(user) && use.getOperandNumber() == 1) ||
             stateOnly.contains(user);
    });
    if (onlyState)
      stateOnly.insert(&op);
  }
  bool redirected = false;
  for (auto [updated, select] : selected)
    updated.replaceUsesWithIf(select, [&](OpOperand &use) {
      bool redirect = stateOnly.contains(use.getOwner());
      redirected |= redirect;
      return redirect;
    });
  // The selects are built at the end; the ops that now read them move after
  // them (graph order only: these ops have no side effects).
  if (redirected)
    sortTopologically(&entry);
}

/// The dynamic rule: on overflow `scale = max(min, scale * backoff)` and the
/// counter resets; after `growth-interval` finite steps the scale grows
/// unless that overflows f32 or passes `max-scale`.
llvm::SmallVector<std::pair<Value, llvm::StringRef>>
LossScalePass::buildScaleUpdate(OpBuilder &builder, Location loc,
                                const ScaleState &state, Value finite) {
  Type f32 = builder.getF32Type(), i32 = builder.getI32Type();
  auto f32Const = [&](double v) { return shlo::buildScalar(builder, loc, f32, v); };
  auto i32Const = [&](int64_t v) {
    return shlo::buildScalar(builder, loc, i32, static_cast<double>(v));
  };
  auto op = [&](llvm::StringRef name, ValueRange operands) {
    return shlo::buildElementwise(builder, loc, name, operands);
  };
  Value scale = state.scale, counter = state.counter;
  Value grownCounter = op("add", {counter, i32Const(1)});
  Value atInterval = shlo::buildCompare(builder, loc, grownCounter,
                                        i32Const(config.growthInterval), "GE");
  Value grown = op("multiply", {scale, f32Const(config.growthFactor)});
  Value canGrow = op(
      "and", {shlo::buildIsFinite(builder, loc, grown),
              shlo::buildCompare(builder, loc, grown,
                                 f32Const(config.maxScale), "LE")});
  Value grow = op("and", {atInterval, canGrow});
  Value finiteScale = shlo::buildSelect(builder, loc, grow, grown, scale);
  Value finiteCounter =
      shlo::buildSelect(builder, loc, atInterval, i32Const(0), grownCounter);
  Value backedOff =
      op("maximum", {op("multiply", {scale, f32Const(config.backoffFactor)}),
                     f32Const(config.minScale)});
  return {{shlo::buildSelect(builder, loc, finite, finiteScale, backedOff),
           attr::kLossScale},
          {shlo::buildSelect(builder, loc, finite, finiteCounter, i32Const(0)),
           attr::kLossScaleCounter}};
}

LogicalResult LossScalePass::appendResults(TrainingStep &step,
                                           const ScaleState &state,
                                           Value finite, Value stateFinite) {
  Operation *returnOp = step.main.front().getTerminator();
  OpBuilder builder(returnOp);
  Location loc = step.main.getLoc();
  llvm::SmallVector<std::pair<Value, llvm::StringRef>> values;
  if (finite)
    values.push_back({finite, attr::kGradsFinite});
  if (config.mode == LossScaleMode::Dynamic)
    values.append(buildScaleUpdate(builder, loc, state, finite));
  llvm::SmallVector<Value> operands(returnOp->getOperands());
  for (llvm::StringRef role :
       lossScaleLayout(config.mode, checksGradients()).results) {
    auto it = llvm::find_if(values, [&](auto &v) { return v.second == role; });
    assert(it != values.end() && "the layout names a result the pass builds");
    if (failed(step.main.insertResult(
            step.main.getNumResults(), it->first.getType(),
            builder.getDictionaryAttr(
                {builder.getNamedAttr(role, builder.getUnitAttr())}))))
      return failure();
    operands.push_back(it->first);
  }
  if (stateFinite) {
    if (failed(step.main.insertResult(
            step.main.getNumResults(), stateFinite.getType(),
            builder.getDictionaryAttr({builder.getNamedAttr(
                attr::kStateFinite, builder.getUnitAttr())}))))
      return failure();
    operands.push_back(stateFinite);
  }
  returnOp->setOperands(operands);
  // The markers are consumed.
  MLIRContext *context = &getContext();
  for (unsigned i = 0, e = step.main.getNumArguments(); i < e; ++i)
    step.main.removeArgAttr(i, attr::kLossSeed);
  for (unsigned i = 0, e = step.main.getNumResults(); i < e; ++i) {
    step.main.removeResultAttr(i, StringAttr::get(context, attr::kGradient));
    step.main.removeResultAttr(i, StringAttr::get(context, attr::kStateOf));
  }
  return success();
}

void LossScalePass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(options.report(module)))
    return signalPassFailure();
  FailureOr<TrainingStep> step = findTrainingStep(module);
  if (failed(step) || failed(validate(*step)))
    return signalPassFailure();
  FailureOr<ScaleState> state = appendArguments(*step);
  if (failed(state))
    return signalPassFailure();
  scaleSeed(*step, *state);
  FailureOr<Value> finite = unscaleAndCheck(*step, *state);
  if (failed(finite))
    return signalPassFailure();
  // With check-state the old state is also kept when the new one is not
  // finite; the scale's update follows the gradients alone.
  Value stateFinite = checkState ? buildStateCheck(*step) : Value();
  Value keep = *finite;
  if (stateFinite) {
    OpBuilder builder(step->main.front().getTerminator());
    keep = shlo::buildElementwise(builder, step->main.getLoc(), "and",
                                  {keep, stateFinite});
  }
  // Without a loss scale the step skips nothing: skipping costs a check of
  // every gradient before any update may be written, and buys nothing f32
  // would not need (check-state asks for it).
  if (config.mode != LossScaleMode::None || checkState)
    keepOldStateUnlessFinite(*step, keep);
  if (failed(appendResults(*step, *state, *finite, stateFinite)))
    return signalPassFailure();
}

} // namespace
