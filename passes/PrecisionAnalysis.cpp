//===- PrecisionAnalysis.cpp - Decide the precision of every value --------===//
//
// The painting follows TF grappler's auto_mixed_precision (deny propagates
// forward, infer/clear ops between two allow ops go low, clear ops follow
// their neighbours), adapted to f32-accumulating dots: an allow op's result
// stays f32 and is rounded only where a low-precision consumer needs it.
// Before painting, the values that feed discrete decisions or linear algebra
// are pinned to f32 back through their producers; after it, large f32
// results that are read again far away are marked for low-precision storage,
// and a gradient a GEMM wrote in bf16 stays bf16 where forward values scale
// it.
//
//===----------------------------------------------------------------------===//

#include "PrecisionAnalysis.h"
#include "Backward.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;
using namespace mlir::amp;

PrecisionAnalysis::PrecisionAnalysis(ModuleOp module,
                                     const PrecisionOptions &options)
    : opts(options) {
  MLIRContext *context = module.getContext();
  full = Float32Type::get(context);
  compute = dtypeType(context, options.policy.compute);
  param = dtypeType(context, options.policy.param);
  output = dtypeType(context, options.policy.output);
  if (options.level == Level::O0)
    return;
  collect(module);
  assignGroups();
  keepExactCones();
  paint();
  explainFullPrecision();
  if (options.storage == Storage::Compute && compute != full)
    decideStorage();
  if (compute == full)
    return;
  backward = backwardValues(module);
  if (options.reduceDtype == ReduceDtype::Compute)
    reduceInComputeDtype();
  if (options.target != Target::Cpu) {
    keepGradientProductsLow();
    keepPartitionedNormTermsLow(shlo::partitionCount(module) > 1);
  }
}

/// reduce-dtype=compute: the backward pass's low-precision GEMMs write
/// their results in the compute dtype (rounded once, after f32
/// accumulation), so where XLA partitions one along its contraction (a
/// weight gradient summed over a batch split across devices, an activation
/// gradient over a split weight) the partial sums it reduces across devices
/// are compute-dtype values, as a hand-cast step's are.
void PrecisionAnalysis::reduceInComputeDtype() {
  for (Operation *op : order) {
    const OpDecision &d = decision(op);
    if (d.cls != OpClass::Allow || !d.low || op->getNumResults() != 1 ||
        !backward.contains(op->getResult(0)) || !isFull(op->getResult(0)))
      continue;
    lowResultDots.insert(op);
    // A result stored low is now made low: nothing is left to round.
    if (stored.erase(op->getResult(0)))
      llvm::erase(storedOrder, op->getResult(0));
  }
}

/// A gradient that a matrix multiply wrote in the compute dtype (rounded
/// once, after f32 accumulation) stays in it while forward values scale
/// it: layer norm's backward pass multiplies dy by gamma, rstd and x - mean,
/// GELU's by gelu'(h), softmax's by its exponential. In f32 those products
/// keep digits dy has lost already, and XLA writes them in f32 between its
/// kernels: three per layer norm, where a hand cast writes two in bf16
/// (docs/DESIGN.md, "Decisions with a price"). The sums, differences and
/// reductions that read them stay f32. Only for bf16, which has f32's
/// exponent range: an f16 product can overflow or flush to zero where the
/// f32 one would not. The other factor is a forward value
/// (a parameter, a statistic, an activation): a scalar (a loss scale, an
/// optimizer's coefficient) or an f32 gradient keeps the product f32.
void PrecisionAnalysis::keepGradientProductsLow() {
  if (opts.policy.compute != Dtype::BF16)
    return;
  auto lowGradient = [&](Value value) {
    return backward.contains(value) &&
           shlo::getFloatElementType(newType(value)) == compute;
  };
  auto forwardFactor = [&](Value value) {
    return !backward.contains(value) && !shlo::isScalarSplat(value);
  };
  forEachBackwardProduct(lowGradient, forwardFactor, [&](Operation *op) {
    makeLow(op, Reason::ScalesLowGradient);
  });
}

