"""Text to text: jaxlib prints, the C++ passes rewrite, jaxlib verifies."""

from __future__ import annotations

import dataclasses
import difflib
import re
import textwrap
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.extend.mlir import ir

from stablehlo_amp import _amp
from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src.policy import Policy, as_policy, dtype_name
from stablehlo_amp._src.report import Report

EMIT_FORMATS = ("pretty", "generic", "bytecode", "portable")


class AmpError(Exception):
  """Base of the errors stablehlo-amp raises; `diagnostics` lists them."""

  def __init__(self, message: str, diagnostics: Sequence[str] = ()):
    super().__init__(message)
    self.diagnostics = tuple(diagnostics)


class InvalidIRError(AmpError):
  """The input is not a module jaxlib can parse and verify."""


class RewriteError(AmpError):
  """A pass rejected the module (bad option or unsupported input)."""


class OptionError(RewriteError):
  """An option does not fit the module (``keep_gemms`` names a GEMM it does
  not have): the caller's mistake, raised wherever the rewrite runs, never
  worked around by running the original program."""


class VerificationError(AmpError):
  """The rewritten module failed jaxlib's StableHLO verifier.

  This is a bug in stablehlo-amp; the message names the op, its location and
  the pipeline that produced it, so it can be reported as it is.
  """


def ir_context() -> ir.Context:
  """A context with every dialect JAX emits (StableHLO, CHLO, Shardy, MHLO)."""
  return jax_compat.make_ir_context()


def default_target() -> str:
  """The backend JAX runs on here, as a target name."""
  backend = jax.default_backend()
  return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


# -- options ---------------------------------------------------------------------


