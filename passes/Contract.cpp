//===- Contract.cpp - Loss-scale rules, decisions, and the contract JSON --===//

#include "Contract.h"
#include "OpClasses.h"
#include "Passes.h"
#include "Policy.h"
#include "Scopes.h"
#include "StableHLO.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <iterator>

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

namespace {
constexpr LossScaleField kLossScaleFields[] = {
    {"growth_interval", "growth-interval", &LossScaleConfig::growthInterval,
     nullptr},
    {"growth_factor", "growth-factor", nullptr, &LossScaleConfig::growthFactor},
    {"backoff_factor", "backoff-factor", nullptr,
     &LossScaleConfig::backoffFactor},
    {"min_scale", "min-scale", nullptr, &LossScaleConfig::minScale},
    {"max_scale", "max-scale", nullptr, &LossScaleConfig::maxScale},
};

const LossScaleField &fieldOf(int64_t LossScaleConfig::*member) {
  for (const LossScaleField &field : kLossScaleFields)
    if (field.integer == member)
      return field;
  llvm_unreachable("every field is listed");
}

const LossScaleField &fieldOf(double LossScaleConfig::*member) {
  for (const LossScaleField &field : kLossScaleFields)
    if (field.real == member)
      return field;
  llvm_unreachable("every field is listed");
}

std::string fieldNames() {
  std::string names;
  for (const LossScaleField &field : kLossScaleFields)
    names += (names.empty() ? "" : ", ") + field.name.str();
  return names;
}
} // namespace

llvm::ArrayRef<LossScaleField> mlir::amp::lossScaleFields() {
  return kLossScaleFields;
}

llvm::Error mlir::amp::validateLossScale(const LossScaleConfig &config,
                                         bool pythonNames) {
  auto spelling = [&](const LossScaleField &field) {
    return pythonNames ? field.name : field.option;
  };
  auto invalid = [&](const LossScaleField &field, const llvm::Twine &rule,
                     const std::string &value) {
    llvm::StringRef name = spelling(field);
    return llvm::createStringError(
        (pythonNames ? "invalid " + name : "invalid option '" + name + "'") +
        ": " + rule + ", got " + value);
  };
  using C = LossScaleConfig;
  if (config.growthInterval < 1)
    return invalid(fieldOf(&C::growthInterval), "must be at least 1",
                   std::to_string(config.growthInterval));
  if (!(config.growthFactor >= 1.0) || std::isinf(config.growthFactor))
    return invalid(fieldOf(&C::growthFactor), "must be finite and at least 1",
                   floatText(config.growthFactor));
  if (!(config.backoffFactor > 0.0 && config.backoffFactor <= 1.0))
    return invalid(fieldOf(&C::backoffFactor), "must be in (0, 1]",
                   floatText(config.backoffFactor));
  if (!(config.minScale > 0.0) || std::isinf(config.minScale))
    return invalid(fieldOf(&C::minScale), "must be finite and positive",
                   floatText(config.minScale));
  if (!(config.maxScale >= config.minScale) || std::isinf(config.maxScale))
    return invalid(fieldOf(&C::maxScale),
                   "must be finite and at least " +
                       spelling(fieldOf(&C::minScale)) + " (" +
                       floatText(config.minScale) + ")",
                   floatText(config.maxScale));
  return llvm::Error::success();
}

llvm::Expected<LossScaleConfig> mlir::amp::lossScaleConfigFromFields(
    LossScaleMode mode,
    llvm::ArrayRef<std::pair<std::string, double>> fields) {
  LossScaleConfig config;
  config.mode = mode;
  llvm::SmallVector<llvm::StringRef> given;
  for (const auto &[name, value] : fields) {
    const LossScaleField *field = llvm::find_if(
        kLossScaleFields, [&](const LossScaleField &f) { return f.name == name; });
    if (field == std::end(kLossScaleFields))
      return llvm::createStringError("unknown loss-scale field '" + name +
                                     "' (fields: " + fieldNames() + ")");
    if (llvm::is_contained(given, field->name))
      return llvm::createStringError("loss-scale field '" + name +
                                     "' given twice");
    given.push_back(field->name);
    if (field->real) {
      config.*field->real = value;
      continue;
    }
    // Integers cross as doubles; a fraction would be truncated silently, and
    // past 2**62 the cast to int64_t would not be exact.
    if (!(std::trunc(value) == value) || std::abs(value) > 0x1p62)
      return llvm::createStringError("invalid " + name +
                                     ": must be an integer, got " +
                                     floatText(value));
    config.*field->integer = static_cast<int64_t>(value);
  }
  for (const LossScaleField &field : kLossScaleFields)
    if (!llvm::is_contained(given, field.name))
      return llvm::createStringError("missing loss-scale field '" +
                                     field.name + "' (fields: " +
                                     fieldNames() + ")");
  if (llvm::Error error = validateLossScale(config, /*pythonNames=*/true))
    return std::move(error);
  return config;
}

LossScaleLayout mlir::amp::lossScaleLayout(LossScaleMode mode,
                                           bool checksGradients) {
  switch (mode) {
  case LossScaleMode::Dynamic:
    return {{attr::kLossScale, attr::kLossScaleCounter},
            {attr::kGradsFinite, attr::kLossScale, attr::kLossScaleCounter}};
  case LossScaleMode::Static:
    return {{attr::kLossScale}, {attr::kGradsFinite}};
  case LossScaleMode::None:
    if (!checksGradients)
      return {{}, {}};
    return {{}, {attr::kGradsFinite}};
  }
  llvm_unreachable("unknown mode");
}

