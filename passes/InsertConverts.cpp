//===- InsertConverts.cpp - Paint precisions, convert at the boundaries ---===//
//
// The painting follows TF grappler's auto_mixed_precision (deny propagates
// forward, infer/clear ops between two allow ops go low, clear ops follow
// their neighbours), adapted to f32-accumulating dots: an allow op's result
// stays f32 and is rounded only where a low-precision consumer needs it.
//
//===----------------------------------------------------------------------===//

#include "Passes.h"
#include "Policy.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPINSERTCONVERTSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;
using shlo::OpClass;

namespace {

enum class Target { Cpu, Gpu, Tpu };

/// Everything the painting needs to know about one op.
struct Node {
  OpClass cls = OpClass::Fixed;
  bool low = false;         ///< computes in the compute dtype
  bool denyMarked = false;  ///< downstream of a deny op (stays f32)
  bool forcedHigh = false;  ///< keep-f32 override
  bool forcedLow = false;   ///< force-compute override
  std::string reason;       ///< why it is what it is, for reports
};

class InsertConvertsPass final
    : public amp::impl::AmpInsertConvertsPassBase<InsertConvertsPass> {
public:
  using AmpInsertConvertsPassBase::AmpInsertConvertsPassBase;

  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;

private:
  // Parsed options.
  Policy parsedPolicy;
  Level parsedLevel = Level::O2;
  Target parsedTarget = Target::Gpu;
  bool lowDotResult = false;
  llvm::StringSet<> keepF32Names, forceComputeNames;
  std::string optionError;

  // Per-run state.
  FloatType fullType, computeType, paramType, outputType;
  std::vector<Operation *> order; ///< painted ops in program order
  llvm::DenseMap<Operation *, Node> nodes;

  void collect(ModuleOp module);
  void paint();
  void markDenyDownstream();
  void markBetweenAllow();
  void pullClearOpsIntoLowProducers();
  void followLowInputs();

  bool isFull(Type type) const {
    return shlo::getFloatElementType(type) == fullType;
  }
  bool isFull(Value value) const { return isFull(value.getType()); }
  bool paintable(const Node &node) const {
    return (node.cls == OpClass::Infer || node.cls == OpClass::Clear) &&
           !node.forcedHigh && !node.forcedLow;
  }
  Node *nodeFor(Operation *op);
  /// Painted ops that consume a full-precision result of `op`.
  llvm::SmallVector<Operation *> floatUsers(Operation *op);
  /// Painted ops that produce a full-precision operand of `op`.
  llvm::SmallVector<Operation *> floatProducers(Operation *op);
  /// The element type a result of `op` takes after painting.
  Type resultElementType(Operation *op, Value result);
  Type newTypeOf(Value value);
  /// The type `user` needs for its operand `operand` after painting.
  Type wantedType(OpOperand &operand);

  LogicalResult rewrite(ModuleOp module);
  void canonicalizeDotForCpu(Operation *dot);
  void annotateDecisions();
};

//===----------------------------------------------------------------------===//
// Options
//===----------------------------------------------------------------------===//

LogicalResult InsertConvertsPass::initialize(MLIRContext *context) {
  auto fail = [&](const llvm::Twine &message) {
    optionError = message.str();
    // Reported from runOnOperation, where a location exists.
    return success();
  };
  llvm::Expected<Policy> parsed = parsePolicy(policy);
  if (!parsed)
    return fail("invalid policy: " + llvm::toString(parsed.takeError()));
  parsedPolicy = *parsed;
  llvm::Expected<Level> levelOr = parseLevel(level);
  if (!levelOr)
    return fail("invalid option 'level': " +
                llvm::toString(levelOr.takeError()));
  parsedLevel = *levelOr;
  if (target == "cpu")
    parsedTarget = Target::Cpu;
  else if (target == "gpu" || target == "cuda" || target == "rocm")
    parsedTarget = Target::Gpu;
  else if (target == "tpu")
    parsedTarget = Target::Tpu;
  else
    return fail("invalid option 'target': unknown target '" + target +
                "' (accepted: cpu, gpu, tpu)");
  if (dotResult != "f32" && dotResult != "compute")
    return fail("invalid option 'dot-result': unknown value '" + dotResult +
                "' (accepted: f32, compute)");
  lowDotResult = dotResult == "compute";
  for (const std::string &name : keepF32)
    keepF32Names.insert(shlo::qualifiedOpName(name));
  for (const std::string &name : forceCompute) {
    std::string qualified = shlo::qualifiedOpName(name);
    if (keepF32Names.contains(qualified))
      return fail("op '" + qualified +
                  "' is named in both keep-f32 and force-compute");
    forceComputeNames.insert(qualified);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Graph
//===----------------------------------------------------------------------===//

Node *InsertConvertsPass::nodeFor(Operation *op) {
  // Ops inside reduction bodies are represented by the reduction.
  while (op && !nodes.count(op)) {
    Operation *parent = op->getParentOp();
    if (!parent || !shlo::hasApplierRegions(parent))
      return nullptr;
    op = parent;
  }
  if (!op)
    return nullptr;
  auto it = nodes.find(op);
  return it == nodes.end() ? nullptr : &it->second;
}

llvm::SmallVector<Operation *> InsertConvertsPass::floatUsers(Operation *op) {
  llvm::SmallVector<Operation *> users;
  for (Value result : op->getResults()) {
    if (!isFull(result))
      continue;
    for (Operation *user : result.getUsers()) {
      if (nodeFor(user))
        users.push_back(user);
    }
  }
  return users;
}

llvm::SmallVector<Operation *>
InsertConvertsPass::floatProducers(Operation *op) {
  llvm::SmallVector<Operation *> producers;
  for (Value operand : op->getOperands())
    if (isFull(operand))
      if (Operation *def = operand.getDefiningOp())
        if (nodes.count(def))
          producers.push_back(def);
  return producers;
}

void InsertConvertsPass::collect(ModuleOp module) {
  module.walk<WalkOrder::PreOrder>([&](Operation *op) -> WalkResult {
    if (op == module.getOperation() || isa<func::FuncOp>(op))
      return WalkResult::advance();
    Node node;
    node.cls = shlo::classify(op, &node.reason);
    // An existing convert of a float is an explicit choice of precision; a
    // convert from an integer or boolean merely materialises a float.
    if (node.cls == OpClass::Convert) {
      if (shlo::getFloatElementType(op->getOperand(0).getType())) {
        node.reason = "explicit convert";
      } else {
        node.cls = OpClass::Clear;
        node.reason = "integer-to-float convert";
      }
    }
    std::string name = op->getName().getStringRef().str();
    if (keepF32Names.contains(name)) {
      node.forcedHigh = true;
      node.reason = "keep-f32 override";
    } else if (forceComputeNames.contains(name) && node.cls != OpClass::Fixed &&
               node.cls != OpClass::Convert) {
      node.forcedLow = true;
      node.reason = "force-compute override";
    }
    if (node.cls == OpClass::Allow && parsedTarget == Target::Cpu &&
        !node.forcedLow) {
      if (shlo::isConvolution(op)) {
        // XLA:CPU upcasts every bf16/f16 convolution: lowering one would only
        // add converts and rounding.
        node.cls = OpClass::Fixed;
        node.reason = "XLA:CPU runs convolutions in f32";
      } else if (computeType.isBF16() && !lowDotResult &&
                 (!shlo::getDotDimensions(op) ||
                  !cast<ShapedType>(op->getOperand(0).getType())
                       .hasStaticShape() ||
                  !cast<ShapedType>(op->getOperand(1).getType())
                       .hasStaticShape())) {
        // Only the NT-canonical form of a mixed dot is safe on XLA:CPU, and
        // we can only build it for static shapes.
        node.cls = OpClass::Fixed;
        node.reason = "dynamic shape: XLA:CPU needs a static NT-canonical dot";
      }
    }
    nodes[op] = node;
    order.push_back(op);
    return shlo::hasApplierRegions(op) ? WalkResult::skip()
                                       : WalkResult::advance();
  });
}

//===----------------------------------------------------------------------===//
// Painting
//===----------------------------------------------------------------------===//

void InsertConvertsPass::paint() {
  for (Operation *op : order) {
    Node &node = nodes[op];
    bool hasFullOperand =
        llvm::any_of(op->getOperands(), [&](Value v) { return isFull(v); });
    bool hasFull = hasFullOperand || llvm::any_of(op->getResults(), [&](
                                                      Value v) {
                     return isFull(v);
                   });
    if (!hasFull)
      continue;
    if (node.forcedLow)
      node.low = true;
    else if (node.forcedHigh)
      node.low = false;
    else if (node.cls == OpClass::Allow)
      // A dot whose operands are already low precision (an f32-accumulating
      // dot in the input, or one this pass emitted) is left as it is.
      node.low = hasFullOperand;
    else if (parsedLevel == Level::O3)
      // Clear ops still only follow their neighbours: data movement never
      // forces a convert, even at O3.
      node.low = node.cls == OpClass::Deny || node.cls == OpClass::Infer;
  }
  if (parsedLevel == Level::O2) {
    markDenyDownstream();
    markBetweenAllow();
  }
  if (parsedLevel == Level::O2 || parsedLevel == Level::O3)
    pullClearOpsIntoLowProducers();
  followLowInputs();
}

void InsertConvertsPass::markDenyDownstream() {
  auto isDenyRoot = [&](const Node &node) {
    return (node.cls == OpClass::Deny && !node.forcedLow) || node.forcedHigh;
  };
  // Ops upstream of a deny or infer op through clear ops only.
  llvm::DenseSet<Operation *> upstream;
  llvm::SmallVector<Operation *> stack;
  for (Operation *op : order) {
    Node &node = nodes[op];
    if (isDenyRoot(node) || (paintable(node) && node.cls == OpClass::Infer)) {
      upstream.insert(op);
      stack.push_back(op);
    }
  }
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *producer : floatProducers(op)) {
      Node &node = nodes[producer];
      if (paintable(node) && node.cls == OpClass::Clear &&
          upstream.insert(producer).second)
        stack.push_back(producer);
    }
  }
  // Deny flows forward through those ops.
  for (Operation *op : order)
    if (isDenyRoot(nodes[op]))
      stack.push_back(op);
  llvm::DenseSet<Operation *> visited;
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *user : floatUsers(op)) {
      Operation *owner = user;
      if (!nodes.count(owner))
        continue;
      Node &node = nodes[owner];
      if (!paintable(node) || !upstream.count(owner) ||
          !visited.insert(owner).second)
        continue;
      node.denyMarked = true;
      stack.push_back(owner);
    }
  }
}

