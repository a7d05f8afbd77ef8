//===- Passes.h - stablehlo-amp passes ------------------------------------===//

#ifndef STABLEHLO_AMP_PASSES_H
#define STABLEHLO_AMP_PASSES_H

// The option defaults in Passes.td name the contract's constants.
#include "Contract.h"
#include "Policy.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir::amp {

#define GEN_PASS_DECL
#include "Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Passes.h.inc"

/// The patterns of amp-simplify-converts, for pipelines of one's own.
void populateSimplifyConvertsPatterns(RewritePatternSet &patterns);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_PASSES_H
