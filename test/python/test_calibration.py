"""The accuracy budget: calibration keeps the fewest matrix-multiply groups
in f32 that bring every output within a tolerance of f32."""

from __future__ import annotations

import inspect
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import cli

# The errors these tests expect are XLA:CPU's: f32 dots in f32 (a GPU may
# run them in TF32) and the CPU target's rewrite (only dots lowered).
# amp.transform rewrites for and runs on the host's default backend; the
# Makefile runs the tests with JAX_PLATFORMS=cpu.
on_cpu_host = pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason=f"expects XLA:CPU's errors, the default backend here is "
    f"{jax.default_backend()} (run with JAX_PLATFORMS=cpu)")

KEYS = jax.random.split(jax.random.key(1), 5)
ARGS = (jax.random.normal(KEYS[0], (64, 64)) / 8,
        jax.random.normal(KEYS[1], (64, 64)) / 8,
        jax.random.normal(KEYS[2], (64, 16)) / 8,
        jax.random.normal(KEYS[3], (32, 64)))


def three_dots(w1, w2, w3, x):
  return (jnp.tanh(jnp.tanh(x @ w1) @ w2) @ w3) * 30.0


def _relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _bf16_dots(text: str) -> int:
  return len(re.findall(r"stablehlo\.dot_general .*\(tensor<[^>]*bf16>", text))


@on_cpu_host
def test_without_calibration_the_error_is_above_the_tightest_budgets():
  error = _relative_error(amp.transform(three_dots)(*ARGS), three_dots(*ARGS))
  assert 1e-3 < error < 1e-2, error


@on_cpu_host
@pytest.mark.parametrize("tolerance, kept_groups", [(1e-2, 0), (3e-3, 2),
                                                    (1e-3, 3)])
def test_calibration_keeps_a_minimal_set_of_groups_that_meets_the_budget(
    tolerance, kept_groups):
  fast = amp.transform(three_dots, calibrate=True, tolerance=tolerance)
  got = fast(*ARGS)
  assert _relative_error(got, three_dots(*ARGS)) <= tolerance
  lowered = fast.lower(*ARGS)
  calibration = lowered.calibration
  assert len(calibration.kept) == kept_groups
  assert calibration.error <= tolerance
  assert _bf16_dots(lowered.as_text()) == 3 - kept_groups
  groups = {e.group for e in calibration.effects}
  assert groups == {0, 1, 2}
  # The emulation below lowers the three dots and nothing else.
  lowered_ops = amp.transform(three_dots).lower(*ARGS).report().lowered
  assert {op: n for op, n in lowered_ops.items() if n} == {
      "stablehlo.dot_general": 3}
  # What calibration decided, against an expectation from first principles
  # (not its own measurements): the error of every choice of groups.
  errors = _emulated_errors()
  kept = frozenset(calibration.kept)
  assert calibration.error == pytest.approx(errors[kept], rel=1e-3, abs=1e-6)
  assert errors[kept] <= tolerance
  # Minimal: lowering any one kept group breaks the budget, and no smaller
  # set of groups meets it.
  for group in kept:
    assert errors[kept - {group}] > tolerance, (group, errors)
  assert min(len(g) for g, e in errors.items() if e <= tolerance) == len(kept)
  if kept_groups:
    # Backward elimination in program order (calibration's documented
    # search), replayed on the emulated errors: each group's
    # `error_if_low` is the error with it and the groups already lowered in
    # bf16, and it stays f32 when that breaks the budget.
    effects = {e.group: e for e in calibration.effects}
    high = frozenset(range(3))
    for group in range(3):
      candidate = high - {group}
      effect = effects[group]
      assert effect.error_if_low == pytest.approx(errors[candidate],
                                                  rel=1e-3), effect
      if errors[candidate] <= tolerance:
        high = candidate
      assert effect.kept == (group in high), effect
    assert kept == high, (str(calibration), errors)
    # The f32 program, the mixed one, every group in f32, one per group.
    assert calibration.compiles == 3 + len(calibration.effects)
  else:
    assert all(e.error_if_low is None for e in calibration.effects)
    assert calibration.compiles == 2
  assert calibration.cost_in_compiles > 1


