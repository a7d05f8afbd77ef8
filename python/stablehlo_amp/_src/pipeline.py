"""Text to text: jaxlib prints, the C++ passes rewrite, jaxlib verifies."""

from __future__ import annotations

import dataclasses
import io
import re
from typing import Iterable, Sequence

import jax
from jax._src.interpreters import mlir as jax_mlir
from jax.extend.mlir import ir

from stablehlo_amp import _amp
from stablehlo_amp._src.policy import Policy, as_policy, check_level
from stablehlo_amp._src.report import Report

TARGETS = ("cpu", "gpu", "tpu")
EMIT_FORMATS = ("pretty", "generic", "bytecode")
DOT_RESULTS = ("f32", "compute")


class AmpError(Exception):
  """Base of the errors stablehlo-amp raises; `diagnostics` lists them."""

  def __init__(self, message: str, diagnostics: Sequence[str] = ()):
    super().__init__(message)
    self.diagnostics = tuple(diagnostics)


class InvalidIRError(AmpError):
  """The input is not a module jaxlib can parse and verify."""


class RewriteError(AmpError):
  """A pass rejected the module (bad option or unsupported input)."""


class VerificationError(AmpError):
  """The rewritten module failed jaxlib's StableHLO verifier.

  This is a bug in stablehlo-amp; the message names the op, its location and
  the pipeline that produced it, so it can be reported as it is.
  """


def ir_context() -> ir.Context:
  """A context with every dialect JAX emits (StableHLO, CHLO, Shardy, MHLO)."""
  return jax_mlir.make_ir_context()


def default_target() -> str:
  """The backend JAX runs on here: cpu, gpu or tpu."""
  backend = jax.default_backend()
  return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


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


def parse_module(source: str | bytes, context: ir.Context,
                 source_name: str = "<module>") -> ir.Module:
  """Parses pretty, generic or bytecode StableHLO and verifies it."""
  if isinstance(source, str) and not source.strip():
    raise InvalidIRError(f"{source_name}: error: empty input, expected a "
                         "StableHLO module")
  try:
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


def build_pipeline(policy: Policy, *, level: str = "O2", target: str = "cpu",
                   dot_result: str = "f32", keep_f32: Iterable[str] = (),
                   force_compute: Iterable[str] = (),
                   annotate: bool = False, loss_scale: str | None = None) -> str:
  """The pass pipeline `amp.rewrite` and `amp-opt` run; `loss_scale` is an
  `amp-loss-scale{...}` pass to run after the precision rewrite."""
  options = [f"policy={policy}", f"level={level}", f"target={target}",
             f"dot-result={dot_result}"]
  keep_f32, force_compute = list(keep_f32), list(force_compute)
  if keep_f32:
    options.append("keep-f32=" + ",".join(keep_f32))
  if force_compute:
    options.append("force-compute=" + ",".join(force_compute))
  if annotate:
    options.append("annotate=true")
  passes = ["amp-insert-converts{" + " ".join(options) + "}"]
  if level == "O0" and not loss_scale:
    # O0 is the identity: not even the convert cleanup runs.
    return "builtin.module(" + passes[0] + ")"
  if loss_scale:
    passes.append(loss_scale)
  passes.append("amp-simplify-converts")
  return "builtin.module(" + ",".join(passes) + ")"


def _check_choice(name: str, value: str, accepted: Sequence[str]) -> str:
  if value not in accepted:
    raise ValueError(f"unknown {name} {value!r} (accepted: "
                     f"{', '.join(accepted)})")
  return value


@dataclasses.dataclass(frozen=True)
class RewriteResult:
  """A rewritten, verified module and what was decided for it."""
  module: ir.Module
  report: Report | None
  pipeline: str
  diagnostics: tuple[str, ...] = ()  # warnings the passes emitted

  def text(self, emit: str = "pretty", debug_info: bool = False) -> str | bytes:
    _check_choice("emit format", emit, EMIT_FORMATS)
    if emit == "bytecode":
      buffer = io.BytesIO()
      self.module.operation.write_bytecode(buffer)
      return buffer.getvalue()
    return self.module.operation.get_asm(
        print_generic_op_form=emit == "generic", enable_debug_info=debug_info)


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


