//===- Fp8Gemms.cpp - Scaled FP8 operands for eligible matrix multiplies --===//
//
// amp-fp8-gemms: each eligible dot becomes a dot of per-tensor scaled FP8
// operands (convert to FP8 of a clamped, scaled value) accumulating in f32,
// times the product of the scales: the form XLA:GPU keeps as an FP8 GEMM on
// Hopper under its default passes. XLA:CPU runs it upcast, so the numerics
// can be tested anywhere.
//
//===----------------------------------------------------------------------===//

#include "Backward.h"
#include "Contract.h"
#include "Passes.h"
#include "Policy.h"
#include "StableHLO.h"
#include "TrainingStep.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseSet.h"

#include <cfloat>
#include <optional>

namespace mlir::amp {
#define GEN_PASS_DEF_AMPFP8GEMMSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

enum class Scaling { Current, Delayed };

/// The FP8 format of one operand, and what scaling it gets.
struct OperandPlan {
  FloatType format;
  bool gradient = false;
};

/// Why `dot` cannot be an FP8 GEMM, with a detail for people (its sizes);
/// nothing when it can.
struct Ineligible {
  Fp8Ineligibility why;
  std::string detail;
};
std::optional<Ineligible> ineligibility(Operation *dot) {
  std::optional<shlo::DotDimensions> dims = shlo::getDotDimensions(dot);
  if (!dims)
    return Ineligible{Fp8Ineligibility::DimensionsUnreadable, ""};
  for (Value operand : dot->getOperands()) {
    auto type = dyn_cast<RankedTensorType>(operand.getType());
    if (!type || !type.hasStaticShape())
      return Ineligible{Fp8Ineligibility::DynamicShapes, ""};
  }
  // A batch of one (XLA:CPU's canonical dot form) is a plain GEMM.
  auto lhsType = cast<RankedTensorType>(dot->getOperand(0).getType());
  int64_t batch = 1;
  for (int64_t d : dims->lhsBatch)
    batch *= lhsType.getDimSize(d);
  if (batch != 1)
    return Ineligible{Fp8Ineligibility::BatchDimensions, ""};
  auto sizes = [](Value operand, llvm::ArrayRef<int64_t> contracting,
                  llvm::ArrayRef<int64_t> batchDims) {
    auto type = cast<RankedTensorType>(operand.getType());
    int64_t contract = 1, free = 1;
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (!llvm::is_contained(batchDims, d))
        (llvm::is_contained(contracting, d) ? contract : free) *=
            type.getDimSize(d);
    return std::make_pair(contract, free);
  };
  auto [k, m] = sizes(dot->getOperand(0), dims->lhsContracting,
                      dims->lhsBatch);
  auto [k2, n] = sizes(dot->getOperand(1), dims->rhsContracting,
                       dims->rhsBatch);
  if (k % 16 || m % 16 || n % 16)
    return Ineligible{Fp8Ineligibility::SizeNotMultipleOf16,
                      "shape " + std::to_string(m) + "x" + std::to_string(k) +
                          " * " + std::to_string(k2) + "x" +
                          std::to_string(n)};
  return std::nullopt;
}

class Fp8GemmsPass final
    : public amp::impl::AmpFp8GemmsPassBase<Fp8GemmsPass> {
public:
  using AmpFp8GemmsPassBase::AmpFp8GemmsPassBase;

  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;

private:
  GemmDtype format = GemmDtype::F8;
  Scaling scalingMode = Scaling::Current;
  std::string optionError;

  OperandPlan planOperand(Value operand,
                          const llvm::DenseSet<Value> &gradients);
  /// The f32 amax the scale comes from for `operand` of a dot in `main`
  /// (delayed: from a history appended to main; else current).
  Value referenceAmax(OpBuilder &builder, Location loc, Value currentAmax,
                      func::FuncOp main, bool topLevel);
  /// An operand in FP8 and the f32 scalar it was divided by.
  struct Quantized {
    Value value;
    Value scale;
  };
  Value widened(OpBuilder &builder, Location loc, Value operand);
  Quantized quantize(OpBuilder &builder, Operation *dot, Value operand,
                     const OperandPlan &plan, func::FuncOp main);
  void replaceWithFp8Dot(OpBuilder &builder, Operation *dot,
                         const Quantized &lhs, const Quantized &rhs,
                         bool computeResult);
  /// FP8 dots made so far, in program order (their survival markers).
  unsigned fp8DotCount = 0;

  /// Adds the FP8 decision to `dot`'s report attribute; `marker` is the
  /// index of its survival marker (replaceWithFp8Dot).
  /// `gemmReason` is the contract id of why it is not FP8, if it is not.
  void annotate(Operation *dot, llvm::StringRef text,
                std::optional<int64_t> marker = std::nullopt,
                llvm::StringRef gemmReason = {});
  /// Adds why `dot` stays in the compute dtype: the text, and the reason's
  /// contract id as `gemm_reason`.
  void annotateIneligible(Operation *dot, const Ineligible &ineligible);
};

LogicalResult Fp8GemmsPass::initialize(MLIRContext *context) {
  llvm::Expected<GemmDtype> parsed = parseFp8Gemm(gemm);
  if (!parsed)
    optionError =
        "invalid option 'gemm': " + llvm::toString(parsed.takeError());
  else if ((format = *parsed, scaling == "current"))
    scalingMode = Scaling::Current;
  else if (scaling == "delayed")
    scalingMode = Scaling::Delayed;
  else
    optionError = "invalid option 'scaling': unknown value '" + scaling +
                  "' (accepted: current, delayed)";
  if (optionError.empty() && amaxHistory < 1)
    optionError = "invalid option 'amax-history': must be at least 1, got " +
                  std::to_string(amaxHistory);
  return success();
}

OperandPlan Fp8GemmsPass::planOperand(Value operand,
                                      const llvm::DenseSet<Value> &gradients) {
  MLIRContext *context = &getContext();
  OperandPlan plan;
  plan.gradient = gradients.contains(operand);
  switch (format) {
  case GemmDtype::F8E4M3FN:
    plan.format = Float8E4M3FNType::get(context);
    break;
  case GemmDtype::F8E5M2:
    plan.format = Float8E5M2Type::get(context);
    break;
  default:
    plan.format = plan.gradient
                      ? static_cast<FloatType>(Float8E5M2Type::get(context))
                      : static_cast<FloatType>(Float8E4M3FNType::get(context));
  }
  return plan;
}

Value Fp8GemmsPass::referenceAmax(OpBuilder &builder, Location loc,
                                  Value currentAmax, func::FuncOp main,
                                  bool topLevel) {
  if (scalingMode == Scaling::Current || !topLevel)
    return currentAmax;
  // The history: one more argument and result of main, newest amax first.
  Type f32 = builder.getF32Type();
  auto historyType = RankedTensorType::get({amaxHistory}, f32);
  Attribute unit = builder.getUnitAttr();
  BlockArgument history =
      appendStateArgument(main, historyType, attr::kAmaxHistory, unit);
  if (!history)
    return currentAmax;
  Value past = shlo::buildReduceAll(builder, loc, history, "maximum", 0.0);
  Value havePast = shlo::buildCompare(
      builder, loc, past, shlo::buildScalar(builder, loc, f32, 0.0), "GT");
  // A non-finite amax (an overflow upstream) is used as it is, so the
  // overflow reaches the output (and the loss-scale check) instead of being
  // clamped away; finite values beyond the history's range saturate.
  Value reference = shlo::buildSelect(
      builder, loc, shlo::buildIsFinite(builder, loc, currentAmax),
      shlo::buildSelect(builder, loc, havePast, past, currentAmax),
      currentAmax);
  // Roll: [current, history[0 : N-1]].
  Value newest = shlo::buildReshape(builder, loc, currentAmax, {1});
  Value rolled = newest;
  if (amaxHistory > 1)
    rolled = shlo::buildConcatenate(
        builder, loc,
        {newest, shlo::buildSlice(builder, loc, history, {0},
                                  {amaxHistory - 1}, {1})},
        0);
  // A skipped step keeps the history (an overflow's amax stays out of it).
  if (failed(appendStateResult(main, rolled, attr::kAmaxHistory, unit,
                               history.getArgNumber())))
    return currentAmax;
  return reference;
}

Fp8GemmsPass::Quantized
Fp8GemmsPass::quantize(OpBuilder &builder, Operation *dot, Value operand,
                       const OperandPlan &plan, func::FuncOp main) {
  Location loc = dot->getLoc();
  Type f32 = builder.getF32Type();
  auto type = cast<RankedTensorType>(operand.getType());
  auto f32Type = RankedTensorType::get(type.getShape(), f32);
  double fmax =
      llvm::APFloat::getLargest(plan.format.getFloatSemantics())
          .convertToDouble();
  auto scalar = [&](double v) { return shlo::buildScalar(builder, loc, f32, v); };
  auto op = [&](llvm::StringRef name, ValueRange operands) {
    return shlo::buildElementwise(builder, loc, name, operands);
  };
  Value wide = widened(builder, loc, operand);
  Value amax = shlo::buildReduceAll(builder, loc, op("abs", {wide}),
                                    "maximum", 0.0);
  bool topLevel = dot->getParentOp() == main.getOperation();
  Value reference = referenceAmax(builder, loc, amax, main, topLevel);
  // A floor keeps an all-zero tensor's scale finite and non-zero.
  Value scale = op("maximum", {op("divide", {reference, scalar(fmax)}),
                               scalar(FLT_MIN)});
  Value scaled = op("divide", {wide, shlo::buildBroadcastScalar(builder, loc,
                                                                scale,
                                                                f32Type)});
  Value clamped = shlo::buildClamp(builder, loc, scalar(-fmax), scaled,
                                   scalar(fmax));
  return {shlo::buildConvert(builder, loc, clamped, plan.format), scale};
}

/// `operand` in f32, for quantizing. A low-precision operand that is the
/// rounding of an f32 value is not widened again: XLA folds the convert
/// chain f32 -> bf16 -> f32 into the f32 original anyway. A value stored
/// low is read back through its barrier, so that the quantizer, which may
/// run late (in the backward pass), reads the stored copy and the f32
/// original dies young; any other value is widened.
Value Fp8GemmsPass::widened(OpBuilder &builder, Location loc, Value operand) {
  Type f32 = builder.getF32Type();
  if (shlo::getFloatElementType(operand.getType()) == f32)
    return operand;
  Operation *rounding = operand.getDefiningOp();
  if (rounding && shlo::isConvert(rounding) &&
      shlo::getFloatElementType(rounding->getOperand(0).getType()) == f32) {
    for (Operation *user : operand.getUsers())
      if (shlo::isOptimizationBarrier(user))
        for (Operation *reader : user->getResult(0).getUsers())
          if (shlo::isConvert(reader) &&
              shlo::getFloatElementType(reader->getResult(0).getType()) == f32)
            return reader->getResult(0);
    return rounding->getOperand(0);
  }
  return shlo::buildConvert(builder, loc, operand, f32);
}

/// `dot` on FP8 operands, accumulating in f32, times the product of the two
/// scales, in the dot's own result type. The FP8 values feed the dot with
/// no convert between them: XLA:GPU's simplify-fp-conversions removes any
/// chain of converts (so f32 -> f8 -> bf16 would become f32 -> bf16), while
/// an FP8 dot is kept by both of its GEMM paths (Triton's FP8 GEMM fusion
/// and cuBLASLt's FP8 GEMM); XLA:CPU runs it upcast to f32, exactly.
void Fp8GemmsPass::replaceWithFp8Dot(OpBuilder &builder, Operation *dot,
                                     const Quantized &lhs,
                                     const Quantized &rhs,
                                     bool computeResult) {
  Location loc = dot->getLoc();
  auto resultType = cast<RankedTensorType>(dot->getResult(0).getType());
  // The GEMM writes f32 (rounded once to the dot's own type after
  // scaling), or with `computeResult` the dot's compute type, scaled there.
  auto productType = computeResult
                         ? resultType
                         : RankedTensorType::get(resultType.getShape(),
                                                 builder.getF32Type());
  Value product =
      shlo::buildDotGeneral(builder, dot, lhs.value, rhs.value,
                            *shlo::getDotDimensions(dot), productType);
  Value scale = shlo::buildElementwise(builder, loc, "multiply",
                                       {lhs.scale, rhs.scale});
  if (computeResult)
    scale = shlo::buildConvert(builder, loc, scale,
                               productType.getElementType());
  Value result = shlo::buildElementwise(
      builder, loc, "multiply",
      {product, shlo::buildBroadcastScalar(builder, loc, scale, productType)});
  if (resultType.getElementType() != productType.getElementType())
    result = shlo::buildConvert(builder, loc, result,
                                resultType.getElementType());
  shlo::markDecision(product.getDefiningOp(), attr::kFp8Marker,
                     fp8DotCount++);
  dot->getResult(0).replaceAllUsesWith(result);
  dot->erase();
}

void Fp8GemmsPass::annotate(Operation *dot, llvm::StringRef text,
                            std::optional<int64_t> marker,
                            llvm::StringRef gemmReason) {
  if (!report)
    return;
  auto decision = dot->getAttrOfType<DictionaryAttr>(attr::kDecision);
  if (!decision)
    return;
  NamedAttrList fields(decision);
  fields.set(decision_key::kGemm, StringAttr::get(&getContext(), text));
  if (marker)
    fields.set(decision_key::kFp8,
               IntegerAttr::get(IntegerType::get(&getContext(), 64), *marker));
  if (!gemmReason.empty())
    fields.set(decision_key::kGemmReason,
               StringAttr::get(&getContext(), gemmReason));
  dot->setAttr(attr::kDecision, fields.getDictionary(&getContext()));
}

void Fp8GemmsPass::annotateIneligible(Operation *dot,
                                      const Ineligible &ineligible) {
  std::string text =
      ("not eligible: " + fp8IneligibilityText(ineligible.why)).str();
  if (!ineligible.detail.empty())
    text += " (" + ineligible.detail + ")";
  annotate(dot, text, std::nullopt, fp8IneligibilityId(ineligible.why));
}

void Fp8GemmsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (!optionError.empty()) {
    module.emitError() << optionError;
    return signalPassFailure();
  }
  auto main = module.lookupSymbol<func::FuncOp>("main");
  fp8DotCount = 0;
  llvm::DenseSet<Value> gradients = backwardValues(module);
  llvm::SmallVector<Operation *> dots;
  module.walk([&](Operation *op) {
    if (!shlo::isDotGeneral(op))
      return;
    // Only the dots amp-insert-converts lowered: low-precision operands.
    auto low = [](Value v) {
      FloatType element = shlo::getFloatElementType(v.getType());
      return element && element.getWidth() == 16;
    };
    if (low(op->getOperand(0)) && low(op->getOperand(1)))
      dots.push_back(op);
  });
  for (Operation *dot : dots) {
    if (std::optional<Ineligible> ineligible = ineligibility(dot)) {
      annotateIneligible(dot, *ineligible);
      continue;
    }
    llvm::SmallVector<OperandPlan> plans;
    for (Value operand : dot->getOperands())
      plans.push_back(planOperand(operand, gradients));
    if (format == GemmDtype::F8 && isa<Float8E5M2Type>(plans[0].format) &&
        isa<Float8E5M2Type>(plans[1].format)) {
      // cuBLASLt multiplies e4m3 by e4m3 or e5m2, never e5m2 by e5m2 (an
      // explicit gemm=f8e5m2 gets it anyway: XLA then runs it dequantized).
      annotateIneligible(dot, {Fp8Ineligibility::BothE5M2, ""});
      continue;
    }
    OpBuilder builder(dot);
    bool delayed = scalingMode == Scaling::Delayed && main &&
                   dot->getParentOp() == main.getOperation();
    llvm::SmallVector<Quantized, 2> operands;
    std::string formats, separator;
    for (auto [operand, plan] : llvm::zip(dot->getOperands(), plans)) {
      operands.push_back(quantize(builder, dot, operand, plan,
                                  delayed ? main : func::FuncOp()));
      formats += separator + (isa<Float8E5M2Type>(plan.format) ? "f8e5m2"
                                                               : "f8e4m3fn");
      separator = " x ";
    }
    annotate(dot,
             formats + (delayed ? ", delayed scaling" : ", current scaling"),
             fp8DotCount);
    // A dot amp-insert-converts made in the compute dtype (a stored value
    // on gpu, reduce-dtype=compute) stays so: where XLA partitions the
    // GEMM along its contraction, it reduces the partial sums in the dtype
    // the GEMM writes.
    bool computeResult =
        shlo::getFloatElementType(dot->getResult(0).getType()).getWidth() ==
        16;
    replaceWithFp8Dot(builder, dot, operands[0], operands[1], computeResult);
  }
}

} // namespace
