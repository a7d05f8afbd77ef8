//===- Provenance.cpp - Where a step's first non-finite value came from --===//

#include "Provenance.h"
#include "Contract.h"
#include "StableHLO.h"

#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SmallVectorExtras.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"


#include <limits>

using namespace mlir;
using namespace mlir::amp;

namespace {

/// What groups an op into its region: the name JAX gives it without the
/// primitive (its transformations and scope, so a module's forward and
/// backward pass differ: `jit(f)/transpose(jvp(Model))/Block_0`), and, where
/// that names no scope of the user's (no `jax.named_scope` or module path
/// below the function JAX differentiates), its innermost frame's
/// `file:line`. Empty when the location has neither. `primitive` gets the
/// name's last part, without a decision tag.
std::string regionKey(Location loc, std::string &primitive) {
  std::string name, frame;
  loc->walk([&](Location inner) {
    if (auto named = dyn_cast<NameLoc>(inner); named && name.empty())
      name = named.getName().str();
    if (auto file = dyn_cast<FileLineColLoc>(inner); file && frame.empty()) {
      // A line of the user's is a region; an installed library's file is
      // one (an optimizer's per-parameter chain of lines: the values it
      // hands from line to line are not checked one by one).
      llvm::StringRef path = file.getFilename().getValue();
      frame = path.contains("/site-packages/") ||
                      path.contains("/dist-packages/")
                  ? path.str()
                  : (path + ":" + llvm::Twine(file.getLine())).str();
    }
    return WalkResult::advance();
  });
  llvm::SmallVector<llvm::StringRef> parts;
  llvm::StringRef(name).split(parts, '/');
  primitive = parts.empty() ? "" : parts.back().split('[').first.str();
  if (!parts.empty())
    parts.pop_back();
  std::string scope = llvm::join(parts, "/");
  // `jit(f)` parts name functions the step was lowered from; JAX's
  // transformations wrap a part (`jvp(Model)`, `transpose(jvp())`). A scope
  // of the user's is what is left of the other parts without them.
  bool scoped = llvm::any_of(parts, [](llvm::StringRef part) {
    if (part.starts_with("jit(") || part.starts_with("pjit("))
      return false;
    while (part.ends_with(")") && part.contains('('))
      part = part.drop_until([](char c) { return c == '('; })
                 .drop_front()
                 .drop_back();
    return !part.empty();
  });
  if (scope.empty() && frame.empty())
    return "";
  return scoped ? scope : scope + "@" + frame;
}

/// Ops that hold no computation of the user's: their values are finite.
bool inNoRegion(Operation *op) {
  return shlo::isConstant(op) || shlo::is(op, "iota");
}

/// Whether every NaN or infinity in the operand `use` of `op` surely leaves
/// a NaN or an infinity in its result (the result its operand becomes, for
/// a barrier): ops that move values, sums and products (inf * 0 is NaN),
/// and the numerator of a quotient. Not exp, tanh, a maximum or a select,
/// which can turn an infinity or a NaN into a finite value, nor a slice.
bool keepsNonFinite(Operation *op, OpOperand &use) {
  if (op->getNumResults() == 0 ||
      !shlo::getFloatElementType(op->getResult(0).getType()))
    return false;
  if (shlo::isOptimizationBarrier(op))
    return true;
  if (shlo::is(op, "divide") || shlo::is(op, "pad"))
    return use.getOperandNumber() == 0;
  if (shlo::is(op, "reduce"))
    return op->getNumResults() == 1 && use.getOperandNumber() == 0 &&
           shlo::reductionBodyKind(op) == "add";
  for (llvm::StringRef name :
       {"add", "subtract", "multiply", "negate", "abs", "sqrt", "log",
        "convert", "reshape", "transpose", "broadcast_in_dim", "concatenate",
        "dot_general"})
    if (shlo::is(op, name))
      return true;
  return false;
}

/// A float convert to a narrower format: a rounding.
bool isNarrowing(Operation *op) {
  if (!shlo::isConvert(op))
    return false;
  FloatType from = shlo::getFloatElementType(op->getOperand(0).getType());
  FloatType to = shlo::getFloatElementType(op->getResult(0).getType());
  return from && to && to.getWidth() < from.getWidth();
}

/// The front end's wrapper of the gradients: an identity.
bool isGradientsCall(Operation *op) {
  return shlo::customCallTarget(op) == attr::kGradientsCall;
}

/// Ops that move their operand's values unchanged.
bool movesValues(Operation *op) {
  return op->getNumOperands() == 1 &&
         (shlo::is(op, "reshape") || shlo::is(op, "transpose") ||
          shlo::is(op, "broadcast_in_dim") ||
          (shlo::isConvert(op) &&
           shlo::isExactWidening(op->getOperand(0).getType(),
                                 op->getResult(0).getType())));
}

/// The name JAX gives an argument of a lowered function, its path in the
/// argument trees (`batch[0]['x']`); empty where it has none.
llvm::StringRef argumentName(BlockArgument argument) {
  auto named = dyn_cast<NameLoc>(argument.getLoc());
  return named ? named.getName().getValue() : "";
}

/// The argument tree a name is of: `batch` for `batch[0]['x']`.
llvm::StringRef argumentTree(llvm::StringRef name) {
  return name.take_until([](char c) { return c == '[' || c == '.'; });
}

/// An argument tree of at most this many leaves has an input region per
/// leaf, so that a NaN in a batch of a few arrays is reported with the
/// leaf's path; a larger one (the parameters of a model) has one.
constexpr int64_t kLeavesByName = 16;

/// The element type of a float tensor with elements; null otherwise.
FloatType checkedElementType(Value value) {
  std::optional<int64_t> count = shlo::numElements(value.getType());
  if (!count || *count == 0)
    return {};
  return shlo::getFloatElementType(value.getType());
}

/// The format a value's elements were last rounded to: its own, or that of
/// the narrower value it widens back exactly, through optimization barriers
/// and moves (a value stored in f16 and read back in f32 overflowed f16,
/// not f32).
FloatType roundedFormat(Value value) {
  FloatType narrowest = checkedElementType(value);
  for (int depth = 0; narrowest && depth < 8; ++depth) {
    Operation *op = value.getDefiningOp();
    if (op && shlo::isOptimizationBarrier(op))
      value = op->getOperand(cast<OpResult>(value).getResultNumber());
    else if (op && movesValues(op))
      value = op->getOperand(0);
    else
      break;
    FloatType element = shlo::getFloatElementType(value.getType());
    if (element && element.getWidth() < narrowest.getWidth())
      narrowest = element;
  }
  return narrowest;
}

} // namespace

