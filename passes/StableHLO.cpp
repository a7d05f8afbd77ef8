//===- StableHLO.cpp - StableHLO op names, operand roles and builders -----===//

#include "StableHLO.h"

#include "Contract.h"

#include "llvm/ADT/APFloat.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OperationSupport.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <algorithm>
#include <vector>

using namespace mlir;
using namespace mlir::amp;

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

namespace {
// The op lists of the StableHLO and CHLO specifications.
constexpr llvm::StringLiteral kOpNames[] = {
    // StableHLO.
    "stablehlo.abs", "stablehlo.add", "stablehlo.after_all",
    "stablehlo.all_gather", "stablehlo.all_reduce", "stablehlo.all_to_all",
    "stablehlo.and", "stablehlo.atan2", "stablehlo.batch_norm_grad",
    "stablehlo.batch_norm_inference", "stablehlo.batch_norm_training",
    "stablehlo.bitcast_convert", "stablehlo.broadcast",
    "stablehlo.broadcast_in_dim", "stablehlo.case", "stablehlo.cbrt",
    "stablehlo.ceil", "stablehlo.cholesky", "stablehlo.clamp",
    "stablehlo.collective_broadcast", "stablehlo.collective_permute",
    "stablehlo.compare", "stablehlo.complex", "stablehlo.composite",
    "stablehlo.concatenate", "stablehlo.constant", "stablehlo.convert",
    "stablehlo.convolution", "stablehlo.cosine",
    "stablehlo.count_leading_zeros", "stablehlo.create_token",
    "stablehlo.cross-replica-sum", "stablehlo.custom_call",
    "stablehlo.divide", "stablehlo.dot", "stablehlo.dot_general",
    "stablehlo.dynamic_broadcast_in_dim", "stablehlo.dynamic_conv",
    "stablehlo.dynamic_gather", "stablehlo.dynamic_iota",
    "stablehlo.dynamic_pad", "stablehlo.dynamic_reshape",
    "stablehlo.dynamic_slice", "stablehlo.dynamic_update_slice",
    "stablehlo.einsum", "stablehlo.exponential",
    "stablehlo.exponential_minus_one", "stablehlo.fft", "stablehlo.floor",
    "stablehlo.gather", "stablehlo.get_dimension_size",
    "stablehlo.get_tuple_element", "stablehlo.if", "stablehlo.imag",
    "stablehlo.infeed", "stablehlo.iota", "stablehlo.is_finite",
    "stablehlo.log", "stablehlo.log_plus_one", "stablehlo.logistic",
    "stablehlo.map", "stablehlo.maximum", "stablehlo.minimum",
    "stablehlo.multiply", "stablehlo.negate", "stablehlo.not",
    "stablehlo.optimization_barrier", "stablehlo.or", "stablehlo.outfeed",
    "stablehlo.pad", "stablehlo.partition_id", "stablehlo.popcnt",
    "stablehlo.power", "stablehlo.real", "stablehlo.real_dynamic_slice",
    "stablehlo.recv", "stablehlo.reduce", "stablehlo.reduce_precision",
    "stablehlo.reduce_scatter", "stablehlo.reduce_window",
    "stablehlo.remainder", "stablehlo.replica_id", "stablehlo.reshape",
    "stablehlo.return", "stablehlo.reverse", "stablehlo.rng",
    "stablehlo.rng_bit_generator", "stablehlo.round_nearest_afz",
    "stablehlo.round_nearest_even", "stablehlo.rsqrt", "stablehlo.scatter",
    "stablehlo.select", "stablehlo.select_and_scatter", "stablehlo.send",
    "stablehlo.set_dimension_size", "stablehlo.shift_left",
    "stablehlo.shift_right_arithmetic", "stablehlo.shift_right_logical",
    "stablehlo.sign", "stablehlo.sine", "stablehlo.slice", "stablehlo.sort",
    "stablehlo.sqrt", "stablehlo.subtract", "stablehlo.tan",
    "stablehlo.tanh", "stablehlo.torch_index_select", "stablehlo.transpose",
    "stablehlo.triangular_solve", "stablehlo.tuple",
    "stablehlo.unary_einsum", "stablehlo.uniform_dequantize",
    "stablehlo.uniform_quantize", "stablehlo.while", "stablehlo.xor",
    // CHLO.
    "chlo.acos", "chlo.acosh", "chlo.asin", "chlo.asinh", "chlo.atan",
    "chlo.atanh", "chlo.bessel_i1e", "chlo.broadcast_add",
    "chlo.broadcast_and", "chlo.broadcast_atan2", "chlo.broadcast_compare",
    "chlo.broadcast_complex", "chlo.broadcast_divide",
    "chlo.broadcast_maximum", "chlo.broadcast_minimum",
    "chlo.broadcast_multiply", "chlo.broadcast_next_after",
    "chlo.broadcast_or", "chlo.broadcast_polygamma", "chlo.broadcast_power",
    "chlo.broadcast_remainder", "chlo.broadcast_select",
    "chlo.broadcast_shift_left", "chlo.broadcast_shift_right_arithmetic",
    "chlo.broadcast_shift_right_logical", "chlo.broadcast_subtract",
    "chlo.broadcast_xor", "chlo.broadcast_zeta", "chlo.conj",
    "chlo.constant", "chlo.constant_like", "chlo.cosh", "chlo.digamma",
    "chlo.erf", "chlo.erf_inv", "chlo.erfc", "chlo.is_inf",
    "chlo.is_neg_inf", "chlo.is_pos_inf", "chlo.lgamma", "chlo.next_after",
    "chlo.polygamma", "chlo.ragged_dot", "chlo.sinh", "chlo.square",
    "chlo.tan", "chlo.top_k", "chlo.zeta"};

const llvm::StringSet<> &opNameSet() {
  static const llvm::StringSet<> names = [] {
    llvm::StringSet<> set;
    for (llvm::StringRef name : kOpNames)
      set.insert(name);
    return set;
  }();
  return names;
}
} // namespace