def _bf16(a) -> np.ndarray:
  """`a` rounded to bf16 (to nearest even, as stablehlo.convert), in f64."""
  return np.asarray(jnp.asarray(a, jnp.float32).astype(jnp.bfloat16),
                    np.float64)


def _emulated_errors() -> dict[frozenset, float]:
  """three_dots' relative error for each set of its dots (groups 0, 1, 2 in
  program order) kept f32, the others lowered, emulated in f64 numpy: a
  lowered dot rounds both operands to bf16 and accumulates exactly (bf16
  products are exact in f32, so only the order of the f32 sums differs);
  nothing else is lowered (the test asserts the report says so)."""
  w1, w2, w3, x = (np.asarray(a, np.float64) for a in ARGS)

  def run(kept):
    def dot(group, a, b):
      return a @ b if group in kept else _bf16(a) @ _bf16(b)
    return dot(2, np.tanh(dot(1, np.tanh(dot(0, x, w1)), w2)), w3) * 30.0

  want = run(frozenset(range(3)))
  return {frozenset(kept): _relative_error(run(frozenset(kept)), want)
          for n in range(4) for kept in itertools.combinations(range(3), n)}


def three_dots_apart(x0, w0, x1, w1, x2, w2):
  """Three independent dots, one per output, each on its own line."""
  slightly = x0 @ w0   # slightly rounded: one operand 2^-14 off bf16
  exact = x1 @ w1      # exact in bf16: small integers
  rounded = x2 @ w2    # rounded: normal f32 operands
  return slightly, exact, rounded


def _three_dots_apart_args():
  keys = jax.random.split(jax.random.key(4), 6)

  def integers(key, shape):  # exact in bf16, and so are their f32 products
    return jax.random.randint(key, shape, -8, 8).astype(jnp.float32)

  return (integers(keys[0], (32, 64)),
          integers(keys[1], (64, 16)) * (1 + 2.0 ** -14),
          integers(keys[2], (32, 64)), integers(keys[3], (64, 16)),
          jax.random.normal(keys[4], (32, 64)),
          jax.random.normal(keys[5], (64, 16)))


@on_cpu_host
@pytest.mark.parametrize("tolerance, kept_dots", [
    (1e-2, ()), (1e-4, ("rounded",)), (1e-6, ("slightly", "rounded"))])
def test_calibration_keeps_the_groups_whose_rounding_breaks_the_budget(
    tolerance, kept_dots):
  """The ranking known by construction, not measured by calibration: of
  three independent dots, bf16 rounding costs one nothing (integer
  operands), one about 6e-5 (an operand 2^-14 off bf16) and one about 2e-3
  (normal operands), in another order than the program's. A group is kept
  f32 exactly when its own dot's error is over the budget; the exact one
  never is. Groups are matched to dots by source line, not by number."""
  args = _three_dots_apart_args()
  want = jax.jit(three_dots_apart)(*args)
  # Each dot's error with its operands rounded to bf16, from first
  # principles (f64 numpy), next to its f32 result.
  pairs = zip(args[0::2], args[1::2])
  dot_errors = {
      name: _relative_error(_bf16(a) @ _bf16(b),
                            np.asarray(a, np.float64) @ np.asarray(b))
      for name, (a, b) in zip(("slightly", "exact", "rounded"), pairs)}
  assert dot_errors["exact"] == 0.0
  assert 3e-5 < dot_errors["slightly"] < 1e-4 < dot_errors["rounded"]
  assert dot_errors["rounded"] > 1e-3

  fast = amp.transform(three_dots_apart, calibrate=True, tolerance=tolerance)
  got = fast(*args)
  calibration = fast.lower(*args).calibration
  source, first = inspect.getsourcelines(three_dots_apart)
  line_of = {re.match(r"\s*(\w+) =", text)[1]: first + i
             for i, text in enumerate(source) if " @ " in text}
  dot_of = {}
  for effect in calibration.effects:
    line = int(re.search(r":(\d+):\d+$", effect.loc)[1])
    dot_of[effect.group] = next(n for n, l in line_of.items() if l == line)
  assert sorted(dot_of.values()) == sorted(dot_errors), calibration
  assert sorted(dot_of[g] for g in calibration.kept) == sorted(kept_dots), (
      str(calibration))
  for name, error in dot_errors.items():
    assert (name in kept_dots) == (error > tolerance)
  # The outputs: the kept dots' exactly f32, the others within the budget.
  for i, name in enumerate(("slightly", "exact", "rounded")):
    error = _relative_error(got[i], want[i])
    if name in kept_dots or name == "exact":
      assert error == 0.0, (name, error)
    else:
      assert error == pytest.approx(dot_errors[name], rel=1e-2)
      assert error <= tolerance


