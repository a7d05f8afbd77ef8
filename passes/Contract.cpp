//===- Contract.cpp - Loss-scale rules, decisions, and the contract JSON --===//

#include "Contract.h"
#include "OpClasses.h"
#include "Passes.h"
#include "Policy.h"
#include "StableHLO.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace mlir::amp;

//===----------------------------------------------------------------------===//
// Loss scaling
//===----------------------------------------------------------------------===//

namespace {
constexpr llvm::StringRef kModeNames[] = {"dynamic", "static", "none"};
constexpr LossScaleMode kModes[] = {LossScaleMode::Dynamic,
                                    LossScaleMode::Static,
                                    LossScaleMode::None};
} // namespace

llvm::ArrayRef<llvm::StringRef> mlir::amp::lossScaleModeNames() {
  return kModeNames;
}

llvm::StringRef mlir::amp::lossScaleModeName(LossScaleMode mode) {
  return kModeNames[static_cast<int>(mode)];
}

llvm::Expected<LossScaleMode> mlir::amp::parseLossScaleMode(llvm::StringRef text) {
  for (auto [name, mode] : llvm::zip(kModeNames, kModes))
    if (text.trim() == name)
      return mode;
  return llvm::createStringError("unknown value '" + text +
                                 "' (accepted: dynamic, static, none)");
}

namespace {
/// `2.0`, `0.5`, `1e+30`: a double the way Python prints it.
std::string floatText(double value) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%.17g", value);
  if (text.find_first_of(".ein") == std::string::npos)
    text += ".0";
  return text;
}
} // namespace

llvm::Error mlir::amp::validateLossScale(const LossScaleConfig &config,
                                         bool pythonNames) {
  auto invalid = [&](llvm::StringRef option, const llvm::Twine &rule,
                     const std::string &value) {
    std::string name = option.str();
    if (pythonNames)
      std::replace(name.begin(), name.end(), '-', '_');
    return llvm::createStringError(
        (pythonNames ? "invalid " + name : "invalid option '" + name + "'") +
        ": " + rule + ", got " + value);
  };
  if (config.growthInterval < 1)
    return invalid("growth-interval", "must be at least 1",
                   std::to_string(config.growthInterval));
  if (!(config.growthFactor >= 1.0) || std::isinf(config.growthFactor))
    return invalid("growth-factor", "must be finite and at least 1",
                   floatText(config.growthFactor));
  if (!(config.backoffFactor > 0.0 && config.backoffFactor <= 1.0))
    return invalid("backoff-factor", "must be in (0, 1]",
                   floatText(config.backoffFactor));
  if (!(config.minScale > 0.0) || std::isinf(config.minScale))
    return invalid("min-scale", "must be finite and positive",
                   floatText(config.minScale));
  if (!(config.maxScale >= config.minScale) || std::isinf(config.maxScale))
    return invalid("max-scale",
                   "must be finite and at least min" +
                       llvm::Twine(pythonNames ? "_" : "-") + "scale (" +
                       floatText(config.minScale) + ")",
                   floatText(config.maxScale));
  return llvm::Error::success();
}

LossScaleLayout mlir::amp::lossScaleLayout(LossScaleMode mode) {
  switch (mode) {
  case LossScaleMode::Dynamic:
    return {{attr::kLossScale, attr::kLossScaleCounter},
            {attr::kGradsFinite, attr::kLossScale, attr::kLossScaleCounter}};
  case LossScaleMode::Static:
    return {{attr::kLossScale}, {attr::kGradsFinite}};
  case LossScaleMode::None:
    return {{}, {attr::kGradsFinite}};
  }
  llvm_unreachable("unknown mode");
}

//===----------------------------------------------------------------------===//
// Decisions
//===----------------------------------------------------------------------===//

namespace {
struct ReasonInfo {
  Reason reason;
  const char *id;
  const char *text;
};
constexpr ReasonInfo kReasons[] = {
    {Reason::MatrixMultiply, "matrix_multiply",
     "matrix multiply, f32 accumulation"},
    {Reason::MatrixMultiplyCompute, "matrix_multiply_compute",
     "matrix multiply"},
    {Reason::BetweenLowOps, "between_low_ops", "between low-precision ops"},
    {Reason::FeedsLowOps, "feeds_low_ops", "feeds only low-precision ops"},
    {Reason::InputsLow, "inputs_low", "inputs are low precision"},
    {Reason::LevelO3, "level_o3", "level O3: every float op"},
    {Reason::ForceCompute, "force_compute", "force-compute override"},
    {Reason::NumericallySensitive, "numerically_sensitive",
     "numerically sensitive op"},
    {Reason::ConsumesSensitive, "consumes_sensitive",
     "consumes a numerically sensitive result"},
    {Reason::NotBetweenLowOps, "not_between_low_ops",
     "not between low-precision ops"},
    {Reason::KeepF32, "keep_f32", "keep-f32 override"},
    {Reason::DiscreteDecision, "discrete_decision",
     "feeds a discrete decision"},
    {Reason::LinearAlgebra, "linear_algebra", "feeds linear algebra"},
    {Reason::Calibration, "calibration", "kept f32 by calibration"},
    {Reason::CpuConvolution, "cpu_convolution",
     "XLA:CPU runs convolutions in f32"},
    {Reason::CpuDynamicDot, "cpu_dynamic_dot",
     "dynamic shape: XLA:CPU needs a static NT-canonical dot"},
    {Reason::DotAlgorithm, "dot_algorithm", "dot algorithm given explicitly"},
    {Reason::Fixed, "fixed", "keeps its exact types"},
    {Reason::NoF32Values, "no_f32_values", "no f32 values"},
    {Reason::OperandsAlreadyLow, "operands_already_low",
     "operands already in a low-precision dtype"},
};

/// The entry of `table` (ReasonInfo, Fp8IneligibilityInfo) for `key`.
template <typename Info, size_t N, typename Key>
const Info &lookup(const Info (&table)[N], Key key, Key Info::*field) {
  for (const Info &info : table)
    if (info.*field == key)
      return info;
  llvm_unreachable("every entry is listed");
}

const ReasonInfo &infoOf(Reason reason) {
  return lookup(kReasons, reason, &ReasonInfo::reason);
}
} // namespace

