//===- StableHLO.cpp - StableHLO op names, classes and builders -----------===//

#include "StableHLO.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OperationSupport.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace mlir::amp;

namespace {
constexpr llvm::StringLiteral kStableHLO = "stablehlo";
constexpr llvm::StringLiteral kCHLO = "chlo";

/// The op name without its dialect prefix, if it is a StableHLO/CHLO op.
llvm::StringRef shortName(Operation *op) {
  llvm::StringRef name = op->getName().getStringRef();
  if (name.consume_front("stablehlo."))
    return name;
  if (name.consume_front("chlo."))
    return name;
  return {};
}

const llvm::StringSet<> &allowOps() {
  static const llvm::StringSet<> ops = {"dot_general", "convolution"};
  return ops;
}

const llvm::StringSet<> &denyOps() {
  static const llvm::StringSet<> ops = {
      // Transcendentals whose error grows fast in low precision.
      "exponential", "exponential_minus_one", "log", "log_plus_one", "power",
      "rsqrt", "sqrt", "cbrt", "tan",
      // CHLO functions that decompose into long polynomial chains.
      "erf_inv", "lgamma", "digamma", "polygamma", "zeta", "igamma", "igammac",
      "sinh", "cosh", "acos", "asin", "atan", "acosh", "asinh", "atanh",
      "bessel_i1e",
      // Normalisation statistics and linear algebra.
      "batch_norm_training", "batch_norm_inference", "batch_norm_grad",
      "cholesky", "triangular_solve"};
  return ops;
}

const llvm::StringSet<> &inferOps() {
  static const llvm::StringSet<> ops = {
      "add",     "subtract", "multiply", "divide",  "remainder", "tanh",
      "logistic", "sine",    "cosine",   "atan2",   "erf",       "erfc",
      "next_after", "square", "cbrt_approx"};
  return ops;
}

const llvm::StringSet<> &clearOps() {
  static const llvm::StringSet<> ops = {
      "broadcast_in_dim", "broadcast", "reshape", "transpose", "slice",
      "dynamic_slice", "dynamic_update_slice", "gather", "pad", "reverse",
      "concatenate", "select", "compare", "iota", "constant", "abs", "negate",
      "sign", "floor", "ceil", "round_nearest_even", "round_nearest_afz",
      "is_finite", "maximum", "minimum", "clamp", "copy", "real_dynamic_slice",
      "dynamic_broadcast_in_dim", "dynamic_reshape", "dynamic_pad",
      "dynamic_gather", "dynamic_iota", "broadcast_select"};
  return ops;
}

/// The single op applied by a reduction body (`add` for a sum), if the body is
/// one binary op on its two block arguments, or "return-update" for a scatter
/// that overwrites.
llvm::StringRef reductionBodyKind(Operation *op) {
  if (op->getNumRegions() == 0 || op->getRegion(0).empty())
    return {};
  Block &body = op->getRegion(0).front();
  if (body.getNumArguments() != 2)
    return {};
  Operation *terminator = body.getTerminator();
  if (!terminator || terminator->getNumOperands() != 1)
    return {};
  if (terminator->getOperand(0) == body.getArgument(1) &&
      std::next(body.begin()) == body.end())
    return "return-update";
  if (std::distance(body.begin(), body.end()) != 2)
    return {};
  Operation &combiner = body.front();
  if (combiner.getNumOperands() != 2 || combiner.getNumResults() != 1 ||
      terminator->getOperand(0) != combiner.getResult(0))
    return {};
  for (Value operand : combiner.getOperands())
    if (operand != body.getArgument(0) && operand != body.getArgument(1))
      return {};
  return shortName(&combiner);
}

bool hasQuantizedOrOpaqueElements(Operation *op) {
  auto isOdd = [](Type type) {
    auto shaped = dyn_cast<ShapedType>(type);
    Type element = shaped ? shaped.getElementType() : type;
    return !isa<FloatType, IntegerType, IndexType, ComplexType>(element);
  };
  return llvm::any_of(op->getOperandTypes(), isOdd) ||
         llvm::any_of(op->getResultTypes(), isOdd);
}
} // namespace