/// In a partitioned program, layer norm's (and batch norm's) backward
/// terms that multiply centred forward data by a per-row gradient
/// statistic, such as (x - mean) dvar, are made in the compute dtype as
/// well. XLA's partitioner computes them where the forward data
/// lives and moves them to where the input gradient is summed: in f32 that
/// is an all-to-all of twice the bytes a hand cast moves (72 MiB per
/// device on the bench's FSDP LM). On one device nothing is moved, the f32
/// product fuses into the sum that reads it, and rounding it would only add
/// kernels, so the rule waits for a partitioned program; in one that is
/// not, it only records that it would apply (`dependsOnPartitions`). The
/// sum stays f32. Softmax's p sum(p dp) is not one of these terms: p is
/// not centred, and p dp - p sum(p dp) cancels where dp is nearly constant
/// along a row.
void PrecisionAnalysis::keepPartitionedNormTermsLow(bool partitioned) {
  // Without a backward pass no product matches: skip classifying values.
  if (opts.policy.compute != Dtype::BF16 || backward.empty())
    return;
  llvm::DenseSet<Value> centred = classifyValues().centred;
  // A backward value broadcast from fewer elements: a per-row statistic.
  auto rowStatisticGradient = [&](Value value) {
    if (!backward.contains(value) || !isFull(newType(value)))
      return false;
    Operation *def = value.getDefiningOp();
    if (!def || !shlo::is(def, "broadcast_in_dim") ||
        shlo::isScalarSplat(value))
      return false;
    std::optional<int64_t> from =
        shlo::numElements(def->getOperand(0).getType());
    std::optional<int64_t> to = shlo::numElements(value.getType());
    return from && to && *from < *to;
  };
  auto centredForward = [&](Value value) {
    return !backward.contains(value) && centred.contains(value);
  };
  forEachBackwardProduct(centredForward, rowStatisticGradient,
                         [&](Operation *op) {
                           if (partitioned)
                             makeLow(op, Reason::PartitionedNormTerm);
                           else
                             partitionDependent = true;
                         });
}

void PrecisionAnalysis::forEachBackwardProduct(
    llvm::function_ref<bool(Value)> first,
    llvm::function_ref<bool(Value)> second,
    llvm::function_ref<void(Operation *)> visit) {
  for (Operation *op : order) {
    const OpDecision &d = decision(op);
    if (!shlo::is(op, "multiply") || d.low || !paintable(d) ||
        !isFull(op->getResult(0)) || !backward.contains(op->getResult(0)))
      continue;
    Value lhs = op->getOperand(0), rhs = op->getOperand(1);
    if ((first(lhs) && second(rhs)) || (first(rhs) && second(lhs)))
      visit(op);
  }
}

void PrecisionAnalysis::makeLow(Operation *op, Reason reason) {
  OpDecision &d = at(op);
  d.low = true;
  d.reason = reason;
  // Made low now: nothing is left to round.
  if (stored.erase(op->getResult(0)))
    llvm::erase(storedOrder, op->getResult(0));
}

//===----------------------------------------------------------------------===//
// Graph
//===----------------------------------------------------------------------===//

bool PrecisionAnalysis::isFull(Type type) const {
  return shlo::getFloatElementType(type) == full;
}

bool PrecisionAnalysis::paintable(const OpDecision &d) const {
  return (d.cls == OpClass::Infer || d.cls == OpClass::Clear) &&
         !d.forcedHigh && !d.forcedLow;
}

const OpDecision &PrecisionAnalysis::decision(Operation *op) const {
  static const OpDecision undecided;
  auto it = decisions.find(op);
  return it == decisions.end() ? undecided : it->second;
}

Operation *PrecisionAnalysis::decidedOwner(Operation *op) const {
  while (op && !decisions.count(op)) {
    Operation *parent = op->getParentOp();
    if (!parent || !shlo::hasApplierRegions(parent))
      return nullptr;
    op = parent;
  }
  return op;
}

llvm::SmallVector<Operation *> PrecisionAnalysis::floatUsers(Operation *op) const {
  llvm::SmallVector<Operation *> users;
  for (Value result : op->getResults()) {
    if (!isFull(result))
      continue;
    // A use inside a reduction body (a captured value) is a use by the
    // reduction.
    for (Operation *user : result.getUsers())
      if (Operation *owner = decidedOwner(user))
        users.push_back(owner);
  }
  return users;
}

llvm::SmallVector<Operation *>
PrecisionAnalysis::floatProducers(Operation *op) const {
  llvm::SmallVector<Operation *> producers;
  for (Value operand : op->getOperands())
    if (isFull(operand))
      if (Operation *def = operand.getDefiningOp())
        if (decisions.count(def))
          producers.push_back(def);
  return producers;
}

OpDecision PrecisionAnalysis::decideClass(Operation *op) {
  Classification classification = classify(op);
  OpDecision d;
  d.cls = classification.cls;
  d.reason = classification.reason;
  d.detail = classification.detail;
  // An existing convert of a float is an explicit choice of precision; a
  // convert from an integer or boolean merely materialises a float.
  if (d.cls == OpClass::Convert &&
      !shlo::getFloatElementType(op->getOperand(0).getType())) {
    d.cls = OpClass::Clear;
    d.detail = "integer-to-float convert";
  }
  applyOverrides(op, d);
  if (d.cls != OpClass::Allow || opts.target != Target::Cpu || d.forcedLow)
    return d;
  if (shlo::isConvolution(op)) {
    // XLA:CPU upcasts every bf16/f16 convolution: lowering one would only
    // add converts and rounding.
    d.cls = OpClass::Fixed;
    d.reason = Reason::CpuConvolution;
  } else if (compute.isBF16() && opts.dotResult == DotResult::F32) {
    auto staticShape = [](Value v) {
      return cast<ShapedType>(v.getType()).hasStaticShape();
    };
    // Only the NT-canonical form of a mixed dot is safe on XLA:CPU, and it
    // can only be built for static shapes.
    if (!shlo::getDotDimensions(op) || !staticShape(op->getOperand(0)) ||
        !staticShape(op->getOperand(1))) {
      d.cls = OpClass::Fixed;
      d.reason = Reason::CpuDynamicDot;
    }
  }
  return d;
}