namespace {
// Kept on a skipped step: marked amp.state_of their argument, so
// amp-loss-scale selects the old value (the histories would otherwise take
// an overflowed step's infinite amaxes, the buffers what the skipped update
// lost; the key is kept so a step's rounding is a function of the state).
// The loss scale is updated on every step: it backs off on a skipped one.
constexpr StateRole kStateRoles[] = {
    {attr::kLossScale, "loss_scale", "amp-loss-scale",
     /*perParameter=*/false, /*keptOnSkip=*/false},
    {attr::kLossScaleCounter, "loss_scale", "amp-loss-scale",
     /*perParameter=*/false, /*keptOnSkip=*/false},
    {attr::kGradsFinite, "loss_scale", "amp-loss-scale",
     /*perParameter=*/false, /*keptOnSkip=*/false},
    {attr::kStateFinite, "loss_scale", "amp-loss-scale",
     /*perParameter=*/false, /*keptOnSkip=*/false},
    {attr::kAmaxHistory, "amax_history", "amp-fp8-gemms",
     /*perParameter=*/false, /*keptOnSkip=*/true},
    {attr::kRoundingKey, "rounding_key", "amp-round-state",
     /*perParameter=*/false, /*keptOnSkip=*/true},
    {attr::kCompensation, "compensation", "amp-round-state",
     /*perParameter=*/true, /*keptOnSkip=*/true},
};

constexpr Measurement kMeasurements[] = {
    {attr::kGemmAmax, "amp-numerics"},
    {attr::kGemmCounts, "amp-numerics"},
    {attr::kNonFinite, "amp-numerics"},
};
} // namespace

llvm::ArrayRef<StateRole> mlir::amp::stateRoles() { return kStateRoles; }
llvm::ArrayRef<Measurement> mlir::amp::measurements() {
  return kMeasurements;
}

