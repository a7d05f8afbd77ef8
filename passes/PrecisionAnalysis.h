//===- PrecisionAnalysis.h - Decide the precision of every value ----------===//
//
// The analysis behind amp-insert-converts. It only decides: for each op,
// whether it computes in the compute dtype or in f32 and why; for each value,
// the type it takes and whether it is stored rounded to the compute dtype;
// for each use, the type it needs. The pass's rewriter applies these
// decisions and decides nothing itself.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_PRECISIONANALYSIS_H
#define STABLEHLO_AMP_PRECISIONANALYSIS_H

#include "Contract.h"
#include "OpClasses.h"
#include "Policy.h"
#include "Scopes.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringSet.h"

#include <string>
#include <vector>

namespace mlir::amp {

/// What the analysis is asked to do (the parsed pass options).
struct PrecisionOptions {
  Policy policy;
  Level level = kDefaultLevel;
  Target target = kDefaultTarget;
  DotResult dotResult = DotResult::F32;
  Storage storage = Storage::F32;
  /// Smaller values are never stored low (see Passes.td, storage).
  int64_t storageMinElements = 4096;
  llvm::StringSet<> keepF32, forceCompute;
  /// Per-layer overrides (see Passes.td, scopes); they win over keepF32,
  /// forceCompute and a dot's requested precision.
  ScopeOverrides scopes;
  /// Calibration groups kept in f32 (see `OpDecision::group`).
  llvm::DenseSet<int64_t> keepGroups;
  /// Every rounding in a form XLA keeps (see Passes.td, strict).
  bool strict = false;
  /// The result dtype of the backward pass's GEMMs (see Passes.td).
  ReduceDtype reduceDtype = kDefaultReduceDtype;
  /// How much of a discrete decision's cone stays f32 (see Passes.td).
  Decisions decisions = kDefaultDecisions;
};

/// The decision for one op.
struct OpDecision {
  OpClass cls = OpClass::Fixed;
  bool low = false;        ///< computes in the compute dtype
  bool denyMarked = false; ///< downstream of a sensitive op (stays f32)
  /// keep-f32, an f32 scope, a requested precision, a decision, linear
  /// algebra, calibration
  bool forcedHigh = false;
  bool forcedLow = false; ///< force-compute, a compute scope
  Reason reason = Reason::Fixed;
  std::string detail; ///< what exactly ("sum reduction", "top_k")
  /// The calibration group: each matrix multiply that may go low opens one
  /// (numbered in program order), and ops painted low because of it join it.
  int64_t group = -1;
};

class PrecisionAnalysis {
public:
  /// Decides everything for `module`, which must not change until the
  /// rewriter has read the decisions.
  PrecisionAnalysis(ModuleOp module, const PrecisionOptions &options);

  /// The decided ops (not function ops, not ops inside reduction bodies), in
  /// program order.
  llvm::ArrayRef<Operation *> ops() const { return order; }
  const OpDecision &decision(Operation *op) const;
  bool isDecided(Operation *op) const { return decisions.count(op); }

  /// The type `value` takes (its computed type).
  Type newType(Value value) const;
  /// The type `operand`'s owner needs (converted at the use if different).
  Type wantedType(OpOperand &operand) const;
  /// Whether `operand` is a gate's hidden state: an f32 activation that a
  /// matrix multiply gating a discrete decision reads, and that another
  /// reader takes in the compute dtype. The gate reads that rounding,
  /// widened: the hidden state stays in the compute dtype, the gate's
  /// weights and arithmetic in f32.
  bool readsComputeCopy(OpOperand &operand) const;
  /// Values stored low (rounded to the compute dtype right after they are
  /// made and read back in f32 by their f32 users), in program order.
  llvm::ArrayRef<Value> storedValues() const { return storedOrder; }
  /// Whether `value` is derived from the loss seed or a cotangent (it is
  /// a gradient, or on the way to one); known only when something is
  /// lowered.
  bool inBackwardPass(Value value) const { return backward.contains(value); }
  /// Whether a decision depends on how many partitions XLA's SPMD
  /// partitioner splits the program into (`mhlo.num_partitions`): a driver
  /// that lowers it partitioned rewrites it again, declared so.
  bool dependsOnPartitions() const { return partitionDependent; }
  /// Ops with a reduction body whose body computes in the compute dtype.
  bool lowersBody(Operation *op) const;
  /// The report's view of an op: its precision and the reason.
  Precision precisionOf(Operation *op) const;

