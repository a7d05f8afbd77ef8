//===- Rematerialize.cpp - Recompute cheap residuals in the backward pass -===//
//
// amp-rematerialize: the backward pass of a training step reads values of
// the forward pass, its residuals, and XLA keeps each of them in memory from
// the forward pass to its last reader. A residual that elementwise ops make
// from values written anyway (other residuals, matrix multiply results,
// small values, constants) need not be kept: it is recomputed right before
// its first reader in the backward pass, where every reader fuses it, so
// that it costs no kernel and no bytes. The recomputation reads those values
// through an optimization barrier, which stops XLA's common-subexpression
// elimination from merging it back into the forward pass (jax.checkpoint
// does the same). ResidualPlan decides; the pass applies.
//
//===----------------------------------------------------------------------===//

#include "Backward.h"
#include "PassSupport.h"
#include "Policy.h"
#include "Passes.h"
#include "StableHLO.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPREMATERIALIZEPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// How to recompute one residual: the ops that make it from its leaves.
struct Recomputation {
  Value residual;
  /// The first op of the backward pass (in the residual's block) that
  /// reads it: the recomputation goes right before it.
  Operation *firstReader = nullptr;
  llvm::SetVector<Operation *> ops; ///< the cone, cloned in block order
  llvm::SetVector<Value> leaves;    ///< what it reads; through the barrier
};

/// A softmax written out, as jax.nn.softmax is: exponentials `e`, their sum
/// `s` over rows, and the quotient `q = e / broadcast(s)`, the only way the
/// forward pass reads `e` and `s`. The backward pass reads `e` and `s` (and
/// what the forward pass makes of them for it alone, such as `1 / s^2`).
/// Softmax is shift-invariant: the quotient of the logits `z - log s` is
/// the same `q`, with exponentials `q` and sum 1, and so is its derivative.
/// The backward pass reads `q`'s stored copy, which a backward matrix
/// multiply reads anyway, in place of `e`, and 1 in place of `s`: it needs
/// neither the logits nor the sum.
struct SoftmaxFrame {
  Value exponentials, sum;
  /// The dimensions `s` sums over: a row.
  llvm::SmallVector<int64_t> rowDims;
  /// `q`, or its copy in the compute dtype, that a backward matrix
  /// multiply reads.
  Value stored;
  /// The first op of the backward pass that reads a residual.
  Operation *firstReader = nullptr;
  /// The values of `e`'s frame the backward pass reads, in block order.
  llvm::SmallVector<Value> residuals;
  /// The ops that make them from `e`, `s` and constants, in block order.
  llvm::SmallVector<Operation *> ops;
};

/// The ops that compute a value in one fused loop, and what they read:
/// through elementwise ops (and broadcasts, reshapes, constants) in the
/// value's block, down to values other ops make or that come from outside
/// the block. These roots are what XLA keeps to recompute the value.
struct Cone {
  llvm::SetVector<Operation *> ops;
  llvm::SetVector<Value> roots;
  bool complete = true; ///< false if it needs more than max-ops ops
};

/// Decides, block by block, which residuals are recomputed.
class ResidualPlan {
public:
  ResidualPlan(ModuleOp module, RematerializeFor goal, int64_t minElements,
               int64_t maxOps);
  llvm::ArrayRef<Recomputation> recomputations() const { return planned; }
  llvm::ArrayRef<SoftmaxFrame> softmaxFrames() const { return frames; }

private:
  const llvm::DenseSet<Value> backward;
  /// Speed: only recomputations that cost nothing; memory: the price is
  /// not asked.
  const bool priced;
  int64_t minElements, maxOps;
  std::vector<Recomputation> planned;
  std::vector<SoftmaxFrame> frames;