llvm::StringRef mlir::amp::precisionId(Precision precision) {
  switch (precision) {
  case Precision::Low:
    return "low";
  case Precision::Full:
    return "f32";
  case Precision::Unchanged:
    return "unchanged";
  }
  llvm_unreachable("unknown precision");
}

llvm::StringRef mlir::amp::reasonId(Reason reason) { return infoOf(reason).id; }

namespace {
struct Fp8IneligibilityInfo {
  Fp8Ineligibility why;
  const char *id;
  const char *text;
};
constexpr Fp8IneligibilityInfo kFp8Ineligibilities[] = {
    {Fp8Ineligibility::DimensionsUnreadable, "dimensions_unreadable",
     "dimension numbers not readable"},
    {Fp8Ineligibility::DynamicShapes, "dynamic_shapes", "dynamic shapes"},
    {Fp8Ineligibility::BatchDimensions, "batch_dimensions",
     "batch dimensions (batched products stay in the compute dtype)"},
    {Fp8Ineligibility::SizeNotMultipleOf16, "size_not_multiple_of_16",
     "a size is not a multiple of 16 (cuBLASLt's FP8 requirement)"},
    {Fp8Ineligibility::BothE5M2, "both_e5m2",
     "both operands e5m2 (no e5m2 x e5m2 FP8 GEMM)"},
};

const Fp8IneligibilityInfo &infoOf(Fp8Ineligibility why) {
  return lookup(kFp8Ineligibilities, why, &Fp8IneligibilityInfo::why);
}
} // namespace

llvm::StringRef mlir::amp::fp8IneligibilityId(Fp8Ineligibility why) {
  return infoOf(why).id;
}
llvm::StringRef mlir::amp::fp8IneligibilityText(Fp8Ineligibility why) {
  return infoOf(why).text;
}

//===----------------------------------------------------------------------===//
// The contract as JSON
//===----------------------------------------------------------------------===//

