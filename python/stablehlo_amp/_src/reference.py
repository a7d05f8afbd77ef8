"""Prints docs/reference.md: the options, flags, passes and report keys.

    python -m stablehlo_amp._src.reference > docs/reference.md
    python -m stablehlo_amp._src.reference --usage  # docs/amp-opt.md's block

Everything here is read from what the package ships: the C++ contract
(`contract.document()`, from `passes/Contract.cpp`), `passes.md` (which
mlir-tblgen writes from `passes/Passes.td`) and `amp-opt`'s parser. Nothing
is written by hand, so an option, flag or pass added there is in the
reference once it is regenerated; `test/python/test_readme.py` fails while
docs/reference.md differs from what this prints.
"""

from __future__ import annotations

import argparse
import importlib.resources
import re
import sys
from typing import Any, Iterable

from stablehlo_amp._src import cli
from stablehlo_amp._src import contract
from stablehlo_amp._src import pipeline as pl

COMMAND = "python -m stablehlo_amp._src.reference > docs/reference.md"
USAGE_COMMAND = "python -m stablehlo_amp._src.reference --usage"


def _cell(text: Any) -> str:
  """`text` for a Markdown table cell."""
  return str(text).replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
  return f"`{_cell(value)}`"


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
  header = list(header)
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |"
            for row in rows]
  return lines


def _value(value: Any) -> str:
  """A default as the pass option spells it."""
  if isinstance(value, bool):
    return _code("true" if value else "false")
  if isinstance(value, list):
    return _code(",".join(str(v) for v in value)) if value else "none"
  if value == "":
    return "–"
  return _code(value)


def _passes_md() -> str:
  return (importlib.resources.files("stablehlo_amp") /
          "passes.md").read_text()


def _pass_summaries() -> dict[str, str]:
  """Pass name -> its one-sentence summary, in passes.md's order."""
  summaries, current = {}, None
  for line in _passes_md().splitlines():
    heading = re.match(r"^#+ `-?([a-z0-9-]+)`", line)
    if heading:
      current = heading.group(1)
      summaries[current] = ""
      continue
    summary = re.match(r"^_(.*)_$", line.strip())
    if summary and current and not summaries[current]:
      summaries[current] = summary.group(1)
  return summaries


def _pass_option_names() -> dict[str, list[str]]:
  """Pass name -> its options in passes.md's order."""
  names: dict[str, list[str]] = {}
  current = None
  for line in _passes_md().splitlines():
    heading = re.match(r"^#+ `-?([a-z0-9-]+)`", line)
    if heading:
      current = heading.group(1)
      names[current] = []
      continue
    option = re.match(r"^-([a-z0-9-]+)\s*: ", line)
    if option and current:
      names[current].append(option.group(1))
  return names


def _taken_by(name: str, spec: dict) -> str:
  if spec["internal"]:
    return "none: set by stablehlo-amp itself"
  if name not in pl.accepted_options(stateful=False):
    return "`train_step`"
  if spec.get("stateful_value"):
    return ("`transform`, `value_and_grad`, `train_step`, `amp-opt` "
            f"(`{spec['stateful_value']}`: `train_step`)")
  return "`transform`, `value_and_grad`, `train_step`, `amp-opt`"


def _option_default(spec: dict) -> str:
  if spec.get("target"):
    return (f"the backend JAX runs on (the pass alone: "
            f"{_value(spec['default'])})")
  defaults = spec.get("target_defaults")
  if defaults:
    return "per target: " + ", ".join(f"{target} {_value(value)}"
                                       for target, value in defaults.items())
  text = _value(spec["default"])
  if "bf16_params_default" in spec:
    text += (f"; {_value(spec['bf16_params_default'])} in `train_step` "
             "with `p=bf16`")
  return text


def _flag(name: str, spec: dict) -> str:
  if name in pl.accepted_options(stateful=False):
    return _code(cli.option_flag(name))
  return "–"


def _pass_option(spec: dict) -> str:
  if not spec["option"]:
    return f"runs `{spec['pass']}` or not"
  return _code(f"{spec['pass']}{{{spec['option']}=...}}")


def _options() -> list[str]:
  lines = ["## Rewrite options", "",
           "Every option the entry points take by keyword "
           "(`amp.transform(fun, policy, **options)`, `amp.train_step`, "
           "`amp.value_and_grad`), with the `amp-opt` flag and the pass "
           "option it sets (`contract.options()`).", ""]
  rows = []
  for name, spec in contract.options().items():
    rows.append([_code(name), _flag(name, spec), _pass_option(spec),
                 spec["kind"],
                 ", ".join(_code(c) for c in spec.get("choices", [])) or "–",
                 _option_default(spec), _taken_by(name, spec),
                 _cell(spec["help"])])
  return lines + _table(["option", "amp-opt flag", "pass option", "kind",
                         "choices", "default", "taken by", "what"], rows)


def _flag_text(action: argparse.Action) -> str:
  if not action.option_strings:
    return _code(action.dest)
  metavar = ""
  if action.nargs != 0:
    metavar = action.metavar or (
        "{" + ",".join(action.choices) + "}" if action.choices
        else action.dest.upper())
  return ", ".join(_code(f"{flag} {metavar}".strip())
                   for flag in action.option_strings)


def amp_opt_usage(width: int = 78) -> str:
  """`amp-opt`'s usage line as its parser makes it, at a fixed width (not
  the terminal's): docs/amp-opt.md's first block."""
  parser = cli._build_parser()
  formatter = argparse.HelpFormatter(prog=parser.prog, width=width)
  formatter.add_usage(parser.usage, parser._actions,
                      parser._mutually_exclusive_groups, prefix="")
  return formatter.format_help().strip("\n")