std::string shlo::qualifiedOpName(llvm::StringRef name) {
  name = name.trim();
  if (name.contains('.'))
    return name.str();
  return (kStableHLO + "." + name).str();
}

bool shlo::isStableHLO(Operation *op) {
  llvm::StringRef dialect = op->getName().getDialectNamespace();
  return dialect == kStableHLO || dialect == kCHLO;
}

bool shlo::isConvert(Operation *op) {
  return op->getName().getStringRef() == "stablehlo.convert";
}
bool shlo::isConstant(Operation *op) {
  return op->getName().getStringRef() == "stablehlo.constant";
}
bool shlo::isDotGeneral(Operation *op) {
  return op->getName().getStringRef() == "stablehlo.dot_general";
}
bool shlo::isConvolution(Operation *op) {
  return op->getName().getStringRef() == "stablehlo.convolution";
}
bool shlo::isRegionReturn(Operation *op) {
  return op->getName().getStringRef() == "stablehlo.return";
}
bool shlo::isControlFlow(Operation *op) {
  return llvm::StringSwitch<bool>(op->getName().getStringRef())
      .Cases({"stablehlo.while", "stablehlo.if", "stablehlo.case"}, true)
      .Default(false);
}

bool shlo::hasApplierRegions(Operation *op) {
  return isStableHLO(op) && op->getNumRegions() > 0 && !isControlFlow(op);
}

shlo::OpClass shlo::classify(Operation *op, std::string *reason) {
  auto because = [&](OpClass cls, llvm::StringRef why) {
    if (reason)
      *reason = why.str();
    return cls;
  };
  llvm::StringRef name = shortName(op);
  if (name.empty())
    return because(OpClass::Fixed, "not a StableHLO op");
  if (hasQuantizedOrOpaqueElements(op))
    return because(OpClass::Fixed, "quantized or opaque element types");
  if (name == "convert")
    return because(OpClass::Convert, "explicit convert");
  if (allowOps().contains(name)) {
    if (isDotGeneral(op) && hasDotAlgorithm(op))
      return because(OpClass::Fixed, "dot algorithm given explicitly");
    return because(OpClass::Allow, "matrix multiply");
  }
  if (denyOps().contains(name))
    return because(OpClass::Deny, "numerically sensitive op");
  if (inferOps().contains(name))
    return because(OpClass::Infer, "elementwise arithmetic");
  if (clearOps().contains(name))
    return because(OpClass::Clear, "data movement");
  if (name == "reduce" || name == "reduce_window" || name == "scatter") {
    // Single-input reductions only: a variadic body (argmax) compares values
    // against indices, and rounding could change which index wins.
    unsigned singleInputOperands = name == "scatter" ? 3 : 2;
    if (op->getNumOperands() != singleInputOperands)
      return because(OpClass::Fixed, "variadic reduction");
    llvm::StringRef body = reductionBodyKind(op);
    if (body == "add" || body == "multiply")
      return because(OpClass::Deny, body == "add" ? "sum reduction"
                                                  : "product reduction");
    if (body == "maximum" || body == "minimum" ||
        (name == "scatter" && body == "return-update"))
      return because(OpClass::Clear, "max/min/overwrite reduction");
    return because(OpClass::Fixed, "reduction with a complex body");
  }
  return because(OpClass::Fixed, "op keeps its exact types");
}

Attribute shlo::getAttr(Operation *op, llvm::StringRef name) {
  if (auto props =
          dyn_cast_or_null<DictionaryAttr>(op->getPropertiesAsAttribute()))
    if (Attribute attr = props.get(name))
      return attr;
  return op->getDiscardableAttr(name);
}

FloatType shlo::getFloatElementType(Type type) {
  if (auto shaped = dyn_cast<TensorType>(type))
    return dyn_cast<FloatType>(shaped.getElementType());
  return dyn_cast<FloatType>(type);
}

Type shlo::withElementType(Type type, Type elementType) {
  if (auto ranked = dyn_cast<RankedTensorType>(type))
    return RankedTensorType::get(ranked.getShape(), elementType,
                                 ranked.getEncoding());
  if (isa<UnrankedTensorType>(type))
    return UnrankedTensorType::get(elementType);
  return elementType;
}

