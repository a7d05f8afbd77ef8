//===- Policy.h - The precision policy and its grammar --------------------===//
//
// One grammar for every front end: the pass options, amp-opt --policy and
// stablehlo_amp.Policy.parse all go through parsePolicy.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_POLICY_H
#define STABLEHLO_AMP_POLICY_H

#include "mlir/IR/BuiltinTypes.h"
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
/// The accepted spellings, for error messages and --help.
std::string acceptedDtypeNames();

/// Which parts of the program a policy lowers.
enum class Level { O0, O1, O2, O3 };
llvm::Expected<Level> parseLevel(llvm::StringRef text);
llvm::StringRef levelName(Level level);

/// Precision policy in the jmp grammar: `p=f32,c=bf16,o=f32`.
struct Policy {
  Dtype param = Dtype::F32;
  Dtype compute = Dtype::F32;
  Dtype output = Dtype::F32;

  /// Canonical text, `p=f32,c=bf16,o=f32`; parsePolicy(str()) == *this.
  std::string str() const;
  bool operator==(const Policy &other) const {
    return param == other.param && compute == other.compute &&
           output == other.output;
  }
};

/// Parses `p=...,c=...,o=...` (keys p|params|param, c|compute, o|output).
/// Missing keys cascade: compute follows params, output follows compute.
/// Errors name the bad key or dtype and list the accepted ones.
llvm::Expected<Policy> parsePolicy(llvm::StringRef text);

/// The policy grammar, as shown by --help.
llvm::StringRef policyGrammarHelp();

} // namespace mlir::amp

#endif // STABLEHLO_AMP_POLICY_H