def cancelling(w1, w2, w3, x):
  """Two dots whose results cancel, and a third that tolerates bf16."""
  return (x @ w1) - (x @ w2), jnp.tanh(x @ w3)


@on_cpu_host
def test_calibration_keeps_groups_that_matter_only_together():
  keys = jax.random.split(jax.random.key(3), 4)
  w1 = jax.random.normal(keys[0], (64, 64)) / 8
  args = (w1, w1 + 1e-3 * jax.random.normal(keys[1], (64, 64)),
          jax.random.normal(keys[2], (64, 64)) / 8,
          jax.random.normal(keys[3], (32, 64)))
  fast = amp.transform(cancelling, calibrate=True, tolerance=1e-2)
  got = fast(*args)
  want = jax.jit(cancelling)(*args)
  calibration = fast.lower(*args).calibration
  # Only the two cancelling dots need f32; the tanh's dot goes bf16 (its
  # output is about 6e-3 off, within the budget).
  assert sorted(calibration.kept) == [0, 1], str(calibration)
  assert _relative_error(got[0], want[0]) <= 1e-2
  assert 1e-3 < _relative_error(got[1], want[1]) <= 1e-2
  text = str(calibration)
  assert "group 2 (low): error if low" in text


def test_unmeasured_groups_say_so():
  fast = amp.transform(three_dots, calibrate=True, tolerance=1e-1)
  fast(*ARGS)
  text = str(fast.lower(*ARGS).calibration)
  assert text.count("not measured") == 3, text
  assert "contribution" not in text


def test_max_abs_error_measure():
  x = np.zeros((32, 64), np.float32)
  x[0, 0] = 100.0   # one large output element dominates the norm
  args = ARGS[:3] + (jnp.asarray(x) + ARGS[3] * 1e-2,)
  norm = amp.transform(three_dots, calibrate=True, tolerance=3e-3)
  max_abs = amp.transform(three_dots, calibrate=True, tolerance=3e-3,
                          error_measure="max_abs")
  norm(*args), max_abs(*args)
  by_norm = norm.lower(*args).calibration
  by_max = max_abs.lower(*args).calibration
  assert by_norm.measure == "norm" and by_max.measure == "max_abs"
  # The budget held in the max_abs measure, computed here (not by the
  # calibration's own measure).
  want = np.asarray(three_dots(*args), np.float64)
  got = np.asarray(max_abs(*args), np.float64)
  assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 3e-3
  assert "(max_abs)" in str(by_max)
  with pytest.raises(ValueError, match="error_measure='max': expected one "
                     "of 'norm', 'max_abs'"):
    amp.transform(three_dots, calibrate=True, error_measure="max")
  with pytest.raises(TypeError, match="error_measure= measures the "
                     "calibration's budget"):
    amp.transform(three_dots, error_measure="max_abs")


def test_the_two_measures_differ_where_they_should():
  from stablehlo_amp._src.calibration import _relative_error as measured
  want = [np.array([100.0, 1.0, 1.0])]
  got = [np.array([100.0, 2.0, 1.0])]
  assert measured(got, want, "norm") == pytest.approx(1 / np.sqrt(10002))
  assert measured(got, want, "max_abs") == pytest.approx(1 / 100)
  assert measured([np.array([1, 2])], [np.array([1, 3])], "max_abs") == np.inf