  void planBlock(Block &block);
  std::optional<SoftmaxFrame> softmaxFrameOf(Operation *exponential) const;
  /// The residuals of `block`, each with its first backward reader, in
  /// program order.
  llvm::SmallVector<std::pair<Value, Operation *>>
  residualsOf(Block &block) const;
  /// Whether `cone` (of a residual of `size` elements in `block`) reads
  /// only what the backward pass keeps anyway (`kept`).
  bool readsKept(Value residual, const Cone &cone, Block &block,
                 const llvm::DenseSet<Value> &kept) const;
  bool writtenAnyway(Value root, Value residual) const;
  bool fusesIntoReaders(Value residual) const;
  Cone coneOf(Value value) const;
  bool isSmall(Value value, int64_t than) const;
};

/// A reduce whose body is the one op `combiner`.
bool reducesWith(Operation *op, llvm::StringRef combiner) {
  if (!shlo::is(op, "reduce") || op->getNumRegions() != 1 ||
      op->getRegion(0).empty())
    return false;
  Block &body = op->getRegion(0).front();
  return !body.empty() && shlo::is(&body.front(), combiner) &&
         std::next(body.begin()) != body.end() &&
         shlo::isRegionReturn(&*std::next(body.begin()));
}

/// A reduction of a whole tensor to a rank-0 result, such as an FP8 scale's
/// amax. (A one-row tensor's row statistic has rank 1: it stays a row
/// reduction, which XLA fuses with its readers.)
bool reducesToScalar(Operation *op) {
  if (!shlo::is(op, "reduce") || op->getNumResults() == 0)
    return false;
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  return type && type.getRank() == 0;
}

/// A softmax's reductions: its row max (recomputed, it equals the forward
/// pass's bit for bit in any order) and its sum of exponentials. XLA fuses
/// both, with the exponentials, into the backward kernel that reads them,
/// as it does in a hand-cast step; kept, the sum must be written by a
/// forward kernel of its own, which splits the softmax's. A maximum over a
/// whole tensor (an FP8 scale's amax) is no row max: recomputed, it would
/// read the tensor again in a kernel of its own.
bool isSoftmaxReduction(Operation *op) {
  if (reducesToScalar(op))
    return false;
  if (reducesWith(op, "maximum"))
    return true;
  if (!reducesWith(op, "add") || op->getNumOperands() != 2)
    return false;
  Operation *input = op->getOperand(0).getDefiningOp();
  while (input && shlo::isConvert(input))
    input = input->getOperand(0).getDefiningOp();
  return input && shlo::is(input, "exponential");
}

/// A splat constant of 0 (a sum's initial value).
bool isZeroConstant(Value value) {
  Operation *def = value.getDefiningOp();
  auto dense = def && shlo::isConstant(def)
                   ? def->getAttrOfType<DenseFPElementsAttr>("value")
                   : nullptr;
  return dense && dense.isSplat() && dense.getSplatValue<APFloat>().isZero();
}

std::optional<int64_t> byteSize(Type type) {
  auto shaped = dyn_cast<ShapedType>(type);
  if (!shaped || !shaped.hasStaticShape() || !shaped.getElementType().isIntOrFloat())
    return std::nullopt;
  return shaped.getNumElements() *
         llvm::divideCeil(shaped.getElementTypeBitWidth(), 8);
}

std::optional<int64_t> elementsOf(Value value) {
  return shlo::getFloatElementType(value.getType())
             ? shlo::numElements(value.getType())
             : std::nullopt;
}

/// True for an op of the backward pass: it (or an op in its regions) reads
/// a backward value. Terminators return what they are given.
bool readsBackward(Operation *op, const llvm::DenseSet<Value> &backward) {
  if (op->hasTrait<OpTrait::IsTerminator>() || shlo::isRegionReturn(op))
    return false;
  bool reads = false;
  op->walk([&](Operation *inner) {
    reads |= llvm::any_of(inner->getOperands(),
                          [&](Value v) { return backward.contains(v); });
  });
  return reads;
}

ResidualPlan::ResidualPlan(ModuleOp module, RematerializeFor goal,
                           int64_t minElements, int64_t maxOps)
    : backward(backwardValues(module)),
      priced(goal == RematerializeFor::Speed), minElements(minElements),
      maxOps(maxOps) {
  if (backward.empty())
    return;
  module.walk([&](Block *block) { planBlock(*block); });
}