def run_pipeline(module: ir.Module, pipeline: str, *, context: ir.Context,
                 source_name: str, report_info: dict | None) -> RewriteResult:
  """Runs `pipeline` on `module` in process and verifies the result."""
  generic = _with_source_name(
      module.operation.get_asm(print_generic_op_form=True,
                               enable_debug_info=True), source_name)
  ok, output, report_json, diagnostics = _amp.run_pipeline(
      generic, pipeline, source_name, report_info is not None)
  diagnostics = [_format_pass_diagnostic(d, source_name) for d in diagnostics]
  if not ok:
    raise RewriteError("\n".join(diagnostics) or
                       f"{source_name}: error: the pipeline failed",
                       diagnostics)
  try:
    rewritten = ir.Module.parse(output, context)
    rewritten.operation.verify()
  except ir.MLIRError as error:
    details = [_format_diagnostic(d, source_name)
               for d in error.error_diagnostics] or [error.message]
    raise VerificationError(
        "stablehlo-amp produced a module that fails StableHLO verification "
        f"(pipeline {pipeline}); please report this:\n" + "\n".join(details),
        details) from None
  report = None
  if report_info is not None:
    report = Report.from_json(report_json, **report_info)
  return RewriteResult(rewritten, report, pipeline, tuple(diagnostics))


def mark_arguments(module: ir.Module, marks: dict[int, list[str]]) -> None:
  """Sets unit attributes on arguments of the public `main`: the markers the
  passes read (`amp.keep_dtype`, `amp.loss_seed`) and consume."""
  if not marks:
    return
  for op in module.body.operations:
    if (op.operation.name == "func.func" and
        ir.StringAttr(op.attributes["sym_name"]).value == "main"):
      main = op
      break
  else:
    raise RewriteError("module has no main function to mark arguments of")
  count = len(ir.FunctionType(
      ir.TypeAttr(main.attributes["function_type"]).value).inputs)
  old = (ir.ArrayAttr(main.attributes["arg_attrs"])
         if "arg_attrs" in main.attributes else None)
  new = []
  for i in range(count):
    entries = {}
    if old is not None:
      attrs = ir.DictAttr(old[i])
      entries = {attrs[j].name: attrs[j].attr for j in range(len(attrs))}
    for name in marks.get(i, ()):
      entries[name] = ir.UnitAttr.get()
    new.append(ir.DictAttr.get(entries))
  main.attributes["arg_attrs"] = ir.ArrayAttr.get(new)


def rewrite_module(source: str | bytes | ir.Module, policy: Policy | str, *,
                   level: str = "O2", target: str | None = None,
                   dot_result: str = "f32", keep_f32: Iterable[str] = (),
                   force_compute: Iterable[str] = (), report: bool = True,
                   source_name: str = "<module>",
                   context: ir.Context | None = None,
                   loss_scale: str | None = None) -> RewriteResult:
  """Rewrites a StableHLO module to `policy`; see `stablehlo_amp.rewrite`.

  `source` may be text, bytecode or a jaxlib `ir.Module` (which must live in
  `context`)."""
  policy = as_policy(policy)
  level = check_level(level)
  target = _check_choice("target", target or default_target(), TARGETS)
  _check_choice("dot result", dot_result, DOT_RESULTS)
  context = context or ir_context()
  with context:
    module = (source if isinstance(source, ir.Module)
              else parse_module(source, context, source_name))
    pipeline = build_pipeline(policy, level=level, target=target,
                              dot_result=dot_result, keep_f32=keep_f32,
                              force_compute=force_compute, annotate=report,
                              loss_scale=loss_scale)
    info = ({"policy": str(policy), "level": level, "target": target}
            if report else None)
    return run_pipeline(module, pipeline, context=context,
                        source_name=source_name, report_info=info)


def rewrite(mlir_text: str | bytes, policy: Policy | str = "p=f32,c=bf16,o=f32",
            **options) -> str:
  """Rewrites StableHLO text to `policy` and returns verified pretty text.

  Accepts pretty or generic text or bytecode; `options` are those of
  `amp-opt` (level, target, dot_result, keep_f32, force_compute).

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> text = jax.jit(lambda w, x: x @ w).lower(
  ...     jnp.ones((8, 8)), jnp.ones((4, 8))).as_text()
  >>> print(amp.rewrite(text, "p=f32,c=bf16,o=f32", target="gpu"))
  module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
    func.func public @main(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xf32> {jax.result_info = "result"}) {
      %0 = stablehlo.convert %arg0 : (tensor<8x8xf32>) -> tensor<8x8xbf16>
      %1 = stablehlo.convert %arg1 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
      %2 = stablehlo.dot_general %1, %0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
      return %2 : tensor<4x8xf32>
    }
  }
  <BLANKLINE>
  """
  options.setdefault("report", False)
  return rewrite_module(mlir_text, policy, **options).text()
