//===- Numerics.cpp - What a step measures of its own numerics ------------===//
//
// amp-numerics{collect=stats}: per low-precision GEMM operand, the amax and
// exact counts of the values its rounding loses (underflow) or cannot hold
// (saturated), reduced inside the step and appended to main's results.
// amp-numerics{collect=provenance}: per region of the step, whether it
// handed on a NaN or an infinity (Provenance.h), appended the same way.
//
//===----------------------------------------------------------------------===//

#include "PassSupport.h"
#include "Passes.h"
#include "Provenance.h"
#include "StableHLO.h"
#include "TrainingStep.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"

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

/// What a loop carries unchanged into the argument `value` of its body
/// (the stacked weights of a scan): the value that entered the loop; null
/// for any other value.
Value enteringLoop(Value value) {
  auto argument = dyn_cast<BlockArgument>(value);
  if (!argument)
    return {};
  Operation *loop = argument.getOwner()->getParentOp();
  if (!loop || !shlo::is(loop, "while") ||
      argument.getOwner() != &loop->getRegion(1).front() ||
      argument.getOwner()->getTerminator()->getOperand(
          argument.getArgNumber()) != argument)
    return {};
  return loop->getOperand(argument.getArgNumber());
}

/// The value `value` is, unchanged, one step back: through an op that
/// moves values without changing them (reshape, transpose, an
/// optimization barrier, an exact widening), a slice of it, what a loop
/// carries unchanged, or an MXFP8 dequantization (codes widened and
/// multiplied by their scale). Null when there is none.
Value unchangedFrom(Value value) {
  if (isa<BlockArgument>(value))
    return enteringLoop(value);
  Operation *op = value.getDefiningOp();
  if (shlo::is(op, "reshape") || shlo::is(op, "transpose") ||
      shlo::is(op, "slice") || shlo::is(op, "dynamic_slice"))
    // A slice reads part of what was rounded (a layer of stacked weights
    // in a scan): the whole is measured.
    return op->getOperand(0);
  if (shlo::isOptimizationBarrier(op))
    return op->getOperand(cast<OpResult>(value).getResultNumber());
  if (shlo::is(op, "multiply")) {
    // An MXFP8 dequantization: FP8 codes, widened, times their scale. Any
    // other product is a value of its own, computed in its format.
    Operation *codes = op->getOperand(0).getDefiningOp();
    FloatType coded =
        codes && shlo::isConvert(codes)
            ? shlo::getFloatElementType(codes->getOperand(0).getType())
            : FloatType();
    return coded && coded.getWidth() == 8 ? op->getOperand(0) : Value();
  }
  if (shlo::isConvert(op) &&
      shlo::isExactWidening(op->getOperand(0).getType(), value.getType()))
    return op->getOperand(0);
  return {};
}

/// Whether `op` rounds a float to a narrower float.
bool isRounding(Operation *op) {
  if (!op || !shlo::isConvert(op))
    return false;
  FloatType from = shlo::getFloatElementType(op->getOperand(0).getType());
  FloatType to = shlo::getFloatElementType(op->getResult(0).getType());
  return from && to && !shlo::isExactWidening(from, to);
}

/// What `convert`, a rounding, rounds: its input (where it enters a loop
/// that carries it unchanged, measured once there), and for an FP8
/// quantization the clamp's input and the value before its scale.
Rounding roundingBy(Operation *convert) {
  // A loop that rounds what it carries unchanged (a scan's stacked
  // weights, whole, on every iteration) rounds the same values each time:
  // they are measured once, where they enter the loop.
  Value input = convert->getOperand(0);
  while (Value entering = enteringLoop(input))
    input = entering;
  Rounding rounding{input, input,
                    shlo::getFloatElementType(convert->getResult(0).getType())};
  if (Operation *clamp = rounding.input.getDefiningOp();
      clamp && shlo::is(clamp, "clamp")) {
    rounding.input = clamp->getOperand(1);
    rounding.magnitude = rounding.input;
    rounding.clamped = true;
    // An FP8 quantization: the scaled value is the operand divided by its
    // scale.
    if (Operation *divide = rounding.input.getDefiningOp();
        divide && shlo::is(divide, "divide"))
      rounding.magnitude = divide->getOperand(0);
  }
  return rounding;
}