namespace {
/// Splits main's body into regions (`assign`), links each to the regions
/// it reads (`linkInputs`), and decides which values each checks
/// (`decideChecks`).
class RegionFinder {
public:
  /// Region 0 is the step's unnamed inputs; each named argument tree
  /// (`params`, `batch`: JAX's names for a lowered function's arguments),
  /// or each of its leaves where it has few, is an input region of its own,
  /// so that a NaN in the batch is reported as the batch's.
  explicit RegionFinder(func::FuncOp main) : body(main.front()) {
    openInput("inputs", nullptr);
    llvm::StringMap<int64_t> leaves;
    for (BlockArgument argument : body.getArguments())
      if (checkedElementType(argument))
        ++leaves[argumentTree(argumentName(argument))];
    for (BlockArgument argument : body.getArguments()) {
      llvm::StringRef name =
          checkedElementType(argument) ? argumentName(argument) : "";
      llvm::StringRef key = leaves[argumentTree(name)] <= kLeavesByName
                                ? name
                                : argumentTree(name);
      int64_t region = 0;
      if (!key.empty()) {
        auto [open, added] = inputByKey.try_emplace(key, regions.size());
        if (added)
          openInput(key, &argument);
        region = open->second;
      }
      inputOf.push_back(region);
    }
  }

  std::vector<ProvenanceRegion> find() {
    for (Operation &op : body.without_terminator())
      assign(op);
    linkInputs();
    decideChecks();
    collectChecks();
    return std::move(regions);
  }

private:
  Block &body;
  std::vector<ProvenanceRegion> regions;
  /// The input region of each of main's arguments, and of each tree.
  llvm::SmallVector<int64_t> inputOf;
  llvm::StringMap<int64_t> inputByKey;
  llvm::StringMap<int64_t> openByKey;
  llvm::DenseMap<Operation *, int64_t> regionOfOp;
  /// What the front end's gradients call (an identity amp-loss-scale
  /// removes) passes on is of its operands' regions.
  llvm::DenseMap<Value, int64_t> passedOn;
  /// The regions each region reads, directly or not.
  std::vector<llvm::BitVector> reads;
  /// Values computed from constants alone (a broadcast NaN that a select
  /// discards: jnp.var's) are no region's: not the user's data.
  llvm::DenseSet<Operation *> constant;
  /// Values whose non-finite elements set their region's bit, and of
  /// those, the ones checked themselves.
  llvm::DenseSet<Value> guarded, checked;
  /// Rounded copies checked for the region of the value they round.
  llvm::SmallVector<std::pair<Value, int64_t>> roundedFor;