void PrecisionAnalysis::applyOverrides(Operation *op, OpDecision &d) const {
  // Op-name overrides keep the class's detail; the others name theirs.
  auto force = [&](bool high, Reason reason,
                   std::optional<llvm::StringRef> detail = std::nullopt) {
    d.forcedHigh = high;
    d.forcedLow = !high;
    d.reason = reason;
    if (detail)
      d.detail = detail->str();
  };
  // An explicit convert is the user's choice of precision; ops that keep
  // their types have none to change.
  bool changeable = d.cls != OpClass::Fixed && d.cls != OpClass::Convert;
  std::string name = op->getName().getStringRef().str();
  if (opts.keepF32.contains(name))
    force(true, Reason::KeepF32);
  else if (opts.forceCompute.contains(name) && changeable)
    force(false, Reason::ForceCompute);
  // precision=HIGHEST (or HIGH) on a dot is the user's request for f32
  // operands; JAX's transpose rules give the backward dots the same one.
  if (d.cls == OpClass::Allow)
    if (llvm::StringRef asked = shlo::requestedPrecision(op); !asked.empty())
      force(true, Reason::PrecisionRequested, asked);
  if (const ScopeRule *rule = opts.scopes.ruleFor(op); rule && changeable) {
    if (rule->choice == ScopeChoice::F32)
      force(true, Reason::ScopeF32, rule->pattern);
    else if (rule->choice == ScopeChoice::Compute)
      force(false, Reason::ScopeCompute, rule->pattern);
  }
}

void PrecisionAnalysis::collect(ModuleOp module) {
  module.walk<WalkOrder::PreOrder>([&](Operation *op) -> WalkResult {
    if (op == module.getOperation() || isa<func::FuncOp>(op))
      return WalkResult::advance();
    if (auto call = dyn_cast<func::CallOp>(op))
      callSites[call.getCalleeAttr().getAttr()].push_back(op);
    else if (FlatSymbolRefAttr callee = shlo::compositeDecomposition(op))
      callSites[callee.getAttr()].push_back(op);
    decisions[op] = decideClass(op);
    order.push_back(op);
    return shlo::hasApplierRegions(op) ? WalkResult::skip()
                                       : WalkResult::advance();
  });
}

void PrecisionAnalysis::assignGroups() {
  int64_t next = 0;
  for (Operation *op : order) {
    OpDecision &d = at(op);
    if (d.cls != OpClass::Allow ||
        !llvm::any_of(op->getOperands(), [&](Value v) { return isFull(v); }))
      continue;
    d.group = next++;
    if (opts.keepGroups.contains(d.group) && !d.forcedLow) {
      d.forcedHigh = true;
      d.reason = Reason::Calibration;
    }
  }
}

//===----------------------------------------------------------------------===//
// Exact cones: discrete decisions and linear algebra
//===----------------------------------------------------------------------===//

void PrecisionAnalysis::keepExactCones() {
  for (Operation *op : order) {
    if (std::optional<DiscreteDecision> decided = discreteDecision(op)) {
      OpDecision &d = at(op);
      if (!d.forcedLow && d.cls != OpClass::Fixed &&
          d.cls != OpClass::Convert) {
        d.forcedHigh = true;
        d.reason = Reason::DiscreteDecision;
        d.detail = decided->name;
      }
      for (unsigned index : decided->operands)
        keepExactBackFrom(op->getOperand(index), Reason::DiscreteDecision,
                          decided->name);
    } else if (std::optional<std::string> routine = linearAlgebraName(op)) {
      for (Value operand : op->getOperands())
        keepExactBackFrom(operand, Reason::LinearAlgebra, *routine);
    }
  }
}

