//===- OpClasses.h - How each StableHLO op takes part in mixed precision --===//
//
// amp's own knowledge about StableHLO ops (after TF grappler's
// auto_mixed_precision lists and PyTorch autocast): which ops may compute in
// a low-precision dtype, which must not, and which ops make discrete
// decisions or do linear algebra, so that what feeds them stays exact.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_OPCLASSES_H
#define STABLEHLO_AMP_OPCLASSES_H

#include "Contract.h"

#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace mlir::amp {

/// How an op takes part in mixed precision (see Passes.td).
enum class OpClass {
  Allow,   ///< dot_general, convolution: low-precision operands
  Deny,    ///< numerically sensitive: stays f32
  Infer,   ///< elementwise arithmetic: follows its inputs
  Clear,   ///< data movement: never forces a convert
  Convert, ///< an existing convert of a float: its result type is kept
  Fixed,   ///< keeps its exact types (custom_call, unknown, control flow, ...)
};

struct Classification {
  OpClass cls = OpClass::Fixed;
  Reason reason = Reason::Fixed;
  /// What exactly, for reports ("sum reduction", "custom call").
  std::string detail;
};

/// The class of `op` and why.
Classification classify(Operation *op);

/// A discrete decision `op` makes on float operands, if any: the decision's
/// name ("top_k", "sort", "argmax", "float-to-integer convert", ...) and the
/// float operands it decides on.
struct DiscreteDecision {
  std::string name;
  llvm::SmallVector<unsigned> operands;
};
std::optional<DiscreteDecision> discreteDecision(Operation *op);

/// The linear-algebra routine `op` is ("cholesky", "lapack_spotrf_ffi"), if
/// it is one: StableHLO's cholesky and triangular_solve, and the LAPACK,
/// cuSOLVER, hipSOLVER and cuBLAS custom calls jaxlib emits for
/// jnp.linalg.
std::optional<std::string> linearAlgebraName(Operation *op);

/// The custom-call targets recognised as linear algebra: exact names and
/// prefixes (for the contract and the tests).
llvm::ArrayRef<llvm::StringRef> linearAlgebraCallPrefixes();

} // namespace mlir::amp

#endif // STABLEHLO_AMP_OPCLASSES_H
