//===- Report.h - What amp-insert-converts decided, as JSON ---------------===//

#ifndef STABLEHLO_AMP_REPORT_H
#define STABLEHLO_AMP_REPORT_H

#include "mlir/IR/BuiltinOps.h"

#include <map>
#include <string>

namespace mlir::amp {

/// Bytes of the float values (op results with static shapes) of a module, by
/// element type ("f32", "bf16"): what a rewrite moves between dtypes.
using StorageBytes = std::map<std::string, int64_t>;
StorageBytes storageBytes(ModuleOp module);

/// Reads the `amp.decision` and `amp.inserted` attributes left by
/// `amp-insert-converts{report=true}` into a JSON report and removes them
/// from the module. The report lists each decided op (name, precision,
/// reason id, detail, calibration group, whether it is stored low,
/// location), counts the converts inserted and present, and gives the bytes
/// of float values by dtype before (`before`) and after the rewrite.
std::string collectPrecisionReport(ModuleOp module, const StorageBytes &before);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_REPORT_H