namespace {
/// Creates a StableHLO op in generic form, inherent attributes as properties
/// (the way jaxlib prints them).
Operation *createOp(OpBuilder &builder, Location loc, llvm::StringRef name,
                    ValueRange operands, TypeRange results,
                    llvm::ArrayRef<NamedAttribute> properties = {}) {
  OperationState state(loc, name);
  state.addOperands(operands);
  state.addTypes(results);
  if (!properties.empty())
    state.propertiesAttr = builder.getDictionaryAttr(properties);
  return builder.create(state);
}

/// Converts a dense float attribute, saturating values that would overflow.
DenseElementsAttr convertElements(DenseElementsAttr attr, FloatType target,
                                  bool *saturated) {
  const llvm::fltSemantics &semantics = target.getFloatSemantics();
  llvm::APFloat largest = llvm::APFloat::getLargest(semantics);
  return attr.mapValues(target, [&](const llvm::APFloat &value) {
    llvm::APFloat converted = value;
    bool losesInfo = false;
    converted.convert(semantics, llvm::APFloat::rmNearestTiesToEven,
                      &losesInfo);
    if (converted.isInfinity() && !value.isInfinity()) {
      if (saturated)
        *saturated = true;
      converted = largest;
      if (value.isNegative())
        converted.changeSign();
    }
    return converted.bitcastToAPInt();
  });
}
} // namespace

Value shlo::buildConvert(OpBuilder &builder, Location loc, Value value,
                         Type elementType) {
  Type resultType = withElementType(value.getType(), elementType);
  return createOp(builder, loc, "stablehlo.convert", value, resultType)
      ->getResult(0);
}

Value shlo::buildReencodedConstant(OpBuilder &builder, Operation *constant,
                                   Type elementType, bool *saturated) {
  auto attr = dyn_cast_or_null<DenseElementsAttr>(getAttr(constant, "value"));
  auto target = dyn_cast<FloatType>(elementType);
  if (!attr || !target || !isa<FloatType>(attr.getElementType()))
    return {};
  DenseElementsAttr converted = convertElements(attr, target, saturated);
  return createOp(builder, constant->getLoc(), "stablehlo.constant", {},
                  withElementType(constant->getResult(0).getType(), target),
                  {builder.getNamedAttr("value", converted)})
      ->getResult(0);
}

bool shlo::reencodeConstantInPlace(Operation *constant, Type elementType,
                                   bool *saturated) {
  auto attr = dyn_cast_or_null<DenseElementsAttr>(getAttr(constant, "value"));
  auto target = dyn_cast<FloatType>(elementType);
  if (!attr || !target || !isa<FloatType>(attr.getElementType()))
    return false;
  DenseElementsAttr converted = convertElements(attr, target, saturated);
  OpBuilder builder(constant->getContext());
  if (failed(constant->setPropertiesFromAttribute(
          builder.getDictionaryAttr({builder.getNamedAttr("value", converted)}),
          /*emitError=*/nullptr)))
    return false;
  constant->getResult(0).setType(
      withElementType(constant->getResult(0).getType(), target));
  return true;
}

//===----------------------------------------------------------------------===//
// dot_general
//===----------------------------------------------------------------------===//

namespace {
constexpr llvm::StringLiteral kDotDimensionNumbers = "dot_dimension_numbers";

/// Parses `name = [1, 2]` lists out of the `#stablehlo.dot<...>` body.
std::optional<llvm::SmallVector<int64_t>> parseDimList(llvm::StringRef body,
                                                       llvm::StringRef key) {
  llvm::SmallVector<int64_t> dims;
  size_t at = body.find(key);
  if (at == llvm::StringRef::npos)
    return dims; // absent lists are empty
  llvm::StringRef rest = body.drop_front(at + key.size()).ltrim();
  if (!rest.consume_front("="))
    return std::nullopt;
  rest = rest.ltrim();
  if (!rest.consume_front("["))
    return std::nullopt;
  llvm::StringRef list = rest.take_until([](char c) { return c == ']'; });
  llvm::SmallVector<llvm::StringRef> items;
  list.split(items, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef item : items) {
    int64_t dim;
    if (item.trim().getAsInteger(10, dim))
      return std::nullopt;
    dims.push_back(dim);
  }
  return dims;
}

std::string printDimList(llvm::StringRef key, llvm::ArrayRef<int64_t> dims) {
  std::string text = key.str() + " = [";
  for (auto [i, dim] : llvm::enumerate(dims))
    text += (i ? ", " : "") + std::to_string(dim);
  return text + "]";
}
} // namespace