namespace {
llvm::json::Array strings(llvm::ArrayRef<llvm::StringRef> values) {
  llvm::json::Array array;
  for (llvm::StringRef value : values)
    array.push_back(value);
  return array;
}

llvm::json::Object option(llvm::json::Value defaultValue,
                          llvm::ArrayRef<llvm::StringRef> choices = {}) {
  llvm::json::Object object{{"default", std::move(defaultValue)}};
  if (!choices.empty())
    object["choices"] = strings(choices);
  return object;
}

llvm::json::Object policyJson() {
  llvm::json::Array dtypes, gemms, keys;
  for (Dtype dtype : allDtypes())
    dtypes.push_back(llvm::json::Object{
        {"name", dtypeName(dtype)},
        {"spellings", strings(dtypeSpellings(dtype))},
        {"fp8", isFp8(dtype)}});
  for (GemmDtype gemm : allGemmDtypes())
    gemms.push_back(llvm::json::Object{
        {"name", gemmDtypeName(gemm)},
        {"spellings", strings(gemmDtypeSpellings(gemm))}});
  for (const PolicyKey &key : policyKeys())
    keys.push_back(llvm::json::Object{{"role", key.role},
                                      {"spellings", strings(key.spellings)}});
  return llvm::json::Object{{"default", kDefaultPolicy},
          {"training_default", kTrainingDefaultPolicy},
          {"grammar", policyGrammarHelp()},
          {"keys", std::move(keys)},
          {"dtypes", std::move(dtypes)},
          {"gemm_dtypes", std::move(gemms)}};
}

llvm::json::Object passesJson() {
  AmpInsertConvertsPassOptions convert;
  AmpLossScalePassOptions scale;
  llvm::json::Object storageDefaults, levelDefaults, rematDefaults;
  for (llvm::StringRef name : targetNames()) {
    Target target = llvm::cantFail(parseTarget(name));
    storageDefaults[name] = storageName(defaultStorage(target));
    levelDefaults[name] = levelName(defaultLevel(target));
    rematDefaults[name] = defaultRematerialize(target);
  }
  llvm::json::Object insertConverts{
      {"policy", option(convert.policy)},
      {"level", option(convert.level, levelNames())},
      {"target", option(convert.target, targetNames())},
      {"dot-result", option(convert.dotResult, dotResultNames())},
      {"storage", option(convert.storage, storageNames())},
      {"keep-f32", option(llvm::json::Array())},
      {"force-compute", option(llvm::json::Array())},
      {"keep-groups", option(llvm::json::Array())},
      {"strict", option(convert.strict)},
      {"report", option(convert.report)},
  };
  AmpFp8GemmsPassOptions fp8;
  llvm::json::Object fp8Gemms{
      {"gemm", option(fp8.gemm, fp8GemmNames())},
      {"scaling", option(fp8.scaling, {"current", "delayed"})},
      {"amax-history", option(fp8.amaxHistory)},
      {"report", option(fp8.report)},
  };
  AmpRematerializePassOptions remat;
  llvm::json::Object rematerialize{
      {"min-elements", option(remat.minElements)},
      {"max-ops", option(remat.maxOps)},
  };
  llvm::json::Object lossScale{
      {"mode", option(scale.mode, lossScaleModeNames())},
      {"seed-arg", option(scale.seedArg)},
      {"gradient-results", option(llvm::json::Array())},
      {"state-results", option(llvm::json::Array())},
      {"growth-interval", option(scale.growthInterval)},
      {"growth-factor", option(scale.growthFactor)},
      {"backoff-factor", option(scale.backoffFactor)},
      {"min-scale", option(scale.minScale)},
      {"max-scale", option(scale.maxScale)},
  };
  return llvm::json::Object{
      {"amp-insert-converts",
       llvm::json::Object{{"options", std::move(insertConverts)},
                          {"storage_defaults", std::move(storageDefaults)},
                          {"level_defaults", std::move(levelDefaults)}}},
      {"amp-fp8-gemms", llvm::json::Object{{"options", std::move(fp8Gemms)}}},
      {"amp-rematerialize",
       llvm::json::Object{{"options", std::move(rematerialize)},
                          {"target_defaults", std::move(rematDefaults)}}},
      {"amp-loss-scale", llvm::json::Object{{"options", std::move(lossScale)}}},
      {"amp-simplify-converts", llvm::json::Object{{"options",
                                                    llvm::json::Object{}}}},
  };
}

llvm::json::Object lossScaleJson() {
  LossScaleConfig defaults;
  llvm::json::Object layouts;
  for (auto [name, mode] : llvm::zip(kModeNames, kModes)) {
    LossScaleLayout layout = lossScaleLayout(mode);
    layouts[name] = llvm::json::Object{{"arguments", strings(layout.arguments)},
                                       {"results", strings(layout.results)}};
  }
  return llvm::json::Object{{"initial_scale", kInitialLossScale},
          {"growth_interval", defaults.growthInterval},
          {"growth_factor", defaults.growthFactor},
          {"backoff_factor", defaults.backoffFactor},
          {"min_scale", defaults.minScale},
          {"max_scale", defaults.maxScale},
          {"layouts", std::move(layouts)}};
}

llvm::json::Object decisionsJson() {
  llvm::json::Object reasons;
  for (const ReasonInfo &info : kReasons)
    reasons[info.id] = info.text;
  llvm::json::Object fp8Reasons;
  for (const Fp8IneligibilityInfo &info : kFp8Ineligibilities)
    fp8Reasons[info.id] = info.text;
  return llvm::json::Object{{"precisions", strings({precisionId(Precision::Low),
                                  precisionId(Precision::Full),
                                  precisionId(Precision::Unchanged)})},
          {"reasons", std::move(reasons)},
          {"fp8_reasons", std::move(fp8Reasons)}};
}
} // namespace

std::string mlir::amp::contractJson() {
  llvm::json::Object attributes{
      {"keep_dtype", attr::kKeepDtype},
      {"loss_seed", attr::kLossSeed},
      {"gradient", attr::kGradient},
      {"state_of", attr::kStateOf},
      {"gradients_call", attr::kGradientsCall},
      {"loss_scale", attr::kLossScale},
      {"loss_scale_counter", attr::kLossScaleCounter},
      {"grads_finite", attr::kGradsFinite},
      {"decision", attr::kDecision},
      {"cotangent", attr::kCotangent},
      {"amax_history", attr::kAmaxHistory},
      {"inserted", attr::kInserted},
      {"stored_marker", attr::kStoredMarker},
      {"fp8_marker", attr::kFp8Marker},
  };
  llvm::json::Object contract{
      {"policy", policyJson()},
      {"passes", passesJson()},
      {"attributes", std::move(attributes)},
      {"loss_scale", lossScaleJson()},
      {"decisions", decisionsJson()},
      {"op_names", strings(shlo::knownOpNames())},
      {"linear_algebra_calls", strings(linearAlgebraCallPrefixes())},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(contract));
  return text;
}
