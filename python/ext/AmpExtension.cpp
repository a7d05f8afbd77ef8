//===- AmpExtension.cpp - The passes, in process, for Python --------------===//
//
// Text in, text out: jaxlib prints the module in generic form, we parse it
// with StableHLO ops unregistered, run a pipeline and print generic form back
// for jaxlib to parse and verify. MLIR here is linked statically and hidden.
//
//===----------------------------------------------------------------------===//

#include "Passes.h"
#include "Policy.h"
#include "Report.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <mutex>

namespace nb = nanobind;
using namespace mlir;

namespace {

void registerOnce() {
  static std::once_flag flag;
  std::call_once(flag, [] { amp::registerAmpPasses(); });
}

std::string diagnosticText(Diagnostic &diag) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (!isa<UnknownLoc>(diag.getLocation()))
    os << diag.getLocation() << ": ";
  switch (diag.getSeverity()) {
  case DiagnosticSeverity::Error:
    os << "error: ";
    break;
  case DiagnosticSeverity::Warning:
    os << "warning: ";
    break;
  case DiagnosticSeverity::Note:
    os << "note: ";
    break;
  case DiagnosticSeverity::Remark:
    os << "remark: ";
    break;
  }
  os << diag;
  for (Diagnostic &note : diag.getNotes())
    os << "\n" << note.getLocation() << ": note: " << note;
  return text;
}

/// Runs `pipeline` (an anchored `builtin.module(...)` string) on `text`.
/// Returns (ok, output text, report JSON or "", diagnostics).
std::tuple<bool, std::string, std::string, std::vector<std::string>>
runPipeline(const std::string &text, const std::string &pipeline,
            const std::string &sourceName, bool collectReport) {
  registerOnce();
  DialectRegistry registry;
  registry.insert<func::FuncDialect>();
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  context.allowUnregisteredDialects();
  context.loadAllAvailableDialects();
  // Diagnostics carry locations; a dump of the whole op would bury them.
  context.printOpOnDiagnostic(false);
  std::vector<std::string> diagnostics;
  bool failedAny = false;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    if (diag.getSeverity() == DiagnosticSeverity::Error)
      failedAny = true;
    diagnostics.push_back(diagnosticText(diag));
    return success();
  });

  ParserConfig config(&context);
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(text, config, sourceName);
  if (!module)
    return {false, "", "", diagnostics};

  // The overload taking a string would nest an anchored pipeline silently.
  std::string pipelineErrors;
  llvm::raw_string_ostream errorStream(pipelineErrors);
  FailureOr<OpPassManager> parsed = parsePassPipeline(pipeline, errorStream);
  if (failed(parsed)) {
    diagnostics.push_back("error: invalid pass pipeline '" + pipeline +
                          "': " + pipelineErrors);
    return {false, "", "", diagnostics};
  }
  PassManager pm(&context, parsed->getOpAnchorName());
  static_cast<OpPassManager &>(pm) = std::move(*parsed);
  if (failed(pm.run(*module)) || failedAny)
    return {false, "", "", diagnostics};

  std::string report;
  if (collectReport)
    report = amp::collectPrecisionReport(*module);
  std::string output;
  llvm::raw_string_ostream os(output);
  module->print(os,
                OpPrintingFlags().printGenericOpForm().enableDebugInfo(
                    /*enable=*/true, /*prettyForm=*/false));
  return {true, output, report, diagnostics};
}

/// Canonical text of a policy, or ValueError naming what is wrong.
std::string canonicalPolicy(const std::string &text) {
  llvm::Expected<amp::Policy> policy = amp::parsePolicy(text);
  if (!policy)
    throw nb::value_error(llvm::toString(policy.takeError()).c_str());
  return policy->str();
}

std::string canonicalLevel(const std::string &text) {
  llvm::Expected<amp::Level> level = amp::parseLevel(text);
  if (!level)
    throw nb::value_error(llvm::toString(level.takeError()).c_str());
  return amp::levelName(*level).str();
}

} // namespace

NB_MODULE(_amp, m) {
  m.doc() = "stablehlo-amp passes (MLIR " LLVM_VERSION_STRING
            ", statically linked)";
  m.def("run_pipeline", &runPipeline, nb::arg("text"), nb::arg("pipeline"),
        nb::arg("source_name") = "<module>", nb::arg("report") = false,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("canonical_policy", &canonicalPolicy, nb::arg("text"));
  m.def("canonical_level", &canonicalLevel, nb::arg("text"));
  m.def("qualified_op_name",
        [](const std::string &name) { return amp::shlo::qualifiedOpName(name); },
        nb::arg("name"));
  m.def("policy_grammar", [] { return amp::policyGrammarHelp().str(); });
  m.attr("mlir_version") = LLVM_VERSION_STRING;
}