/// A root much smaller than what it helps recompute (a scale, a bias)
/// costs nothing to keep. A row reduction's result is not such a root: XLA
/// fuses a normalization (a reduction and the elementwise ops that read
/// it, as in a layer norm or a softmax) into one kernel that writes only
/// its last value, and a barrier that reads the statistic splits it. A
/// reduction to a scalar (an FP8 scale's amax) is: no kernel both reduces
/// a whole tensor and reads the result elementwise, so it is written anyway.
bool ResidualPlan::isSmall(Value value, int64_t than) const {
  if (Operation *producer = value.getDefiningOp();
      priced && producer && shlo::is(producer, "reduce") &&
      !reducesToScalar(producer))
    return false;
  std::optional<int64_t> elements = shlo::numElements(value.getType());
  return elements && (*elements < minElements || *elements * 64 <= than);
}

Cone ResidualPlan::coneOf(Value value) const {
  Cone cone;
  Block *block = value.getParentBlock();
  llvm::SmallVector<Value> worklist = {value};
  llvm::DenseSet<Value> seen;
  while (!worklist.empty()) {
    Value next = worklist.pop_back_val();
    if (!seen.insert(next).second)
      continue;
    Operation *producer = next.getDefiningOp();
    bool inBlock = producer && producer->getBlock() == block;
    if (inBlock && (shlo::isConstant(producer) ||
                    (priced && shlo::is(producer, "iota")))) {
      cone.ops.insert(producer);
      continue;
    }
    if (!inBlock || !(shlo::isElementwiseOrBroadcast(producer) ||
                      (priced && isSoftmaxReduction(producer)))) {
      cone.roots.insert(next);
      continue;
    }
    if (static_cast<int64_t>(cone.ops.size()) >= maxOps) {
      cone.complete = false;
      return cone;
    }
    cone.ops.insert(producer);
    worklist.append(producer->operand_begin(), producer->operand_end());
  }
  return cone;
}

llvm::SmallVector<std::pair<Value, Operation *>>
ResidualPlan::residualsOf(Block &block) const {
  llvm::MapVector<Value, Operation *> residuals;
  for (Operation &op : block) {
    if (!readsBackward(&op, backward))
      continue;
    op.walk([&](Operation *inner) {
      for (Value operand : inner->getOperands()) {
        Operation *producer = operand.getDefiningOp();
        std::optional<int64_t> elements = elementsOf(operand);
        if (!producer || producer->getBlock() != &block ||
            backward.contains(operand) || !elements ||
            *elements < minElements)
          continue;
        residuals.insert({operand, &op}); // keeps the first reader
      }
    });
  }
  llvm::SmallVector<std::pair<Value, Operation *>> inOrder(residuals.begin(),
                                                          residuals.end());
  llvm::sort(inOrder, [](const auto &a, const auto &b) {
    return a.first.getDefiningOp()->isBeforeInBlock(b.first.getDefiningOp());
  });
  return inOrder;
}

bool ResidualPlan::readsKept(Value residual, const Cone &cone, Block &block,
                             const llvm::DenseSet<Value> &kept) const {
  int64_t size = *elementsOf(residual);
  // A residual made from arguments alone (a parameter's compute-dtype
  // copy) is kept: recomputing it puts a barrier on the argument, which
  // costs XLA temporaries and saves nothing (docs/DESIGN.md,
  // Rematerialization).
  if (llvm::all_of(cone.roots,
                   [](Value root) { return isa<BlockArgument>(root); }))
    return false;
  return cone.complete && llvm::all_of(cone.roots, [&](Value root) {
           Operation *producer = root.getDefiningOp();
           return !producer || producer->getBlock() != &block ||
                  kept.contains(root) || isSmall(root, size) ||
                  (priced && writtenAnyway(root, residual));
         });
}