def test_calibration_runs_once_per_signature_and_is_cached():
  fast = amp.transform(three_dots, calibrate=True, tolerance=3e-3)
  first = fast(*ARGS)
  calibration = fast.lower(*ARGS).calibration
  second = fast(*ARGS)
  np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
  assert fast.lower(*ARGS).calibration is calibration


@on_cpu_host
def test_calibrate_on_given_inputs():
  fast = amp.transform(three_dots, calibrate=ARGS, tolerance=3e-3)
  lowered = fast.lower(*ARGS)  # calibrates on ARGS, not on what lower sees
  assert len(lowered.calibration.kept) == 2


def test_calibration_needs_arrays_and_a_budget_needs_calibration():
  fast = amp.transform(three_dots, calibrate=True)
  with pytest.raises(TypeError, match="calibrate=True calibrates on the "
                     "first call's inputs"):
    jax.jit(fast)(*ARGS)
  with pytest.raises(TypeError, match="tolerance= is the calibration's "
                     "budget: it needs calibrate="):
    amp.transform(three_dots, tolerance=1e-3)
  with pytest.raises(ValueError, match="tolerance must be positive"):
    amp.transform(three_dots, calibrate=True, tolerance=0.0)


def _write_inputs(tmp_path) -> tuple:
  module = tmp_path / "three_dots.mlir"
  module.write_text(jax.jit(three_dots).lower(*ARGS).as_text())
  inputs = tmp_path / "inputs.npz"
  np.savez(inputs, **{f"arg{i}": np.asarray(a) for i, a in enumerate(ARGS)})
  return module, inputs


@on_cpu_host
def test_amp_opt_calibrates_on_an_npz(tmp_path, capsys):
  module, inputs = _write_inputs(tmp_path)
  out = tmp_path / "out.mlir"
  status = cli.main([str(module), "--calibrate", str(inputs), "--tolerance",
                     "3e-3", "--target", "cpu", "-o", str(out)])
  err = capsys.readouterr().err
  assert status == 0, err
  assert re.search(r"calibration: tolerance 0.003 \(norm\), error without "
                   r"f32 groups 0\.00\d+, with 2 of 3 groups kept in f32", err)
  assert _bf16_dots(out.read_text()) == 1


def test_amp_opt_calibration_errors(tmp_path, capsys):
  module, inputs = _write_inputs(tmp_path)
  assert cli.main([str(module), "--tolerance", "1e-3"]) == 2
  assert "--tolerance needs --calibrate" in capsys.readouterr().err
  assert cli.main([str(module), "--calibrate", str(tmp_path / "no.npz")]) == 2
  assert "cannot read calibration inputs" in capsys.readouterr().err
  few = tmp_path / "few.npz"
  np.savez(few, arg0=np.asarray(ARGS[0]))
  assert cli.main([str(module), "--calibrate", str(few)]) == 1
  assert ("main takes 4 arguments, the calibration inputs hold 1 arrays"
          in capsys.readouterr().err)


def stored_and_reread(x, w1, w2):
  """exp(x @ w1) is large and read again after another dot: stored in bf16
  by default, an error no group of dots controls."""
  e = jnp.exp(x @ w1 / 8)
  return (jnp.tanh(x @ w2) @ w1.T) * e[:, :64].sum() + e


def test_calibration_can_turn_storage_off_to_reach_f32():
  keys = jax.random.split(jax.random.key(2), 3)
  args = (jax.random.normal(keys[0], (64, 128)),
          jax.random.normal(keys[1], (128, 128)) / 11,
          jax.random.normal(keys[2], (128, 128)) / 11)
  fast = amp.transform(stored_and_reread, calibrate=True, tolerance=1e-6,
                       target="cpu")
  got = fast(*args)
  calibration = fast.lower(*args).calibration
  from stablehlo_amp._src.calibration import STORAGE_GROUP
  assert STORAGE_GROUP in {e.group for e in calibration.effects}
  assert STORAGE_GROUP in calibration.kept
  assert calibration.error <= 1e-6
  assert _relative_error(got, jax.jit(stored_and_reread)(*args)) <= 1e-6
  assert fast.lower(*args).report().stored_low == {}
