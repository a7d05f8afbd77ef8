//===- Policy.cpp - Parsing and printing policies and option choices ------===//

#include "Policy.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::amp;

namespace {

template <typename T>
struct Spelling {
  const char *name;
  T value;
};

// The first spelling of each dtype is its canonical name. `half` is f16, as
// on GPUs; bf16 must be asked for by name.
constexpr Spelling<Dtype> kDtypeSpellings[] = {
    {"f32", Dtype::F32},           {"float32", Dtype::F32},
    {"full", Dtype::F32},          {"bf16", Dtype::BF16},
    {"bfloat16", Dtype::BF16},     {"f16", Dtype::F16},
    {"float16", Dtype::F16},       {"half", Dtype::F16},
    {"f64", Dtype::F64},           {"float64", Dtype::F64},
    {"f8e4m3fn", Dtype::F8E4M3FN}, {"float8_e4m3fn", Dtype::F8E4M3FN},
    {"f8e5m2", Dtype::F8E5M2},     {"float8_e5m2", Dtype::F8E5M2},
};
constexpr Dtype kDtypes[] = {Dtype::F32, Dtype::BF16,     Dtype::F16,
                             Dtype::F64, Dtype::F8E4M3FN, Dtype::F8E5M2};

constexpr Spelling<GemmDtype> kGemmSpellings[] = {
    {"compute", GemmDtype::Compute},
    {"f8", GemmDtype::F8},
    {"fp8", GemmDtype::F8},
    {"f8e4m3fn", GemmDtype::F8E4M3FN},
    {"float8_e4m3fn", GemmDtype::F8E4M3FN},
    {"f8e5m2", GemmDtype::F8E5M2},
    {"float8_e5m2", GemmDtype::F8E5M2},
};
constexpr GemmDtype kGemmDtypes[] = {GemmDtype::Compute, GemmDtype::F8,
                                     GemmDtype::F8E4M3FN, GemmDtype::F8E5M2};

llvm::Error optionError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

template <typename T, size_t N>
llvm::SmallVector<llvm::StringRef> spellingsOf(const Spelling<T> (&table)[N],
                                               T value) {
  llvm::SmallVector<llvm::StringRef> names;
  for (const Spelling<T> &spelling : table)
    if (spelling.value == value)
      names.push_back(spelling.name);
  return names;
}

template <typename T, size_t N>
std::string acceptedNames(const Spelling<T> (&table)[N]) {
  llvm::SmallVector<llvm::StringRef> names;
  for (const Spelling<T> &spelling : table)
    names.push_back(spelling.name);
  return llvm::join(names, ", ");
}

template <typename T, size_t N>
std::optional<T> lookup(const Spelling<T> (&table)[N], llvm::StringRef text) {
  std::string lowered = text.trim().lower();
  for (const Spelling<T> &spelling : table)
    if (lowered == spelling.name)
      return spelling.value;
  return std::nullopt;
}

const llvm::SmallVector<PolicyKey> &keys() {
  static const llvm::SmallVector<PolicyKey> table = {
      {"param", {"p", "param", "params"}},
      {"compute", {"c", "compute"}},
      {"output", {"o", "output"}},
      {"gemm", {"gemm"}},
  };
  return table;
}

/// Looks `value` up among the canonical `names` of an enum listed in `values`
/// order; the error names the option and the accepted values.
template <typename Enum>
llvm::Expected<Enum> parseChoice(llvm::StringRef option, llvm::StringRef text,
                                 llvm::ArrayRef<llvm::StringRef> names,
                                 llvm::ArrayRef<Enum> values) {
  for (auto [name, value] : llvm::zip(names, values))
    if (text.trim() == name)
      return value;
  return optionError("unknown " + option + " '" + text + "' (accepted: " +
                     llvm::join(names, ", ") + ")");
}

constexpr llvm::StringRef kLevelNames[] = {"O0", "O1", "O2", "O3"};
constexpr Level kLevels[] = {Level::O0, Level::O1, Level::O2, Level::O3};
constexpr llvm::StringRef kTargetNames[] = {"cpu", "gpu", "tpu"};
constexpr Target kTargets[] = {Target::Cpu, Target::Gpu, Target::Tpu};
constexpr llvm::StringRef kDotResultNames[] = {"f32", "compute"};
constexpr DotResult kDotResults[] = {DotResult::F32, DotResult::Compute};
constexpr llvm::StringRef kStorageNames[] = {"f32", "compute"};
constexpr Storage kStorages[] = {Storage::F32, Storage::Compute};
constexpr llvm::StringRef kReduceDtypeNames[] = {"f32", "compute"};
constexpr llvm::StringRef kDecisionsNames[] = {"exact", "gate"};
constexpr Decisions kDecisions[] = {Decisions::Exact, Decisions::Gate};
constexpr llvm::StringRef kRematerializeForNames[] = {"speed", "memory"};
constexpr RematerializeFor kRematerializeFors[] = {RematerializeFor::Speed,
                                                   RematerializeFor::Memory};

} // namespace

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