/// A recomputation pays only where XLA fuses it into the kernel of each
/// backward reader: an elementwise op, a reduction or a transpose. A
/// matrix multiply would read it from memory, written by a kernel of its
/// own, which costs what keeping it saves.
bool ResidualPlan::fusesIntoReaders(Value residual) const {
  Block *block = residual.getParentBlock();
  return llvm::all_of(residual.getUsers(), [&](Operation *user) {
    Operation *reader = block->findAncestorOpInBlock(*user);
    if (!reader || !readsBackward(reader, backward))
      return true;
    return reader == user && (shlo::isElementwiseOrBroadcast(user) ||
                              shlo::is(user, "reduce") ||
                              shlo::is(user, "transpose"));
  });
}

/// A matrix multiply's result, a library call's or a stored value (behind
/// its barrier) is written to memory by its own kernel whatever the
/// backward pass does, so keeping it costs its bytes and no kernel. It
/// serves as a leaf when it takes no more bytes than the residual. (A
/// sharding annotation is a custom call that writes nothing.)
bool ResidualPlan::writtenAnyway(Value root, Value residual) const {
  Operation *producer = root.getDefiningOp();
  bool libraryCall =
      shlo::isCustomCall(producer) && !shlo::isShardingAnnotation(producer);
  if (!shlo::isDotGeneral(producer) && !shlo::isConvolution(producer) &&
      !libraryCall && !shlo::isOptimizationBarrier(producer))
    return false;
  std::optional<int64_t> rootBytes = byteSize(root.getType());
  std::optional<int64_t> residualBytes = byteSize(residual.getType());
  return rootBytes && residualBytes && *rootBytes <= *residualBytes;
}

/// The constant ops `value` is made of, through broadcasts, reshapes and
/// converts; false if it is not a constant.
bool collectConstant(Value value, llvm::SetVector<Operation *> &ops) {
  Operation *def = value.getDefiningOp();
  if (!def)
    return false;
  if (shlo::isConstant(def)) {
    ops.insert(def);
    return true;
  }
  if (!(shlo::is(def, "broadcast_in_dim") || shlo::is(def, "reshape") ||
        shlo::isConvert(def)) ||
      !collectConstant(def->getOperand(0), ops))
    return false;
  ops.insert(def);
  return true;
}