void PrecisionAnalysis::keepExactBackFrom(Value start, Reason reason,
                                          llvm::StringRef detail) {
  llvm::SmallVector<Value> worklist = {start};
  while (!worklist.empty()) {
    Value value = worklist.pop_back_val();
    if (!isFull(value) || !exact.insert(value).second)
      continue;
    // Through calls and control flow: a private function's argument is its
    // call sites' operand; a loop-carried value is the loop's input and the
    // body's next value.
    if (auto arg = dyn_cast<BlockArgument>(value)) {
      worklist.append(flowsInto(arg));
      continue;
    }
    Operation *producer = value.getDefiningOp();
    if (!producer || !decisions.count(producer))
      continue;
    unsigned index = cast<OpResult>(value).getResultNumber();
    if (llvm::SmallVector<Value> sources = flowsOutOf(producer, index);
        !sources.empty()) {
      worklist.append(sources);
      continue;
    }
    // Stop at ops that keep their types (custom calls: their insides are
    // not ours) and at converts from another dtype (nothing upstream is
    // f32).
    OpDecision &d = at(producer);
    if (d.cls == OpClass::Fixed)
      continue;
    // decisions=gate: the nearest matrix multiply gates the decision; it
    // computes in f32 from what it reads, which keeps its own precision.
    bool gate = reason == Reason::DiscreteDecision &&
                opts.decisions == Decisions::Gate && d.cls == OpClass::Allow;
    if (!d.forcedHigh && !d.forcedLow) {
      d.forcedHigh = true;
      d.reason = gate ? Reason::GatesDecision : reason;
      d.detail = detail.str();
    }
    if (gate)
      continue;
    for (Value operand : producer->getOperands())
      worklist.push_back(operand);
  }
}

llvm::SmallVector<Value> PrecisionAnalysis::flowsInto(BlockArgument arg) const {
  llvm::SmallVector<Value> sources;
  Operation *owner = arg.getOwner()->getParentOp();
  unsigned index = arg.getArgNumber();
  if (auto func = dyn_cast<func::FuncOp>(owner)) {
    if (func.isPublic() || !arg.getOwner()->isEntryBlock())
      return sources;
    auto it = callSites.find(func.getSymNameAttr());
    if (it != callSites.end())
      for (Operation *call : it->second)
        if (index < call->getNumOperands())
          sources.push_back(call->getOperand(index));
  } else if (shlo::is(owner, "while") &&
             index < owner->getNumOperands()) {
    sources.push_back(owner->getOperand(index));
    Operation *next = owner->getRegion(1).front().getTerminator();
    if (next && index < next->getNumOperands())
      sources.push_back(next->getOperand(index));
  }
  return sources;
}

llvm::SmallVector<Value> PrecisionAnalysis::flowsOutOf(Operation *op,
                                                      unsigned index) const {
  llvm::SmallVector<Value> sources;
  auto returned = [&](Region &region) {
    if (region.empty())
      return;
    Operation *terminator = region.front().getTerminator();
    if (terminator && index < terminator->getNumOperands())
      sources.push_back(terminator->getOperand(index));
  };
  FlatSymbolRefAttr calleeName;
  if (auto call = dyn_cast<func::CallOp>(op))
    calleeName = call.getCalleeAttr();
  else
    calleeName = shlo::compositeDecomposition(op);
  if (calleeName) {
    auto callee =
        SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(op, calleeName);
    if (callee && !callee.isExternal())
      returned(callee.getBody());
  } else if (shlo::is(op, "while")) {
    sources.push_back(op->getOperand(index));
    returned(op->getRegion(1));
  } else if (shlo::is(op, "if") || shlo::is(op, "case")) {
    for (Region &branch : op->getRegions())
      returned(branch);
  }
  return sources;
}

//===----------------------------------------------------------------------===//
// Painting
//===----------------------------------------------------------------------===//

void PrecisionAnalysis::paint() {
  paintSeeds();
  if (opts.level == Level::O2) {
    markDenyDownstream();
    markBetweenAllow();
  }
  if (opts.level == Level::O2 || opts.level == Level::O3)
    pullClearOpsIntoLowProducers();
  followLowInputs();
}

void PrecisionAnalysis::paintSeeds() {
  for (Operation *op : order) {
    OpDecision &d = at(op);
    bool hasFullOperand =
        llvm::any_of(op->getOperands(), [&](Value v) { return isFull(v); });
    bool hasFull = hasFullOperand ||
                   llvm::any_of(op->getResults(),
                                [&](Value v) { return isFull(v); });
    if (!hasFull)
      continue;
    if (d.forcedLow)
      d.low = true;
    else if (d.forcedHigh)
      d.low = false;
    else if (d.cls == OpClass::Allow)
      // A dot whose operands are already low precision (an f32-accumulating
      // dot in the input, or one this pass emitted) is left as it is.
      d.low = hasFullOperand;
    else if (opts.level == Level::O3 &&
             (d.cls == OpClass::Deny || d.cls == OpClass::Infer)) {
      // Clear ops still only follow their neighbours: data movement never
      // forces a convert, even at O3.
      d.low = true;
      d.reason = Reason::LevelO3;
    }
    if (d.low && d.cls == OpClass::Allow && !d.forcedLow)
      d.reason = opts.dotResult == DotResult::Compute
                     ? Reason::MatrixMultiplyCompute
                     : Reason::MatrixMultiply;
  }
}