void InsertConvertsPass::markBetweenAllow() {
  auto isLowRoot = [&](Operation *op) {
    const Node &node = nodes[op];
    return node.low && !paintable(node);
  };
  auto canPass = [&](Operation *op) {
    const Node &node = nodes[op];
    return paintable(node) && !node.denyMarked;
  };
  llvm::DenseSet<Operation *> downstream;
  llvm::SmallVector<Operation *> stack;
  for (Operation *op : order)
    if (isLowRoot(op))
      stack.push_back(op);
  llvm::SmallVector<Operation *> roots(stack);
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *user : floatUsers(op))
      if (nodes.count(user) && canPass(user) && downstream.insert(user).second)
        stack.push_back(user);
  }
  stack = roots;
  llvm::DenseSet<Operation *> visited;
  while (!stack.empty()) {
    Operation *op = stack.pop_back_val();
    for (Operation *producer : floatProducers(op)) {
      if (!downstream.count(producer) || !visited.insert(producer).second)
        continue;
      nodes[producer].low = true;
      nodes[producer].reason = "between low-precision ops";
      stack.push_back(producer);
    }
  }
}

void InsertConvertsPass::pullClearOpsIntoLowProducers() {
  // Reverse program order: a chain of clear ops feeding a low op (broadcast of
  // a bias, transpose of a weight) goes low in one sweep, so the convert lands
  // on the smallest tensor.
  for (Operation *op : llvm::reverse(order)) {
    Node &node = nodes[op];
    if (!paintable(node) || node.cls != OpClass::Clear || node.low ||
        node.denyMarked)
      continue;
    llvm::SmallVector<Operation *> users = floatUsers(op);
    if (users.empty())
      continue;
    bool allLow = llvm::all_of(users, [&](Operation *user) {
      auto it = nodes.find(user);
      return it != nodes.end() && it->second.low &&
             !shlo::isRegionReturn(user);
    });
    if (allLow) {
      node.low = true;
      node.reason = "feeds only low-precision ops";
    }
  }
}

