//===- StableHLO.h - StableHLO ops as unregistered operations -------------===//
//
// No StableHLO C++ library is available to us, so the passes see StableHLO
// ops as unregistered operations in generic form. Everything that knows a
// StableHLO op name, an attribute name, an operand role or how to build an op
// lives here, so the passes read as they would against the real dialect.
// Knowledge that is amp's own (which ops are numerically sensitive, which
// attributes amp sets) lives in OpClasses.h and Contract.h.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_STABLEHLO_H
#define STABLEHLO_AMP_STABLEHLO_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>

namespace mlir::amp::shlo {

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

inline constexpr llvm::StringLiteral kDialect = "stablehlo";
inline constexpr llvm::StringLiteral kChloDialect = "chlo";

/// The op name without its dialect prefix ("add"), for StableHLO and CHLO
/// ops; empty for any other op.
llvm::StringRef shortName(Operation *op);
/// True for ops of the StableHLO (or CHLO) dialects.
bool isStableHLO(Operation *op);
/// True if `op` is `stablehlo.<name>` (CHLO ops: `isChlo`).
bool is(Operation *op, llvm::StringRef name);
bool isChlo(Operation *op, llvm::StringRef name);

/// The full name of an op named in an option: `tanh` is `stablehlo.tanh`.
std::string qualifiedOpName(llvm::StringRef name);
/// Every StableHLO and CHLO op name (qualified), from the specifications;
/// the names options may mention.
llvm::ArrayRef<llvm::StringRef> knownOpNames();
bool isKnownOpName(llvm::StringRef qualifiedName);
/// Up to `limit` known op names closest to `name` (by edit distance), for
/// "did you mean" errors.
llvm::SmallVector<llvm::StringRef> nearestOpNames(llvm::StringRef name,
                                                  unsigned limit = 3);
/// The qualified name of an op named in `option` (keep-f32, ...), or an
/// error naming the option, the unknown name and the nearest known ones.
llvm::Expected<std::string> checkedOpName(llvm::StringRef option,
                                          llvm::StringRef name);

inline constexpr llvm::StringLiteral kConvertOpName = "stablehlo.convert";

inline bool isConvert(Operation *op) { return is(op, "convert"); }
inline bool isConstant(Operation *op) { return is(op, "constant"); }
inline bool isDotGeneral(Operation *op) { return is(op, "dot_general"); }
inline bool isConvolution(Operation *op) { return is(op, "convolution"); }
inline bool isCustomCall(Operation *op) { return is(op, "custom_call"); }
inline bool isOptimizationBarrier(Operation *op) {
  return is(op, "optimization_barrier");
}
/// The terminator of StableHLO regions (`stablehlo.return`).
inline bool isRegionReturn(Operation *op) { return is(op, "return"); }
/// Elementwise ops of the StableHLO specification (each result element from
/// the operand elements at its index), and the broadcasts and reshapes that
/// feed them: what XLA fuses into one loop, and what can be recomputed
/// without materialising anything.
bool isElementwiseOrBroadcast(Operation *op);
/// Control flow whose regions are painted as part of the enclosing function.
bool isControlFlow(Operation *op);
/// Ops whose regions are applied element-wise (reduce, reduce_window,
/// scatter, sort, select_and_scatter, map, all_reduce, ... bodies).
bool hasApplierRegions(Operation *op);

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

/// An inherent attribute (stored as a property of an unregistered op) or a
/// discardable one.
Attribute getAttr(Operation *op, llvm::StringRef name);
/// The target of a `stablehlo.custom_call`, or empty.
llvm::StringRef customCallTarget(Operation *op);
/// A custom call that only annotates a sharding (@Sharding, the SPMD shape
/// calls): it writes no memory of its own.
bool isShardingAnnotation(Operation *op);
/// The function a `stablehlo.composite` stands for (its `decomposition`),
/// or null.
FlatSymbolRefAttr compositeDecomposition(Operation *op);
/// The name of a `stablehlo.composite` ("chlo.top_k"), or empty.
llvm::StringRef compositeName(Operation *op);
/// How many partitions XLA's SPMD partitioner splits the program into: the
/// module's `mhlo.num_partitions` (what JAX writes for a sharded `jit`), 1
/// where it has none.
int64_t partitionCount(ModuleOp module);

/// Sets `key = value` in the op's `mhlo.frontend_attributes`: XLA carries
/// these through to the compiled program's instructions (fused ones too),
/// which is how a decision can be found again after XLA is done.
void setFrontendAttribute(Operation *op, llvm::StringRef key,
                          llvm::StringRef value);
/// Marks `op` as decision `index` of kind `key` for the compiled program:
/// the XLA frontend attribute `key = "index"`, and `[key=index]` after the
/// last part of its location's name, which XLA carries as the op_name of
/// every instruction made from it (frontend attributes are lost where
/// layout normalization moves them onto a bitcast that is then folded).
void markDecision(Operation *op, llvm::StringRef key, int64_t index);

//===----------------------------------------------------------------------===//
// Operand roles
//===----------------------------------------------------------------------===//

/// The number of reduced inputs of a reduce, reduce_window or scatter (a
/// variadic reduction has more than one).
unsigned numReducedInputs(Operation *op);
/// The element-wise combiner of a reduction body that is one binary op on its
/// two block arguments ("add" for a sum), "return-update" for a scatter that
/// overwrites, or empty.
llvm::StringRef reductionBodyKind(Operation *op);
/// The operands of a `stablehlo.sort` that its comparator reads (its keys).
llvm::SmallVector<unsigned> sortKeyOperands(Operation *sort);
/// The index operands of gather/scatter/dynamic_slice/dynamic_update_slice:
/// values that pick elements.
llvm::SmallVector<unsigned> indexOperands(Operation *op);

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

/// The float element type of `type` if it is a ranked or unranked tensor of
/// floats (or a float scalar), else null.
FloatType getFloatElementType(Type type);
/// The lowercase MLIR spelling of `type` ("f8e4m3fn", "bf16"): the
/// contract's dtype names.
std::string floatTypeName(FloatType type);
/// True if `from` and `to` have float elements and every value of `from`'s
/// is exactly representable in `to`'s (a convert between them is exact).
bool isExactWidening(Type from, Type to);
/// `type` with its element type replaced by `elementType`; shape and encoding
/// are kept.
Type withElementType(Type type, Type elementType);
/// Static element count of a ranked tensor, or nullopt.
std::optional<int64_t> numElements(Type type);
/// True if every element of `value` is one number: a splat constant, or a
/// broadcast (through reshapes and converts) of a one-element tensor.
bool isScalarSplat(Value value);
/// Whether `divisor` is `sum`, a reduction of a tensor shaped like
/// `divisor` over `reduced`, broadcast back over exactly those dimensions
/// (through the broadcasts and unit-dimension reshapes of keepdims): each
/// element is divided by the sum of its own row.
bool broadcastsRowsBack(Value divisor, Value sum,
                        llvm::ArrayRef<int64_t> reduced);

//===----------------------------------------------------------------------===//
// dot_general dimension numbers
//===----------------------------------------------------------------------===//

/// `#stablehlo.dot<...>`. Without the dialect it is an opaque attribute, so it
/// is read and written as the text the StableHLO printer uses; any key we do
/// not know makes the dot unreadable (and it is left alone).
struct DotDimensions {
  llvm::SmallVector<int64_t> lhsBatch, rhsBatch, lhsContracting,
      rhsContracting;
  static std::optional<DotDimensions> parse(llvm::StringRef text);
  std::string print() const;
};
std::optional<DotDimensions> getDotDimensions(Operation *dot);
/// True if the dot carries an explicit `algorithm` (its precision is the
/// user's choice).
bool hasDotAlgorithm(Operation *dot);
/// The strongest precision a dot_general's or convolution's
/// `precision_config` asks of an operand, "HIGHEST" or "HIGH"; empty for
/// DEFAULT or none.
llvm::StringRef requestedPrecision(Operation *op);

//===----------------------------------------------------------------------===//
// Builders (generic form, inherent attributes as properties)
//===----------------------------------------------------------------------===//

/// `stablehlo.convert` of `value` to `elementType`.
Value buildConvert(OpBuilder &builder, Location loc, Value value,
                   Type elementType);
/// A float `stablehlo.constant` re-encoded as `elementType`. Values that
/// overflow the new type saturate to its largest finite value; `saturated`
/// reports whether that happened. Null if `constant` holds no dense float
/// elements.
Value buildReencodedConstant(OpBuilder &builder, Operation *constant,
                             Type elementType, bool *saturated);
/// Re-encodes a float `stablehlo.constant` in place; false (and `constant`
/// untouched) if it holds no dense float elements.
[[nodiscard]] bool reencodeConstantInPlace(Operation *constant,
                                           Type elementType, bool *saturated);
Value buildTranspose(OpBuilder &builder, Location loc, Value value,
                     llvm::ArrayRef<int64_t> permutation);
Value buildReshape(OpBuilder &builder, Location loc, Value value,
                   llvm::ArrayRef<int64_t> shape);
/// `stablehlo.reduce_precision` of `value` to the exponent and mantissa
/// bits of `format`: rounds to nearest even, keeping `value`'s type. XLA
/// never removes it from a wider type (JAX's own precision blocker).
Value buildReducePrecision(OpBuilder &builder, Location loc, Value value,
                           FloatType format);
/// `stablehlo.optimization_barrier` over `values`: XLA cannot fold or fuse
/// across it.
Operation *buildOptimizationBarrier(OpBuilder &builder, Location loc,
                                    ValueRange values);
/// A dot_general like `prototype` (precision config and discardable
/// attributes kept) with new operands, dimensions and result type.
Value buildDotGeneral(OpBuilder &builder, Operation *prototype, Value lhs,
                      Value rhs, const DotDimensions &dims, Type resultType);
/// Elementwise ops on same-typed operands (`add`, `multiply`, `maximum`,
/// `and`, `abs`, ...), by StableHLO short name.
Value buildElementwise(OpBuilder &builder, Location loc, llvm::StringRef name,
                       ValueRange operands);
/// A `stablehlo.constant` of `value`.
Value buildConstant(OpBuilder &builder, Location loc, DenseElementsAttr value);
/// A scalar (rank-0) constant of `elementType`.
Value buildScalar(OpBuilder &builder, Location loc, Type elementType,
                  double value);
/// `scalars` (i1, rank 0) combined with the binary `combiner` ("and",
/// "or"); the i1 constant `empty` where there is none.
Value buildCombineScalars(OpBuilder &builder, Location loc,
                          llvm::ArrayRef<Value> scalars,
                          llvm::StringRef combiner, bool empty);
/// `stablehlo.compare` with `direction` (EQ, NE, GE, GT, LE, LT).
Value buildCompare(OpBuilder &builder, Location loc, Value lhs, Value rhs,
                   llvm::StringRef direction);
Value buildSelect(OpBuilder &builder, Location loc, Value predicate,
                  Value onTrue, Value onFalse);
/// `stablehlo.clamp(min, value, max)`.
Value buildClamp(OpBuilder &builder, Location loc, Value min, Value value,
                 Value max);
Value buildIsFinite(OpBuilder &builder, Location loc, Value value);
/// `stablehlo.bitcast_convert` of `value` to `resultType` (same bits; a
/// wider element type drops the last dimension, a narrower one adds it).
Value buildBitcastConvert(OpBuilder &builder, Location loc, Value value,
                          Type resultType);
/// `stablehlo.rng_bit_generator` with the THREE_FRY algorithm: from
/// `state` (ui64[2]) the next state and random bits of `bitsType`.
std::pair<Value, Value> buildRngBitGenerator(OpBuilder &builder, Location loc,
                                             Value state, Type bitsType);
/// `stablehlo.iota` of `type`: element i along `dimension` is i.
Value buildIota(OpBuilder &builder, Location loc, RankedTensorType type,
                int64_t dimension);
/// A full reduction of `value` to a rank-0 tensor with the binary combiner
/// `combiner` ("and", "maximum", "add") and the initial value `init`.
Value buildReduceAll(OpBuilder &builder, Location loc, Value value,
                     llvm::StringRef combiner, double init);
/// Full reductions of `values` (tensors of one shape) as one variadic
/// `stablehlo.reduce`, value i with `combiners[i]` from `inits[i]`: one
/// pass over the elements (XLA runs it as one kernel).
llvm::SmallVector<Value>
buildReduceAllTogether(OpBuilder &builder, Location loc, ValueRange values,
                       llvm::ArrayRef<llvm::StringRef> combiners,
                       llvm::ArrayRef<double> inits);
/// A reduction of `value` over `dimensions` with the binary combiner
/// `combiner` and the initial value `init`.
Value buildReduce(OpBuilder &builder, Location loc, Value value,
                  llvm::ArrayRef<int64_t> dimensions, llvm::StringRef combiner,
                  double init);
/// `stablehlo.broadcast_in_dim` of `value` to `type`'s shape, operand
/// dimension i becoming result dimension `dimensions[i]`.
Value buildBroadcastInDim(OpBuilder &builder, Location loc, Value value,
                          RankedTensorType type,
                          llvm::ArrayRef<int64_t> dimensions);
/// Broadcasts a rank-0 tensor to `type`'s shape.
Value buildBroadcastScalar(OpBuilder &builder, Location loc, Value scalar,
                           RankedTensorType type);
/// `value - zero`, `zero` a scalar (of any number type) that is always 0
/// but that XLA cannot know: exactly `value` (NaN, infinities and -0
/// included), which XLA cannot compute before `zero`. Orders a reader of
/// `value` after what `zero` is made from.
Value buildAfter(OpBuilder &builder, Location loc, Value value, Value zero);
/// `stablehlo.slice` of `value` from `start` to `limit` (exclusive).
Value buildSlice(OpBuilder &builder, Location loc, Value value,
                 llvm::ArrayRef<int64_t> start, llvm::ArrayRef<int64_t> limit,
                 llvm::ArrayRef<int64_t> strides);
/// `stablehlo.concatenate` of `values` along `dimension`.
Value buildConcatenate(OpBuilder &builder, Location loc, ValueRange values,
                       int64_t dimension);
/// `loop` (a `stablehlo.while`) carrying more values: `inits` enter it,
/// `next(builder, carried)` makes their values for the next iteration in
/// the body (before its return), and the new loop's last results are
/// their final values. `loop`'s results are replaced and it is erased.
Operation *extendWhile(
    OpBuilder &builder, Operation *loop, ValueRange inits,
    llvm::function_ref<llvm::SmallVector<Value>(OpBuilder &, ValueRange)>
        next);
/// `stablehlo.composite "name"` of `operands` with `attributes`, which
/// `decomposition` (a function of the same signature) implements.
Operation *buildComposite(OpBuilder &builder, Location loc,
                          llvm::StringRef name, ValueRange operands,
                          Type resultType, DictionaryAttr attributes,
                          FlatSymbolRefAttr decomposition);
/// Builds a `stablehlo.return` (the terminator of StableHLO regions).
Operation *buildRegionReturn(OpBuilder &builder, Location loc,
                             ValueRange values);

} // namespace mlir::amp::shlo

#endif // STABLEHLO_AMP_STABLEHLO_H
