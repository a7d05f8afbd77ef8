//===- SimplifyConverts.cpp - Remove converts that change nothing ---------===//
//
// amp-simplify-converts: three rewrite patterns run by the greedy driver.
// None of them removes a conversion that can lose information.
//
//===----------------------------------------------------------------------===//

#include "Passes.h"
#include "StableHLO.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::amp {
#define GEN_PASS_DEF_AMPSIMPLIFYCONVERTSPASS
#include "Passes.h.inc"
} // namespace mlir::amp

using namespace mlir;
using namespace mlir::amp;

namespace {

/// A pattern on `stablehlo.convert`, an unregistered op matched by name:
/// subclasses see only well-formed (unary) converts.
struct ConvertPattern : RewritePattern {
  explicit ConvertPattern(MLIRContext *context, PatternBenefit benefit = 1)
      : RewritePattern(shlo::kConvertOpName, benefit, context) {}

  LogicalResult matchAndRewrite(Operation *op,
                                PatternRewriter &rewriter) const final {
    if (op->getNumOperands() != 1 || op->getNumResults() != 1)
      return rewriter.notifyMatchFailure(op, "not a unary convert");
    return rewriteConvert(op, rewriter);
  }

  virtual LogicalResult rewriteConvert(Operation *op,
                                       PatternRewriter &rewriter) const = 0;
};

/// convert(x : T) -> T is x.
struct FoldIdentityConvert final : ConvertPattern {
  using ConvertPattern::ConvertPattern;
  LogicalResult rewriteConvert(Operation *op,
                               PatternRewriter &rewriter) const override {
    if (op->getOperand(0).getType() != op->getResult(0).getType())
      return rewriter.notifyMatchFailure(op, "changes the type");
    rewriter.replaceOp(op, op->getOperand(0));
    return success();
  }
};

/// convert(convert(x : T -> A) -> B) with T -> A exact is convert(x -> B):
/// the first conversion lost nothing, so only the second one rounds; when B
/// is T, it is x.
struct FoldExactRoundTrip final : ConvertPattern {
  using ConvertPattern::ConvertPattern;
  LogicalResult rewriteConvert(Operation *op,
                               PatternRewriter &rewriter) const override {
    Operation *producer = op->getOperand(0).getDefiningOp();
    if (!producer || !shlo::isConvert(producer) ||
        producer->getNumOperands() != 1)
      return rewriter.notifyMatchFailure(op, "input is not a convert");
    Value source = producer->getOperand(0);
    if (!shlo::isExactWidening(source.getType(), op->getOperand(0).getType()))
      return rewriter.notifyMatchFailure(
          op, "the first conversion may round: the pair is not a no-op");
    if (source.getType() == op->getResult(0).getType())
      rewriter.replaceOp(op, source);
    else
      rewriter.modifyOpInPlace(op, [&] { op->setOperand(0, source); });
    // Unregistered ops are never trivially dead to the driver.
    if (producer->use_empty())
      rewriter.eraseOp(producer);
    return success();
  }
};

/// Converts of one value to one type become one: a convert is replaced by an
/// equal convert in its own block before it, or in an enclosing block before
/// the op that holds it (a `case` branch, a loop body).
struct MergeDuplicateConverts final : ConvertPattern {
  using ConvertPattern::ConvertPattern;
  LogicalResult rewriteConvert(Operation *op,
                               PatternRewriter &rewriter) const override {
    Value input = op->getOperand(0);
    Type type = op->getResult(0).getType();
    for (Operation *at = op; at && at->getBlock(); at = at->getParentOp()) {
      for (Operation *user : input.getUsers()) {
        if (user == op || !shlo::isConvert(user) ||
            user->getNumResults() != 1 ||
            user->getResult(0).getType() != type ||
            user->getBlock() != at->getBlock() || !user->isBeforeInBlock(at))
          continue;
        rewriter.replaceOp(op, user->getResults());
        return success();
      }
      if (input.getParentBlock() == at->getBlock())
        break;
    }
    return rewriter.notifyMatchFailure(op, "no earlier equal convert");
  }
};

class SimplifyConvertsPass final
    : public amp::impl::AmpSimplifyConvertsPassBase<SimplifyConvertsPass> {
public:
  using AmpSimplifyConvertsPassBase::AmpSimplifyConvertsPassBase;

  LogicalResult initialize(MLIRContext *context) override {
    RewritePatternSet patterns(context);
    populateSimplifyConvertsPatterns(patterns);
    frozen = std::move(patterns);
    return success();
  }

  void runOnOperation() override {
    // Program order (a convert's inputs are simplified before it), and no
    // region simplification: the module's blocks are not ours to merge.
    GreedyRewriteConfig config;
    config.setUseTopDownTraversal(true)
        .setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled)
        .enableFolding(false)
        .enableConstantCSE(false);
    if (failed(applyPatternsGreedily(getOperation(), frozen, config))) {
      getOperation().emitError()
          << "amp-simplify-converts did not converge";
      signalPassFailure();
    }
  }

private:
  FrozenRewritePatternSet frozen;
};

} // namespace

void mlir::amp::populateSimplifyConvertsPatterns(RewritePatternSet &patterns) {
  patterns.add<FoldIdentityConvert, FoldExactRoundTrip, MergeDuplicateConverts>(
      patterns.getContext());
}
