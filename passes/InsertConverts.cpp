//===- InsertConverts.cpp - Apply the precision decisions -----------------===//
//
// amp-insert-converts: PrecisionAnalysis decides; this file only applies its
// decisions. Values are retyped, each value is converted at most once per
// target type, values stored low are rounded right after their producer,
// and on cpu the lowered dots take the one form XLA:CPU runs.
//
//===----------------------------------------------------------------------===//

#include "Calls.h"
#include "Contract.h"
#include "CpuDotLayout.h"
#include "PassSupport.h"
#include "Passes.h"
#include "Policy.h"
#include "PrecisionAnalysis.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPINSERTCONVERTSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// Applies a PrecisionAnalysis to its module. All reads of the decisions
/// happen in `plan`, before anything changes.
class ConvertRewriter {
public:
  ConvertRewriter(ModuleOp module, const PrecisionAnalysis &analysis,
                  bool annotate)
      : module(module), analysis(analysis), annotate(annotate),
        strict(analysis.options().strict), builder(module.getContext()) {}

  /// Applies the decisions; returns whether float constants saturated.
  bool run();

private:
  struct PendingUse {
    OpOperand *operand;
    Type wanted;
    /// Strict: the user computes in f32 on a value rounded to the compute
    /// dtype's precision (`wanted` is the f32 type).
    bool rounded = false;
    /// A gate reads the compute-dtype copy other readers take, widened
    /// (`wanted` is that copy's type).
    bool throughCopy = false;
  };

  ModuleOp module;
  const PrecisionAnalysis &analysis;
  bool annotate;
  bool strict;
  OpBuilder builder;
  bool saturated = false;
  // The plan.
  llvm::SmallVector<PendingUse> pending;
  llvm::SmallVector<std::pair<Value, Type>> retyped;
  llvm::SmallVector<Operation *> lowBodies;
  llvm::SmallVector<Operation *> lowDots;
  llvm::SmallVector<Operation *> lowConstants;
  /// One convert per (value, type).
  llvm::DenseMap<std::pair<Value, Type>, Value> converted;
  /// One widened, held copy per value a gate reads.
  llvm::DenseMap<Value, Value> widenedCopies;
  /// Strict: results in the compute dtype kept f32 (program order), and the
  /// values known to hold compute-dtype values in f32.
  llvm::SmallVector<Value> heldFull;
  llvm::DenseSet<Value> roundedValues;
  /// Strict: one reduce_precision per value.
  llvm::DenseMap<Value, Value> roundings;
  /// Backward-pass ops that read a forward value stored low in the compute
  /// dtype where others read it in f32, and each stored value's rounding
  /// with the barrier that holds it.
  llvm::DenseSet<Operation *> backwardReadersOfStored;
  llvm::SmallVector<std::pair<Value, Value>> heldCopies;

  bool isLowConstant(Value value) const;
  bool isHeldFull(Value value) const;
  bool wantsRounded(OpOperand &operand, Type wanted) const;
  bool isRounded(Value value) const;
  void roundHeldResults();
  Value roundOnce(Value value);
  Type physicalType(Value value) const;
  void plan();
  void planCapturedUses(Operation *op);
  void lowerBodies();
  void storeLow();
  void insertConverts();
  void readStoredAcrossPasses();
  Value convertOnce(Value value, Type wanted);
  struct HeldCopy {
    Value low, held, back;
  };
  HeldCopy holdLowCopy(Value value, Type lowType);
  Value readCopy(Value value, Type lowType);
  void eraseDeadConstants();
  void updateSignatures();
  void canonicalizeCpuDots();
  void mark(Value value) {
    if (annotate)
      value.getDefiningOp()->setAttr(attr::kInserted, builder.getUnitAttr());
  }
};

// A lowered constant stays as it is for its f32 users; each user that wants
// the compute dtype gets one re-encoded copy.
bool ConvertRewriter::isLowConstant(Value value) const {
  Operation *def = value.getDefiningOp();
  return def && shlo::isConstant(def) && analysis.isDecided(def) &&
         analysis.decision(def).low;
}

