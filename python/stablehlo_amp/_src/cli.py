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
Rewrite a StableHLO module (pretty or generic text, or MLIR bytecode: what
jax.jit(f).lower(...).as_text() or jax.export give you) to a mixed-precision
policy. Converts go only where precision changes; exp/log/sum reductions and
norm statistics stay f32; dots take low-precision operands and accumulate in
f32. The result is verified with jaxlib's StableHLO verifier.

exit status: 0 success, 1 invalid IR (or a failed rewrite), 2 bad usage or policy
"""


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
    from stablehlo_amp._src.policy import policy_grammar
    return (text + "\npolicy grammar:\n  " + policy_grammar() +
            "\n\npasses (for --pass-pipeline and mlir-opt with the plugin):\n"
            + passes)


def _build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog="amp-opt", description=DESCRIPTION,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("input", nargs="?", default="-",
                      help="input file, or - for standard input (default)")
  parser.add_argument("-o", "--output", default="-",
                      help="output file, or - for standard output (default)")
  parser.add_argument("--policy", default="p=f32,c=bf16,o=f32",
                      help="precision policy (default: %(default)s)")
  parser.add_argument("--level", default="O2",
                      help="O0 no change, O1 dots/convs only, O2 painting "
                      "(default), O3 every float op")
  parser.add_argument("--target", choices=("cpu", "gpu", "tpu"),
                      help="backend the module will run on (default: the one "
                      "JAX reports here)")
  parser.add_argument("--dot-result", choices=("f32", "compute"),
                      default="f32",
                      help="result dtype of lowered dots/convolutions "
                      "(default: f32 accumulation)")
  parser.add_argument("--keep-f32", action="append", default=[],
                      metavar="OPS", help="comma-separated op names kept f32 "
                      "(e.g. tanh,stablehlo.logistic)")
  parser.add_argument("--force-compute", action="append", default=[],
                      metavar="OPS", help="comma-separated op names forced "
                      "into the compute dtype")
  parser.add_argument("--emit", choices=("pretty", "generic", "bytecode"),
                      default="pretty", help="output form (default: pretty)")
  parser.add_argument("--debug-info", action="store_true",
                      help="print locations in the output")
  parser.add_argument("--report", action="store_true",
                      help="print what was lowered, kept f32 and why "
                      "(to standard error)")
  parser.add_argument("--split-input-file", action="store_true",
                      help=f"process chunks separated by '{SPLIT_MARKER}' "
                      "independently")
  parser.add_argument("--pass-pipeline", metavar="PIPELINE",
                      help="run this pipeline instead, e.g. "
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

  # Imported late: --help and usage errors should not wait for JAX.
  from stablehlo_amp._src import pipeline as pl
  from stablehlo_amp._src.policy import Policy
  from stablehlo_amp._src.transform import check_options

  try:
    policy = Policy.parse(args.policy)
    options = check_options(args.level, args.target, args.dot_result,
                            _split_ops(args.keep_f32),
                            _split_ops(args.force_compute))
  except ValueError as error:
    print(f"amp-opt: error: {error}", file=sys.stderr)
    return EXIT_USAGE
  if args.emit == "bytecode" and args.split_input_file:
    print("amp-opt: error: --emit=bytecode cannot be combined with "
          "--split-input-file", file=sys.stderr)
    return EXIT_USAGE

  try:
    source, name = _read_input(args.input)
  except OSError as error:
    print(f"amp-opt: error: cannot read {args.input}: {error.strerror}",
          file=sys.stderr)
    return EXIT_USAGE

  target = args.target or pl.default_target()
  chunks = (_chunks(source) if args.split_input_file and
            isinstance(source, str) else [source])
  outputs, status = [], EXIT_OK
  for chunk in chunks:
    context = pl.ir_context()
    try:
      with context:
        if args.pass_pipeline:
          module = pl.parse_module(chunk, context, name)
          result = pl.run_pipeline(module, args.pass_pipeline,
                                   context=context, source_name=name,
                                   report_info=None)
        else:
          result = pl.rewrite_module(
              chunk, policy, **dict(options, target=target),
              report=args.report, source_name=name, context=context)
        outputs.append(result.text(args.emit, args.debug_info))
      for diagnostic in result.diagnostics:
        print(diagnostic, file=sys.stderr)
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
    print(f"amp-opt: error: cannot write {args.output}: {error.strerror}",
          file=sys.stderr)
    return EXIT_USAGE
  return status


def entry_point() -> None:
  try:
    sys.exit(main())
  except KeyboardInterrupt:
    sys.exit(130)
  except BrokenPipeError:
    sys.exit(EXIT_OK)