std::optional<SoftmaxFrame>
ResidualPlan::softmaxFrameOf(Operation *exponential) const {
  Block *block = exponential->getBlock();
  std::optional<int64_t> elements = elementsOf(exponential->getResult(0));
  if (!elements || *elements < minElements)
    return std::nullopt;
  // The sum over rows, and the quotient by it.
  Value exponentials = exponential->getResult(0);
  Operation *sum = nullptr, *quotient = nullptr;
  for (Operation *user : exponentials.getUsers())
    if (user->getBlock() == block && reducesWith(user, "add") &&
        user->getNumOperands() == 2 && user->getOperand(0) == exponentials &&
        isZeroConstant(user->getOperand(1)))
      sum = user;
  auto reduced =
      sum ? sum->getAttrOfType<DenseI64ArrayAttr>("dimensions") : nullptr;
  if (!reduced)
    return std::nullopt;
  for (Operation *user : exponentials.getUsers())
    if (user->getBlock() == block && shlo::is(user, "divide") &&
        user->getOperand(0) == exponentials &&
        shlo::broadcastsRowsBack(user->getOperand(1), sum->getResult(0),
                                 reduced.asArrayRef()))
      quotient = user;
  if (!quotient)
    return std::nullopt;

  // What the forward pass makes of `e` and `s`, besides the sum and the
  // quotient: elementwise ops the backward pass alone reads (through more
  // of them), or the loss would depend on `e` other than through `q`.
  SoftmaxFrame frame;
  frame.exponentials = exponentials;
  frame.sum = sum->getResult(0);
  frame.rowDims.assign(reduced.asArrayRef().begin(), reduced.asArrayRef().end());
  llvm::SetVector<Value> derived;
  derived.insert(frame.exponentials);
  derived.insert(frame.sum);
  llvm::SetVector<Operation *> helpers;
  llvm::SetVector<Value> residuals;
  for (size_t i = 0; i < derived.size(); ++i) {
    for (OpOperand &use : derived[i].getUses()) {
      Operation *user = use.getOwner();
      Operation *reader = block->findAncestorOpInBlock(*user);
      if (reader && readsBackward(reader, backward)) {
        residuals.insert(derived[i]);
        if (!frame.firstReader || reader->isBeforeInBlock(frame.firstReader))
          frame.firstReader = reader;
        continue;
      }
      if (user == sum || user == quotient)
        continue;
      if (reader != user || !shlo::isElementwiseOrBroadcast(user) ||
          user->getNumRegions() != 0)
        return std::nullopt;
      helpers.insert(user);
      derived.insert(user->result_begin(), user->result_end());
    }
  }
  if (residuals.empty())
    return std::nullopt;

  // The copy of `q` a backward matrix multiply reads, 16 bits or more.
  Value q = quotient->getResult(0);
  llvm::SmallVector<Value> quotients = {q};
  for (Operation *user : q.getUsers())
    if (shlo::isConvert(user) && user->getBlock() == block)
      quotients.push_back(user->getResult(0));
  for (Value copy : quotients) {
    FloatType type = shlo::getFloatElementType(copy.getType());
    if (frame.stored || !type || type.getWidth() < 16 ||
        !copy.getDefiningOp()->isBeforeInBlock(frame.firstReader))
      continue;
    for (Operation *user : copy.getUsers())
      if (user->getBlock() == block && readsBackward(user, backward) &&
          (shlo::isDotGeneral(user) || shlo::isConvolution(user)))
        frame.stored = copy;
  }
  if (!frame.stored)
    return std::nullopt;

  // The ops that make the residuals: helpers, back to `e`, `s` and
  // constants (cloned too: they may come after the first reader).
  llvm::SetVector<Operation *> ops;
  llvm::SmallVector<Value> worklist(residuals.begin(), residuals.end());
  while (!worklist.empty()) {
    Operation *def = worklist.pop_back_val().getDefiningOp();
    if (!helpers.contains(def) || !ops.insert(def))
      continue;
    for (Value operand : def->getOperands())
      if (derived.contains(operand))
        worklist.push_back(operand);
      else if (!collectConstant(operand, ops))
        return std::nullopt;
  }
  frame.ops.assign(ops.begin(), ops.end());
  llvm::sort(frame.ops,
             [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  frame.residuals.assign(residuals.begin(), residuals.end());
  return frame;
}

void ResidualPlan::planBlock(Block &block) {
  // In program order, so that what a residual is made of has been decided.
  // `kept` holds what the backward pass keeps for the residuals it reads
  // as they are: a residual another kind of op makes, or the roots of one
  // elementwise ops make (XLA keeps those, or the residual itself).
  llvm::DenseSet<Value> kept;
  // A softmax frame's residuals are read from its stored quotient, which
  // is kept for them (for=memory would recompute it otherwise).
  llvm::DenseSet<Value> framed;
  for (Operation &op : block)
    if (shlo::is(&op, "exponential"))
      if (std::optional<SoftmaxFrame> frame = softmaxFrameOf(&op)) {
        framed.insert(frame->residuals.begin(), frame->residuals.end());
        kept.insert(frame->stored);
        frames.push_back(std::move(*frame));
      }
  for (auto [residual, firstReader] : residualsOf(block)) {
    if (framed.contains(residual) || kept.contains(residual))
      continue;
    Operation *producer = residual.getDefiningOp();
    if (!shlo::isElementwiseOrBroadcast(producer) &&
        !(priced && isSoftmaxReduction(producer))) {
      kept.insert(residual);
      continue;
    }
    Cone cone = coneOf(residual);
    if (!readsKept(residual, cone, block, kept) ||
        (priced && !fusesIntoReaders(residual))) {
      // Unpriced, the roots of a complete cone count as kept (XLA keeps
      // them, or the residual): more is recomputed from them, at the price
      // of writing them.
      if (!priced && cone.complete)
        kept.insert(cone.roots.begin(), cone.roots.end());
      else
        kept.insert(residual);
      continue;
    }
    Recomputation plan;
    plan.residual = residual;
    plan.firstReader = firstReader;
    plan.ops = std::move(cone.ops);
    for (Value root : cone.roots)
      plan.leaves.insert(root);
    // The leaves are kept for the backward pass now: more may be
    // recomputed from them at no price (the softmax's sum, from the
    // logits its exponentials are recomputed from).
    if (priced)
      kept.insert(cone.roots.begin(), cone.roots.end());
    planned.push_back(std::move(plan));
  }
}

class RematerializePass final
    : public amp::impl::AmpRematerializePassBase<RematerializePass> {
public:
  using AmpRematerializePassBase::AmpRematerializePassBase;

  LogicalResult initialize(MLIRContext *context) override {
    options.keep(parseOptions());
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(options.report(module)))
      return signalPassFailure();
    ResidualPlan plan(module, parsedGoal, minElements, maxOps);
    llvm::DenseSet<Value> backward = backwardValues(module);
    for (const SoftmaxFrame &frame : plan.softmaxFrames())
      readQuotient(frame, backward);
    for (auto &group : groups(plan.recomputations()))
      recompute(group, backward);
  }

private:
  OptionCheck options;
  RematerializeFor parsedGoal = kDefaultRematerializeFor;

  llvm::Error parseOptions() {
    if (minElements < 1 || maxOps < 1)
      return llvm::createStringError(
          "invalid option '" +
          llvm::Twine(minElements < 1 ? "min-elements" : "max-ops") +
          "': must be at least 1");
    return readOption("for", parseRematerializeFor(goal), parsedGoal);
  }

  using Group = llvm::SmallVector<const Recomputation *>;
  /// Recomputations that share ops, together: they are recomputed once,
  /// before the first reader of any of them.
  static std::vector<Group> groups(llvm::ArrayRef<Recomputation> all);
  void recompute(llvm::ArrayRef<const Recomputation *> group,
                 const llvm::DenseSet<Value> &backward);
  void readQuotient(const SoftmaxFrame &frame,
                    const llvm::DenseSet<Value> &backward);
};

/// Makes `frame`'s residuals from the stored quotient (for the
/// exponentials) and 1 (for the sum), before their first backward reader.
void RematerializePass::readQuotient(const SoftmaxFrame &frame,
                                     const llvm::DenseSet<Value> &backward) {
  Operation *reader = frame.firstReader;
  Location loc = reader->getLoc();
  OpBuilder builder(reader);
  Value held =
      shlo::buildOptimizationBarrier(builder, loc, frame.stored)->getResult(0);
  // Divided by its rows' sums (in f32 at least), the stored quotient's rows
  // sum to 1, as the frame's sum says. XLA fuses this, and the backward
  // pass that reads it, into one normalization kernel.
  auto exponentialsType = cast<RankedTensorType>(frame.exponentials.getType());
  FloatType elementType = shlo::getFloatElementType(exponentialsType);
  FloatType accumulate =
      elementType.getWidth() < 32 ? builder.getF32Type() : elementType;
  if (shlo::getFloatElementType(held.getType()) != accumulate)
    held = shlo::buildConvert(builder, loc, held, accumulate);
  llvm::SmallVector<int64_t> otherDims;
  for (int64_t d = 0; d < exponentialsType.getRank(); ++d)
    if (!llvm::is_contained(frame.rowDims, d))
      otherDims.push_back(d);
  Value rowSums = shlo::buildReduce(builder, loc, held, frame.rowDims, "add", 0);
  Value exponentials = shlo::buildElementwise(
      builder, loc, "divide",
      {held, shlo::buildBroadcastInDim(
                 builder, loc, rowSums,
                 cast<RankedTensorType>(held.getType()), otherDims)});
  if (accumulate != elementType)
    exponentials = shlo::buildConvert(builder, loc, exponentials, elementType);
  auto sumType = cast<RankedTensorType>(frame.sum.getType());
  IRMapping mapping;
  mapping.map(frame.exponentials, exponentials);
  mapping.map(frame.sum,
              shlo::buildBroadcastScalar(
                  builder, loc,
                  shlo::buildScalar(builder, loc, sumType.getElementType(), 1),
                  sumType));
  for (Operation *op : frame.ops)
    builder.clone(*op, mapping);
  Block *block = reader->getBlock();
  for (Value residual : frame.residuals)
    residual.replaceUsesWithIf(mapping.lookup(residual), [&](OpOperand &use) {
      Operation *owner = block->findAncestorOpInBlock(*use.getOwner());
      return owner && readsBackward(owner, backward);
    });
}

std::vector<RematerializePass::Group>
RematerializePass::groups(llvm::ArrayRef<Recomputation> all) {
  llvm::EquivalenceClasses<const Recomputation *> classes;
  llvm::DenseMap<Operation *, const Recomputation *> owner;
  for (const Recomputation &r : all) {
    classes.insert(&r);
    for (Operation *op : r.ops)
      if (!shlo::isConstant(op))
        if (auto [it, fresh] = owner.try_emplace(op, &r); !fresh)
          classes.unionSets(it->second, &r);
  }
  std::vector<Group> result;
  llvm::DenseMap<const Recomputation *, size_t> index;
  for (const Recomputation &r : all) {
    auto [it, fresh] =
        index.try_emplace(classes.getLeaderValue(&r), result.size());
    if (fresh)
      result.emplace_back();
    result[it->second].push_back(&r);
  }
  return result;
}

void RematerializePass::recompute(llvm::ArrayRef<const Recomputation *> group,
                                  const llvm::DenseSet<Value> &backward) {
  Operation *reader = group.front()->firstReader;
  llvm::SetVector<Value> leaves;
  llvm::SetVector<Operation *> ops;
  for (const Recomputation *r : group) {
    if (r->firstReader->isBeforeInBlock(reader))
      reader = r->firstReader;
    leaves.insert(r->leaves.begin(), r->leaves.end());
    ops.insert(r->ops.begin(), r->ops.end());
  }
  llvm::SmallVector<Operation *> ordered(ops.begin(), ops.end());
  llvm::sort(ordered, [](Operation *a, Operation *b) {
    return a->isBeforeInBlock(b);
  });
  // Leaves in program order (arguments and outer values first), so the
  // barrier reads like the forward pass.
  llvm::SmallVector<Value> sortedLeaves(leaves.begin(), leaves.end());
  llvm::stable_sort(sortedLeaves, [&](Value a, Value b) {
    Operation *x = a.getDefiningOp(), *y = b.getDefiningOp();
    bool xHere = x && x->getBlock() == reader->getBlock();
    bool yHere = y && y->getBlock() == reader->getBlock();
    if (xHere != yHere)
      return yHere;
    return xHere && x->isBeforeInBlock(y);
  });
  OpBuilder builder(reader);
  IRMapping mapping;
  if (!sortedLeaves.empty()) {
    Operation *barrier =
        shlo::buildOptimizationBarrier(builder, reader->getLoc(), sortedLeaves);
    for (auto [leaf, held] : llvm::zip(sortedLeaves, barrier->getResults()))
      mapping.map(leaf, held);
  }
  for (Operation *op : ordered)
    builder.clone(*op, mapping);
  Block *block = reader->getBlock();
  for (const Recomputation *r : group) {
    Value residual = r->residual;
    Value recomputed = mapping.lookup(residual);
    residual.replaceUsesWithIf(recomputed, [&](OpOperand &use) {
      Operation *owner = block->findAncestorOpInBlock(*use.getOwner());
      return owner && !owner->isBeforeInBlock(reader) &&
             readsBackward(owner, backward);
    });
  }
}

} // namespace
