//===- Passes.h - stablehlo-amp passes ------------------------------------===//

#ifndef STABLEHLO_AMP_PASSES_H
#define STABLEHLO_AMP_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::amp {

#define GEN_PASS_DECL
#include "Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Passes.h.inc"

} // namespace mlir::amp

#endif // STABLEHLO_AMP_PASSES_H
