//===- Report.h - What amp-insert-converts decided, as JSON ---------------===//

#ifndef STABLEHLO_AMP_REPORT_H
#define STABLEHLO_AMP_REPORT_H

#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace mlir::amp {

/// Reads the `amp.precision` and `amp.inserted` annotations left by
/// `amp-insert-converts{annotate=true}` into a JSON report, removing them from
/// the module. The report lists each decided op (name, decision, location)
/// and counts the converts inserted and present.
std::string collectPrecisionReport(ModuleOp module);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_REPORT_H