  void openInput(llvm::StringRef key, BlockArgument *argument) {
    regions.emplace_back();
    regions.back().key = key.str();
    if (argument)
      regions.back().argument = *argument;
    reads.emplace_back();
  }
  /// Whether `region` is one of the step's inputs (no op's).
  bool isInput(int64_t region) {
    return region >= 0 && !regions[region].first;
  }
  int64_t regionOf(Value value) {
    if (auto found = passedOn.find(value); found != passedOn.end())
      return found->second;
    if (auto argument = dyn_cast<BlockArgument>(value))
      return argument.getOwner() == &body ? inputOf[argument.getArgNumber()]
                                          : -1;
    Operation *op = body.findAncestorOpInBlock(*value.getDefiningOp());
    auto found = regionOfOp.find(op);
    return found == regionOfOp.end() ? -1 : found->second;
  }
  int64_t regionOf(Operation *op) {
    auto found = regionOfOp.find(op);
    return found == regionOfOp.end() ? -1 : found->second;
  }
  llvm::BitVector &readsOf(int64_t region) {
    if (reads[region].size() < regions.size())
      reads[region].resize(regions.size());
    return reads[region];
  }

  bool isConstant(Operation &op) {
    return inNoRegion(&op) ||
           (op.getNumRegions() == 0 && op.getNumOperands() > 0 &&
            llvm::all_of(op.getOperands(), [&](Value operand) {
              return operand.getDefiningOp() &&
                     constant.contains(operand.getDefiningOp());
            }));
  }
  void assign(Operation &op);
  void linkInputs();
  bool leaves(Value value, int64_t region);
  bool covered(Value value, int64_t region);
  Value roundedCopy(Value value, int depth = 0);
  void decide(Value value, int64_t region);
  void decideChecks();
  int64_t operandsRegion(Operation &op);
  void handOn(int64_t region, Value value);
  void collectChecks();
};

/// The region of an op with no key of its own: its first operand's that is
/// not an input. An op of inputs alone (the batch's rounding, named as its
/// argument) gets none (-1): its values are of the input they read, for
/// the regions that read them.
int64_t RegionFinder::operandsRegion(Operation &op) {
  int64_t input = -1;
  for (Value operand : op.getOperands()) {
    int64_t from = regionOf(operand);
    if (from >= 0 && !isInput(from))
      return from;
    if (input < 0 && from > 0)
      input = from;
  }
  if (input > 0)
    for (Value result : op.getResults())
      passedOn[result] = input;
  return -1;
}

/// Puts `op` in a region: the open region of its key (its first operand's
/// region where it has none), unless that would close a cycle (it reads a
/// region that reads this one: layer norm, attention, then the residual
/// add of one scope); then it opens a new region of its key. So regions
/// form a DAG, and the first to go non-finite is one whose inputs are
/// finite.
void RegionFinder::assign(Operation &op) {
  if (isConstant(op)) {
    constant.insert(&op);
    return;
  }
  if (isGradientsCall(&op)) {
    for (auto [operand, result] :
         llvm::zip_equal(op.getOperands(), op.getResults()))
      passedOn[result] = regionOf(operand);
    return;
  }
  std::string primitive;
  std::string key = regionKey(op.getLoc(), primitive);
  llvm::SmallVector<int64_t> sources;
  op.walk([&](Operation *nested) {
    for (Value operand : nested->getOperands())
      if (int64_t from = regionOf(operand); from >= 0)
        sources.push_back(from);
  });
  int64_t region = -1;
  if (key.empty()) {
    region = operandsRegion(op);
    if (region < 0)
      return;
    key = regions[region].key;
  } else if (auto open = openByKey.find(key); open != openByKey.end()) {
    region = open->second;
  }
  bool closesCycle =
      region >= 0 && llvm::any_of(sources, [&](int64_t from) {
        return from != region && readsOf(from).test(region);
      });
  if (region < 0 || closesCycle) {
    region = regions.size();
    openByKey[key] = region;
    regions.emplace_back();
    regions.back().key = key;
    regions.back().first = &op;
    reads.emplace_back();
  }
  for (int64_t from : sources)
    if (from != region) {
      readsOf(region).set(from);
      readsOf(region) |= readsOf(from);
    }
  regionOfOp[&op] = region;
  auto &primitives = regions[region].primitives;
  if (!primitive.empty() && !llvm::is_contained(primitives, primitive))
    primitives.push_back(primitive);
}

/// What each region reads from the others (through the ops nested in a
/// loop or conditional too).
void RegionFinder::linkInputs() {
  for (Operation &op : body.without_terminator()) {
    int64_t region = regionOf(&op);
    if (region < 0)
      continue;
    op.walk([&](Operation *nested) {
      for (Value operand : nested->getOperands()) {
        int64_t from = regionOf(operand);
        if (from >= 0 && from != region)
          regions[region].inputs.insert(from);
      }
    });
  }
}

/// Whether another region reads `value` of `region`, or main returns it.
bool RegionFinder::leaves(Value value, int64_t region) {
  return llvm::any_of(value.getUses(), [&](OpOperand &use) {
    Operation *reader = body.findAncestorOpInBlock(*use.getOwner());
    if (reader == body.getTerminator())
      return true;
    if (isGradientsCall(reader))
      return leaves(reader->getResult(use.getOperandNumber()), region);
    int64_t other = regionOf(reader);
    // (An input's reader may be in no region: an op that reads inputs alone
    // and has no location to group by, as the rounding of the batch that
    // carries the argument's own name.)
    return other != region && (other >= 0 || isInput(region));
  });
}

/// Whether every non-finite element of `value` surely reaches a value of
/// its region that sets the region's bit (`keepsNonFinite`).
bool RegionFinder::covered(Value value, int64_t region) {
  for (OpOperand &use : value.getUses()) {
    Operation *user = use.getOwner();
    if (user->getBlock() != &body || !keepsNonFinite(user, use) ||
        regionOf(user) != region)
      continue;
    Value result = shlo::isOptimizationBarrier(user)
                       ? user->getResult(use.getOperandNumber())
                       : user->getResult(0);
    if (guarded.contains(result))
      return true;
  }
  return false;
}

/// A copy of `value` rounded to a narrower format, through reshapes and
/// transposes; null if there is none.
Value RegionFinder::roundedCopy(Value value, int depth) {
  for (Operation *user : value.getUsers()) {
    if (user->getBlock() != &body)
      continue;
    if (isNarrowing(user))
      return user->getResult(0);
    if (depth < 4 && (shlo::is(user, "reshape") || shlo::is(user, "transpose")))
      if (Value rounded = roundedCopy(user->getResult(0), depth + 1))
        return rounded;
  }
  return {};
}

/// Whether `value` of `region` is checked. A value the region hands on (read
/// by another region, or returned) is, unless it is covered. A value
/// rounded to a narrower format is checked as its rounded copy, for its
/// region: the copy has every non-finite element of the value, and an
/// infinity the rounding makes (an f16 overflow) is the value's too; XLA
/// keeps the copy, where it would fuse the wider value away (into a GEMM's
/// epilogue) but for a check.
void RegionFinder::decide(Value value, int64_t region) {
  if (!checkedElementType(value))
    return;
  if (covered(value, region)) {
    guarded.insert(value);
    return;
  }
  if (!leaves(value, region))
    return;
  guarded.insert(value);
  // (Not an input's: it is read where it is anyway, and its rounding is no
  // part of the inputs.)
  if (Value rounded = isInput(region) ? Value() : roundedCopy(value)) {
    roundedFor.push_back({rounded, region});
    return;
  }
  checked.insert(value);
}

/// Decided from the last op back, so each value's readers come first.
void RegionFinder::decideChecks() {
  for (Operation &op : llvm::reverse(body.without_terminator()))
    if (int64_t region = regionOf(&op); region >= 0)
      for (Value result : op.getResults())
        decide(result, region);
  for (BlockArgument argument : body.getArguments())
    decide(argument, regionOf(argument));
  // A value that only moves one another region made (a reshape, transpose,
  // broadcast or exact widening of it) is non-finite exactly where that one
  // is, and then that region's bit is set: it is not checked again. (Never
  // a link of a covering chain: that one's operand is of its own region.)
  for (Operation &op : body.without_terminator())
    if (movesValues(&op) && checked.contains(op.getResult(0)) &&
        regionOf(op.getOperand(0)) != regionOf(&op) &&
        guarded.contains(op.getOperand(0)))
      checked.erase(op.getResult(0));
}

void RegionFinder::handOn(int64_t region, Value value) {
  ProvenanceRegion &target = regions[region];
  target.handedOn.push_back(value);
  FloatType element = roundedFormat(value);
  if (!target.narrowest || element.getWidth() < target.narrowest.getWidth())
    target.narrowest = element;
}

void RegionFinder::collectChecks() {
  for (auto [rounded, region] : roundedFor)
    handOn(region, rounded);
  for (BlockArgument argument : body.getArguments())
    if (checked.contains(argument))
      handOn(regionOf(argument), argument);
  for (Operation &op : body.without_terminator())
    if (int64_t region = regionOf(&op); region >= 0)
      for (Value result : op.getResults())
        if (checked.contains(result))
          handOn(region, result);
}
} // namespace