def _names(value: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
  """A string is one name; anything else an iterable of names."""
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  try:
    names = tuple(value)
  except TypeError:
    raise TypeError(f"{what} must be a string or a list of strings, got "
                    f"{type(value).__name__}") from None
  for name in names:
    if not isinstance(name, str):
      raise TypeError(f"{what} must contain strings, got {name!r}")
  return names


def unknown_options_message(unknown: Sequence[str],
                            accepted: Iterable[str],
                            stateful: Iterable[str] = ()) -> str:
  """"unexpected options: NAME (nearest: ...; accepted: ...)": what every
  entry point says of a keyword that is none of its options."""
  accepted, stateful = sorted(accepted), set(stateful)
  nearest = sorted({n for name in unknown
                    for n in difflib.get_close_matches(name, accepted, n=2)})
  needs_state = sorted(set(unknown) & stateful)
  return (f"unexpected options: {', '.join(sorted(unknown))} ("
          + (f"{', '.join(needs_state)} configure{'s' * (len(needs_state) == 1)}"
             " what only amp.train_step has: the state it carries across "
             "steps, its checks; " if needs_state else "")
          + (f"nearest: {', '.join(nearest)}; " if nearest else "")
          + f"accepted: {', '.join(accepted)})")


def accepted_options(stateful: bool) -> list[str]:
  """The rewrite options an entry point takes by keyword: every option of
  the contract, less those that configure state when it carries none."""
  return [name for name, spec in contract.options().items()
          if not spec["internal"] and (stateful or not spec["stateful"])]


def check_option_names(given: Iterable[str] | Mapping[str, Any],
                       stateful: bool) -> None:
  """TypeError naming the keywords that are none of the rewrite options an
  entry point takes (`stateful`: one that carries state across steps);
  ValueError for a value that needs that state (``fp8_scaling="delayed"``)
  where the entry point carries none."""
  accepted = accepted_options(stateful)
  unknown = sorted(set(given) - set(accepted))
  if unknown:
    raise TypeError(unknown_options_message(
        unknown, accepted, accepted_options(stateful=True)))
  if not stateful and isinstance(given, Mapping):
    check_stateless_values(given)


def check_stateless_values(given: Mapping[str, Any]) -> None:
  """ValueError for an option value that configures state across steps
  (the contract's ``stateful_value``), given to an entry point that
  carries none."""
  for name, value in given.items():
    spec = contract.options().get(name, {})
    needs_state = spec.get("stateful_value")
    if needs_state and isinstance(value, str) and value.strip() == needs_state:
      others = [c for c in spec.get("choices", ()) if c != needs_state]
      raise ValueError(
          f"{name}={value!r} keeps state across steps, which only "
          f"amp.train_step carries; here use {', '.join(others)}")


def returns_measurements(options: "RewriteOptions") -> bool:
  """Whether a program built with `options` returns measurements beside
  its own results (an option value among the contract's
  ``measured_values``: ``numerics="stats"``, ``"provenance"``)."""
  return any(getattr(options, name) in spec.get("measured_values", ())
             for name, spec in contract.options().items()
             if not spec["internal"])


def options_help(stateful: bool, indent: int = 0) -> str:
  """One line per option an entry point takes: its name, the pass's help,
  its choices and default; for docstrings."""
  lines = []
  for name in accepted_options(stateful):
    spec = contract.options()[name]
    low = (f" (default with p=bf16: {spec['bf16_params_default']})"
           if stateful and "bf16_params_default" in spec else "")
    lines += textwrap.wrap(f"``{name}``: {spec['help']}{low}",
                           80, initial_indent=" " * indent,
                           subsequent_indent=" " * (indent + 2),
                           break_on_hyphens=False)
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class RewriteOptions:
  """Validated pass options (besides the policy), by their Python names.

  Which options exist, their kinds, choices, defaults and help come from
  the contract (`passes/Contract.cpp`; `amp-opt --help` lists them): read
  one as an attribute (``options.storage``). Build with
  `RewriteOptions.make`, which checks every value with the pass's own
  parsers (through the extension) and raises ValueError naming the accepted
  values; a target left out is the backend JAX runs on.
  """
  values: tuple[tuple[str, Any], ...]

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__"):
      raise AttributeError(name)
    for key, value in object.__getattribute__(self, "values"):
      if key == name:
        return value
    raise AttributeError(f"no rewrite option {name!r} (options: "
                         f"{', '.join(contract.options())})")

  @classmethod
  def make(cls, **given: Any) -> "RewriteOptions":
    check_option_names(given, stateful=True)
    table = contract.options()
    # The target first: other options' defaults and spellings depend on it.
    target_name = contract.target_option()
    target = _amp.canonical_option(
        target_name, _choice_text(target_name, given.get(target_name) or
                                  default_target()), "gpu")
    values = {name: (target if name == target_name else
                     _checked(name, spec, given.get(name), target))
              for name, spec in table.items()}
    both = sorted(set(values["keep_f32"]) & set(values["force_compute"]))
    if both:
      raise ValueError(f"ops named in both keep_f32 and force_compute: "
                       f"{', '.join(both)}")
    return cls(tuple(values.items()))

  def check_policy(self, policy: Any) -> None:
    """ValueError for a value `policy` cannot take: a reduce_dtype naming
    a dtype that is not f32 nor the compute dtype (the pass's own check,
    made before anything is traced)."""
    reduce = self.reduce_dtype
    policy = as_policy(policy)
    if (self.fp8_scaling == contract.values("fp8_scaling").mxfp8 and
        policy.gemm == contract.values("gemm").f8e5m2):
      raise ValueError(
          f"fp8_scaling='mxfp8' stores E4M3 data and policy {policy} asks "
          "for e5m2 operands: use gemm=f8 or gemm=f8e4m3fn with it")
    no_fp8 = policy.gemm == contract.values("gemm").compute
    if self.keep_gemms and no_fp8:
      raise ValueError(
          f"keep_gemms keeps FP8 GEMMs in the compute dtype, and policy "
          f"{policy} has none: add gemm=f8 (for example "
          "p=f32,c=bf16,o=f32,gemm=f8)")
    scaling = contract.options()["fp8_scaling"]["default"]
    if self.fp8_scaling != scaling and no_fp8:
      raise ValueError(
          f"fp8_scaling={self.fp8_scaling!r} scales the operands of FP8 "
          f"GEMMs, and policy {policy} has none: add gemm=f8 (for example "
          "p=f32,c=bf16,o=f32,gemm=f8)")
    f8 = contract.values("scopes").f8
    if (any(entry.rpartition("=")[2] == f8 for entry in self.scopes) and
        policy.gemm == contract.values("gemm").compute):
      raise ValueError(
          f"invalid option 'scopes': {f8} puts a scope's GEMMs in FP8, and "
          f"policy {policy} has none: add gemm=f8 to the policy (for "
          "example p=f32,c=bf16,o=f32,gemm=f8)")
    compute = dtype_name(policy.compute_dtype)
    named = contract.values("reduce_dtype")
    if reduce not in (named.f32, named.compute, compute):
      raise ValueError(
          f"reduce_dtype={reduce!r} is neither f32 nor the compute dtype of "
          f"policy {policy} ({compute}): use 'f32', {compute!r} or "
          "'compute'")

  def replace(self, **changes: Any) -> "RewriteOptions":
    values = dict(self.values)
    unknown = sorted(set(changes) - set(values))
    if unknown:
      raise TypeError(unknown_options_message(unknown, values))
    values.update(changes)
    return RewriteOptions(tuple(values.items()))

  def pass_options(self, pass_name: str) -> dict[str, Any]:
    """The options of `pass_name`, by their pass spellings."""
    table = contract.options()
    return {table[name]["option"]: value for name, value in self.values
            if pass_name in (table[name]["pass"],
                             table[name].get("also_pass")) and
            table[name]["option"]}

  def runs(self, pass_name: str) -> bool:
    """False when an option switches `pass_name` off (rematerialize=False)."""
    table = contract.options()
    return all(value for name, value in self.values
               if table[name]["pass"] == pass_name and
               not table[name]["option"])


def _choice_text(name: str, value: Any) -> str:
  if not isinstance(value, str):
    raise TypeError(f"{name} must be a string, got {type(value).__name__}")
  return value


def _checked(name: str, spec: Mapping[str, Any], value: Any,
             target: str) -> Any:
  """`value` of option `name` (None: its default on `target`), checked and
  in its canonical spelling, by the option's kind in the contract."""
  if value is None:
    value = spec.get("target_defaults", {}).get(target, spec["default"])
  kind = spec["kind"]
  if kind == "choice":
    return _amp.canonical_option(name, _choice_text(name, value), target)
  if kind == "op_names":
    return tuple(_amp.check_op_names(name, list(_names(value, name))))
  if kind == "scopes":
    return _scope_entries(name, value)
  if kind == "bool":
    if not isinstance(value, bool):
      raise TypeError(f"{name} must be True or False, got {value!r}")
    return value
  if kind == "int":
    if (isinstance(value, bool) or not isinstance(value, int) or
        value < spec["minimum"]):
      raise ValueError(f"{name} must be an integer of at least "
                       f"{spec['minimum']}, got {value!r}")
    return value
  if kind == "ints":
    if isinstance(value, int) and not isinstance(value, bool):
      value = (value,)
    if not isinstance(value, (tuple, list)) or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer))
        for v in value):
      raise ValueError(f"{name} must be a sequence of integers, got "
                       f"{value!r}")
    values = tuple(int(v) for v in value)
    if any(v < spec["minimum"] for v in values):
      raise ValueError(f"{name} must be integers of at least "
                       f"{spec['minimum']}, got {values}")
    return values
  raise AssertionError(f"option {name} has a kind Python does not know: "
                       f"{kind}")


