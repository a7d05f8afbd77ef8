//===- Mxfp8.cpp - MXFP8 GEMMs: blocks of 32 with E8M0 scales -------------===//
//
// amp-fp8-gemms' `scaling=mxfp8`: each operand as a matrix [free,
// contraction], quantized to E4M3 in blocks of 32 along the contraction
// with power-of-two (E8M0) scales, and the GEMM written as an
// `xla.scaled_dot` composite (a block-scaled GEMM on Blackwell) or as a dot
// of dequantized operands. XLA:CPU runs both upcast, exactly.
//
//===----------------------------------------------------------------------===//

#include "Mxfp8.h"

#include "Contract.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/SymbolTable.h"

#include <cmath>

using namespace mlir;
using namespace mlir::amp;

/// An MXFP8 GEMM's operands are matrices [free, contraction] (XLA's
/// scaled-dot takes one free and one contracting dimension each), blocked
/// along the contraction, and the product [M, N] is reshaped back.
static const shlo::DotDimensions &matrixDimensions() {
  static const shlo::DotDimensions dims{{}, {}, {1}, {1}};
  return dims;
}

Value mlir::amp::mxfp8::asMatrix(OpBuilder &builder, Location loc,
                                Value value,
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

Fp8Operand mlir::amp::mxfp8::quantizeBlocks(OpBuilder &builder, Location loc,
                                            Value wide, int64_t blockDim) {
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
  Value scaled = op(
      "divide", {blocks, shlo::buildBroadcastInDim(
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

/// The private function decomposing an `xla.scaled_dot` composite that
/// replaces `dot` (the dequantized dot), added to `module`.
static FlatSymbolRefAttr scaledDotDecomposition(ModuleOp module,
                                                Operation *dot,
                                                TypeRange operandTypes,
                                                Type resultType) {
  MLIRContext *context = module.getContext();
  Location loc = dot->getLoc();
  auto function = func::FuncOp::create(
      loc, attr::kScaledDotComposite,
      FunctionType::get(context, operandTypes, {resultType}));
  function.setPrivate();
  // Unique among the module's symbols (one per dot): xla.scaled_dot_0, ...
  SymbolTable(module).insert(function);
  OpBuilder builder(context);
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


/// `dot`'s `xla.scaled_dot` composite of the [M, N] matrices: the codes
/// and their E8M0 scales, accumulating in the dot's result type if that is
/// f32 or bf16 (the composite's only result types), else in f32. XLA turns
/// it into a block-scaled GEMM that keeps no marker: the lhs scale, which
/// only the GEMM reads, carries `marker` too.
static Operation *buildScaledDotComposite(OpBuilder &builder, ModuleOp module,
                                          Operation *dot,
                                          const Fp8Operand &lhs,
                                          const Fp8Operand &rhs, int64_t m,
                                          int64_t n, int64_t marker) {
  Location loc = dot->getLoc();
  MLIRContext *context = builder.getContext();
  const shlo::DotDimensions &dims = matrixDimensions();
  Type e8m0 = Float8E8M0FNUType::get(context);
  Value lhsScale = shlo::buildConvert(builder, loc, lhs.scale, e8m0);
  Value rhsScale = shlo::buildConvert(builder, loc, rhs.scale, e8m0);
  shlo::markDecision(lhsScale.getDefiningOp(), attr::kFp8Marker, marker);
  Type accumulated =
      cast<RankedTensorType>(dot->getResult(0).getType()).getElementType();
  if (!accumulated.isBF16() && !accumulated.isF32())
    accumulated = builder.getF32Type();
  auto compositeType = RankedTensorType::get({m, n}, accumulated);
  llvm::SmallVector<Value> operands{lhs.value, rhs.value, lhsScale, rhsScale};
  auto ints = [&](llvm::ArrayRef<int64_t> values) {
    llvm::SmallVector<Attribute> attrs;
    for (int64_t v : values)
      attrs.push_back(builder.getI64IntegerAttr(v));
    return ArrayAttr::get(context, attrs);
  };
  // ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)).
  Attribute dimensionNumbers = ArrayAttr::get(
      context,
      {ArrayAttr::get(context,
                      {ints(dims.lhsContracting), ints(dims.rhsContracting)}),
       ArrayAttr::get(context, {ints(dims.lhsBatch), ints(dims.rhsBatch)})});
  DictionaryAttr attributes = builder.getDictionaryAttr(
      {builder.getNamedAttr("dimension_numbers", dimensionNumbers),
       builder.getNamedAttr("preferred_element_type",
                            TypeAttr::get(accumulated))});
  Operation *gemm = shlo::buildComposite(
      builder, loc, attr::kScaledDotComposite, operands, compositeType,
      attributes,
      scaledDotDecomposition(module, dot, ValueRange(operands).getTypes(),
                             compositeType));
  // The dot's decision (and any attribute of its own) stays with it.
  gemm->setDiscardableAttrs(dot->getDiscardableAttrDictionary());
  return gemm;
}

/// `dot` on the dequantized [M, N] matrices: each code times its scale,
/// exactly, in the dot's operand type. XLA:CPU rewrites a bf16 dot into an
/// f32 one without its marker: the lhs's dequantization (the FP8 rounding
/// kept) carries `marker` too.
static Operation *buildDequantizedDot(OpBuilder &builder, Operation *dot,
                                      const Fp8Operand &lhs,
                                      const Fp8Operand &rhs, int64_t m,
                                      int64_t n, int64_t marker) {
  Location loc = dot->getLoc();
  auto operandType = [&](unsigned i) {
    return cast<RankedTensorType>(dot->getOperand(i).getType())
        .getElementType();
  };
  // The codes go through a barrier: without one XLA:GPU, in a partitioned
  // program, folded the FP8 convert into the bf16 one and dropped the
  // rounding.
  auto held = [&](Value codes) {
    return shlo::buildOptimizationBarrier(builder, loc, codes)->getResult(0);
  };
  Value lhsValues = dequantizeBlocks(builder, loc, held(lhs.value), lhs.scale,
                                     1, operandType(0));
  shlo::markDecision(lhsValues.getDefiningOp(), attr::kFp8Marker, marker);
  Value rhsValues = dequantizeBlocks(builder, loc, held(rhs.value), rhs.scale,
                                     1, operandType(1));
  auto resultType = cast<RankedTensorType>(dot->getResult(0).getType());
  return shlo::buildDotGeneral(
             builder, dot, lhsValues, rhsValues, matrixDimensions(),
             RankedTensorType::get({m, n}, resultType.getElementType()))
      .getDefiningOp();
}

void mlir::amp::mxfp8::replaceWithBlockScaledDot(OpBuilder &builder,
                                                 ModuleOp module,
                                                 Operation *dot,
                                                 const Fp8Operand &lhs,
                                                 const Fp8Operand &rhs,
                                                 bool composite,
                                                 int64_t marker) {
  Location loc = dot->getLoc();
  auto resultType = cast<RankedTensorType>(dot->getResult(0).getType());
  // [M, N] of the matrices, reshaped to the dot's result (batch dimensions
  // of one, lhs free, rhs free) at the end.
  int64_t m = cast<RankedTensorType>(lhs.value.getType()).getDimSize(0);
  int64_t n = cast<RankedTensorType>(rhs.value.getType()).getDimSize(0);
  Operation *gemm =
      composite ? buildScaledDotComposite(builder, module, dot, lhs, rhs, m, n,
                                          marker)
                : buildDequantizedDot(builder, dot, lhs, rhs, m, n, marker);
  Value result = gemm->getResult(0);
  if (cast<RankedTensorType>(result.getType()).getElementType() !=
      resultType.getElementType())
    result = shlo::buildConvert(builder, loc, result,
                                resultType.getElementType());
  shlo::markDecision(gemm, attr::kFp8Marker, marker);
  if (resultType.getShape() != llvm::ArrayRef<int64_t>{m, n})
    result = shlo::buildReshape(builder, loc, result, resultType.getShape());
  dot->getResult(0).replaceAllUsesWith(result);
  dot->erase();
}
