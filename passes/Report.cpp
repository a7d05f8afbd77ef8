//===- Report.cpp - What amp-insert-converts decided, as JSON -------------===//

#include "Report.h"
#include "Contract.h"
#include "PassSupport.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

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

/// One decision attribute as a JSON record: the op, its location, and each
/// decision key the attribute has, under the same key.
llvm::json::Object decisionJson(Operation *op, DictionaryAttr decision) {
  auto string = [&](llvm::StringRef key) -> llvm::StringRef {
    auto value = decision.getAs<StringAttr>(key);
    return value ? value.getValue() : llvm::StringRef();
  };
  llvm::json::Object record{
      {report_key::kOp, op->getName().getStringRef()},
      {decision_key::kPrecision, string(decision_key::kPrecision)},
      {decision_key::kReason, string(decision_key::kReason)},
      {report_key::kLoc, locationText(op->getLoc())},
  };
  for (llvm::StringRef key :
       {decision_key::kDetail, decision_key::kGemm, decision_key::kGemmReason,
        decision_key::kGemmDetail})
    if (!string(key).empty())
      record[key] = string(key);
  for (llvm::StringRef key :
       {decision_key::kGroup, decision_key::kStored, decision_key::kFp8,
        decision_key::kGemmIndex, decision_key::kGemmStats})
    if (auto index = decision.getAs<IntegerAttr>(key))
      record[key] = index.getInt();
  if (auto formats = decision.getAs<ArrayAttr>(decision_key::kGemmStatsFormats)) {
    llvm::json::Array names;
    for (auto name : formats.getAsValueRange<StringAttr>())
      names.push_back(name);
    record[decision_key::kGemmStatsFormats] = std::move(names);
  }
  return record;
}

/// One provenance region (amp-numerics' record on main) as JSON.
llvm::json::Object regionJson(DictionaryAttr record) {
  llvm::json::Array primitives, inputs;
  if (auto names = record.getAs<ArrayAttr>(region_key::kPrimitives))
    for (llvm::StringRef name : names.getAsValueRange<StringAttr>())
      primitives.push_back(name);
  if (auto indices = record.getAs<ArrayAttr>(region_key::kInputs))
    for (auto index : indices.getAsRange<IntegerAttr>())
      inputs.push_back(index.getInt());
  auto text = [&](llvm::StringRef key) {
    auto value = record.getAs<StringAttr>(key);
    return value ? value.getValue() : llvm::StringRef();
  };
  auto values = record.getAs<IntegerAttr>(region_key::kValues);
  return llvm::json::Object{
      {region_key::kLoc, text(region_key::kLoc)},
      {region_key::kPrimitives, std::move(primitives)},
      {region_key::kFormat, text(region_key::kFormat)},
      {region_key::kInputs, std::move(inputs)},
      {region_key::kValues, values ? values.getInt() : 0}};
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
  llvm::json::Array regions;
  if (func::FuncOp main = entryFunction(module))
    if (auto records = main->getAttrOfType<ArrayAttr>(attr::kNonFiniteRegions))
      for (auto record : records.getAsRange<DictionaryAttr>())
        regions.push_back(regionJson(record));
  llvm::json::Object json{
      {report_key::kOps, std::move(ops)},
      {report_key::kNonFiniteRegions, std::move(regions)},
      {report_key::kConvertsInserted, inserted},
      {report_key::kConvertsTotal, total},
      {report_key::kBytesBefore, bytesJson(before)},
      {report_key::kBytesAfter, bytesJson(storageBytes(module))},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(json));
  return text;
}
