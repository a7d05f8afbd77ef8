"""Tests for `numerics="stats"`: per-GEMM range statistics from inside the
compiled step (amp-numerics), `amp.GemmStats` and `amp.explain`.

What is checked: the counts equal a NumPy computation on the same operands,
exactly, for e4m3 and e5m2 (after the FP8 scale), f16 (subnormals,
underflow, overflow to inf) and bf16 (as XLA:CPU reads f32: subnormals
flushed); the amax is the operand's before scaling; a step's state is the
same with and without statistics; `merge` accumulates; `explain` ranks the
GEMM whose operand loses values first and says when a step was skipped;
every error.
"""

from __future__ import annotations

import ml_dtypes
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp

FORMATS = {"f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2,
           "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def linear_loss(params, batch):
  x, y = batch
  return jnp.mean((x @ params["w"] - y) ** 2)


def _wide_range(rng, shape, low: float, high: float) -> np.ndarray:
  """Signed values spread over decades 10**low .. 10**high, a tenth zero."""
  x = np.sign(rng.standard_normal(shape)) * 10.0 ** rng.uniform(low, high,
                                                                shape)
  x[rng.random(shape) < 0.1] = 0
  return x.astype(np.float32)


def _forward_lhs(step, state, batch, metrics):
  """The statistics of the forward GEMM's lhs (the batch's x), and the
  format the report says it is rounded to."""
  report = step.lower(state, batch).report()
  forward = [d for d in report.decisions
             if d.stats_index is not None and d.phase == "forward"]
  assert len(forward) == 1
  g = forward[0].stats_index
  stats = metrics["gemm_stats"]
  return (forward[0].stats_formats[0],
          {name: np.asarray(getattr(stats, name))[g, 0]
           for name in ("amax", "nonzero", "underflow", "saturated")})


def _step_on(x: np.ndarray, policy: str, **options):
  rng = np.random.default_rng(1)
  params = {"w": jnp.asarray(rng.standard_normal((x.shape[1], 16)) * 0.1,
                             jnp.float32)}
  batch = (jnp.asarray(x), jnp.zeros((x.shape[0], 16), jnp.float32))
  step = amp.train_step(linear_loss, optax.sgd(1e-3), policy,
                        numerics="stats", target="gpu", **options)
  state = step.init(params)
  _, metrics = step(state, batch)
  return _forward_lhs(step, state, batch, metrics)


def _reference(values: np.ndarray, fmt, *, clamped: bool) -> dict:
  """NumPy's (ml_dtypes') counts for `values` rounded to `fmt`."""
  with np.errstate(over="ignore"):  # what overflows is what is counted
    rounded = values.astype(fmt).astype(np.float32)
  finite = np.isfinite(values)
  largest = float(ml_dtypes.finfo(fmt).max)
  return {"nonzero": int(np.sum(np.abs(values) > 0)),
          "underflow": int(np.sum((values != 0) & (rounded == 0))),
          "saturated": int(np.sum(finite & (
              np.abs(values) > largest if clamped else ~np.isfinite(rounded))))}


def _exact_scale(x: np.ndarray) -> np.ndarray:
  """`x` with each matrix's amax 0.875 = 448 * 2^-9 = 57344 * 2^-16: its
  E4M3 and E5M2 scales are powers of two, so the scaled values are exact
  however the device divides (XLA may multiply by the reciprocal)."""
  x = np.clip(x, -0.8, 0.8)
  x.reshape(-1, *x.shape[-2:])[:, 0, 0] = 0.875
  return x


@pytest.mark.parametrize("gemm", ["f8e4m3fn", "f8e5m2"])
def test_fp8_counts_match_numpy(gemm):
  x = _exact_scale(_wide_range(np.random.default_rng(0), (64, 96), -12, 0))
  fmt = FORMATS[gemm]
  formats, measured = _step_on(x, f"p=f32,c=bf16,o=f32,gemm={gemm}",
                               fp8_min_size=0)
  # Current scaling: the operand divided by max(amax / largest, FLT_MIN)
  # in f32, then rounded.
  largest = np.float32(ml_dtypes.finfo(fmt).max)
  scale = np.maximum(np.float32(np.abs(x).max()) / largest,
                     np.finfo(np.float32).tiny)
  scaled = (x / scale).astype(np.float32)
  expected = _reference(scaled, fmt, clamped=True)
  assert formats == gemm
  assert expected["underflow"] > 100  # the check below has something to count
  assert {k: int(measured[k]) for k in expected} == expected
  assert measured["amax"] == np.abs(x).max()


def test_f16_counts_match_numpy_subnormals_and_overflow():
  rng = np.random.default_rng(2)
  x = _wide_range(rng, (64, 96), -10, 5.2)
  # The edges: f16's smallest subnormal 2^-24 (kept), half of it (a tie:
  # to zero), just above half (kept), the largest finite 65504, 65519
  # (rounds down to it) and 65520 (the tie: to inf).
  edges = np.float32([2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 65504,
                      65519, 65520, -65520, 2.0 ** -14 * 0.75])
  x[0, :len(edges)] = edges
  formats, measured = _step_on(x, "p=f32,c=f16,o=f32")
  expected = _reference(x, np.float16, clamped=False)
  assert formats == "f16"
  assert expected["underflow"] > 100 and expected["saturated"] > 10
  assert {k: int(measured[k]) for k in expected} == expected
  assert measured["amax"] == np.abs(x).max()


def test_transform_and_value_and_grad_return_the_statistics():
  rng = np.random.default_rng(4)
  x = _wide_range(rng, (64, 96), -10, 5.2)
  w = jnp.asarray(rng.standard_normal((96, 16)) * 0.1, jnp.float32)
  expected = _reference(x, np.float16, clamped=False)
  fast = amp.transform(lambda x, w: x @ w, "p=f32,c=f16,o=f32",
                       numerics="stats", target="gpu")
  (decision,) = [d for d in fast.lower(x, w).report().decisions
                 if d.stats_index is not None]
  out, measured = fast(x, w)
  assert out.shape == (64, 16)
  stats = measured["gemm_stats"]
  assert {k: int(np.asarray(getattr(stats, k))[decision.stats_index, 0])
          for k in expected} == expected
  # value_and_grad: the same forward GEMM among its GEMMs, a fourth element.
  vg = amp.value_and_grad(linear_loss, "p=f32,c=f16,o=f32",
                          numerics="stats", target="gpu")
  batch = (x, jnp.zeros((64, 16)))
  report = vg.lower({"w": w}, batch).report()
  (forward,) = [d for d in report.decisions
                if d.stats_index is not None and d.phase == "forward"]
  *_, measured = vg({"w": w}, batch)
  stats = measured["gemm_stats"]
  assert {k: int(np.asarray(getattr(stats, k))[forward.stats_index, 0])
          for k in expected} == expected
  assert "Low-precision GEMMs: " in amp.explain(measured, report)


def test_bf16_counts_match_numpy_as_xla_cpu_reads_f32():
  rng = np.random.default_rng(3)
  x = _wide_range(rng, (64, 96), -30, 30)
  # bf16 overflows to inf from (2 - 2^-8) * 2^127 (a tie, to inf: the
  # largest bf16's significand is odd); f32's smallest normal is kept.
  top = np.float32((2 - 2.0 ** -8) * 2.0 ** 127)
  edges = np.float32([top, np.nextafter(top, np.float32(0)), -top,
                      np.finfo(np.float32).max, np.finfo(np.float32).tiny])
  x[0, :len(edges)] = edges
  formats, measured = _step_on(x, "p=f32,c=bf16,o=f32")
  expected = _reference(x, ml_dtypes.bfloat16, clamped=False)
  assert formats == "bf16"
  assert expected["saturated"] == 3
  assert {k: int(measured[k]) for k in expected} == expected


def test_bf16_underflow_needs_f32_subnormals_which_xla_cpu_flushes():
  # Every f32 value that underflows bf16 (|x| <= 2^-134) is an f32
  # subnormal; XLA:CPU reads those as zero, so they count as zeros.
  x = np.zeros((16, 32), np.float32)
  x[0, :4] = np.float32([2.0 ** -135, 2.0 ** -140, 1.0, 2.0 ** -120])
  _, measured = _step_on(x, "p=f32,c=bf16,o=f32")
  assert int(measured["nonzero"]) == 2
  assert int(measured["underflow"]) == 0


def _mlp_loss(params, batch):
  x, y = batch
  h = jnp.tanh(x @ params["w1"])
  out = h @ params["w2"]  # the GEMM whose weights span 12 decades
  return jnp.mean((out - y) ** 2)


def _mlp_setup(policy: str = "p=f32,c=bf16,o=f32,gemm=f8", **options):
  rng = np.random.default_rng(4)
  params = {"w1": jnp.asarray(rng.standard_normal((32, 64)) * 0.2,
                              jnp.float32),
            "w2": jnp.asarray(_wide_range(rng, (64, 16), -12, 0))}
  batch = (jnp.asarray(rng.standard_normal((128, 32)), jnp.float32),
           jnp.zeros((128, 16), jnp.float32))
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), policy, target="gpu",
                        fp8_min_size=0, **options)
  return step, params, batch