const StateRole &mlir::amp::stateRole(llvm::StringRef attribute) {
  for (const StateRole &role : kStateRoles)
    if (role.attribute == attribute)
      return role;
  llvm_unreachable("not a state role of the contract");
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
    {Reason::ScalesLowGradient, "scales_low_gradient",
     "scales a gradient a matrix multiply wrote in the compute dtype"},
    {Reason::PartitionedNormTerm, "partitioned_norm_term",
     "a normalisation's backward term, moved between devices"},
    {Reason::LevelO3, "level_o3", "level O3: every float op"},
    {Reason::ForceCompute, "force_compute", "force-compute override"},
    {Reason::ScopeCompute, "scope_compute",
     "forced into the compute dtype by scopes['{detail}']"},
    {Reason::NumericallySensitive, "numerically_sensitive",
     "numerically sensitive op"},
    {Reason::ConsumesSensitive, "consumes_sensitive",
     "consumes a numerically sensitive result"},
    {Reason::NotBetweenLowOps, "not_between_low_ops",
     "not between low-precision ops"},
    {Reason::KeepF32, "keep_f32", "keep-f32 override"},
    {Reason::ScopeF32, "scope_f32", "kept f32 by scopes['{detail}']"},
    {Reason::PrecisionRequested, "precision_requested",
     "precision={detail} requested at {where}"},
    {Reason::DiscreteDecision, "discrete_decision",
     "feeds a discrete decision"},
    {Reason::GatesDecision, "gates_decision",
     "the matrix multiply that gates a discrete decision"},
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
    {Fp8Ineligibility::ContractionNotMultipleOfBlock,
     "contraction_not_multiple_of_32",
     "mxfp8 needs a contraction that is a multiple of its 32-element blocks"},
    {Fp8Ineligibility::TooSmall, "too_small",
     "too small: quantizing its operands would cost more than FP8 saves "
     "(fp8_min_size)"},
    {Fp8Ineligibility::Kept, "kept",
     "kept in the compute dtype by keep_gemms (or fp8_fallback)"},
    {Fp8Ineligibility::Scope, "scope", "kept in the compute dtype by scopes"},
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
// State rounding
//===----------------------------------------------------------------------===//

namespace {
constexpr llvm::StringRef kUpdateRoundingNames[] = {"nearest", "stochastic",
                                              "kahan"};
constexpr llvm::StringRef kOptimizerStateDtypeNames[] = {"f32", "bf16", "f8"};
// amp-fp8-gemms' scalings, in Fp8Scaling's order.
constexpr llvm::StringRef kFp8ScalingNames[] = {"current", "delayed",
                                                "rowwise", "mxfp8"};
// MxForm's, in its order: the composite has E8M0 scales (XLA:GPU makes it a
// block-scaled GEMM, JAX >= 0.9.1); the dequantized form runs everywhere.
constexpr llvm::StringRef kMxFormNames[] = {"composite", "dequantize"};
// amp-numerics' collections, in Numerics' order.
constexpr llvm::StringRef kNumericsNames[] = {"none", "stats",
                                              "provenance"};
constexpr llvm::StringRef kGemmStatsCounts[] = {"nonzero", "underflow",
                                                "saturated"};
constexpr Roofline kRooflines[] = {
    {"h100", "H100 SXM", 989.4e12, 1978.9e12, 494.7e12, 66.9e12, 3.352e12,
     450e9},
    {"b200", "B200", 2250e12, 4500e12, 1100e12, 40e12, 8.0e12, 900e9},
};

/// The position of `text` among `names`, or an error naming them all.
llvm::Expected<size_t> closedChoice(llvm::StringRef text,
                                    llvm::ArrayRef<llvm::StringRef> names,
                                    llvm::StringRef what) {
  for (auto [index, name] : llvm::enumerate(names))
    if (text.trim() == name)
      return index;
  return llvm::createStringError("unknown " + what + " '" + text +
                                 "' (accepted: " + llvm::join(names, ", ") +
                                 ")");
}

/// The enumerator at `text`'s position among `names`.
template <typename Enum>
llvm::Expected<Enum> closedEnum(llvm::StringRef text,
                                llvm::ArrayRef<llvm::StringRef> names,
                                llvm::StringRef what) {
  llvm::Expected<size_t> index = closedChoice(text, names, what);
  if (!index)
    return index.takeError();
  return static_cast<Enum>(*index);
}
} // namespace

llvm::ArrayRef<llvm::StringRef> mlir::amp::updateRoundingNames() {
  return kUpdateRoundingNames;
}

llvm::Expected<Fp8Scaling> mlir::amp::parseFp8Scaling(llvm::StringRef text) {
  return closedEnum<Fp8Scaling>(text, kFp8ScalingNames, "fp8_scaling");
}
llvm::Expected<MxForm> mlir::amp::parseMxForm(llvm::StringRef text) {
  return closedEnum<MxForm>(text, kMxFormNames, "value");
}

llvm::ArrayRef<llvm::StringRef> mlir::amp::numericsNames() {
  return kNumericsNames;
}
llvm::Expected<Numerics> mlir::amp::parseNumerics(llvm::StringRef text) {
  return closedEnum<Numerics>(text, kNumericsNames, "numerics");
}
llvm::ArrayRef<llvm::StringRef> mlir::amp::gemmStatsCounts() {
  return kGemmStatsCounts;
}

int64_t Roofline::minSize() const {
  return static_cast<int64_t>(
      std::ceil(kQuantizeBytesPerElement * bf16Flops / bytesPerSecond));
}
llvm::ArrayRef<Roofline> mlir::amp::rooflines() { return kRooflines; }
int64_t mlir::amp::defaultFp8MinSize(Target target) {
  return target == Target::Gpu ? kRooflines[0].minSize() : 0;
}

llvm::Expected<UpdateRounding>
mlir::amp::parseUpdateRounding(llvm::StringRef text) {
  return closedEnum<UpdateRounding>(text, kUpdateRoundingNames,
                                    "update rounding");
}

llvm::Expected<llvm::SmallVector<std::pair<unsigned, unsigned>>>
mlir::amp::parseStateResults(llvm::ArrayRef<std::string> pairs) {
  llvm::SmallVector<std::pair<unsigned, unsigned>> parsed;
  for (const std::string &pair : pairs) {
    auto [result, arg] = llvm::StringRef(pair).split(':');
    unsigned resultIndex, argIndex;
    if (result.trim().getAsInteger(10, resultIndex) ||
        arg.trim().getAsInteger(10, argIndex))
      return llvm::createStringError("invalid option 'state-results': '" +
                                     pair + "' is not RESULT:ARG");
    parsed.push_back({resultIndex, argIndex});
  }
  return parsed;
}

size_t OptimizerStateBlocks::keptDimensions(llvm::ArrayRef<int64_t> shape) {
  // The trailing product grows as k falls: the first k from the back whose
  // trailing dimensions hold whole blocks keeps the most leading ones.
  int64_t trailing = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    trailing *= shape[k];
    if (trailing % kBlock == 0)
      return k;
  }
  return 0;
}

llvm::SmallVector<int64_t>
OptimizerStateBlocks::storedShape(llvm::ArrayRef<int64_t> shape) {
  size_t kept = keptDimensions(shape);
  int64_t trailing = 1;
  for (int64_t size : shape.drop_front(kept))
    trailing *= size;
  llvm::SmallVector<int64_t> stored(shape.take_front(kept));
  stored.push_back((trailing + kBlock - 1) / kBlock);
  stored.push_back(kBlock + kScaleBytes);
  return stored;
}

llvm::ArrayRef<llvm::StringRef> mlir::amp::optimizerStateDtypeNames() {
  return kOptimizerStateDtypeNames;
}

llvm::Expected<OptimizerStateDtype>
mlir::amp::parseOptimizerStateDtype(llvm::StringRef text) {
  return closedEnum<OptimizerStateDtype>(text, kOptimizerStateDtypeNames,
                                         "optimizer-state dtype");
}

//===----------------------------------------------------------------------===//
// Entry-point options
//===----------------------------------------------------------------------===//

