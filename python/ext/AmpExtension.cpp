//===- AmpExtension.cpp - The passes and the contract, in process ---------===//
//
// Text in, text out: jaxlib prints the module in generic form, we parse it
// with StableHLO ops unregistered, run a pipeline and print generic form back
// for jaxlib to parse and verify. The extension also exports the contract
// (Contract.h) and the parsers and validators the Python side calls, so that
// nothing the passes define is written twice. MLIR here is linked statically
// and hidden.
//
//===----------------------------------------------------------------------===//

#include "Contract.h"
#include "Passes.h"
#include "Policy.h"
#include "Report.h"
#include "Scopes.h"
#include "StableHLO.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
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
///
/// Neither the parser nor the pass manager verifies: with StableHLO
/// unregistered, MLIR takes any one-region op for a possible symbol table and
/// rejects a `func.call` inside a reduction body. jaxlib, which knows the
/// dialect, verifies the input before and the output after.
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

  ParserConfig config(&context, /*verifyAfterParse=*/false);
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
                          "': " + llvm::StringRef(pipelineErrors).trim().str());
    return {false, "", "", diagnostics};
  }
  PassManager pm(&context, parsed->getOpAnchorName());
  static_cast<OpPassManager &>(pm) = std::move(*parsed);
  pm.enableVerifier(false);
  amp::StorageBytes before;
  if (collectReport)
    before = amp::storageBytes(*module);
  if (failed(pm.run(*module)) || failedAny)
    return {false, "", "", diagnostics};

  std::string report;
  if (collectReport)
    report = amp::collectPrecisionReport(*module, before);
  std::string output;
  llvm::raw_string_ostream os(output);
  module->print(os,
                OpPrintingFlags().printGenericOpForm().enableDebugInfo(
                    /*enable=*/true, /*prettyForm=*/false));
  return {true, output, report, diagnostics};
}

[[noreturn]] void raiseValueError(llvm::Error error) {
  throw nb::value_error(llvm::toString(std::move(error)).c_str());
}

template <typename T>
T valueOrRaise(llvm::Expected<T> value) {
  if (!value)
    raiseValueError(value.takeError());
  return std::move(*value);
}

/// A policy's four fields by role, canonical names.
std::map<std::string, std::string> parsePolicy(const std::string &text) {
  amp::Policy policy = valueOrRaise(amp::parsePolicy(text));
  return {{"param", amp::dtypeName(policy.param).str()},
          {"compute", amp::dtypeName(policy.compute).str()},
          {"output", amp::dtypeName(policy.output).str()},
          {"gemm", amp::gemmDtypeName(policy.gemm).str()},
          {"text", policy.str()}};
}

/// The canonical spelling of an entry-point option's value (the contract's
/// `options`), or ValueError naming the accepted values.
std::string canonicalOption(const std::string &name, const std::string &value,
                            const std::string &target) {
  return valueOrRaise(amp::canonicalOptionValue(name, value, target));
}

/// Qualified op names, or ValueError naming the unknown one and the nearest
/// known ones.
std::vector<std::string> checkOpNames(const std::string &option,
                                      const std::vector<std::string> &names) {
  std::vector<std::string> qualified;
  for (const std::string &name : names)
    qualified.push_back(valueOrRaise(amp::shlo::checkedOpName(option, name)));
  return qualified;
}

/// `PATTERN=CHOICE` entries of the scopes option, checked by the pass's
/// parser (choice, regular expression) and in canonical spelling, or
/// ValueError naming the bad entry.
std::vector<std::string> checkScopes(const std::vector<std::string> &entries) {
  amp::ScopeOverrides parsed = valueOrRaise(amp::ScopeOverrides::parse(entries));
  std::vector<std::string> canonical;
  for (const amp::ScopeRule &rule : parsed.entries())
    canonical.push_back(
        rule.pattern + "=" +
        amp::scopeChoiceNames()[static_cast<int>(rule.choice)].str());
  return canonical;
}

/// The loss-scale configuration of `mode` from its fields by name (the
/// contract's `loss_scale.fields`), checked by the code the pass runs, as
/// {name: value} in the contract's order with each value of its field's type.
/// ValueError names an unknown, missing or invalid field.
nb::dict lossScaleConfig(const std::string &mode, const nb::dict &fields) {
  std::vector<std::pair<std::string, double>> named;
  for (auto [key, value] : fields) {
    if (!nb::isinstance<nb::str>(key))
      throw nb::type_error("loss-scale field names must be str");
    // bool is an int to Python, but a growth interval of True is a mistake.
    if (nb::isinstance<nb::bool_>(value) ||
        !(nb::isinstance<nb::int_>(value) || nb::isinstance<nb::float_>(value)))
      throw nb::type_error(("loss-scale field '" + nb::cast<std::string>(key) +
                            "' must be a number, got " +
                            nb::cast<std::string>(nb::repr(value)))
                               .c_str());
    named.push_back({nb::cast<std::string>(key), nb::cast<double>(value)});
  }
  amp::LossScaleConfig config = valueOrRaise(amp::lossScaleConfigFromFields(
      valueOrRaise(amp::parseLossScaleMode(mode)), named));
  nb::dict result;
  for (const amp::LossScaleField &field : amp::lossScaleFields()) {
    nb::str name(field.name.data(), field.name.size());
    if (field.integer)
      result[name] = config.*field.integer;
    else
      result[name] = config.*field.real;
  }
  return result;
}

/// The canonical text of a pass pipeline, or ValueError with the parser's
/// message (unknown pass, bad option).
std::string checkPipeline(const std::string &pipeline) {
  registerOnce();
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  FailureOr<OpPassManager> parsed = parsePassPipeline(pipeline, errorStream);
  if (failed(parsed))
    throw nb::value_error(("invalid pass pipeline '" + pipeline + "': " +
                           llvm::StringRef(errors).trim().str())
                              .c_str());
  std::string text;
  llvm::raw_string_ostream os(text);
  parsed->printAsTextualPipeline(os);
  return text;
}

/// The shape optimizer-state=f8 stores a tensor of `shape` as.
std::vector<int64_t> f8StateShape(const std::vector<int64_t> &shape) {
  llvm::SmallVector<int64_t> stored =
      amp::OptimizerStateBlocks::storedShape(shape);
  return {stored.begin(), stored.end()};
}

} // namespace

NB_MODULE(_amp, m) {
  m.doc() = "stablehlo-amp passes (MLIR " LLVM_VERSION_STRING
            ", statically linked)";
  m.def("run_pipeline", &runPipeline, nb::arg("text"), nb::arg("pipeline"),
        nb::arg("source_name") = "<module>", nb::arg("report") = false,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("contract", &amp::contractJson,
        "The contract between the passes and their front ends, as JSON.");
  m.def("parse_policy", &parsePolicy, nb::arg("text"));
  m.def("canonical_option", &canonicalOption, nb::arg("name"),
        nb::arg("value"), nb::arg("target") = "gpu");
  m.def("check_op_names", &checkOpNames, nb::arg("option"), nb::arg("names"));
  m.def("check_scopes", &checkScopes, nb::arg("entries"));
  m.def("check_pipeline", &checkPipeline, nb::arg("pipeline"));
  m.def("loss_scale_config", &lossScaleConfig, nb::arg("mode"),
        nb::arg("fields"));
  m.def("f8_state_shape", &f8StateShape, nb::arg("shape"),
        "The shape opt_state_dtype='f8' stores a tensor of `shape` as.");
  m.attr("mlir_version") = LLVM_VERSION_STRING;
}
