//===- Fp8Gemms.cpp - Scaled FP8 operands for eligible matrix multiplies --===//
//
// amp-fp8-gemms: each eligible dot becomes a dot of scaled FP8 operands
// (convert to FP8 of a clamped, scaled value) accumulating in f32, times
// the scales (per tensor or per row): the form XLA:GPU keeps as an FP8 GEMM
// with the scaling in its epilogue. MXFP8 (E4M3 blocks of 32 with E8M0
// scales) becomes an `xla.scaled_dot` composite, a block-scaled GEMM on
// Blackwell, or a dot of dequantized operands. XLA:CPU runs them upcast,
// so the numerics can be tested anywhere.
//
//===----------------------------------------------------------------------===//

#include "Backward.h"
#include "Contract.h"
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

/// An MXFP8 GEMM's operands are matrices [free, contraction] (XLA's
/// scaled-dot takes one free and one contracting dimension each), blocked
/// along the contraction, and the product [M, N] is reshaped back.
const shlo::DotDimensions &matrixDimensions() {
  static const shlo::DotDimensions dims{{}, {}, {1}, {1}};
  return dims;
}

/// `value`, an operand of a dot with `contracting` and `batch` (each of
/// one) dimensions, as the matrix [free, contraction]: its free dimensions
/// then its contracting ones in their listed order (the order both
/// operands share), flattened.
Value asMatrix(OpBuilder &builder, Location loc, Value value,
               llvm::ArrayRef<int64_t> contracting,
               llvm::ArrayRef<int64_t> batch) {
  auto type = cast<RankedTensorType>(value.getType());
  llvm::SmallVector<int64_t> order;
  int64_t free = 1, contraction = 1;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (!llvm::is_contained(contracting, d) && !llvm::is_contained(batch, d)) {
      order.push_back(d);
      free *= type.getDimSize(d);
    }
  for (int64_t d : contracting) {
    order.push_back(d);
    contraction *= type.getDimSize(d);
  }
  for (int64_t d : batch)
    order.push_back(d);
  if (!llvm::equal(order, llvm::seq<int64_t>(0, type.getRank())))
    value = shlo::buildTranspose(builder, loc, value, order);
  if (cast<RankedTensorType>(value.getType()).getShape() ==
      llvm::ArrayRef<int64_t>{free, contraction})
    return value;
  return shlo::buildReshape(builder, loc, value, {free, contraction});
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
  /// What `mx-form` asks for, and what this module gets: XLA (as of JAX
  /// 0.10) cannot partition the composite, so a program XLA's SPMD
  /// partitioner splits gets the dequantized form.
  bool mxComposite = true;
  bool writeComposite = true;
  std::string optionError;
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
  /// An operand in FP8 and the f32 scale it was divided by: a scalar (per
  /// tensor), the operand's free dimensions (rowwise: its batch dimensions,
  /// each of one, left out), or the operand's shape with the block
  /// dimension divided by 32 (mxfp8).
  struct Quantized {
    Value value;
    Value scale;
  };
  Value widened(OpBuilder &builder, Location loc, Value operand);
  /// Operand `index` of `dot` in FP8.
  Quantized quantize(OpBuilder &builder, Operation *dot, unsigned index,
                     const OperandPlan &plan, func::FuncOp main);
  Quantized quantizeRows(OpBuilder &builder, Location loc, Value wide,
                         FloatType format, llvm::ArrayRef<int64_t> contracting,
                         llvm::ArrayRef<int64_t> batch);
  Quantized quantizeBlocks(OpBuilder &builder, Location loc, Value wide,
                           int64_t blockDim);
  void replaceWithFp8Dot(OpBuilder &builder, Operation *dot,
                         const Quantized &lhs, const Quantized &rhs,
                         bool computeResult);
  void replaceWithBlockScaledDot(OpBuilder &builder, Operation *dot,
                                 const Quantized &lhs, const Quantized &rhs);
  /// The private function decomposing an `xla.scaled_dot` composite
  /// replacing `dot` (the dequantized dot).
  FlatSymbolRefAttr scaledDotDecomposition(Operation *dot,
                                           TypeRange operandTypes,
                                           Type resultType);
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

LogicalResult Fp8GemmsPass::initialize(MLIRContext *context) {
  llvm::Expected<GemmDtype> parsed = parseFp8Gemm(gemm);
  llvm::Expected<Fp8Scaling> parsedScaling = parseFp8Scaling(scaling);
  if (!parsed) {
    optionError =
        "invalid option 'gemm': " + llvm::toString(parsed.takeError());
    llvm::consumeError(parsedScaling.takeError());
  } else if (!parsedScaling) {
    optionError = "invalid option 'scaling': " +
                  llvm::toString(parsedScaling.takeError());
  } else {
    format = *parsed;
    scalingMode = *parsedScaling;
  }
  if (optionError.empty() && amaxHistory < 1)
    optionError = "invalid option 'amax-history': must be at least 1, got " +
                  std::to_string(amaxHistory);
  if (optionError.empty() && minSize < 0)
    optionError = "invalid option 'min-size': must be at least 0, got " +
                  std::to_string(minSize);
  if (optionError.empty() && scalingMode == Fp8Scaling::Mxfp8 &&
      format == GemmDtype::F8E5M2)
    optionError = "invalid option 'scaling': mxfp8 stores E4M3 data; use "
                  "gemm=f8 or gemm=f8e4m3fn with it";
  if (optionError.empty())
    if (llvm::Error error = ScopeOverrides::parse(scopes).moveInto(scopeRules))
      optionError = llvm::toString(std::move(error));
  if (optionError.empty()) {
    if (mxForm == mxFormNames()[0])
      mxComposite = true;
    else if (mxForm == mxFormNames()[1])
      mxComposite = false;
    else
      optionError = "invalid option 'mx-form': unknown value '" + mxForm +
                    "' (accepted: " + llvm::join(mxFormNames(), ", ") + ")";
  }
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
    return quantizeBlocks(
        builder, loc,
        asMatrix(builder, loc, wide,
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

/// `shape` with dimension `blockDim` split into [size / kMxBlock, kMxBlock].
static llvm::SmallVector<int64_t> blockedShape(llvm::ArrayRef<int64_t> shape,
                                               int64_t blockDim) {
  llvm::SmallVector<int64_t> blocked(shape);
  blocked[blockDim] /= kMxBlock;
  blocked.insert(blocked.begin() + blockDim + 1, kMxBlock);
  return blocked;
}

/// Every dimension of the blocked shape but the one inside a block: where a
/// per-block value broadcasts from.
static llvm::SmallVector<int64_t> blockBroadcastDims(int64_t rank,
                                                     int64_t blockDim) {
  llvm::SmallVector<int64_t> dims;
  for (int64_t d = 0; d <= rank; ++d)
    if (d != blockDim + 1)
      dims.push_back(d);
  return dims;
}

Fp8GemmsPass::Quantized Fp8GemmsPass::quantizeBlocks(OpBuilder &builder,
                                                     Location loc, Value wide,
                                                     int64_t blockDim) {
  auto type = cast<RankedTensorType>(wide.getType());
  Type f32 = builder.getF32Type(), i32 = builder.getI32Type();
  auto blockedType =
      RankedTensorType::get(blockedShape(type.getShape(), blockDim), f32);
  auto op = [&](llvm::StringRef name, ValueRange operands) {
    return shlo::buildElementwise(builder, loc, name, operands);
  };
  Value blocks = shlo::buildReshape(builder, loc, wide, blockedType.getShape());
  Value amax = shlo::buildReduce(builder, loc, op("abs", {blocks}),
                                 {blockDim + 1}, "maximum", 0.0);
  auto scaleType = cast<RankedTensorType>(amax.getType());
  auto intType = RankedTensorType::get(scaleType.getShape(), i32);
  auto splat = [&](Type element, double v, RankedTensorType like) {
    return shlo::buildBroadcastScalar(
        builder, loc, shlo::buildScalar(builder, loc, element, v),
        RankedTensorType::get(like.getShape(), element));
  };
  auto integer = [&](int64_t v) { return splat(i32, v, intType); };
  // The smallest power of two that keeps the block within E4M3's 448 =
  // 1.75 * 2^8, from amax's bits (exact; log2 in floating point is not):
  // amax = 1.m * 2^E needs 2^(E-8), or 2^(E-7) when 1.m > 1.75.
  Value bits = shlo::buildBitcastConvert(builder, loc, amax, intType);
  Value biased = op("shift_right_logical", {bits, integer(23)});
  Value mantissa = op("and", {bits, integer(0x7FFFFF)});
  Value roundsUp = shlo::buildSelect(
      builder, loc, shlo::buildCompare(builder, loc, mantissa,
                                       integer(0x600000), "GT"),
      integer(1), integer(0));
  Value exponent = op("add", {op("subtract", {biased, integer(127 + 8)}),
                              roundsUp});
  // E8M0 holds 2^-127 .. 2^127; the least here is 2^-126 (an all-zero
  // block's), f32's least normal: XLA flushes subnormals to zero, and a
  // block divided by a zero scale would be NaN.
  exponent = shlo::buildClamp(builder, loc,
                              shlo::buildScalar(builder, loc, i32, -126),
                              exponent,
                              shlo::buildScalar(builder, loc, i32, 127));
  // 2^e as f32 bits.
  Value scaleBits =
      op("shift_left", {op("add", {exponent, integer(127)}), integer(23)});
  Value scale = shlo::buildBitcastConvert(builder, loc, scaleBits, scaleType);
  // A block holding inf or NaN gets a NaN scale (as in the OCP MX format),
  // so the overflow reaches the output and the loss-scale check.
  scale = shlo::buildSelect(
      builder, loc, shlo::buildIsFinite(builder, loc, amax), scale,
      splat(f32, std::nan(""), scaleType));
  Value scaled = op("divide",
                    {blocks, shlo::buildBroadcastInDim(
                                 builder, loc, scale, blockedType,
                                 blockBroadcastDims(type.getRank(), blockDim))});
  Value clamped = shlo::buildClamp(
      builder, loc, shlo::buildScalar(builder, loc, f32, -448.0), scaled,
      shlo::buildScalar(builder, loc, f32, 448.0));
  Value codes = shlo::buildConvert(builder, loc, clamped,
                                   Float8E4M3FNType::get(builder.getContext()));
  return {shlo::buildReshape(builder, loc, codes, type.getShape()), scale};
}

/// MXFP8 `codes` times their per-block `scale` (f32 or E8M0), in
/// `elementType`: exact, a code times a power of two.
static Value dequantizeBlocks(OpBuilder &builder, Location loc, Value codes,
                              Value scale, int64_t blockDim,
                              Type elementType) {
  auto type = cast<RankedTensorType>(codes.getType());
  Type scaleElement = cast<RankedTensorType>(scale.getType()).getElementType();
  auto blockedScaleType = RankedTensorType::get(
      blockedShape(type.getShape(), blockDim), scaleElement);
  Value perElement = shlo::buildReshape(
      builder, loc,
      shlo::buildBroadcastInDim(builder, loc, scale, blockedScaleType,
                                blockBroadcastDims(type.getRank(), blockDim)),
      type.getShape());
  return shlo::buildElementwise(
      builder, loc, "multiply",
      {shlo::buildConvert(builder, loc, codes, elementType),
       shlo::buildConvert(builder, loc, perElement, elementType)});
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

/// `dot` as an MXFP8 GEMM. The composite form is what `jax.lax.scaled_dot`
/// emits (JAX >= 0.9.1): the codes and their E8M0 scales, accumulating in
/// f32 or bf16 (its only result types; another is converted after). The
/// dequantized form multiplies each code by its scale, exactly, in the
/// dot's operand type and runs the original dot.
void Fp8GemmsPass::replaceWithBlockScaledDot(OpBuilder &builder,
                                             Operation *dot,
                                             const Quantized &lhs,
                                             const Quantized &rhs) {
  Location loc = dot->getLoc();
  auto resultType = cast<RankedTensorType>(dot->getResult(0).getType());
  const shlo::DotDimensions &dims = matrixDimensions();
  // [M, N] of the matrices, reshaped to the dot's result (batch dimensions
  // of one, lhs free, rhs free) at the end.
  int64_t m = cast<RankedTensorType>(lhs.value.getType()).getDimSize(0);
  int64_t n = cast<RankedTensorType>(rhs.value.getType()).getDimSize(0);
  Operation *gemm;
  Value result;
  if (writeComposite) {
    Type e8m0 = Float8E8M0FNUType::get(builder.getContext());
    Value lhsScale = shlo::buildConvert(builder, loc, lhs.scale, e8m0);
    Value rhsScale = shlo::buildConvert(builder, loc, rhs.scale, e8m0);
    // XLA turns the composite into a block-scaled GEMM that keeps no
    // marker: the lhs scale, which only the GEMM reads, carries it too.
    shlo::markDecision(lhsScale.getDefiningOp(), attr::kFp8Marker,
                       fp8DotCount);
    Type accumulated = resultType.getElementType();
    if (!accumulated.isBF16() && !accumulated.isF32())
      accumulated = builder.getF32Type();
    auto compositeType = RankedTensorType::get({m, n}, accumulated);
    llvm::SmallVector<Value> operands{lhs.value, rhs.value, lhsScale,
                                      rhsScale};
    MLIRContext *context = builder.getContext();
    auto ints = [&](llvm::ArrayRef<int64_t> values) {
      llvm::SmallVector<Attribute> attrs;
      for (int64_t v : values)
        attrs.push_back(builder.getI64IntegerAttr(v));
      return ArrayAttr::get(context, attrs);
    };
    // ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)).
    Attribute dimensionNumbers = ArrayAttr::get(
        context,
        {ArrayAttr::get(context, {ints(dims.lhsContracting),
                                  ints(dims.rhsContracting)}),
         ArrayAttr::get(context, {ints(dims.lhsBatch), ints(dims.rhsBatch)})});
    DictionaryAttr attributes = builder.getDictionaryAttr(
        {builder.getNamedAttr("dimension_numbers", dimensionNumbers),
         builder.getNamedAttr("preferred_element_type",
                              TypeAttr::get(accumulated))});
    gemm = shlo::buildComposite(
        builder, loc, attr::kScaledDotComposite, operands, compositeType,
        attributes,
        scaledDotDecomposition(dot, ValueRange(operands).getTypes(),
                               compositeType));
    // The dot's decision (and any attribute of its own) stays with it.
    gemm->setDiscardableAttrs(dot->getDiscardableAttrDictionary());
    result = gemm->getResult(0);
    if (accumulated != resultType.getElementType())
      result = shlo::buildConvert(builder, loc, result,
                                  resultType.getElementType());
  } else {
    auto operandType = [&](unsigned i) {
      return cast<RankedTensorType>(dot->getOperand(i).getType())
          .getElementType();
    };
    // The codes go through a barrier: without one XLA:GPU, in a
    // partitioned program, folded the FP8 convert into the bf16 one and
    // dropped the rounding.
    auto held = [&](Value codes) {
      return shlo::buildOptimizationBarrier(builder, loc, codes)->getResult(0);
    };
    Value lhsValues = dequantizeBlocks(builder, loc, held(lhs.value),
                                       lhs.scale, 1, operandType(0));
    // XLA:CPU rewrites a bf16 dot into an f32 one without its marker: the
    // lhs's dequantization (the FP8 rounding kept) carries it too.
    shlo::markDecision(lhsValues.getDefiningOp(), attr::kFp8Marker,
                       fp8DotCount);
    Value rhsValues = dequantizeBlocks(builder, loc, held(rhs.value),
                                       rhs.scale, 1, operandType(1));
    result = shlo::buildDotGeneral(
        builder, dot, lhsValues, rhsValues, dims,
        RankedTensorType::get({m, n}, resultType.getElementType()));
    gemm = result.getDefiningOp();
  }
  shlo::markDecision(gemm, attr::kFp8Marker, fp8DotCount++);
  if (resultType.getShape() != llvm::ArrayRef<int64_t>{m, n})
    result = shlo::buildReshape(builder, loc, result, resultType.getShape());
  dot->getResult(0).replaceAllUsesWith(result);
  dot->erase();
}

FlatSymbolRefAttr
Fp8GemmsPass::scaledDotDecomposition(Operation *dot, TypeRange operandTypes,
                                     Type resultType) {
  ModuleOp module = getOperation();
  Location loc = dot->getLoc();
  auto function = func::FuncOp::create(
      loc, attr::kScaledDotComposite,
      FunctionType::get(&getContext(), operandTypes, {resultType}));
  function.setPrivate();
  // Unique among the module's symbols (one per dot): xla.scaled_dot_0, ...
  SymbolTable(module).insert(function);
  OpBuilder builder(&getContext());
  Block *body = function.addEntryBlock();
  builder.setInsertionPointToStart(body);
  // As jax.lax.scaled_dot's decomposition: dequantized in bf16 (exact).
  Type bf16 = builder.getBF16Type();
  Value lhs = dequantizeBlocks(builder, loc, body->getArgument(0),
                               body->getArgument(2), 1, bf16);
  Value rhs = dequantizeBlocks(builder, loc, body->getArgument(1),
                               body->getArgument(3), 1, bf16);
  Value product = shlo::buildDotGeneral(builder, dot, lhs, rhs,
                                        matrixDimensions(), resultType);
  product.getDefiningOp()->setDiscardableAttrs(builder.getDictionaryAttr({}));
  func::ReturnOp::create(builder, loc, product);
  return FlatSymbolRefAttr::get(function.getSymNameAttr());
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

void Fp8GemmsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (!optionError.empty()) {
    module.emitError() << optionError;
    return signalPassFailure();
  }
  auto main = module.lookupSymbol<func::FuncOp>("main");
  fp8DotCount = 0;
  quantizations.clear();
  bool partitioned = shlo::partitionCount(module) > 1;
  writeComposite = mxComposite && !partitioned;
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
  for (int64_t index : keepGemms)
    if (index < 0 || index >= static_cast<int64_t>(dots.size())) {
      module.emitError() << "invalid option 'keep-gemms': no low-precision "
                            "dot "
                         << index << " (the module has " << dots.size()
                         << (dots.size() ? ", numbered 0 to " +
                                               std::to_string(dots.size() - 1)
                                         : std::string())
                         << "; the report's gemm_index)";
      return signalPassFailure();
    }
  if (llvm::Error error = scopeRules.check(module)) {
    module.emitError() << llvm::toString(std::move(error));
    return signalPassFailure();
  }
  llvm::SmallVector<GemmCandidate> candidates = decideFp8(dots, gradients);
  for (auto [index, candidate] : llvm::enumerate(candidates)) {
    Operation *dot = candidate.dot;
    if (candidate.ineligible) {
      annotateIneligible(dot, index, *candidate.ineligible);
      continue;
    }
    llvm::SmallVector<OperandPlan, 2> &plans = candidate.plans;
    OpBuilder builder(dot);
    bool delayed = scalingMode == Fp8Scaling::Delayed && main &&
                   dot->getParentOp() == main.getOperation();
    llvm::SmallVector<Quantized, 2> operands;
    std::string formats, separator;
    for (auto [index, plan] : llvm::enumerate(plans)) {
      operands.push_back(quantize(builder, dot, index, plan,
                                  delayed ? main : func::FuncOp()));
      formats += separator + (isa<Float8E5M2Type>(plan.format) ? "f8e5m2"
                                                               : "f8e4m3fn");
      separator = " x ";
    }
    if (scalingMode == Fp8Scaling::Mxfp8) {
      annotate(dot, index,
               formats + ", mxfp8 (blocks of 32, E8M0 scales" +
                   (writeComposite ? ", xla.scaled_dot)"
                    : mxComposite
                        ? ", dequantized: XLA does not partition "
                          "xla.scaled_dot)"
                        : ", dequantized)"),
               fp8DotCount);
      replaceWithBlockScaledDot(builder, dot, operands[0], operands[1]);
      continue;
    }
    annotate(dot, index,
             formats + (delayed ? ", delayed scaling"
                        : scalingMode == Fp8Scaling::Rowwise
                            ? ", rowwise scaling"
                            : ", current scaling"),
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
