//===- Calls.cpp - Calls analysed in their callers' context ---------------===//

#include "Calls.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::amp;

namespace {

bool hasArgOrResultAttrs(func::FuncOp func) {
  auto nonEmpty = [](ArrayAttr attrs) {
    return attrs && llvm::any_of(attrs, [](Attribute a) {
             auto dict = dyn_cast<DictionaryAttr>(a);
             return dict && !dict.empty();
           });
  };
  return nonEmpty(func.getArgAttrsAttr()) || nonEmpty(func.getResAttrsAttr());
}

/// Whether a function computes on f32 values, the only ones the pass
/// rewrites (an f64 or integer function is left exactly as it is).
bool touchesF32(func::FuncOp func) {
  auto isF32 = [](Type type) {
    FloatType element = shlo::getFloatElementType(type);
    return element && element.isF32();
  };
  return func.walk([&](Operation *op) {
               return llvm::any_of(op->getOperandTypes(), isF32) ||
                              llvm::any_of(op->getResultTypes(), isF32)
                          ? WalkResult::interrupt()
                          : WalkResult::advance();
             })
      .wasInterrupted();
}

/// Functions that can reach themselves through calls: never inlined.
llvm::DenseSet<func::FuncOp> recursiveFunctions(ModuleOp module,
                                                SymbolTable &symbols) {
  llvm::DenseSet<func::FuncOp> recursive;
  for (auto root : module.getOps<func::FuncOp>()) {
    llvm::DenseSet<func::FuncOp> seen;
    llvm::SmallVector<func::FuncOp> worklist = {root};
    while (!worklist.empty() && !recursive.contains(root)) {
      func::FuncOp func = worklist.pop_back_val();
      func.walk([&](func::CallOp call) {
        auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
        if (!callee)
          return;
        if (callee == root)
          recursive.insert(root);
        else if (seen.insert(callee).second)
          worklist.push_back(callee);
      });
    }
  }
  return recursive;
}

/// Every symbol some attribute refers to. (SymbolTable's own use queries
/// give up on modules with unregistered ops, which StableHLO's are here.)
llvm::DenseSet<StringAttr> referencedSymbols(ModuleOp module) {
  llvm::DenseSet<StringAttr> referenced;
  module.walk([&](Operation *op) {
    op->getAttrDictionary().walk([&](SymbolRefAttr ref) {
      referenced.insert(ref.getRootReference());
    });
  });
  return referenced;
}

/// The location of an op inlined from a callee at `callLoc`: the call's
/// name path with the op's own appended (so the op is in its call site's
/// scope and phase: a specialised body's ops are named relative to it,
/// `loc("mul")`), and the op's frames, if it has any, called from the
/// call's frames, as MLIR's inliner does. The user's line is then the
/// call's when the callee is library code.
Location inlinedLoc(Location calleeLoc, Location callLoc) {
  MLIRContext *context = callLoc.getContext();
  if (isa<UnknownLoc>(calleeLoc))
    return callLoc;
  auto callName = dyn_cast<NameLoc>(callLoc);
  auto calleeName = dyn_cast<NameLoc>(calleeLoc);
  Location callFrames = callName ? callName.getChildLoc() : callLoc;
  Location calleeFrames = calleeName ? calleeName.getChildLoc() : calleeLoc;
  Location frames = isa<UnknownLoc>(calleeFrames)
                        ? callFrames
                        : CallSiteLoc::get(calleeFrames, callFrames);
  if (!callName && !calleeName)
    return frames;
  std::string name = callName ? callName.getName().str() : "";
  if (calleeName)
    name += (name.empty() ? "" : "/") + calleeName.getName().str();
  return NameLoc::get(StringAttr::get(context, name), frames);
}

/// Replaces `call` with a copy of `callee`'s body, located at the call.
void inlineCall(func::CallOp call, func::FuncOp callee) {
  Block &body = callee.getBody().front();
  IRMapping mapping;
  mapping.map(body.getArguments(), call.getOperands());
  OpBuilder builder(call);
  for (Operation &op : body.without_terminator())
    builder.clone(op, mapping)->walk([&](Operation *inlined) {
      inlined->setLoc(inlinedLoc(inlined->getLoc(), call.getLoc()));
    });
  for (auto [result, returned] :
       llvm::zip(call.getResults(), body.getTerminator()->getOperands()))
    result.replaceAllUsesWith(mapping.lookupOrDefault(returned));
  call.erase();
}

} // namespace

int64_t mlir::amp::inlinePrivateCalls(ModuleOp module) {
  SymbolTable symbols(module);
  llvm::DenseSet<func::FuncOp> recursive = recursiveFunctions(module, symbols);
  // Per callee, computed once (inlining never changes a callee's body).
  llvm::DenseMap<func::FuncOp, bool> inlinableCallee;
  auto inlinable = [&](func::CallOp call) -> func::FuncOp {
    auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
    if (!callee || !call->getDiscardableAttrDictionary().empty())
      return nullptr;
    auto [it, inserted] = inlinableCallee.try_emplace(callee, false);
    if (inserted)
      it->second = !callee.isExternal() && callee.isPrivate() &&
                   llvm::hasSingleElement(callee.getBody()) &&
                   !hasArgOrResultAttrs(callee) &&
                   !recursive.contains(callee) && touchesF32(callee);
    return it->second ? callee : nullptr;
  };

  llvm::SmallVector<func::FuncOp> inlined;
  int64_t count = 0;
  for (bool changed = true; changed;) {
    changed = false;
    llvm::SmallVector<func::CallOp> calls;
    module.walk([&](func::CallOp call) { calls.push_back(call); });
    for (func::CallOp call : calls) {
      func::FuncOp callee = inlinable(call);
      if (!callee)
        continue;
      inlineCall(call, callee);
      if (!llvm::is_contained(inlined, callee))
        inlined.push_back(callee);
      ++count;
      changed = true;
    }
  }
  // Only the callees inlined here: a private function that was unused
  // before stays, as the rest of the module does.
  // (A callee's own calls keep its callees alive until it is erased.)
  for (bool erased = true; erased;) {
    erased = false;
    llvm::DenseSet<StringAttr> referenced = referencedSymbols(module);
    for (func::FuncOp &callee : inlined)
      if (callee && !referenced.contains(callee.getSymNameAttr())) {
        callee.erase();
        callee = nullptr;
        erased = true;
      }
  }
  return count;
}