void PrecisionAnalysis::markDenyDownstream() {
  auto isDenyRoot = [&](const OpDecision &d) {
    return (d.cls == OpClass::Deny && !d.forcedLow) || d.forcedHigh;
  };
  // Ops upstream of a deny or infer op through clear ops only.
  llvm::DenseSet<Operation *> upstream;
  llvm::SmallVector<Operation *> stack;
  for (Operation *op : order) {
    const OpDecision &d = at(op);
    if (isDenyRoot(d) || (paintable(d) && d.cls == OpClass::Infer)) {
      upstream.insert(op);
      stack.push_back(op);
    }
  }
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *producer : floatProducers(op)) {
      const OpDecision &d = at(producer);
      if (paintable(d) && d.cls == OpClass::Clear &&
          upstream.insert(producer).second)
        stack.push_back(producer);
    }
  }
  // Deny flows forward through those ops.
  for (Operation *op : order)
    if (isDenyRoot(at(op)))
      stack.push_back(op);
  llvm::DenseSet<Operation *> visited;
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *user : floatUsers(op)) {
      OpDecision &d = at(user);
      if (!paintable(d) || !upstream.count(user) ||
          !visited.insert(user).second)
        continue;
      d.denyMarked = true;
      stack.push_back(user);
    }
  }
}

void PrecisionAnalysis::markBetweenAllow() {
  auto isLowRoot = [&](Operation *op) {
    const OpDecision &d = at(op);
    return d.low && !paintable(d);
  };
  auto canPass = [&](Operation *op) {
    const OpDecision &d = at(op);
    return paintable(d) && !d.denyMarked;
  };
  // Ops reachable downstream of a low root through paintable ops, with the
  // group of the root that reached them first.
  llvm::DenseMap<Operation *, int64_t> downstream;
  llvm::SmallVector<Operation *> stack;
  for (Operation *op : order)
    if (isLowRoot(op))
      stack.push_back(op);
  llvm::SmallVector<Operation *> roots(stack);
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *user : floatUsers(op))
      if (canPass(user) && downstream.try_emplace(user, at(op).group).second)
        stack.push_back(user);
  }
  // ...and upstream of another low root: between two low ops.
  stack = roots;
  llvm::DenseSet<Operation *> visited;
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *producer : floatProducers(op)) {
      auto it = downstream.find(producer);
      if (it == downstream.end() || !visited.insert(producer).second)
        continue;
      OpDecision &d = at(producer);
      d.low = true;
      d.reason = Reason::BetweenLowOps;
      d.group = it->second;
      stack.push_back(producer);
    }
  }
}

void PrecisionAnalysis::pullClearOpsIntoLowProducers() {
  // Reverse program order: a chain of clear ops feeding a low op (broadcast
  // of a bias, transpose of a weight) goes low in one sweep, so the convert
  // lands on the smallest tensor.
  for (Operation *op : llvm::reverse(order)) {
    OpDecision &d = at(op);
    if (!paintable(d) || d.cls != OpClass::Clear || d.low || d.denyMarked)
      continue;
    llvm::SmallVector<Operation *> users = floatUsers(op);
    if (users.empty())
      continue;
    bool allLow = llvm::all_of(users, [&](Operation *user) {
      return at(user).low && !shlo::isRegionReturn(user);
    });
    if (allLow) {
      d.low = true;
      d.reason = Reason::FeedsLowOps;
      d.group = at(users.front()).group;
    }
  }
}

void PrecisionAnalysis::followLowInputs() {
  for (Operation *op : order) {
    OpDecision &d = at(op);
    if (!paintable(d) || d.low || d.denyMarked)
      continue;
    bool anyFull = false, allLow = true;
    Operation *lowProducer = nullptr;
    for (Value operand : op->getOperands()) {
      if (!isFull(operand))
        continue;
      anyFull = true;
      bool low = shlo::getFloatElementType(newType(operand)) == compute;
      allLow &= low;
      if (low && !lowProducer)
        lowProducer = operand.getDefiningOp();
    }
    if (anyFull && allLow) {
      d.low = true;
      d.reason = Reason::InputsLow;
      if (lowProducer && decisions.count(lowProducer))
        d.group = at(lowProducer).group;
    }
  }
}

