"""The accuracy budget: calibration keeps the fewest matrix-multiply groups
in f32 that bring every output within a tolerance of f32."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import cli

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


def test_without_calibration_the_error_is_above_the_tightest_budgets():
  error = _relative_error(amp.transform(three_dots)(*ARGS), three_dots(*ARGS))
  assert 1e-3 < error < 1e-2, error


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
  if kept_groups:
    # Minimal: each kept group was tried low and broke the budget; each
    # lowered one held it. Checked here by compiling each alternative.
    for effect in calibration.effects:
      assert effect.kept == (effect.group in calibration.kept)
      assert (effect.error_if_low > tolerance) == effect.kept
    for group in calibration.kept:
      fewer = tuple(g for g in calibration.kept if g != group)
      rewritten = _with_groups_kept(fewer)
      assert _relative_error(rewritten, three_dots(*ARGS)) > tolerance
    # The f32 program, the mixed one, every group in f32, one per group.
    assert calibration.compiles == 3 + len(calibration.effects)
  else:
    assert all(e.error_if_low is None for e in calibration.effects)
    assert calibration.compiles == 2
  assert calibration.cost_in_compiles > 1


def _with_groups_kept(groups):
  """three_dots rewritten by amp-opt's pipeline with `groups` kept f32."""
  from stablehlo_amp._src import pipeline as pl
  from stablehlo_amp._src import calibration as cal
  text = jax.jit(three_dots).lower(*ARGS).as_text()
  context = pl.ir_context()
  result = pl.rewrite_module(
      text, "p=f32,c=bf16,o=f32",
      pl.RewriteOptions.make().replace(keep_groups=tuple(groups)),
      context=context, source_name="three_dots")
  with context:
    return cal._runner(result.module)(*ARGS)[0]


def cancelling(w1, w2, w3, x):
  """Two dots whose results cancel, and a third that tolerates bf16."""
  return (x @ w1) - (x @ w2), jnp.tanh(x @ w3)


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
  from stablehlo_amp._src.calibration import _relative_error as measured
  want = [np.asarray(three_dots(*args))]
  got = [np.asarray(max_abs(*args))]
  assert measured(got, want, "max_abs") <= 3e-3
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
