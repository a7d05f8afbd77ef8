"""Tests for the training API: `amp.value_and_grad`, `amp.train_step` and
`amp.PrecisionHandler`, with loss scaling fused into the compiled step.

What is checked: a step makes no host transfer and is rewritten once; f16
gradients that underflow without scaling train with it, as in f32; an
overflowed step is skipped bit for bit and training goes on; embedding
gradients (scatter-add) stay f32; clipping in an optax chain sees unscaled
gradients; gradients match JAX's; the defaults; aux outputs and model state
(kept only on finite steps); integer parameter leaves; argnums as in JAX;
p=bf16 parameters; the handler under jit; every error message; a step on
its own outputs does not compile again.
"""

from __future__ import annotations

import warnings
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from jax_events import duration_events

F16_POLICY = "p=f32,c=f16,o=f32"
BF16_POLICY = "p=f32,c=bf16,o=f32"
F32_POLICY = "p=f32,c=f32,o=f32"
F16_SMALLEST_SUBNORMAL = 2.0 ** -24  # 5.96e-8

# -- a small MLP regression ----------------------------------------------------
# Dot dimensions are all >= 8 (XLA:CPU's mixed-precision dots want that).

_KEYS = jax.random.split(jax.random.key(7), 8)
X = jax.random.normal(_KEYS[0], (160, 8))
Y = jnp.tanh(X @ (jax.random.normal(_KEYS[1], (8, 8)) / 3))
PARAMS = {"w1": jax.random.normal(_KEYS[2], (8, 16)) / 3,
          "b1": jnp.zeros(16),
          "w2": jax.random.normal(_KEYS[3], (16, 8)) / 4,
          "b2": jnp.zeros(8)}


def mlp(params, x):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return h @ params["w2"] + params["b2"]


def mse(params, batch):
  x, y = batch
  return jnp.mean((mlp(params, x) - y) ** 2)


def _batch(i: int, size: int = 8):
  return X[i * size:(i + 1) * size], Y[i * size:(i + 1) * size]


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _assert_tree_close(actual, expected, rtol):
  """Leaf by leaf, relative to each leaf's largest magnitude."""
  assert (jax.tree_util.tree_structure(actual) ==
          jax.tree_util.tree_structure(expected))
  for a, e in zip(_leaves(actual), _leaves(expected)):
    assert a.shape == e.shape
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64),
                               rtol=rtol, atol=rtol * scale)


def _f32_training(loss_fn, optimizer, params, batches):
  """The reference: plain JAX in f32."""
  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state, losses = optimizer.init(params), []
  for batch in batches:
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(float(loss))
  return params, opt_state, losses


# -- (a) no host round trip ----------------------------------------------------


def test_twenty_steps_without_a_host_transfer_and_one_rewrite():
  step = amp.train_step(mse, optax.adam(1e-2), F16_POLICY)
  state = step.init(PARAMS)
  batches = jax.block_until_ready([_batch(i) for i in range(20)])
  metrics = []
  with jax.transfer_guard("disallow"):
    # The guard is live: an implicit host-to-device copy fails. (On CPU,
    # device-to-host reads are zero-copy and not guarded; what this checks is
    # that no Python scalar or NumPy constant is sent to a step.)
    with pytest.raises(Exception, match="Disallowed host-to-device"):
      jax.jit(lambda a: a + 1)(np.ones(2, np.float32))
    for batch in batches:
      state, m = step(state, batch)
      metrics.append(m)
  assert step.rewrite_count == 1
  losses = [float(m["loss"]) for m in metrics]
  assert all(bool(m["grads_finite"]) for m in metrics)
  assert int(metrics[-1]["skipped_steps"]) == 0
  assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


# -- (b) gradients that underflow in f16 without scaling -----------------------

TINY = 1e-6  # the loss's magnitude: its backward values fall below f16's range
UNDERFLOW_STEPS = 100


def tiny_mse(params, batch):
  return TINY * mse(params, batch)


def _underflow_optimizer():
  # Adam is insensitive to the gradients' scale, so tiny f32 gradients train
  # as well as large ones (eps is lowered so as not to swamp them), and a
  # gradient that underflowed to exactly zero gives exactly no update.
  return optax.adam(1e-2, eps=1e-20)


def test_f16_gradients_underflow_to_zero_without_loss_scaling():
  batch = (X[:64], Y[:64])
  x, y = batch
  # The backward pass starts from d loss / d prediction; in f32 every element
  # is below half of f16's smallest subnormal, so in f16 it rounds to zero.
  seed_cotangent = jax.grad(lambda pred: TINY * jnp.mean((pred - y) ** 2))(
      mlp(PARAMS, x))
  assert np.count_nonzero(seed_cotangent) == seed_cotangent.size
  assert np.max(np.abs(seed_cotangent)) < F16_SMALLEST_SUBNORMAL / 2
  assert not np.any(np.asarray(seed_cotangent, np.float16))
  ref = jax.grad(tiny_mse)(PARAMS, batch)
  vg = amp.value_and_grad(tiny_mse, F16_POLICY)
  (_, grads), finite, _ = vg(PARAMS, batch, loss_scale=amp.NoOpLossScale())
  unscaled = np.concatenate([g.ravel() for g in _leaves(grads)])
  assert bool(finite)
  assert np.mean(unscaled == 0) > 0.9, "expected f16 gradients to underflow"
  (_, grads), finite, _ = vg(PARAMS, batch, loss_scale=amp.DynamicLossScale())
  assert bool(finite)
  scaled = np.concatenate([g.ravel() for g in _leaves(grads)])
  assert np.count_nonzero(scaled) == scaled.size
  _assert_tree_close(grads, ref, rtol=1e-2)


def test_loss_scaling_trains_f16_like_f32_and_without_it_nothing_moves():
  batch = (X[:64], Y[:64])
  batches = [batch] * UNDERFLOW_STEPS
  _, _, f32_losses = _f32_training(tiny_mse, _underflow_optimizer(), PARAMS,
                                   batches)

  def f16_training(loss_scale):
    # Painted (O2): the backward pass is f16 throughout, bias gradients too.
    step = amp.train_step(tiny_mse, _underflow_optimizer(), F16_POLICY,
                          loss_scale=loss_scale, level="O2")
    state, losses = step.init(PARAMS), []
    for b in batches:
      state, metrics = step(state, b)
      losses.append(float(metrics["loss"]))
    return state, metrics, losses

  scaled_state, scaled_metrics, scaled = f16_training(amp.DynamicLossScale())
  unscaled_state, _, unscaled = f16_training(amp.NoOpLossScale())
  print(f"\nunderflow demo after {UNDERFLOW_STEPS} steps: "
        f"f32 {f32_losses[-1]:.4e}, f16+scaling {scaled[-1]:.4e}, "
        f"f16 without scaling {unscaled[-1]:.4e} "
        f"(initial {f32_losses[0]:.4e})")
  # f32 trains: the loss drops by more than 10x.
  assert f32_losses[-1] < 0.1 * f32_losses[0]
  # f16 with dynamic scaling ends within 1% of f32.
  assert abs(scaled[-1] - f32_losses[-1]) <= 0.01 * f32_losses[-1]
  assert int(scaled_metrics["skipped_steps"]) == 0
  # f16 without scaling does not train: zero gradients, no update at all.
  for before, after in zip(_leaves(PARAMS), _leaves(unscaled_state.params)):
    np.testing.assert_array_equal(before, after)
  assert unscaled[-1] >= 0.99 * unscaled[0]
  assert unscaled[-1] > 10 * f32_losses[-1]


# -- (c) an overflowed step is skipped -----------------------------------------


def _poisoned(batch, value):
  x, y = batch
  return x.at[3, 5].set(value), y