void PrecisionAnalysis::explainFullPrecision() {
  for (Operation *op : order) {
    OpDecision &d = at(op);
    if (d.low || d.forcedHigh)
      continue;
    if (d.denyMarked) {
      d.reason = Reason::ConsumesSensitive;
      d.detail.clear();
    } else if (paintable(d)) {
      d.reason = Reason::NotBetweenLowOps;
      d.detail.clear();
    }
    if (d.cls != OpClass::Allow)
      d.group = -1;
  }
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

Type PrecisionAnalysis::resultElementType(Operation *op, Value result) const {
  Type type = result.getType();
  if (!isFull(type))
    return shlo::getFloatElementType(type);
  auto it = decisions.find(op);
  if (it == decisions.end() || !it->second.low)
    return full;
  const OpDecision &d = it->second;
  if (d.cls == OpClass::Allow && opts.dotResult == DotResult::F32 &&
      !d.forcedLow && !lowResultDots.contains(op))
    return full;
  return compute;
}

Type PrecisionAnalysis::newType(Value value) const {
  Type type = value.getType();
  if (!isFull(type))
    return type;
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    Operation *owner = arg.getOwner()->getParentOp();
    if (auto func = dyn_cast<func::FuncOp>(owner))
      return func.isPublic() && arg.getOwner()->isEntryBlock() &&
                     !func.getArgAttr(arg.getArgNumber(), attr::kKeepDtype)
                 ? shlo::withElementType(type, param)
                 : type;
    // Block arguments of a reduction body follow the reduction.
    if (lowersBody(owner))
      return shlo::withElementType(type, compute);
    return type;
  }
  return shlo::withElementType(type,
                               resultElementType(value.getDefiningOp(), value));
}

Type PrecisionAnalysis::wantedType(OpOperand &operand) const {
  Value value = operand.get();
  Type type = value.getType();
  if (!isFull(type))
    return type;
  Operation *user = operand.getOwner();
  if (isa<func::ReturnOp>(user)) {
    auto func = user->getParentOfType<func::FuncOp>();
    if (!func.isPublic())
      return type;
    // The new value of an argument (a parameter, an optimizer state) keeps
    // the argument's dtype, so a step can feed its results back in.
    unsigned index = operand.getOperandNumber();
    if (auto stateOf =
            func.getResultAttrOfType<IntegerAttr>(index, attr::kStateOf)) {
      int64_t arg = stateOf.getInt();
      if (arg >= 0 && arg < static_cast<int64_t>(func.getNumArguments()) &&
          isFull(func.getArgument(arg)))
        return newType(func.getArgument(arg));
    }
    return shlo::withElementType(type, output);
  }
  auto it = decisions.find(user);
  if (it == decisions.end())
    return type;
  if (it->second.cls == OpClass::Convert)
    return newType(value); // a convert takes any float
  return it->second.low ? shlo::withElementType(type, compute) : type;
}

bool PrecisionAnalysis::readsComputeCopy(OpOperand &operand) const {
  Operation *gate = operand.getOwner();
  const OpDecision &d = decision(gate);
  Value value = operand.get();
  Operation *producer = value.getDefiningOp();
  if (!shlo::isDotGeneral(gate) || d.reason != Reason::GatesDecision ||
      !isFull(value) || !producer || shlo::isConstant(producer) ||
      !decisions.count(producer) || newType(value) != value.getType())
    return false;
  return llvm::any_of(value.getUses(), [&](OpOperand &use) {
    return &use != &operand && !isFull(wantedType(use));
  });
}

bool PrecisionAnalysis::lowersBody(Operation *op) const {
  if (!shlo::hasApplierRegions(op))
    return false;
  auto it = decisions.find(op);
  return it != decisions.end() && it->second.low;
}

Precision PrecisionAnalysis::precisionOf(Operation *op) const {
  const OpDecision &d = decision(op);
  if (d.low)
    return Precision::Low;
  auto touchesFull = [&](Type t) { return isFull(t); };
  // A dot of low-precision operands (an input already mixed, or this pass's
  // own output) is left as it is, whatever its result type.
  if (d.cls == OpClass::Allow &&
      !llvm::any_of(op->getOperandTypes(), touchesFull))
    return Precision::Unchanged;
  if (!llvm::any_of(op->getOperandTypes(), touchesFull) &&
      !llvm::any_of(op->getResultTypes(), touchesFull))
    return Precision::Unchanged;
  return Precision::Full;
}

//===----------------------------------------------------------------------===//
// Storage
//===----------------------------------------------------------------------===//

bool PrecisionAnalysis::mayStoreLow(
    Value value, const llvm::DenseSet<Value> &statistics,
    const llvm::DenseMap<Operation *, int64_t> &gemmsBefore) const {
  Operation *producer = value.getDefiningOp();
  const OpDecision &d = decision(producer);
  // Large: per-row statistics and scalars stay f32.
  std::optional<int64_t> elements = shlo::numElements(value.getType());
  if (!elements || *elements < opts.storageMinElements ||
      statistics.contains(value))
    return false;
  // Made by f32 arithmetic (data movement follows its operand; reductions
  // are statistics; explicit and fixed ops keep their types).
  bool arithmetic = d.cls == OpClass::Allow || d.cls == OpClass::Infer ||
                    (d.cls == OpClass::Deny && !shlo::hasApplierRegions(producer));
  bool computesFull = !d.low || d.cls == OpClass::Allow;
  // Ops kept in f32 on purpose (keep-f32, calibration, a decision, linear
  // algebra) keep f32 storage too.
  if (!arithmetic || !computesFull || newType(value) != value.getType() ||
      exact.contains(value) || d.forcedHigh)
    return false;
  // Read only by decided arithmetic in the same block: never by a result, a
  // custom call, a loop, a call or a region that captures it.
  int64_t lastUse = -1;
  bool anyFullUser = false;
  for (OpOperand &use : value.getUses()) {
    Operation *user = use.getOwner();
    if (user->getBlock() != producer->getBlock() || !decisions.count(user))
      return false;
    const OpDecision &u = decision(user);
    if (u.cls == OpClass::Fixed || u.cls == OpClass::Convert ||
        shlo::isRegionReturn(user) || u.forcedHigh)
      return false;
    anyFullUser |= wantedType(use) == value.getType();
    lastUse = std::max(lastUse, gemmsBefore.lookup(user));
  }
  if (!anyFullUser)
    return true; // every reader rounds it anyway: one convert, made early
  // Read again far from where it was made (across a matrix multiply, as the
  // backward pass reads saved activations): XLA stores it rather than
  // recomputing it, so the rounding saves memory.
  int64_t madeAfter = gemmsBefore.lookup(producer) +
                      (d.cls == OpClass::Allow ? 1 : 0);
  return lastUse - madeAfter >= 1;
}