std::vector<ProvenanceRegion>
mlir::amp::findProvenanceRegions(func::FuncOp main) {
  return RegionFinder(main).find();
}

namespace {
/// What one check of a value found: its largest and smallest elements,
/// from 0. XLA's maximum and minimum keep a NaN, so the largest is NaN if
/// the value has one, else +inf if it has one; the smallest is -inf if it
/// has one. (A value with both reports its NaN.)
struct Check {
  Value largest;
  Value smallest;
  int64_t region;
  /// True, from the same reduction: `x == x or x != x` for every element.
  /// A reader that selects on it cannot start before the check, at no
  /// cost of its own (a comparison of `largest` would be a kernel).
  Value always;
};

/// Checks `value` with one variadic reduction of the value itself.
/// (Comparisons before the reduction, `x != x` and `|x| == inf`, let
/// XLA:GPU fuse them into the kernel that writes the value and reduce the
/// predicates it then stores, 1 byte per element: +11% memory on an H100.
/// Comparisons after it cost a kernel each: its flags are compared as one
/// vector, `packBits`.)
Check checkNonFinite(OpBuilder &builder, Location loc, Value value,
                     int64_t region, bool withAlways) {
  // In f32: XLA:CPU reduces a 16-bit maximum element by element, 30x
  // slower (a widening keeps NaN and infinities).
  auto element = cast<FloatType>(getElementTypeOrSelf(value.getType()));
  if (element.getWidth() < 32)
    value = shlo::buildConvert(builder, loc, value, builder.getF32Type());
  llvm::SmallVector<Value> values{value, value};
  llvm::SmallVector<llvm::StringRef> combiners{"maximum", "minimum"};
  llvm::SmallVector<double> inits{0.0, 0.0};
  if (withAlways) {
    values.push_back(shlo::buildElementwise(
        builder, loc, "or",
        {shlo::buildCompare(builder, loc, value, value, "EQ"),
         shlo::buildCompare(builder, loc, value, value, "NE")}));
    combiners.push_back("and");
    inits.push_back(1.0);
  }
  llvm::SmallVector<Value> reduced =
      shlo::buildReduceAllTogether(builder, loc, values, combiners, inits);
  return {reduced[0], reduced[1], region,
          withAlways ? reduced[2] : Value()};
}

/// Makes `use` read its value after `check`: `select(always, x, -x)`,
/// exactly `x`, which XLA cannot compute before the check.
void readAfter(OpBuilder &builder, Location loc, OpOperand &use,
               const Check &check) {
  Value value = use.get();
  auto type = cast<RankedTensorType>(value.getType());
  Value always = shlo::buildBroadcastScalar(
      builder, loc, check.always,
      RankedTensorType::get(type.getShape(), builder.getI1Type()));
  use.set(shlo::buildSelect(
      builder, loc, always, value,
      shlo::buildElementwise(builder, loc, "negate", {value})));
}

/// Values at least this large (bytes, whole: 64 MiB) have their check
/// placed before their first elementwise reader. A small value kept to the
/// end of the step costs little, and a wait costs XLA a kernel where the
/// reader cannot take it: on the H100 LM, waits on every value over 1 MiB
/// took 23 more kernels (379 against 356) for 61 MiB less per device
/// sharded over 8 (507.9 against 568.5).
constexpr int64_t kHeldBytes = int64_t{1} << 26;

/// The first elementwise reader, among `uses`, of a value of `body` at
/// least `kHeldBytes` large; null if there is none.
OpOperand *firstHeldReader(Block &body, Value value,
                           llvm::ArrayRef<OpOperand *> uses) {
  auto type = cast<RankedTensorType>(value.getType());
  if (!type.hasStaticShape() ||
      type.getNumElements() * type.getElementTypeBitWidth() / 8 < kHeldBytes)
    return nullptr;
  OpOperand *first = nullptr;
  for (OpOperand *use : uses) {
    Operation *reader = use->getOwner();
    if (reader->getBlock() == &body &&
        shlo::isElementwiseOrBroadcast(reader) &&
        (!first || reader->isBeforeInBlock(first->getOwner())))
      first = use;
  }
  return first;
}

/// Whether the kernel that checks `value` reads one of main's arguments:
/// an argument, or a value of elementwise ops on one, which XLA fuses into
/// the check (the optimizer's new parameter, `p + update`, reads `p`).
bool readsInputWhenFused(Value value, int depth = 0) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return isa<func::FuncOp>(argument.getOwner()->getParentOp());
  Operation *producer = value.getDefiningOp();
  if (depth > 6 || !shlo::isElementwiseOrBroadcast(producer))
    return false;
  return llvm::any_of(producer->getOperands(), [&](Value operand) {
    return readsInputWhenFused(operand, depth + 1);
  });
}