llvm::StringRef shlo::shortName(Operation *op) {
  llvm::StringRef name = op->getName().getStringRef();
  if (name.consume_front("stablehlo.") || name.consume_front("chlo."))
    return name;
  return {};
}

bool shlo::isStableHLO(Operation *op) {
  llvm::StringRef dialect = op->getName().getDialectNamespace();
  return dialect == kDialect || dialect == kChloDialect;
}

bool shlo::is(Operation *op, llvm::StringRef name) {
  llvm::StringRef full = op->getName().getStringRef();
  return full.consume_front("stablehlo.") && full == name;
}

bool shlo::isChlo(Operation *op, llvm::StringRef name) {
  llvm::StringRef full = op->getName().getStringRef();
  return full.consume_front("chlo.") && full == name;
}

std::string shlo::qualifiedOpName(llvm::StringRef name) {
  name = name.trim();
  if (name.contains('.'))
    return name.str();
  return (kDialect + "." + name).str();
}

llvm::ArrayRef<llvm::StringRef> shlo::knownOpNames() {
  static const llvm::SmallVector<llvm::StringRef> names(std::begin(kOpNames),
                                                        std::end(kOpNames));
  return names;
}

bool shlo::isKnownOpName(llvm::StringRef qualifiedName) {
  return opNameSet().contains(qualifiedName);
}