/// A value divided by its own sum (softmax's exponential), on a GPU, over
/// rows of a power-of-two length: XLA:GPU fuses the sum and the division
/// with the value's producer into one Triton kernel, which storing the
/// value would split; the quotient is stored instead. Over other rows (a
/// ViT's 197 tokens) XLA writes the exponential from one kernel and sums it
/// in another anyway, and storing it makes that write bf16 (docs/DESIGN.md,
/// "Decisions with a price").
bool PrecisionAnalysis::dividedByItsOwnSum(Value value) const {
  if (opts.target != Target::Gpu)
    return false;
  auto type = dyn_cast<ShapedType>(value.getType());
  if (!type || !type.hasStaticShape())
    return false;
  // The sums over rows that fuse, with the dimensions each reduces.
  llvm::SmallVector<std::pair<Value, llvm::ArrayRef<int64_t>>, 2> sums;
  for (Operation *user : value.getUsers()) {
    auto reduced = user->getAttrOfType<DenseI64ArrayAttr>("dimensions");
    if (!shlo::is(user, "reduce") || !reduced ||
        decision(user).cls != OpClass::Deny)
      continue;
    int64_t row = 1;
    for (int64_t dim : reduced.asArrayRef())
      row *= type.getDimSize(dim);
    if (llvm::isPowerOf2_64(row))
      sums.push_back({user->getResult(0), reduced.asArrayRef()});
  }
  // The divisor: a sum of its rows, broadcast back over them.
  auto isSum = [&](Value divisor) {
    return llvm::any_of(sums, [&](const auto &sum) {
      return shlo::broadcastsRowsBack(divisor, sum.first, sum.second);
    });
  };
  return !sums.empty() &&
         llvm::any_of(value.getUses(), [&](OpOperand &use) {
           Operation *user = use.getOwner();
           return shlo::is(user, "divide") && use.getOperandNumber() == 0 &&
                  isSum(user->getOperand(1));
         });
}

/// Elementwise arithmetic without transcendentals, and data movement.
bool PrecisionAnalysis::isCheapToRebuild(Operation *op) const {
  const OpDecision &d = decision(op);
  if (d.cls == OpClass::Clear)
    return !shlo::hasApplierRegions(op);
  if (d.cls != OpClass::Infer)
    return false;
  return shlo::is(op, "add") || shlo::is(op, "subtract") ||
         shlo::is(op, "multiply") || shlo::is(op, "divide") ||
         shlo::isChlo(op, "square");
}

