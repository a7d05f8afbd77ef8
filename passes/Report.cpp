//===- Report.cpp - What amp-insert-converts decided, as JSON -------------===//

#include "Report.h"
#include "StableHLO.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

namespace {
std::string locationText(Location loc) {
  std::string text;
  llvm::raw_string_ostream os(text);
  loc.print(os);
  return text;
}
} // namespace

std::string mlir::amp::collectPrecisionReport(ModuleOp module) {
  llvm::json::Array ops;
  int64_t inserted = 0, total = 0;
  module.walk([&](Operation *op) {
    if (shlo::isConvert(op)) {
      ++total;
      if (op->hasAttr(shlo::kInsertedAttr))
        ++inserted;
    }
    op->removeAttr(shlo::kInsertedAttr);
    auto decision = op->getAttrOfType<StringAttr>(shlo::kPrecisionAttr);
    if (!decision)
      return;
    op->removeAttr(shlo::kPrecisionAttr);
    auto [kind, reason] = decision.getValue().split(": ");
    ops.push_back(llvm::json::Object{
        {"op", op->getName().getStringRef()},
        {"precision", kind},
        {"reason", reason},
        {"loc", locationText(op->getLoc())},
    });
  });
  llvm::json::Object report{
      {"ops", std::move(ops)},
      {"converts_inserted", inserted},
      {"converts_total", total},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(report));
  return text;
}
