//===- Contract.h - What the passes and their front ends agree on ---------===//
//
// Everything the C++ passes and the Python package must agree on lives here
// and only here: amp's own attribute names (markers the front ends set, the
// ones the passes add), the report's keys, the loss-scale configuration
// (its fields by name, defaults, validation, and the arguments and results
// the pass appends, in order), and the decision kinds and reasons of the
// report. The extension exports all of it,
// together with the policy vocabulary of Policy.h and the pass options, as
// one JSON document (`contractJson`) that Python reads instead of copying.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_CONTRACT_H
#define STABLEHLO_AMP_CONTRACT_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>
#include <utility>

namespace mlir::amp {

//===----------------------------------------------------------------------===//
// amp's attributes
//===----------------------------------------------------------------------===//

namespace attr {
/// Argument attribute: this f32 argument of a public function is not a
/// parameter and keeps its dtype. Consumed by amp-insert-converts.
inline constexpr llvm::StringLiteral kKeepDtype = "amp.keep_dtype";
/// Argument attribute: the loss cotangent seed. Consumed by amp-loss-scale.
inline constexpr llvm::StringLiteral kLossSeed = "amp.loss_seed";
/// Argument attribute: a cotangent input (of a derived vjp program): values
/// derived from it are gradients, for amp-fp8-gemms's e5m2 choice.
inline constexpr llvm::StringLiteral kCotangent = "amp.cotangent";
/// Argument and result attribute amp-fp8-gemms puts on the amax history of
/// one FP8 operand (delayed scaling): f32[N], newest first.
inline constexpr llvm::StringLiteral kAmaxHistory = "amp.amax_history";
/// Result attribute: this result is a gradient. Consumed by amp-loss-scale.
inline constexpr llvm::StringLiteral kGradient = "amp.gradient";
/// Result attribute `amp.state_of = N`: this result is the new value of
/// argument N (kept only on finite steps). Consumed by amp-loss-scale, and
/// read by amp-insert-converts, which gives such a result its argument's
/// dtype.
inline constexpr llvm::StringLiteral kStateOf = "amp.state_of";
/// The custom call a front end wraps gradients in so amp-loss-scale finds
/// them anywhere in a step; the pass removes it.
inline constexpr llvm::StringLiteral kGradientsCall = "stablehlo_amp.gradients";
/// Argument and result attributes amp-loss-scale puts on what it appends.
inline constexpr llvm::StringLiteral kLossScale = "amp.loss_scale";
inline constexpr llvm::StringLiteral kLossScaleCounter =
    "amp.loss_scale_counter";
inline constexpr llvm::StringLiteral kGradsFinite = "amp.grads_finite";
/// Result attribute amp-loss-scale puts on what it appends with
/// `check-state=true`: every float value of the new state is finite (i1).
inline constexpr llvm::StringLiteral kStateFinite = "amp.state_finite";
/// Results amp-numerics appends with `collect=stats`: per measured GEMM and
/// operand, the amax (f32[G, 2]) and the counts of `gemmStatsCounts()`
/// (i32[G, 2, 3]).
inline constexpr llvm::StringLiteral kGemmAmax = "amp.gemm_amax";
inline constexpr llvm::StringLiteral kGemmCounts = "amp.gemm_counts";
/// Result amp-numerics appends with `collect=provenance`: per region of the
/// step, whether it handed on a NaN (row 0) or an infinity (row 1), as bits
/// (i32[2, words]); and the attribute of main that lists the regions (the
/// report's `nonfinite_regions`).
inline constexpr llvm::StringLiteral kNonFinite = "amp.nonfinite";
inline constexpr llvm::StringLiteral kNonFiniteRegions =
    "amp.nonfinite_regions";
/// Argument and result attribute amp-round-state puts on the random-bit
/// state it appends (ui32[4]; the result is the next state).
inline constexpr llvm::StringLiteral kRoundingKey = "amp.rounding_key";
/// Argument and result attribute `amp.compensation = N` amp-round-state
/// puts on the Kahan compensation buffer of argument N (a bf16 parameter)
/// it appends; the result is the buffer's next value.
inline constexpr llvm::StringLiteral kCompensation = "amp.compensation";
/// Argument attribute: this f32 argument is optimizer state that
/// amp-round-state may store in a lower precision (with its new value, the
/// result marked amp.state_of it). Consumed by amp-round-state.
inline constexpr llvm::StringLiteral kOptimizerState = "amp.optimizer_state";
/// With `report=true`: the decision taken for an op (a dictionary keyed by
/// the decision_key:: keys below), and a unit attribute on each convert the
/// pass inserted. Read and removed by the extension's report.
inline constexpr llvm::StringLiteral kDecision = "amp.decision";
inline constexpr llvm::StringLiteral kInserted = "amp.inserted";
/// XLA frontend attributes naming the rounding convert of the N-th value
/// stored low, and the N-th FP8 dot (program order), so the compiled
/// program can be checked for them (`mhlo.frontend_attributes`).
inline constexpr llvm::StringLiteral kStoredMarker = "amp_stored";
inline constexpr llvm::StringLiteral kFp8Marker = "amp_fp8";
/// The composite amp-fp8-gemms writes an MXFP8 GEMM as (`mx-form=composite`,
/// what `jax.lax.scaled_dot` emits), also the name of the private function
/// that decomposes it. XLA cannot partition it: the driver rebuilds a
/// program holding one for a partitioned lowering.
inline constexpr llvm::StringLiteral kScaledDotComposite = "xla.scaled_dot";
/// Module attribute JAX writes for a sharded jit: how many partitions XLA's
/// SPMD partitioner splits the program into (the driver writes it on the
/// copy it rebuilds for a partitioned lowering).
inline constexpr llvm::StringLiteral kNumPartitions = "mhlo.num_partitions";
/// Unit attribute amp-insert-converts writes on a module it rewrote without
/// `mhlo.num_partitions` where a decision depends on the partition count
/// (reason `partitioned_norm_term`): the driver rewrites it again for a
/// partitioned lowering.
inline constexpr llvm::StringLiteral kPartitionDependent =
    "amp.partition_dependent";
} // namespace attr

//===----------------------------------------------------------------------===//
// The report's schema
//===----------------------------------------------------------------------===//

/// Keys of the attr::kDecision dictionary on a decided op. The report copies
/// each into the op's record under the same key, so they are also keys of
/// every entry of report_key::kOps.
namespace decision_key {
// Written by amp-insert-converts.
inline constexpr llvm::StringLiteral kPrecision = "precision"; ///< precisionId
inline constexpr llvm::StringLiteral kReason = "reason";       ///< reasonId
/// Text that qualifies the reason ("sum reduction", "variadic reduction").
inline constexpr llvm::StringLiteral kDetail = "detail";
/// Calibration group: a lowered matrix multiply and the ops painted with it.
inline constexpr llvm::StringLiteral kGroup = "group";
/// Index of the survival marker of the value stored in the compute dtype.
inline constexpr llvm::StringLiteral kStored = "stored";
// Written by amp-fp8-gemms.
/// The FP8 operand formats, or the text of why the dot is not FP8.
inline constexpr llvm::StringLiteral kGemm = "gemm";
/// Index of the FP8 dot's survival marker.
inline constexpr llvm::StringLiteral kFp8 = "fp8";
/// The dot's place among the module's low-precision dots, in program order
/// (whether FP8 or not): what `keep-gemms` names.
inline constexpr llvm::StringLiteral kGemmIndex = "gemm_index";
inline constexpr llvm::StringLiteral kGemmReason =
    "gemm_reason"; ///< fp8IneligibilityId
/// The dot's own detail of why it is not FP8 (its sizes), if any.
inline constexpr llvm::StringLiteral kGemmDetail = "gemm_detail";
// Written by amp-numerics.
/// The GEMM's row in the statistics results.
inline constexpr llvm::StringLiteral kGemmStats = "gemm_stats";
/// Per operand, the format it is rounded to at the GEMM ("f8e4m3fn",
/// "bf16"), or "" where it is computed in its own format.
inline constexpr llvm::StringLiteral kGemmStatsFormats = "gemm_stats_formats";
} // namespace decision_key

/// Keys of the report JSON (collectPrecisionReport).
namespace report_key {
/// One record per decided op: kOp, kLoc and the decision_key:: keys it has.
inline constexpr llvm::StringLiteral kOps = "ops";
inline constexpr llvm::StringLiteral kConvertsInserted = "converts_inserted";
inline constexpr llvm::StringLiteral kConvertsTotal = "converts_total";
/// Bytes of float values by dtype, before and after the rewrite.
inline constexpr llvm::StringLiteral kBytesBefore = "bytes_before";
inline constexpr llvm::StringLiteral kBytesAfter = "bytes_after";
/// numerics=provenance: the step's regions, in bit order (region_key::).
inline constexpr llvm::StringLiteral kNonFiniteRegions = "nonfinite_regions";
// Keys of a record, besides the decision_key:: keys.
inline constexpr llvm::StringLiteral kOp = "op";   ///< the op's name
inline constexpr llvm::StringLiteral kLoc = "loc"; ///< its location, printed
} // namespace report_key

/// Keys of a record of report_key::kNonFiniteRegions (and of main's
/// attr::kNonFiniteRegions): one region of the step, region 0 its inputs.
namespace region_key {
/// Its first op's location, printed ("" for the inputs).
inline constexpr llvm::StringLiteral kLoc = "loc";
/// The JAX primitives of its ops, in program order.
inline constexpr llvm::StringLiteral kPrimitives = "primitives";
/// The narrowest float type of the values it hands on ("f16").
inline constexpr llvm::StringLiteral kFormat = "format";
/// The regions it reads.
inline constexpr llvm::StringLiteral kInputs = "inputs";
/// How many values it hands on (each checked).
inline constexpr llvm::StringLiteral kValues = "values";
} // namespace region_key

//===----------------------------------------------------------------------===//
// Loss scaling
//===----------------------------------------------------------------------===//

enum class LossScaleMode { Dynamic, Static, None };
llvm::ArrayRef<llvm::StringRef> lossScaleModeNames();
llvm::Expected<LossScaleMode> parseLossScaleMode(llvm::StringRef text);
llvm::StringRef lossScaleModeName(LossScaleMode mode);

/// The dynamic loss-scale rule's configuration. The defaults are PyTorch
/// GradScaler's, with jmp's floor and a ceiling of 2**24.
struct LossScaleConfig {
  LossScaleMode mode = LossScaleMode::Dynamic;
  int64_t growthInterval = 2000;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  double minScale = 1.0;
  double maxScale = 16777216.0; // 2**24
};
/// The scale a front end starts from when none is given (2**15).
inline constexpr double kInitialLossScale = 32768.0;

/// A configurable field of LossScaleConfig, by name: `name` is the Python
/// keyword and the key front ends pass it under, `option` the amp-loss-scale
/// option. Exactly one of `integer` and `real` points at the field.
struct LossScaleField {
  llvm::StringLiteral name;
  llvm::StringLiteral option;
  int64_t LossScaleConfig::*integer;
  double LossScaleConfig::*real;
};
/// Every configurable field, in the order of LossScaleConfig.
llvm::ArrayRef<LossScaleField> lossScaleFields();

/// Checks a configuration; the error names the bad field (in the pass-option
/// spelling, or with `pythonNames` as the Python keyword) and what it must
/// be. The pass and the Python constructors both call this.
llvm::Error validateLossScale(const LossScaleConfig &config,
                              bool pythonNames = false);

/// The configuration of `mode` from fields given by name (LossScaleField's
/// `name`), validated. Every field must be given, once: an unknown or
/// missing name, or a fractional value for an integer field, is an error
/// that names it and lists the fields.
llvm::Expected<LossScaleConfig>
lossScaleConfigFromFields(LossScaleMode mode,
                          llvm::ArrayRef<std::pair<std::string, double>> fields);

/// What a loss-scale mode appends to `main`, in order: argument roles after
/// the existing arguments, result roles after the existing results. Roles
/// are the attribute names the pass sets on them (attr::kLossScale, ...).
struct LossScaleLayout {
  llvm::SmallVector<llvm::StringRef> arguments;
  llvm::SmallVector<llvm::StringRef> results;
};
/// A loss scale always checks the gradients; `mode=none` only when
/// `checksGradients` (check-grads or check-state).
LossScaleLayout lossScaleLayout(LossScaleMode mode,
                                bool checksGradients = true);

/// A value a pass appends to a training step's `main`, as an argument (its
/// value before the step) and a result (after it), marked with `attribute`:
/// the field of a front end's training state that gives the argument and
/// takes the result, whether there is one per parameter (the attribute's
/// value is then the parameter's argument), and whether a skipped step
/// (non-finite gradients) returns the old value. Result-only roles
/// (grads_finite) belong to the field that reads them.
struct StateRole {
  llvm::StringLiteral attribute;
  llvm::StringLiteral field;
  llvm::StringLiteral pass; ///< the pass that appends it
  bool perParameter;
  bool keptOnSkip;
};
/// Every role a pass appends, in no particular order.
llvm::ArrayRef<StateRole> stateRoles();
/// The role marked `attribute` (one of stateRoles()).
const StateRole &stateRole(llvm::StringRef attribute);

/// A value a pass appends to `main` as a result only, marked with
/// `attribute`: a measurement of the step (amp.train_step's metrics), which
/// nothing gives back. Not state.
struct Measurement {
  llvm::StringLiteral attribute;
  llvm::StringLiteral pass; ///< the pass that appends it
};
/// Every measurement a pass appends, in no particular order.
llvm::ArrayRef<Measurement> measurements();

//===----------------------------------------------------------------------===//
// Decisions
//===----------------------------------------------------------------------===//

/// What happened to an op's float values.
enum class Precision {
  Low,       ///< computes in the compute dtype
  Full,      ///< stays in f32
  Unchanged, ///< has float values but none in f32: the policy does not apply
};
llvm::StringRef precisionId(Precision precision);

/// Why. Each reason has a stable id (what the report carries) and a text
/// (what people read). The report appends a decision's detail to the text
/// in parentheses, or puts it where the text says `{detail}`; `{where}`
/// is the op's `file:line` in the user's code.
enum class Reason {
  // Low precision.
  MatrixMultiply,
  MatrixMultiplyCompute,
  BetweenLowOps,
  FeedsLowOps,
  InputsLow,
  ScalesLowGradient,
  PartitionedNormTerm,
  LevelO3,
  ForceCompute,
  ScopeCompute,
  // f32.
  NumericallySensitive,
  ConsumesSensitive,
  NotBetweenLowOps,
  KeepF32,
  ScopeF32,
  PrecisionRequested,
  DiscreteDecision,
  GatesDecision,
  LinearAlgebra,
  Calibration,
  CpuConvolution,
  CpuDynamicDot,
  DotAlgorithm,
  Fixed,
  // Unchanged.
  NoF32Values,
  OperandsAlreadyLow,
};
llvm::StringRef reasonId(Reason reason);

/// Why a lowered dot is not an FP8 GEMM (amp-fp8-gemms): an id the report
/// carries (`gemm_reason`) and a text, as for Reason.
enum class Fp8Ineligibility {
  DimensionsUnreadable,
  DynamicShapes,
  BatchDimensions,
  SizeNotMultipleOf16,
  BothE5M2,
  ContractionNotMultipleOfBlock,
  TooSmall,
  Kept,
  Scope,
};
llvm::StringRef fp8IneligibilityId(Fp8Ineligibility why);
llvm::StringRef fp8IneligibilityText(Fp8Ineligibility why);

/// How amp-fp8-gemms scales an FP8 operand: one f32 scale per tensor from
/// this step's amax (current) or from an amax history carried as state
/// (delayed); one f32 scale per row of the non-contracting dimensions
/// (rowwise); or MXFP8: one power-of-two (E8M0) scale per block of
/// `kMxBlock` elements along the contraction, E4M3 data.
enum class Fp8Scaling { Current, Delayed, Rowwise, Mxfp8 };
llvm::Expected<Fp8Scaling> parseFp8Scaling(llvm::StringRef text);
inline constexpr int64_t kMxBlock = 32;
/// How amp-fp8-gemms writes an MXFP8 GEMM (`mx-form`): the `xla.scaled_dot`
/// composite, or dequantized operands feeding a plain dot.
enum class MxForm { Composite, Dequantize };
llvm::Expected<MxForm> parseMxForm(llvm::StringRef text);

/// amp-numerics' `collect` values: none, stats, provenance.
enum class Numerics { None, Stats, Provenance };
llvm::ArrayRef<llvm::StringRef> numericsNames();
llvm::Expected<Numerics> parseNumerics(llvm::StringRef text);
/// The counts per GEMM operand in amp.gemm_counts, in its order: nonzero,
/// underflow, saturated.
llvm::ArrayRef<llvm::StringRef> gemmStatsCounts();

/// A target's roofline: the figures a kernel is priced with (peak matrix
/// flops by operand class, HBM and interconnect bandwidth, a launch), for
/// the decisions that weigh time (FP8's shape filter) and the bench's step
/// estimate (hlo.py, `estimate`). docs/DESIGN.md gives the sources.
///
/// FP8 only where it pays: an FP8 GEMM saves half the compute-dtype GEMM's
/// time, 2*M*N*K / peak / 2; quantizing its operands reads each
/// compute-dtype element once more for the amax and writes its FP8 copy
/// (the scaling fuses into the producer), `kQuantizeBytesPerElement` bytes
/// per element of the M*K + K*N operand elements. FP8 pays when
/// M*N/(M+N) (K cancels) exceeds kQuantizeBytesPerElement * peak /
/// bandwidth: the GEMM's "effective size".
struct Roofline {
  llvm::StringLiteral name;   ///< how options and the bench name it: h100
  llvm::StringLiteral device; ///< H100 SXM
  double bf16Flops;           ///< dense bf16/f16 tensor-core peak, FLOP/s
  double fp8Flops;            ///< dense FP8 tensor-core peak
  double tf32Flops;           ///< f32 dots, run as TF32
  double f64Flops;
  double bytesPerSecond;      ///< HBM bandwidth, peak
  double interconnectBytesPerSecond; ///< per device and direction (NVLink)
  int64_t minSize() const;
};
inline constexpr double kQuantizeBytesPerElement = 3.0;
/// What a streaming kernel achieves of the peaks, and a kernel's launch.
inline constexpr double kHbmEfficiency = 0.85;
inline constexpr double kInterconnectEfficiency = 0.8;
inline constexpr double kKernelLaunchSeconds = 2e-6;
/// H100 SXM and B200.
llvm::ArrayRef<Roofline> rooflines();
/// defaultFp8MinSize (Policy.h) reads the first, the H100's.

//===----------------------------------------------------------------------===//
// State rounding
//===----------------------------------------------------------------------===//

/// How amp-round-state rounds a step's new low-precision state from its f32
/// value: to nearest (what a convert does), stochastically (unbiased), or to
/// nearest with a bf16 compensation buffer carrying each rounding's error
/// into the next step (Kahan).
enum class UpdateRounding { Nearest, Stochastic, Kahan };
llvm::ArrayRef<llvm::StringRef> updateRoundingNames();
llvm::Expected<UpdateRounding> parseUpdateRounding(llvm::StringRef text);
/// The dtype amp-round-state stores optimizer state in: f32, bf16, or f8
/// (block-scaled FP8, `OptimizerStateBlocks`).
enum class OptimizerStateDtype { F32, BF16, F8 };
/// optimizer-state=f8's layout: per block of kBlock elements of the
/// row-major flattened tensor, the FP8 E4M3 codes of r = sign(x) *
/// sqrt(|x|) scaled so the block's largest |r| is kMax (a nonzero r never
/// below kSmallest: never flushed to zero), then the block's f32 scale
/// (largest |r| / kMax) as 4 bytes: kBlock + 4 bytes a block. The blocks
/// are stored with as many of the tensor's leading dimensions as keep them
/// whole (see `storedShape`), so the state shards like its tensor.
struct OptimizerStateBlocks {
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kScaleBytes = 4;
  static constexpr double kMax = 448.0;      // E4M3's largest finite value
  static constexpr double kSmallest = 0x1p-9; // and its smallest subnormal
  /// The shape a tensor of `shape` is stored as: `shape[:k] + [B, kBlock +
  /// 4]` for the largest k whose trailing dimensions hold a whole number
  /// of blocks, B of them per index of the leading ones (no block crosses
  /// a leading index, so a tensor sharded along those dimensions has its
  /// blocks on the same devices); where none does, `[ceil(N / kBlock),
  /// kBlock + 4]`, the flattened tensor zero-padded. The bytes are the
  /// flat layout's in both cases.
  static llvm::SmallVector<int64_t> storedShape(llvm::ArrayRef<int64_t> shape);
  /// The number of leading dimensions `storedShape` keeps (the k above; 0
  /// also where the tensor is padded).
  static size_t keptDimensions(llvm::ArrayRef<int64_t> shape);
};
llvm::ArrayRef<llvm::StringRef> optimizerStateDtypeNames();
llvm::Expected<OptimizerStateDtype>
parseOptimizerStateDtype(llvm::StringRef text);
/// `RESULT:ARG` pairs (the `state-results` option of amp-round-state and
/// amp-loss-scale): result RESULT of main is the new value of argument ARG.
llvm::Expected<llvm::SmallVector<std::pair<unsigned, unsigned>>>
parseStateResults(llvm::ArrayRef<std::string> pairs);

//===----------------------------------------------------------------------===//
// Entry-point options
//===----------------------------------------------------------------------===//

/// How amp.transform, amp.train_step, amp.value_and_grad and amp-opt take a
/// pass option: a closed choice, op names, a switch, an integer, integers,
/// or `{pattern: choice}` per scope (Scopes.h; `PATTERN=CHOICE` entries).
enum class OptionKind { Choice, OpNames, Bool, Int, Ints, Scopes };

/// `value` of the entry-point option `name` (its Python spelling, e.g.
/// `dot_result`) in its canonical spelling on `target`; an empty value of
/// a target-dependent choice is the target's default. The error names the
/// accepted values, or the options when `name` is none of them.
llvm::Expected<std::string> canonicalOptionValue(llvm::StringRef name,
                                                 llvm::StringRef value,
                                                 llvm::StringRef target);

//===----------------------------------------------------------------------===//
// The whole contract, for the extension
//===----------------------------------------------------------------------===//

/// The contract as JSON: policy vocabulary, option choices and defaults of
/// every pass, the options the entry points take, attribute names, the
/// report's keys, loss-scale fields, defaults and layouts, decision kinds and
/// reasons, and the StableHLO op names options may mention.
std::string contractJson();

} // namespace mlir::amp

#endif // STABLEHLO_AMP_CONTRACT_H