llvm::StringRef mlir::amp::dtypeName(Dtype dtype) {
  return spellingsOf(kDtypeSpellings, dtype).front();
}

llvm::SmallVector<llvm::StringRef> mlir::amp::dtypeSpellings(Dtype dtype) {
  return spellingsOf(kDtypeSpellings, dtype);
}

llvm::ArrayRef<Dtype> mlir::amp::allDtypes() { return kDtypes; }

bool mlir::amp::isFp8(Dtype dtype) {
  return dtype == Dtype::F8E4M3FN || dtype == Dtype::F8E5M2;
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

llvm::StringRef mlir::amp::gemmDtypeName(GemmDtype gemm) {
  return spellingsOf(kGemmSpellings, gemm).front();
}

llvm::SmallVector<llvm::StringRef>
mlir::amp::gemmDtypeSpellings(GemmDtype gemm) {
  return spellingsOf(kGemmSpellings, gemm);
}

llvm::ArrayRef<GemmDtype> mlir::amp::allGemmDtypes() { return kGemmDtypes; }

llvm::ArrayRef<llvm::StringRef> mlir::amp::fp8GemmNames() {
  static const llvm::SmallVector<llvm::StringRef> names = [] {
    llvm::SmallVector<llvm::StringRef> fp8;
    for (GemmDtype gemm : kGemmDtypes)
      if (gemm != GemmDtype::Compute)
        fp8.push_back(gemmDtypeName(gemm));
    return fp8;
  }();
  return names;
}

llvm::Expected<GemmDtype> mlir::amp::parseFp8Gemm(llvm::StringRef text) {
  std::optional<GemmDtype> gemm = lookup(kGemmSpellings, text);
  if (!gemm || *gemm == GemmDtype::Compute)
    return optionError("'" + text + "' is not an FP8 format (accepted: " +
                       llvm::join(fp8GemmNames(), ", ") + ")");
  return *gemm;
}

//===----------------------------------------------------------------------===//
// The policy grammar
//===----------------------------------------------------------------------===//

llvm::ArrayRef<PolicyKey> mlir::amp::policyKeys() { return keys(); }

std::string Policy::str() const {
  std::string text = ("p=" + dtypeName(param) + ",c=" + dtypeName(compute) +
                      ",o=" + dtypeName(output))
                         .str();
  if (gemm != GemmDtype::Compute)
    text += ",gemm=" + gemmDtypeName(gemm).str();
  return text;
}

namespace {
/// The key of `item`, a policy entry `KEY=DTYPE` split into `key` and
/// `value`, or why the entry is malformed.
llvm::Expected<const PolicyKey *> entryKey(llvm::StringRef item,
                                           llvm::StringRef key,
                                           llvm::StringRef value) {
  if (value.contains('=')) {
    // Two entries run together ("p=bf16 c=bf16", "p=bf16;c=bf16").
    llvm::SmallVector<llvm::StringRef> parts;
    llvm::SplitString(item, parts, " \t;:");
    return optionError("policy entries are separated by commas: '" + item +
                       "' holds more than one KEY=DTYPE (write " +
                       llvm::join(parts, ",") + ")");
  }
  if (!item.contains('=') || key.empty() || value.empty())
    return optionError("malformed policy entry '" + item +
                       "' (expected KEY=DTYPE with KEY one of p, c, o, "
                       "gemm)");
  const PolicyKey *match = nullptr;
  for (const PolicyKey &candidate : keys())
    if (llvm::is_contained(candidate.spellings, key.lower()))
      match = &candidate;
  if (!match)
    return optionError("unknown policy key '" + key +
                       "' (accepted: p|param|params, c|compute, o|output, "
                       "gemm)");
  return match;
}

/// The dtype `value` names for `key`, whose role is `role` (param,
/// compute or output).
llvm::Expected<Dtype> roleDtype(llvm::StringRef key, llvm::StringRef value,
                                llvm::StringRef role) {
  std::optional<Dtype> dtype = lookup(kDtypeSpellings, value);
  if (!dtype) {
    // The FP8 formats are not accepted here (see below): not listed.
    llvm::SmallVector<llvm::StringRef> names;
    for (const Spelling<Dtype> &spelling : kDtypeSpellings)
      if (!isFp8(spelling.value))
        names.push_back(spelling.name);
    std::string lowered = value.lower();
    bool fp8 = llvm::StringRef(lowered).starts_with("f8") ||
               llvm::StringRef(lowered).starts_with("float8");
    return optionError(
        "unknown dtype '" + value + "' for key '" + key + "' (accepted: " +
        llvm::join(names, ", ") + ")" +
        (fp8 ? "; FP8 is a GEMM operand format, not a " + role.str() +
                   " dtype: keep " + role.str() +
                   " in bf16/f16/f32 and add gemm=f8 (for example "
                   "p=f32,c=bf16,o=f32,gemm=f8)"
             : std::string()));
  }
  if (isFp8(*dtype))
    // FP8 has no arithmetic worth doing elementwise, and unscaled FP8
    // overflows to NaN: it is only an operand format for scaled GEMMs.
    return optionError("FP8 dtype '" + value + "' cannot be the " + role +
                       " dtype: FP8 is a GEMM operand format; keep " + role +
                       " in bf16/f16/f32 and add gemm=f8 (for example "
                       "p=f32,c=bf16,o=f32,gemm=f8)");
  return *dtype;
}

/// `policy` with the cascading defaults, or why its gemm= cannot apply.
llvm::Expected<Policy> completed(std::optional<Dtype> param,
                                 std::optional<Dtype> compute,
                                 std::optional<Dtype> output,
                                 std::optional<GemmDtype> gemm) {
  Policy policy;
  policy.param = param.value_or(Dtype::F32);
  policy.compute = compute.value_or(policy.param);
  policy.output = output.value_or(policy.compute);
  policy.gemm = gemm.value_or(GemmDtype::Compute);
  if (policy.gemm != GemmDtype::Compute &&
      (policy.compute == Dtype::F32 || policy.compute == Dtype::F64))
    // FP8 operands are given to the matrix multiplies the policy lowers;
    // with an f32 compute dtype none is lowered, and gemm=f8 would do
    // nothing.
    return optionError("gemm=" + gemmDtypeName(policy.gemm).str() +
                       " needs a low-precision compute dtype (c=bf16 or "
                       "c=f16, for example p=f32,c=bf16,o=f32,gemm=" +
                       gemmDtypeName(policy.gemm).str() + "): with c=" +
                       dtypeName(policy.compute).str() +
                       " no matrix multiply is lowered, so none becomes "
                       "an FP8 GEMM");
  return policy;
}
} // namespace

llvm::Expected<Policy> mlir::amp::parsePolicy(llvm::StringRef text) {
  std::optional<Dtype> param, compute, output;
  std::optional<GemmDtype> gemm;
  if (text.trim().empty())
    return optionError("empty policy (expected " + policyGrammarHelp() + ")");
  llvm::SmallVector<llvm::StringRef> items;
  text.split(items, ',');
  for (llvm::StringRef item : items) {
    item = item.trim();
    auto [key, value] = item.split('=');
    key = key.trim();
    value = value.trim();
    llvm::Expected<const PolicyKey *> match = entryKey(item, key, value);
    if (!match)
      return match.takeError();
    if ((*match)->role == "gemm") {
      if (gemm)
        return optionError("policy key '" + key + "' given twice");
      gemm = lookup(kGemmSpellings, value);
      if (!gemm)
        return optionError("unknown GEMM operand dtype '" + value +
                           "' for key 'gemm' (accepted: " +
                           acceptedNames(kGemmSpellings) + ")");
      continue;
    }
    std::optional<Dtype> *slot = (*match)->role == "param"     ? &param
                                 : (*match)->role == "compute" ? &compute
                                                               : &output;
    if (slot->has_value())
      return optionError("policy key '" + key + "' given twice");
    llvm::Expected<Dtype> dtype = roleDtype(key, value, (*match)->role);
    if (!dtype)
      return dtype.takeError();
    *slot = *dtype;
  }
  return completed(param, compute, output, gemm);
}

std::string mlir::amp::policyGrammarHelp() {
  std::string dtypes;
  for (Dtype dtype : kDtypes) {
    if (isFp8(dtype))
      continue;
    if (!dtypes.empty())
      dtypes += ", ";
    dtypes += llvm::join(dtypeSpellings(dtype), "|");
  }
  std::string gemms;
  for (GemmDtype gemm : kGemmDtypes) {
    if (!gemms.empty())
      gemms += ", ";
    gemms += llvm::join(gemmDtypeSpellings(gemm), "|");
  }
  return "p=DTYPE,c=DTYPE,o=DTYPE[,gemm=GEMM]: keys p|param|params "
         "(parameters), c|compute, o|output, gemm (matrix-multiply operands); "
         "missing keys cascade (compute follows params, output follows "
         "compute, gemm follows compute); dtypes " +
         dtypes + "; GEMM dtypes " + gemms +
         " (f8: e4m3fn forward, e5m2 gradients, scaled per tensor)";
}

//===----------------------------------------------------------------------===//
// Levels, targets, dot results, storage
//===----------------------------------------------------------------------===//

llvm::ArrayRef<llvm::StringRef> mlir::amp::levelNames() { return kLevelNames; }
llvm::ArrayRef<llvm::StringRef> mlir::amp::targetNames() {
  return kTargetNames;
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::dotResultNames() {
  return kDotResultNames;
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::storageNames() {
  return kStorageNames;
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::reduceDtypeNames() {
  return kReduceDtypeNames;
}
llvm::StringRef mlir::amp::reduceDtypeName(ReduceDtype reduce) {
  return kReduceDtypeNames[static_cast<int>(reduce)];
}

llvm::Expected<std::string>
mlir::amp::canonicalReduceDtypeName(llvm::StringRef text) {
  text = text.trim();
  if (llvm::is_contained(kReduceDtypeNames, text))
    return text.str();
  std::optional<Dtype> dtype = lookup(kDtypeSpellings, text);
  if (dtype == Dtype::F32)
    return std::string("f32");
  if (dtype == Dtype::BF16 || dtype == Dtype::F16)
    return dtypeName(*dtype).str();
  return optionError(
      (dtype ? "reduce-dtype '" + text +
                   "': gradients are reduced in f32 or a compute dtype"
             : "unknown reduce-dtype '" + text + "'") +
      " (accepted: f32, compute, or the compute dtype: bf16, f16)");
}

llvm::Expected<ReduceDtype> mlir::amp::parseReduceDtype(llvm::StringRef text,
                                                        Dtype compute) {
  llvm::Expected<std::string> name = canonicalReduceDtypeName(text);
  if (!name)
    return name.takeError();
  if (*name == "f32")
    return ReduceDtype::F32;
  if (*name == "compute" || *name == dtypeName(compute))
    return ReduceDtype::Compute;
  return optionError("reduce-dtype '" + text + "' is neither f32 nor the "
                     "policy's compute dtype (" + dtypeName(compute) +
                     "): use f32, " + dtypeName(compute) + " or compute");
}

llvm::StringRef mlir::amp::levelName(Level level) {
  return kLevelNames[static_cast<int>(level)];
}
llvm::StringRef mlir::amp::targetName(Target target) {
  return kTargetNames[static_cast<int>(target)];
}
llvm::StringRef mlir::amp::dotResultName(DotResult dotResult) {
  return kDotResultNames[static_cast<int>(dotResult)];
}
llvm::StringRef mlir::amp::decisionsName(Decisions decisions) {
  return kDecisionsNames[static_cast<int>(decisions)];
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::decisionsNames() {
  return kDecisionsNames;
}
llvm::Expected<Decisions> mlir::amp::parseDecisions(llvm::StringRef text) {
  return parseChoice<Decisions>("decisions", text, kDecisionsNames,
                                kDecisions);
}
llvm::StringRef mlir::amp::rematerializeForName(RematerializeFor goal) {
  return kRematerializeForNames[static_cast<int>(goal)];
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::rematerializeForNames() {
  return kRematerializeForNames;
}
llvm::Expected<RematerializeFor>
mlir::amp::parseRematerializeFor(llvm::StringRef text) {
  return parseChoice<RematerializeFor>("goal", text, kRematerializeForNames,
                                       kRematerializeFors);
}
llvm::StringRef mlir::amp::storageName(Storage storage) {
  return kStorageNames[static_cast<int>(storage)];
}

llvm::Expected<Level> mlir::amp::parseLevel(llvm::StringRef text) {
  return parseChoice<Level>("level", text.trim().upper(), kLevelNames,
                            kLevels);
}

llvm::Expected<Target> mlir::amp::parseTarget(llvm::StringRef text) {
  return parseChoice<Target>("target", text, kTargetNames, kTargets);
}

llvm::Expected<DotResult> mlir::amp::parseDotResult(llvm::StringRef text) {
  return parseChoice<DotResult>("dot-result", text, kDotResultNames,
                                kDotResults);
}

llvm::Expected<DotResult> mlir::amp::parseDotResult(llvm::StringRef text,
                                                    Target target,
                                                    Dtype compute) {
  if (text.trim().empty())
    return defaultDotResult(target, compute);
  return parseDotResult(text);
}

DotResult mlir::amp::defaultDotResult(Target target, Dtype compute) {
  // An f32 result buys one rounding of a value whose operands were rounded
  // already, and costs its bytes twice more: written, and read by each
  // reader (docs/DESIGN.md, "Decisions with a price").
  return target != Target::Cpu && compute == Dtype::BF16 ? DotResult::Compute
                                                          : DotResult::F32;
}

llvm::Expected<Storage> mlir::amp::parseStorage(llvm::StringRef text,
                                                Target target) {
  if (text.trim().empty())
    return defaultStorage(target);
  return parseChoice<Storage>("storage", text, kStorageNames, kStorages);
}

llvm::Expected<Level> mlir::amp::parseLevel(llvm::StringRef text,
                                            Target target) {
  if (text.trim().empty())
    return defaultLevel(target);
  return parseLevel(text);
}

Level mlir::amp::defaultLevel(Target target) {
  // XLA:CPU computes bf16 and f16 elementwise arithmetic in f32 and rounds
  // after each op: painting it low adds converts and rounding and no speed
  // (bench/peers.py: O1 0.47x f32 step and 0.70x memory against O2's 0.53x
  // and 0.81x on the LM). On GPUs and TPUs low-precision elementwise
  // arithmetic is native and halves the bytes it moves.
  return target == Target::Cpu ? Level::O1 : Level::O2;
}

bool mlir::amp::defaultRematerialize(Target target) {
  // LM training step, 4 layers: on an H100 (deviceless compile) it takes
  // memory from 0.69x to 0.53x f32; on XLA:CPU, at O1, it finds little to
  // recompute and adds 2 MiB (160 -> 162 MiB) and elementwise work.
  return target != Target::Cpu;
}

Storage mlir::amp::defaultStorage(Target target) {
  // Measured with bench/peers.py (cpu) and bench/gpu.py (gpu): see Passes.td.
  switch (target) {
  case Target::Cpu:
  case Target::Gpu:
  case Target::Tpu:
    return Storage::Compute;
  }
  llvm_unreachable("unknown target");
}