/// Whether `reader` of a step's input is part of what writes an output
/// over an input's buffer: the return, or an op that may write its result
/// over its operand's (an elementwise op, a loop's or conditional's
/// carried value, an in-place update) whose value reaches the return
/// through such ops. Only those readers of an input wait for its check:
/// the others (a parameter's cast for the forward pass, a GEMM) would
/// start later for nothing, and XLA would store `p - 0` for a GEMM (+12
/// MiB of f32 parameters on the bench LM with an f32 policy).
bool writesOutput(Operation *reader, int depth = 0) {
  if (isa<func::ReturnOp>(reader))
    return true;
  bool mayWriteOver = shlo::isElementwiseOrBroadcast(reader) ||
                      shlo::isControlFlow(reader) ||
                      shlo::is(reader, "dynamic_update_slice") ||
                      shlo::is(reader, "scatter");
  if (depth > 8 || !mayWriteOver)
    return false;
  return llvm::any_of(reader->getUsers(), [&](Operation *user) {
    return writesOutput(user, depth + 1);
  });
}

/// Whether any of `largest` (checks' largest elements, from 0) is below 0:
/// never, but XLA cannot know. One vector per element type, so that it
/// costs a kernel or two, not one per check.
Value anyBelowZero(OpBuilder &builder, Location loc,
                   llvm::ArrayRef<Value> largest) {
  llvm::MapVector<Type, llvm::SmallVector<Value>> byType;
  for (Value value : largest)
    byType[getElementTypeOrSelf(value.getType())].push_back(
        shlo::buildReshape(builder, loc, value, {1}));
  llvm::SmallVector<Value> below;
  for (auto &[element, group] : byType) {
    Value vector = shlo::buildConcatenate(builder, loc, group, 0);
    auto type = cast<RankedTensorType>(vector.getType());
    Value zeros = shlo::buildBroadcastScalar(
        builder, loc, shlo::buildScalar(builder, loc, element, 0.0), type);
    below.push_back(shlo::buildReduce(
        builder, loc, shlo::buildCompare(builder, loc, vector, zeros, "LT"),
        {0}, "or", 0));
  }
  return shlo::buildCombineScalars(builder, loc, below, "or", false);
}

