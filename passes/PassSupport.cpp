//===- PassSupport.cpp - How every pass starts ----------------------------===//

#include "PassSupport.h"

using namespace mlir;

llvm::Error mlir::amp::invalidOption(llvm::StringRef name,
                                     llvm::Error error) {
  return llvm::createStringError("invalid option '" + name +
                                 "': " + llvm::toString(std::move(error)));
}

void mlir::amp::OptionCheck::keep(llvm::Error error) {
  if (error)
    this->error = llvm::toString(std::move(error));
}

LogicalResult mlir::amp::OptionCheck::report(ModuleOp module) const {
  if (error.empty())
    return success();
  module.emitError() << error;
  return failure();
}

func::FuncOp mlir::amp::entryFunction(ModuleOp module) {
  auto main = module.lookupSymbol<func::FuncOp>("main");
  if (!main || !main.isPublic() || main.isExternal())
    return {};
  return main;
}

FailureOr<func::FuncOp>
mlir::amp::requireEntryFunction(ModuleOp module, const llvm::Twine &error) {
  if (func::FuncOp main = entryFunction(module))
    return main;
  module.emitError() << error;
  return failure();
}