def _amp_opt() -> list[str]:
  lines = ["## `amp-opt` flags", "",
           "Every flag of `amp-opt --help`, from its parser; the rewrite "
           "options' flags are made from the contract (above).", ""]
  rows = [[_flag_text(action), _cell(action.help or "")]
          for action in cli._build_parser()._actions]
  return lines + _table(["flag", "what"], rows)


def _passes() -> list[str]:
  lines = ["## Passes", "",
           "Each pass's summary and options (`passes/Passes.td`; "
           "`amp-opt --help` prints the full descriptions). Give options "
           "inside a pipeline: `amp-opt --pass-pipeline="
           "'builtin.module(amp-insert-converts{policy=p=f32,c=bf16,o=f32 "
           "target=gpu})'`.", ""]
  described = contract._pass_option_help()
  documented = contract.document()["passes"]
  names = _pass_option_names()
  for pass_name, summary in _pass_summaries().items():
    lines += [f"### `{pass_name}`", "", summary, ""]
    options = documented.get(pass_name, {}).get("options", {})
    order = names.get(pass_name, []) + sorted(set(options) -
                                              set(names.get(pass_name, [])))
    if not order:
      lines += ["No options.", ""]
      continue
    rows = []
    for option in order:
      spec = options.get(option, {})
      rows.append([_code(option), _value(spec.get("default", "")),
                   ", ".join(_code(c) for c in spec.get("choices", []))
                   or "–",
                   _cell(described.get((pass_name, option), ""))])
    lines += _table(["option", "default", "choices", "what"], rows) + [""]
  return lines[:-1]


def _policy() -> list[str]:
  return ["## Policy", "",
          _cell(contract.policy_grammar()), "",
          f"Default: {_code(contract.default_policy())} (`transform`, "
          f"`rewrite`, `amp-opt`, the passes); "
          f"{_code(contract.default_policy(training=True))} "
          "(`train_step`, `value_and_grad`)."]


def _report() -> list[str]:
  decisions = contract.document()["decisions"]
  lines = ["## Report", "",
           "Top-level keys of the report JSON the extension hands to Python"
           " (`contract.report_keys()`): " +
           ", ".join(_code(key) for key in contract.report_keys()) + ".", "",
           "Keys of one op's record in `ops` (`contract.report_op_keys()`): "
           +
           ", ".join(_code(key) for key in contract.report_op_keys()) +
           ".", "",
           "Precisions (`precision`): " +
           ", ".join(_code(p) for p in contract.precisions()) + ".", "",
           "Reasons (`reason`):", ""]
  lines += _table(["id", "text"], [[_code(key), _cell(text)] for key, text
                                   in decisions["reasons"].items()])
  lines += ["", "Why a lowered dot is not an FP8 GEMM (`gemm_reason`):", ""]
  lines += _table(["id", "text"], [[_code(key), _cell(text)] for key, text
                                   in decisions["fp8_reasons"].items()])
  return lines


def _attributes() -> list[str]:
  return ["## Attributes", "",
          "The attribute (or custom-call target) the passes read and write "
          "for each role (`contract.attribute(role)`).", ""] + _table(
              ["role", "name"],
              [[_code(role), _code(name)] for role, name
               in contract.document()["attributes"].items()])


def _state_roles() -> list[str]:
  return ["## Training-state roles", "",
          "What the passes append to a training step's `main`, as an "
          "argument (the value before the step) and a result (after it): "
          "the `TrainState` field that gives and takes it, whether there "
          "is one per parameter, and whether a skipped step keeps the old "
          "value (`contract.state_roles()`).", ""] + _table(
              ["attribute", "field", "pass", "per parameter",
               "kept on a skipped step"],
              [[_code(attribute), _code(spec["field"]), _code(spec["pass"]),
                "yes" if spec["per_parameter"] else "no",
                "yes" if spec["kept_on_skip"] else "no"]
               for attribute, spec in contract.state_roles().items()])


def _measurements() -> list[str]:
  return ["## Measurements", "",
          "What the passes append to a training step's `main` as a result "
          "only: a measurement, returned in the step's metrics and never "
          "given back (`contract.measurements()`).", ""] + _table(
              ["attribute", "pass"],
              [[_code(attribute), _code(spec["pass"])]
               for attribute, spec in contract.measurements().items()])


def markdown() -> str:
  """docs/reference.md, whole."""
  sections = [
      ["# Reference", "",
       "<!-- Generated: do not edit; regenerate it with the command below."
       " -->", "",
       f"Generated by `{COMMAND}` from the C++ contract "
       "(`passes/Contract.cpp`), `passes/Passes.td` and `amp-opt`'s parser;"
       " `test/python/test_readme.py` fails when this file differs from "
       "what the command prints. The guides say what each option is for: "
       "[policy.md](policy.md) and the others linked from the "
       "[README](../README.md)."],
      _options(), _amp_opt(), _passes(), _policy(), _report(),
      _attributes(), _state_roles(), _measurements()]
  return "\n\n".join("\n".join(section) for section in sections) + "\n"


def main() -> None:
  if sys.argv[1:] == ["--usage"]:
    sys.stdout.write(amp_opt_usage() + "\n")
  else:
    sys.stdout.write(markdown())


if __name__ == "__main__":
  main()