/// Makes the readers of a checked value that reads a step's input
/// (`readsInputWhenFused`; `uses`: its readers before the check, or for an
/// input those that `writesOutput`) read it after its check, through
/// `value - never`, where `never` is false but made from the check
/// (`anyBelowZero`): exactly `value` (NaN, infinities and -0 included),
/// which XLA cannot compute before the check. An input is donated, so the
/// step writes its new value over it; a check that the writer does not
/// wait for makes XLA copy the input first (every parameter and moment:
/// +11% memory on an H100), or fuse the check with the write, which then
/// cannot be in place. (An optimization barrier orders nothing here: XLA
/// removes barriers before it places copies.)
void readAfterCheck(OpBuilder &builder, Location loc,
                    llvm::ArrayRef<OpOperand *> uses, Value never) {
  if (uses.empty())
    return;
  Value held = shlo::buildAfter(builder, loc, uses.front()->get(), never);
  for (OpOperand *use : uses)
    use->set(held);
}

/// The OR of `masks` (`i32[checks, words]`) over the checks whose `flags`
/// (`i1[checks]`) are set: `i32[words]`.
Value maskedOr(OpBuilder &builder, Location loc, Value flags, Value masks) {
  auto type = cast<RankedTensorType>(masks.getType());
  Value set = shlo::buildBroadcastInDim(
      builder, loc, flags,
      RankedTensorType::get(type.getShape(), builder.getI1Type()), {0});
  Value zeros = shlo::buildBroadcastScalar(
      builder, loc, shlo::buildScalar(builder, loc, type.getElementType(), 0),
      type);
  return shlo::buildReduce(builder, loc,
                           shlo::buildSelect(builder, loc, set, masks, zeros),
                           {0}, "or", 0);
}

