"""Figures for discrete decisions and linear algebra (issue 12), as markdown.

1. Before / after: for each program of `test/python/programs.py` that has a
   discrete decision or linear algebra (top-k MoE, argmax classifier,
   sort by a computed key, GP with a Cholesky solve; forward and Adam
   training step), under each policy: ops in the f32 module, ops lowered,
   ops kept f32 and why (the largest reasons), converts inserted, the
   largest relative error of a float output against f32, and how many
   elements of the integer outputs (expert indices, predictions, sort
   indices, Adam's count) differ from f32 on the same inputs, over all
   steps. BEFORE is the package as it was before
   issue 12 (commit 565cd52), AFTER the installed one. Each side runs in its
   own subprocess (`--side`), BEFORE with `--before` on PYTHONPATH.
2. Calibration (`stablehlo_amp._src.calibration.calibrate`) on the corpus
   models (`test/python/corpus_decisions.py`, and with `--corpus all` also
   `test/python/test_corpus.py`) at tolerances 1e-2 and 1e-3: groups kept in
   f32 out of all, the error without and with them, compiles, and the time
   as a multiple of one compile.

3. `--numerics` (issue 9, storage precision): every program of
   `test/python/programs.py` and every model of the corpus
   (`test/python/test_corpus.py`, forward and training step), max error
   against f32 before and after, and the ratio after / before (the goal:
   at most 1.5). `--level O2` compares at the level that was the default
   before the per-target default (so only the storage decision differs);
   without it each side runs at its own default (AFTER: O1 on cpu).

The BEFORE package: build 565cd52 in a worktree and drop its extension into
a copy of its Python package:

    git worktree add /tmp/amp-before 565cd52
    cmake -S /tmp/amp-before -B /tmp/amp-before/build -G Ninja \\
      -DAMP_BUILD_PYTHON=ON -DPython_EXECUTABLE=$PWD/.venv/bin/python \\
      -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir
    cmake --build /tmp/amp-before/build
    mkdir -p /tmp/amp-before-py && cp -r /tmp/amp-before/python/stablehlo_amp \\
      /tmp/amp-before-py/ && cp /tmp/amp-before/build/python/_amp*.so \\
      /tmp/amp-before-py/stablehlo_amp/

    .venv/bin/python bench/decisions.py [--before /tmp/amp-before-py]
        [--corpus decisions|all] [--policy P ...] [--skip-calibration]
        [--save figures.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "test" / "python"
PROGRAMS = ("moe_topk", "argmax_classifier", "sort_select", "gp_regression",
            "moe_topk_step", "argmax_classifier_step", "sort_select_step",
            "gp_regression_step")
TOLERANCES = (1e-2, 1e-3)


# -- one side (runs in a subprocess) -------------------------------------------

def _with_level(level: str | None) -> None:
  """Every amp.transform of this process at `level` (None: the default)."""
  if level is None:
    return
  import functools as ft
  import stablehlo_amp as amp
  amp.transform = ft.partial(amp.transform, level=level)


def measure_corpus(case, policy: str) -> dict:
  import test_corpus as tc
  try:
    row, _ = tc.measure(case, policy)
  except Exception as error:  # the table says it
    return {"program": case.id, "policy": policy,
            "error": f"{type(error).__name__}: "
                     f"{str(error).splitlines()[0][:100]}"}
  return {"program": case.id, "policy": policy, "ops": row.ops,
          "lowered": row.lowered, "kept": row.kept_f32,
          "converts": row.converts, "max_error": row.max_error,
          "update_diff": row.update_diff}


def measure_program(name: str, policy: str) -> dict:
  import jax
  import numpy as np
  import programs as P
  import stablehlo_amp as amp
  program = P.PROGRAMS_BY_NAME[name]
  args = program.make_args()
  from test_corpus import count_ops
  row = {"program": name, "policy": policy,
         "ops": count_ops(jax.jit(program.fn).lower(*args).as_text())}
  try:
    lowered = amp.transform(program.fn, policy).lower(*args)
    report = lowered.report()
    compiled = lowered.compile()
  except Exception as error:  # the table says it
    row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
    return row
  row.update(lowered=sum(report.lowered.values()),
             kept=sum(report.kept_f32.values()),
             converts=report.converts_inserted,
             reasons={reason: sum(ops.values()) for reason, ops in
                      report.kept_f32_reasons.items()},
             dots_kept=report.kept_f32["stablehlo.dot_general"],
             dots_lowered=report.lowered["stablehlo.dot_general"])
  try:
    steps = list(P.compare_steps(program, compiled, jax.jit(program.fn),
                                 args))
  except Exception as error:
    row["error"] = "fails at run time: " + P.first_line(error)[:100]
    return row
  # The error of the last step (of every step, for a program compared on
  # the same inputs each step); integer outputs, every step, as mismatched
  # elements out of all.
  compared = steps if program.same_inputs else steps[-1:]
  row["max_error"] = max(P.relative_error(fast[i], ref[i])
                         for fast, ref in compared
                         for i in program.float_outputs)
  ints = [i for i in range(len(steps[0][1]))
          if i not in program.float_outputs]
  if ints:
    row["int_mismatches"] = sum(
        int(np.sum(np.asarray(fast[i]) != np.asarray(ref[i])))
        for fast, ref in steps for i in ints)
    row["int_elements"] = sum(int(np.size(ref[i]))
                              for _, ref in steps for i in ints)
  return row


def measure_calibration(case, policy: str, tolerance: float) -> dict:
  import jax
  import test_corpus as tc
  from stablehlo_amp._src import calibration
  from stablehlo_amp._src import pipeline as pl
  from stablehlo_amp._src.policy import Policy
  fn, args = tc.built(case)
  # keep_unused: main takes every argument, in the order of the inputs.
  module = jax.jit(fn, keep_unused=True).lower(*args).compiler_ir("stablehlo")
  inputs = jax.tree_util.tree_leaves(args)
  with module.context:
    result, cal = calibration.calibrate(
        module, Policy.parse(policy), pl.RewriteOptions.make(target="cpu"),
        inputs, tolerance=tolerance, context=module.context)
  # The candidate groups: the lowered matrix multiplies of the plain
  # rewrite (those feeding a decision or linear algebra are f32 already).
  return {"model": case.id, "policy": policy, "tolerance": tolerance,
          "groups": len(cal.effects), "kept": len(cal.kept),
          "error_before": cal.error_f32_free, "error_after": cal.error,
          "compiles": cal.compiles, "seconds": cal.seconds,
          "cost": cal.cost_in_compiles}


def run_side(side: str, policies: list[str], corpus: str,
             calibrate: bool, numerics: bool = False,
             level: str | None = None) -> dict:
  sys.path.insert(0, str(TESTS))
  import stablehlo_amp
  _with_level(level)
  out = {"side": side, "package": os.path.dirname(stablehlo_amp.__file__),
         "level": level or "default", "programs": [], "calibration": []}
  if numerics:
    import programs as P
    import test_corpus as tc
    for program in P.PROGRAMS:
      for policy in policies:
        out["programs"].append(measure_program(program.name, policy))
        print(f"[{side}] {program.name} {policy}", file=sys.stderr)
    for case in tc.CASES:
      for policy in policies:
        out["programs"].append(measure_corpus(case, policy))
        print(f"[{side}] {case.id} {policy}", file=sys.stderr)
    return out
  for name in PROGRAMS:
    for policy in policies:
      start = time.perf_counter()
      out["programs"].append(measure_program(name, policy))
      print(f"[{side}] {name} {policy} {time.perf_counter() - start:.1f}s",
            file=sys.stderr)
  if calibrate:
    import corpus_decisions
    cases = list(corpus_decisions.CASES)
    if corpus == "all":
      import test_corpus
      cases += list(test_corpus.CASES)
    for case in cases:
      for policy in policies:
        for tolerance in TOLERANCES:
          try:
            row = measure_calibration(case, policy, tolerance)
          except Exception as error:  # the table says it
            row = {"model": case.id, "policy": policy,
                   "tolerance": tolerance,
                   "error": f"{type(error).__name__}: "
                            f"{str(error).splitlines()[0][:100]}"}
          out["calibration"].append(row)
          print(f"[{side}] calibrate {case.id} {policy} {tolerance:g}",
                file=sys.stderr)
  return out


# -- tables --------------------------------------------------------------------

def _reasons(reasons: dict, top: int = 3) -> str:
  ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
  text = "; ".join(f"{reason} {n}" for reason, n in ranked[:top])
  rest = sum(n for _, n in ranked[top:])
  return text + (f"; other {rest}" if rest else "")


def _error(value) -> str:
  if value is None:
    return "n/a"
  return "nan" if isinstance(value, float) and math.isnan(value) else \
      f"{value:.2e}"


def programs_table(before: dict, after: dict) -> str:
  by_key = {(r["program"], r["policy"]): r for r in before["programs"]}
  lines = ["| program | policy | ops | lowered (dots) before → after "
           "| kept f32 before → after | converts before → after "
           "| max error vs f32 before → after | integer outputs differing before → after "
           "| kept f32, why (after) |",
           "|---|---|---:|---|---|---|---|---|---|"]
  def cell(row, key):
    return "—" if "error" in row else row[key]
  def ints(row):
    if "error" in row:
      return "—"
    if "int_mismatches" not in row:
      return "n/a"
    text = f"{row['int_mismatches']} / {row['int_elements']}"
    return f"**{text}**" if row["int_mismatches"] else text
  for row in after["programs"]:
    old = by_key[(row["program"], row["policy"])]
    if "error" in row:
      lines.append(f"| {row['program']} | {row['policy']} | {row['ops']} | "
                   f"after fails: {row['error']} ||||||")
      continue
    old_lowered = ("fails" if "error" in old else
                   f"{old['lowered']} ({old['dots_lowered']})")
    old_error = (old["error"] if "error" in old
                 else _error(old.get("max_error")))
    lines.append(
        f"| {row['program']} | {row['policy']} | {row['ops']} | "
        f"{old_lowered} → {row['lowered']} ({row['dots_lowered']}) | "
        f"{cell(old, 'kept')} → {row['kept']} | "
        f"{cell(old, 'converts')} → {row['converts']} | "
        f"{old_error} → {_error(row.get('max_error'))} | "
        f"{ints(old)} → {ints(row)} | {_reasons(row['reasons'])} |")
  return "\n".join(lines)


def numerics_table(before: dict, after: dict) -> str:
  by_key = {(r["program"], r["policy"]): r for r in before["programs"]}
  lines = [f"| program | policy | max error vs f32 before ({before['level']}) "
           f"| after ({after['level']}) | after / before | lowered before → "
           "after | converts before → after |",
           "|---|---|---:|---:|---:|---|---|"]
  worst = 0.0
  for row in after["programs"]:
    old = by_key.get((row["program"], row["policy"]), {})
    if "error" in row or "error" in old or not old:
      lines.append(f"| {row['program']} | {row['policy']} | "
                   f"{old.get('error', _error(old.get('max_error')))} | "
                   f"{row.get('error', _error(row.get('max_error')))} ||||")
      continue
    a, b = row.get("max_error"), old.get("max_error")
    ratio = a / b if a is not None and b else None
    if ratio is not None:
      worst = max(worst, ratio)
    lines.append(
        f"| {row['program']} | {row['policy']} | {_error(b)} | {_error(a)} | "
        f"{'n/a' if ratio is None else f'{ratio:.2f}'} | "
        f"{old['lowered']} → {row['lowered']} | "
        f"{old['converts']} → {row['converts']} |")
  lines.append(f"\nlargest after / before: {worst:.2f}")
  return "\n".join(lines)


def calibration_table(after: dict) -> str:
  lines = ["| model | policy | tolerance | groups kept / total "
           "| error before → after | compiles | time | cost (x one compile) |",
           "|---|---|---:|---:|---|---:|---:|---:|"]
  for row in after["calibration"]:
    if "error" in row:
      lines.append(f"| {row['model']} | {row['policy']} | "
                   f"{row['tolerance']:g} | fails: {row['error']} |||||")
      continue
    lines.append(
        f"| {row['model']} | {row['policy']} | {row['tolerance']:g} | "
        f"{row['kept']} / {row['groups']} | {_error(row['error_before'])} → "
        f"{_error(row['error_after'])} | {row['compiles']} | "
        f"{row['seconds']:.1f} s | {row['cost']:.1f} |")
  return "\n".join(lines)


def _spawn(side: str, args, pythonpath: str | None) -> dict:
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    env = dict(os.environ)
    if pythonpath:
      env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, __file__, "--side", side, "--json", out.name,
               "--corpus", args.corpus]
    for policy in args.policies:
      command += ["--policy", policy]
    if args.numerics:
      command.append("--numerics")
    if args.level:
      command += ["--level", args.level]
    if side == "before" or args.skip_calibration:
      command.append("--skip-calibration")
    subprocess.run(command, env=env, check=True, cwd=TESTS)
    return json.loads(pathlib.Path(out.name).read_text())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--before", default="/tmp/amp-before-py",
                      help="directory holding the pre-issue-12 stablehlo_amp")
  parser.add_argument("--policy", action="append", dest="policies",
                      help="a policy (repeat for several; default: "
                      "p=f32,c=bf16,o=f32 and p=f32,c=f16,o=f32)")
  parser.add_argument("--corpus", choices=("decisions", "all"),
                      default="decisions")
  parser.add_argument("--skip-calibration", action="store_true")
  parser.add_argument("--numerics", action="store_true",
                      help="max error against f32 of every program and "
                      "corpus model, before and after (issue 9)")
  parser.add_argument("--level", help="with --numerics: run both sides at "
                      "this level (default: each side's default)")
  parser.add_argument("--side", choices=("before", "after"),
                      help=argparse.SUPPRESS)
  parser.add_argument("--json", help=argparse.SUPPRESS)
  parser.add_argument("--save", help="also write both sides' figures here "
                      "(JSON)")
  args = parser.parse_args()
  args.policies = args.policies or ["p=f32,c=bf16,o=f32", "p=f32,c=f16,o=f32"]
  if args.side:
    result = run_side(args.side, args.policies, args.corpus,
                      not args.skip_calibration, args.numerics, args.level)
    pathlib.Path(args.json).write_text(json.dumps(result))
    return
  if not (pathlib.Path(args.before) / "stablehlo_amp").is_dir():
    sys.exit(f"no pre-issue-12 package in {args.before} (see the docstring)")
  before = _spawn("before", args, args.before)
  after = _spawn("after", args, None)
  print(f"BEFORE: {before['package']}\nAFTER: {after['package']}\n")
  if args.numerics:
    print("## Max error against f32, before and after storage precision\n")
    print(numerics_table(before, after))
    if args.save:
      pathlib.Path(args.save).write_text(json.dumps(
          {"before": before, "after": after}, indent=1))
    return
  print("## Discrete decisions and linear algebra: before and after issue 12"
        "\n")
  print(programs_table(before, after))
  if after["calibration"]:
    print("\n## Calibration on the corpus models\n")
    print(calibration_table(after))
  if args.save:
    pathlib.Path(args.save).write_text(json.dumps(
        {"before": before, "after": after}, indent=1))


if __name__ == "__main__":
  main()
