"""Models whose results hang on discrete decisions (top-k routing, argmax)
or linear algebra (a Cholesky solve), through stablehlo-amp: the models of
`corpus_decisions.py`, forward and training step, under bf16 and f16.

For every case and policy:

- the f32 module rewrites and verifies, and so do the module
  `amp.transform` rewrites and the `jax.export` module; in each, every dot
  is lowered except those that
  feed the decision or the linear algebra, which stay f32 with the report
  naming the decision (`top_k`, `argmax/argmin`) or the routine (the
  Cholesky and triangular-solve kernels);
- `amp.transform` runs it on XLA:CPU without falling back, and, with
  `decisions="exact"`, it matches the f32 program as `test_corpus.py`
  measures it: floats within the
  compute dtype's tolerance, parameter updates within 2 lr per step of f32
  and pointing the same way, and integer outputs (expert indices,
  predictions, Adam's step count) bit-identical; a training step that
  returns its decisions is compared step by step, each step against the
  f32 step on the same inputs.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.export
import numpy as np
import pytest

import stablehlo_amp as amp
from corpus_decisions import CASES, DECISIONS, KEPT_DOTS
from mlir_checks import duplicate_converts
from test_corpus import (POLICIES, TRAIN_STEPS, built, compare, f32_text,
                         measure, reference)

# The rule whose promise these tests check: everything upstream of a
# decision stays f32, so the decisions equal f32's. The default
# (decisions="gate": only the nearest matrix multiply) has its own test.
EXACT = {"decisions": "exact"}

# Bugs of the pass these tests found and that are not fixed yet, as in
# test_programs.py: (test, case id, policy or None) -> why; strict xfails.
KNOWN_BUGS: dict[tuple[str, str, str | None], str] = {
}


def _cases(test: str):
  for case in CASES:
    for policy in POLICIES:
      reason = (KNOWN_BUGS.get((test, case.id, policy)) or
                KNOWN_BUGS.get((test, case.id, None)))
      marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
      yield pytest.param(case, policy, marks=marks, id=f"{case.id}-{policy}")


def check_decisions(report: amp.Report, case) -> None:
  """The dots that feed the decision stay f32, for that reason; the others
  are lowered; the report names the decision or routine."""
  dots = [d for d in report.decisions if d.op == "stablehlo.dot_general"]
  kept = [d for d in dots if d.precision == "f32"]
  assert len(kept) == KEPT_DOTS[case.id], [(d.reason, d.loc) for d in kept]
  # (jnp.linalg's solves ask for precision=HIGHEST, honoured as such.)
  assert {d.reason_id for d in kept} <= {"discrete_decision",
                                         "linear_algebra",
                                         "precision_requested"}
  assert all(d.precision == "low" for d in dots if d not in kept)
  shown = {(d.reason_id, d.detail) for d in report.decisions
           if d.precision == "f32"}
  for reason, pattern in DECISIONS[case.name]:
    assert any(r == reason and re.search(pattern, detail)
               for r, detail in shown), (reason, pattern, sorted(shown))


@pytest.mark.parametrize("case, policy",
                         list(_cases("test_rewrites_and_verifies")))
def test_rewrites_and_verifies(case, policy):
  """The f32 module (`jax.jit(...).lower(...).as_text()`, with chlo.top_k
  itself) rewrites and verifies, keeping what decides in f32."""
  result = amp.rewrite_module(f32_text(case), policy, target="cpu", **EXACT)
  assert duplicate_converts(result.module) == []
  check_decisions(result.report, case)


@pytest.mark.parametrize("case, policy",
                         list(_cases("test_transform_keeps_what_decides_f32")))
def test_transform_keeps_what_decides_f32(case, policy):
  """The same through `amp.transform`."""
  fn, args = built(case)
  check_decisions(amp.transform(fn, policy, **EXACT).lower(*args).report(),
                  case)


@pytest.mark.parametrize(
    "case, policy", list(_cases("test_exported_module_keeps_what_decides_f32")))
def test_exported_module_keeps_what_decides_f32(case, policy):
  """The same for what `jax.export` produces, through
  `amp.rewrite_module`."""
  fn, args = built(case)
  text = jax.export.export(jax.jit(fn))(*args).mlir_module()
  result = amp.rewrite_module(text, policy, target="cpu", **EXACT)  # verifies
  check_decisions(result.report, case)


@pytest.mark.parametrize("case, policy",
                         list(_cases("test_runs_and_matches_f32")))
def test_runs_and_matches_f32(case, policy):
  """Forward passes and the GP's training step: as test_corpus.py measures
  them (a training step over three steps, each on its own outputs). The
  training steps whose state holds decisions (expert indices, predictions):
  each step against the f32 step on the same inputs (see `step_by_step`)."""
  if case.train and case.name in DECIDING_STEPS:
    problems = step_by_step(case, policy)
  else:
    _, result = measure(case, policy, **EXACT)
    problems = result.problems
  assert not problems, problems


# Training steps whose non-trained state is the step's decisions.
DECIDING_STEPS = ("linen_moe", "nnx_argmax_classifier")


def step_by_step(case, policy) -> list[str]:
  """Runs `amp.transform`'s step three times on its own outputs, and at
  each step the f32 step on the same inputs; `test_corpus.compare` then
  checks that step: floats within tolerance, the update within its
  allowance and pointing the same way, and integers (the decisions in the
  state, Adam's count) bit-identical. (Compared over three steps instead,
  the two runs' parameters differ by rounding after the first, and a
  routing decision on different parameters may legitimately differ.)"""
  fn, args = built(case)
  fast = amp.transform(fn, policy, **EXACT)
  reference_step = jax.jit(fn)
  problems = []
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="stablehlo-amp")
    for step in range(TRAIN_STEPS):
      actual = jax.block_until_ready(fast(*args))
      expected = reference_step(*args)
      result = compare(case, policy, actual, expected, [actual["loss"]],
                       [expected["loss"]], args[0])
      problems += [f"step {step}: {p}" for p in result.problems]
      args = (actual["params"], actual["state"], args[2])
  return problems


def test_cases_have_integer_outputs_and_their_decisions():
  """What the comparison relies on: the MoE and classifier cases output
  integers (expert indices, predictions) besides Adam's step count, and
  every f32 module contains its decision or linear algebra."""
  wanted = {"linen_moe": r"chlo\.top_k",
            "nnx_argmax_classifier": r"stablehlo\.reduce\(.*\)\s*across|"
                                     r"stablehlo\.compare",
            "gp_regression": r"lapack_spotrf|stablehlo\.cholesky"}
  for case in CASES:
    assert re.search(wanted[case.name], f32_text(case)), case.id
    expected, _ = reference(case)
    ints = [leaf for leaf in jax.tree_util.tree_leaves(expected)
            if not np.issubdtype(np.asarray(leaf).dtype, np.floating)]
    if case.name != "gp_regression":
      decided = [leaf for leaf in ints if np.asarray(leaf).size > 1]
      assert decided, f"{case.id}: no integer output of the decision"


@pytest.mark.parametrize("case, policy",
                         list(_cases("test_the_default_keeps_only_the_gate")))
def test_the_default_keeps_only_the_gate(case, policy):
  """decisions="gate" (the default) keeps in f32 only the matrix multiplies
  that gate a decision, a subset of what "exact" keeps, and says so; linear
  algebra keeps its whole cone either way."""
  fn, args = built(case)
  gate = amp.transform(fn, policy).lower(*args).report()
  dots = [d for d in gate.decisions if d.op == "stablehlo.dot_general"]
  kept = [d for d in dots if d.precision == "f32"]
  assert {d.reason_id for d in kept} <= {"gates_decision", "linear_algebra",
                                         "precision_requested"}
  assert 0 < len(kept) <= KEPT_DOTS[case.id], [(d.reason, d.loc)
                                               for d in kept]
  if case.name != "gp_regression":
    assert any(d.reason_id == "gates_decision" for d in kept), str(gate)