/// The rounding of a GEMM operand: its defining convert from a wider float
/// type, through what unchangedFrom sees through. None when the operand
/// was computed in its own format.
std::optional<Rounding> roundingOf(Value operand) {
  Value value = operand;
  for (int step = 0; step < 16 && value; ++step) {
    if (!isa<BlockArgument>(value) && isRounding(value.getDefiningOp()))
      return roundingBy(value.getDefiningOp());
    value = unchangedFrom(value);
  }
  return std::nullopt;
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

  LogicalResult initialize(MLIRContext *context) override {
    options.keep(readOption("collect", parseNumerics(collect), collected));
    return success();
  }
  void runOnOperation() override;

private:
  Numerics collected = Numerics::None;
  OptionCheck options;

  LogicalResult collectStats(func::FuncOp main);
  LogicalResult collectProvenance(func::FuncOp main);

  /// A rounding read by several GEMMs (a weight, forward and backward) is
  /// measured once.
  llvm::DenseMap<Value, OperandStats> measured;
  /// GEMMs measured so far: the next one's row.
  int64_t gemms = 0;

  void measureBlock(Block &block, llvm::SmallVectorImpl<OperandStats> &out);
  void measureLoop(Operation *loop, llvm::SmallVectorImpl<OperandStats> &out);
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

/// Makes `gemm`'s result depend on `counts` (never negative) through
/// `result - min(counts..., 0)`, which is exactly the result (-0 too). So
/// XLA measures an operand before its first GEMM runs, not last, when
/// nothing else waits for the measurements: measured last, a parameter is
/// still read after the optimizer would write its new value in place, and
/// XLA copies it (on the H100 LM with gemm=f8: 16 MiB more and 13 more
/// kernels than with the order kept).
void measureBefore(OpBuilder &builder, llvm::ArrayRef<Value> counts,
                   Operation *gemm) {
  if (counts.empty())
    return;
  Location loc = gemm->getLoc();
  Value result = gemm->getResult(0);
  builder.setInsertionPointAfter(gemm);
  Value least = shlo::buildScalar(builder, loc, builder.getI32Type(), 0);
  for (Value count : counts)
    least = shlo::buildElementwise(builder, loc, "minimum", {count, least});
  Value same = shlo::buildAfter(builder, loc, result, least);
  result.replaceAllUsesExcept(same, same.getDefiningOp());
}

/// Measures the low-precision GEMMs of `block` in program order, and
/// those of the loops in it (accumulated over their iterations, carried
/// out as more results of each loop): appends two operands' statistics per
/// GEMM to `out`, as values of `block`.
void NumericsPass::measureBlock(Block &block,
                                llvm::SmallVectorImpl<OperandStats> &out) {
  MLIRContext *context = &getContext();
  OpBuilder builder(context);
  for (Operation &op : llvm::make_early_inc_range(block)) {
    if (shlo::is(&op, "while")) {
      measureLoop(&op, out);
      continue;
    }
    if (!isLowPrecisionGemm(&op))
      continue;
    llvm::SmallVector<Attribute, 2> formats;
    llvm::SmallVector<Value, 2> fresh;
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
          builder.setInsertionPointToStart(
              cast<BlockArgument>(key).getOwner());
        OperandStats stats =
            rounding ? measure(builder, op.getLoc(), *rounding)
                     : measureUnrounded(builder, op.getLoc(), operand);
        found = measured.try_emplace(key, stats).first;
        fresh.push_back(stats.counts.front());
      }
      out.push_back(found->second);
      formats.push_back(StringAttr::get(
          context, rounding ? shlo::floatTypeName(rounding->format) : ""));
    }
    measureBefore(builder, fresh, &op);
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
}

/// A loop's GEMMs, measured in its body and accumulated over its
/// iterations: the larger amax, the counts summed, carried by the loop
/// from zeros.
/// Whether `value` is a constant (a count of zero, which stays zero).
bool isConstantValue(Value value) {
  return value.getDefiningOp() && shlo::isConstant(value.getDefiningOp());
}

/// Each distinct value of the statistics measured inside a loop once (both
/// operands of a GEMM may be one rounding; an unrounded operand's zero
/// counts are one constant), with how it accumulates over the iterations.
llvm::MapVector<Value, llvm::StringRef>
perIterationValues(llvm::ArrayRef<OperandStats> inner,
                   llvm::ArrayRef<bool> inLoop) {
  llvm::MapVector<Value, llvm::StringRef> perIteration;
  for (auto [stats, inside] : llvm::zip_equal(inner, inLoop)) {
    if (!inside)
      continue;
    perIteration.insert({stats.amax, "maximum"});
    for (Value count : stats.counts)
      if (!isConstantValue(count))
        perIteration.insert({count, "add"});
  }
  return perIteration;
}