namespace {
/// Edit distance counting a swap of neighbours as one edit ("tahn" is one
/// edit from "tanh"), the typo people make.
unsigned typoDistance(llvm::StringRef a, llvm::StringRef b) {
  std::vector<std::vector<unsigned>> d(a.size() + 1,
                                       std::vector<unsigned>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      unsigned cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}
} // namespace

llvm::SmallVector<llvm::StringRef> shlo::nearestOpNames(llvm::StringRef name,
                                                        unsigned limit) {
  std::string qualified = qualifiedOpName(name);
  // Names the input abbreviates first ("exp": exponential), then the
  // closest; among equals, the one of the same length (a swap, not a
  // missing letter).
  llvm::StringRef wanted = llvm::StringRef(qualified).rsplit('.').second;
  llvm::SmallVector<
      std::pair<std::tuple<bool, unsigned, size_t>, llvm::StringRef>>
      scored;
  for (llvm::StringRef candidate : kOpNames) {
    size_t lengthGap = candidate.size() > qualified.size()
                           ? candidate.size() - qualified.size()
                           : qualified.size() - candidate.size();
    bool abbreviates =
        !wanted.empty() && candidate.rsplit('.').second.starts_with(wanted);
    scored.push_back({{!abbreviates, typoDistance(qualified, candidate),
                       lengthGap},
                      candidate});
  }
  llvm::stable_sort(scored, [](const auto &a, const auto &b) {
    return a.first < b.first;
  });
  llvm::SmallVector<llvm::StringRef> nearest;
  for (auto [distance, candidate] : scored) {
    if (nearest.size() == limit)
      break;
    nearest.push_back(candidate);
  }
  return nearest;
}

llvm::Expected<std::string> shlo::checkedOpName(llvm::StringRef option,
                                                llvm::StringRef name) {
  std::string qualified = qualifiedOpName(name);
  if (isKnownOpName(qualified))
    return qualified;
  return llvm::createStringError("invalid option '" + option +
                                 "': unknown op '" + name + "' (nearest: " +
                                 llvm::join(nearestOpNames(name), ", ") + ")");
}

bool shlo::isElementwiseOrBroadcast(Operation *op) {
  static const llvm::StringSet<> names = {
      "abs", "add", "and", "atan2", "broadcast_in_dim", "cbrt", "ceil",
      "clamp", "compare", "convert", "cosine", "divide", "exponential",
      "exponential_minus_one", "floor", "is_finite", "log", "log_plus_one",
      "logistic", "maximum", "minimum", "multiply", "negate", "not", "or",
      "power", "reduce_precision", "remainder", "reshape", "round_nearest_afz",
      "round_nearest_even", "rsqrt", "select", "sign", "sine", "sqrt",
      "subtract", "tan", "tanh", "xor"};
  return op->getName().getDialectNamespace() == kDialect &&
         op->getNumRegions() == 0 && op->getNumResults() == 1 &&
         names.contains(shortName(op));
}

bool shlo::isControlFlow(Operation *op) {
  return is(op, "while") || is(op, "if") || is(op, "case");
}

bool shlo::hasApplierRegions(Operation *op) {
  return isStableHLO(op) && op->getNumRegions() > 0 && !isControlFlow(op);
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

Attribute shlo::getAttr(Operation *op, llvm::StringRef name) {
  if (auto props =
          dyn_cast_or_null<DictionaryAttr>(op->getPropertiesAsAttribute()))
    if (Attribute attr = props.get(name))
      return attr;
  return op->getDiscardableAttr(name);
}

llvm::StringRef shlo::customCallTarget(Operation *op) {
  if (!isCustomCall(op))
    return {};
  auto target = dyn_cast_or_null<StringAttr>(getAttr(op, "call_target_name"));
  return target ? target.getValue() : llvm::StringRef();
}

bool shlo::isShardingAnnotation(Operation *op) {
  llvm::StringRef target = customCallTarget(op);
  return target.starts_with("Sharding") || target.starts_with("SPMD");
}

FlatSymbolRefAttr shlo::compositeDecomposition(Operation *op) {
  if (!is(op, "composite"))
    return {};
  return dyn_cast_or_null<FlatSymbolRefAttr>(getAttr(op, "decomposition"));
}

llvm::StringRef shlo::compositeName(Operation *op) {
  if (!is(op, "composite"))
    return {};
  auto name = dyn_cast_or_null<StringAttr>(getAttr(op, "name"));
  return name ? name.getValue() : llvm::StringRef();
}

int64_t shlo::partitionCount(ModuleOp module) {
  auto count = module->getAttrOfType<IntegerAttr>(attr::kNumPartitions);
  return count ? count.getInt() : 1;
}

//===----------------------------------------------------------------------===//
// Operand roles
//===----------------------------------------------------------------------===//

void shlo::setFrontendAttribute(Operation *op, llvm::StringRef key,
                                llvm::StringRef value) {
  constexpr llvm::StringLiteral kFrontendAttributes = "mhlo.frontend_attributes";
  Builder builder(op->getContext());
  NamedAttrList entries;
  if (auto existing = op->getAttrOfType<DictionaryAttr>(kFrontendAttributes))
    entries.assign(existing.getValue());
  entries.set(key, builder.getStringAttr(value));
  op->setAttr(kFrontendAttributes, entries.getDictionary(op->getContext()));
}

void shlo::markDecision(Operation *op, llvm::StringRef key, int64_t index) {
  std::string tag = std::to_string(index);
  setFrontendAttribute(op, key, tag);
  tag = ("[" + key + "=" + tag + "]").str();
  MLIRContext *context = op->getContext();
  Location loc = op->getLoc();
  if (auto named = dyn_cast<NameLoc>(loc))
    op->setLoc(NameLoc::get(
        StringAttr::get(context, named.getName().str() + tag),
        named.getChildLoc()));
  else
    op->setLoc(NameLoc::get(StringAttr::get(context, tag), loc));
}

unsigned shlo::numReducedInputs(Operation *op) {
  // reduce/reduce_window: N inputs then N init values; scatter: N inputs,
  // the indices, then N updates.
  if (is(op, "scatter"))
    return (op->getNumOperands() - 1) / 2;
  return op->getNumOperands() / 2;
}

llvm::StringRef shlo::reductionBodyKind(Operation *op) {
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

llvm::SmallVector<unsigned> shlo::sortKeyOperands(Operation *sort) {
  llvm::SmallVector<unsigned> keys;
  if (sort->getNumRegions() != 1 || sort->getRegion(0).empty())
    return keys;
  Block &comparator = sort->getRegion(0).front();
  for (unsigned i = 0, e = sort->getNumOperands(); i < e; ++i) {
    if (2 * i + 1 >= comparator.getNumArguments())
      break;
    if (!comparator.getArgument(2 * i).use_empty() ||
        !comparator.getArgument(2 * i + 1).use_empty())
      keys.push_back(i);
  }
  return keys;
}

llvm::SmallVector<unsigned> shlo::indexOperands(Operation *op) {
  llvm::SmallVector<unsigned> indices;
  unsigned count = op->getNumOperands();
  if (is(op, "gather") || is(op, "dynamic_gather") ||
      is(op, "torch_index_select")) {
    indices.push_back(1);
  } else if (is(op, "scatter")) {
    indices.push_back(numReducedInputs(op));
  } else if (is(op, "dynamic_slice")) {
    for (unsigned i = 1; i < count; ++i)
      indices.push_back(i);
  } else if (is(op, "dynamic_update_slice")) {
    for (unsigned i = 2; i < count; ++i)
      indices.push_back(i);
  }
  return indices;
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

FloatType shlo::getFloatElementType(Type type) {
  if (auto shaped = dyn_cast<TensorType>(type))
    return dyn_cast<FloatType>(shaped.getElementType());
  return dyn_cast<FloatType>(type);
}

std::string shlo::floatTypeName(FloatType type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return llvm::StringRef(text).lower();
}

bool shlo::isExactWidening(Type from, Type to) {
  FloatType fromFloat = getFloatElementType(from);
  FloatType toFloat = getFloatElementType(to);
  return fromFloat && toFloat &&
         llvm::APFloatBase::isRepresentableBy(fromFloat.getFloatSemantics(),
                                              toFloat.getFloatSemantics());
}

Type shlo::withElementType(Type type, Type elementType) {
  if (auto ranked = dyn_cast<RankedTensorType>(type))
    return RankedTensorType::get(ranked.getShape(), elementType,
                                 ranked.getEncoding());
  if (isa<UnrankedTensorType>(type))
    return UnrankedTensorType::get(elementType);
  return elementType;
}

std::optional<int64_t> shlo::numElements(Type type) {
  auto ranked = dyn_cast<RankedTensorType>(type);
  if (!ranked || !ranked.hasStaticShape())
    return std::nullopt;
  return ranked.getNumElements();
}

bool shlo::isScalarSplat(Value value) {
  while (true) {
    if (std::optional<int64_t> elements = numElements(value.getType());
        elements && *elements == 1)
      return true;
    Operation *def = value.getDefiningOp();
    if (def && isConstant(def)) {
      auto dense = def->getAttrOfType<DenseElementsAttr>("value");
      return dense && dense.isSplat();
    }
    if (!def || !(is(def, "broadcast_in_dim") || is(def, "reshape") ||
                  isConvert(def)))
      return false;
    value = def->getOperand(0);
  }
}

bool shlo::broadcastsRowsBack(Value divisor, Value sum,
                              llvm::ArrayRef<int64_t> reduced) {
  auto full = dyn_cast<RankedTensorType>(divisor.getType());
  if (!full || !full.hasStaticShape())
    return false;
  // source[j]: the dimension of `current` that dimension j of `divisor`
  // comes from, or -1 where a broadcast made it.
  llvm::SmallVector<int64_t> source = llvm::to_vector(
      llvm::seq<int64_t>(0, full.getRank()));
  Value current = divisor;
  while (current != sum) {
    Operation *def = current.getDefiningOp();
    if (!def || def->getNumOperands() != 1)
      return false;
    auto from = dyn_cast<RankedTensorType>(def->getOperand(0).getType());
    auto to = cast<RankedTensorType>(current.getType());
    if (!from || !from.hasStaticShape())
      return false;
    // origin[d]: the operand dimension that result dimension d comes from.
    llvm::SmallVector<int64_t> origin(to.getRank(), -1);
    if (shlo::is(def, "broadcast_in_dim")) {
      auto dims = def->getAttrOfType<DenseI64ArrayAttr>("broadcast_dimensions");
      if (!dims)
        return false;
      for (auto [i, d] : llvm::enumerate(dims.asArrayRef()))
        if (from.getDimSize(i) == to.getDimSize(d))
          origin[d] = i;
    } else if (shlo::is(def, "reshape")) {
      // Only reshapes that add or drop unit dimensions.
      auto nonUnit = [](RankedTensorType type) {
        llvm::SmallVector<int64_t> dims;
        for (int64_t d = 0; d < type.getRank(); ++d)
          if (type.getDimSize(d) != 1)
            dims.push_back(d);
        return dims;
      };
      llvm::SmallVector<int64_t> a = nonUnit(from), b = nonUnit(to);
      if (a.size() != b.size())
        return false;
      for (auto [i, d] : llvm::zip(a, b)) {
        if (from.getDimSize(i) != to.getDimSize(d))
          return false;
        origin[d] = i;
      }
    } else {
      return false;
    }
    for (int64_t &j : source)
      if (j >= 0)
        j = origin[j];
    current = def->getOperand(0);
  }
  // The sum's dimensions are the others, in order. (A unit dimension is
  // one element either way.)
  int64_t position = 0;
  for (int64_t j = 0; j < full.getRank(); ++j) {
    bool isReduced = llvm::is_contained(reduced, j);
    if (full.getDimSize(j) != 1 &&
        (isReduced ? source[j] != -1 : source[j] != position))
      return false;
    if (!isReduced)
      ++position;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// dot_general dimension numbers
//===----------------------------------------------------------------------===//

namespace {
constexpr llvm::StringLiteral kDotDimensionNumbers = "dot_dimension_numbers";
constexpr llvm::StringLiteral kLhsBatch = "lhs_batching_dimensions";
constexpr llvm::StringLiteral kRhsBatch = "rhs_batching_dimensions";
constexpr llvm::StringLiteral kLhsContracting = "lhs_contracting_dimensions";
constexpr llvm::StringLiteral kRhsContracting = "rhs_contracting_dimensions";

/// `[1, 2]` to {1, 2}.
std::optional<llvm::SmallVector<int64_t>> parseDimList(llvm::StringRef text) {
  text = text.trim();
  if (!text.consume_front("[") || !text.consume_back("]"))
    return std::nullopt;
  llvm::SmallVector<int64_t> dims;
  llvm::SmallVector<llvm::StringRef> items;
  text.split(items, ',', -1, /*KeepEmpty=*/false);
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

std::optional<shlo::DotDimensions>
shlo::DotDimensions::parse(llvm::StringRef text) {
  if (!text.consume_front("dot<") || !text.consume_back(">"))
    return std::nullopt;
  DotDimensions dims;
  // `key = [..], key = [..]`: split at the commas outside brackets.
  llvm::SmallVector<llvm::StringRef> entries;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    char c = i < text.size() ? text[i] : ',';
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (c == ',' && depth == 0) {
      if (!text.slice(start, i).trim().empty())
        entries.push_back(text.slice(start, i).trim());
      start = i + 1;
    }
  }
  for (llvm::StringRef entry : entries) {
    auto [key, value] = entry.split('=');
    std::optional<llvm::SmallVector<int64_t>> list = parseDimList(value);
    llvm::SmallVector<int64_t> *slot =
        llvm::StringSwitch<llvm::SmallVector<int64_t> *>(key.trim())
            .Case(kLhsBatch, &dims.lhsBatch)
            .Case(kRhsBatch, &dims.rhsBatch)
            .Case(kLhsContracting, &dims.lhsContracting)
            .Case(kRhsContracting, &dims.rhsContracting)
            .Default(nullptr);
    if (!slot || !list)
      return std::nullopt;
    *slot = *list;
  }
  return dims;
}

std::string shlo::DotDimensions::print() const {
  llvm::SmallVector<std::string> parts;
  if (!lhsBatch.empty())
    parts.push_back(printDimList(kLhsBatch, lhsBatch));
  if (!rhsBatch.empty())
    parts.push_back(printDimList(kRhsBatch, rhsBatch));
  parts.push_back(printDimList(kLhsContracting, lhsContracting));
  parts.push_back(printDimList(kRhsContracting, rhsContracting));
  return "dot<" + llvm::join(parts, ", ") + ">";
}

std::optional<shlo::DotDimensions> shlo::getDotDimensions(Operation *dot) {
  auto attr = dyn_cast_or_null<OpaqueAttr>(getAttr(dot, kDotDimensionNumbers));
  if (!attr || attr.getDialectNamespace() != kDialect)
    return std::nullopt;
  return DotDimensions::parse(attr.getAttrData());
}

bool shlo::hasDotAlgorithm(Operation *dot) {
  return static_cast<bool>(getAttr(dot, "algorithm"));
}

llvm::StringRef shlo::requestedPrecision(Operation *op) {
  auto config = dyn_cast_or_null<ArrayAttr>(getAttr(op, "precision_config"));
  if (!config)
    return "";
  llvm::StringRef strongest;
  for (Attribute entry : config) {
    // `#stablehlo<precision HIGHEST>`, opaque without the dialect.
    auto opaque = dyn_cast<OpaqueAttr>(entry);
    if (!opaque || opaque.getDialectNamespace() != kDialect)
      continue;
    llvm::StringRef data = opaque.getAttrData();
    if (data.ends_with(" HIGHEST"))
      return "HIGHEST";
    if (data.ends_with(" HIGH"))
      strongest = "HIGH";
  }
  return strongest;
}

//===----------------------------------------------------------------------===//
// Builders
//===----------------------------------------------------------------------===//

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

std::string opName(llvm::StringRef shortName) {
  return (shlo::kDialect + "." + shortName).str();
}

Attribute opaque(MLIRContext *context, llvm::StringRef data) {
  return OpaqueAttr::get(StringAttr::get(context, shlo::kDialect), data,
                         NoneType::get(context));
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
    // Formats without infinities (f8e4m3fn) overflow to NaN.
    bool overflowed = (converted.isInfinity() && !value.isInfinity()) ||
                      (converted.isNaN() && !value.isNaN());
    if (overflowed) {
      // finfo(dtype).min/max (an attention mask's fill) stays the largest
      // finite value: its meaning, not a saturation to warn about.
      if (saturated && !value.isLargest())
        *saturated = true;
      converted = largest;
      if (value.isNegative())
        converted.changeSign();
    }
    return converted.bitcastToAPInt();
  });
}

DenseElementsAttr floatElements(Operation *constant, Type elementType) {
  auto attr = dyn_cast_or_null<DenseElementsAttr>(shlo::getAttr(constant,
                                                                "value"));
  if (!attr || !isa<FloatType>(elementType) ||
      !isa<FloatType>(attr.getElementType()))
    return {};
  return attr;
}
} // namespace

Value shlo::buildConvert(OpBuilder &builder, Location loc, Value value,
                         Type elementType) {
  Type resultType = withElementType(value.getType(), elementType);
  return createOp(builder, loc, opName("convert"), value, resultType)
      ->getResult(0);
}

Value shlo::buildReencodedConstant(OpBuilder &builder, Operation *constant,
                                   Type elementType, bool *saturated) {
  DenseElementsAttr attr = floatElements(constant, elementType);
  if (!attr)
    return {};
  auto target = cast<FloatType>(elementType);
  DenseElementsAttr converted = convertElements(attr, target, saturated);
  return createOp(builder, constant->getLoc(), opName("constant"), {},
                  withElementType(constant->getResult(0).getType(), target),
                  {builder.getNamedAttr("value", converted)})
      ->getResult(0);
}

bool shlo::reencodeConstantInPlace(Operation *constant, Type elementType,
                                   bool *saturated) {
  DenseElementsAttr attr = floatElements(constant, elementType);
  if (!attr)
    return false;
  bool saturatedHere = false;
  DenseElementsAttr converted =
      convertElements(attr, cast<FloatType>(elementType), &saturatedHere);
  OpBuilder builder(constant->getContext());
  if (failed(constant->setPropertiesFromAttribute(
          builder.getDictionaryAttr({builder.getNamedAttr("value", converted)}),
          /*emitError=*/nullptr)))
    return false;
  constant->getResult(0).setType(
      withElementType(constant->getResult(0).getType(), elementType));
  if (saturated && saturatedHere)
    *saturated = true;
  return true;
}

Value shlo::buildTranspose(OpBuilder &builder, Location loc, Value value,
                           llvm::ArrayRef<int64_t> permutation) {
  auto type = cast<RankedTensorType>(value.getType());
  llvm::SmallVector<int64_t> shape;
  for (int64_t dim : permutation)
    shape.push_back(type.getDimSize(dim));
  return createOp(builder, loc, opName("transpose"), value,
                  RankedTensorType::get(shape, type.getElementType()),
                  {builder.getNamedAttr(
                      "permutation", builder.getDenseI64ArrayAttr(permutation))})
      ->getResult(0);
}

Value shlo::buildReshape(OpBuilder &builder, Location loc, Value value,
                         llvm::ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(value.getType());
  return createOp(builder, loc, opName("reshape"), value,
                  RankedTensorType::get(shape, type.getElementType()))
      ->getResult(0);
}

Value shlo::buildReducePrecision(OpBuilder &builder, Location loc,
                                 Value value, FloatType format) {
  int64_t mantissa = format.getFPMantissaWidth() - 1;
  int64_t exponent = format.getWidth() - 1 - mantissa;
  return createOp(builder, loc, opName("reduce_precision"), value,
                  value.getType(),
                  {builder.getNamedAttr("exponent_bits",
                                        builder.getI32IntegerAttr(exponent)),
                   builder.getNamedAttr("mantissa_bits",
                                        builder.getI32IntegerAttr(mantissa))})
      ->getResult(0);
}

Operation *shlo::buildOptimizationBarrier(OpBuilder &builder, Location loc,
                                          ValueRange values) {
  return createOp(builder, loc, opName("optimization_barrier"), values,
                  values.getTypes());
}

Value shlo::buildDotGeneral(OpBuilder &builder, Operation *prototype, Value lhs,
                            Value rhs, const DotDimensions &dims,
                            Type resultType) {
  MLIRContext *context = builder.getContext();
  llvm::SmallVector<NamedAttribute> properties;
  if (auto props =
          dyn_cast_or_null<DictionaryAttr>(prototype->getPropertiesAsAttribute()))
    for (NamedAttribute attr : props)
      if (attr.getName() != kDotDimensionNumbers)
        properties.push_back(attr);
  properties.push_back(builder.getNamedAttr(kDotDimensionNumbers,
                                            opaque(context, dims.print())));
  Operation *dot = createOp(builder, prototype->getLoc(), opName("dot_general"),
                            {lhs, rhs}, resultType, properties);
  dot->setDiscardableAttrs(prototype->getDiscardableAttrDictionary());
  return dot->getResult(0);
}

Value shlo::buildElementwise(OpBuilder &builder, Location loc,
                             llvm::StringRef name, ValueRange operands) {
  return createOp(builder, loc, opName(name), operands,
                  operands.front().getType())
      ->getResult(0);
}

Value shlo::buildCombineScalars(OpBuilder &builder, Location loc,
                               llvm::ArrayRef<Value> scalars,
                               llvm::StringRef combiner, bool empty) {
  if (scalars.empty())
    return buildScalar(builder, loc, builder.getI1Type(), empty ? 1.0 : 0.0);
  Value combined = scalars.front();
  for (Value scalar : llvm::drop_begin(scalars))
    combined = buildElementwise(builder, loc, combiner, {combined, scalar});
  return combined;
}

Value shlo::buildConstant(OpBuilder &builder, Location loc,
                          DenseElementsAttr value) {
  return createOp(builder, loc, opName("constant"), {}, value.getType(),
                  {builder.getNamedAttr("value", value)})
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
  return createOp(builder, loc, opName("constant"), {}, type,
                  {builder.getNamedAttr(
                      "value", DenseElementsAttr::get(type, element))})
      ->getResult(0);
}

Value shlo::buildCompare(OpBuilder &builder, Location loc, Value lhs,
                         Value rhs, llvm::StringRef direction) {
  Type predicate = withElementType(lhs.getType(), builder.getI1Type());
  return createOp(builder, loc, opName("compare"), {lhs, rhs}, predicate,
                  {builder.getNamedAttr(
                      "comparison_direction",
                      opaque(builder.getContext(),
                             ("comparison_direction " + direction).str()))})
      ->getResult(0);
}

Value shlo::buildSelect(OpBuilder &builder, Location loc, Value predicate,
                        Value onTrue, Value onFalse) {
  return createOp(builder, loc, opName("select"),
                  {predicate, onTrue, onFalse}, onTrue.getType())
      ->getResult(0);
}

Value shlo::buildClamp(OpBuilder &builder, Location loc, Value min,
                       Value value, Value max) {
  return createOp(builder, loc, opName("clamp"), {min, value, max},
                  value.getType())
      ->getResult(0);
}

Value shlo::buildIsFinite(OpBuilder &builder, Location loc, Value value) {
  return createOp(builder, loc, opName("is_finite"), value,
                  withElementType(value.getType(), builder.getI1Type()))
      ->getResult(0);
}

Value shlo::buildSlice(OpBuilder &builder, Location loc, Value value,
                       llvm::ArrayRef<int64_t> start,
                       llvm::ArrayRef<int64_t> limit,
                       llvm::ArrayRef<int64_t> strides) {
  auto type = cast<RankedTensorType>(value.getType());
  llvm::SmallVector<int64_t> shape;
  for (auto [begin, end, stride] : llvm::zip(start, limit, strides))
    shape.push_back((end - begin + stride - 1) / stride);
  return createOp(builder, loc, opName("slice"), value,
                  RankedTensorType::get(shape, type.getElementType()),
                  {builder.getNamedAttr("start_indices",
                                        builder.getDenseI64ArrayAttr(start)),
                   builder.getNamedAttr("limit_indices",
                                        builder.getDenseI64ArrayAttr(limit)),
                   builder.getNamedAttr("strides",
                                        builder.getDenseI64ArrayAttr(strides))})
      ->getResult(0);
}

Value shlo::buildConcatenate(OpBuilder &builder, Location loc,
                             ValueRange values, int64_t dimension) {
  auto first = cast<RankedTensorType>(values.front().getType());
  llvm::SmallVector<int64_t> shape(first.getShape());
  shape[dimension] = 0;
  for (Value value : values)
    shape[dimension] += cast<RankedTensorType>(value.getType())
                            .getDimSize(dimension);
  return createOp(builder, loc, opName("concatenate"), values,
                  RankedTensorType::get(shape, first.getElementType()),
                  {builder.getNamedAttr("dimension",
                                        builder.getI64IntegerAttr(dimension))})
      ->getResult(0);
}

Operation *shlo::buildRegionReturn(OpBuilder &builder, Location loc,
                                   ValueRange values) {
  return createOp(builder, loc, opName("return"), values, {});
}

Value shlo::buildReduce(OpBuilder &builder, Location loc, Value value,
                        llvm::ArrayRef<int64_t> dimensions,
                        llvm::StringRef combiner, double init) {
  auto type = cast<RankedTensorType>(value.getType());
  Type element = type.getElementType();
  auto scalar = RankedTensorType::get({}, element);
  llvm::SmallVector<int64_t> kept;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (!llvm::is_contained(dimensions, d))
      kept.push_back(type.getDimSize(d));
  Value initValue = buildScalar(builder, loc, element, init);
  OperationState state(loc, opName("reduce"));
  state.addOperands({value, initValue});
  state.addTypes(RankedTensorType::get(kept, element));
  state.propertiesAttr = builder.getDictionaryAttr({builder.getNamedAttr(
      "dimensions", builder.getDenseI64ArrayAttr(dimensions))});
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  block->addArguments({scalar, scalar}, {loc, loc});
  Operation *reduce = builder.create(state);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(block);
  Value combined = buildElementwise(
      builder, loc, combiner, {block->getArgument(0), block->getArgument(1)});
  buildRegionReturn(builder, loc, combined);
  return reduce->getResult(0);
}

llvm::SmallVector<Value>
shlo::buildReduceAllTogether(OpBuilder &builder, Location loc,
                             ValueRange values,
                             llvm::ArrayRef<llvm::StringRef> combiners,
                             llvm::ArrayRef<double> inits) {
  auto shape = cast<RankedTensorType>(values.front().getType()).getShape();
  llvm::SmallVector<int64_t> dims;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    dims.push_back(d);
  OperationState state(loc, opName("reduce"));
  llvm::SmallVector<Type> scalars;
  llvm::SmallVector<Location> locs(2 * values.size(), loc);
  state.addOperands(values);
  for (auto [value, init] : llvm::zip_equal(values, inits)) {
    Type element = cast<RankedTensorType>(value.getType()).getElementType();
    state.addOperands(buildScalar(builder, loc, element, init));
    scalars.push_back(RankedTensorType::get({}, element));
  }
  state.addTypes(scalars);
  state.propertiesAttr = builder.getDictionaryAttr({builder.getNamedAttr(
      "dimensions", builder.getDenseI64ArrayAttr(dims))});
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  // The body takes the accumulators, then the elements.
  llvm::SmallVector<Type> arguments(scalars);
  arguments.append(scalars);
  block->addArguments(arguments, locs);
  Operation *reduce = builder.create(state);
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(block);
  llvm::SmallVector<Value> combined;
  for (auto [i, combiner] : llvm::enumerate(combiners))
    combined.push_back(buildElementwise(
        builder, loc, combiner,
        {block->getArgument(i), block->getArgument(values.size() + i)}));
  buildRegionReturn(builder, loc, combined);
  return llvm::SmallVector<Value>(reduce->getResults());
}

Value shlo::buildReduceAll(OpBuilder &builder, Location loc, Value value,
                           llvm::StringRef combiner, double init) {
  auto type = cast<RankedTensorType>(value.getType());
  if (type.getRank() == 0)
    return value;
  llvm::SmallVector<int64_t> dims;
  for (int64_t d = 0; d < type.getRank(); ++d)
    dims.push_back(d);
  return buildReduce(builder, loc, value, dims, combiner, init);
}

Operation *shlo::extendWhile(
    OpBuilder &builder, Operation *loop, ValueRange inits,
    llvm::function_ref<llvm::SmallVector<Value>(OpBuilder &, ValueRange)>
        next) {
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPoint(loop);
  OperationState state(loop->getLoc(), loop->getName().getStringRef());
  state.addOperands(loop->getOperands());
  state.addOperands(inits);
  state.addTypes(loop->getResultTypes());
  state.addTypes(inits.getTypes());
  state.propertiesAttr = loop->getPropertiesAsAttribute();
  state.addAttributes(loop->getDiscardableAttrDictionary().getValue());
  for (Region &region : loop->getRegions())
    state.addRegion()->takeBody(region);
  Operation *grown = builder.create(state);
  // The condition and the body both take the carried values.
  for (Region &region : grown->getRegions())
    for (Value init : inits)
      region.front().addArgument(init.getType(), loop->getLoc());
  Block &body = grown->getRegion(1).front();
  Operation *terminator = body.getTerminator();
  builder.setInsertionPoint(terminator);
  llvm::SmallVector<Value> nextValues =
      next(builder, body.getArguments().take_back(inits.size()));
  llvm::SmallVector<Value> returned(terminator->getOperands());
  llvm::append_range(returned, nextValues);
  terminator->setOperands(returned);
  for (auto [old, replacement] :
       llvm::zip(loop->getResults(), grown->getResults()))
    old.replaceAllUsesWith(replacement);
  loop->erase();
  return grown;
}

Operation *shlo::buildComposite(OpBuilder &builder, Location loc,
                                llvm::StringRef name, ValueRange operands,
                                Type resultType, DictionaryAttr attributes,
                                FlatSymbolRefAttr decomposition) {
  return createOp(
      builder, loc, opName("composite"), operands, resultType,
      {builder.getNamedAttr("composite_attributes", attributes),
       builder.getNamedAttr("decomposition", decomposition),
       builder.getNamedAttr("name", builder.getStringAttr(name)),
       builder.getNamedAttr("version", builder.getI32IntegerAttr(0))});
}

Value shlo::buildBitcastConvert(OpBuilder &builder, Location loc, Value value,
                                Type resultType) {
  return createOp(builder, loc, opName("bitcast_convert"), value, resultType)
      ->getResult(0);
}

std::pair<Value, Value> shlo::buildRngBitGenerator(OpBuilder &builder,
                                                   Location loc, Value state,
                                                   Type bitsType) {
  Operation *op = createOp(
      builder, loc, opName("rng_bit_generator"), state,
      {state.getType(), bitsType},
      {builder.getNamedAttr("rng_algorithm",
                            opaque(builder.getContext(),
                                   "rng_algorithm THREE_FRY"))});
  return {op->getResult(0), op->getResult(1)};
}

Value shlo::buildIota(OpBuilder &builder, Location loc, RankedTensorType type,
                      int64_t dimension) {
  return createOp(builder, loc, opName("iota"), {}, type,
                  {builder.getNamedAttr("iota_dimension",
                                        builder.getI64IntegerAttr(dimension))})
      ->getResult(0);
}

Value shlo::buildBroadcastInDim(OpBuilder &builder, Location loc,
                                Value value, RankedTensorType type,
                                llvm::ArrayRef<int64_t> dimensions) {
  auto valueType = cast<RankedTensorType>(value.getType());
  return createOp(builder, loc, opName("broadcast_in_dim"), value,
                  RankedTensorType::get(type.getShape(),
                                        valueType.getElementType()),
                  {builder.getNamedAttr("broadcast_dimensions",
                                        builder.getDenseI64ArrayAttr(
                                            dimensions))})
      ->getResult(0);
}

Value shlo::buildAfter(OpBuilder &builder, Location loc, Value value,
                       Value zero) {
  auto type = cast<RankedTensorType>(value.getType());
  Value zeros = buildBroadcastScalar(
      builder, loc, buildConvert(builder, loc, zero, type.getElementType()),
      type);
  return buildElementwise(builder, loc, "subtract", {value, zeros});
}

Value shlo::buildBroadcastScalar(OpBuilder &builder, Location loc,
                                 Value scalar, RankedTensorType type) {
  if (type.getRank() == 0)
    return scalar;
  auto scalarType = cast<RankedTensorType>(scalar.getType());
  return createOp(builder, loc, opName("broadcast_in_dim"), scalar,
                  RankedTensorType::get(type.getShape(),
                                        scalarType.getElementType()),
                  {builder.getNamedAttr("broadcast_dimensions",
                                        builder.getDenseI64ArrayAttr({}))})
      ->getResult(0);
}
