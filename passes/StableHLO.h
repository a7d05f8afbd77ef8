//===- StableHLO.h - StableHLO ops as unregistered operations -------------===//
//
// No StableHLO C++ library is available to us, so the passes see StableHLO
// ops as unregistered operations in generic form. Everything that knows an op
// name, an attribute name, an operand role or how to build an op lives here,
// so the passes read as they would against the real dialect.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_STABLEHLO_H
#define STABLEHLO_AMP_STABLEHLO_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <optional>

namespace mlir::amp::shlo {

/// The attribute the passes use to mark converts they inserted, and (with
/// `annotate=true`) the precision decision taken for each op.
inline constexpr llvm::StringLiteral kInsertedAttr = "amp.inserted";
inline constexpr llvm::StringLiteral kPrecisionAttr = "amp.precision";
/// An argument attribute: this argument of a public function keeps its dtype
/// (it is not a parameter). Removed by amp-insert-converts.
inline constexpr llvm::StringLiteral kKeepDtypeAttr = "amp.keep_dtype";

/// How an op takes part in mixed precision (see Passes.td).
enum class OpClass {
  Allow,   ///< dot_general, convolution: low-precision operands
  Deny,    ///< numerically sensitive: stays f32
  Infer,   ///< elementwise arithmetic: follows its inputs
  Clear,   ///< data movement: never forces a convert
  Convert, ///< an existing convert: any operand type, its result type is kept
  Fixed,   ///< keeps its exact types (custom_call, unknown, control flow, ...)
};

/// The class of `op`. `reason` names why, for reports ("sum reduction").
OpClass classify(Operation *op, std::string *reason = nullptr);

/// True if `op` carries regions that are applied element-wise (reduce,
/// reduce_window, scatter, sort, ... bodies): their block arguments and ops
/// take the precision of the op, they are not painted on their own.
bool hasApplierRegions(Operation *op);

/// The full name of an op named in an option: `tanh` is `stablehlo.tanh`.
std::string qualifiedOpName(llvm::StringRef name);

/// True for ops of the StableHLO (or CHLO) dialects.
bool isStableHLO(Operation *op);
bool isConvert(Operation *op);
bool isConstant(Operation *op);
bool isDotGeneral(Operation *op);
bool isConvolution(Operation *op);
/// The terminator of StableHLO regions (`stablehlo.return`).
bool isRegionReturn(Operation *op);
/// Control flow whose regions are painted as part of the enclosing function.
bool isControlFlow(Operation *op);

/// An inherent attribute (stored as a property of an unregistered op) or a
/// discardable one.
Attribute getAttr(Operation *op, llvm::StringRef name);

/// The float element type of `type` if it is a ranked or unranked tensor of
/// floats (or a float scalar), else null.
FloatType getFloatElementType(Type type);
/// `type` with its element type replaced by `elementType`; shape and encoding
/// are kept.
Type withElementType(Type type, Type elementType);

/// Builds `stablehlo.convert` of `value` to `elementType`.
Value buildConvert(OpBuilder &builder, Location loc, Value value,
                   Type elementType);
/// Re-encodes a float `stablehlo.constant` as `elementType`. Values that
/// overflow the new type saturate to its largest finite value; `saturated`
/// reports whether that happened. Returns null if `constant` holds no dense
/// float elements.
Value buildReencodedConstant(OpBuilder &builder, Operation *constant,
                             Type elementType, bool *saturated);
/// Re-encodes a float `stablehlo.constant` in place.
bool reencodeConstantInPlace(Operation *constant, Type elementType,
                             bool *saturated);

/// dot_general dimension numbers (`#stablehlo.dot<...>`).
struct DotDimensions {
  llvm::SmallVector<int64_t> lhsBatch, rhsBatch, lhsContracting,
      rhsContracting;
};
std::optional<DotDimensions> getDotDimensions(Operation *dot);
/// True if the dot carries an explicit `algorithm` (its precision is the
/// user's choice).
bool hasDotAlgorithm(Operation *dot);
Value buildTranspose(OpBuilder &builder, Location loc, Value value,
                     llvm::ArrayRef<int64_t> permutation);
Value buildReshape(OpBuilder &builder, Location loc, Value value,
                   llvm::ArrayRef<int64_t> shape);
/// `stablehlo.optimization_barrier` over `values`: XLA cannot fold or fuse
/// across it.
Operation *buildOptimizationBarrier(OpBuilder &builder, Location loc,
                                    ValueRange values);
/// Builds a dot_general like `prototype` (precision config kept) with new
/// operands, dimensions and result type.
Value buildDotGeneral(OpBuilder &builder, Operation *prototype, Value lhs,
                      Value rhs, const DotDimensions &dims, Type resultType);

//===----------------------------------------------------------------------===//
// Loss scaling
//===----------------------------------------------------------------------===//

/// The custom call the Python driver wraps gradients in so the loss-scale
/// pass can find them anywhere in a training step; the pass removes it.
inline constexpr llvm::StringLiteral kGradientsMarker = "stablehlo_amp.gradients";
bool isGradientsMarker(Operation *op);

/// Elementwise ops on same-typed operands (`add`, `multiply`, `maximum`,
/// `and`, ...), by StableHLO short name.
Value buildElementwise(OpBuilder &builder, Location loc, llvm::StringRef name,
                       ValueRange operands);
/// A scalar (rank-0) constant of `elementType`.
Value buildScalar(OpBuilder &builder, Location loc, Type elementType,
                  double value);
/// `stablehlo.compare` with `direction` (EQ, NE, GE, GT, LE, LT).
Value buildCompare(OpBuilder &builder, Location loc, Value lhs, Value rhs,
                   llvm::StringRef direction);
Value buildSelect(OpBuilder &builder, Location loc, Value predicate,
                  Value onTrue, Value onFalse);
Value buildIsFinite(OpBuilder &builder, Location loc, Value value);
/// AND of every element of a boolean tensor, as a rank-0 tensor.
Value buildReduceAll(OpBuilder &builder, Location loc, Value predicate);
/// Broadcasts a rank-0 tensor to `type`'s shape.
Value buildBroadcastScalar(OpBuilder &builder, Location loc, Value scalar,
                           RankedTensorType type);

} // namespace mlir::amp::shlo

#endif // STABLEHLO_AMP_STABLEHLO_H
