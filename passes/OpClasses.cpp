//===- OpClasses.cpp - Op classes, discrete decisions, linear algebra -----===//

#include "OpClasses.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::amp;

namespace {

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
      "add",      "subtract", "multiply", "divide", "remainder", "tanh",
      "logistic", "sine",     "cosine",   "atan2",  "erf",       "erfc",
      "next_after", "square"};
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

bool hasQuantizedOrOpaqueElements(Operation *op) {
  auto isOdd = [](Type type) {
    auto shaped = dyn_cast<ShapedType>(type);
    Type element = shaped ? shaped.getElementType() : type;
    return !isa<FloatType, IntegerType, IndexType, ComplexType>(element);
  };
  return llvm::any_of(op->getOperandTypes(), isOdd) ||
         llvm::any_of(op->getResultTypes(), isOdd);
}

Classification classified(OpClass cls, Reason reason,
                          llvm::StringRef detail = {}) {
  return {cls, reason, detail.str()};
}

/// reduce, reduce_window and scatter: by their body.
Classification classifyReduction(Operation *op, llvm::StringRef name) {
  // Single-input reductions only: a variadic body (argmax) compares values
  // against indices, and rounding could change which index wins.
  if (shlo::numReducedInputs(op) != 1)
    return classified(OpClass::Fixed, Reason::Fixed, "variadic reduction");
  llvm::StringRef body = shlo::reductionBodyKind(op);
  if (body == "add")
    return classified(OpClass::Deny, Reason::NumericallySensitive,
                      "sum reduction");
  if (body == "multiply")
    return classified(OpClass::Deny, Reason::NumericallySensitive,
                      "product reduction");
  if (body == "maximum" || body == "minimum" ||
      (name == "scatter" && body == "return-update"))
    return classified(OpClass::Clear, Reason::Fixed,
                      "max/min/overwrite reduction");
  return classified(OpClass::Fixed, Reason::Fixed,
                    "reduction with a complex body");
}

// Custom-call targets of linear algebra: jaxlib's LAPACK (CPU), cuSOLVER and
// cuBLAS (CUDA), hipSOLVER and hipBLAS (ROCm) kernels, and XLA:TPU's.
constexpr llvm::StringLiteral kLinearAlgebraPrefixes[] = {
    "lapack_",        "cusolver_",        "hipsolver_",
    "cublas_geqrf",   "hipblas_geqrf",    "cu_cholesky",
    "Qr",             "Eigh",             "LuDecomposition",
    "Cholesky",       "Svd",              "ProductOfElementaryHouseholderReflectors"};

// Custom calls that select the k largest values.
constexpr llvm::StringLiteral kTopKCalls[] = {"ApproxTopK", "TopK",
                                              "PartialReduce"};

/// True if the i1 result of a float compare picks integers, indices or
/// control flow: it reaches, through boolean and integer values only, a
/// select of non-float values, an index operand, a float-to-integer convert,
/// or a control-flow predicate.
bool compareFeedsDiscreteSink(Operation *compare) {
  llvm::SmallVector<Value> worklist(compare->getResults());
  llvm::DenseSet<Value> seen;
  while (!worklist.empty()) {
    Value value = worklist.pop_back_val();
    if (!seen.insert(value).second)
      continue;
    for (OpOperand &use : value.getUses()) {
      Operation *user = use.getOwner();
      if (shlo::is(user, "select") &&
          !shlo::getFloatElementType(user->getResult(0).getType()))
        return true;
      if (llvm::is_contained(shlo::indexOperands(user),
                             use.getOperandNumber()))
        return true;
      if ((shlo::is(user, "if") || shlo::is(user, "case")) &&
          use.getOperandNumber() == 0)
        return true;
      if (shlo::isRegionReturn(user) && user->getParentOp() &&
          shlo::is(user->getParentOp(), "while") &&
          user->getParentRegion() == &user->getParentOp()->getRegion(0))
        return true;
      // Follow boolean and integer results only: a float select of the
      // predicate (a ReLU mask) is a continuous choice.
      for (Value result : user->getResults())
        if (!shlo::getFloatElementType(result.getType()) &&
            isa<TensorType>(result.getType()))
          worklist.push_back(result);
    }
  }
  return false;
}

llvm::SmallVector<unsigned> floatOperands(Operation *op) {
  llvm::SmallVector<unsigned> operands;
  for (OpOperand &operand : op->getOpOperands())
    if (shlo::getFloatElementType(operand.get().getType()))
      operands.push_back(operand.getOperandNumber());
  return operands;
}

} // namespace