/// `loop` made to carry each of `perIteration`'s values accumulated from
/// zero; the loop that replaces it, whose last results are the totals.
Operation *
accumulateInLoop(OpBuilder &builder, Operation *loop,
                 const llvm::MapVector<Value, llvm::StringRef> &perIteration) {
  Location loc = loop->getLoc();
  llvm::SmallVector<Value> inits;
  for (auto &entry : perIteration)
    inits.push_back(shlo::buildScalar(
        builder, loc,
        cast<RankedTensorType>(entry.first.getType()).getElementType(), 0));
  return shlo::extendWhile(
      builder, loop, inits, [&](OpBuilder &body, ValueRange carried) {
        llvm::SmallVector<Value> next;
        for (auto [i, entry] : llvm::enumerate(perIteration))
          next.push_back(shlo::buildElementwise(
              body, loc, entry.second, {carried[i], entry.first}));
        return next;
      });
}

void NumericsPass::measureLoop(Operation *loop,
                               llvm::SmallVectorImpl<OperandStats> &out) {
  llvm::SmallVector<OperandStats> inner;
  measureBlock(loop->getRegion(1).front(), inner);
  if (inner.empty())
    return;
  OpBuilder builder(loop);
  Location loc = loop->getLoc();
  // Statistics of a rounding outside the loop (what it carries unchanged)
  // are measured once there, and not accumulated (decided before the loop
  // is replaced).
  llvm::SmallVector<bool> inLoop;
  for (OperandStats &stats : inner)
    inLoop.push_back(
        loop->isAncestor(stats.amax.getParentRegion()->getParentOp()));
  llvm::MapVector<Value, llvm::StringRef> perIteration =
      perIterationValues(inner, inLoop);
  if (perIteration.empty()) {
    out.append(inner.begin(), inner.end());
    return;
  }
  Operation *grown = accumulateInLoop(builder, loop, perIteration);
  auto results = grown->getResults().take_back(perIteration.size());
  builder.setInsertionPointAfter(grown);
  Value zero = shlo::buildScalar(builder, loc, builder.getI32Type(), 0);
  auto total = [&](Value value) -> Value {
    if (isConstantValue(value))
      return zero;
    return results[perIteration.find(value) - perIteration.begin()];
  };
  for (auto [stats, inside] : llvm::zip_equal(inner, inLoop)) {
    if (!inside) {
      out.push_back(stats);
      continue;
    }
    OperandStats accumulated{total(stats.amax), {}};
    for (Value count : stats.counts)
      accumulated.counts.push_back(total(count));
    out.push_back(accumulated);
  }
}

void NumericsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(options.report(module)))
    return signalPassFailure();
  if (collected == Numerics::None)
    return;
  FailureOr<func::FuncOp> entry = requireEntryFunction(
      module, "amp-numerics: no function 'main' to return its measurements "
              "from");
  if (failed(entry))
    return signalPassFailure();
  func::FuncOp main = *entry;
  for (unsigned i = 0; i < main.getNumResults(); ++i)
    for (llvm::StringRef measured : {attr::kGemmAmax, attr::kNonFinite})
      if (main.getResultAttr(i, measured)) {
        main.emitError() << "amp-numerics: main already returns what it "
                            "measures (" << measured << ")";
        return signalPassFailure();
      }
  if (failed(collected == Numerics::Stats ? collectStats(main)
                                           : collectProvenance(main)))
    return signalPassFailure();
}

LogicalResult NumericsPass::collectProvenance(func::FuncOp main) {
  std::vector<ProvenanceRegion> regions = findProvenanceRegions(main);
  OpBuilder builder(&getContext());
  Value bits = buildProvenanceBits(builder, main, regions);
  main->setAttr(attr::kNonFiniteRegions,
                provenanceRegionsAttr(&getContext(), regions));
  if (failed(appendMeasurement(main, bits, attr::kNonFinite)))
    return main.emitError() << "amp-numerics: cannot append the "
                               "provenance bits";
  return success();
}

LogicalResult NumericsPass::collectStats(func::FuncOp main) {
  MLIRContext *context = &getContext();
  Location loc = main.getLoc();
  Type f32 = Float32Type::get(context), i32 = IntegerType::get(context, 32);
  measured.clear();
  gemms = 0;
  llvm::SmallVector<OperandStats> operands;
  measureBlock(main.front(), operands);
  llvm::SmallVector<Value> amaxes, counts;
  for (const OperandStats &stats : operands) {
    amaxes.push_back(stats.amax);
    llvm::append_range(counts, stats.counts);
  }
  // The results: every scalar as one element, then shaped [G, 2] and
  // [G, 2, counts].
  OpBuilder builder(main.front().getTerminator());
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
  if (failed(appendMeasurement(main, amaxResult, attr::kGemmAmax)) ||
      failed(appendMeasurement(main, countsResult, attr::kGemmCounts)))
    return main.emitError() << "amp-numerics: cannot append the statistics";
  return success();
}

} // namespace