def _scope_entries(name: str, value: Any) -> tuple[str, ...]:
  """``{pattern: choice}`` as the pass's ``PATTERN=CHOICE`` entries, each
  checked by the pass's own parser (the choice, the regular expression)."""
  if isinstance(value, (tuple, list)) and all(
      isinstance(v, str) for v in value):
    return tuple(_amp.check_scopes(list(value)))  # entries already
  if not isinstance(value, Mapping):
    raise TypeError(f"{name} must be a dict {{pattern: choice}}, got "
                    f"{type(value).__name__}")
  for pattern, choice in value.items():
    if not isinstance(pattern, str) or not isinstance(choice, str):
      raise TypeError(f"{name} maps patterns (str) to choices (str), got "
                      f"{pattern!r}: {choice!r}")
    if "=" in choice:
      raise ValueError(f"invalid option '{name}': unknown choice "
                       f"{choice!r} for '{pattern}' (accepted: "
                       f"{', '.join(contract.options()[name]['choices'])})")
  return tuple(_amp.check_scopes([f"{pattern}={choice}"
                                  for pattern, choice in value.items()]))


def _pass_text(name: str, options: dict[str, Any]) -> str:
  """`name{opt=value ...}` with the options' pass spellings, each checked
  against the contract."""
  known = contract.document()["passes"][name]["options"]
  parts = []
  for key, value in options.items():
    option = key.replace("_", "-")
    if option not in known:
      raise KeyError(f"{name} has no option {option!r}")
    if isinstance(value, (tuple, list)):
      if not value:
        continue
      value = ",".join(str(v) for v in value)
    elif isinstance(value, bool):
      value = "true" if value else "false"
    parts.append(f"{option}={value}")
  return name + ("{" + " ".join(parts) + "}" if parts else "")