Classification mlir::amp::classify(Operation *op) {
  llvm::StringRef name = shlo::shortName(op);
  if (isa<func::CallOp>(op))
    return classified(OpClass::Fixed, Reason::Fixed,
                      "a call: the function is painted inside");
  if (name.empty())
    return classified(OpClass::Fixed, Reason::Fixed, "not a StableHLO op");
  if (hasQuantizedOrOpaqueElements(op))
    return classified(OpClass::Fixed, Reason::Fixed,
                      "quantized or opaque element types");
  if (name == "convert")
    return classified(OpClass::Convert, Reason::Fixed, "explicit convert");
  if (allowOps().contains(name)) {
    if (shlo::isDotGeneral(op) && shlo::hasDotAlgorithm(op))
      return classified(OpClass::Fixed, Reason::DotAlgorithm);
    return classified(OpClass::Allow, Reason::MatrixMultiply);
  }
  if (denyOps().contains(name))
    return classified(OpClass::Deny, Reason::NumericallySensitive,
                      (name == "cholesky" || name == "triangular_solve")
                          ? "linear algebra"
                          : "transcendental or statistic");
  if (inferOps().contains(name))
    return classified(OpClass::Infer, Reason::NotBetweenLowOps,
                      "elementwise arithmetic");
  if (clearOps().contains(name))
    return classified(OpClass::Clear, Reason::NotBetweenLowOps,
                      "data movement");
  if (name == "reduce" || name == "reduce_window" || name == "scatter")
    return classifyReduction(op, name);
  return classified(OpClass::Fixed, Reason::Fixed,
                    shlo::isCustomCall(op) ? "custom call" : "");
}

std::optional<DiscreteDecision> mlir::amp::discreteDecision(Operation *op) {
  if (!shlo::isStableHLO(op))
    return std::nullopt;
  auto decide = [&](llvm::StringRef name, llvm::SmallVector<unsigned> ops)
      -> std::optional<DiscreteDecision> {
    llvm::erase_if(ops, [&](unsigned i) {
      return !shlo::getFloatElementType(op->getOperand(i).getType());
    });
    if (ops.empty())
      return std::nullopt;
    return DiscreteDecision{name.str(), std::move(ops)};
  };
  if (shlo::is(op, "sort"))
    return decide("sort", shlo::sortKeyOperands(op));
  if (shlo::isChlo(op, "top_k") || shlo::compositeName(op) == "chlo.top_k")
    return decide("top_k", {0});
  if (llvm::is_contained(kTopKCalls, shlo::customCallTarget(op)))
    return decide(shlo::customCallTarget(op), floatOperands(op));
  if ((shlo::is(op, "reduce") || shlo::is(op, "reduce_window")) &&
      shlo::numReducedInputs(op) > 1 && op->getNumRegions() == 1) {
    // argmax/argmin: a variadic reduction whose body compares.
    bool compares = false;
    op->getRegion(0).walk([&](Operation *inner) {
      compares |= shlo::is(inner, "compare");
    });
    if (compares) {
      llvm::SmallVector<unsigned> inputs;
      for (unsigned i = 0, e = shlo::numReducedInputs(op); i < e; ++i)
        inputs.push_back(i);
      return decide("argmax/argmin", inputs);
    }
  }
  if (shlo::isConvert(op) &&
      shlo::getFloatElementType(op->getOperand(0).getType()) &&
      isa<IntegerType>(
          cast<ShapedType>(op->getResult(0).getType()).getElementType()))
    return decide("float-to-integer convert", {0});
  if (shlo::is(op, "compare") && compareFeedsDiscreteSink(op))
    return decide("compare that picks integers or indices", {0, 1});
  return std::nullopt;
}

std::optional<std::string> mlir::amp::linearAlgebraName(Operation *op) {
  if (shlo::is(op, "cholesky") || shlo::is(op, "triangular_solve"))
    return shlo::shortName(op).str();
  llvm::StringRef target = shlo::customCallTarget(op);
  if (target.empty())
    return std::nullopt;
  for (llvm::StringRef prefix : kLinearAlgebraPrefixes)
    if (target.starts_with(prefix))
      return target.str();
  return std::nullopt;
}

llvm::ArrayRef<llvm::StringRef> mlir::amp::linearAlgebraCallPrefixes() {
  static const llvm::SmallVector<llvm::StringRef> prefixes(
      std::begin(kLinearAlgebraPrefixes), std::end(kLinearAlgebraPrefixes));
  return prefixes;
}
