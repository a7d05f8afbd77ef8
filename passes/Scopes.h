//===- Scopes.h - Per-layer overrides by scope path ----------------------===//
//
// The `scopes` option of amp-insert-converts and amp-fp8-gemms: PATTERN=
// CHOICE entries, each a regular expression searched in an op's scope path
// (the `jax.named_scope` / module path the report prints: `Net/head`), and
// what the ops of a matching scope do: stay f32, compute in the compute
// dtype, or (with gemm=f8) be the only GEMMs that go FP8. The scope path is
// read from the name JAX gives the op (its NameLoc), without JAX's
// transformation wrappers, so the backward pass of a scope
// (`transpose(jvp(Net))/head`) is the scope's own.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_SCOPES_H
#define STABLEHLO_AMP_SCOPES_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/Regex.h"

#include <memory>
#include <string>
#include <vector>

namespace mlir::amp {

/// What a scope's ops do (the choice of a `scopes` entry).
enum class ScopeChoice { F32, Compute, F8 };
/// f32, compute, f8, in ScopeChoice's order.
llvm::ArrayRef<llvm::StringRef> scopeChoiceNames();

/// JAX's transformation wrappers in an op's name (`transpose(jvp(Net))`):
/// they wrap a scope, they are not one.
llvm::ArrayRef<llvm::StringRef> scopeWrapperNames();
/// Names of the functions the front ends trace (`main`, `module_fn`, ...):
/// parts of an op's name that are no scope of the user's.
llvm::ArrayRef<llvm::StringRef> scopeDriverNames();

/// The scope path of an op at `loc`, as the report prints it
/// (`Net/Block_3/attn`): the parts of the name JAX gives it, less the
/// primitive, the leading `jit(f)`, JAX's wrappers and the driver's
/// function names. Empty when the op has no name or no scope.
std::string scopePath(Location loc);

/// One `PATTERN=CHOICE` entry.
struct ScopeRule {
  std::string pattern;
  ScopeChoice choice;
  std::shared_ptr<llvm::Regex> regex;
  /// `scopes['PATTERN']`: how the report names this override.
  std::string name() const { return "scopes['" + pattern + "']"; }
};

/// The parsed `scopes` option.
class ScopeOverrides {
public:
  /// Parses `PATTERN=CHOICE` entries (split at the last `=`). The error
  /// names the bad entry: no `=`, an unknown choice (listing the accepted
  /// ones), an invalid regular expression, or a pattern given twice.
  static llvm::Expected<ScopeOverrides>
  parse(llvm::ArrayRef<std::string> entries);

  bool empty() const { return rules.empty(); }
  bool has(ScopeChoice choice) const;
  llvm::ArrayRef<ScopeRule> entries() const { return rules; }

  /// The rule whose pattern matches the most characters of `op`'s scope
  /// path, or null. `check` must have accepted the module (no ties).
  const ScopeRule *ruleFor(Operation *op) const;

  /// Errors for `module`: a pattern that matches no op's scope (naming the
  /// nearest scopes), and two patterns that match the same scope with
  /// matches of the same length (naming both).
  llvm::Error check(ModuleOp module) const;

private:
  std::vector<ScopeRule> rules;
  /// The matching rules with the longest match in `path`, in entry order.
  llvm::SmallVector<const ScopeRule *, 2> longest(llvm::StringRef path) const;
};

} // namespace mlir::amp

#endif // STABLEHLO_AMP_SCOPES_H