/// The NaN and infinity bits (`i32[words]` each) of `checks`: bit `r % 32`
/// of word `r / 32` is set where a check of region r found one. The checks'
/// extremes are concatenated, per element type, and compared as vectors: a
/// few kernels, where comparisons of each scalar cost XLA a kernel each.
std::pair<Value, Value> packBits(OpBuilder &builder, Location loc,
                                 llvm::ArrayRef<Check> checks, int64_t words) {
  Type i32 = builder.getI32Type();
  auto bitsType = RankedTensorType::get({words}, i32);
  Value nanBits = shlo::buildBroadcastScalar(
      builder, loc, shlo::buildScalar(builder, loc, i32, 0), bitsType);
  Value infBits = nanBits;
  llvm::MapVector<Type, llvm::SmallVector<const Check *>> byType;
  for (const Check &check : checks)
    byType[getElementTypeOrSelf(check.largest.getType())].push_back(&check);
  for (auto &[type, group] : byType) {
    auto element = cast<FloatType>(type);
    int64_t count = group.size();
    auto vector = [&](Value Check::*extreme) {
      return shlo::buildConcatenate(
          builder, loc, llvm::map_to_vector(group, [&](const Check *check) {
            return shlo::buildReshape(builder, loc, check->*extreme, {1});
          }), 0);
    };
    Value largest = vector(&Check::largest);
    Value smallest = vector(&Check::smallest);
    auto vectorType = RankedTensorType::get({count}, element);
    auto constant = [&](double value) {
      return shlo::buildBroadcastScalar(
          builder, loc, shlo::buildScalar(builder, loc, element, value),
          vectorType);
    };
    llvm::SmallVector<int32_t> masks(count * words, 0);
    for (auto [i, check] : llvm::enumerate(group))
      masks[i * words + check->region / 32] =
          static_cast<int32_t>(uint32_t{1} << (check->region % 32));
    Value maskValues = shlo::buildConstant(
        builder, loc,
        DenseElementsAttr::get(RankedTensorType::get({count, words}, i32),
                               llvm::ArrayRef(masks)));
    nanBits = shlo::buildElementwise(
        builder, loc, "or",
        {nanBits,
         maskedOr(builder, loc,
                  shlo::buildCompare(builder, loc, largest, largest, "NE"),
                  maskValues)});
    double inf = std::numeric_limits<double>::infinity();
    Value infinite = shlo::buildElementwise(
        builder, loc, "or",
        {shlo::buildCompare(builder, loc, largest, constant(inf), "EQ"),
         shlo::buildCompare(builder, loc, smallest, constant(-inf), "EQ")});
    infBits = shlo::buildElementwise(
        builder, loc, "or",
        {infBits, maskedOr(builder, loc, infinite, maskValues)});
  }
  return {nanBits, infBits};
}
/// An input's readers that wait for the inputs' checks, and the largest
/// element its check found.
using HeldInput = std::pair<llvm::SmallVector<OpOperand *>, Value>;

/// Makes the readers in `inputs` wait for every input's check (one flag
/// for all: the inputs are all there at the start), and clears it.
void holdInputs(OpBuilder &builder, func::FuncOp main,
                llvm::SmallVectorImpl<HeldInput> &inputs) {
  if (llvm::all_of(inputs, [](auto &input) { return input.first.empty(); })) {
    inputs.clear();
    return;
  }
  Operation *last = inputs.front().second.getDefiningOp();
  for (auto &input : inputs)
    if (last->isBeforeInBlock(input.second.getDefiningOp()))
      last = input.second.getDefiningOp();
  builder.setInsertionPointAfter(last);
  Value never = anyBelowZero(
      builder, main.getLoc(),
      llvm::map_to_vector(inputs, [](auto &input) { return input.second; }));
  for (auto &[uses, largest] : inputs)
    readAfterCheck(builder, main.getLoc(), uses, never);
  inputs.clear();
}