std::optional<shlo::DotDimensions> shlo::getDotDimensions(Operation *dot) {
  auto attr = dyn_cast_or_null<OpaqueAttr>(getAttr(dot, kDotDimensionNumbers));
  if (!attr || attr.getDialectNamespace() != kStableHLO)
    return std::nullopt;
  llvm::StringRef body = attr.getAttrData();
  if (!body.consume_front("dot<"))
    return std::nullopt;
  DotDimensions dims;
  auto lhsBatch = parseDimList(body, "lhs_batching_dimensions");
  auto rhsBatch = parseDimList(body, "rhs_batching_dimensions");
  auto lhsContracting = parseDimList(body, "lhs_contracting_dimensions");
  auto rhsContracting = parseDimList(body, "rhs_contracting_dimensions");
  if (!lhsBatch || !rhsBatch || !lhsContracting || !rhsContracting)
    return std::nullopt;
  dims.lhsBatch = *lhsBatch;
  dims.rhsBatch = *rhsBatch;
  dims.lhsContracting = *lhsContracting;
  dims.rhsContracting = *rhsContracting;
  return dims;
}

bool shlo::hasDotAlgorithm(Operation *dot) {
  return static_cast<bool>(getAttr(dot, "algorithm"));
}

Value shlo::buildTranspose(OpBuilder &builder, Location loc, Value value,
                           llvm::ArrayRef<int64_t> permutation) {
  auto type = cast<RankedTensorType>(value.getType());
  llvm::SmallVector<int64_t> shape;
  for (int64_t dim : permutation)
    shape.push_back(type.getDimSize(dim));
  return createOp(builder, loc, "stablehlo.transpose", value,
                  RankedTensorType::get(shape, type.getElementType()),
                  {builder.getNamedAttr(
                      "permutation", builder.getDenseI64ArrayAttr(permutation))})
      ->getResult(0);
}

Value shlo::buildReshape(OpBuilder &builder, Location loc, Value value,
                         llvm::ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(value.getType());
  return createOp(builder, loc, "stablehlo.reshape", value,
                  RankedTensorType::get(shape, type.getElementType()))
      ->getResult(0);
}

Operation *shlo::buildOptimizationBarrier(OpBuilder &builder, Location loc,
                                          ValueRange values) {
  return createOp(builder, loc, "stablehlo.optimization_barrier", values,
                  values.getTypes());
}

Value shlo::buildDotGeneral(OpBuilder &builder, Operation *prototype, Value lhs,
                            Value rhs, const DotDimensions &dims,
                            Type resultType) {
  std::string body = "dot<";
  llvm::SmallVector<std::string> parts;
  if (!dims.lhsBatch.empty())
    parts.push_back(printDimList("lhs_batching_dimensions", dims.lhsBatch));
  if (!dims.rhsBatch.empty())
    parts.push_back(printDimList("rhs_batching_dimensions", dims.rhsBatch));
  parts.push_back(printDimList("lhs_contracting_dimensions", dims.lhsContracting));
  parts.push_back(printDimList("rhs_contracting_dimensions", dims.rhsContracting));
  body += llvm::join(parts, ", ") + ">";
  MLIRContext *context = builder.getContext();
  llvm::SmallVector<NamedAttribute> properties;
  if (auto props =
          dyn_cast_or_null<DictionaryAttr>(prototype->getPropertiesAsAttribute()))
    for (NamedAttribute attr : props)
      if (attr.getName() != kDotDimensionNumbers)
        properties.push_back(attr);
  properties.push_back(builder.getNamedAttr(
      kDotDimensionNumbers,
      OpaqueAttr::get(StringAttr::get(context, kStableHLO), body,
                      NoneType::get(context))));
  Operation *dot = createOp(builder, prototype->getLoc(),
                            "stablehlo.dot_general", {lhs, rhs}, resultType,
                            properties);
  dot->setDiscardableAttrs(prototype->getDiscardableAttrDictionary());
  return dot->getResult(0);
}