def test_overflow_skips_the_step_halves_the_scale_and_training_goes_on():
  step = amp.train_step(mse, optax.adam(1e-2), F16_POLICY,
                        loss_scale=amp.DynamicLossScale(2.0 ** 10,
                                                        growth_interval=1000))
  state = step.init(PARAMS)
  for i in range(3):
    state, metrics = step(state, _batch(i))
    assert bool(metrics["grads_finite"])
  scale, skipped = 2.0 ** 10, 0
  for poison in (jnp.inf, jnp.nan):
    before = _leaves((state.params, state.opt_state))
    state, metrics = step(state, _poisoned(_batch(3), poison))
    after = _leaves((state.params, state.opt_state))
    assert not bool(metrics["grads_finite"])
    assert len(before) == len(after)
    for b, a in zip(before, after):  # adam's mu, nu and count included
      assert b.dtype == a.dtype
      assert np.array_equal(b, a), "an overflowed step changed the state"
    scale /= 2
    skipped += 1
    assert float(metrics["loss_scale"]) == scale
    assert float(state.loss_scale.loss_scale) == scale
    assert int(state.loss_scale.counter) == 0
    assert int(metrics["skipped_steps"]) == skipped
    assert int(state.skipped_steps) == skipped
    # Normal batches train again, at the lower scale.
    losses = []
    for i in range(4, 10):
      previous = _leaves(state.params)
      state, metrics = step(state, _batch(i % 4))
      assert bool(metrics["grads_finite"])
      assert not all(np.array_equal(p, q) for p, q in
                     zip(previous, _leaves(state.params)))
      losses.append(float(metrics["loss"]))
    assert int(metrics["skipped_steps"]) == skipped
    assert float(metrics["loss_scale"]) == scale
    assert losses[-1] < losses[0]
  assert step.rewrite_count == 1


@pytest.mark.parametrize("loss_scale, options", [
    (amp.StaticLossScale(1024.0), {}),
    (amp.NoOpLossScale(), {"skip_nonfinite": True})],
                         ids=["static", "noop-skip_nonfinite"])
def test_overflow_is_skipped_with_a_static_scale_or_skip_nonfinite(
    loss_scale, options):
  step = amp.train_step(mse, optax.adam(1e-2), F16_POLICY,
                        loss_scale=loss_scale, **options)
  state, _ = step(step.init(PARAMS), _batch(0))
  before = _leaves((state.params, state.opt_state))
  state, metrics = step(state, _poisoned(_batch(1), jnp.inf))
  assert not bool(metrics["grads_finite"])
  for b, a in zip(before, _leaves((state.params, state.opt_state))):
    assert np.array_equal(b, a)
  assert int(metrics["skipped_steps"]) == 1
  assert type(state.loss_scale) is type(loss_scale)
  assert float(metrics["loss_scale"]) == float(loss_scale.loss_scale)
  state, metrics = step(state, _batch(2))
  assert bool(metrics["grads_finite"])
  assert int(metrics["skipped_steps"]) == 1


@pytest.mark.parametrize("check_grads", [False, True])
def test_without_a_loss_scale_an_overflow_is_applied_not_skipped(check_grads):
  step = amp.train_step(mse, optax.adam(1e-2), F16_POLICY,
                        loss_scale=amp.NoOpLossScale(),
                        check_grads=check_grads)
  state, _ = step(step.init(PARAMS), _batch(0))
  state, metrics = step(state, _poisoned(_batch(1), jnp.inf))
  # The check is made, and reported, only when asked for.
  if check_grads:
    assert not bool(metrics["grads_finite"])
  else:
    assert "grads_finite" not in metrics
  assert int(metrics["skipped_steps"]) == 0
  assert not all(np.isfinite(x).all() for x in _leaves(state.params))


def _overflowing_sgd() -> optax.GradientTransformation:
  """SGD whose update overflows f32 on the first step (a rate of 1e60, as
  two factors f32 can hold): the gradients are finite, the new parameters
  are not."""
  return optax.chain(optax.scale(-1e30), optax.scale(1e30))


@pytest.mark.parametrize("policy", [F32_POLICY, BF16_POLICY, F16_POLICY])
def test_skip_nonfinite_never_writes_a_nonfinite_state(policy):
  plain = amp.train_step(mse, _overflowing_sgd(), policy, check_grads=True)
  state, metrics = plain(plain.init(PARAMS), _batch(0))
  # Without it the gradients pass the check and the state is written.
  assert bool(metrics["grads_finite"]) and "state_finite" not in metrics
  assert not all(np.isfinite(x).all() for x in _leaves(state.params))
  step = amp.train_step(mse, _overflowing_sgd(), policy, skip_nonfinite=True)
  start = step.init(PARAMS)
  state, metrics = step(start, _batch(0))
  assert bool(metrics["grads_finite"])
  assert not bool(metrics["state_finite"])
  assert int(metrics["skipped_steps"]) == 1
  for b, a in zip(_leaves((start.params, start.opt_state)),
                  _leaves((state.params, state.opt_state))):
    assert np.array_equal(b, a)
  # The loss scale follows the gradients alone: a finite step at f16's
  # scale does not back it off.
  assert float(state.loss_scale.loss_scale) == float(
      start.loss_scale.loss_scale)


def test_skip_nonfinite_changes_nothing_on_a_finite_step():
  ref = amp.train_step(mse, optax.adam(1e-2), BF16_POLICY)
  step = amp.train_step(mse, optax.adam(1e-2), BF16_POLICY,
                        skip_nonfinite=True)
  ref_state, step_state = ref.init(PARAMS), step.init(PARAMS)
  for i in range(3):
    ref_state, _ = ref(ref_state, _batch(i))
    step_state, metrics = step(step_state, _batch(i))
    assert bool(metrics["state_finite"])
  assert int(metrics["skipped_steps"]) == 0
  for a, b in zip(_leaves((ref_state.params, ref_state.opt_state)),
                  _leaves((step_state.params, step_state.opt_state))):
    assert np.array_equal(a, b)


def test_skip_nonfinite_is_a_train_step_option():
  with pytest.raises(TypeError, match="skip_nonfinite configures what only "
                     "amp.train_step has"):
    amp.transform(mlp, BF16_POLICY, skip_nonfinite=True)
  with pytest.raises((TypeError, ValueError), match="skip_nonfinite"):
    amp.train_step(mse, optax.sgd(0.1), BF16_POLICY, skip_nonfinite="yes")


def big_mse(params, batch):
  return 1000.0 * mse(params, batch)


def test_f16_overflow_at_the_default_scale_backs_off_until_finite():
  """No injected inf: the scaled backward pass itself overflows f16 at 2**15;
  each such step is skipped with the scale halved, until it fits."""
  batch = _batch(0, 16)
  step = amp.train_step(big_mse, optax.sgd(1e-5), F16_POLICY)
  state = step.init(PARAMS)
  scale, flags = 2.0 ** 15, []
  for _ in range(10):
    before = _leaves(state.params)
    state, metrics = step(state, batch)
    finite = bool(metrics["grads_finite"])
    flags.append(finite)
    unchanged = all(np.array_equal(b, a) for b, a in
                    zip(before, _leaves(state.params)))
    if finite:
      assert not unchanged
    else:
      assert unchanged
      scale /= 2
    assert float(metrics["loss_scale"]) == scale
  skipped = flags.count(False)
  assert skipped >= 1, "expected f16 to overflow at 2**15 for this loss"
  assert flags == [False] * skipped + [True] * (len(flags) - skipped), flags
  assert int(metrics["skipped_steps"]) == skipped
  # At the settled scale the gradients are those of f32.
  vg = amp.value_and_grad(big_mse, F16_POLICY)
  (_, grads), finite, _ = vg(state.params, batch, loss_scale=state.loss_scale)
  assert bool(finite)
  _assert_tree_close(grads, jax.grad(big_mse)(state.params, batch), rtol=1e-2)


# -- (d) embedding gradients ---------------------------------------------------

VOCAB, SEQ, DIM, BATCH = 32, 8, 16, 8


def _lm_params():
  k = jax.random.split(jax.random.key(11), 6)
  return {"tok": jax.random.normal(k[0], (VOCAB, DIM)) * 0.5,
          "pos": jax.random.normal(k[1], (SEQ, DIM)) * 0.1,
          "wq": jax.random.normal(k[2], (DIM, DIM)) / 4,
          "wk": jax.random.normal(k[3], (DIM, DIM)) / 4,
          "wv": jax.random.normal(k[4], (DIM, DIM)) / 4,
          "out": jax.random.normal(k[5], (DIM, VOCAB)) / 4}


TOKENS = jax.random.randint(jax.random.key(12), (BATCH, SEQ + 1), 0, VOCAB)


