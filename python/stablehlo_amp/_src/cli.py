"""`amp-opt`: rewrite a StableHLO file to a precision policy."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import os
import sys
import tempfile
from typing import Any

EXIT_OK, EXIT_INVALID_IR, EXIT_USAGE = 0, 1, 2
SPLIT_MARKER = "// -----"

DESCRIPTION = """\
Rewrite a StableHLO module (pretty or generic text, MLIR bytecode, or a
jax.export portable artifact: what jax.jit(f).lower(...).as_text() or
jax.export give you) to a mixed-precision policy. Converts go only where
precision changes; exp/log/sum reductions and norm statistics stay f32; what
feeds discrete decisions (top_k, argmax, sort) and linear algebra stays f32;
dots take low-precision operands and accumulate in f32. The result is
verified with jaxlib's StableHLO verifier.

exit status: 0 success, 1 invalid IR (or a failed rewrite), 2 bad usage or policy
"""

# Flags that configure the default pipeline, with their defaults: with
# --pass-pipeline they do not apply.
# Flags that choose what --pass-pipeline spells out itself (with every
# rewrite option's flag).
_BESIDES_PIPELINE = ("policy", "calibrate", "tolerance", "error_measure")


class _Parser(argparse.ArgumentParser):
  """argparse that exits 2 with one line, and shows the pass reference."""

  def error(self, message: str):
    self.exit(EXIT_USAGE, f"amp-opt: error: {message}\n")

  def format_help(self) -> str:
    text = super().format_help()
    try:
      passes = (importlib.resources.files("stablehlo_amp") /
                "passes.md").read_text()
      passes = "\n".join(line for line in passes.splitlines()
                         if not line.startswith("<!--"))
    except OSError:
      passes = ""
    from stablehlo_amp._src import contract
    return (text + "\npolicy grammar:\n  " + contract.policy_grammar() +
            "\n\npasses (for --pass-pipeline and mlir-opt with the plugin):\n"
            + passes)


def _build_parser() -> argparse.ArgumentParser:
  from stablehlo_amp._src import contract
  insert = contract.INSERT_CONVERTS
  parser = _Parser(prog="amp-opt", description=DESCRIPTION,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("input", nargs="?", default="-",
                      help="input file, or - for standard input (default)")
  parser.add_argument("-o", "--output", default="-",
                      help="output file, or - for standard output (default)")
  parser.add_argument("--policy",
                      help="precision policy (default: "
                      f"{contract.default(insert, 'policy')})")
  _add_option_flags(parser)
  parser.add_argument("--calibrate", metavar="INPUTS.npz",
                      help="keep in f32 a minimal set of op groups that brings "
                      "every output within --tolerance of f32 on these "
                      "inputs (arrays arg0, arg1, ... in argument order)")
  parser.add_argument("--tolerance", type=float,
                      help="with --calibrate: the largest error allowed, "
                      "relative to each output's f32 norm (default: 1e-2)")
  parser.add_argument("--error-measure", choices=("norm", "max_abs"),
                      help="with --calibrate: norm (||got - f32|| / ||f32||, "
                      "default) or max_abs (max |got - f32| / max |f32|)")
  parser.add_argument("--emit",
                      choices=("pretty", "generic", "bytecode", "portable"),
                      help="output form (default: a portable artifact for a "
                      "portable-artifact input, else pretty)")
  parser.add_argument("--debug-info", action="store_true",
                      help="print locations in the output")
  parser.add_argument("--report", action="store_true",
                      help="print what was lowered, kept f32 and why "
                      "(to standard error)")
  parser.add_argument("--split-input-file", action="store_true",
                      help=f"process chunks separated by '{SPLIT_MARKER}' "
                      "independently")
  parser.add_argument("--pass-pipeline", metavar="PIPELINE",
                      help="run exactly this pipeline instead, e.g. "
                      "'builtin.module(amp-simplify-converts)'")
  parser.add_argument("--version", action="store_true",
                      help="print the version and exit")
  return parser


def option_flag(name: str) -> str:
  """The amp-opt flag of rewrite option `name`: ``--dot-result``; a
  per-scope option takes one entry a flag (``--scope PATTERN=CHOICE``)."""
  from stablehlo_amp._src import contract
  if contract.options()[name]["kind"] == "scopes":
    name = name.removesuffix("s")
  return "--" + name.replace("_", "-")


def _add_option_flags(parser: argparse.ArgumentParser) -> None:
  """A flag per rewrite option of the contract (those amp.transform takes),
  with the pass's help; values are checked by the pass's own parsers, so a
  bad one is a usage error naming the accepted values."""
  from stablehlo_amp._src import contract
  from stablehlo_amp._src import pipeline as pl
  for name in pl.accepted_options(stateful=False):
    spec = contract.options()[name]
    flag = option_flag(name)
    defaults = spec.get("target_defaults")
    help_text = spec["help"]
    if spec.get("target"):
      help_text += " (default: the backend JAX runs on here)"
    elif defaults and not spec["option"]:  # a pass switch
      help_text += " (default per target: " + ", ".join(
          f"{k} {_on_off(v)}" for k, v in defaults.items()) + ")"
    kind = spec["kind"]
    if kind == "choice":
      parser.add_argument(flag, metavar="{" + ",".join(spec["choices"]) + "}",
                          help=help_text)
    elif kind == "op_names":
      parser.add_argument(flag, action="append", default=[], metavar="OPS",
                          help=help_text + "; comma-separated, repeatable")
    elif kind == "bool" and defaults:
      parser.add_argument(flag, choices=("on", "off"), help=help_text)
    elif kind == "bool":
      parser.add_argument(flag, action="store_true", help=help_text)
    elif kind == "int":
      parser.add_argument(flag, type=int, help=help_text)
    elif kind == "ints":
      parser.add_argument(flag, type=_int_list, metavar="N,...",
                          help=help_text + "; comma-separated")
    elif kind == "scopes":
      parser.add_argument(flag, dest=name, action="append", default=[],
                          type=_scope_entry, metavar="PATTERN=CHOICE",
                          help=help_text + "; repeatable")
    else:
      raise AssertionError(f"no flag for option {name} of kind {kind}")


def _scope_entry(text: str) -> tuple[str, str]:
  pattern, equals, choice = text.rpartition("=")
  if not equals or not pattern:
    raise argparse.ArgumentTypeError(
        f"expected PATTERN=CHOICE, got {text!r}")
  return pattern, choice


def _int_list(text: str) -> list[int]:
  try:
    return [int(part) for part in text.split(",") if part.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected comma-separated integers, got {text!r}") from None


def _on_off(value: Any) -> str:
  return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _option_values(args: argparse.Namespace) -> dict[str, Any]:
  """The rewrite options the flags gave, as `RewriteOptions.make` takes them
  (flags not given are left out: the option's default applies)."""
  from stablehlo_amp._src import contract
  from stablehlo_amp._src import pipeline as pl
  values: dict[str, Any] = {}
  for name in pl.accepted_options(stateful=False):
    value = getattr(args, name)
    kind = contract.options()[name]["kind"]
    if kind == "op_names":
      value = _split_ops(value) or None
    elif kind == "scopes":
      value = _scopes(value) or None
    elif kind == "bool" and isinstance(value, str):
      value = value == "on"
    elif kind == "bool":
      value = value or None
    if value is not None:
      values[name] = value
  return values


def _scopes(entries: list[tuple[str, str]]) -> dict[str, str]:
  scopes: dict[str, str] = {}
  for pattern, choice in entries:
    if pattern in scopes:
      raise ValueError(f"--scope {pattern}= given twice")
    scopes[pattern] = choice
  return scopes


def _split_ops(values: list[str]) -> list[str]:
  return [name.strip() for value in values for name in value.split(",")
          if name.strip()]


def _read_input(path: str) -> tuple[str | bytes, str]:
  if path == "-":
    data = sys.stdin.buffer.read()
    name = "<stdin>"
  else:
    with open(path, "rb") as f:
      data = f.read()
    name = path
  if data.startswith(b"ML\xefR"):  # MLIR bytecode magic
    return data, name
  try:
    return data.decode("utf-8"), name
  except UnicodeDecodeError:
    return data, name  # jaxlib says what is wrong with it


def _write_output(path: str, data: str | bytes) -> None:
  """Writes all of `data` or nothing: a temporary file renamed into place."""
  if path == "-":
    if isinstance(data, bytes):
      sys.stdout.buffer.write(data)
    else:
      sys.stdout.write(data)
    sys.stdout.flush()
    return
  if os.path.exists(path) and not os.path.isfile(path):
    # A device or a pipe (/dev/null, a FIFO): renaming over it would replace
    # it with a regular file.
    with open(path, "wb") as f:
      f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return
  directory = os.path.dirname(os.path.abspath(path))
  fd, temporary = tempfile.mkstemp(dir=directory, prefix=".amp-opt-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    # mkstemp makes the file private; give it the mode a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    os.replace(temporary, path)
  except BaseException:
    os.unlink(temporary)
    raise


def _chunks(text: str) -> list[str]:
  """Splits at marker lines, padding each chunk so line numbers still match
  the file."""
  chunks, current, line_offset = [], [], 0
  lines = text.splitlines(keepends=True)
  for number, line in enumerate(lines):
    if line.strip() == SPLIT_MARKER:
      chunks.append("\n" * line_offset + "".join(current))
      current, line_offset = [], number + 1
    else:
      current.append(line)
  chunks.append("\n" * line_offset + "".join(current))
  return chunks


def _usage(message: str) -> int:
  print(f"amp-opt: error: {message}", file=sys.stderr)
  return EXIT_USAGE


def _check_usage(args, parser: argparse.ArgumentParser) -> str | None:
  """A usage error, or None."""
  from stablehlo_amp._src import pipeline as pl
  if args.emit == "bytecode" and args.split_input_file:
    return "--emit=bytecode cannot be combined with --split-input-file"
  if args.pass_pipeline is not None:
    names = (_BESIDES_PIPELINE[:1] + tuple(pl.accepted_options(False)) +
             _BESIDES_PIPELINE[1:])
    given = [option_flag(name) if name in pl.accepted_options(False)
             else f"--{name.replace('_', '-')}" for name in names
             if getattr(args, name) != parser.get_default(name)]
    if given:
      return (f"{', '.join(given)} do{'es' if len(given) == 1 else ''} not "
              "apply with --pass-pipeline: give pass options inside the "
              "pipeline, e.g. 'builtin.module(amp-insert-converts"
              "{policy=p=f32,c=bf16,o=f32 target=gpu})'")
  if args.tolerance is not None and args.calibrate is None:
    return "--tolerance needs --calibrate"
  if args.error_measure is not None and args.calibrate is None:
    return "--error-measure needs --calibrate"
  return None


def _rewrite_chunks(args: argparse.Namespace, chunks: list, name: str,
                    policy: Any, options: Any, calibration: Any
                    ) -> tuple[list[str], int]:
  """Each chunk rewritten (or run through --pass-pipeline) and printed in
  the form asked for; diagnostics, calibration and reports go to stderr.
  The outputs, and the exit status (invalid IR in any chunk)."""
  from stablehlo_amp._src import pipeline as pl
  outputs, status = [], EXIT_OK
  for chunk in chunks:
    context = pl.ir_context()
    try:
      with context:
        if args.pass_pipeline is not None:
          form = pl.SourceForm()
          module = pl.parse_module(chunk, context, name, form)
          result = pl.run_pipeline(module, args.pass_pipeline,
                                   context=context, source_name=name,
                                   form=form)
        elif calibration is not None:
          from stablehlo_amp._src import calibration as cal
          result = cal.calibrate_module(
              chunk, policy, options, calibration,
              tolerance=args.tolerance or 1e-2, source_name=name,
              context=context, measure=args.error_measure or "norm")
        else:
          result = pl.rewrite_module(chunk, policy, options,
                                     report=args.report, source_name=name,
                                     context=context)
        emit = args.emit or ("portable" if result.form.kind == "portable"
                             else "pretty")
        outputs.append(result.text(emit, args.debug_info))
      for diagnostic in result.diagnostics:
        print(diagnostic, file=sys.stderr)
      if result.calibration is not None:
        print(result.calibration, file=sys.stderr)
      if args.report and result.report is not None:
        print(result.report, file=sys.stderr)
    except pl.OptionError as error:
      # An option that does not fit the module (--keep-gemms 7 of a module
      # with one GEMM) is a usage error, not invalid IR.
      print(error, file=sys.stderr)
      status = max(status, EXIT_USAGE)
    except pl.AmpError as error:
      print(error, file=sys.stderr)
      status = max(status, EXIT_INVALID_IR)
  return outputs, status


def main(argv: list[str] | None = None) -> int:
  parser = _build_parser()
  args = parser.parse_args(argv)
  if args.version:
    from stablehlo_amp import _amp
    try:
      version = importlib.metadata.version("stablehlo-amp")
    except importlib.metadata.PackageNotFoundError:
      version = "unknown"
    print(f"amp-opt (stablehlo-amp) {version}, MLIR {_amp.mlir_version}")
    return EXIT_OK
  problem = _check_usage(args, parser)
  if problem:
    return _usage(problem)

  # Imported late: --help and usage errors should not wait for JAX.
  from stablehlo_amp import _amp
  from stablehlo_amp._src import pipeline as pl
  from stablehlo_amp._src.policy import Policy

  try:
    if args.pass_pipeline is not None:
      _amp.check_pipeline(args.pass_pipeline)
      policy = options = None
    else:
      from stablehlo_amp._src import contract
      policy = Policy.parse(
          args.policy if args.policy is not None else
          contract.default(contract.INSERT_CONVERTS, "policy"))
      pl.check_stateless_values(_option_values(args))
      options = pl.RewriteOptions.make(**_option_values(args))
      options.check_policy(policy)
  except (ValueError, TypeError) as error:
    return _usage(str(error))

  try:
    source, name = _read_input(args.input)
  except OSError as error:
    return _usage(f"cannot read {args.input}: {error.strerror}")
  calibration = None
  if args.calibrate:
    from stablehlo_amp._src import calibration as cal
    try:
      calibration = cal.load_inputs(args.calibrate)
    except (OSError, ValueError) as error:
      return _usage(f"cannot read calibration inputs {args.calibrate}: "
                    f"{error}")

  chunks = (_chunks(source) if args.split_input_file and
            isinstance(source, str) else [source])
  outputs, status = _rewrite_chunks(args, chunks, name, policy, options,
                                    calibration)
  if status != EXIT_OK and args.output != "-":
    return status  # a file is written whole or not at all
  if not outputs:
    return status
  data = (outputs[0] if len(outputs) == 1 else
          f"\n{SPLIT_MARKER}\n".join(outputs))
  try:
    _write_output(args.output, data)
  except OSError as error:
    return _usage(f"cannot write {args.output}: {error.strerror}")
  return status


def entry_point() -> None:
  try:
    sys.exit(main())
  except KeyboardInterrupt:
    sys.exit(130)
  except BrokenPipeError:
    sys.exit(EXIT_OK)
