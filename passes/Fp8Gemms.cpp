//===- Fp8Gemms.cpp - Scaled FP8 operands for eligible matrix multiplies --===//
//
// amp-fp8-gemms: each eligible dot becomes a dot of scaled FP8 operands
// (convert to FP8 of a clamped, scaled value) accumulating in f32, times
// the scales (per tensor or per row): the form XLA:GPU keeps as an FP8 GEMM
// with the scaling in its epilogue. MXFP8 (E4M3 blocks of 32 with E8M0
// scales, Mxfp8.cpp) becomes an `xla.scaled_dot` composite, a block-scaled
// GEMM on Blackwell, or a dot of dequantized operands. XLA:CPU runs them
// upcast, so the numerics can be tested anywhere.
//
//===----------------------------------------------------------------------===//

#include "Backward.h"
#include "Contract.h"
#include "Mxfp8.h"
#include "PassSupport.h"
#include "Passes.h"
#include "Policy.h"
#include "Scopes.h"
#include "StableHLO.h"
#include "TrainingStep.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"

#include <array>
#include <cfloat>
#include <cmath>
#include <optional>
#include <tuple>

namespace mlir::amp {
#define GEN_PASS_DEF_AMPFP8GEMMSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

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

/// A GEMM's sizes: M (lhs free), K (contraction), N (rhs free).
struct GemmSizes {
  int64_t m = 0, k = 0, n = 0;
  std::string text() const {
    return std::to_string(m) + "x" + std::to_string(k) + "x" +
           std::to_string(n);
  }
};

/// A low-precision dot, and whether it becomes an FP8 GEMM: its operands'
/// plans, or why not.
struct GemmCandidate {
  Operation *dot;
  GemmSizes sizes;
  llvm::SmallVector<OperandPlan, 2> plans;
  std::optional<Ineligible> ineligible;
};

std::optional<Ineligible> ineligibility(Operation *dot, GemmSizes &gemm) {
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
  gemm = {m, k, n};
  return std::nullopt;
}

/// Why `dot`, eligible, cannot be an MXFP8 GEMM: a contraction MXFP8
/// cannot block.
std::optional<Ineligible> unblockable(const GemmSizes &gemm,
                                      Fp8Scaling scaling) {
  if (scaling == Fp8Scaling::Mxfp8 && gemm.k % kMxBlock)
    return Ineligible{Fp8Ineligibility::ContractionNotMultipleOfBlock,
                      "contraction of " + std::to_string(gemm.k)};
  return std::nullopt;
}

/// Why `dot`, eligible, is too small for FP8 to pay under `minSize`;
/// `shared[i]`: operand i is quantized for another FP8 GEMM anyway, so
/// quantizing it costs this one nothing. The roofline (Contract.h,
/// Roofline) compares M*N*K with K*(M + N): K cancels, and a shared
/// operand leaves its term out of the sum (none left: FP8 is free).
std::optional<Ineligible> unprofitable(const GemmSizes &gemm,
                                       std::array<bool, 2> shared,
                                       int64_t minSize) {
  int64_t cost = (shared[0] ? 0 : gemm.m) + (shared[1] ? 0 : gemm.n);
  if (cost == 0)
    return std::nullopt;
  int64_t effective = gemm.m * gemm.n / cost;
  if (effective >= minSize)
    return std::nullopt;
  const char *formula = shared[0]   ? "M*N/N"
                        : shared[1] ? "M*N/M"
                                    : "M*N/(M+N)";
  const char *why = shared[0]   ? " (its lhs is quantized for another FP8 GEMM)"
                    : shared[1] ? " (its rhs is quantized for another FP8 GEMM)"
                                : "";
  return Ineligible{Fp8Ineligibility::TooSmall,
                    gemm.text() + " GEMM, " + formula + " = " +
                        std::to_string(effective) + " < " +
                        std::to_string(minSize) + why +
                        ": FP8 would be slower"};
}

/// The value `widened` scales for `operand`: the f32 value a rounding to
/// the compute dtype came from (its copy past a barrier, if it has one),
/// else the operand. GEMMs of one block reading the same source in the
/// same FP8 format share its per-tensor quantization (`quantize`).
Value quantizationSource(Value operand) {
  Type f32 = Float32Type::get(operand.getContext());
  if (shlo::getFloatElementType(operand.getType()) == f32)
    return operand;
  Operation *rounding = operand.getDefiningOp();
  if (!rounding || !shlo::isConvert(rounding) ||
      shlo::getFloatElementType(rounding->getOperand(0).getType()) != f32)
    return operand;
  for (Operation *user : operand.getUsers())
    if (shlo::isOptimizationBarrier(user))
      for (Operation *reader : user->getResult(0).getUsers())
        if (shlo::isConvert(reader) &&
            shlo::getFloatElementType(reader->getResult(0).getType()) == f32)
          return reader->getResult(0);
  return rounding->getOperand(0);
}

class Fp8GemmsPass final
    : public amp::impl::AmpFp8GemmsPassBase<Fp8GemmsPass> {
public:
  using AmpFp8GemmsPassBase::AmpFp8GemmsPassBase;

  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;

private:
  GemmDtype format = GemmDtype::F8;
  Fp8Scaling scalingMode = Fp8Scaling::Current;
  /// What `mx-form` asks for, and whether this module gets the composite:
  /// XLA (as of JAX 0.10) cannot partition it, so a program XLA's SPMD
  /// partitioner splits gets the dequantized form.
  MxForm form = MxForm::Composite;
  bool writeComposite = true;
  OptionCheck options;

  llvm::Error parseOptions();
  ScopeOverrides scopeRules;
  /// Why `dot` stays in the compute dtype by `scopes`, if it does.
  std::optional<Ineligible> keptByScope(Operation *dot) const;

  OperandPlan planOperand(Value operand,
                          const llvm::DenseSet<Value> &gradients);
  /// Which of `dots` become FP8 GEMMs, in the same order.
  llvm::SmallVector<GemmCandidate>
  decideFp8(llvm::ArrayRef<Operation *> dots,
            const llvm::DenseSet<Value> &gradients);
  /// The f32 amax the scale comes from for `operand` of a dot in `main`
  /// (delayed: from a history appended to main; else current).
  Value referenceAmax(OpBuilder &builder, Location loc, Value currentAmax,
                      func::FuncOp main, bool topLevel);
  using Quantized = Fp8Operand;
  Value widened(OpBuilder &builder, Location loc, Value operand);
  /// Operand `index` of `dot` in FP8.
  Quantized quantize(OpBuilder &builder, Operation *dot, unsigned index,
                     const OperandPlan &plan, func::FuncOp main);
  Quantized quantizeRows(OpBuilder &builder, Location loc, Value wide,
                         FloatType format, llvm::ArrayRef<int64_t> contracting,
                         llvm::ArrayRef<int64_t> batch);
  void replaceWithFp8Dot(OpBuilder &builder, Operation *dot,
                         const Quantized &lhs, const Quantized &rhs,
                         bool computeResult);
  /// The low-precision dots of `module` (what amp-insert-converts lowered),
  /// in program order: what keep-gemms and gemm_index number.
  static llvm::SmallVector<Operation *> lowPrecisionDots(ModuleOp module);
  /// Whether every dot keep-gemms names is one of `count` low-precision
  /// dots; the error names the range when not.
  LogicalResult checkKeptGemms(ModuleOp module, size_t count);
  /// Rewrites `candidate`, eligible and `index`-th of the low-precision
  /// dots, as an FP8 GEMM and says so in its decision.
  void rewriteGemm(const GemmCandidate &candidate, int64_t index,
                   func::FuncOp main);
  /// FP8 dots made so far, in program order (their survival markers).
  unsigned fp8DotCount = 0;
  /// Per-tensor current quantizations made so far, by source, format and
  /// block: GEMMs that read the same value in the same format share one
  /// (a weight gradient reads its forward GEMM's FP8 activation), so the
  /// program keeps one FP8 copy and amp-numerics measures it once.
  llvm::DenseMap<std::tuple<Value, Type, Block *>, Quantized> quantizations;

  /// Adds the FP8 decision to `dot`'s report attribute: `gemmIndex` is its
  /// place among the low-precision dots (what keep-gemms names), `marker`
  /// the index of its survival marker (replaceWithFp8Dot).
  /// `gemmReason` is the contract id of why it is not FP8, if it is not,
  /// and `gemmDetail` this dot's detail of it.
  void annotate(Operation *dot, int64_t gemmIndex, llvm::StringRef text,
                std::optional<int64_t> marker = std::nullopt,
                llvm::StringRef gemmReason = {},
                llvm::StringRef gemmDetail = {});
  /// Adds why `dot` stays in the compute dtype: the text, and the reason's
  /// contract id as `gemm_reason`.
  void annotateIneligible(Operation *dot, int64_t gemmIndex,
                          const Ineligible &ineligible);
};

llvm::Error Fp8GemmsPass::parseOptions() {
  if (llvm::Error error = readOption("gemm", parseFp8Gemm(gemm), format))
    return error;
  if (llvm::Error error =
          readOption("scaling", parseFp8Scaling(scaling), scalingMode))
    return error;
  if (amaxHistory < 1)
    return llvm::createStringError(
        "invalid option 'amax-history': must be at least 1, got " +
        std::to_string(amaxHistory));
  if (minSize < 0)
    return llvm::createStringError(
        "invalid option 'min-size': must be at least 0, got " +
        std::to_string(minSize));
  if (scalingMode == Fp8Scaling::Mxfp8 && format == GemmDtype::F8E5M2)
    return llvm::createStringError(
        "invalid option 'scaling': mxfp8 stores E4M3 data; use gemm=f8 or "
        "gemm=f8e4m3fn with it");
  if (llvm::Error error = ScopeOverrides::parse(scopes).moveInto(scopeRules))
    return error;
  return readOption("mx-form", parseMxForm(mxForm), form);
}

LogicalResult Fp8GemmsPass::initialize(MLIRContext *context) {
  options.keep(parseOptions());
  return success();
}

OperandPlan Fp8GemmsPass::planOperand(Value operand,
                                      const llvm::DenseSet<Value> &gradients) {
  MLIRContext *context = &getContext();
  OperandPlan plan;
  plan.gradient = gradients.contains(operand);
  if (scalingMode == Fp8Scaling::Mxfp8) {
    plan.format = Float8E4M3FNType::get(context);
    return plan;
  }
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

std::optional<Ineligible> Fp8GemmsPass::keptByScope(Operation *dot) const {
  if (scopeRules.empty())
    return std::nullopt;
  const ScopeRule *rule = scopeRules.ruleFor(dot);
  if (rule && rule->choice != ScopeChoice::F8)
    return Ineligible{Fp8Ineligibility::Scope, rule->name()};
  if (!rule && scopeRules.has(ScopeChoice::F8))
    return Ineligible{Fp8Ineligibility::Scope, "not in a scope marked f8"};
  return std::nullopt;
}

/// Decided before any GEMM is rewritten: whether one pays depends on which
/// of its operands other FP8 GEMMs quantize anyway. Per-tensor current
/// scaling of the same value in the same format is one quantization, made
/// once (`quantize`): a weight-gradient GEMM reads the activation its
/// forward GEMM quantized and the gradient its input-gradient GEMM did.
/// (Rowwise and MXFP8 scales run along each GEMM's own contraction, and
/// delayed scaling keeps a history per GEMM: nothing is shared there.)
llvm::SmallVector<GemmCandidate>
Fp8GemmsPass::decideFp8(llvm::ArrayRef<Operation *> dots,
                        const llvm::DenseSet<Value> &gradients) {
  llvm::SmallVector<GemmCandidate> candidates;
  llvm::SmallDenseSet<int64_t> kept(keepGemms.begin(), keepGemms.end());
  for (auto [index, dot] : llvm::enumerate(dots)) {
    GemmCandidate candidate{dot, {}, {}, std::nullopt};
    candidate.ineligible = ineligibility(dot, candidate.sizes);
    if (!candidate.ineligible && kept.contains(index))
      candidate.ineligible = Ineligible{Fp8Ineligibility::Kept, ""};
    if (!candidate.ineligible)
      candidate.ineligible = keptByScope(dot);
    if (!candidate.ineligible)
      candidate.ineligible = unblockable(candidate.sizes, scalingMode);
    for (Value operand : dot->getOperands())
      candidate.plans.push_back(planOperand(operand, gradients));
    if (!candidate.ineligible && format == GemmDtype::F8 &&
        isa<Float8E5M2Type>(candidate.plans[0].format) &&
        isa<Float8E5M2Type>(candidate.plans[1].format))
      // cuBLASLt multiplies e4m3 by e4m3 or e5m2, never e5m2 by e5m2 (an
      // explicit gemm=f8e5m2 gets it anyway: XLA then runs it dequantized).
      candidate.ineligible = Ineligible{Fp8Ineligibility::BothE5M2, ""};
    candidates.push_back(std::move(candidate));
  }
  bool sharing = scalingMode == Fp8Scaling::Current;
  llvm::DenseSet<std::tuple<Value, Type, Block *>> quantized;
  auto key = [](const GemmCandidate &candidate, unsigned i) {
    return std::make_tuple(quantizationSource(candidate.dot->getOperand(i)),
                           Type(candidate.plans[i].format),
                           candidate.dot->getBlock());
  };
  auto tooSmall = [&](const GemmCandidate &candidate) {
    std::array<bool, 2> shared{false, false};
    for (unsigned i = 0; sharing && i < 2; ++i)
      shared[i] = quantized.contains(key(candidate, i));
    return unprofitable(candidate.sizes, shared, minSize);
  };
  // Each GEMM that becomes FP8 can only make others cheaper: repeat until
  // none changes.
  llvm::SmallVector<bool> fp8(candidates.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (auto [candidate, chosen] : llvm::zip_equal(candidates, fp8)) {
      if (candidate.ineligible || chosen || tooSmall(candidate))
        continue;
      chosen = changed = true;
      for (unsigned i = 0; i < 2; ++i)
        quantized.insert(key(candidate, i));
    }
  }
  for (auto [candidate, chosen] : llvm::zip_equal(candidates, fp8))
    if (!candidate.ineligible && !chosen)
      candidate.ineligible = tooSmall(candidate);
  return candidates;
}

Value Fp8GemmsPass::referenceAmax(OpBuilder &builder, Location loc,
                                  Value currentAmax, func::FuncOp main,
                                  bool topLevel) {
  if (scalingMode != Fp8Scaling::Delayed || !topLevel)
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
Fp8GemmsPass::quantize(OpBuilder &builder, Operation *dot, unsigned index,
                       const OperandPlan &plan, func::FuncOp main) {
  Location loc = dot->getLoc();
  Type f32 = builder.getF32Type();
  Value operand = dot->getOperand(index);
  Value wide = widened(builder, loc, operand);
  shlo::DotDimensions dims = *shlo::getDotDimensions(dot);
  bool lhs = index == 0;
  if (scalingMode == Fp8Scaling::Rowwise)
    return quantizeRows(builder, loc, wide, plan.format,
                        lhs ? dims.lhsContracting : dims.rhsContracting,
                        lhs ? dims.lhsBatch : dims.rhsBatch);
  if (scalingMode == Fp8Scaling::Mxfp8)
    return mxfp8::quantizeBlocks(
        builder, loc,
        mxfp8::asMatrix(builder, loc, wide,
                        lhs ? dims.lhsContracting : dims.rhsContracting,
                        lhs ? dims.lhsBatch : dims.rhsBatch),
        1);
  bool topLevel = dot->getParentOp() == main.getOperation();
  bool shared = scalingMode == Fp8Scaling::Current;
  std::tuple<Value, Type, Block *> key{quantizationSource(operand),
                                       plan.format, dot->getBlock()};
  if (shared)
    if (auto found = quantizations.find(key); found != quantizations.end())
      return found->second;
  auto type = cast<RankedTensorType>(operand.getType());
  auto f32Type = RankedTensorType::get(type.getShape(), f32);
  double fmax =
      llvm::APFloat::getLargest(plan.format.getFloatSemantics())
          .convertToDouble();
  auto scalar = [&](double v) { return shlo::buildScalar(builder, loc, f32, v); };
  auto op = [&](llvm::StringRef name, ValueRange operands) {
    return shlo::buildElementwise(builder, loc, name, operands);
  };
  Value amax = shlo::buildReduceAll(builder, loc, op("abs", {wide}),
                                    "maximum", 0.0);
  Value reference = referenceAmax(builder, loc, amax, main, topLevel);
  // A floor keeps an all-zero tensor's scale finite and non-zero.
  Value scale = op("maximum", {op("divide", {reference, scalar(fmax)}),
                               scalar(FLT_MIN)});
  Value scaled = op("divide", {wide, shlo::buildBroadcastScalar(builder, loc,
                                                                scale,
                                                                f32Type)});
  Value clamped = shlo::buildClamp(builder, loc, scalar(-fmax), scaled,
                                   scalar(fmax));
  Quantized quantized{shlo::buildConvert(builder, loc, clamped, plan.format),
                      scale};
  if (shared)
    quantizations[key] = quantized;
  return quantized;
}

Fp8GemmsPass::Quantized Fp8GemmsPass::quantizeRows(
    OpBuilder &builder, Location loc, Value wide, FloatType format,
    llvm::ArrayRef<int64_t> contracting, llvm::ArrayRef<int64_t> batch) {
  auto type = cast<RankedTensorType>(wide.getType());
  Type f32 = builder.getF32Type();
  double fmax =
      llvm::APFloat::getLargest(format.getFloatSemantics()).convertToDouble();
  llvm::SmallVector<int64_t> reduced(contracting);
  llvm::sort(reduced);
  llvm::SmallVector<int64_t> kept, free;
  for (int64_t d = 0; d < type.getRank(); ++d) {
    if (llvm::is_contained(contracting, d))
      continue;
    kept.push_back(d);
    if (!llvm::is_contained(batch, d))
      free.push_back(type.getDimSize(d));
  }
  auto op = [&](llvm::StringRef name, ValueRange operands) {
    return shlo::buildElementwise(builder, loc, name, operands);
  };
  // scale = max(amax / fmax, FLT_MIN) as one reduction: the max of
  // |x| / fmax (rounding is monotonic: the same value) from FLT_MIN. Its
  // readers (the quantize, the product's scaling) take it as it is, so XLA
  // fuses no elementwise kernel of its own for it.
  Value magnitudes = op("multiply",
                        {op("abs", {wide}),
                         shlo::buildBroadcastScalar(
                             builder, loc,
                             shlo::buildScalar(builder, loc, f32, 1.0 / fmax),
                             type)});
  Value scale = shlo::buildReduce(builder, loc, magnitudes, reduced,
                                  "maximum", FLT_MIN);
  auto scaleType = cast<RankedTensorType>(scale.getType());
  Value scaled = op("divide", {wide, shlo::buildBroadcastInDim(
                                         builder, loc, scale, type, kept)});
  Value clamped = shlo::buildClamp(
      builder, loc, shlo::buildScalar(builder, loc, f32, -fmax), scaled,
      shlo::buildScalar(builder, loc, f32, fmax));
  Value codes = shlo::buildConvert(builder, loc, clamped, format);
  if (scaleType.getRank() != static_cast<int64_t>(free.size()))
    scale = shlo::buildReshape(builder, loc, scale, free);
  return {codes, scale};
}

/// `operand` in f32, for quantizing. A low-precision operand that is the
/// rounding of an f32 value is not widened again: XLA folds the convert
/// chain f32 -> bf16 -> f32 into the f32 original anyway. A value stored
/// low is read back through its barrier, so that the quantizer, which may
/// run late (in the backward pass), reads the stored copy and the f32
/// original dies young; any other value is widened.
Value Fp8GemmsPass::widened(OpBuilder &builder, Location loc, Value operand) {
  Value source = quantizationSource(operand);
  if (shlo::getFloatElementType(source.getType()) == builder.getF32Type())
    return source;
  return shlo::buildConvert(builder, loc, operand, builder.getF32Type());
}

/// `dot` on FP8 operands, accumulating in f32, times the scales, in the
/// dot's own result type. The FP8 values feed the dot with no convert
/// between them: XLA:GPU's simplify-fp-conversions removes any chain of
/// converts (so f32 -> f8 -> bf16 would become f32 -> bf16), while an FP8
/// dot is kept by both of its GEMM paths (Triton's FP8 GEMM fusion and
/// cuBLASLt's FP8 GEMM); XLA:CPU runs it upcast to f32, exactly. Per-row
/// scales multiply the result's rows (lhs), then its columns (rhs).
void Fp8GemmsPass::replaceWithFp8Dot(OpBuilder &builder, Operation *dot,
                                     const Quantized &lhs,
                                     const Quantized &rhs,
                                     bool computeResult) {
  Location loc = dot->getLoc();
  auto resultType = cast<RankedTensorType>(dot->getResult(0).getType());
  bool rowwise = scalingMode == Fp8Scaling::Rowwise;
  // The GEMM writes f32 (rounded once to the dot's own type after
  // scaling), or with `computeResult` the dot's compute type, scaled there.
  auto f32Result =
      RankedTensorType::get(resultType.getShape(), builder.getF32Type());
  auto productType = computeResult ? resultType : f32Result;
  Type productElement = productType.getElementType();
  shlo::DotDimensions dims = *shlo::getDotDimensions(dot);
  Value product = shlo::buildDotGeneral(builder, dot, lhs.value, rhs.value,
                                        dims, productType);
  Value result;
  if (rowwise) {
    // Result dimensions: batch (each of one), lhs free, rhs free; the
    // product times the rows' scales, then the columns' (XLA:GPU fuses
    // that chain into the GEMM's epilogue, or into the elementwise
    // fusion reading the product).
    int64_t batch = dims.lhsBatch.size();
    int64_t lhsFree = cast<RankedTensorType>(lhs.scale.getType()).getRank();
    int64_t rhsFree = cast<RankedTensorType>(rhs.scale.getType()).getRank();
    llvm::SmallVector<int64_t> rows, columns;
    for (int64_t i = 0; i < lhsFree; ++i)
      rows.push_back(batch + i);
    for (int64_t i = 0; i < rhsFree; ++i)
      columns.push_back(batch + lhsFree + i);
    auto along = [&](Value scale, llvm::ArrayRef<int64_t> dimensions) {
      if (computeResult)
        scale = shlo::buildConvert(builder, loc, scale, productElement);
      return shlo::buildBroadcastInDim(builder, loc, scale, productType,
                                       dimensions);
    };
    result = shlo::buildElementwise(builder, loc, "multiply",
                                    {product, along(lhs.scale, rows)});
    result = shlo::buildElementwise(builder, loc, "multiply",
                                    {result, along(rhs.scale, columns)});
  } else {
    Value scale = shlo::buildElementwise(builder, loc, "multiply",
                                         {lhs.scale, rhs.scale});
    if (computeResult)
      scale = shlo::buildConvert(builder, loc, scale, productElement);
    result = shlo::buildElementwise(
        builder, loc, "multiply",
        {product, shlo::buildBroadcastScalar(builder, loc, scale,
                                             productType)});
  }
  if (resultType.getElementType() != productType.getElementType())
    result = shlo::buildConvert(builder, loc, result,
                                resultType.getElementType());
  shlo::markDecision(product.getDefiningOp(), attr::kFp8Marker,
                     fp8DotCount++);
  dot->getResult(0).replaceAllUsesWith(result);
  dot->erase();
}

void Fp8GemmsPass::annotate(Operation *dot, int64_t gemmIndex,
                            llvm::StringRef text,
                            std::optional<int64_t> marker,
                            llvm::StringRef gemmReason,
                            llvm::StringRef gemmDetail) {
  if (!report)
    return;
  auto decision = dot->getAttrOfType<DictionaryAttr>(attr::kDecision);
  if (!decision)
    return;
  NamedAttrList fields(decision);
  fields.set(decision_key::kGemm, StringAttr::get(&getContext(), text));
  fields.set(decision_key::kGemmIndex,
             IntegerAttr::get(IntegerType::get(&getContext(), 64), gemmIndex));
  if (marker)
    fields.set(decision_key::kFp8,
               IntegerAttr::get(IntegerType::get(&getContext(), 64), *marker));
  if (!gemmReason.empty())
    fields.set(decision_key::kGemmReason,
               StringAttr::get(&getContext(), gemmReason));
  if (!gemmDetail.empty())
    fields.set(decision_key::kGemmDetail,
               StringAttr::get(&getContext(), gemmDetail));
  dot->setAttr(attr::kDecision, fields.getDictionary(&getContext()));
}

void Fp8GemmsPass::annotateIneligible(Operation *dot, int64_t gemmIndex,
                                      const Ineligible &ineligible) {
  // A GEMM the user (or fp8_fallback) kept was eligible.
  std::string text =
      ineligible.why == Fp8Ineligibility::Kept
          ? fp8IneligibilityText(ineligible.why).str()
          : ("not eligible: " + fp8IneligibilityText(ineligible.why)).str();
  if (!ineligible.detail.empty())
    text += " (" + ineligible.detail + ")";
  annotate(dot, gemmIndex, text, std::nullopt,
           fp8IneligibilityId(ineligible.why),
           ineligible.detail);
}

llvm::SmallVector<Operation *> Fp8GemmsPass::lowPrecisionDots(ModuleOp module) {
  llvm::SmallVector<Operation *> dots;
  module.walk([&](Operation *op) {
    if (!shlo::isDotGeneral(op))
      return;
    auto low = [](Value v) {
      FloatType element = shlo::getFloatElementType(v.getType());
      return element && element.getWidth() == 16;
    };
    if (low(op->getOperand(0)) && low(op->getOperand(1)))
      dots.push_back(op);
  });
  return dots;
}

LogicalResult Fp8GemmsPass::checkKeptGemms(ModuleOp module, size_t count) {
  for (int64_t kept : keepGemms)
    if (kept < 0 || kept >= static_cast<int64_t>(count))
      return module.emitError()
             << "invalid option 'keep-gemms': no low-precision dot " << kept
             << " (the module has " << count
             << (count ? ", numbered 0 to " + std::to_string(count - 1)
                       : std::string())
             << "; the report's gemm_index)";
  return success();
}

void Fp8GemmsPass::rewriteGemm(const GemmCandidate &candidate, int64_t index,
                               func::FuncOp main) {
  Operation *dot = candidate.dot;
  OpBuilder builder(dot);
  bool delayed = scalingMode == Fp8Scaling::Delayed && main &&
                 dot->getParentOp() == main.getOperation();
  llvm::SmallVector<Quantized, 2> operands;
  std::string formats, separator;
  for (auto [operand, plan] : llvm::enumerate(candidate.plans)) {
    operands.push_back(quantize(builder, dot, operand, plan,
                                delayed ? main : func::FuncOp()));
    formats += separator + (isa<Float8E5M2Type>(plan.format) ? "f8e5m2"
                                                             : "f8e4m3fn");
    separator = " x ";
  }
  if (scalingMode == Fp8Scaling::Mxfp8) {
    annotate(dot, index,
             formats + ", mxfp8 (blocks of 32, E8M0 scales" +
                 (writeComposite ? ", xla.scaled_dot)"
                  : form == MxForm::Composite
                      ? ", dequantized: XLA does not partition "
                        "xla.scaled_dot)"
                      : ", dequantized)"),
             fp8DotCount);
    mxfp8::replaceWithBlockScaledDot(builder, getOperation(), dot,
                                     operands[0], operands[1], writeComposite,
                                     fp8DotCount++);
    return;
  }
  annotate(dot, index,
           formats + (delayed ? ", delayed scaling"
                      : scalingMode == Fp8Scaling::Rowwise
                          ? ", rowwise scaling"
                          : ", current scaling"),
           fp8DotCount);
  // A dot amp-insert-converts made in the compute dtype (a stored value on
  // gpu, reduce-dtype=compute) stays so: where XLA partitions the GEMM
  // along its contraction, it reduces the partial sums in the dtype the
  // GEMM writes.
  bool computeResult =
      shlo::getFloatElementType(dot->getResult(0).getType()).getWidth() == 16;
  replaceWithFp8Dot(builder, dot, operands[0], operands[1], computeResult);
}

void Fp8GemmsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(options.report(module)))
    return signalPassFailure();
  func::FuncOp main = entryFunction(module);
  fp8DotCount = 0;
  quantizations.clear();
  bool partitioned = shlo::partitionCount(module) > 1;
  writeComposite = form == MxForm::Composite && !partitioned;
  llvm::DenseSet<Value> gradients = backwardValues(module);
  llvm::SmallVector<Operation *> dots = lowPrecisionDots(module);
  if (failed(checkKeptGemms(module, dots.size())))
    return signalPassFailure();
  if (llvm::Error error = scopeRules.check(module)) {
    module.emitError() << llvm::toString(std::move(error));
    return signalPassFailure();
  }
  llvm::SmallVector<GemmCandidate> candidates = decideFp8(dots, gradients);
  for (auto [index, candidate] : llvm::enumerate(candidates)) {
    if (candidate.ineligible)
      annotateIneligible(candidate.dot, index, *candidate.ineligible);
    else
      rewriteGemm(candidate, index, main);
  }
}

} // namespace