def lm_loss(params, tokens):
  """One causal attention layer over token + position embeddings."""
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  h = params["tok"][inputs] + params["pos"][jnp.arange(SEQ)]
  q, k, v = h @ params["wq"], h @ params["wk"], h @ params["wv"]
  scores = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(DIM)
  mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
  attention = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
  h = h + jnp.einsum("bts,bsd->btd", attention, v)
  logp = jax.nn.log_softmax(h @ params["out"], axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


_SCATTER = re.compile(r'"stablehlo\.scatter"\((.*?)\n\s*\}\) : \(([^)]*)\) -> '
                      r'(tensor<[^>]*>)', re.S)


def _scatter_adds(text: str) -> list[tuple[list[str], str]]:
  """(operand types, result type) of every scatter whose body adds."""
  found = []
  for match in _SCATTER.finditer(text):
    body, operands, result = match.groups()
    if "stablehlo.add" in body:
      found.append(([t.strip() for t in operands.split(",")], result))
  return found


def test_embedding_gradients_stay_f32_and_finite_in_f16_training():
  params = _lm_params()
  step = amp.train_step(lm_loss, optax.adam(1e-2), F16_POLICY)
  state = step.init(params)
  assert isinstance(state.loss_scale, amp.DynamicLossScale)
  assert float(state.loss_scale.loss_scale) == 2.0 ** 15
  text = step.lower(state, TOKENS).as_text()
  # The model does run in f16 (the check below is not vacuous) ...
  assert re.search(r"stablehlo\.dot_general .*tensor<[0-9x]*xf16>", text)
  # ... and the embedding gradients accumulate in f32.
  scatters = _scatter_adds(text)
  results = {result for _, result in scatters}
  embeddings = {f"tensor<{VOCAB}x{DIM}xf32>", f"tensor<{SEQ}x{DIM}xf32>"}
  assert embeddings <= results, results
  for operands, result in scatters:
    assert result.endswith("xf32>"), (operands, result)
    operand, _, updates = operands
    assert operand.endswith("xf32>") and updates.endswith("xf32>"), operands

  finite, losses = [], []
  for _ in range(8):
    state, metrics = step(state, TOKENS)
    finite.append(bool(metrics["grads_finite"]))
    losses.append(float(metrics["loss"]))
  settle = 3  # at most a few backoffs from 2**15 before the scale settles
  assert all(finite[settle:]), finite
  assert int(metrics["skipped_steps"]) == finite.count(False) <= settle
  assert losses[-1] < losses[0]

  vg = amp.value_and_grad(lm_loss, F16_POLICY)
  (loss, grads), grads_finite, ls = vg(params, TOKENS,
                                      loss_scale=amp.DynamicLossScale())
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(lm_loss))(params, TOKENS)
  assert bool(grads_finite) and float(ls.loss_scale) == 2.0 ** 15
  for name in ("tok", "pos"):
    assert grads[name].dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(grads[name])))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-2)
  _assert_tree_close(grads, ref_grads, rtol=2e-2)


# -- (e) clipping sees unscaled gradients --------------------------------------

CLIP_BATCH = (X[:16], jax.random.normal(_KEYS[4], (16, 8)))


def small_mse(params, batch):
  return 0.05 * mse(params, batch)


@pytest.mark.parametrize("make_optimizer", [
    lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)),
    lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)),
], ids=["clip_adam", "clip_sgd"])
def test_clipping_in_an_optax_chain_sees_unscaled_gradients(make_optimizer):
  grads = jax.grad(small_mse)(PARAMS, CLIP_BATCH)
  norm = float(optax.tree.norm(grads))
  scale = 2.0 ** 15
  # Clipping is inactive on the true gradients and would bite on scaled ones.
  assert norm < 1.0 < norm * scale
  optimizer = make_optimizer()
  ref_params, ref_opt_state, _ = _f32_training(small_mse, optimizer, PARAMS,
                                               [CLIP_BATCH])
  step = amp.train_step(small_mse, optimizer, F16_POLICY,
                        loss_scale=amp.DynamicLossScale(scale))
  state, metrics = step(step.init(PARAMS), CLIP_BATCH)
  assert bool(metrics["grads_finite"])
  _assert_tree_close(state.params, ref_params, rtol=1e-2)
  _assert_tree_close(state.opt_state, ref_opt_state, rtol=1e-2)

  # What clipping scaled gradients would give is far from it (the test can
  # tell the two apart).
  wrong_params, wrong_opt_state, _ = _f32_training(
      lambda p, b: scale * small_mse(p, b), optimizer, PARAMS, [CLIP_BATCH])
  wrong = [(a, w) for a, w in zip(_leaves((state.params, state.opt_state)),
                                  _leaves((wrong_params, wrong_opt_state)))
           if a.dtype.kind == "f"]
  assert not all(np.allclose(a, w, rtol=0.1, atol=0) for a, w in wrong)


# -- (f) value_and_grad against JAX --------------------------------------------

TOLERANCE = {F16_POLICY: 1e-2, BF16_POLICY: 5e-2}


@pytest.mark.parametrize("policy", [F16_POLICY, BF16_POLICY])
def test_value_and_grad_matches_jax_in_f32(policy):
  batch = _batch(0, 16)
  vg = amp.value_and_grad(mse, policy)
  (loss, grads), finite, _ = vg(PARAMS, batch)
  ref_loss, ref_grads = jax.value_and_grad(mse)(PARAMS, batch)
  assert bool(finite)
  assert jnp.asarray(loss).dtype == jnp.float32
  assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(grads))
  np.testing.assert_allclose(loss, ref_loss, rtol=TOLERANCE[policy])
  _assert_tree_close(grads, ref_grads, rtol=TOLERANCE[policy])


def mse_with_aux(params, batch):
  x, y = batch
  pred = mlp(params, x)
  return jnp.mean((pred - y) ** 2), {"pred_mean": jnp.mean(pred),
                                     "count": jnp.asarray(x.shape[0])}


@pytest.mark.parametrize("policy", [F16_POLICY, BF16_POLICY])
def test_value_and_grad_has_aux(policy):
  batch = _batch(1, 16)
  vg = amp.value_and_grad(mse_with_aux, policy, has_aux=True)
  ((loss, aux), grads), finite, _ = vg(PARAMS, batch)
  (ref_loss, ref_aux), ref_grads = jax.value_and_grad(
      mse_with_aux, has_aux=True)(PARAMS, batch)
  assert bool(finite)
  assert set(aux) == {"pred_mean", "count"}
  assert int(aux["count"]) == 16
  np.testing.assert_allclose(aux["pred_mean"], ref_aux["pred_mean"],
                             rtol=TOLERANCE[policy], atol=TOLERANCE[policy])
  np.testing.assert_allclose(loss, ref_loss, rtol=TOLERANCE[policy])
  _assert_tree_close(grads, ref_grads, rtol=TOLERANCE[policy])


# -- (g) defaults and the handler ----------------------------------------------


def elementwise_loss(w, x):
  # No dot: the defaults do not depend on which dots a backend can run.
  return jnp.sum(jnp.tanh(w * x))


@pytest.mark.parametrize("policy, expected", [
    (F16_POLICY, amp.DynamicLossScale), ("p=f16", amp.DynamicLossScale),
    (BF16_POLICY, amp.NoOpLossScale), (F32_POLICY, amp.NoOpLossScale)])
def test_default_loss_scale_follows_the_compute_dtype(policy, expected):
  w, x = jnp.full((8,), 0.5), jnp.linspace(-1.0, 1.0, 8)
  step = amp.train_step(elementwise_loss, optax.sgd(0.1), policy)
  state = step.init(w)
  assert type(state.loss_scale) is expected
  assert type(amp.PrecisionHandler(policy).loss_scale) is expected
  (_, grads), finite, ls = amp.value_and_grad(elementwise_loss, policy)(w, x)
  assert type(ls) is expected and bool(finite)
  if expected is amp.DynamicLossScale:
    assert float(ls.loss_scale) == 2.0 ** 15 and int(ls.counter) == 1
    assert ls.growth_interval == 2000 and ls.min_scale == 1.0
  state, metrics = step(state, x)
  # Without a loss scale the step checks nothing (check_grads=True would).
  scaled = expected is not amp.NoOpLossScale
  assert set(metrics) == {"loss", "loss_scale", "skipped_steps",
                          *(["grads_finite"] if scaled else [])}
  assert metrics["loss_scale"].dtype == jnp.float32
  if scaled:
    assert metrics["grads_finite"].dtype == jnp.bool_
  assert metrics["skipped_steps"].dtype == jnp.int32
  assert float(metrics["loss_scale"]) == (
      2.0 ** 15 if expected is amp.DynamicLossScale else 1.0)


