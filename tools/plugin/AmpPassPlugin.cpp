//===- AmpPassPlugin.cpp - stablehlo-amp passes as an mlir-opt plugin -----===//
//
//   mlir-opt --load-pass-plugin=AmpPassPlugin.so --allow-unregistered-dialect \
//     --pass-pipeline='builtin.module(amp-insert-converts{policy=p=f32,c=bf16,o=f32})'
//
//===----------------------------------------------------------------------===//

#include "Passes.h"

#include "mlir/Tools/Plugins/PassPlugin.h"
#include "llvm/Config/llvm-config.h"

extern "C" __attribute__((visibility("default"))) ::mlir::PassPluginLibraryInfo
mlirGetPassPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "StablehloAmp", LLVM_VERSION_STRING,
          []() { ::mlir::amp::registerAmpPasses(); }};
}