PrecisionAnalysis::ValueKinds PrecisionAnalysis::classifyValues() const {
  ValueKinds kinds;
  llvm::DenseSet<Value> &statistics = kinds.statistics;
  llvm::DenseSet<Value> &constants = kinds.constants;
  llvm::DenseSet<Value> &normalised = kinds.normalised;
  llvm::DenseSet<Value> &centred = kinds.centred;
  // Statistics: reduction results and what elementwise arithmetic makes of
  // them and of constants alone (mean, variance, rsqrt(var + eps), the
  // softmax max and sum).
  // Constants: constant ops and what any op but a GEMM or a fixed op makes
  // of constants alone, integers included (jnp.var's `N - ddof` is a
  // convert of the integer ddof its specialised body is called with).
  // Normalised: f32 data centred by a statistic (x - mean) and what
  // multiplying or dividing by statistics, constants or normalised data
  // makes of it (x̂, 2 (x - mean)), when the data was made by f32
  // arithmetic. Batch norm's backward pass cancels across
  // x̂ (dx = rstd (dy - mean(dy) - x̂ mean(dy x̂))); where nothing upstream
  // was rounded (a convolution XLA:CPU runs in f32), rounding x̂ raised the
  // flax ResNet step's error 4.7x. Data from a low-precision op was rounded
  // already, and may be stored low.
  // Centred: the same, whatever made the data (keepPartitionedNormTermsLow).
  for (Operation *op : order) {
    const OpDecision &d = decision(op);
    bool reduction = shlo::hasApplierRegions(op) &&
                     (d.cls == OpClass::Deny || d.cls == OpClass::Clear);
    bool anyStatistic = false, allStatOrConst = op->getNumOperands() > 0;
    bool anyNormalised = false, anyCentred = false, anyUnroundedData = false;
    bool anyData = false;
    bool allConstant =
        op->getNumOperands() > 0 && d.cls != OpClass::Allow &&
        d.cls != OpClass::Fixed &&
        llvm::all_of(op->getOperands(),
                     [&](Value operand) { return constants.contains(operand); });
    for (Value operand : op->getOperands()) {
      if (!shlo::getFloatElementType(operand.getType()))
        continue;
      anyStatistic |= statistics.contains(operand);
      allStatOrConst &=
          statistics.contains(operand) || constants.contains(operand);
      anyNormalised |= normalised.contains(operand);
      anyCentred |= centred.contains(operand);
      anyData |= !statistics.contains(operand) &&
                 !constants.contains(operand) && !centred.contains(operand);
      Operation *producer = operand.getDefiningOp();
      anyUnroundedData |= !statistics.contains(operand) &&
                          !constants.contains(operand) &&
                          !normalised.contains(operand) &&
                          !(producer && decision(producer).low);
    }
    for (Value result : op->getResults()) {
      if (shlo::isConstant(op) || allConstant ||
          (d.cls == OpClass::Clear && allStatOrConst && !anyStatistic))
        constants.insert(result);
      else if (reduction || (d.cls != OpClass::Allow && d.cls != OpClass::Fixed &&
                             anyStatistic && allStatOrConst))
        statistics.insert(result);
      else if ((shlo::is(op, "subtract") && anyStatistic && anyUnroundedData) ||
               ((shlo::is(op, "multiply") || shlo::is(op, "divide") ||
                 shlo::isChlo(op, "square")) &&
                anyNormalised && !anyUnroundedData))
        normalised.insert(result);
      if ((shlo::is(op, "subtract") && anyStatistic && anyData) ||
          ((shlo::is(op, "multiply") || shlo::is(op, "divide") ||
            shlo::isChlo(op, "square")) &&
           anyCentred && !anyData))
        centred.insert(result);
    }
  }
  return kinds;
}

void PrecisionAnalysis::decideStorage() {
  ValueKinds kinds = classifyValues();
  const llvm::DenseSet<Value> &statistics = kinds.statistics;
  const llvm::DenseSet<Value> &constants = kinds.constants;
  // Position of each op in its block: the matrix multiplies before it
  // (`order` lists each block's ops in program order).
  llvm::DenseMap<Operation *, int64_t> gemmsBefore;
  llvm::DenseMap<Block *, int64_t> gemmsInBlock;
  for (Operation *op : order) {
    int64_t &gemms = gemmsInBlock[op->getBlock()];
    gemmsBefore[op] = gemms;
    if (decision(op).cls == OpClass::Allow)
      ++gemms;
  }
  // Rebuildable: what a cheap elementwise or data-movement op makes of
  // arguments, constants, statistics, stored values and other rebuildable
  // values (layer norm's x - mean and its normalised x, softmax's e / sum).
  // XLA recomputes such a value in its readers' fusions instead of keeping
  // it; rounding it would only add a rounded copy.
  llvm::DenseSet<Value> rebuildable;
  auto cheapSource = [&](Value value) {
    return isa<BlockArgument>(value) || constants.contains(value) ||
           statistics.contains(value) || stored.contains(value) ||
           rebuildable.contains(value);
  };
  for (Operation *op : order) {
    if (isCheapToRebuild(op) &&
        llvm::all_of(op->getOperands(), [&](Value operand) {
          return !shlo::getFloatElementType(operand.getType()) ||
                 cheapSource(operand);
        }))
      rebuildable.insert(op->result_begin(), op->result_end());
    for (Value result : op->getResults()) {
      if (!isFull(result) || rebuildable.contains(result) ||
          kinds.normalised.contains(result) || dividedByItsOwnSum(result) ||
          !mayStoreLow(result, statistics, gemmsBefore))
        continue;
      // A GPU or TPU GEMM accumulates in f32 and rounds once as it writes:
      // its result is made in the compute dtype. XLA:CPU has no such kernel,
      // so there the f32 result is converted; so it is in strict mode, where
      // XLA could fuse a GEMM's output rounding into its f32 readers.
      if (decision(op).cls == OpClass::Allow && opts.target != Target::Cpu &&
          decision(op).low && !opts.strict) {
        lowResultDots.insert(op);
        continue;
      }
      if (stored.insert(result).second)
        storedOrder.push_back(result);
    }
  }
}