def test_explain_ranks_the_gemm_that_loses_values_first():
  step, params, batch = _mlp_setup(numerics="stats")
  state = step.init(params)
  state, metrics = step(state, batch)
  report = step.lower(state, batch).report()
  text = amp.explain(metrics, report)
  worst = text.splitlines()[2]
  line = _mlp_loss.__code__.co_firstlineno + 3  # `out = h @ params["w2"]`
  assert f"test_numerics.py:{line}" in worst, text
  assert "f8e4m3fn" in worst and "underflow" in worst
  rows = metrics["gemm_stats"].operands(report)
  assert rows[0].underflow_fraction > 0.3
  assert len(rows) == 2 * metrics["gemm_stats"].amax.shape[0]


def test_statistics_change_nothing_the_step_computes():
  with_stats, params, batch = _mlp_setup(numerics="stats")
  without, _, _ = _mlp_setup()
  a, metrics_a = with_stats(with_stats.init(params), batch)
  b, metrics_b = without(without.init(params), batch)
  for x, y in zip(jax.tree_util.tree_leaves(a.params),
                  jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert float(metrics_a["loss"]) == float(metrics_b["loss"])
  assert "gemm_stats" not in metrics_b


def test_merge_accumulates_over_steps():
  step, params, batch = _mlp_setup(numerics="stats")
  state = step.init(params)
  state, first = step(state, batch)
  state, second = step(state, batch)
  total = first["gemm_stats"].merge(second["gemm_stats"])
  np.testing.assert_array_equal(
      total.underflow,
      first["gemm_stats"].underflow + second["gemm_stats"].underflow)
  np.testing.assert_array_equal(
      total.amax, np.maximum(first["gemm_stats"].amax,
                             second["gemm_stats"].amax))
  assert np.all(np.asarray(total.underflow_fraction) <= 1)
  # Merged statistics explain like a step's.
  assert "underflow" in amp.explain(total, step.lower(state, batch).report())


def test_explain_says_a_step_was_skipped():
  _, params, batch = _mlp_setup()
  step = amp.train_step(_mlp_loss, optax.sgd(1e-3), "p=f32,c=f16,o=f32",
                        target="gpu", numerics="stats")
  state = step.init(params)
  huge = (batch[0] * 1e30, batch[1])
  state, metrics = step(state, huge)
  assert not bool(metrics["grads_finite"])
  text = amp.explain(metrics, step.lower(state, huge).report())
  assert text.startswith("This step was skipped: its gradients were not "
                         "finite.")
  assert "saturate" in text


def test_bad_numerics_values_and_entry_points():
  with pytest.raises(ValueError, match=r"accepted: none, stats"):
    amp.train_step(linear_loss, optax.sgd(1e-3), numerics="stat")
  step, params, batch = _mlp_setup(numerics="stats")
  state, metrics = step(step.init(params), batch)
  other = amp.transform(lambda x, w: x @ w, "p=f32,c=bf16,o=f32",
                        target="gpu")
  other_report = other.lower(batch[0], params["w1"]).report()
  with pytest.raises(ValueError, match=r"give the report of the step"):
    amp.explain(metrics, other_report)
  with pytest.raises(TypeError, match=r"explain needs amp.explain\(metrics, "
                     r"step\) .*or its Report \(.report\(\)\); got str"):
    amp.explain(metrics, "report")
  none_step, _, _ = _mlp_setup()
  _, plain = none_step(none_step.init(params), batch)
  assert "numerics='stats'" in amp.explain(plain, other_report)


def test_the_example_runs_and_explains(capsys):
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[2] / "examples" / \
      "numerics.py"
  spec = importlib.util.spec_from_file_location("numerics_example", path)
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  example.main(["--steps", "2", "--d-model", "32", "--layers", "1"])
  out = capsys.readouterr().out
  assert "p=f32,c=f16,o=f32, loss scale none, 2 steps" in out
  assert "Low-precision GEMMs:" in out and "lm.py:" in out


def _scanned_loss(params, batch):
  x, y = batch

  def layer(h, w):
    return jnp.tanh(h @ w), None
  h, _ = jax.lax.scan(layer, x, params["w"])
  return jnp.mean((h - y) ** 2)


@pytest.mark.parametrize("policy", ["p=f32,c=f16,o=f32",
                                    "p=f32,c=bf16,o=f32,gemm=f8e4m3fn"])
def test_gemms_in_a_scan_are_measured_over_its_iterations(policy):
  """The layers of a `lax.scan` share one GEMM in the loop body: its
  statistics are those of every layer's weights, counted once each."""
  rng = np.random.default_rng(5)
  layers = 3
  w = _exact_scale(_wide_range(rng, (layers, 32, 32), -10, 0))
  batch = (jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),
           jnp.zeros((16, 32), jnp.float32))
  options = {"fp8_min_size": 0} if "gemm" in policy else {}
  step = amp.train_step(_scanned_loss, optax.sgd(1e-3), policy,
                        numerics="stats", target="gpu", **options)
  state = step.init({"w": jnp.asarray(w)})
  _, metrics = step(state, batch)
  report = step.lower(state, batch).report()
  forward = [d for d in report.decisions
             if d.stats_index is not None and d.phase == "forward"]
  assert len(forward) == 1  # the loop body's GEMM
  g = forward[0].stats_index
  stats = metrics["gemm_stats"]
  if "gemm" in policy:
    # Each layer's slice is quantized with its own scale (2^-9: amax
    # 0.875), from the stacked weights the loop rounded to bf16 before
    # slicing them: what the GEMM's quantization reads.
    fmt = ml_dtypes.float8_e4m3fn
    read = w.astype(ml_dtypes.bfloat16).astype(np.float32)
    scaled = (read * np.float32(2.0 ** 9)).astype(np.float32)
    expected = _reference(scaled, fmt, clamped=True)
  else:
    expected = _reference(w, np.float16, clamped=False)
  assert expected["underflow"] > 50
  measured = {k: int(np.asarray(getattr(stats, k))[g, 1]) for k in expected}
  assert measured == expected
  assert float(np.asarray(stats.amax)[g, 1]) == np.abs(w).max()