//===----------------------------------------------------------------------===//
// Loss scaling
//===----------------------------------------------------------------------===//

bool shlo::isGradientsMarker(Operation *op) {
  if (op->getName().getStringRef() != "stablehlo.custom_call")
    return false;
  auto target = dyn_cast_or_null<StringAttr>(getAttr(op, "call_target_name"));
  return target && target.getValue() == kGradientsMarker;
}

Value shlo::buildElementwise(OpBuilder &builder, Location loc,
                             llvm::StringRef name, ValueRange operands) {
  return createOp(builder, loc, ("stablehlo." + name).str(), operands,
                  operands.front().getType())
      ->getResult(0);
}

Value shlo::buildScalar(OpBuilder &builder, Location loc, Type elementType,
                        double value) {
  auto type = RankedTensorType::get({}, elementType);
  Attribute element;
  if (auto floatType = dyn_cast<FloatType>(elementType))
    element = builder.getFloatAttr(floatType, value);
  else
    element = builder.getIntegerAttr(elementType, static_cast<int64_t>(value));
  return createOp(builder, loc, "stablehlo.constant", {}, type,
                  {builder.getNamedAttr(
                      "value", DenseElementsAttr::get(type, element))})
      ->getResult(0);
}

Value shlo::buildCompare(OpBuilder &builder, Location loc, Value lhs,
                         Value rhs, llvm::StringRef direction) {
  MLIRContext *context = builder.getContext();
  Type predicate = withElementType(lhs.getType(), builder.getI1Type());
  auto opaque = [&](llvm::StringRef data) {
    return OpaqueAttr::get(StringAttr::get(context, kStableHLO), data,
                           NoneType::get(context));
  };
  return createOp(
             builder, loc, "stablehlo.compare", {lhs, rhs}, predicate,
             {builder.getNamedAttr(
                 "comparison_direction",
                 opaque(("comparison_direction " + direction).str()))})
      ->getResult(0);
}

Value shlo::buildSelect(OpBuilder &builder, Location loc, Value predicate,
                        Value onTrue, Value onFalse) {
  return createOp(builder, loc, "stablehlo.select",
                  {predicate, onTrue, onFalse}, onTrue.getType())
      ->getResult(0);
}

Value shlo::buildIsFinite(OpBuilder &builder, Location loc, Value value) {
  return createOp(builder, loc, "stablehlo.is_finite", value,
                  withElementType(value.getType(), builder.getI1Type()))
      ->getResult(0);
}

Value shlo::buildReduceAll(OpBuilder &builder, Location loc,
                           Value predicate) {
  auto type = cast<RankedTensorType>(predicate.getType());
  if (type.getRank() == 0)
    return predicate;
  Type i1 = builder.getI1Type();
  auto scalar = RankedTensorType::get({}, i1);
  Value init = buildScalar(builder, loc, i1, 1.0);
  llvm::SmallVector<int64_t> dims;
  for (int64_t d = 0; d < type.getRank(); ++d)
    dims.push_back(d);
  OperationState state(loc, "stablehlo.reduce");
  state.addOperands({predicate, init});
  state.addTypes(scalar);
  state.propertiesAttr = builder.getDictionaryAttr(
      {builder.getNamedAttr("dimensions", builder.getDenseI64ArrayAttr(dims))});
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  block->addArguments({scalar, scalar}, {loc, loc});
  Operation *reduce = builder.create(state);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(block);
  Value combined = buildElementwise(builder, loc, "and",
                                    {block->getArgument(0), block->getArgument(1)});
  createOp(builder, loc, "stablehlo.return", combined, {});
  return reduce->getResult(0);
}

Value shlo::buildBroadcastScalar(OpBuilder &builder, Location loc,
                                 Value scalar, RankedTensorType type) {
  if (type.getRank() == 0)
    return scalar;
  auto scalarType = cast<RankedTensorType>(scalar.getType());
  return createOp(builder, loc, "stablehlo.broadcast_in_dim", scalar,
                  RankedTensorType::get(type.getShape(),
                                        scalarType.getElementType()),
                  {builder.getNamedAttr("broadcast_dimensions",
                                        builder.getDenseI64ArrayAttr({}))})
      ->getResult(0);
}
