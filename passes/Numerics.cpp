//===- Numerics.cpp - What a step measures of its own numerics ------------===//
//
// amp-numerics{collect=stats}: per low-precision GEMM operand, the amax and
// exact counts of the values its rounding loses (underflow) or cannot hold
// (saturated), reduced inside the step and appended to main's results.
//
//===----------------------------------------------------------------------===//

#include "Passes.h"
#include "StableHLO.h"
#include "TrainingStep.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPNUMERICSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// Where a GEMM operand was rounded to its format: `input` is the value the
/// rounding convert reads (after the FP8 scale; before the clamp, if any),
/// `magnitude` the operand before scaling.
struct Rounding {
  Value input;
  Value magnitude;
  FloatType format;
  bool clamped = false;
};

bool isLowPrecisionGemm(Operation *op) {
  if (shlo::isDotGeneral(op)) {
    auto narrow = [](Value v) {
      FloatType element = shlo::getFloatElementType(v.getType());
      return element && element.getWidth() <= 16;
    };
    return narrow(op->getOperand(0)) && narrow(op->getOperand(1));
  }
  return shlo::compositeName(op) == attr::kScaledDotComposite;
}

/// The rounding of a GEMM operand: its defining convert from a wider float
/// type, through ops that move values without changing them (reshape,
/// transpose, an optimization barrier) and an MXFP8 dequantization (codes
/// widened and multiplied by their scale). None when the operand was
/// computed in its own format.
std::optional<Rounding> roundingOf(Value operand) {
  Value value = operand;
  for (int step = 0; step < 16; ++step) {
    Operation *op = value.getDefiningOp();
    if (!op)
      return std::nullopt;
    if (shlo::is(op, "reshape") || shlo::is(op, "transpose")) {
      value = op->getOperand(0);
      continue;
    }
    if (shlo::isOptimizationBarrier(op)) {
      value = op->getOperand(cast<OpResult>(value).getResultNumber());
      continue;
    }
    if (shlo::is(op, "multiply")) {
      // A dequantization: the widened codes times their scale.
      Operation *codes = op->getOperand(0).getDefiningOp();
      if (!codes || !shlo::isConvert(codes))
        return std::nullopt;
      value = op->getOperand(0);
      continue;
    }
    if (!shlo::isConvert(op))
      return std::nullopt;
    FloatType from = shlo::getFloatElementType(op->getOperand(0).getType());
    FloatType to = shlo::getFloatElementType(value.getType());
    if (!from || !to)
      return std::nullopt;
    if (shlo::isExactWidening(from, to)) {
      value = op->getOperand(0);
      continue;
    }
    Rounding rounding{op->getOperand(0), op->getOperand(0), to};
    if (Operation *clamp = rounding.input.getDefiningOp();
        clamp && shlo::is(clamp, "clamp")) {
      rounding.input = clamp->getOperand(1);
      rounding.magnitude = rounding.input;
      rounding.clamped = true;
      // An FP8 quantization: the scaled value is the operand divided by
      // its scale.
      if (Operation *divide = rounding.input.getDefiningOp();
          divide && shlo::is(divide, "divide"))
        rounding.magnitude = divide->getOperand(0);
    }
    return rounding;
  }
  return std::nullopt;
}

/// The lowercase MLIR spelling of `type` ("f8e4m3fn", "bf16").
std::string formatName(FloatType type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return llvm::StringRef(text).lower();
}

/// One operand's measurements: amax (f32) and the counts (i32), scalars.
struct OperandStats {
  Value amax;
  llvm::SmallVector<Value, 3> counts;
};

class NumericsPass final
    : public amp::impl::AmpNumericsPassBase<NumericsPass> {
public:
  using AmpNumericsPassBase::AmpNumericsPassBase;

  void runOnOperation() override;

private:
  OperandStats measure(OpBuilder &builder, Location loc,
                       const Rounding &rounding);
  OperandStats measureUnrounded(OpBuilder &builder, Location loc,
                                Value operand);
};