Type InsertConvertsPass::resultElementType(Operation *op, Value result) {
  Type type = result.getType();
  if (!isFull(type))
    return shlo::getFloatElementType(type);
  auto it = nodes.find(op);
  if (it == nodes.end() || !it->second.low)
    return fullType;
  if (it->second.cls == OpClass::Allow && !lowDotResult &&
      !it->second.forcedLow)
    return fullType;
  return computeType;
}

Type InsertConvertsPass::newTypeOf(Value value) {
  Type type = value.getType();
  if (!isFull(type))
    return type;
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    Operation *owner = arg.getOwner()->getParentOp();
    if (auto func = dyn_cast<func::FuncOp>(owner))
      return func.isPublic() && arg.getOwner()->isEntryBlock() &&
                     !func.getArgAttr(arg.getArgNumber(), shlo::kKeepDtypeAttr)
                 ? shlo::withElementType(type, paramType)
                 : type;
    // Block arguments of a reduction body follow the reduction.
    if (shlo::hasApplierRegions(owner)) {
      auto it = nodes.find(owner);
      if (it != nodes.end() && it->second.low)
        return shlo::withElementType(type, computeType);
    }
    return type;
  }
  Operation *def = value.getDefiningOp();
  return shlo::withElementType(type, resultElementType(def, value));
}