def build_pipeline(policy: Policy, options: RewriteOptions, *,
                   report: bool = False,
                   loss_scale: dict[str, Any] | None = None) -> str:
  """The pass pipeline `amp.rewrite` and `amp-opt` run; `loss_scale` holds
  the options of an `amp-loss-scale` pass to run after the precision
  rewrite."""
  insert = _pass_text(contract.INSERT_CONVERTS,
                      dict(policy=str(policy),
                           **options.pass_options(contract.INSERT_CONVERTS),
                           report=report))
  identity = options.level == contract.values("level").O0
  if identity and not loss_scale:
    # O0 is the identity: not even the convert cleanup runs.
    return f"builtin.module({insert})"
  passes = [insert]
  if policy.gemm != contract.values("gemm").compute and not identity:
    passes.append(_pass_text(contract.FP8_GEMMS, dict(
        gemm=policy.gemm, **options.pass_options(contract.FP8_GEMMS),
        mx_form=jax_compat.mx_form(options.target), report=report)))
  numerics = _pass_text(contract.NUMERICS,
                        options.pass_options(contract.NUMERICS))
  # The statistics measure the roundings amp-fp8-gemms made; provenance
  # checks what the step finally computes (rematerialized values too), so
  # it runs last but the loss scaling.
  if options.numerics == contract.values("numerics").stats:
    passes.append(numerics)
  if options.runs(contract.REMATERIALIZE) and not identity:
    passes.append(_pass_text(contract.REMATERIALIZE,
                             options.pass_options(contract.REMATERIALIZE)))
  round_state = options.pass_options(contract.ROUND_STATE)
  if loss_scale and round_state != {
      name: contract.default(contract.ROUND_STATE, name)
      for name in round_state}:
    passes.append(_pass_text(contract.ROUND_STATE, round_state))
  if options.numerics == contract.values("numerics").provenance:
    passes.append(numerics)
  if loss_scale:
    passes.append(_pass_text(contract.LOSS_SCALE, {
        **loss_scale, **options.pass_options(contract.LOSS_SCALE)}))
  passes.append(contract.SIMPLIFY_CONVERTS)
  return "builtin.module(" + ",".join(passes) + ")"


# -- parsing and diagnostics -----------------------------------------------------

_LOC = re.compile(r'^loc\("(?P<file>[^"]*)":(?P<line>\d+):(?P<col>\d+)\)$')


def _format_diagnostic(diagnostic, source_name: str,
                       severity: str = "error") -> str:
  """`file:line:col: error: message`, the way compilers say it."""
  location = str(diagnostic.location)
  match = _LOC.match(location)
  if match:
    file = match["file"]
    if file in ("-", ""):
      file = source_name
    where = f"{file}:{match['line']}:{match['col']}"
  else:
    where = location
  lines = [f"{where}: {severity}: {diagnostic.message}"]
  for note in getattr(diagnostic, "notes", ()):
    lines.append(_format_diagnostic(note, source_name, "note"))
  return "\n".join(lines)