/// The amax (f32) of `magnitude` (|x|) and the count (i32) of each of
/// `predicates` (i1, of its shape), in one pass over the elements.
OperandStats reduceTogether(OpBuilder &builder, Location loc, Value magnitude,
                            llvm::ArrayRef<Value> predicates) {
  Type f32 = builder.getF32Type(), i32 = builder.getI32Type();
  if (shlo::getFloatElementType(magnitude.getType()) != f32)
    magnitude = shlo::buildConvert(builder, loc, magnitude, f32);
  llvm::SmallVector<Value> values{magnitude};
  llvm::SmallVector<llvm::StringRef> combiners{"maximum"};
  for (Value predicate : predicates) {
    values.push_back(shlo::buildConvert(builder, loc, predicate, i32));
    combiners.push_back("add");
  }
  llvm::SmallVector<double> inits(values.size(), 0.0);
  llvm::SmallVector<Value> reduced =
      shlo::buildReduceAllTogether(builder, loc, values, combiners, inits);
  return {reduced.front(), llvm::SmallVector<Value, 3>(
                               llvm::drop_begin(reduced))};
}

/// Compares `magnitude` elementwise with the scalar `bound`.
Value compareWith(OpBuilder &builder, Location loc, Value magnitude,
                  double bound, llvm::StringRef direction) {
  auto type = cast<RankedTensorType>(magnitude.getType());
  Value scalar = shlo::buildScalar(builder, loc, type.getElementType(), bound);
  return shlo::buildCompare(
      builder, loc, magnitude,
      shlo::buildBroadcastScalar(builder, loc, scalar, type), direction);
}

OperandStats NumericsPass::measure(OpBuilder &builder, Location loc,
                                   const Rounding &rounding) {
  const llvm::fltSemantics &format = rounding.format.getFloatSemantics();
  double largest = llvm::APFloat::getLargest(format).convertToDouble();
  // Round to nearest even sends |x| <= smallest / 2 to zero: the tie goes
  // to zero, whose significand is even.
  double halfSmallest =
      llvm::APFloat::getSmallest(format).convertToDouble() / 2;
  // Unclamped, the least magnitude that rounds past the largest finite
  // value: halfway to the next binade step, and the tie too where the
  // largest value's significand is odd.
  llvm::APFloat below = llvm::APFloat::getLargest(format);
  below.next(/*nextDown=*/true);
  double overflow = largest + (largest - below.convertToDouble()) / 2;
  bool tieOverflows = false;
  {
    llvm::APFloat tie(overflow);
    bool lost = false;
    tie.convert(format, llvm::APFloat::rmNearestTiesToEven, &lost);
    tieOverflows = tie.isInfinity() || tie.isNaN();
  }
  Value magnitude = shlo::buildElementwise(builder, loc, "abs",
                                           {rounding.input});
  Value nonzero = compareWith(builder, loc, magnitude, 0.0, "GT");
  Value small = compareWith(builder, loc, magnitude, halfSmallest, "LE");
  Value underflow = shlo::buildElementwise(builder, loc, "and",
                                           {nonzero, small});
  // An infinity given to the rounding is not one it made: amax shows it.
  Value saturated = shlo::buildElementwise(
      builder, loc, "and",
      {shlo::buildIsFinite(builder, loc, rounding.input),
       rounding.clamped
           ? compareWith(builder, loc, magnitude, largest, "GT")
           : compareWith(builder, loc, magnitude, overflow,
                         tieOverflows ? "GE" : "GT")});
  Value unscaled = rounding.magnitude == rounding.input
                       ? magnitude
                       : shlo::buildElementwise(builder, loc, "abs",
                                                {rounding.magnitude});
  return reduceTogether(builder, loc, unscaled,
                        {nonzero, underflow, saturated});
}

OperandStats NumericsPass::measureUnrounded(OpBuilder &builder, Location loc,
                                            Value operand) {
  Value magnitude = shlo::buildElementwise(builder, loc, "abs", {operand});
  OperandStats stats = reduceTogether(
      builder, loc, magnitude,
      {compareWith(builder, loc, magnitude, 0.0, "GT")});
  Value zero = shlo::buildScalar(builder, loc, builder.getI32Type(), 0);
  stats.counts.append({zero, zero});
  return stats;
}