Type InsertConvertsPass::wantedType(OpOperand &operand) {
  Value value = operand.get();
  Type type = value.getType();
  if (!isFull(type))
    return type;
  Operation *user = operand.getOwner();
  if (isa<func::ReturnOp>(user)) {
    auto func = user->getParentOfType<func::FuncOp>();
    return func.isPublic() ? shlo::withElementType(type, outputType) : type;
  }
  auto it = nodes.find(user);
  if (it == nodes.end())
    return type;
  if (it->second.cls == OpClass::Convert)
    return newTypeOf(value); // a convert takes any float
  return it->second.low ? shlo::withElementType(type, computeType) : type;
}

void InsertConvertsPass::followLowInputs() {
  for (Operation *op : order) {
    Node &node = nodes[op];
    if (!paintable(node) || node.low || node.denyMarked)
      continue;
    bool anyFull = false, allLow = true;
    for (Value operand : op->getOperands()) {
      if (!isFull(operand))
        continue;
      anyFull = true;
      allLow &= shlo::getFloatElementType(newTypeOf(operand)) == computeType;
    }
    if (anyFull && allLow) {
      node.low = true;
      node.reason = "inputs are low precision";
    }
  }
}

//===----------------------------------------------------------------------===//
// Rewriting
//===----------------------------------------------------------------------===//