@dataclasses.dataclass
class SourceForm:
  """How the input came: text, MLIR bytecode, or a portable artifact (VHLO)
  for StableHLO `version`."""
  kind: str = "text"
  version: str | None = None


def parse_module(source: str | bytes, context: ir.Context,
                 source_name: str = "<module>",
                 form: SourceForm | None = None) -> ir.Module:
  """Parses pretty, generic, bytecode or portable-artifact StableHLO and
  verifies it; `form`, if given, is filled in with what the input was."""
  if isinstance(source, str) and not source.strip():
    raise InvalidIRError(f"{source_name}: error: empty input, expected a "
                         "StableHLO module")
  form = form if form is not None else SourceForm()
  version = (jax_compat.portable_artifact_version(source)
             if isinstance(source, bytes) else None)
  if isinstance(source, bytes) and not version and _is_serialized_exported(
      source):
    raise InvalidIRError(
        f"{source_name}: error: this is a serialized jax.export.Exported "
        "(Exported.serialize(), a flatbuffer around the module), not a "
        "StableHLO module. Give its module instead: write "
        "jax.export.deserialize(data).mlir_module_serialized to a file (a "
        "portable artifact), or jax.export.deserialize(data).mlir_module() "
        "as text")
  try:
    if version:
      form.kind, form.version = "portable", version
      module = jax_compat.deserialize_portable_artifact(source)
    else:
      form.kind = "bytecode" if isinstance(source, bytes) else "text"
      module = ir.Module.parse(source, context)
    module.operation.verify()
  except ir.MLIRError as error:
    diagnostics = [_format_diagnostic(d, source_name)
                   for d in error.error_diagnostics]
    if not diagnostics:
      diagnostics = [f"{source_name}: error: {error.message}"]
    raise InvalidIRError("\n".join(diagnostics), diagnostics) from None
  except UnicodeDecodeError:
    raise InvalidIRError(f"{source_name}: error: input is neither MLIR text "
                         "nor MLIR bytecode") from None
  return module


def _is_serialized_exported(data: bytes) -> bool:
  """Whether `data` is `Exported.serialize()`'s flatbuffer: not MLIR
  bytecode itself, but holding a portable artifact as a byte vector (a
  little-endian uint32 length, then the bytes)."""
  if data.startswith(b"ML\xefR"):
    return False
  start = data.find(b"ML\xefR")
  if start < 4:
    return False
  length = int.from_bytes(data[start - 4:start], "little")
  return (start + length <= len(data) and jax_compat.portable_artifact_version(
      data[start:start + length]) is not None)


_PASS_DIAGNOSTIC = re.compile(
    r'^loc\("(?P<file>(?:[^"\\]|\\.)*)":(?P<line>\d+):(?P<col>\d+)\): '
    r'(?P<rest>.*)$', re.S)


def _format_pass_diagnostic(text: str, source_name: str) -> str:
  """The C++ side prints `loc("file":l:c): error: ...`; say
  `file:l:c: error: ...` like every other message (no position when the
  diagnostic is about the whole module)."""
  match = _PASS_DIAGNOSTIC.match(text)
  if not match:
    return text if ": " in text.split("\n")[0] else f"{source_name}: {text}"
  file = match["file"]
  if file in ("-", ""):
    file = source_name
  if match["line"] == "0":
    return f"{file}: {match['rest']}"
  return f"{file}:{match['line']}:{match['col']}: {match['rest']}"


def _with_source_name(generic: str, source_name: str) -> str:
  """jaxlib parses text under the file name "-"; name the real source in the
  locations instead, so diagnostics and --debug-info output point at it."""
  if source_name in ("-", "") or source_name.startswith("<"):
    return generic
  escaped = source_name.replace("\\", "\\\\").replace('"', '\\"')
  return generic.replace('loc("-":', f'loc("{escaped}":')


# -- running ---------------------------------------------------------------------


