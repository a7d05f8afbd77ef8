//===- Provenance.h - Where a step's first non-finite value came from ----===//
//
// numerics=provenance: the regions of a step (one per JAX name scope and
// transformation, and source line: a module's forward or backward pass at
// one line, an optimizer line) and, per region, whether a value it hands
// on is NaN or infinite, as bits of one small integer result.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_PROVENANCE_H
#define STABLEHLO_AMP_PROVENANCE_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#include "llvm/ADT/SetVector.h"

#include <string>
#include <vector>

namespace mlir::amp {

/// One region of a step: its ops in main's body, what it reads from other
/// regions, and the values it hands on (read by another region, or
/// returned), which are checked. Region 0 is the step's inputs (main's
/// arguments) that have no name; each argument tree JAX named (`params`,
/// `batch`: the root of the argument's name location), or each leaf of a
/// tree of at most 16, is an input region of its own, after region 0 and
/// before the regions of ops.
struct ProvenanceRegion {
  std::string key;
  Operation *first = nullptr;       ///< null for the inputs
  /// The first argument of an input region of a named argument tree.
  Value argument;
  llvm::SetVector<int64_t> inputs;  ///< regions it reads, in first-read order
  llvm::SmallVector<Value> handedOn;
  llvm::SmallVector<std::string> primitives; ///< JAX primitives, in order
  FloatType narrowest;              ///< of the values it hands on, as rounded
};

/// The regions of `main`'s body in program order (the step's inputs first).
/// Ops with no location to group by join the region of their first
/// operand's producer; constants and iotas are in no region. A loop, a
/// conditional or a call is one op of its region.
std::vector<ProvenanceRegion> findProvenanceRegions(func::FuncOp main);

/// The provenance bits of `regions` as `i32[2, ceil((R) / 32)]`: row 0 has
/// bit r set when region r handed on a NaN, row 1 when it handed on an
/// infinity (bit r % 32 of word r / 32). Built in `main`, the checks next
/// to the values they read, the words before its terminator.
Value buildProvenanceBits(OpBuilder &builder, func::FuncOp main,
                          llvm::ArrayRef<ProvenanceRegion> regions);

/// The regions as the report's records: their location, primitives,
/// narrowest format, inputs and how many values each checks.
ArrayAttr provenanceRegionsAttr(MLIRContext *context,
                                llvm::ArrayRef<ProvenanceRegion> regions);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_PROVENANCE_H