LogicalResult InsertConvertsPass::rewrite(ModuleOp module) {
  // Decide everything on the original types, then mutate.
  struct PendingUse {
    OpOperand *operand;
    Type wanted;
  };
  llvm::SmallVector<PendingUse> pending;
  llvm::SmallVector<std::pair<Value, Type>> retyped;
  // A lowered constant stays as it is for its f32 users; each user that
  // wants the compute dtype gets one re-encoded copy (and a constant left
  // without users is erased).
  auto isLowConstant = [&](Value value) {
    Operation *def = value.getDefiningOp();
    return def && shlo::isConstant(def) && nodes.count(def) && nodes[def].low;
  };
  auto physicalTypeOf = [&](Value value) {
    return isLowConstant(value) ? value.getType() : newTypeOf(value);
  };
  auto noteValue = [&](Value value) {
    Type type = physicalTypeOf(value);
    if (type != value.getType())
      retyped.push_back({value, type});
  };
  auto noteUse = [&](OpOperand &operand, Type wanted) {
    if (wanted != physicalTypeOf(operand.get()))
      pending.push_back({&operand, wanted});
  };
  for (auto func : module.getOps<func::FuncOp>())
    for (BlockArgument arg : func.getArguments())
      noteValue(arg);
  llvm::SmallVector<Operation *> lowAppliers;
  for (Operation *op : order) {
    for (OpOperand &operand : op->getOpOperands())
      noteUse(operand, wantedType(operand));
    for (Value result : op->getResults())
      noteValue(result);
    if (!shlo::hasApplierRegions(op))
      continue;
    bool low = nodes[op].low;
    if (low)
      lowAppliers.push_back(op);
    // Values the body captures from outside (jax.export hoists a
    // comparator's constants) take the body's precision.
    op->walk([&](Operation *inner) {
      if (inner == op)
        return;
      for (OpOperand &operand : inner->getOpOperands()) {
        Value value = operand.get();
        if (!isFull(value) || op->isAncestor(value.getParentRegion()->getParentOp()))
          continue;
        noteUse(operand, low ? shlo::withElementType(value.getType(),
                                                      computeType)
                             : value.getType());
      }
    });
  }

  for (auto [value, type] : retyped)
    value.setType(type);
  bool saturatedAny = false;
  // Reduction bodies of lowered reductions compute in the compute dtype.
  for (Operation *op : lowAppliers) {
    for (Region &region : op->getRegions()) {
      region.walk([&](Block *block) {
        for (BlockArgument arg : block->getArguments())
          if (isFull(arg))
            arg.setType(shlo::withElementType(arg.getType(), computeType));
      });
      region.walk([&](Operation *inner) {
        if (shlo::isConstant(inner) && isFull(inner->getResult(0)))
          shlo::reencodeConstantInPlace(inner, computeType, &saturatedAny);
        for (Value result : inner->getResults())
          if (isFull(result))
            result.setType(
                shlo::withElementType(result.getType(), computeType));
      });
    }
  }

  // Each value is converted at most once per target type.
  llvm::DenseMap<std::pair<Value, Type>, Value> converted;
  OpBuilder builder(module.getContext());
  for (const PendingUse &use : pending) {
    Value value = use.operand->get();
    auto key = std::make_pair(value, use.wanted);
    Value &replacement = converted[key];
    if (!replacement) {
      if (auto arg = dyn_cast<BlockArgument>(value))
        builder.setInsertionPointToStart(arg.getOwner());
      else
        builder.setInsertionPointAfter(value.getDefiningOp());
      Type element = shlo::getFloatElementType(use.wanted);
      Operation *def = value.getDefiningOp();
      if (def && shlo::isConstant(def))
        replacement =
            shlo::buildReencodedConstant(builder, def, element, &saturatedAny);
      if (!replacement)
        replacement =
            shlo::buildConvert(builder, value.getLoc(), value, element);
      if (annotate)
        replacement.getDefiningOp()->setAttr(shlo::kInsertedAttr,
                                             builder.getUnitAttr());
    }
    use.operand->set(replacement);
  }

  llvm::SmallPtrSet<Operation *, 8> deadConstants;
  for (Operation *op : order)
    if (shlo::isConstant(op) && nodes[op].low && op->use_empty())
      deadConstants.insert(op);
  llvm::erase_if(order, [&](Operation *op) { return deadConstants.count(op); });
  for (Operation *op : deadConstants) {
    nodes.erase(op);
    op->erase();
  }

  // Function signatures follow their arguments and returns.
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func.isExternal())
      continue;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      func.removeArgAttr(i, shlo::kKeepDtypeAttr);
    Operation *terminator = func.getBody().back().getTerminator();
    func.setFunctionType(
        FunctionType::get(func.getContext(), func.front().getArgumentTypes(),
                          terminator->getOperandTypes()));
  }

  if (parsedTarget == Target::Cpu && computeType.isBF16() && !lowDotResult)
    for (Operation *op : order)
      if (shlo::isDotGeneral(op) && nodes[op].low)
        canonicalizeDotForCpu(op);
  if (saturatedAny)
    module.emitWarning()
        << "float constants out of range of " << dtypeName(parsedPolicy.compute)
        << " were saturated to its largest finite value";
  return success();
}