class RewriteResult:
  """A rewritten, verified module and what was decided for it.

  The report is built only when asked for (`report` is a property): a
  rewrite does not pay for it.
  """

  def __init__(self, module: ir.Module, pipeline: str,
               diagnostics: Sequence[str] = (),
               report: Report | None = None,
               make_report: Callable[[], Report] | None = None,
               form: SourceForm | None = None):
    self.module = module
    self.pipeline = pipeline
    self.diagnostics = tuple(diagnostics)
    self._report = report
    self._make_report = make_report
    self.form = form or SourceForm()
    self.calibration = None  # set by calibration: what it kept and why
    # Whether a decision depends on the partition count the module was
    # rewritten for (`mhlo.num_partitions`; amp-insert-converts).
    self.partition_dependent = False

  @property
  def report(self) -> Report | None:
    if self._report is None and self._make_report is not None:
      self._report = self._make_report()
    return self._report

  def text(self, emit: str = "pretty", debug_info: bool = False) -> str | bytes:
    """The module as `emit`: pretty or generic text, MLIR bytecode, or a
    portable artifact (for the input's StableHLO version if it was one)."""
    if emit not in EMIT_FORMATS:
      raise ValueError(f"unknown emit format {emit!r} (accepted: "
                       f"{', '.join(EMIT_FORMATS)})")
    if emit == "portable":
      version = self.form.version or jax_compat.current_stablehlo_version()
      return jax_compat.serialize_portable_artifact(self.module, version)
    if emit == "bytecode":
      return jax_compat.bytecode_of(self.module)
    return self.module.operation.get_asm(
        print_generic_op_form=emit == "generic", enable_debug_info=debug_info)


def generic_text(module: ir.Module, source_name: str) -> str:
  return _with_source_name(
      module.operation.get_asm(print_generic_op_form=True,
                               enable_debug_info=True), source_name)


def _run_passes(generic: str, pipeline: str, *, source_name: str,
                report: bool) -> tuple[str, str, list[str]]:
  """(output text, report JSON, diagnostics) of the C++ pipeline."""
  ok, output, report_json, diagnostics = _amp.run_pipeline(
      generic, pipeline, source_name, report)
  diagnostics = [_format_pass_diagnostic(d, source_name) for d in diagnostics]
  if not ok:
    error = (OptionError if any("error: invalid option '" in d
                                for d in diagnostics) else RewriteError)
    raise error("\n".join(diagnostics) or
                       f"{source_name}: error: the pipeline failed",
                       diagnostics)
  return output, report_json, diagnostics


def _run(generic: str, pipeline: str, *, context: ir.Context,
         source_name: str) -> tuple[ir.Module, list[str]]:
  output, _, diagnostics = _run_passes(generic, pipeline,
                                       source_name=source_name, report=False)
  try:
    # Parsing verifies (MLIR's verifyAfterParse; the verification-failure
    # tests of test_transform.py check it on each JAX they run on): a
    # second verify would only repeat it.
    rewritten = ir.Module.parse(output, context)
  except ir.MLIRError as error:
    details = [_format_diagnostic(d, source_name)
               for d in error.error_diagnostics] or [error.message]
    raise VerificationError(
        "stablehlo-amp produced a module that fails StableHLO verification "
        f"(pipeline {pipeline}); please report this:\n" + "\n".join(details),
        details) from None
  return rewritten, diagnostics


def run_pipeline(module: ir.Module, pipeline: str, *, context: ir.Context,
                 source_name: str, report_pipeline: str | None = None,
                 report_info: dict | None = None,
                 form: SourceForm | None = None) -> RewriteResult:
  """Runs `pipeline` on `module` in process and verifies the result.

  `report_pipeline` is the same pipeline with decisions attached; it runs
  on demand to build the report (its module is not needed again)."""
  generic = generic_text(module, source_name)
  rewritten, diagnostics = _run(generic, pipeline, context=context,
                                source_name=source_name)

  def make_report() -> Report:
    _, json_text, _ = _run_passes(generic, report_pipeline,
                                  source_name=source_name, report=True)
    return Report.from_json(json_text, **report_info)

  maker = make_report if report_pipeline else None
  result = RewriteResult(rewritten, pipeline, diagnostics,
                         make_report=maker, form=form)
  return result


