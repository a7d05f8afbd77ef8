"""The FP8 lane (`gemm=f8`): scaled e4m3fn/e5m2 GEMM operands.

On XLA:CPU the FP8 converts are emulated, so these tests check the numerics:
no value overflows to inf or NaN (the conversion saturates), a matrix
multiply's error stays within what e4m3 with per-tensor scaling allows, the
backward pass takes e5m2 for its gradient operands, and a model trains to
a held-out loss close to bf16's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp

F8 = "p=f32,c=bf16,o=f32,gemm=f8"
BF16 = "p=f32,c=bf16,o=f32"

# Unit roundoffs: e4m3 keeps 3 mantissa bits, bf16 7 (operands are rounded to
# bf16 by the precision rewrite, then scaled and rounded to e4m3).
E4M3_U, BF16_U = 2.0 ** -4, 2.0 ** -8
E4M3_MAX = 448.0
# Below e4m3fn's smallest normal (2**-6) values are subnormal, spaced 2**-9:
# an absolute rounding error of at most 2**-10 in scaled units.
E4M3_SUBNORMAL_ERROR = 2.0 ** -10


def _operand_error(x: np.ndarray) -> tuple[float, np.ndarray]:
  """(relative bound, absolute bound) of the error of x after bf16 then
  per-tensor-scaled e4m3 rounding."""
  scale = np.abs(x).max() / E4M3_MAX
  relative = (1 + BF16_U) * (1 + E4M3_U) - 1
  return relative, np.full(x.shape, E4M3_SUBNORMAL_ERROR * scale)


def e4m3_matmul_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """An elementwise bound on |fp8(x) @ fp8(w) - x @ w|.

  With |x' - x| <= d |x| + a and |w' - w| <= d |w| + b (d the relative and
  a, b the subnormal bounds), each product term is off by at most
  (d|x| + a)(|w| + d|w| + b) + |x|(d|w| + b); summed over the contraction,
  plus f32 accumulation (n 2**-24 sum |x||w|).
  """
  x, w = x.astype(np.float64), w.astype(np.float64)
  d, a = _operand_error(x)
  _, b = _operand_error(w)
  ax, aw = np.abs(x), np.abs(w)
  bound = (d * ax + a) @ ((1 + d) * aw + b) + ax @ (d * aw + b)
  return bound + x.shape[1] * 2.0 ** -24 * (ax @ aw)


def test_matmul_with_large_inputs_stays_finite_and_within_the_e4m3_bound():
  keys = jax.random.split(jax.random.key(0), 2)
  x = jax.random.uniform(keys[0], (64, 128), minval=-1e4, maxval=1e4)
  w = jax.random.normal(keys[1], (128, 32))
  fp8 = amp.transform(lambda x, w: x @ w, F8)
  got = np.asarray(fp8(x, w), np.float64)
  want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  assert np.all(np.isfinite(got))
  error = np.abs(got - want)
  bound = e4m3_matmul_bound(np.asarray(x), np.asarray(w))
  assert np.all(error <= bound), float((error / bound).max())
  # It is FP8, not bf16: the error is well above what bf16 alone gives.
  bf16 = np.asarray(amp.transform(lambda x, w: x @ w, BF16)(x, w), np.float64)
  assert (np.linalg.norm(got - want) >
          4 * np.linalg.norm(bf16 - want)), "no FP8 rounding seen"
  report = fp8.lower(x, w).report()
  assert [d.gemm for d in report.fp8_gemms] == [
      "f8e4m3fn x f8e4m3fn, current scaling"]


def test_an_all_zero_operand_gives_zeros_not_nan():
  fp8 = amp.transform(lambda x, w: x @ w, F8)
  got = fp8(jnp.zeros((32, 64)), jnp.ones((64, 16)))
  np.testing.assert_array_equal(np.asarray(got), np.zeros((32, 16)))


def test_the_report_says_why_a_dot_is_not_fp8_by_contract_id():
  # 30 rows: not a multiple of 16, so that dot stays bf16; the other is FP8.
  def f(x, w, v):
    return (x @ w).sum() + (v @ w).sum()

  args = (jnp.ones((30, 64)), jnp.ones((64, 16)), jnp.ones((32, 64)))
  # fp8_min_size=0: at these sizes the shape filter would keep both out.
  report = amp.transform(f, F8, target="gpu",
                         fp8_min_size=0).lower(*args).report()
  dots = [d for d in report.decisions if d.op == "stablehlo.dot_general"]
  assert sorted(d.gemm_reason_id for d in dots) == [
      "", "size_not_multiple_of_16"]
  assert len(report.fp8_gemms) == 1
  assert report.fp8_gemms[0].gemm == "f8e4m3fn x f8e4m3fn, current scaling"
  text = str(report)
  assert ("kept in bf16, not FP8: a size is not a multiple of 16 "
          "(cuBLASLt's FP8 requirement): 1 op") in text, text
  assert "FP8 GEMMs: 1 op (f8e4m3fn x f8e4m3fn, current scaling: 1)" in text


def test_unscaled_fp8_compute_dtype_is_rejected_pointing_to_gemm():
  with pytest.raises(ValueError, match=r"FP8 dtype 'f8e4m3fn' cannot be the "
                     r"compute dtype: .* add gemm=f8"):
    amp.transform(lambda x, w: x @ w, "p=f32,c=f8e4m3fn,o=f32")


def _mlp_problem(seed: int):
  keys = jax.random.split(jax.random.key(seed), 6)
  teacher = jax.random.normal(keys[0], (64, 16)) / 8
  params = {"w1": jax.random.normal(keys[1], (64, 128)) / 8,
            "b1": jnp.zeros(128),
            "w2": jax.random.normal(keys[2], (128, 16)) / 11.3}

  def batch(key):
    x = jax.random.normal(key, (64, 64))
    return x, jnp.tanh(x @ teacher)

  train = [batch(k) for k in jax.random.split(keys[3], 8)]
  held_out = [batch(k) for k in jax.random.split(keys[4], 4)]
  return params, train, held_out


def _loss(params, batch):
  x, y = batch
  h = jax.nn.gelu(x @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] - y) ** 2)


def _held_out_loss(policy: str, seed: int, steps: int) -> tuple[float, dict]:
  params, train, held_out = _mlp_problem(seed)
  step = amp.train_step(_loss, optax.adam(3e-3), policy)
  state = step.init(params)
  for i in range(steps):
    state, metrics = step(state, train[i % len(train)])
  assert int(metrics["skipped_steps"]) == 0
  evaluate = jax.jit(_loss)
  held = float(np.mean([evaluate(state.params, b) for b in held_out]))
  return held, step.lower(state, train[0]).report()


def test_mlp_trains_in_fp8_to_a_held_out_loss_close_to_bf16():
  """3 seeds, 150 Adam steps: FP8 (e4m3fn forward, e5m2 gradients, current
  scaling) ends within 5e-3 of bf16's held-out loss on average (the issue's
  bound is 0.05; the loss itself is about 0.09, and FP8 lands within 1e-4)."""
  differences = []
  for seed in range(3):
    fp8, report = _held_out_loss(F8, seed, 150)
    bf16, _ = _held_out_loss(BF16, seed, 150)
    differences.append(fp8 - bf16)
  assert abs(np.mean(differences)) <= 5e-3, differences
  formats = sorted(d.gemm for d in report.fp8_gemms)
  # Forward: e4m3 x e4m3; backward: one e5m2 gradient operand per dot.
  assert formats.count("f8e4m3fn x f8e4m3fn, current scaling") == 2
  assert len(formats) == 5
  assert all("f8e5m2" in f for f in formats
             if f != "f8e4m3fn x f8e4m3fn, current scaling")


def test_mlp_trains_with_delayed_scaling_like_current_scaling():
  """Delayed scaling (the max of the last 16 amaxes, carried in the state)
  trains as close to bf16 as current scaling, 3 seeds."""
  differences = []
  for seed in range(3):
    params, train, held_out = _mlp_problem(seed)
    step = amp.train_step(_loss, optax.adam(3e-3), F8,
                          fp8_scaling="delayed", amax_history=16)
    state = step.init(params)
    assert state.amax_history is None
    for i in range(150):
      state, metrics = step(state, train[i % len(train)])
    assert int(metrics["skipped_steps"]) == 0
    # One history per FP8 operand: 2 per dot, 5 dots.
    assert len(state.amax_history) == 10
    assert all(h.shape == (16,) and bool(jnp.all(h > 0))
               for h in state.amax_history)
    evaluate = jax.jit(_loss)
    delayed = float(np.mean([evaluate(state.params, b) for b in held_out]))
    bf16, _ = _held_out_loss(BF16, seed, 150)
    differences.append(delayed - bf16)
  assert abs(np.mean(differences)) <= 5e-3, differences
  report = step.lower(state, train[0]).report()
  assert all(d.gemm.endswith("delayed scaling") for d in report.fp8_gemms)


def test_delayed_scaling_saturates_values_beyond_the_history():
  """A history far below this step's amax: values beyond the delayed scale's
  range are clamped to the format's largest value, never inf or NaN; the
  history then takes the new amax."""
  params, train, _ = _mlp_problem(0)
  step = amp.train_step(_loss, optax.sgd(0.0), F8, fp8_scaling="delayed",
                        amax_history=4, check_grads=True)
  state, _ = step(step.init(params), train[0])
  tiny = tuple(jnp.full_like(h, 1e-6) for h in state.amax_history)
  state, metrics = step(state._replace(amax_history=tiny), train[0])
  assert bool(metrics["grads_finite"]) and np.isfinite(float(metrics["loss"]))
  for history in state.amax_history:
    assert float(history[0]) != np.float32(1e-6)  # this step's amax, first
    np.testing.assert_array_equal(np.asarray(history[1:]), np.float32(1e-6))


def test_an_overflowed_step_leaves_the_histories_as_they_were():
  """An inf in the batch is not clamped away by the delayed scale: it
  reaches the gradients, the step is skipped, and its amaxes stay out of
  the histories."""
  params, train, _ = _mlp_problem(0)
  step = amp.train_step(_loss, optax.sgd(1e-3), "p=f32,c=f16,o=f32,gemm=f8",
                        fp8_scaling="delayed", amax_history=4,
                        loss_scale=amp.DynamicLossScale(2.0 ** 15))
  state, _ = step(step.init(params), train[0])
  before = [np.asarray(h) for h in state.amax_history]
  x, y = train[1]
  state, metrics = step(state, (x.at[0, 0].set(jnp.inf), y))
  assert not bool(metrics["grads_finite"])
  for old, new in zip(before, state.amax_history):
    np.testing.assert_array_equal(old, np.asarray(new))


def test_delayed_scaling_is_for_train_step():
  with pytest.raises(ValueError, match="fp8_scaling='delayed' keeps state "
                     "across steps, which only amp.train_step carries; here "
                     "use current, rowwise, mxfp8"):
    amp.value_and_grad(_loss, F8, fp8_scaling="delayed")


@pytest.mark.parametrize("options", [{"fp8_scaling": "delayed"},
                                     {"amax_history": 8},
                                     {"fp8_scaling": "current",
                                      "amax_history": 8}])
def test_fp8_options_without_fp8_gemms_are_an_error(options):
  with pytest.raises(ValueError, match=r"(configures?|scales the operands "
                     r"of) FP8 GEMMs, and policy p=f32,c=bf16,o=f32 has "
                     r"none: add gemm=f8"):
    amp.train_step(_loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32", **options)