/// Rewrites a mixed-precision dot_general into the one form XLA:CPU runs
/// natively (YNNPACK) and never rejects: lhs [B, M, K], rhs [B, N, K], one
/// contracting dimension last on both, batch dimensions leading. The canonical
/// operands go through an optimization barrier: otherwise XLA folds the
/// transposes (and unit-dimension reshapes) back into the dot, and the dot it
/// ends up with has no XLA:CPU kernel for mixed precision.
void InsertConvertsPass::canonicalizeDotForCpu(Operation *dot) {
  std::optional<shlo::DotDimensions> dims = shlo::getDotDimensions(dot);
  auto lhsType = dyn_cast<RankedTensorType>(dot->getOperand(0).getType());
  auto rhsType = dyn_cast<RankedTensorType>(dot->getOperand(1).getType());
  auto resultType = dyn_cast<RankedTensorType>(dot->getResult(0).getType());
  if (!dims || !lhsType || !rhsType || !resultType ||
      !lhsType.hasStaticShape() || !rhsType.hasStaticShape())
    return;
  auto layout = [](RankedTensorType type, llvm::ArrayRef<int64_t> batch,
                   llvm::ArrayRef<int64_t> contracting,
                   llvm::SmallVector<int64_t> &perm, int64_t &batchSize,
                   int64_t &freeSize, int64_t &contractSize) {
    batchSize = freeSize = contractSize = 1;
    for (int64_t d : batch) {
      perm.push_back(d);
      batchSize *= type.getDimSize(d);
    }
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (!llvm::is_contained(batch, d) && !llvm::is_contained(contracting, d)) {
        perm.push_back(d);
        freeSize *= type.getDimSize(d);
      }
    for (int64_t d : contracting) {
      perm.push_back(d);
      contractSize *= type.getDimSize(d);
    }
  };
  llvm::SmallVector<int64_t> lhsPerm, rhsPerm;
  int64_t batch, m, k, rhsBatch, n, rhsK;
  layout(lhsType, dims->lhsBatch, dims->lhsContracting, lhsPerm, batch, m, k);
  layout(rhsType, dims->rhsBatch, dims->rhsContracting, rhsPerm, rhsBatch, n,
         rhsK);
  if (batch != rhsBatch || k != rhsK)
    return;

  OpBuilder builder(dot);
  Location loc = dot->getLoc();
  auto canonical = [&](Value operand, llvm::ArrayRef<int64_t> perm,
                       llvm::ArrayRef<int64_t> shape) {
    bool identity = llvm::all_of(llvm::enumerate(perm), [](auto pair) {
      return static_cast<int64_t>(pair.index()) == pair.value();
    });
    if (!identity)
      operand = shlo::buildTranspose(builder, loc, operand, perm);
    if (cast<RankedTensorType>(operand.getType()).getShape() != shape)
      operand = shlo::buildReshape(builder, loc, operand, shape);
    return operand;
  };
  Value lhs = canonical(dot->getOperand(0), lhsPerm, {batch, m, k});
  Value rhs = canonical(dot->getOperand(1), rhsPerm, {batch, n, k});
  Operation *barrier =
      shlo::buildOptimizationBarrier(builder, loc, ValueRange{lhs, rhs});
  shlo::DotDimensions canonicalDims;
  canonicalDims.lhsBatch = canonicalDims.rhsBatch = {0};
  canonicalDims.lhsContracting = canonicalDims.rhsContracting = {2};
  Type canonicalResult =
      RankedTensorType::get({batch, m, n}, resultType.getElementType());
  Value result = shlo::buildDotGeneral(builder, dot, barrier->getResult(0),
                                       barrier->getResult(1), canonicalDims,
                                       canonicalResult);
  Operation *newDot = result.getDefiningOp();
  if (canonicalResult != resultType)
    result = shlo::buildReshape(builder, loc, result, resultType.getShape());
  dot->getResult(0).replaceAllUsesWith(result);
  dot->erase();
  nodes.erase(dot);
  Node node;
  node.cls = OpClass::Allow;
  node.low = true;
  node.reason = "matrix multiply, NT-canonical for XLA:CPU";
  nodes[newDot] = node;
  llvm::replace(order, dot, newDot);
}

void InsertConvertsPass::annotateDecisions() {
  Builder builder(&getContext());
  for (Operation *op : order) {
    const Node &node = nodes[op];
    if (isa<func::ReturnOp>(op) || shlo::isRegionReturn(op))
      continue;
    auto anyType = [&](auto predicate) {
      return llvm::any_of(op->getOperandTypes(), predicate) ||
             llvm::any_of(op->getResultTypes(), predicate);
    };
    bool touchesFloat =
        anyType([&](Type t) { return bool(shlo::getFloatElementType(t)); });
    if (!touchesFloat)
      continue;
    std::string decision;
    if (!node.low && !anyType([&](Type t) { return isFull(t); }))
      decision = "unchanged: no f32 values";
    else if (node.low)
      decision = "low: " + (node.cls == OpClass::Allow && !node.forcedLow
                                ? std::string(lowDotResult
                                                  ? "matrix multiply"
                                                  : "matrix multiply, f32 "
                                                    "accumulation")
                                : node.reason);
    else if (node.denyMarked)
      decision = "f32: consumes a numerically sensitive result";
    else if (paintable(node))
      decision = "f32: not between low-precision ops";
    else
      decision = "f32: " + node.reason;
    op->setAttr(shlo::kPrecisionAttr, builder.getStringAttr(decision));
  }
}

void InsertConvertsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (!optionError.empty()) {
    module.emitError() << optionError;
    return signalPassFailure();
  }
  if (parsedLevel == Level::O0)
    return;
  MLIRContext *context = module.getContext();
  fullType = Float32Type::get(context);
  computeType = dtypeType(context, parsedPolicy.compute);
  paramType = dtypeType(context, parsedPolicy.param);
  outputType = dtypeType(context, parsedPolicy.output);
  order.clear();
  nodes.clear();
  collect(module);
  paint();
  if (failed(rewrite(module)))
    return signalPassFailure();
  if (annotate)
    annotateDecisions();
}

} // namespace
