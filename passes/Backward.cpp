//===- Backward.cpp - Which values of a training step are the backward pass ===//

#include "Backward.h"
#include "Contract.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;
using namespace mlir::amp;

llvm::DenseSet<Value> mlir::amp::backwardValues(ModuleOp module) {
  llvm::DenseSet<Value> tainted;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (!func.isPublic() || func.isExternal())
      continue;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      if (func.getArgAttr(i, attr::kLossSeed) ||
          func.getArgAttr(i, attr::kCotangent))
        tainted.insert(func.getArgument(i));
  }
  if (tainted.empty())
    return tainted;
  module.walk<WalkOrder::PreOrder>([&](Operation *op) {
    bool any = llvm::any_of(op->getOperands(),
                            [&](Value v) { return tainted.contains(v); });
    if (!any)
      return;
    if (shlo::isOptimizationBarrier(op)) {
      for (auto [operand, result] :
           llvm::zip(op->getOperands(), op->getResults()))
        if (tainted.contains(operand))
          tainted.insert(result);
      return;
    }
    tainted.insert(op->result_begin(), op->result_end());
    for (Region &region : op->getRegions())
      for (Block &block : region)
        tainted.insert(block.args_begin(), block.args_end());
  });
  return tainted;
}
