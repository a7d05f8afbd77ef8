"""`amp-opt`: rewrite a StableHLO file to a precision policy."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import os
import sys
import tempfile

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
_PIPELINE_FLAGS = {"policy": None, "level": None, "target": None,
                   "dot_result": None, "storage": None, "keep_f32": [],
                   "force_compute": [], "calibrate": None, "tolerance": None,
                   "error_measure": None, "strict": False,
                   "rematerialize": None}


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
  levels = contract.document()["passes"][insert]["level_defaults"]
  parser.add_argument("--level",
                      help="O0 no change, O1 dots/convs only, O2 painting, "
                      "O3 every float op (default: the target's: " +
                      ", ".join(f"{v} on {k}" for k, v in levels.items()) +
                      ")")
  parser.add_argument("--target", choices=contract.choices(insert, "target"),
                      help="backend the module will run on (default: the one "
                      "JAX reports here)")
  parser.add_argument("--dot-result",
                      choices=contract.choices(insert, "dot-result"),
                      help="result dtype of lowered dots/convolutions "
                      "(default: f32 accumulation)")
  parser.add_argument("--storage", choices=contract.choices(insert, "storage"),
                      help="store large f32 results that are read again "
                      "later in the compute dtype (default: the target's)")
  parser.add_argument("--strict", action="store_true",
                      help="every rounding the painted module describes in a "
                      "form XLA keeps (reduce_precision)")
  parser.add_argument("--rematerialize", choices=("on", "off"),
                      help="on a training step, recompute cheap elementwise "
                      "residuals in the backward pass (default: the "
                      "target's: on for gpu/tpu)")
  parser.add_argument("--keep-f32", action="append", default=[],
                      metavar="OPS", help="comma-separated op names kept f32 "
                      "(e.g. tanh,stablehlo.logistic)")
  parser.add_argument("--force-compute", action="append", default=[],
                      metavar="OPS", help="comma-separated op names forced "
                      "into the compute dtype")
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


def _check_usage(args) -> str | None:
  """A usage error, or None."""
  if args.emit == "bytecode" and args.split_input_file:
    return "--emit=bytecode cannot be combined with --split-input-file"
  if args.pass_pipeline is not None:
    given = [f"--{name.replace('_', '-')}" for name, unset in
             _PIPELINE_FLAGS.items() if getattr(args, name) != unset]
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


def main(argv: list[str] | None = None) -> int:
  args = _build_parser().parse_args(argv)
  if args.version:
    from stablehlo_amp import _amp
    try:
      version = importlib.metadata.version("stablehlo-amp")
    except importlib.metadata.PackageNotFoundError:
      version = "unknown"
    print(f"amp-opt (stablehlo-amp) {version}, MLIR {_amp.mlir_version}")
    return EXIT_OK
  problem = _check_usage(args)
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
      options = pl.RewriteOptions.make(
          level=args.level, target=args.target, dot_result=args.dot_result,
          storage=args.storage, keep_f32=_split_ops(args.keep_f32),
          force_compute=_split_ops(args.force_compute), strict=args.strict,
          rematerialize=(None if args.rematerialize is None else
                         args.rematerialize == "on"))
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
    except pl.AmpError as error:
      print(error, file=sys.stderr)
      status = EXIT_INVALID_IR
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