def mark_arguments(module: ir.Module, marks: dict[int, list[str]],
                   result_marks: dict[int, dict[str, ir.Attribute]] | None =
                   None) -> None:
  """Sets attributes on arguments and results of the public `main`: the
  markers the passes read (`contract.attribute(...)`) and consume."""
  if not marks and not result_marks:
    return
  for op in module.body.operations:
    if (op.operation.name == "func.func" and
        ir.StringAttr(op.attributes["sym_name"]).value == "main"):
      main = op
      break
  else:
    raise RewriteError("module has no main function to mark arguments of")
  function_type = ir.FunctionType(
      ir.TypeAttr(main.attributes["function_type"]).value)

  def updated(attr_name: str, count: int, entries_by_index: dict) -> None:
    old = (ir.ArrayAttr(main.attributes[attr_name])
           if attr_name in main.attributes else None)
    new = []
    for i in range(count):
      entries = {}
      if old is not None:
        attrs = ir.DictAttr(old[i])
        entries = {attrs[j].name: attrs[j].attr for j in range(len(attrs))}
      entries.update(entries_by_index.get(i, {}))
      new.append(ir.DictAttr.get(entries))
    main.attributes[attr_name] = ir.ArrayAttr.get(new)

  if marks:
    updated("arg_attrs", len(function_type.inputs),
            {i: {name: ir.UnitAttr.get() for name in names}
             for i, names in marks.items()})
  if result_marks:
    updated("res_attrs", len(function_type.results), result_marks)


def rewrite_module(source: str | bytes | ir.Module, policy: Policy | str,
                   options: RewriteOptions | None = None, *,
                   report: bool = True,
                   source_name: str = "<module>",
                   context: ir.Context | None = None,
                   loss_scale: dict[str, Any] | None = None,
                   **option_values) -> RewriteResult:
  """Rewrites a StableHLO module to `policy`; see `stablehlo_amp.rewrite`.

  `source` may be text, bytecode, a portable artifact or a jaxlib
  `ir.Module` (which must live in `context`). Options come as a
  `RewriteOptions` or as keywords of `RewriteOptions.make`."""
  policy = as_policy(policy)
  if options is None:
    options = RewriteOptions.make(**option_values)
  elif option_values:
    raise TypeError("give options either as RewriteOptions or as keywords")
  options.check_policy(policy)
  context = context or ir_context()
  form = SourceForm()
  with context:
    module = (source if isinstance(source, ir.Module)
              else parse_module(source, context, source_name, form))
    pipeline = build_pipeline(policy, options, loss_scale=loss_scale)
    info = {"policy": str(policy), "level": options.level,
            "target": options.target}
    result = run_pipeline(
        module, pipeline, context=context, source_name=source_name,
        report_pipeline=(build_pipeline(policy, options, report=True,
                                        loss_scale=loss_scale)
                         if report else None),
        report_info=info, form=form)
    # Read and removed, like the report's annotations: the driver rewrites
    # the program again for a partitioned lowering.
    marker = contract.attribute("partition_dependent")
    attributes = result.module.operation.attributes
    if marker in attributes:
      del attributes[marker]
      result.partition_dependent = True
  return result


def rewrite(mlir_text: str | bytes,
            policy: Policy | str = contract.default_policy(),
            **options) -> str:
  """Rewrites StableHLO text to `policy` and returns verified pretty text.

  Accepts pretty or generic text, bytecode or a portable artifact; `options`
  are the rewrite options of `amp.transform` (and `amp-opt`).

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> text = jax.jit(lambda w, x: x @ w).lower(
  ...     jnp.ones((8, 8)), jnp.ones((4, 8))).as_text()
  >>> print(amp.rewrite(text, "p=f32,c=bf16,o=f32", target="gpu"))
  module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
    func.func public @main(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xf32> {jax.result_info = "result"}) {
      %0 = stablehlo.convert %arg0 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
      %1 = stablehlo.convert %arg1 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
      %2 = stablehlo.dot_general %1, %0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>
      %3 = stablehlo.convert %2 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
      return %3 : tensor<4x8xf32>
    }
  }
  <BLANKLINE>
  """
  return rewrite_module(mlir_text, policy, report=False, **options).text()
