//===- Policy.cpp - Parsing and printing precision policies ---------------===//

#include "Policy.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace mlir::amp;

namespace {
struct DtypeSpelling {
  const char *name;
  Dtype dtype;
};
// The first spelling of each dtype is its canonical name. `half` is f16, as
// on GPUs; bf16 must be asked for by name.
constexpr DtypeSpelling kDtypeSpellings[] = {
    {"f32", Dtype::F32},           {"float32", Dtype::F32},
    {"full", Dtype::F32},          {"bf16", Dtype::BF16},
    {"bfloat16", Dtype::BF16},     {"f16", Dtype::F16},
    {"float16", Dtype::F16},       {"half", Dtype::F16},
    {"f64", Dtype::F64},           {"float64", Dtype::F64},
    {"f8e4m3fn", Dtype::F8E4M3FN}, {"float8_e4m3fn", Dtype::F8E4M3FN},
    {"f8e5m2", Dtype::F8E5M2},     {"float8_e5m2", Dtype::F8E5M2},
};

llvm::Error policyError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

llvm::Expected<Dtype> parseDtype(llvm::StringRef key, llvm::StringRef text) {
  std::string lowered = text.trim().lower();
  for (const DtypeSpelling &spelling : kDtypeSpellings)
    if (lowered == spelling.name)
      return spelling.dtype;
  return policyError("unknown dtype '" + text + "' for key '" + key +
                     "' (accepted: " + acceptedDtypeNames() + ")");
}
} // namespace

llvm::StringRef mlir::amp::dtypeName(Dtype dtype) {
  for (const DtypeSpelling &spelling : kDtypeSpellings)
    if (spelling.dtype == dtype)
      return spelling.name;
  llvm_unreachable("every dtype has a spelling");
}

FloatType mlir::amp::dtypeType(MLIRContext *context, Dtype dtype) {
  switch (dtype) {
  case Dtype::F64:
    return Float64Type::get(context);
  case Dtype::F32:
    return Float32Type::get(context);
  case Dtype::BF16:
    return BFloat16Type::get(context);
  case Dtype::F16:
    return Float16Type::get(context);
  case Dtype::F8E4M3FN:
    return Float8E4M3FNType::get(context);
  case Dtype::F8E5M2:
    return Float8E5M2Type::get(context);
  }
  llvm_unreachable("unknown dtype");
}

std::string mlir::amp::acceptedDtypeNames() {
  std::string names;
  for (const DtypeSpelling &spelling : kDtypeSpellings) {
    if (!names.empty())
      names += ", ";
    names += spelling.name;
  }
  return names;
}

llvm::Expected<Level> mlir::amp::parseLevel(llvm::StringRef text) {
  std::string upper = text.trim().upper();
  std::optional<Level> level = llvm::StringSwitch<std::optional<Level>>(upper)
                                   .Case("O0", Level::O0)
                                   .Case("O1", Level::O1)
                                   .Case("O2", Level::O2)
                                   .Case("O3", Level::O3)
                                   .Default(std::nullopt);
  if (!level)
    return policyError("unknown level '" + text +
                       "' (accepted: O0, O1, O2, O3)");
  return *level;
}

llvm::StringRef mlir::amp::levelName(Level level) {
  static const char *names[] = {"O0", "O1", "O2", "O3"};
  return names[static_cast<int>(level)];
}

std::string Policy::str() const {
  return ("p=" + dtypeName(param) + ",c=" + dtypeName(compute) +
          ",o=" + dtypeName(output))
      .str();
}

llvm::Expected<Policy> mlir::amp::parsePolicy(llvm::StringRef text) {
  std::optional<Dtype> param, compute, output;
  if (text.trim().empty())
    return policyError("empty policy (expected " + policyGrammarHelp() + ")");
  llvm::SmallVector<llvm::StringRef> items;
  text.split(items, ',');
  for (llvm::StringRef item : items) {
    item = item.trim();
    auto [key, value] = item.split('=');
    key = key.trim();
    if (!item.contains('=') || key.empty() || value.trim().empty())
      return policyError("malformed policy entry '" + item +
                         "' (expected KEY=DTYPE with KEY one of p, c, o)");
    std::optional<Dtype> *slot =
        llvm::StringSwitch<std::optional<Dtype> *>(key.lower())
            .Cases({"p", "param", "params"}, &param)
            .Cases({"c", "compute"}, &compute)
            .Cases({"o", "output"}, &output)
            .Default(nullptr);
    if (!slot)
      return policyError("unknown policy key '" + key +
                         "' (accepted: p|param|params, c|compute, o|output)");
    if (slot->has_value())
      return policyError("policy key '" + key + "' given twice");
    llvm::Expected<Dtype> dtype = parseDtype(key, value);
    if (!dtype)
      return dtype.takeError();
    *slot = *dtype;
  }
  Policy policy;
  policy.param = param.value_or(Dtype::F32);
  policy.compute = compute.value_or(policy.param);
  policy.output = output.value_or(policy.compute);
  return policy;
}

llvm::StringRef mlir::amp::policyGrammarHelp() {
  return "p=DTYPE,c=DTYPE,o=DTYPE: keys p|params (parameters), c|compute, "
         "o|output; missing keys cascade (compute follows params, output "
         "follows compute); dtypes f32|float32|full, bf16|bfloat16, "
         "f16|float16|half, f64|float64, f8e4m3fn|float8_e4m3fn, "
         "f8e5m2|float8_e5m2";
}