def test_train_state_fields():
  step = amp.train_step(mse, optax.adam(1e-3), F16_POLICY)
  state = step.init(PARAMS)
  assert isinstance(state, amp.TrainState)
  assert state._fields == ("params", "opt_state", "loss_scale",
                           "skipped_steps", "model_state", "amax_history",
                           "rounding_key", "compensation")
  assert state.model_state is None and state.amax_history is None
  assert state.rounding_key is None  # update_rounding="stochastic" makes it
  assert state.compensation is None  # update_rounding="kahan" makes it
  assert int(state.skipped_steps) == 0
  assert state.skipped_steps.dtype == jnp.int32


def test_precision_handler_training_step_wrapper_keeps_the_scale_state():
  handler = amp.PrecisionHandler(
      F16_POLICY, loss_scale=amp.DynamicLossScale(2.0 ** 4, growth_interval=2))
  train = handler.training_step_wrapper(mse)
  batch = _batch(0, 16)
  loss, grads, grads_finite = train(PARAMS, batch)
  ref_loss, ref_grads = jax.value_and_grad(mse)(PARAMS, batch)
  assert bool(grads_finite)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-2)
  _assert_tree_close(grads, ref_grads, rtol=1e-2)
  assert isinstance(handler.loss_scale, amp.DynamicLossScale)
  assert (float(handler.loss_scale.loss_scale),
          int(handler.loss_scale.counter)) == (16.0, 1)
  train(PARAMS, batch)
  assert (float(handler.loss_scale.loss_scale),
          int(handler.loss_scale.counter)) == (32.0, 0)
  _, _, grads_finite = train(PARAMS, _poisoned(batch, jnp.inf))
  assert not bool(grads_finite)
  assert (float(handler.loss_scale.loss_scale),
          int(handler.loss_scale.counter)) == (16.0, 0)


def test_precision_handler_inference_wrapper():
  handler = amp.PrecisionHandler(F16_POLICY)
  x = X[:16]
  out = handler.inference_wrapper(mlp)(PARAMS, x)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, mlp(PARAMS, x), rtol=1e-2, atol=1e-2)


def _main_signature(text: str) -> str:
  match = re.search(r"func\.func public @main\((.*)", text)
  assert match, text[:500]
  return match.group(1)