Type ConvertRewriter::physicalType(Value value) const {
  return isLowConstant(value) || isHeldFull(value) ? value.getType()
                                                   : analysis.newType(value);
}

// Strict: what an op without regions computes in the compute dtype stays
// f32, rounded right after by a reduce_precision (roundHeldResults). XLA
// computes low-precision arithmetic in f32 and may drop the roundings in
// between (excess precision); it never drops a reduce_precision.
bool ConvertRewriter::isHeldFull(Value value) const {
  Operation *def = value.getDefiningOp();
  return strict && def && def->getNumRegions() == 0 &&
         !shlo::isConstant(def) && analysis.isDecided(def) &&
         shlo::getFloatElementType(value.getType()) == analysis.fullType() &&
         shlo::getFloatElementType(analysis.newType(value)) ==
             analysis.computeType();
}

// Strict: a painted op that computes elementwise reads its low-precision
// operands as rounded f32 values; matrix multiplies, converts, ops with
// regions and returns take real compute-dtype values.
bool ConvertRewriter::wantsRounded(OpOperand &operand, Type wanted) const {
  Operation *user = operand.getOwner();
  if (!strict || user->getNumRegions() != 0 || !analysis.isDecided(user) ||
      shlo::getFloatElementType(wanted) != analysis.computeType())
    return false;
  OpClass cls = analysis.decision(user).cls;
  return cls == OpClass::Infer || cls == OpClass::Clear ||
         cls == OpClass::Deny;
}

bool ConvertRewriter::isRounded(Value value) const {
  if (roundedValues.contains(value))
    return true;
  Operation *def = value.getDefiningOp();
  // Widened from the compute dtype (a stored value's read-back).
  return def && shlo::isConvert(def) &&
         shlo::getFloatElementType(def->getOperand(0).getType()) ==
             analysis.computeType();
}

Value ConvertRewriter::roundOnce(Value value) {
  Value &rounding = roundings[value];
  if (rounding)
    return rounding;
  if (auto arg = dyn_cast<BlockArgument>(value))
    builder.setInsertionPointToStart(arg.getOwner());
  else
    builder.setInsertionPointAfter(value.getDefiningOp());
  rounding = shlo::buildReducePrecision(builder, value.getLoc(), value,
                                        analysis.computeType());
  roundedValues.insert(rounding);
  mark(rounding);
  return rounding;
}

/// Strict: each held result is rounded once, right after its producer, and
/// read rounded. Data movement, max/min, select and the like make rounded
/// values of rounded operands, and need no rounding of their own.
void ConvertRewriter::roundHeldResults() {
  for (Value value : heldFull) {
    Operation *def = value.getDefiningOp();
    bool exactOfOperands =
        analysis.decision(def).cls == OpClass::Clear &&
        llvm::any_of(def->getOperandTypes(), [](Type t) {
          return static_cast<bool>(shlo::getFloatElementType(t));
        });
    if (exactOfOperands) {
      roundedValues.insert(value);
      continue;
    }
    Value rounding = roundOnce(value);
    value.replaceAllUsesExcept(rounding, rounding.getDefiningOp());
  }
}