namespace {
/// The canonical spelling of a closed choice on a target, or the parser's
/// error naming the accepted values.
using Canonicalizer = llvm::Expected<std::string> (*)(llvm::StringRef value,
                                                      Target target);

template <typename T, typename Name>
llvm::Expected<std::string> canonical(llvm::Expected<T> parsed, Name name) {
  if (!parsed)
    return parsed.takeError();
  return name(*parsed).str();
}

llvm::Expected<std::string> canonicalLevel(llvm::StringRef value,
                                           Target target) {
  return canonical(parseLevel(value, target), levelName);
}
llvm::Expected<std::string> canonicalTarget(llvm::StringRef value, Target) {
  return canonical(parseTarget(value), targetName);
}
/// Empty stays empty: the pass's default follows the compute dtype too,
/// which only the pass sees (defaultDotResult).
llvm::Expected<std::string> canonicalDotResult(llvm::StringRef value, Target) {
  if (value.trim().empty())
    return std::string();
  return canonical(parseDotResult(value), dotResultName);
}
llvm::Expected<std::string> canonicalDecisions(llvm::StringRef value, Target) {
  return canonical(parseDecisions(value), decisionsName);
}
llvm::Expected<std::string> canonicalRematerializeFor(llvm::StringRef value,
                                                      Target) {
  return canonical(parseRematerializeFor(value), rematerializeForName);
}
llvm::Expected<std::string> canonicalReduceDtype(llvm::StringRef value,
                                                 Target) {
  return canonicalReduceDtypeName(value);
}
llvm::Expected<std::string> canonicalStorage(llvm::StringRef value,
                                             Target target) {
  return canonical(parseStorage(value, target), storageName);
}
llvm::Expected<std::string> canonicalFp8Scaling(llvm::StringRef value,
                                                Target) {
  llvm::Expected<size_t> index =
      closedChoice(value, kFp8ScalingNames, "fp8_scaling");
  if (!index)
    return index.takeError();
  return kFp8ScalingNames[*index].str();
}
llvm::Expected<std::string> canonicalNumerics(llvm::StringRef value, Target) {
  return canonical(parseNumerics(value), [](Numerics numerics) {
    return kNumericsNames[static_cast<int>(numerics)];
  });
}
llvm::json::Value fp8MinSizeDefault(Target target) {
  return defaultFp8MinSize(target);
}
llvm::Expected<std::string> canonicalUpdateRounding(llvm::StringRef value,
                                                    Target) {
  return canonical(parseUpdateRounding(value), [](UpdateRounding rounding) {
    return kUpdateRoundingNames[static_cast<int>(rounding)];
  });
}
llvm::Expected<std::string> canonicalOptimizerStateDtype(llvm::StringRef value,
                                                         Target) {
  return canonical(parseOptimizerStateDtype(value),
                   [](OptimizerStateDtype dtype) {
                     return kOptimizerStateDtypeNames[static_cast<int>(dtype)];
                   });
}

llvm::json::Value levelDefault(Target target) {
  return levelName(defaultLevel(target));
}
llvm::json::Value storageDefault(Target target) {
  return storageName(defaultStorage(target));
}
llvm::json::Value rematerializeDefault(Target target) {
  return defaultRematerialize(target);
}

/// An option the entry points take, under its Python name (amp-opt: the
/// same with dashes). Adding a pass option to the entry points is one row:
/// its name, pass, pass option and kind (or passSwitch), then by name what
/// differs from the defaults.
struct EntryOption {
  EntryOption(llvm::StringRef name, llvm::StringRef pass,
              llvm::StringRef option, OptionKind kind)
      : name(name), pass(pass), option(option), kind(kind) {}

  llvm::StringRef name;
  llvm::StringRef pass;
  /// The pass option it sets; empty: it switches the pass on or off.
  llvm::StringRef option;
  OptionKind kind = OptionKind::Bool;
  /// It configures state only amp.train_step carries (the amax histories),
  /// or the training step itself (its finite checks).
  bool stateful = false;
  /// stablehlo-amp sets it (calibration's groups); users do not.
  bool internal = false;
  bool isTarget = false;
  Canonicalizer canonicalize = nullptr;                   // Choice
  llvm::json::Value (*targetDefault)(Target) = nullptr;   // per-target default
  int64_t minimum = 0;                                    // Int, Ints
  llvm::StringRef switchHelp = "";                        // a pass switch
  /// The default of a training step that stores its parameters in bf16
  /// (p=bf16), where it differs from the pass's; empty: the pass's.
  llvm::StringRef bf16ParamsDefault = "";
  /// The one value that configures state only amp.train_step carries
  /// (fp8_scaling=delayed); the option's other values are accepted
  /// everywhere.
  llvm::StringRef statefulValue = "";
  /// The values that make the program return measurements beside its own
  /// results (numerics=stats, provenance): amp-opt appends them to main's
  /// results, amp.train_step puts them in its metrics, amp.value_and_grad
  /// and amp.transform return them as one more element.
  llvm::ArrayRef<llvm::StringRef> measuredValues = {};
  /// Another pass that takes the same option under the same spelling
  /// (scopes: amp-fp8-gemms reads the "f8" entries); empty: none.
  llvm::StringRef alsoPass = "";

