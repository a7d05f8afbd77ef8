"""Tests for moving FP8 GEMMs to the compute dtype: by hand (`keep_gemms=`,
amp-fp8-gemms' `keep-gemms`) and from measured statistics
(`train_step(..., fp8_fallback=amp.Fp8Fallback())`).

The program is examples/fp8_fallback.py's. What is checked: `keep_gemms` keeps exactly the GEMMs it names, through
every entry point and amp-opt, by the place the report and `explain` give
them; on a step whose first layer's weight gradient underflows e5m2 almost
entirely, the fallback moves exactly that GEMM after the first step,
compiles the step once more and never again, says so in the report, and
the held-out loss follows the bf16 run's (3 seeds) where FP8 without the
fallback does not; statistics merged over `check_every` steps; every
error.
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys

import jax
import jax.numpy as jnp
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import cli


def _example(name: str):
  path = pathlib.Path(__file__).resolve().parents[2] / "examples" / name
  spec = importlib.util.spec_from_file_location(path.stem + "_example", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # a dataclass looks its module up there
  spec.loader.exec_module(module)
  return module


example = _example("fp8_fallback.py")
BF16, F8, spiked_loss = example.BF16, example.FP8, example.spiked_loss
_data, _params, _train = example.data, example.init, example.train


def _line_of(fun, text: str) -> int:
  lines, first = inspect.getsourcelines(fun)
  return next(first + i for i, line in enumerate(lines) if text in line)


FIRST_LAYER_LINE = _line_of(spiked_loss, 'z = x @ params["w1"]')


def _first_layer_weight_gradient(report: amp.Report) -> amp.OpDecision:
  """The GEMM of the first layer's backward pass whose operand is the
  spiked gradient: found by where it is and what it computes, not by
  number."""
  found = [d for d in report.decisions
           if d.gemm_index is not None and d.phase == "backward" and
           d.where.endswith(f":{FIRST_LAYER_LINE}")]
  assert len(found) == 1, [(d.gemm_index, d.where, d.phase)
                           for d in report.decisions]
  return found[0]


def test_the_fallback_moves_exactly_the_gemm_whose_gradient_underflows():
  _, step, state, train, metrics = _train(F8, 0, 4,
                                          fp8_fallback=amp.Fp8Fallback())
  report = step.lower(state, train).report()
  moved = _first_layer_weight_gradient(report)
  # Moved after the first step, from what that step measured.
  (event,) = step.fp8_fallbacks
  assert event.step == 1 and event.gemm_index == moved.gemm_index
  assert event.operand.format == "f8e5m2"
  assert event.operand.underflow_fraction > 0.99
  assert moved.gemm_reason_id == "kept" and moved.fp8_index is None
  # Every other GEMM stays FP8: the program has five, four of them FP8.
  gemms = [d for d in report.decisions if d.gemm_index is not None]
  assert len(gemms) == 5 and len(report.fp8_gemms) == 4
  assert {d.gemm_index for d in gemms} - {d.gemm_index for d in
                                          report.fp8_gemms} == {
                                              moved.gemm_index}
  # Compiled once more, then never again.
  assert step.rewrite_count == 2
  # The report says what moved it, with the figures.
  text = str(report)
  assert "moved to bf16 by fp8_fallback, from measured statistics" in text
  assert (f"backward GEMM {moved.gemm_index} at " in text and
          "after step 1, its " in text and "-> f8e5m2: 99.9" in text and
          "(limit 5.00%)" in text)
  # Its operands are bf16 now, and lose nothing measurable there.
  rows = [r for r in metrics["gemm_stats"].operands(report)
          if r.gemm.gemm_index == moved.gemm_index]
  assert {r.format for r in rows} == {"bf16"}
  assert all(r.underflow_fraction < 0.05 for r in rows)


def test_the_loss_follows_the_bf16_run_with_the_fallback_and_not_without():
  # Held-out loss after 40 steps, 3 seeds: FP8 without the fallback leaves
  # the first layer untrained (its weight gradient is zero but for one
  # column); with it, the loss is the bf16 run's within a tenth of that
  # gap.
  gaps, fallback_gaps = [], []
  for seed in range(3):
    bf16, *_ = _train(BF16, seed, 40)
    fp8, *_ = _train(F8, seed, 40)
    moved, step, *_ = _train(F8, seed, 40, fp8_fallback=amp.Fp8Fallback())
    assert len(step.fp8_fallbacks) == 1 and step.rewrite_count == 2
    gaps.append(fp8 - bf16)
    fallback_gaps.append(moved - bf16)
  assert min(gaps) > 0.05, gaps
  assert max(abs(g) for g in fallback_gaps) < 0.1 * min(gaps), (
      gaps, fallback_gaps)


def test_statistics_are_judged_over_check_every_steps():
  _, step, *_ = _train(F8, 0, 3, fp8_fallback=amp.Fp8Fallback(check_every=3))
  (event,) = step.fp8_fallbacks
  assert event.step == 3
  # 3 steps merged: three times one step's nonzero values.
  _, one, *_ = _train(F8, 0, 1, fp8_fallback=amp.Fp8Fallback())
  assert event.operand.nonzero == 3 * one.fp8_fallbacks[0].operand.nonzero


def test_a_high_threshold_moves_nothing():
  _, step, *_ = _train(F8, 0, 2,
                       fp8_fallback=amp.Fp8Fallback(underflow=0.9999,
                                                    saturation=0.5))
  assert step.fp8_fallbacks == () and step.rewrite_count == 1


def test_keep_gemms_keeps_the_gemms_it_names_everywhere(tmp_path):
  train, _, key = _data(0)
  params = _params(key)
  grad = jax.grad(spiked_loss)
  report = amp.transform(grad, F8).lower(params, train).report()
  target = _first_layer_weight_gradient(report)
  assert len(report.fp8_gemms) == 5
  kept = amp.transform(grad, F8, keep_gemms=[target.gemm_index]).lower(
      params, train).report()
  assert [d.gemm_index for d in kept.decisions if d.gemm_reason_id ==
          "kept"] == [target.gemm_index]
  assert len(kept.fp8_gemms) == 4
  # The number explain gives a GEMM is the one keep_gemms takes.
  step = amp.train_step(spiked_loss, optax.adam(1e-2), F8, numerics="stats")
  state = step.init(params)
  state, metrics = step(state, train)
  text = amp.explain(metrics, step.lower(state, train).report())
  assert f"backward GEMM {target.gemm_index} lhs -> f8e5m2" in text, text
  # The same through train_step and value_and_grad.
  step = amp.train_step(spiked_loss, optax.adam(1e-2), F8,
                        keep_gemms=(target.gemm_index,))
  state = step.init(params)
  assert len(step.lower(state, train).report().fp8_gemms) == 4
  vg = amp.value_and_grad(spiked_loss, F8, keep_gemms=(target.gemm_index,))
  assert len(vg.lower(params, train).report().fp8_gemms) == 4
  # amp-opt --keep-gemms.
  source = tmp_path / "grad.mlir"
  source.write_text(jax.jit(grad).lower(params, train).as_text())
  out = tmp_path / "out.mlir"
  assert cli.main([str(source), "--policy", F8, "--keep-gemms",
                   str(target.gemm_index), "-o", str(out)]) == 0
  assert out.read_text().count("amp_fp8") == 4


def test_gemm_places_are_the_statistics_rows_on_a_transformer():
  # The report's gemm_index (what keep_gemms takes) and stats_index (the
  # statistics' row) both count low-precision GEMMs in program order: on
  # examples/lm.py, attention and vocabulary GEMMs among them.
  import functools
  lm = _example("lm.py")
  config = lm.Config(vocab=64, d_model=64, heads=2, layers=2, seq=32,
                     batch=4)
  params = lm.init(jax.random.key(0), config)
  batch = jnp.zeros((config.batch, config.seq + 1), jnp.int32)
  step = amp.train_step(functools.partial(lm.loss_fn, config=config),
                        optax.adam(1e-3), F8, numerics="stats")
  report = step.lower(step.init(params), batch).report()
  measured = [d for d in report.decisions if d.stats_index is not None]
  assert len(measured) > 8 and report.fp8_gemms
  assert all(d.gemm_index == d.stats_index for d in measured)


@pytest.mark.parametrize("make, error, match", [
    (lambda: amp.Fp8Fallback(underflow=1.5), ValueError,
     r"0 <= underflow < 1, got 1.5"),
    (lambda: amp.Fp8Fallback(saturation=-0.1), ValueError,
     r"0 <= saturation < 1, got -0.1"),
    (lambda: amp.Fp8Fallback(underflow="5%"), ValueError,
     r"0 <= underflow < 1, got '5%'"),
    (lambda: amp.Fp8Fallback(check_every=0), ValueError,
     r"check_every=...\) is a number of steps, at least 1, got 0"),
    (lambda: amp.train_step(spiked_loss, optax.sgd(0.1), F8,
                            fp8_fallback=0.05), TypeError,
     r"fp8_fallback must be amp.Fp8Fallback\(underflow=..., saturation=..., "
     r"check_every=...\), got float"),
    (lambda: amp.train_step(spiked_loss, optax.sgd(0.1), BF16,
                            fp8_fallback=amp.Fp8Fallback()), ValueError,
     r"fp8_fallback moves FP8 GEMMs to the compute dtype, and policy "
     r"p=f32,c=bf16,o=f32 has none: add gemm=f8"),
    (lambda: amp.train_step(spiked_loss, optax.sgd(0.1), F8,
                            numerics="provenance",
                            fp8_fallback=amp.Fp8Fallback()), ValueError,
     r"fp8_fallback decides from the GEMMs' statistics \(numerics='stats'\), "
     r"and numerics='provenance' asks for something else"),
    (lambda: amp.train_step(spiked_loss, optax.sgd(0.1), F8,
                            fp8_scaling="delayed",
                            fp8_fallback=amp.Fp8Fallback()), ValueError,
     r"fp8_fallback cannot move GEMMs with fp8_scaling='delayed'"),
    (lambda: amp.transform(spiked_loss, BF16, keep_gemms=[4]), ValueError,
     r"keep_gemms keeps FP8 GEMMs in the compute dtype, and policy "
     r"p=f32,c=bf16,o=f32 has none: add gemm=f8"),
    (lambda: amp.transform(spiked_loss, F8, keep_gemms=["w1"]), ValueError,
     r"keep_gemms must be a sequence of integers, got \['w1'\]"),
    (lambda: amp.transform(spiked_loss, F8, keep_gemms=[-1]), ValueError,
     r"keep_gemms must be integers of at least 0, got \(-1,\)"),
])
def test_bad_input_is_a_clear_error(make, error, match):
  with pytest.raises(error, match=match):
    make()


def test_a_gemm_the_program_does_not_have_is_a_clear_error(capsys):
  train, _, key = _data(0)
  with pytest.raises(amp.RewriteError,
                     match=r"invalid option 'keep-gemms': no low-precision "
                     r"dot 7 \(the module has 2, numbered 0 to 1; the "
                     r"report's gemm_index\)"):
    amp.transform(spiked_loss, F8, keep_gemms=[7]).lower(_params(key), train)
  with pytest.raises(SystemExit) as exited:
    cli.main(["-", "--keep-gemms", "one"])
  assert exited.value.code == 2
  assert ("argument --keep-gemms: expected comma-separated integers, got "
          "'one'") in capsys.readouterr().err


def test_the_fallback_needs_the_statistics_between_steps():
  train, _, key = _data(0)
  step = amp.train_step(spiked_loss, optax.adam(1e-2), F8,
                        fp8_fallback=amp.Fp8Fallback())
  state = step.init(_params(key))
  with pytest.raises(TypeError, match="call the training step outside "
                     "jax.jit"):
    jax.jit(step)(state, train)


def test_the_example_runs(capsys):
  example.main(["--steps", "2", "--seeds", "1"])
  out = capsys.readouterr().out
  assert "held-out loss after 2 steps, mean (spread) over 1 seeds" in out
  assert "compiled 2 times; moved:" in out
  assert "after step 1, its lhs -> f8e5m2" in out
  assert "moved to bf16 by fp8_fallback" in out