void ConvertRewriter::plan() {
  auto noteValue = [&](Value value) {
    Type type = physicalType(value);
    if (type != value.getType())
      retyped.push_back({value, type});
  };
  for (auto func : module.getOps<func::FuncOp>())
    for (BlockArgument arg : func.getArguments())
      noteValue(arg);
  for (Operation *op : analysis.ops()) {
    for (OpOperand &operand : op->getOpOperands()) {
      Type wanted = analysis.wantedType(operand);
      if (analysis.readsComputeCopy(operand))
        pending.push_back({&operand,
                           shlo::withElementType(operand.get().getType(),
                                                 analysis.computeType()),
                           /*rounded=*/false, /*throughCopy=*/true});
      else if (wantsRounded(operand, wanted))
        pending.push_back({&operand,
                           shlo::withElementType(wanted, analysis.fullType()),
                           /*rounded=*/true});
      else if (wanted != physicalType(operand.get()))
        pending.push_back({&operand, wanted});
    }
    for (Value result : op->getResults()) {
      noteValue(result);
      if (isHeldFull(result))
        heldFull.push_back(result);
    }
    if (analysis.lowersBody(op))
      lowBodies.push_back(op);
    if (shlo::hasApplierRegions(op))
      planCapturedUses(op);
    if (shlo::isDotGeneral(op) && analysis.decision(op).low)
      lowDots.push_back(op);
    if (shlo::isConstant(op) && analysis.decision(op).low)
      lowConstants.push_back(op);
  }
  // A forward value stored low whose held copy the backward pass reads in
  // f32 anyway: its low backward readers read that copy as well.
  for (Value value : analysis.storedValues()) {
    if (analysis.inBackwardPass(value))
      continue;
    llvm::SmallVector<Operation *> lowReaders;
    bool fullReader = false;
    for (OpOperand &use : value.getUses()) {
      Operation *user = use.getOwner();
      if (!llvm::any_of(user->getResults(), [&](Value result) {
            return analysis.inBackwardPass(result);
          }))
        continue;
      if (analysis.isFull(analysis.wantedType(use)))
        fullReader = true;
      else
        lowReaders.push_back(user);
    }
    if (fullReader)
      backwardReadersOfStored.insert(lowReaders.begin(), lowReaders.end());
  }
}

/// Values a reduction body captures from outside (jax.export hoists a
/// comparator's constants) take the body's precision.
void ConvertRewriter::planCapturedUses(Operation *op) {
  bool low = analysis.lowersBody(op);
  op->walk([&](Operation *inner) {
    if (inner == op)
      return;
    for (OpOperand &operand : inner->getOpOperands()) {
      Value value = operand.get();
      if (shlo::getFloatElementType(value.getType()) != analysis.fullType() ||
          op->isAncestor(value.getParentRegion()->getParentOp()))
        continue;
      Type wanted = low ? shlo::withElementType(value.getType(),
                                                analysis.computeType())
                        : value.getType();
      if (wanted != physicalType(value))
        pending.push_back({&operand, wanted});
    }
  });
}

/// Reduction bodies of lowered reductions compute in the compute dtype.
void ConvertRewriter::lowerBodies() {
  FloatType full = analysis.fullType(), compute = analysis.computeType();
  auto lower = [&](Value value) {
    if (shlo::getFloatElementType(value.getType()) == full)
      value.setType(shlo::withElementType(value.getType(), compute));
  };
  for (Operation *op : lowBodies) {
    for (Region &region : op->getRegions()) {
      region.walk([&](Block *block) {
        for (BlockArgument arg : block->getArguments())
          lower(arg);
      });
      region.walk([&](Operation *inner) {
        if (shlo::isConstant(inner) &&
            shlo::getFloatElementType(inner->getResult(0).getType()) == full) {
          if (shlo::reencodeConstantInPlace(inner, compute, &saturated))
            return;
          // Not dense float elements (a resource blob): convert it instead
          // of retyping a constant whose value stays f32.
          builder.setInsertionPointAfter(inner);
          Value cast =
              shlo::buildConvert(builder, inner->getLoc(), inner->getResult(0),
                                 compute);
          inner->getResult(0).replaceAllUsesExcept(cast,
                                                   cast.getDefiningOp());
          mark(cast);
          return;
        }
        for (Value result : inner->getResults())
          lower(result);
      });
    }
  }
}

Value ConvertRewriter::convertOnce(Value value, Type wanted) {
  Value &replacement = converted[{value, wanted}];
  if (replacement)
    return replacement;
  if (auto arg = dyn_cast<BlockArgument>(value))
    builder.setInsertionPointToStart(arg.getOwner());
  else
    builder.setInsertionPointAfter(value.getDefiningOp());
  Type element = shlo::getFloatElementType(wanted);
  Operation *def = value.getDefiningOp();
  if (def && shlo::isConstant(def))
    replacement =
        shlo::buildReencodedConstant(builder, def, element, &saturated);
  if (!replacement)
    replacement = shlo::buildConvert(builder, value.getLoc(), value, element);
  mark(replacement);
  return replacement;
}

