//===- SimplifyConverts.cpp - Remove converts that change nothing ---------===//

#include "Passes.h"
#include "StableHLO.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPSIMPLIFYCONVERTSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// True if every value of `from` is exactly representable in `to`.
bool isExactWidening(Type from, Type to) {
  auto fromFloat = shlo::getFloatElementType(from);
  auto toFloat = shlo::getFloatElementType(to);
  if (!fromFloat || !toFloat)
    return false;
  return llvm::APFloatBase::isRepresentableBy(fromFloat.getFloatSemantics(),
                                              toFloat.getFloatSemantics());
}

class SimplifyConvertsPass final
    : public amp::impl::AmpSimplifyConvertsPassBase<SimplifyConvertsPass> {
public:
  using AmpSimplifyConvertsPassBase::AmpSimplifyConvertsPassBase;

  void runOnOperation() override {
    llvm::SmallVector<Operation *> converts;
    getOperation().walk([&](Operation *op) {
      if (shlo::isConvert(op) && op->getNumOperands() == 1 &&
          op->getNumResults() == 1)
        converts.push_back(op);
    });
    // Program order: by the time a convert is visited, the converts feeding
    // it are already simplified.
    for (Operation *convert : converts)
      simplify(convert);
    mergeDuplicates();
  }

private:
  void simplify(Operation *convert) {
    Value input = convert->getOperand(0);
    Value result = convert->getResult(0);
    if (input.getType() == result.getType()) {
      result.replaceAllUsesWith(input);
      convert->erase();
      return;
    }
    Operation *producer = input.getDefiningOp();
    if (!producer || !shlo::isConvert(producer))
      return;
    Value source = producer->getOperand(0);
    // convert(convert(x: T -> A) -> B) with T -> A exact is convert(x -> B):
    // the first conversion lost nothing, so only the second one rounds.
    if (!isExactWidening(source.getType(), input.getType()))
      return;
    if (source.getType() == result.getType()) {
      result.replaceAllUsesWith(source);
      convert->erase();
    } else {
      convert->setOperand(0, source);
    }
    if (producer->use_empty())
      producer->erase();
  }

  /// Converts of one value to one type become one: a later convert in the
  /// same block, or one nested in a region (a `case` branch, a loop body) of
  /// an op that comes after the first convert, uses the first.
  void mergeDuplicates() {
    llvm::SmallVector<Operation *> converts;
    getOperation().walk<WalkOrder::PreOrder>([&](Operation *op) {
      if (shlo::isConvert(op) && op->getNumOperands() == 1)
        converts.push_back(op);
    });
    llvm::DenseMap<std::tuple<Block *, Value, Type>, Operation *> first;
    for (Operation *convert : converts) {
      Value input = convert->getOperand(0);
      Type type = convert->getResult(0).getType();
      Operation *kept = nullptr;
      // The convert's own block, then each enclosing block up to the one
      // that defines the input.
      for (Operation *at = convert; at && !kept; at = at->getParentOp()) {
        Block *block = at->getBlock();
        if (!block)
          break;
        auto it = first.find(std::make_tuple(block, input, type));
        if (it != first.end() && it->second->isBeforeInBlock(at))
          kept = it->second;
        if (input.getParentBlock() == block)
          break;
      }
      if (!kept) {
        first.try_emplace(std::make_tuple(convert->getBlock(), input, type),
                          convert);
        continue;
      }
      convert->getResult(0).replaceAllUsesWith(kept->getResult(0));
      convert->erase();
    }
  }
};

} // namespace