def test_lower_gives_the_rewritten_step_its_report_and_executable():
  step = amp.train_step(mse, optax.sgd(0.1), F16_POLICY)
  state, batch = step.init(PARAMS), _batch(0)
  lowered = step.lower(state, batch)
  signature = _main_signature(lowered.as_text())
  assert "{amp.loss_scale}" in signature
  assert "{amp.loss_scale_counter}" in signature
  assert "{amp.grads_finite}" in signature
  assert "amp.loss_seed" not in signature
  assert "stablehlo_amp.gradients" not in lowered.as_text()
  report = lowered.report()
  assert isinstance(report, amp.Report)
  assert "f16" in str(report)
  new_state, metrics = lowered.compile()(state, batch)
  ref_state, ref_metrics = step(state, batch)
  assert float(metrics["loss"]) == float(ref_metrics["loss"])
  for a, b in zip(_leaves(new_state), _leaves(ref_state)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("api", ["train_step", "value_and_grad"])
def test_lower_returns_the_module_of_its_own_arguments(api):
  small, large = _batch(0, 8), _batch(0, 16)
  if api == "train_step":
    step = amp.train_step(mse, optax.sgd(0.1), F16_POLICY)
    state = step.init(PARAMS)
    step(state, small)
    step(state, large)
    lower = lambda batch: step.lower(state, batch)
  else:
    step = amp.value_and_grad(mse, F16_POLICY)
    step(PARAMS, small)
    step(PARAMS, large)
    lower = lambda batch: step.lower(PARAMS, batch)
  assert step.rewrite_count == 2

  def argument_types(batch):
    arguments = _main_signature(lower(batch).as_text()).split(") -> (")[0]
    return re.findall(r"tensor<[^>]*>", arguments)

  # x and y are [8, 8] or [16, 8]; w2 is [16, 8] in both.
  small_types, large_types = argument_types(small), argument_types(large)
  assert (small_types.count("tensor<8x8xf32>"),
          small_types.count("tensor<16x8xf32>")) == (2, 1), small_types
  assert (large_types.count("tensor<8x8xf32>"),
          large_types.count("tensor<16x8xf32>")) == (0, 3), large_types


# -- (h) aux outputs and model state -------------------------------------------


def mse_and_mean(params, batch):
  pred = mlp(params, batch[0])
  return jnp.mean((pred - batch[1]) ** 2), {"pred_mean": jnp.mean(pred),
                                            "count": jnp.int32(len(pred))}


def test_has_aux_comes_back_as_metrics_aux():
  step = amp.train_step(mse_and_mean, optax.sgd(0.1), BF16_POLICY,
                        has_aux=True)
  state, metrics = step(step.init(PARAMS), _batch(0))
  _, ref_aux = mse_and_mean(PARAMS, _batch(0))
  assert set(metrics) == {"loss", "loss_scale", "skipped_steps", "aux"}
  assert metrics["aux"]["count"].dtype == jnp.int32
  assert int(metrics["aux"]["count"]) == 8
  np.testing.assert_allclose(metrics["aux"]["pred_mean"],
                             ref_aux["pred_mean"], rtol=5e-2, atol=5e-3)


def normalized_mse(params, stats, batch):
  """A batch-norm-like layer: the running mean is model state, updated with
  momentum; a step counter (int32) in the state counts the updates."""
  x, y = batch
  h = x @ params["w1"]
  mean = jnp.mean(h, axis=0)
  pred = jnp.tanh(h - mean + params["b1"]) @ params["w2"] + params["b2"]
  new_stats = {"mean": 0.9 * stats["mean"] + 0.1 * mean,
               "updates": stats["updates"] + 1}
  return jnp.mean((pred - y) ** 2), new_stats


STATS = {"mean": jnp.zeros(16), "updates": jnp.int32(0)}


@pytest.mark.parametrize("has_aux", [False, True])
def test_model_state_is_updated_and_kept_only_on_finite_steps(has_aux):
  def loss_fn(params, stats, batch):
    loss, new_stats = normalized_mse(params, stats, batch)
    return (loss, (new_stats, {"loss_again": loss})) if has_aux else (
        loss, new_stats)

  step = amp.train_step(loss_fn, optax.adam(1e-2), F16_POLICY,
                        loss_scale=amp.DynamicLossScale(2.0 ** 10),
                        has_aux=has_aux)
  state = step.init(PARAMS, model_state=STATS)
  assert state.model_state is not None
  for i in range(3):
    state, metrics = step(state, _batch(i))
    assert bool(metrics["grads_finite"])
  assert int(state.model_state["updates"]) == 3
  # The running mean is f32 model state, updated as plain JAX updates it.
  want = _f32_state_updates(3)
  assert state.model_state["mean"].dtype == jnp.float32
  np.testing.assert_allclose(state.model_state["mean"], want["mean"],
                             rtol=2e-2, atol=2e-3)
  if has_aux:
    np.testing.assert_allclose(metrics["aux"]["loss_again"], metrics["loss"])

  before = _leaves((state.params, state.opt_state, state.model_state))
  state, metrics = step(state, _poisoned(_batch(3), jnp.inf))
  assert not bool(metrics["grads_finite"])
  after = _leaves((state.params, state.opt_state, state.model_state))
  assert len(before) == len(after)
  for b, a in zip(before, after):
    assert b.dtype == a.dtype
    assert np.array_equal(b, a), "an overflowed step changed the state"
  assert int(state.model_state["updates"]) == 3
  assert int(state.skipped_steps) == 1
  state, metrics = step(state, _batch(4))
  assert bool(metrics["grads_finite"])
  assert int(state.model_state["updates"]) == 4
  assert step.rewrite_count == 1


@functools.lru_cache(maxsize=None)
def _f32_state_updates(steps):
  """The model state after `steps` Adam steps of `normalized_mse` in plain
  JAX, f32."""
  optimizer = optax.adam(1e-2)

  @jax.jit
  def step(params, opt_state, stats, batch):
    (_, stats), grads = jax.value_and_grad(normalized_mse, has_aux=True)(
        params, stats, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, stats

  params, opt_state, stats = PARAMS, optimizer.init(PARAMS), STATS
  for i in range(steps):
    params, opt_state, stats = step(params, opt_state, stats, _batch(i))
  return stats


@pytest.mark.parametrize("new_stats, message", [
    (lambda s: {"mean": s["mean"].astype(jnp.bfloat16),
                "updates": s["updates"]},
     r"at \['mean'\] expected float32\[16\], got bfloat16\[16\]"),
    (lambda s: {"mean": s["mean"][:8], "updates": s["updates"]},
     r"at \['mean'\] expected float32\[16\], got float32\[8\]"),
    (lambda s: {"mean": s["mean"]},
     r"expected the structure PyTreeDef\(\{'mean': \*, 'updates': \*\}\), "
     r"got PyTreeDef\(\{'mean': \*\}\)"),
])
def test_a_new_model_state_of_another_type_is_an_error(new_stats, message):
  def changes_its_state(params, stats, batch):
    return mse(params, batch), new_stats(stats)

  step = amp.train_step(changes_its_state, optax.sgd(0.1), BF16_POLICY)
  with pytest.raises(TypeError, match=r"changes_its_state must return a new "
                     r"model state with the structure, shapes and dtypes of "
                     r"the one given: " + message):
    step(step.init(PARAMS, model_state=STATS), _batch(0))


def test_an_optimizer_state_that_changes_dtype_is_an_error():
  drifting = optax.GradientTransformation(
      lambda params: jnp.zeros((), jnp.int32),
      lambda updates, count, params=None: (updates, count + 0.5))
  step = amp.train_step(mse, drifting, BF16_POLICY)
  with pytest.raises(TypeError, match=re.escape(
      "the optimizer's update must return an optimizer state with the "
      "structure, shapes and dtypes of the one given: at the root expected "
      "int32[], got float32[]")):
    step(step.init(PARAMS), _batch(0))


# -- (i) non-float parameter leaves --------------------------------------------


def mse_counting(params, batch):
  return mse({k: v for k, v in params.items() if k != "calls"}, batch)


@pytest.mark.parametrize("make_optimizer", [
    lambda: optax.adamw(1e-2, weight_decay=0.1),
    lambda: optax.masked(optax.adam(1e-2),
                         lambda p: {k: k.startswith("w") for k in p}),
], ids=["adamw", "masked"])
def test_integer_parameter_leaves_pass_through(make_optimizer):
  params = {**PARAMS, "calls": jnp.array([7, -3], jnp.int32)}
  # check_grads: the check must skip the integer leaf too.
  step = amp.train_step(mse_counting, make_optimizer(), BF16_POLICY,
                        check_grads=True)
  state = step.init(params)
  # The optimizer sees None in place of the integer leaf: no state for it.
  assert (jax.tree_util.tree_structure(state.opt_state) ==
          jax.tree_util.tree_structure(
              make_optimizer().init({**PARAMS, "calls": None})))
  for i in range(3):
    state, metrics = step(state, _batch(i))
    assert bool(metrics["grads_finite"])
  assert state.params["calls"].dtype == jnp.int32
  np.testing.assert_array_equal(state.params["calls"], [7, -3])
  # The float leaves trained as in plain JAX without the counter.
  want, _, _ = _f32_training(mse, make_optimizer(), PARAMS,
                             [_batch(i) for i in range(3)])
  got = {k: v for k, v in state.params.items() if k != "calls"}
  _assert_tree_close(got, want, rtol=5e-2)


# -- (j) value_and_grad's argnums ----------------------------------------------


def three_argument_loss(x, params, scale, *, offset=0.0):
  return scale * mse(params, (x, Y[:len(x)])) + offset


@pytest.mark.parametrize("argnums", [1, -2, (2, 1), (-1, 0)])
def test_value_and_grad_argnums_as_in_jax(argnums):
  args = (X[:16], PARAMS, jnp.float32(1.5))
  vg = amp.value_and_grad(three_argument_loss, BF16_POLICY, argnums=argnums)
  (loss, grads), finite, _ = vg(*args, offset=0.25)
  ref_loss, ref_grads = jax.value_and_grad(three_argument_loss,
                                           argnums=argnums)(*args, offset=0.25)
  assert bool(finite)
  np.testing.assert_allclose(loss, ref_loss, rtol=5e-2)
  _assert_tree_close(grads, ref_grads, rtol=5e-2)


@pytest.mark.parametrize("argnums, error, message", [
    (3, ValueError, "argnums=3 needs at least 4 positional arguments, "
                    "three_argument_loss was called with 3"),
    ((0, -4), ValueError, "argnums=(0, -4) needs at least 4 positional "
                          "arguments, three_argument_loss was called with 3"),
    ((), ValueError, "argnums must name at least one argument, got ()"),
    ("params", TypeError, "argnums must be an int or a sequence of ints, got "
                          "'params'"),
])
def test_value_and_grad_bad_argnums(argnums, error, message):
  with pytest.raises(error, match=re.escape(message)):
    amp.value_and_grad(three_argument_loss, BF16_POLICY, argnums=argnums)(
        X[:16], PARAMS, jnp.float32(1.5))


# -- (k) the dtype contract in training ----------------------------------------


def test_p_bf16_stores_the_parameters_in_bf16():
  step = amp.train_step(mse, optax.adam(1e-2), "p=bf16,c=bf16,o=f32")
  state = step.init(PARAMS)
  assert {x.dtype for x in _leaves(state.params)} == {np.dtype(jnp.bfloat16)}
  # The optimizer state is made from, and kept in, f32.
  float_state = [x for x in _leaves(state.opt_state) if x.dtype.kind == "f"]
  assert float_state and {x.dtype for x in float_state} == {
      np.dtype(jnp.float32)}
  signature = _main_signature(step.lower(state, _batch(0)).as_text())
  # Every parameter comes in and goes out in bf16, and nothing else does.
  arguments, results = signature.split(") ->", 1)
  assert arguments.count("xbf16>") == len(PARAMS), arguments
  assert results.count("xbf16>") == len(PARAMS), results
  batches = [_batch(i) for i in range(6)]
  for batch in batches:
    previous = _leaves(state.params)
    state, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"]))
    assert not any(np.array_equal(a, b) for a, b in
                   zip(previous, _leaves(state.params)))
  assert {x.dtype for x in _leaves(state.params)} == {np.dtype(jnp.bfloat16)}
  assert {x.dtype for x in _leaves(state.opt_state) if x.dtype.kind == "f"} \
      == {np.dtype(jnp.float32)}
  want, _, _ = _f32_training(mse, optax.adam(1e-2), PARAMS, batches)
  _assert_tree_close(jax.tree_util.tree_map(
      lambda p: p.astype(jnp.float32), state.params), want, rtol=5e-2)


def _enable_x64():
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64  # older JAX releases
  return enable_x64()


def test_f64_gradients_keep_f64_under_x64():
  with _enable_x64():
    params = jax.tree_util.tree_map(lambda p: p.astype(jnp.float64), PARAMS)
    batch = jax.tree_util.tree_map(lambda b: b.astype(jnp.float64),
                                   _batch(0, 16))
    vg = amp.value_and_grad(mse, BF16_POLICY)
    (loss, grads), finite, _ = vg(params, batch)
    ref_loss, ref_grads = jax.value_and_grad(mse)(params, batch)
    assert bool(finite) and loss.dtype == jnp.float64
    assert {g.dtype for g in _leaves(grads)} == {np.dtype(jnp.float64)}
    # Nothing in the program is f32 or bf16 but the loss-scale's own scalars.
    text = vg.lower(params, batch).as_text()
    assert "bf16" not in text
    for got, want in zip(_leaves(grads), _leaves(ref_grads)):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


# -- (l) PrecisionHandler under jit, and errors --------------------------------


def test_precision_handler_training_step_is_functional_under_jit():
  handler = amp.PrecisionHandler(
      F16_POLICY, loss_scale=amp.DynamicLossScale(2.0 ** 4, growth_interval=2))
  train = handler.training_step(mse)

  @jax.jit
  def sgd_step(params, batch, loss_scale):
    loss, grads, finite, loss_scale = train(params, batch,
                                            loss_scale=loss_scale)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return params, loss, finite, loss_scale

  params, loss_scale = PARAMS, handler.loss_scale
  losses = []
  for i in range(4):
    params, loss, finite, loss_scale = sgd_step(params, _batch(i, 16),
                                                loss_scale)
    assert bool(finite)
    losses.append(float(loss))
  assert isinstance(loss_scale, amp.DynamicLossScale)
  assert (float(loss_scale.loss_scale), int(loss_scale.counter)) == (64.0, 0)
  # The handler's own state is not touched by the functional step.
  assert float(handler.loss_scale.loss_scale) == 16.0
  ref_loss, ref_grads = jax.value_and_grad(mse)(PARAMS, _batch(0, 16))
  np.testing.assert_allclose(losses[0], ref_loss, rtol=1e-2)
  _, overflow, _ = sgd_step(params, _poisoned(_batch(0, 16), jnp.inf),
                            loss_scale)[1:]
  assert not bool(overflow)


def test_precision_handler_wrapper_under_jit_points_to_training_step():
  handler = amp.PrecisionHandler(F16_POLICY)
  train = handler.training_step_wrapper(mse)
  with pytest.raises(TypeError, match=re.escape(
      "PrecisionHandler.training_step_wrapper keeps the loss scale on the "
      "handler and cannot run under jax.jit or other transformations; use "
      "handler.training_step(loss_fn), which takes and returns the loss "
      "scale")):
    jax.jit(train)(PARAMS, _batch(0))


def per_example_mse(params, batch):
  return jnp.mean((mlp(params, batch[0]) - batch[1]) ** 2, axis=-1)


@pytest.mark.parametrize("api", ["train_step", "value_and_grad"])
@pytest.mark.parametrize("has_aux, fun, got", [
    (False, per_example_mse, "float32[8]; if it returns (loss, aux), pass "
                             "has_aux=True"),
    (False, mse_and_mean, "tuple; if it returns (loss, aux), pass "
                          "has_aux=True"),
    (True, lambda p, b: (per_example_mse(p, b), None), "float32[8]"),
    (False, lambda p, b: jnp.int32(1), "int32[]; if it returns"),
])
def test_a_loss_that_is_not_a_float_scalar_is_a_type_error(api, has_aux, fun,
                                                            got):
  name = getattr(fun, "__qualname__")
  if api == "train_step":
    step = amp.train_step(fun, optax.sgd(0.1), BF16_POLICY, has_aux=has_aux)
    call = lambda: step(step.init(PARAMS), _batch(0))
  else:
    vg = amp.value_and_grad(fun, BF16_POLICY, has_aux=has_aux)
    call = lambda: vg(PARAMS, _batch(0))
  with pytest.raises(TypeError, match=re.escape(
      f"{name} must return a scalar float loss, got {got}")):
    call()


def test_init_copies_what_a_donating_step_consumes():
  params = jax.tree_util.tree_map(lambda p: p + 0, PARAMS)
  stats = jax.tree_util.tree_map(lambda s: s + 0, STATS)
  step = amp.train_step(normalized_mse, optax.sgd(0.1), BF16_POLICY,
                        donate=True)
  state = step.init(params, model_state=stats)
  first = state
  state, _ = step(state, _batch(0))
  leaves = jax.tree_util.tree_leaves
  assert all(x.is_deleted() for x in leaves((first.params,
                                             first.model_state)))
  # The caller's arrays stay valid.
  assert not any(x.is_deleted() for x in leaves((params, stats)))
  for a, b in zip(_leaves(params), _leaves(PARAMS)):
    np.testing.assert_array_equal(a, b)
  state, _ = step(state, _batch(1))
  assert int(state.model_state["updates"]) == 2
  # A second state from init runs too: it does not share the first's
  # (consumed) loss-scale arrays.
  f16 = amp.train_step(normalized_mse, optax.sgd(0.1), F16_POLICY,
                       donate=True)
  f16(f16.init(params, model_state=stats), _batch(0))
  again, _ = f16(f16.init(params, model_state=stats), _batch(0))
  assert np.isfinite(float(again.loss_scale.loss_scale))


def _count_compiles(fun) -> int:
  """XLA compilations while `fun()` runs."""
  count = [0]

  def listener(event: str, seconds: float, **kwargs):
    del seconds, kwargs
    if event.endswith("backend_compile_duration"):
      count[0] += 1

  with duration_events(listener):
    jax.block_until_ready(fun())
  return count[0]


@pytest.mark.parametrize("api", ["train_step", "value_and_grad"])
def test_a_step_on_its_own_outputs_does_not_compile_again(api):
  """Outputs come back uncommitted, as jax.jit's do, so the second call has
  the signature of the first."""
  if api == "train_step":
    step = amp.train_step(mse, optax.adam(1e-2), F16_POLICY)
    state = step.init(PARAMS)
    state, _ = step(state, _batch(0))
    assert _count_compiles(lambda: step(state, _batch(1))) == 0
  else:
    vg = amp.value_and_grad(mse, F16_POLICY)
    (_, grads), _, loss_scale = vg(PARAMS, _batch(0))
    params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, PARAMS, grads)
    assert _count_compiles(
        lambda: vg(params, _batch(1), loss_scale=loss_scale)) == 0


def test_the_report_says_where_each_decision_is_and_groups_by_phase():
  """A 2-layer model in named scopes, trained: each decision names the
  user's file:line and scope, and the text groups kept ops by phase."""
  def layer(w, x):
    with jax.named_scope("mlp"):
      return jnp.tanh(x @ w)

  def loss(params, batch):
    x, y = batch
    with jax.named_scope("model"):
      h = layer(params["w1"], x)
      out = layer(params["w2"], h)
    return jnp.mean((out - y) ** 2)

  keys = jax.random.split(jax.random.key(0), 4)
  params = {"w1": jax.random.normal(keys[0], (32, 32)),
            "w2": jax.random.normal(keys[1], (32, 8))}
  batch = (jax.random.normal(keys[2], (16, 32)),
           jax.random.normal(keys[3], (16, 8)))
  step = amp.train_step(loss, optax.adam(1e-3), "p=f32,c=bf16,o=f32")
  report = step.lower(step.init(params), batch).report()
  this_file = __file__.rsplit("/", 1)[-1]
  dots = [d for d in report.decisions if d.op == "stablehlo.dot_general"]
  assert dots and all(d.where.split("/")[-1].startswith(f"{this_file}:")
                      for d in dots), [d.where for d in dots]
  assert {d.scope for d in dots} == {"model/mlp"}
  assert {d.phase for d in dots} == {"forward", "backward"}
  adam = [d for d in report.decisions if d.phase == "optimizer"]
  assert adam and all("/optax/" in d.where for d in adam
                      if this_file not in d.where)
  # No raw location: every `where` is a short file:line (or a name).
  assert all(len(d.where) < 200 and "loc(" not in d.where
             for d in report.decisions)
  text = str(report)
  followers = sum(1 for d in report.decisions if d.precision == "f32" and
                  d.op in ("stablehlo.broadcast_in_dim", "stablehlo.constant",
                           "stablehlo.iota"))
  kept = sum(report.kept_f32.values()) - followers
  assert followers and f"kept f32: {kept} ops (and {followers} broadcasts" in text
  assert "    forward: " in text and "    backward: " in text
  assert "    optimizer: " in text
  entries = report.to_dict()["decisions"]
  assert {e["phase"] for e in entries if e["phase"]} == {
      "forward", "backward", "optimizer"}
  # Only ops without a location have no phase: jax 0.4.36 hoists constants
  # with loc(unknown).
  assert {e["op"] for e in entries if not e["phase"]} <= {"stablehlo.constant"}


def test_debug_prints_in_the_loss_run_and_the_step_is_still_rewritten(capfd):
  def loss(w, batch):
    x, y = batch
    value = jnp.mean((jnp.tanh(x @ w) - y) ** 2)
    jax.debug.print("loss {v}", v=value)
    return value

  def quiet(w, batch):
    x, y = batch
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

  keys = jax.random.split(jax.random.key(5), 3)
  w = jax.random.normal(keys[0], (32, 8)) / 6
  batch = (jax.random.normal(keys[1], (16, 32)),
           jax.random.normal(keys[2], (16, 8)))
  losses = {}
  for fn in (loss, quiet):
    step = amp.train_step(fn, optax.adam(1e-2), "p=f32,c=f16,o=f32")
    state = step.init(w)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      for _ in range(3):
        state, metrics = step(state, batch)
    losses[fn.__name__] = float(metrics["loss"])
    report = step.lower(state, batch).report()
    assert report.lowered["stablehlo.dot_general"] >= 2
  jax.effects_barrier()
  printed = [line for line in capfd.readouterr().out.splitlines()
             if line.startswith("loss ")]
  assert len(printed) == 3, printed
  # The print changes nothing else: the same rewritten step, the same loss.
  assert losses["loss"] == losses["quiet"]
  vg = amp.value_and_grad(loss, "p=f32,c=bf16,o=f32")
  (value, grads), finite, _ = vg(w, batch)
  jax.effects_barrier()
  assert bool(finite) and grads.shape == w.shape
  assert f"loss {float(value)}"[:10] in capfd.readouterr().out


def test_a_typed_key_in_the_model_state_trains():
  def loss(w, model_state, batch):
    (key,) = model_state
    key, sub = jax.random.split(key)
    keep = jax.random.bernoulli(sub, 0.5, (batch.shape[0], w.shape[1]))
    return jnp.mean((jnp.tanh(batch @ w) * keep) ** 2), (key,)

  w = jnp.ones((8, 4)) * 0.1
  batch = jnp.ones((6, 8))
  step = amp.train_step(loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32")
  state = step.init(w, model_state=(jax.random.key(1),))
  keys = []
  for _ in range(3):
    state, metrics = step(state, batch)
    keys.append(np.asarray(jax.random.key_data(state.model_state[0])))
  assert jax.dtypes.issubdtype(state.model_state[0].dtype,
                               jax.dtypes.prng_key)
  # The key advances each step, as the loss says.
  expected = jax.random.key(1)
  for got in keys:
    expected = jax.random.split(expected)[0]
    np.testing.assert_array_equal(got, jax.random.key_data(expected))
  assert np.isfinite(float(metrics["loss"]))


@pytest.mark.parametrize("option, value, message", [
    ("params", (0,), r"TrainStep does not take params=: params= selects the "
     r"parameter arguments of amp.transform"),
    ("calibrate", True, r"does not take calibrate=: calibrate= belongs to "
     r"amp.transform"),
    ("tolerance", 1e-3, r"tolerance= is calibration's budget"),
    ("storag", "f32", r"unexpected options: storag \(nearest: storage; "),
])
def test_options_train_step_does_not_take_say_where_they_belong(
    option, value, message):
  with pytest.raises(TypeError, match=message):
    amp.train_step(lambda p, b: jnp.sum(p * b), optax.sgd(0.1),
                   "p=f32,c=bf16,o=f32", **{option: value})


def _simple_loss(w, batch):
  return jnp.mean(jnp.tanh(batch @ w))


_W, _BATCH = jnp.ones((8, 4)) * 0.1, jnp.ones((2, 8))


def test_a_step_called_with_the_parameters_says_to_make_a_state():
  step = amp.train_step(_simple_loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32")
  with pytest.raises(TypeError, match=r"takes \(state, batch\), where state "
                     r"is the TrainState from step.init\(params\); got a "
                     r"\w+ as the state"):
    step(_W, _BATCH)


def test_a_model_state_loss_that_returns_a_bare_loss_says_what_to_return():
  step = amp.train_step(lambda w, ms, b: _simple_loss(w, b), optax.sgd(0.1),
                        "p=f32,c=bf16,o=f32")
  state = step.init(_W, model_state={"count": jnp.zeros(())})
  with pytest.raises(TypeError, match=r"must return \(loss, "
                     r"new_model_state\); it returned an array of shape \(\)"):
    step(state, _BATCH)


def test_argnums_on_an_integer_argument_says_to_choose_a_float_one():
  vg = amp.value_and_grad(lambda w, n: jnp.sum(w) * n, "p=f32,c=bf16,o=f32",
                          argnums=1)
  with pytest.raises(TypeError, match=r"argnums selects argument 1 of .*, "
                     r"which has no float values \(int32\)"):
    vg(_W, jnp.int32(3))


def test_an_optimizer_factory_passed_uncalled_says_to_call_it():
  with pytest.raises(TypeError, match=r"optimizer must be an optax "
                     r"GradientTransformation .*got 'sgd': call it, e.g. "
                     r"optax.sgd\(learning_rate\)"):
    amp.train_step(_simple_loss, optax.sgd, "p=f32,c=bf16,o=f32")


def test_a_state_from_another_step_is_refused():
  f16 = amp.train_step(_simple_loss, optax.sgd(0.1), "p=f32,c=f16,o=f32")
  bf16 = amp.train_step(_simple_loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32")
  with pytest.raises(TypeError, match=r"this state carries a "
                     r"DynamicLossScale, and this step \(policy "
                     r"p=f32,c=bf16,o=f32\) uses a NoOpLossScale"):
    bf16(f16.init(_W), _BATCH)
  low = amp.train_step(_simple_loss, optax.sgd(0.1), "p=bf16,c=bf16,o=f32")
  with pytest.raises(TypeError, match=r"parameter params is float32, and this "
                     r"step's policy p=bf16,c=bf16,o=f32 keeps parameters in "
                     r"bfloat16"):
    low(bf16.init(_W), _BATCH)


def test_steps_skipped_by_a_forward_overflow_warn_once(recwarn):
  """f16 whose forward pass overflows: dynamic scaling backs off to its
  minimum, every step is skipped, and the step says why, once."""
  def overflowing(w, batch):
    return jnp.mean(jnp.exp(batch @ w))  # exp(x @ w) > 65504 in f16

  step = amp.train_step(overflowing, optax.sgd(0.1), "p=f32,c=f16,o=f32",
                        level="O3",
                        loss_scale=amp.DynamicLossScale(2.0 ** 4,
                                                        min_scale=1.0))
  state = step.init(jnp.ones((8, 4)) * 3.0)
  for _ in range(8):
    state, metrics = step(state, jnp.ones((2, 8)))
  jax.effects_barrier()
  assert int(metrics["skipped_steps"]) == 8
  stuck = [w for w in recwarn if "training is not progressing" in str(
      w.message)]
  assert len(stuck) == 1, [str(w.message) for w in recwarn]
  message = str(stuck[0].message)
  assert "the loss is not finite at the current parameters, which no loss " \
         "scale can fix. It may be an overflow in float16 or a run that " \
         "diverges" in message
  assert "numerics='provenance'" in message and "c=f32" in message
  assert "(its minimum)" in message


def test_finite_steps_do_not_warn(recwarn):
  step = amp.train_step(_simple_loss, optax.sgd(0.1), "p=f32,c=f16,o=f32")
  state = step.init(_W)
  for _ in range(3):
    state, _ = step(state, _BATCH)
  jax.effects_barrier()
  assert not [w for w in recwarn if "not progressing" in str(w.message)]


# -- loose input: flags, callbacks, states of other steps ------------------------


@pytest.mark.parametrize("make", [
    lambda: amp.train_step(mse, optax.sgd(0.1), donate="yes"),
    lambda: amp.train_step(mse, optax.sgd(0.1), has_aux="no"),
    lambda: amp.value_and_grad(mse, has_aux="no"),
], ids=["train_step donate", "train_step has_aux", "value_and_grad has_aux"])
def test_a_flag_that_is_not_a_bool_is_a_type_error(make):
  # 'no' is truthy: it was taken as True.
  with pytest.raises(TypeError, match=r"(donate|has_aux) must be True or "
                     r"False, got '(yes|no)'"):
    make()


def test_keep_f32_state_of_one_argument_says_how_it_is_called():
  with pytest.raises(TypeError, match=r"keep_f32_state must be a function "
                     r"\(path, leaf\) -> bool.*cannot be called with two "
                     r"arguments.*lambda path, leaf"):
    amp.train_step(mse, optax.adam(0.1), "p=bf16,c=bf16,o=f32",
                   opt_state_dtype="bf16", keep_f32_state=lambda leaf: False)


@pytest.mark.parametrize("optimizer, hint", [
    (optax.sgd(0.1).update, r"pass the GradientTransformation itself \(for "
     r"example optax.sgd\(0.1\)\), not its update or init function"),
    (optax.sgd, r"call it, e.g. optax.sgd\(learning_rate\)"),
])
def test_an_optimizer_function_says_what_to_pass(optimizer, hint):
  # optax.sgd(0.1).update suggested optax.update_fn(...), which does not
  # exist.
  with pytest.raises(TypeError, match=r"optimizer must be an optax "
                     r"GradientTransformation .*" + hint):
    amp.train_step(mse, optimizer)


def _state_of(opt_state_dtype: str, params=None):
  step = amp.train_step(mse, optax.adam(1e-3), "p=bf16,c=bf16,o=f32",
                        opt_state_dtype=opt_state_dtype)
  return step, step.init(PARAMS if params is None else params)


@pytest.mark.parametrize("given, taken, message", [
    # An f8-state checkpoint resumed under opt_state_dtype="bf16": a raw
    # 'func.call' operand type mismatch and 3 KB of locations.
    ("f8", "bf16", r"opt_state\[0\]\.mu\['b1'\] is uint8\[1, 260\], and this "
     r"step \(opt_state_dtype='bf16'\) takes bfloat16\[16\] there: it was "
     r"made by another step or by the optimizer alone"),
    ("bf16", "f8", r"is bfloat16\[16\], and this step "
     r"\(opt_state_dtype='f8'\) takes uint8\[1, 260\]"),
    # The optimizer's own f32 state was taken silently by a bf16-state step
    # (and f32 parameters were rejected).
    ("optax", "bf16", r"is float32\[16\], and this step "
     r"\(opt_state_dtype='bf16'\) takes bfloat16\[16\]"),
    ("other shapes", "bf16", r"is bfloat16\[4, 16\], .* takes "
     r"bfloat16\[8, 16\] there: it was made for parameters of other shapes"),
])
def test_a_state_the_step_does_not_take_names_the_leaf(given, taken, message):
  step, state = _state_of(taken)
  if given == "optax":
    state = state.replace(opt_state=optax.adam(1e-3).init(PARAMS))
  elif given == "other shapes":
    other = dict(PARAMS, w1=PARAMS["w1"][:4])
    state = state.replace(opt_state=_state_of(taken, other)[1].opt_state)
  else:
    state = state.replace(opt_state=_state_of(given)[1].opt_state)
  with pytest.raises(TypeError, match=message + r".*Make the state with "
                     r"this step's init"):
    step(state, _batch(0))


def test_train_state_has_flax_style_replace():
  step = amp.train_step(mse, optax.sgd(0.1), BF16_POLICY)
  state = step.init(PARAMS)
  replaced = state.replace(skipped_steps=jnp.ones((), jnp.int32))
  assert int(replaced.skipped_steps) == 1 and replaced.params is state.params


def test_a_tracer_error_names_the_users_loss_not_the_driver():
  def my_loss(params, batch):
    if mse(params, batch) > 0:  # Python control flow on a traced value
      return mse(params, batch)
    return 0.0

  step = amp.train_step(my_loss, optax.sgd(0.1))
  vg = amp.value_and_grad(my_loss)
  for run in (lambda: step(step.init(PARAMS), _batch(0)),
              lambda: vg(PARAMS, _batch(0))):
    with pytest.raises(jax.errors.ConcretizationTypeError) as caught:
      run()
    assert "my_loss at " in str(caught.value), str(caught.value)
    assert "module_fn" not in str(caught.value)


# -- jax.vmap of value_and_grad ------------------------------------------------


@pytest.mark.parametrize("policy, loss_scale", [
    (BF16_POLICY, None), (F16_POLICY, amp.DynamicLossScale(2.0 ** 15))])
def test_vmap_of_value_and_grad_gives_per_example_gradients(policy,
                                                             loss_scale):
  """Per-example gradients, `jax.vmap(amp.value_and_grad(f))`, raised
  "Batching rule for 'amp_module_call' not implemented"; the batched
  program is rewritten in turn, with one loss scale for the batch."""
  vg = amp.value_and_grad(mse, policy)
  batch = (X[:64].reshape(16, 4, 8), Y[:64].reshape(16, 4, 8))

  def per_example(params, example):
    return vg(params, example, loss_scale=loss_scale)

  vmapped = jax.jit(jax.vmap(per_example, in_axes=(None, 0)))
  (loss, grads), finite, _ = vmapped(PARAMS, batch)
  want_loss, want_grads = jax.vmap(jax.value_and_grad(mse),
                                   in_axes=(None, 0))(PARAMS, batch)
  assert loss.shape == (16,) and grads["w1"].shape == (16, 8, 16)
  assert bool(jnp.all(finite))
  np.testing.assert_allclose(loss, want_loss, rtol=2e-2, atol=1e-3)
  for name in PARAMS:
    np.testing.assert_allclose(grads[name], want_grads[name], rtol=5e-2,
                               atol=5e-3)
  # The batched program's matrix multiplies are in the compute dtype.
  compute = policy.split("c=")[1].split(",")[0]
  text = vmapped.lower(PARAMS, batch).as_text()
  low_dots = re.findall(rf"stablehlo\.dot_general .*: \(tensor<16x[0-9x]+"
                        rf"x{compute}>, tensor<[0-9x]+x{compute}>\)", text)
  assert low_dots, text[:3000]


@pytest.mark.parametrize("make", [
    lambda **o: amp.train_step(mse, optax.sgd(0.1), BF16_POLICY, **o),
    lambda **o: amp.value_and_grad(mse, BF16_POLICY, **o),
    lambda **o: amp.transform(mlp, BF16_POLICY, **o),
], ids=["train_step", "value_and_grad", "transform"])
@pytest.mark.parametrize("value, message", [
    ("int8", r"unknown reduce-dtype 'int8' \(accepted: f32, compute, or the "
     r"compute dtype: bf16, f16\)"),
    ("f64", r"reduce-dtype 'f64': gradients are reduced in f32 or a compute "
     r"dtype"),
    ("f16", r"reduce_dtype='f16' is neither f32 nor the compute dtype of "
     r"policy p=f32,c=bf16,o=f32 \(bf16\): use 'f32', 'bf16' or 'compute'"),
])
def test_a_reduce_dtype_that_is_not_f32_or_the_compute_dtype(make, value,
                                                              message):
  with pytest.raises(ValueError, match=message):
    make(reduce_dtype=value)


def test_compiling_a_flax_lm_step_on_cpu_warns_about_nothing_harmless():
  """Every .compile() of a flax LM step on CPU warned that XLA did not keep
  7 stored values: their roundings were fused into the fusions that read
  them (nothing stored in either precision), or into one that writes a
  bf16 function of them. Only a dropped rounding or an FP8 dot run wider
  is a warning; the report still lists every fate."""
  nn = pytest.importorskip("flax.linen")

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.MultiHeadDotProductAttention(num_heads=4)(
          nn.LayerNorm()(x), mask=nn.make_causal_mask(x[..., 0]))
      x = x + h
      h = nn.Dense(128)(nn.gelu(nn.Dense(512)(nn.LayerNorm()(x))))
      return x + h

  class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      x = nn.Embed(256, 128)(tokens)
      for _ in range(2):
        x = Block()(x)
      return nn.Dense(256)(nn.LayerNorm()(x))

  model = LM()
  tokens = jax.random.randint(jax.random.key(0), (16, 65), 0, 256)
  params = model.init(jax.random.key(1), tokens[:, :-1])

  def loss(params, batch):
    logits = model.apply(params, batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, batch[:, 1:]).mean()

  step = amp.train_step(loss, optax.adamw(1e-3), BF16_POLICY)
  lowered = step.lower(step.init(params), tokens)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lowered.compile()
  assert not [w for w in caught if "stablehlo-amp" in str(w.message)], \
      [str(w.message) for w in caught]
  report = lowered.report()
  assert report.xla.stored and all(
      status in ("kept", "fused away") for status in report.xla.stored.values())
  assert "kept" in report.xla.stored.values()