/// `value` rounded to `lowType` (one convert per value and type), held by
/// an optimization barrier, and that held copy widened back to `value`'s
/// type. A chain of converts alone would be folded by XLA:GPU's
/// simplify-fp-conversions into the original (see storeLow).
ConvertRewriter::HeldCopy ConvertRewriter::holdLowCopy(Value value,
                                                       Type lowType) {
  Value low = convertOnce(value, lowType);
  builder.setInsertionPointAfter(low.getDefiningOp());
  Value held = shlo::buildOptimizationBarrier(builder, value.getLoc(),
                                              ValueRange{low})
                   ->getResult(0);
  Value back = shlo::buildConvert(builder, value.getLoc(), held,
                                  shlo::getFloatElementType(value.getType()));
  mark(back);
  return {low, held, back};
}

/// The copy a gate reads: `value`'s compute-dtype rounding, widened.
Value ConvertRewriter::readCopy(Value value, Type lowType) {
  Value &widened = widenedCopies[value];
  if (!widened)
    widened = holdLowCopy(value, lowType).back;
  return widened;
}

/// A value stored low is rounded once, right after its producer; its
/// low-precision readers use the rounded value and its f32 readers one
/// convert of it back, so nothing reads the f32 original and XLA keeps only
/// the rounded buffer. An optimization barrier holds the rounded value:
/// XLA:GPU's simplify-fp-conversions (on under the default
/// xla_allow_excess_precision) removes any chain of converts, and would
/// turn f32 -> bf16 -> f32 back into the f32 original; a barrier is never
/// folded, and XLA expands it only after scheduling.
void ConvertRewriter::storeLow() {
  FloatType compute = analysis.computeType();
  for (auto [index, stored] : llvm::enumerate(analysis.storedValues())) {
    Value value = stored;
    Type lowType = shlo::withElementType(value.getType(), compute);
    HeldCopy copy = holdLowCopy(value, lowType);
    Value low = copy.low, back = copy.back;
    shlo::markDecision(low.getDefiningOp(), attr::kStoredMarker, index);
    value.replaceUsesWithIf(back, [&](OpOperand &use) {
      return use.getOwner() != low.getDefiningOp();
    });
    // Readers that want the compute dtype read the rounded value itself.
    converted[{back, lowType}] = low;
    heldCopies.push_back({low, copy.held});
  }
}

void ConvertRewriter::insertConverts() {
  for (const PendingUse &use : pending) {
    Value value = use.operand->get();
    if (use.throughCopy)
      use.operand->set(readCopy(value, use.wanted));
    else if (!use.rounded)
      use.operand->set(convertOnce(value, use.wanted));
    else if (value.getType() != use.wanted)
      use.operand->set(convertOnce(value, use.wanted)); // widened: exact
    else if (!isRounded(value))
      use.operand->set(roundOnce(value));
  }
}

/// Where the backward pass reads a stored forward value's held copy in
/// f32, its low readers there read that copy too: one that read the
/// rounding before the barrier would keep the rounding alive beside the held
/// copy, or amp-rematerialize would recompute it for them, and neither frees
/// anything. Forward readers keep reading it before the barrier, in the
/// kernel that makes it.
void ConvertRewriter::readStoredAcrossPasses() {
  for (auto [low, held] : heldCopies)
    low.replaceUsesWithIf(held, [&](OpOperand &use) {
      return backwardReadersOfStored.contains(use.getOwner());
    });
}

void ConvertRewriter::eraseDeadConstants() {
  for (Operation *op : lowConstants)
    if (op->use_empty())
      op->erase();
}

/// Function signatures follow their arguments and returns.
void ConvertRewriter::updateSignatures() {
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func.isExternal())
      continue;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      func.removeArgAttr(i, attr::kKeepDtype);
    Operation *terminator = func.getBody().back().getTerminator();
    func.setFunctionType(
        FunctionType::get(func.getContext(), func.front().getArgumentTypes(),
                          terminator->getOperandTypes()));
  }
}