  /// A closed choice: its canonical spelling.
  EntryOption &&canonicalizedBy(Canonicalizer canonical) && {
    canonicalize = canonical;
    return std::move(*this);
  }
  EntryOption &&atLeast(int64_t least) && {
    minimum = least;
    return std::move(*this);
  }
  EntryOption &&keepsState() && {
    stateful = true;
    return std::move(*this);
  }
  EntryOption &&internalOnly() && {
    internal = true;
    return std::move(*this);
  }
  EntryOption &&namesTheTarget() && {
    isTarget = true;
    return std::move(*this);
  }
  EntryOption &&withTargetDefaults(llvm::json::Value (*defaults)(Target)) && {
    targetDefault = defaults;
    return std::move(*this);
  }
  EntryOption &&withBf16ParamsDefault(llvm::StringRef value) && {
    bf16ParamsDefault = value;
    return std::move(*this);
  }
  EntryOption &&withStatefulValue(llvm::StringRef value) && {
    statefulValue = value;
    return std::move(*this);
  }
  EntryOption &&withMeasuredValues(llvm::ArrayRef<llvm::StringRef> values) && {
    measuredValues = values;
    return std::move(*this);
  }
  EntryOption &&alsoFor(llvm::StringRef pass) && {
    alsoPass = pass;
    return std::move(*this);
  }
};

/// Switches `pass` on or off (on by default); `help` says what it does.
EntryOption passSwitch(llvm::StringRef name, llvm::StringRef pass,
                       llvm::StringRef help) {
  EntryOption entry(name, pass, /*option=*/"", OptionKind::Bool);
  entry.switchHelp = help;
  return entry;
}

constexpr llvm::StringLiteral kInsertConverts = "amp-insert-converts";
constexpr llvm::StringLiteral kFp8Gemms = "amp-fp8-gemms";
constexpr llvm::StringLiteral kRoundState = "amp-round-state";

const EntryOption kEntryOptions[] = {
    EntryOption("level", kInsertConverts, "level", OptionKind::Choice)
        .canonicalizedBy(canonicalLevel)
        .withTargetDefaults(levelDefault),
    EntryOption("target", kInsertConverts, "target", OptionKind::Choice)
        .canonicalizedBy(canonicalTarget)
        .namesTheTarget(),
    EntryOption("dot_result", kInsertConverts, "dot-result",
                OptionKind::Choice)
        .canonicalizedBy(canonicalDotResult),
    EntryOption("storage", kInsertConverts, "storage", OptionKind::Choice)
        .canonicalizedBy(canonicalStorage)
        .withTargetDefaults(storageDefault),
    EntryOption("keep_f32", kInsertConverts, "keep-f32", OptionKind::OpNames),
    EntryOption("force_compute", kInsertConverts, "force-compute",
                OptionKind::OpNames),
    EntryOption("scopes", kInsertConverts, "scopes", OptionKind::Scopes)
        .alsoFor(kFp8Gemms),
    EntryOption("keep_groups", kInsertConverts, "keep-groups",
                OptionKind::Ints)
        .internalOnly(),
    EntryOption("storage_min_elements", kInsertConverts,
                "storage-min-elements", OptionKind::Int)
        .atLeast(1),
    EntryOption("strict", kInsertConverts, "strict", OptionKind::Bool),
    EntryOption("decisions", kInsertConverts, "decisions", OptionKind::Choice)
        .canonicalizedBy(canonicalDecisions),
    EntryOption("reduce_dtype", kInsertConverts, "reduce-dtype",
                OptionKind::Choice)
        .canonicalizedBy(canonicalReduceDtype),
    passSwitch("rematerialize", "amp-rematerialize",
               "On a training step, recompute cheap elementwise residuals in "
               "the backward pass instead of keeping them")
        .withTargetDefaults(rematerializeDefault),
    EntryOption("rematerialize_for", "amp-rematerialize", "for",
                OptionKind::Choice)
        .canonicalizedBy(canonicalRematerializeFor),
    // Delayed scaling keeps state; the others are accepted everywhere.
    EntryOption("fp8_scaling", kFp8Gemms, "scaling", OptionKind::Choice)
        .canonicalizedBy(canonicalFp8Scaling)
        .withStatefulValue("delayed"),
    EntryOption("fp8_min_size", kFp8Gemms, "min-size", OptionKind::Int)
        .atLeast(0)
        .withTargetDefaults(fp8MinSizeDefault),
    EntryOption("keep_gemms", kFp8Gemms, "keep-gemms", OptionKind::Ints),
    EntryOption("amax_history", kFp8Gemms, "amax-history", OptionKind::Int)
        .atLeast(1)
        .keepsState(),
    // bf16 parameters are rounded stochastically unless asked otherwise: the
    // measured best of the three for the state it keeps
    // (docs/low-precision-state.md).
    // The pass's own default stays nearest: it appends an argument only
    // when asked.
    EntryOption("update_rounding", kRoundState, "rounding", OptionKind::Choice)
        .canonicalizedBy(canonicalUpdateRounding)
        .keepsState()
        .withBf16ParamsDefault("stochastic"),
    EntryOption("opt_state_dtype", kRoundState, "optimizer-state",
                OptionKind::Choice)
        .canonicalizedBy(canonicalOptimizerStateDtype)
        .keepsState(),
    // Without a loss scale only the metric reads the check: off by default,
    // where it costs a kernel per gradient (docs/DESIGN.md).
    EntryOption("check_grads", "amp-loss-scale", "check-grads",
                OptionKind::Bool)
        .keepsState(),
    EntryOption("skip_nonfinite", "amp-loss-scale", "check-state",
                OptionKind::Bool)
        .keepsState(),
    EntryOption("numerics", "amp-numerics", "collect", OptionKind::Choice)
        .canonicalizedBy(canonicalNumerics)
        .withMeasuredValues(llvm::ArrayRef(kNumericsNames).drop_front()),
};

llvm::StringRef kindName(OptionKind kind) {
  switch (kind) {
  case OptionKind::Choice:
    return "choice";
  case OptionKind::OpNames:
    return "op_names";
  case OptionKind::Bool:
    return "bool";
  case OptionKind::Int:
    return "int";
  case OptionKind::Ints:
    return "ints";
  case OptionKind::Scopes:
    return "scopes";
  }
  llvm_unreachable("unknown option kind");
}
} // namespace