void NumericsPass::runOnOperation() {
  ModuleOp module = getOperation();
  llvm::Expected<Numerics> parsed = parseNumerics(collect);
  if (!parsed) {
    module.emitError() << "invalid option 'collect': "
                       << llvm::toString(parsed.takeError());
    return signalPassFailure();
  }
  if (*parsed == Numerics::None)
    return;
  auto main = module.lookupSymbol<func::FuncOp>("main");
  if (!main || main.isExternal()) {
    module.emitError() << "amp-numerics: no function 'main' to return the "
                          "statistics from";
    return signalPassFailure();
  }
  for (unsigned i = 0; i < main.getNumResults(); ++i)
    if (main.getResultAttr(i, attr::kGemmAmax)) {
      main.emitError() << "amp-numerics: main already returns GEMM "
                          "statistics (" << attr::kGemmAmax << ")";
      return signalPassFailure();
    }
  MLIRContext *context = &getContext();
  Location loc = main.getLoc();
  Type f32 = Float32Type::get(context), i32 = IntegerType::get(context, 32);
  // A rounding read by several GEMMs (a weight, forward and backward) is
  // measured once.
  llvm::DenseMap<Value, OperandStats> measured;
  llvm::SmallVector<Value> amaxes, counts;
  int64_t gemms = 0;
  OpBuilder builder(context);
  for (Operation &op : llvm::make_early_inc_range(main.front())) {
    if (!isLowPrecisionGemm(&op))
      continue;
    llvm::SmallVector<Attribute, 2> formats;
    for (unsigned index = 0; index < 2; ++index) {
      Value operand = op.getOperand(index);
      std::optional<Rounding> rounding = roundingOf(operand);
      Value key = rounding ? rounding->input : operand;
      auto found = measured.find(key);
      if (found == measured.end()) {
        // Next to the value measured, so its reductions can fuse with the
        // kernel that writes it (and the value need not live longer).
        if (Operation *producer = key.getDefiningOp())
          builder.setInsertionPointAfter(producer);
        else
          builder.setInsertionPointToStart(&main.front());
        OperandStats stats =
            rounding ? measure(builder, op.getLoc(), *rounding)
                     : measureUnrounded(builder, op.getLoc(), operand);
        found = measured.try_emplace(key, stats).first;
      }
      amaxes.push_back(found->second.amax);
      llvm::append_range(counts, found->second.counts);
      formats.push_back(StringAttr::get(
          context, rounding ? formatName(rounding->format) : ""));
    }
    if (auto decision = op.getAttrOfType<DictionaryAttr>(attr::kDecision)) {
      NamedAttrList fields(decision);
      fields.set(decision_key::kGemmStats,
                 IntegerAttr::get(IntegerType::get(context, 64), gemms));
      fields.set(decision_key::kGemmStatsFormats,
                 ArrayAttr::get(context, formats));
      op.setAttr(attr::kDecision, fields.getDictionary(context));
    }
    ++gemms;
  }
  // The results: every scalar as one element, then shaped [G, 2] and
  // [G, 2, counts].
  builder.setInsertionPoint(main.front().getTerminator());
  int64_t perOperand = gemmStatsCounts().size();
  auto gathered = [&](llvm::ArrayRef<Value> scalars, Type element,
                      llvm::ArrayRef<int64_t> shape) {
    if (scalars.empty())
      return shlo::buildBroadcastScalar(
          builder, loc, shlo::buildScalar(builder, loc, element, 0),
          RankedTensorType::get(shape, element));
    llvm::SmallVector<Value> elements;
    for (Value scalar : scalars)
      elements.push_back(shlo::buildReshape(builder, loc, scalar, {1}));
    Value flat = elements.size() == 1
                     ? elements.front()
                     : shlo::buildConcatenate(builder, loc, elements, 0);
    return shlo::buildReshape(builder, loc, flat, shape);
  };
  Value amaxResult = gathered(amaxes, f32, {gemms, 2});
  Value countsResult = gathered(counts, i32, {gemms, 2, perOperand});
  Attribute unit = UnitAttr::get(context);
  if (failed(appendStateResult(main, amaxResult, attr::kGemmAmax, unit, 0)) ||
      failed(appendStateResult(main, countsResult, attr::kGemmCounts, unit,
                               0))) {
    main.emitError() << "amp-numerics: cannot append the statistics";
    return signalPassFailure();
  }
}

} // namespace
