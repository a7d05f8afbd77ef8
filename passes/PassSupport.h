//===- PassSupport.h - How every pass starts --------------------*- C++ -*-===//
//
// Every pass starts the same way. Its options are read once, in
// initialize(), into the pass's own parsed form; an invalid one is kept and
// reported from runOnOperation on the module (initialize has no location
// to report it at). Then, if the pass needs one, it finds the entry
// function: the module's public function `main` with a body.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_PASSSUPPORT_H
#define STABLEHLO_AMP_PASSSUPPORT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <string>

namespace mlir::amp {

/// The error of an invalid option: "invalid option 'NAME': <error>".
llvm::Error invalidOption(llvm::StringRef name, llvm::Error error);

/// Stores `parsed` in `into`, or returns its error as invalidOption(name).
template <typename T>
llvm::Error readOption(llvm::StringRef name, llvm::Expected<T> parsed,
                       T &into) {
  if (!parsed)
    return invalidOption(name, parsed.takeError());
  into = std::move(*parsed);
  return llvm::Error::success();
}

/// What initialize() made of a pass's options: nothing to say, or the first
/// invalid option's error, for runOnOperation to report.
class OptionCheck {
public:
  /// Keeps `error` (the pass's parseOptions()), if it is one.
  void keep(llvm::Error error);
  /// Emits the kept error on `module`: failure when there is one.
  LogicalResult report(ModuleOp module) const;

private:
  std::string error;
};

/// The module's entry function: its public function `main` with a body, or
/// null when it has none.
func::FuncOp entryFunction(ModuleOp module);

/// entryFunction(module), or failure with `error` emitted on the module
/// when it has none.
FailureOr<func::FuncOp> requireEntryFunction(ModuleOp module,
                                             const llvm::Twine &error);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_PASSSUPPORT_H