llvm::Expected<std::string>
mlir::amp::canonicalOptionValue(llvm::StringRef name, llvm::StringRef value,
                                llvm::StringRef target) {
  Target parsedTarget;
  if (llvm::Error error = parseTarget(target).moveInto(parsedTarget))
    return std::move(error);
  std::string closed;
  for (const EntryOption &entry : kEntryOptions) {
    if (entry.name != name)
      continue;
    if (!entry.canonicalize)
      return llvm::createStringError("option '" + name +
                                     "' is not a closed choice");
    return entry.canonicalize(value, parsedTarget);
  }
  for (const EntryOption &entry : kEntryOptions)
    if (entry.canonicalize)
      closed += (closed.empty() ? "" : ", ") + entry.name.str();
  return llvm::createStringError("no closed-choice option '" + name +
                                 "' (options: " + closed + ")");
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

llvm::json::Object insertConvertsJson() {
  AmpInsertConvertsPassOptions convert;
  llvm::json::Object storageDefaults, levelDefaults;
  for (llvm::StringRef name : targetNames()) {
    Target target = llvm::cantFail(parseTarget(name));
    storageDefaults[name] = storageName(defaultStorage(target));
    levelDefaults[name] = levelName(defaultLevel(target));
  }
  llvm::json::Object options{
      {"policy", option(convert.policy)},
      {"level", option(convert.level, levelNames())},
      {"target", option(convert.target, targetNames())},
      {"dot-result", option(convert.dotResult, dotResultNames())},
      {"storage", option(convert.storage, storageNames())},
      {"keep-f32", option(llvm::json::Array())},
      {"force-compute", option(llvm::json::Array())},
      {"scopes", option(llvm::json::Array(), scopeChoiceNames())},
      {"keep-groups", option(llvm::json::Array())},
      {"storage-min-elements", option(convert.storageMinElements)},
      {"strict", option(convert.strict)},
      {"reduce-dtype", option(convert.reduceDtype, reduceDtypeNames())},
      {"decisions", option(convert.decisions, decisionsNames())},
      {"report", option(convert.report)},
  };
  return llvm::json::Object{{"options", std::move(options)},
                            {"storage_defaults", std::move(storageDefaults)},
                            {"level_defaults", std::move(levelDefaults)}};
}

llvm::json::Object fp8GemmsJson() {
  AmpFp8GemmsPassOptions fp8;
  llvm::json::Object options{
      {"gemm", option(fp8.gemm, fp8GemmNames())},
      {"scaling", option(fp8.scaling, kFp8ScalingNames)},
      {"amax-history", option(fp8.amaxHistory)},
      {"min-size", option(fp8.minSize)},
      {"keep-gemms", option(llvm::json::Array())},
      {"scopes", option(llvm::json::Array(), scopeChoiceNames())},
      {"mx-form", option(fp8.mxForm, kMxFormNames)},
      {"report", option(fp8.report)},
  };
  return llvm::json::Object{{"options", std::move(options)}};
}

llvm::json::Object rematerializeJson() {
  AmpRematerializePassOptions remat;
  llvm::json::Object targetDefaults;
  for (llvm::StringRef name : targetNames())
    targetDefaults[name] =
        defaultRematerialize(llvm::cantFail(parseTarget(name)));
  llvm::json::Object options{
      {"for", option(remat.goal, rematerializeForNames())},
      {"min-elements", option(remat.minElements)},
      {"max-ops", option(remat.maxOps)},
  };
  return llvm::json::Object{{"options", std::move(options)},
                            {"target_defaults", std::move(targetDefaults)}};
}

llvm::json::Object roundStateJson() {
  AmpRoundStatePassOptions roundState;
  llvm::json::Object options{
      {"rounding", option(roundState.rounding, updateRoundingNames())},
      {"optimizer-state",
       option(roundState.optimizerState, optimizerStateDtypeNames())},
      {"state-results", option(llvm::json::Array())},
      {"optimizer-state-args", option(llvm::json::Array())},
  };
  return llvm::json::Object{{"options", std::move(options)}};
}

llvm::json::Object lossScaleOptionsJson() {
  AmpLossScalePassOptions scale;
  llvm::json::Object options{
      {"mode", option(scale.mode, lossScaleModeNames())},
      {"seed-arg", option(scale.seedArg)},
      {"gradient-results", option(llvm::json::Array())},
      {"state-results", option(llvm::json::Array())},
      {"growth-interval", option(scale.growthInterval)},
      {"growth-factor", option(scale.growthFactor)},
      {"backoff-factor", option(scale.backoffFactor)},
      {"min-scale", option(scale.minScale)},
      {"max-scale", option(scale.maxScale)},
      {"check-grads", option(scale.checkGrads)},
      {"check-state", option(scale.checkState)},
  };
  return llvm::json::Object{{"options", std::move(options)}};
}

llvm::json::Object numericsJson() {
  AmpNumericsPassOptions numerics;
  llvm::json::Object options{
      {"collect", option(numerics.collect, kNumericsNames)},
  };
  return llvm::json::Object{{"options", std::move(options)}};
}

/// Each pass's options (their defaults and choices), by pass name.
llvm::json::Object passesJson() {
  return llvm::json::Object{
      {"amp-insert-converts", insertConvertsJson()},
      {"amp-fp8-gemms", fp8GemmsJson()},
      {"amp-rematerialize", rematerializeJson()},
      {"amp-round-state", roundStateJson()},
      {"amp-loss-scale", lossScaleOptionsJson()},
      {"amp-numerics", numericsJson()},
      {"amp-simplify-converts",
       llvm::json::Object{{"options", llvm::json::Object{}}}},
  };
}

/// The entry-point options, in the order amp-opt lists them; each reads
/// its default and choices from the pass option it sets (its help is that
/// option's description in Passes.td, in the passes.md built from it).
llvm::json::Array entryOptionsJson(const llvm::json::Object &passes) {
  llvm::json::Array array;
  for (const EntryOption &entry : kEntryOptions) {
    llvm::json::Object object{{"name", entry.name},
                              {"pass", entry.pass},
                              {"option", entry.option},
                              {"kind", kindName(entry.kind)},
                              {"stateful", entry.stateful},
                              {"internal", entry.internal},
                              {"target", entry.isTarget}};
    if (entry.kind == OptionKind::Int || entry.kind == OptionKind::Ints)
      object["minimum"] = entry.minimum;
    if (entry.option.empty()) {
      object["default"] = true;
      object["help"] = entry.switchHelp;
    } else {
      const llvm::json::Object *passOption =
          passes.getObject(entry.pass)->getObject("options")->getObject(
              entry.option);
      for (llvm::StringRef key : {"default", "choices"})
        if (const llvm::json::Value *value = passOption->get(key))
          object[key] = *value;
    }
    if (!entry.bf16ParamsDefault.empty())
      object["bf16_params_default"] = entry.bf16ParamsDefault;
    if (!entry.statefulValue.empty())
      object["stateful_value"] = entry.statefulValue;
    if (!entry.measuredValues.empty())
      object["measured_values"] = strings(entry.measuredValues);
    if (!entry.alsoPass.empty())
      object["also_pass"] = entry.alsoPass;
    if (entry.targetDefault) {
      llvm::json::Object defaults;
      for (llvm::StringRef name : targetNames())
        defaults[name] = entry.targetDefault(llvm::cantFail(parseTarget(name)));
      object["target_defaults"] = std::move(defaults);
    }
    array.push_back(std::move(object));
  }
  return array;
}

llvm::json::Object lossScaleJson() {
  LossScaleConfig defaults;
  llvm::json::Object layouts;
  for (auto [name, mode] : llvm::zip(kModeNames, kModes)) {
    LossScaleLayout layout = lossScaleLayout(mode);
    layouts[name] = llvm::json::Object{{"arguments", strings(layout.arguments)},
                                       {"results", strings(layout.results)}};
  }
  // An array: the order is LossScaleConfig's (for reprs and messages).
  llvm::json::Array fields;
  for (const LossScaleField &field : kLossScaleFields)
    fields.push_back(llvm::json::Object{
        {"name", field.name},
        {"option", field.option},
        {"type", field.integer ? "int" : "float"},
        {"default", field.integer ? llvm::json::Value(defaults.*field.integer)
                                  : llvm::json::Value(defaults.*field.real)}});
  return llvm::json::Object{{"initial_scale", kInitialLossScale},
                            {"fields", std::move(fields)},
                            {"layouts", std::move(layouts)}};
}

/// The state roles, by attribute (what `_appended_roles` reads off main).
llvm::json::Object stateRolesJson() {
  llvm::json::Object roles;
  for (const StateRole &role : stateRoles())
    roles[role.attribute] = llvm::json::Object{
        {"field", role.field},
        {"pass", role.pass},
        {"per_parameter", role.perParameter},
        {"kept_on_skip", role.keptOnSkip}};
  return roles;
}

/// The measurements, by attribute: results a step returns and nothing gives
/// back (amp.train_step's metrics).
llvm::json::Object measurementsJson() {
  llvm::json::Object measured;
  for (const Measurement &measurement : measurements())
    measured[measurement.attribute] =
        llvm::json::Object{{"pass", measurement.pass}};
  return measured;
}

/// The keys of the decision dictionary, by role (what Python calls them).
llvm::json::Object decisionKeysJson() {
  return llvm::json::Object{{"precision", decision_key::kPrecision},
                            {"reason", decision_key::kReason},
                            {"detail", decision_key::kDetail},
                            {"group", decision_key::kGroup},
                            {"stored", decision_key::kStored},
                            {"gemm", decision_key::kGemm},
                            {"fp8", decision_key::kFp8},
                            {"gemm_index", decision_key::kGemmIndex},
                            {"gemm_reason", decision_key::kGemmReason},
                            {"gemm_detail", decision_key::kGemmDetail},
                            {"gemm_stats", decision_key::kGemmStats},
                            {"gemm_stats_formats",
                             decision_key::kGemmStatsFormats}};
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
          {"fp8_reasons", std::move(fp8Reasons)},
          {"keys", decisionKeysJson()}};
}