void ConvertRewriter::canonicalizeCpuDots() {
  const PrecisionOptions &options = analysis.options();
  if (options.target != Target::Cpu || !analysis.computeType().isBF16() ||
      options.dotResult != DotResult::F32)
    return;
  // The new dot keeps the old one's attributes, its decision included.
  // A dot made in the compute dtype (reduce-dtype=compute) is no mixed dot:
  // XLA:CPU runs it as it is.
  for (Operation *dot : lowDots)
    if (analysis.isFull(dot->getResult(0).getType()))
      canonicalizeDotForCpu(dot);
}

bool ConvertRewriter::run() {
  plan();
  for (auto [value, type] : retyped)
    value.setType(type);
  lowerBodies();
  roundHeldResults();
  // Stored values first: their low readers then share the stored convert.
  storeLow();
  insertConverts();
  readStoredAcrossPasses();
  eraseDeadConstants();
  updateSignatures();
  canonicalizeCpuDots();
  return saturated;
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

class InsertConvertsPass final
    : public amp::impl::AmpInsertConvertsPassBase<InsertConvertsPass> {
public:
  using AmpInsertConvertsPassBase::AmpInsertConvertsPassBase;

  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;

private:
  PrecisionOptions parsed;
  OptionCheck options;

  llvm::Error parseOptions();
  /// keep-f32, force-compute and scopes: the per-op and per-layer overrides.
  llvm::Error parseOverrides();
  void annotateDecisions(const PrecisionAnalysis &analysis);
};

/// Names in keep-f32/force-compute must be StableHLO or CHLO ops.
llvm::Error parseOpNames(llvm::StringRef option,
                         llvm::ArrayRef<std::string> names,
                         llvm::StringSet<> &into) {
  for (const std::string &name : names) {
    llvm::Expected<std::string> qualified = shlo::checkedOpName(option, name);
    if (!qualified)
      return qualified.takeError();
    into.insert(*qualified);
  }
  return llvm::Error::success();
}

llvm::Error InsertConvertsPass::parseOverrides() {
  if (llvm::Error error = parseOpNames("keep-f32", keepF32, parsed.keepF32))
    return error;
  if (llvm::Error error =
          parseOpNames("force-compute", forceCompute, parsed.forceCompute))
    return error;
  for (const auto &entry : parsed.forceCompute)
    if (parsed.keepF32.contains(entry.getKey()))
      return llvm::createStringError("op '" + entry.getKey() +
                                     "' is named in both keep-f32 and "
                                     "force-compute");
  if (llvm::Error error =
          ScopeOverrides::parse(scopes).moveInto(parsed.scopes))
    return error;
  if (parsed.scopes.has(ScopeChoice::F8) &&
      parsed.policy.gemm == GemmDtype::Compute)
    return llvm::createStringError(
        "invalid option 'scopes': f8 puts a scope's GEMMs in FP8, and "
        "policy " +
        parsed.policy.str() + " has none: add gemm=f8 to the policy");
  return llvm::Error::success();
}

llvm::Error InsertConvertsPass::parseOptions() {
  llvm::Expected<Policy> policyOr = parsePolicy(policy);
  if (!policyOr)
    return llvm::createStringError("invalid policy: " +
                                   llvm::toString(policyOr.takeError()));
  parsed.policy = *policyOr;
  if (llvm::Error error =
          readOption("target", parseTarget(target), parsed.target))
    return error;
  if (llvm::Error error =
          readOption("level", parseLevel(level, parsed.target), parsed.level))
    return error;
  if (llvm::Error error = readOption(
          "dot-result",
          parseDotResult(dotResult, parsed.target, parsed.policy.compute),
          parsed.dotResult))
    return error;
  if (llvm::Error error = readOption(
          "storage", parseStorage(storage, parsed.target), parsed.storage))
    return error;
  if (llvm::Error error = parseOverrides())
    return error;
  parsed.strict = strict;
  if (llvm::Error error = readOption(
          "reduce-dtype", parseReduceDtype(reduceDtype, parsed.policy.compute),
          parsed.reduceDtype))
    return error;
  if (llvm::Error error =
          readOption("decisions", parseDecisions(decisions), parsed.decisions))
    return error;
  if (storageMinElements < 1)
    return llvm::createStringError(
        "invalid option 'storage-min-elements': must be at least 1, got " +
        std::to_string(storageMinElements));
  parsed.storageMinElements = storageMinElements;
  for (int64_t group : keepGroups) {
    if (group < 0)
      return llvm::createStringError(
          "invalid option 'keep-groups': negative group " +
          std::to_string(group));
    parsed.keepGroups.insert(group);
  }
  return llvm::Error::success();
}

LogicalResult InsertConvertsPass::initialize(MLIRContext *context) {
  options.keep(parseOptions());
  return success();
}

void InsertConvertsPass::annotateDecisions(const PrecisionAnalysis &analysis) {
  Builder b(&getContext());
  llvm::DenseMap<Value, int64_t> storedIndex;
  for (auto [index, value] : llvm::enumerate(analysis.storedValues()))
    storedIndex[value] = index;
  for (Operation *op : analysis.ops()) {
    if (isa<func::ReturnOp>(op) || shlo::isRegionReturn(op) ||
        !analysis.isDecided(op))
      continue;
    auto touchesFloat = [](Type t) {
      return static_cast<bool>(shlo::getFloatElementType(t));
    };
    if (!llvm::any_of(op->getOperandTypes(), touchesFloat) &&
        !llvm::any_of(op->getResultTypes(), touchesFloat))
      continue;
    const OpDecision &d = analysis.decision(op);
    Precision precision = analysis.precisionOf(op);
    Reason reason = d.reason;
    if (precision == Precision::Unchanged)
      reason = d.cls == OpClass::Allow ? Reason::OperandsAlreadyLow
                                       : Reason::NoF32Values;
    llvm::SmallVector<NamedAttribute> fields = {
        b.getNamedAttr(decision_key::kPrecision,
                       b.getStringAttr(precisionId(precision))),
        b.getNamedAttr(decision_key::kReason, b.getStringAttr(reasonId(reason)))};
    if (!d.detail.empty() && precision != Precision::Unchanged)
      fields.push_back(
          b.getNamedAttr(decision_key::kDetail, b.getStringAttr(d.detail)));
    if (d.group >= 0)
      fields.push_back(
          b.getNamedAttr(decision_key::kGroup, b.getI64IntegerAttr(d.group)));
    // The index of a stored value is its survival marker's (storeLow).
    for (Value result : op->getResults())
      if (auto it = storedIndex.find(result); it != storedIndex.end())
        fields.push_back(b.getNamedAttr(decision_key::kStored,
                                        b.getI64IntegerAttr(it->second)));
    op->setAttr(attr::kDecision, b.getDictionaryAttr(fields));
  }
}

void InsertConvertsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(options.report(module)))
    return signalPassFailure();
  if (parsed.level == Level::O0)
    return;
  // Rules follow calls: each call site is decided in its own context.
  inlinePrivateCalls(module);
  if (llvm::Error error = parsed.scopes.check(module)) {
    module.emitError() << llvm::toString(std::move(error));
    return signalPassFailure();
  }
  PrecisionAnalysis analysis(module, parsed);
  if (analysis.dependsOnPartitions())
    module->setAttr(attr::kPartitionDependent, UnitAttr::get(&getContext()));
  // Decisions are attached before rewriting, while every op is where the
  // analysis saw it; the CPU dot rewrite carries them to the new dots.
  if (report)
    annotateDecisions(analysis);
  if (ConvertRewriter(module, analysis, report).run())
    module.emitWarning() << "float constants out of range of "
                         << dtypeName(parsed.policy.compute)
                         << " were saturated to its largest finite value";
}

} // namespace