  FloatType fullType() const { return full; }
  FloatType computeType() const { return compute; }
  const PrecisionOptions &options() const { return opts; }

  /// Whether `type` is f32 (or a tensor of it): full precision.
  bool isFull(Type type) const;
  bool isFull(Value value) const { return isFull(value.getType()); }

private:
  const PrecisionOptions &opts;
  FloatType full, compute, param, output;
  std::vector<Operation *> order;
  llvm::DenseMap<Operation *, OpDecision> decisions;
  llvm::DenseSet<Value> exact; ///< values that must not be rounded
  llvm::DenseSet<Value> backward; ///< derived from the loss seed
  /// Call sites of each function, by name.
  llvm::DenseMap<Attribute, llvm::SmallVector<Operation *>> callSites;
  llvm::DenseSet<Value> stored;
  /// Lowered dots whose result is made in the compute dtype (gpu/tpu).
  llvm::DenseSet<Operation *> lowResultDots;
  std::vector<Value> storedOrder;
  bool partitionDependent = false;

  // Building the graph.
  void collect(ModuleOp module);
  OpDecision decideClass(Operation *op);
  /// The user's overrides of `d`: op names, a requested precision, scopes.
  void applyOverrides(Operation *op, OpDecision &d) const;
  void assignGroups();
  // Values that feed discrete decisions or linear algebra stay f32, back
  // through their producers.
  void keepExactCones();
  void keepExactBackFrom(Value value, Reason reason, llvm::StringRef detail);
  /// Values that reach `arg` (call operands of a private function's
  /// argument; a loop's input and next value of its carried argument).
  llvm::SmallVector<Value> flowsInto(BlockArgument arg) const;
  /// Values that become result `index` of a call or control-flow op.
  llvm::SmallVector<Value> flowsOutOf(Operation *op, unsigned index) const;
  // Painting (TF grappler's order).
  void paint();
  void paintSeeds();
  void markDenyDownstream();
  void markBetweenAllow();
  void pullClearOpsIntoLowProducers();
  void followLowInputs();
  void explainFullPrecision();
  // Storage.
  struct ValueKinds {
    llvm::DenseSet<Value> statistics; ///< reductions and their arithmetic
    llvm::DenseSet<Value> constants;  ///< constants and their data movement
    llvm::DenseSet<Value> normalised; ///< f32 data centred by a statistic
    /// Data centred by a statistic, rounded or not, and its scalings.
    llvm::DenseSet<Value> centred;
  };
  ValueKinds classifyValues() const;
  void decideStorage();
  void reduceInComputeDtype();
  void keepGradientProductsLow();
  void keepPartitionedNormTermsLow(bool partitioned);
  /// Calls `visit` on each paintable f32 multiply of the backward pass, in
  /// program order, one of whose operands satisfies `first` and the other
  /// `second`; what `visit` decides is seen by the multiplies after it.
  void forEachBackwardProduct(llvm::function_ref<bool(Value)> first,
                              llvm::function_ref<bool(Value)> second,
                              llvm::function_ref<void(Operation *)> visit);
  /// `op` computes in the compute dtype, for `reason`.
  void makeLow(Operation *op, Reason reason);
  bool isCheapToRebuild(Operation *op) const;
  bool dividedByItsOwnSum(Value value) const;
  bool mayStoreLow(Value value, const llvm::DenseSet<Value> &statistics,
                   const llvm::DenseMap<Operation *, int64_t> &gemmsBefore)
      const;

  bool paintable(const OpDecision &decision) const;
  /// The decided op that stands for `op` (an op inside a reduction body is
  /// represented by the reduction), or null.
  Operation *decidedOwner(Operation *op) const;
  /// Decided ops that consume a full-precision result of `op`.
  llvm::SmallVector<Operation *> floatUsers(Operation *op) const;
  /// Decided ops that produce a full-precision operand of `op`.
  llvm::SmallVector<Operation *> floatProducers(Operation *op) const;
  Type resultElementType(Operation *op, Value result) const;
  OpDecision &at(Operation *op) { return decisions.find(op)->second; }
};

} // namespace mlir::amp

#endif // STABLEHLO_AMP_PRECISIONANALYSIS_H