/// The targets' rooflines: what the bench's estimate prices kernels with,
/// and the effective size M*N/(M+N) FP8's filter asks of a GEMM.
llvm::json::Array rooflinesJson() {
  llvm::json::Array table;
  for (const Roofline &roofline : rooflines())
    table.push_back(llvm::json::Object{
        {"name", roofline.name},
        {"device", roofline.device},
        {"matrix_flops", llvm::json::Object{{"bf16", roofline.bf16Flops},
                                            {"f8", roofline.fp8Flops},
                                            {"f32", roofline.tf32Flops},
                                            {"f64", roofline.f64Flops}}},
        {"bytes_per_second", roofline.bytesPerSecond},
        {"hbm_efficiency", kHbmEfficiency},
        {"interconnect_bytes_per_second",
         roofline.interconnectBytesPerSecond},
        {"interconnect_efficiency", kInterconnectEfficiency},
        {"launch_seconds", kKernelLaunchSeconds},
        {"quantize_bytes_per_element", kQuantizeBytesPerElement},
        {"min_size", roofline.minSize()}});
  return table;
}

llvm::json::Object reportJson() {
  llvm::json::Object opKeys{{"op", report_key::kOp}, {"loc", report_key::kLoc}};
  for (auto &entry : decisionKeysJson())
    opKeys[entry.first] = entry.second;
  return llvm::json::Object{
      {"keys", llvm::json::Object{
                   {"ops", report_key::kOps},
                   {"converts_inserted", report_key::kConvertsInserted},
                   {"converts_total", report_key::kConvertsTotal},
                   {"bytes_before", report_key::kBytesBefore},
                   {"bytes_after", report_key::kBytesAfter},
                   {"nonfinite_regions", report_key::kNonFiniteRegions}}},
      {"op_keys", std::move(opKeys)},
      {"region_keys", llvm::json::Object{
                          {"loc", region_key::kLoc},
                          {"primitives", region_key::kPrimitives},
                          {"format", region_key::kFormat},
                          {"inputs", region_key::kInputs},
                          {"values", region_key::kValues}}}};
}

