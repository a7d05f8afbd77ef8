//===- Policy.h - The precision policy and the option vocabulary ---------===//
//
// One grammar and one set of choices for every front end: the pass options,
// `amp-opt`, and `stablehlo_amp` (through the extension's contract) all parse
// with these functions, so an accepted spelling or an error message cannot
// differ between them.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_POLICY_H
#define STABLEHLO_AMP_POLICY_H

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace mlir::amp {

/// A floating-point dtype a policy can name.
enum class Dtype { F64, F32, BF16, F16, F8E4M3FN, F8E5M2 };

/// Canonical short name ("bf16").
llvm::StringRef dtypeName(Dtype dtype);
/// The MLIR element type for `dtype`.
FloatType dtypeType(MLIRContext *context, Dtype dtype);
/// Every accepted spelling of `dtype`, canonical name first.
llvm::SmallVector<llvm::StringRef> dtypeSpellings(Dtype dtype);
/// Every dtype, in the order the grammar lists them.
llvm::ArrayRef<Dtype> allDtypes();
bool isFp8(Dtype dtype);

/// The operand dtype of matrix multiplies (the `gemm=` key). `Compute` means
/// "the compute dtype" and is the default; `F8` means e4m3fn for forward
/// operands and e5m2 for gradient operands.
enum class GemmDtype { Compute, F8, F8E4M3FN, F8E5M2 };
llvm::StringRef gemmDtypeName(GemmDtype gemm);
llvm::SmallVector<llvm::StringRef> gemmDtypeSpellings(GemmDtype gemm);
llvm::ArrayRef<GemmDtype> allGemmDtypes();
/// The FP8 formats (every GEMM dtype but `compute`), canonical names.
llvm::ArrayRef<llvm::StringRef> fp8GemmNames();
/// An FP8 GEMM format (any spelling); the error lists fp8GemmNames().
llvm::Expected<GemmDtype> parseFp8Gemm(llvm::StringRef text);

/// Precision policy in the jmp grammar, `p=f32,c=bf16,o=f32`, plus the
/// optional GEMM operand dtype, `gemm=f8`.
struct Policy {
  Dtype param = Dtype::F32;
  Dtype compute = Dtype::F32;
  Dtype output = Dtype::F32;
  GemmDtype gemm = GemmDtype::Compute;

  /// Canonical text, `p=f32,c=bf16,o=f32[,gemm=f8]`; parsePolicy(str()) ==
  /// *this.
  std::string str() const;
  bool operator==(const Policy &other) const {
    return param == other.param && compute == other.compute &&
           output == other.output && gemm == other.gemm;
  }
};

/// The keys of the grammar, each with its accepted spellings (canonical
/// first): p|param|params, c|compute, o|output, gemm.
struct PolicyKey {
  llvm::StringRef role; ///< "param", "compute", "output", "gemm"
  llvm::SmallVector<llvm::StringRef> spellings;
};
llvm::ArrayRef<PolicyKey> policyKeys();

/// The policy a pass or front end uses when none is given.
inline constexpr llvm::StringLiteral kDefaultPolicy = "p=f32,c=bf16,o=f32";
/// The training entry points' default (train_step, value_and_grad): f16
/// compute with dynamic loss scaling, the setting loss scaling exists for.
inline constexpr llvm::StringLiteral kTrainingDefaultPolicy =
    "p=f32,c=f16,o=f32";

/// Parses a policy. Missing keys cascade: compute follows params, output
/// follows compute; `gemm` defaults to the compute dtype. Errors name the bad
/// key or dtype and list the accepted ones. FP8 is accepted only for `gemm`.
llvm::Expected<Policy> parsePolicy(llvm::StringRef text);

/// The policy grammar, as --help and error messages show it.
std::string policyGrammarHelp();

//===----------------------------------------------------------------------===//
// The other options of amp-insert-converts: each a closed set of names.
//===----------------------------------------------------------------------===//

/// Which parts of the program a policy lowers.
enum class Level { O0, O1, O2, O3 };
inline constexpr Level kDefaultLevel = Level::O2;
/// The backend a module will run on.
enum class Target { Cpu, Gpu, Tpu };
/// The pass's default; front ends pass the backend they run on.
inline constexpr Target kDefaultTarget = Target::Gpu;
/// The result dtype of a lowered dot_general or convolution.
enum class DotResult { F32, Compute };
/// What a discrete decision (top_k, argmax, sort...) keeps in f32: the
/// whole computation upstream of it (exact: its choices equal f32's), or
/// the gating computation, from the nearest matrix multiply up to it (gate:
/// the hidden states that multiply reads stay low precision).
enum class Decisions { Exact, Gate };
inline constexpr Decisions kDefaultDecisions = Decisions::Gate;
/// What rematerialization trades: only recomputations that cost no kernel
/// and no bytes (speed), or every cheap one that saves memory (memory).
enum class RematerializeFor { Speed, Memory };
inline constexpr RematerializeFor kDefaultRematerializeFor =
    RematerializeFor::Speed;
/// Where f32 arithmetic keeps its results: in f32, or rounded to the compute
/// dtype once, right after the producer, when that is safe (see Passes.td).
enum class Storage { F32, Compute };
/// The result dtype of the backward pass's matrix multiplies, whose partial
/// sums XLA's SPMD partitioner reduces across devices (the gradient
/// reduce-scatter): f32, or the compute dtype.
enum class ReduceDtype { F32, Compute };
inline constexpr ReduceDtype kDefaultReduceDtype = ReduceDtype::F32;

llvm::StringRef levelName(Level level);
llvm::StringRef targetName(Target target);
llvm::StringRef dotResultName(DotResult dotResult);
llvm::StringRef storageName(Storage storage);
llvm::StringRef reduceDtypeName(ReduceDtype reduce);
llvm::StringRef decisionsName(Decisions decisions);
llvm::StringRef rematerializeForName(RematerializeFor goal);

llvm::ArrayRef<llvm::StringRef> levelNames();
llvm::ArrayRef<llvm::StringRef> targetNames();
llvm::ArrayRef<llvm::StringRef> dotResultNames();
llvm::ArrayRef<llvm::StringRef> storageNames();
llvm::ArrayRef<llvm::StringRef> reduceDtypeNames();
llvm::ArrayRef<llvm::StringRef> decisionsNames();
llvm::ArrayRef<llvm::StringRef> rematerializeForNames();

/// Each parser accepts the canonical names (levels also in lower case) and
/// names the accepted ones in its error.
llvm::Expected<Level> parseLevel(llvm::StringRef text);
llvm::Expected<Target> parseTarget(llvm::StringRef text);
llvm::Expected<DotResult> parseDotResult(llvm::StringRef text);
llvm::Expected<Decisions> parseDecisions(llvm::StringRef text);
llvm::Expected<RematerializeFor> parseRematerializeFor(llvm::StringRef text);
/// An empty `text` means the default for `target` and `compute`
/// (defaultDotResult).
llvm::Expected<DotResult> parseDotResult(llvm::StringRef text, Target target,
                                         Dtype compute);
/// f32 or compute; a float dtype's name also, which must then be f32 or
/// `compute` (the policy's): reduce-dtype=bf16 under c=f16 is an error.
llvm::Expected<ReduceDtype> parseReduceDtype(llvm::StringRef text,
                                             Dtype compute);
/// The canonical spelling of a reduce-dtype whatever the policy: f32,
/// compute, or the canonical name of a low-precision float dtype.
llvm::Expected<std::string> canonicalReduceDtypeName(llvm::StringRef text);
/// An empty `text` means the target's default (defaultStorage).
llvm::Expected<Storage> parseStorage(llvm::StringRef text, Target target);
/// An empty `text` means the target's default (defaultLevel).
llvm::Expected<Level> parseLevel(llvm::StringRef text, Target target);

/// The storage used when none is asked for (docs/DESIGN.md, storage).
Storage defaultStorage(Target target);
/// The dot result used when none is asked for: the compute dtype where a
/// GEMM rounds its f32 accumulator once as it writes (gpu, tpu) and the
/// compute dtype has f32's range (bf16); f32 elsewhere (XLA:CPU has no such
/// GEMM; f16 results can overflow where f32 ones do not).
DotResult defaultDotResult(Target target, Dtype compute);
/// The level used when none is asked for (docs/DESIGN.md, levels).
Level defaultLevel(Target target);
/// Whether a front end runs amp-rematerialize on a training step when not
/// told (docs/DESIGN.md, "Rematerialization").
bool defaultRematerialize(Target target);
/// The effective size M*N/(M+N) below which a GEMM stays out of FP8 by
/// default on `target`: the H100's roofline on gpu (Contract.h,
/// Roofline); 0 (no filter) elsewhere (XLA:CPU emulates FP8; TPUs are
/// not modelled).
int64_t defaultFp8MinSize(Target target);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_POLICY_H