/// Checks `value`, which region `index` hands on (`loc`: its first op's),
/// and makes the readers that must wait for the check wait; an input's
/// readers are added to `inputs`, to wait for every input's check.
Check checkHandedOn(OpBuilder &builder, func::FuncOp main, Value value,
                    int64_t index, Location loc,
                    llvm::SmallVectorImpl<HeldInput> &inputs) {
  Block &body = main.front();
  // Next to the value, so XLA can fuse the check into the kernel that
  // writes it, and the value need not live longer for it. (Checking the
  // values of one shape together, in one kernel, kept them alive longer:
  // +28% memory and slower steps on XLA:CPU.)
  if (Operation *producer = value.getDefiningOp())
    builder.setInsertionPointAfter(producer);
  else
    builder.setInsertionPointToStart(&body);
  llvm::SmallVector<OpOperand *> uses;
  bool input = isa<BlockArgument>(value);
  // (A reader inside a loop or a conditional counts as that op.)
  for (OpOperand &use : value.getUses())
    if (!input || writesOutput(body.findAncestorOpInBlock(*use.getOwner())))
      uses.push_back(&use);
  // Of a large value that is neither, the first elementwise reader waits
  // for the check, or XLA may check last and keep the value alive until
  // then (sharded over 8 H100s, the attention scores of every layer). One
  // reader places the check, and an elementwise one takes the wait into
  // its own kernel.
  bool fromInput = !input && readsInputWhenFused(value);
  OpOperand *held =
      input || fromInput ? nullptr : firstHeldReader(body, value, uses);
  Check check = checkNonFinite(builder, loc, value, index, held != nullptr);
  if (input)
    inputs.push_back({uses, check.largest});
  else if (fromInput)
    readAfterCheck(builder, loc, uses,
                   anyBelowZero(builder, loc, check.largest));
  else if (held)
    readAfter(builder, loc, *held, check);
  return check;
}

} // namespace

Value mlir::amp::buildProvenanceBits(OpBuilder &builder, func::FuncOp main,
                                     llvm::ArrayRef<ProvenanceRegion> regions) {
  llvm::SmallVector<Check> checks;
  llvm::SmallVector<HeldInput> inputs;
  bool held = false;
  for (auto [index, region] : llvm::enumerate(regions)) {
    if (region.first && !held) { // the first region of ops
      holdInputs(builder, main, inputs);
      held = true;
    }
    Location loc = region.first ? region.first->getLoc() : main.getLoc();
    for (Value value : region.handedOn)
      checks.push_back(
          checkHandedOn(builder, main, value, index, loc, inputs));
  }
  holdInputs(builder, main, inputs);
  Location loc = main.getLoc();
  builder.setInsertionPoint(main.front().getTerminator());
  int64_t words = (regions.size() + 31) / 32;
  auto [nanBits, infBits] = packBits(builder, loc, checks, words);
  return shlo::buildConcatenate(
      builder, loc,
      {shlo::buildReshape(builder, loc, nanBits, {1, words}),
       shlo::buildReshape(builder, loc, infBits, {1, words})},
      0);
}

ArrayAttr
mlir::amp::provenanceRegionsAttr(MLIRContext *context,
                                 llvm::ArrayRef<ProvenanceRegion> regions) {
  Builder builder(context);
  llvm::SmallVector<Attribute> records;
  for (const ProvenanceRegion &region : regions) {
    std::string loc;
    llvm::raw_string_ostream os(loc);
    if (region.first)
      region.first->getLoc().print(os);
    else if (region.argument)
      region.argument.getLoc().print(os);
    llvm::SmallVector<Attribute> primitives, inputs;
    for (const std::string &primitive : region.primitives)
      primitives.push_back(builder.getStringAttr(primitive));
    for (int64_t input : region.inputs)
      inputs.push_back(builder.getI64IntegerAttr(input));
    records.push_back(builder.getDictionaryAttr({
        builder.getNamedAttr(region_key::kLoc, builder.getStringAttr(loc)),
        builder.getNamedAttr(region_key::kPrimitives,
                             builder.getArrayAttr(primitives)),
        builder.getNamedAttr(
            region_key::kFormat,
            builder.getStringAttr(region.narrowest
                                      ? shlo::floatTypeName(region.narrowest)
                                      : "")),
        builder.getNamedAttr(region_key::kInputs,
                             builder.getArrayAttr(inputs)),
        builder.getNamedAttr(
            region_key::kValues,
            builder.getI64IntegerAttr(region.handedOn.size())),
    }));
  }
  return builder.getArrayAttr(records);
}