/// The attribute names the passes and the front ends share.
llvm::json::Object attributesJson() {
  return llvm::json::Object{
      {"keep_dtype", attr::kKeepDtype},
      {"loss_seed", attr::kLossSeed},
      {"gradient", attr::kGradient},
      {"state_of", attr::kStateOf},
      {"gradients_call", attr::kGradientsCall},
      {"loss_scale", attr::kLossScale},
      {"loss_scale_counter", attr::kLossScaleCounter},
      {"grads_finite", attr::kGradsFinite},
      {"state_finite", attr::kStateFinite},
      {"gemm_amax", attr::kGemmAmax},
      {"gemm_counts", attr::kGemmCounts},
      {"nonfinite", attr::kNonFinite},
      {"nonfinite_regions", attr::kNonFiniteRegions},
      {"rounding_key", attr::kRoundingKey},
      {"compensation", attr::kCompensation},
      {"optimizer_state", attr::kOptimizerState},
      {"decision", attr::kDecision},
      {"cotangent", attr::kCotangent},
      {"amax_history", attr::kAmaxHistory},
      {"inserted", attr::kInserted},
      {"stored_marker", attr::kStoredMarker},
      {"fp8_marker", attr::kFp8Marker},
      {"scaled_dot_composite", attr::kScaledDotComposite},
      {"num_partitions", attr::kNumPartitions},
      {"partition_dependent", attr::kPartitionDependent},
  };
}
} // namespace

std::string mlir::amp::contractJson() {
  llvm::json::Object passes = passesJson();
  llvm::json::Array entryOptions = entryOptionsJson(passes);
  llvm::json::Object contract{
      {"policy", policyJson()},
      {"passes", std::move(passes)},
      {"options", std::move(entryOptions)},
      {"attributes", attributesJson()},
      {"loss_scale", lossScaleJson()},
      {"state_roles", stateRolesJson()},
      {"measurements", measurementsJson()},
      // How optimizer-state=f8 lays out a tensor (a front end makes the
      // first state in it).
      {"optimizer_state_f8",
       llvm::json::Object{
           {"block", OptimizerStateBlocks::kBlock},
           {"scale_bytes", OptimizerStateBlocks::kScaleBytes},
           {"max", OptimizerStateBlocks::kMax},
           {"smallest", OptimizerStateBlocks::kSmallest}}},
      {"decisions", decisionsJson()},
      {"rooflines", rooflinesJson()},
      {"mx_block", kMxBlock},
      {"gemm_stats_counts", strings(gemmStatsCounts())},
      {"report", reportJson()},
      {"op_names", strings(shlo::knownOpNames())},
      // How an op's scope path is read from its name (Scopes.h).
      {"scope_path",
       llvm::json::Object{{"wrappers", strings(scopeWrapperNames())},
                          {"driver_names", strings(scopeDriverNames())}}},
      {"linear_algebra_calls", strings(linearAlgebraCallPrefixes())},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(contract));
  return text;
}
