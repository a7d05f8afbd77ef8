//===- Report.cpp - What amp-insert-converts decided, as JSON -------------===//

#include "Report.h"
#include "Contract.h"
#include "StableHLO.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::amp;

namespace {
std::string locationText(Location loc) {
  std::string text;
  llvm::raw_string_ostream os(text);
  loc.print(os);
  return text;
}

std::string typeText(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

llvm::json::Object bytesJson(const StorageBytes &bytes) {
  llvm::json::Object object;
  for (const auto &[dtype, count] : bytes)
    object[dtype] = count;
  return object;
}

/// One decision attribute as a JSON record.
llvm::json::Object decisionJson(Operation *op, DictionaryAttr decision) {
  auto string = [&](llvm::StringRef key) -> llvm::StringRef {
    auto value = decision.getAs<StringAttr>(key);
    return value ? value.getValue() : llvm::StringRef();
  };
  llvm::json::Object record{
      {"op", op->getName().getStringRef()},
      {"precision", string("precision")},
      {"reason", string("reason")},
      {"loc", locationText(op->getLoc())},
  };
  if (!string("detail").empty())
    record["detail"] = string("detail");
  if (auto group = decision.getAs<IntegerAttr>("group"))
    record["group"] = group.getInt();
  if (auto stored = decision.getAs<IntegerAttr>("stored"))
    record["stored"] = stored.getInt();
  if (auto fp8 = decision.getAs<IntegerAttr>("fp8"))
    record["fp8"] = fp8.getInt();
  if (!string("gemm").empty())
    record["gemm"] = string("gemm");
  if (!string("gemm_reason").empty())
    record["gemm_reason"] = string("gemm_reason");
  return record;
}
} // namespace

namespace {
/// A float-to-float convert that widens (or narrows) its operand.
bool isFloatConvert(Operation *op, bool widening) {
  if (!shlo::isConvert(op) || op->getNumOperands() != 1)
    return false;
  FloatType from = shlo::getFloatElementType(op->getOperand(0).getType());
  FloatType to = shlo::getFloatElementType(op->getResult(0).getType());
  return from && to &&
         (widening ? to.getWidth() > from.getWidth()
                   : to.getWidth() < from.getWidth());
}
} // namespace

StorageBytes mlir::amp::storageBytes(ModuleOp module) {
  // A value rounded right after it is made is kept only as its rounded copy,
  // and a widening convert is fused into its readers (XLA fuses both
  // converts): each value counts once, in the dtype it is kept in.
  StorageBytes bytes;
  module.walk([&](Operation *op) {
    // A barrier's results are its operands (no copy).
    if (isFloatConvert(op, /*widening=*/true) ||
        shlo::isOptimizationBarrier(op))
      return;
    for (Value result : op->getResults()) {
      FloatType element = shlo::getFloatElementType(result.getType());
      std::optional<int64_t> count = shlo::numElements(result.getType());
      bool onlyRounded =
          !result.use_empty() && llvm::all_of(result.getUsers(), [](Operation *user) {
            return isFloatConvert(user, /*widening=*/false);
          });
      if (element && count && !onlyRounded)
        bytes[typeText(element)] += *count * element.getWidth() / 8;
    }
  });
  return bytes;
}

std::string mlir::amp::collectPrecisionReport(ModuleOp module,
                                              const StorageBytes &before) {
  llvm::json::Array ops;
  int64_t inserted = 0, total = 0;
  module.walk([&](Operation *op) {
    if (shlo::isConvert(op)) {
      ++total;
      if (op->hasAttr(attr::kInserted))
        ++inserted;
    }
    op->removeAttr(attr::kInserted);
    auto decision = op->getAttrOfType<DictionaryAttr>(attr::kDecision);
    if (!decision)
      return;
    op->removeAttr(attr::kDecision);
    ops.push_back(decisionJson(op, decision));
  });
  llvm::json::Object report{
      {"ops", std::move(ops)},
      {"converts_inserted", inserted},
      {"converts_total", total},
      {"bytes_before", bytesJson(before)},
      {"bytes_after", bytesJson(storageBytes(module))},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(report));
  return text;
}
