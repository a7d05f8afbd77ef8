"""update_rounding="stochastic" | "kahan": bf16 parameters rounded from
their f32 update without bias, or with a bf16 buffer carrying what each
rounding lost (amp-round-state), so updates below bf16's resolution
accumulate as they do in f32; opt_state_dtype="bf16": the optimizer's
state stored in bf16."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import hlo
from stablehlo_amp._src.train_state import encode_f8

BF16 = "p=bf16,c=bf16,o=f32"


def _assert_bit_identical(expected, got):
  """Same structure, dtypes and bits, leaf by leaf."""
  assert (jax.tree_util.tree_structure(expected) ==
          jax.tree_util.tree_structure(got))
  for a, b in zip(jax.tree_util.tree_leaves(expected),
                  jax.tree_util.tree_leaves(got)):
    assert np.asarray(a).dtype == np.asarray(b).dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _linear(w, b):
  return jnp.sum(w * b)  # the gradient is b: each SGD update is -lr * b


def _run(rounding, params, batches, lr=1.0, policy=BF16, **options):
  step = amp.train_step(_linear, optax.sgd(lr), policy,
                        update_rounding=rounding, **options)
  state = step.init(params)
  for batch in batches:
    state, metrics = step(state, batch)
  return step, state, metrics


def test_updates_below_half_an_ulp_accumulate_only_when_stochastic():
  """16 updates of 2^-10 from 1.0 (a bf16 ulp there is 2^-7): rounded to
  nearest each is lost; rounded stochastically the mean over 4096
  parameters follows f32 (sd of the mean about 1.6e-4)."""
  n, steps = 4096, 16
  batches = [jnp.full((n,), -2.0 ** -10)] * steps
  _, nearest, _ = _run("nearest", jnp.ones((n,)), batches)
  _, stochastic, _ = _run("stochastic", jnp.ones((n,)), batches)
  assert nearest.params.dtype == stochastic.params.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(nearest.params, np.float32), 1.0)
  mean = float(np.asarray(stochastic.params, np.float32).mean())
  assert abs(mean - (1 + steps * 2.0 ** -10)) < 8e-4, mean


def test_each_value_rounds_to_a_neighbour_and_the_mean_error_is_zero():
  """One step from random bf16 parameters by random f32 updates: every new
  value is one of the two bf16 neighbours of the f32 result, and the mean
  rounding error, in ulps, is zero within its statistical spread (nearest
  rounding's would not be: it is biased whenever the updates are small)."""
  rng = np.random.default_rng(0)
  n = 1 << 16
  params = rng.uniform(1, 1.9, n).astype(ml_dtypes.bfloat16).astype(np.float32)
  update = rng.uniform(0, 2.0 ** -8, n).astype(np.float32)  # < half an ulp
  exact = params + update
  _, state, _ = _run("stochastic", jnp.asarray(params),
                     [jnp.asarray(-update)])
  got = np.asarray(state.params, np.float32)
  ulp = 2.0 ** -7
  below = np.floor(exact / ulp) * ulp
  assert np.all((got == below) | (got == below + ulp))
  errors = (got - exact) / ulp
  assert abs(errors.mean()) < 5 * errors.std() / np.sqrt(n), errors.mean()
  # Rounded up as often as the distance says: about a quarter of them here.
  up = float((got > below).mean())
  expected_up = float(((exact - below) / ulp).mean())
  assert abs(up - expected_up) < 0.01, (up, expected_up)


def test_kahan_compensation_follows_f32_within_half_an_ulp():
  """40 steps of random updates below half a bf16 ulp from random bf16
  parameters: rounded to nearest nothing moves; with Kahan compensation the
  parameter plus its buffer follows the f32 trajectory. The buffer
  (|c| <= 2^-8 here) is itself rounded to bf16 each step, an error of at
  most 2^-17, so after 40 steps they differ by at most 40 * 2^-17 (a tenth
  of a bf16 ulp), and the parameter is the f32 value rounded to bf16,
  within half an ulp plus that."""
  rng = np.random.default_rng(1)
  n, steps = 4096, 40
  params = rng.uniform(1, 1.9, n).astype(ml_dtypes.bfloat16).astype(np.float32)
  updates = [rng.uniform(-2.0 ** -9, 2.0 ** -9, n).astype(np.float32)
             for _ in range(steps)]
  batches = [jnp.asarray(-u) for u in updates]
  exact = params.copy()
  for u in updates:
    exact = (exact + u).astype(np.float32)
  _, nearest, _ = _run("nearest", jnp.asarray(params), batches)
  step, kahan, _ = _run("kahan", jnp.asarray(params), batches)
  np.testing.assert_array_equal(np.asarray(nearest.params, np.float32),
                                params)
  assert kahan.params.dtype == kahan.compensation.dtype == jnp.bfloat16
  got = np.asarray(kahan.params, np.float32)
  carried = np.asarray(kahan.compensation, np.float32)
  ulp = 2.0 ** -7  # of values in [1, 2)
  drift = steps * 2.0 ** -17
  assert np.max(np.abs(got + carried - exact)) <= drift
  assert np.max(np.abs(got - exact)) <= ulp / 2 + drift
  assert np.max(np.abs(carried)) <= ulp / 2
  # The state holds one bf16 buffer per parameter, zero at first.
  np.testing.assert_array_equal(
      np.asarray(step.init(jnp.asarray(params)).compensation, np.float32), 0)


def test_kahan_buffers_only_for_bf16_parameters_in_the_params_tree():
  """A pytree of parameters: each bf16 leaf gets a buffer of its shape; an
  integer leaf gets None; the buffers come back in the same tree."""
  def loss(p, b):
    return jnp.sum(p["w"] * b) + jnp.sum(p["v"]) + 0 * p["n"]
  step = amp.train_step(loss, optax.sgd(1.0), BF16, update_rounding="kahan")
  params = {"w": jnp.ones((8,)), "v": jnp.ones((2, 3)),
            "n": jnp.zeros((), jnp.int32)}
  state = step.init(params)
  assert state.compensation["n"] is None
  assert state.compensation["v"].shape == (2, 3)
  for _ in range(8):  # 8 updates of a quarter ulp: two ulps
    state, _ = step(state, jnp.full((8,), -2.0 ** -9))
  np.testing.assert_array_equal(np.asarray(state.params["w"], np.float32),
                                1 + 2 * 2.0 ** -7)
  assert (jax.tree_util.tree_structure(state.compensation) ==
          jax.tree_util.tree_structure(step.init(params).compensation))
  assert int(state.params["n"]) == 0


def test_rounding_decisions_are_independent_across_elements_tensors_steps():
  """The random words are a hash of each element's index under a key per
  tensor and step: at exactly half an ulp each value rounds up as a fair
  coin would, uncorrelated with its neighbours along either axis, with
  the same element of another tensor of the same shape, and with its own
  decision on the next step (a weak hash or a key shared between tensors
  or steps correlates them; 4 sd of a correlation here is 0.016)."""
  shape, ones = (256, 256), jnp.ones((256, 256), jnp.bfloat16)
  step = amp.train_step(
      lambda p, b: jnp.sum(p["a"] * b) + jnp.sum(p["b"] * b), optax.sgd(1.0),
      BF16, update_rounding="stochastic")
  half_ulp = jnp.full(shape, -2.0 ** -8)  # 1 + 2^-8: between 1 and 1 + 2^-7
  state, _ = step(step.init({"a": ones, "b": ones}), half_ulp)
  again, _ = step(state._replace(params={"a": ones, "b": ones}), half_ulp)
  up = {name: np.asarray(s.params[t], np.float32).ravel() > 1
        for name, s, t in (("a", state, "a"), ("b", state, "b"),
                           ("a next", again, "a"))}
  grid = up["a"].reshape(shape)

  def corr(x, y):
    return float(np.corrcoef(x.ravel(), y.ravel())[0, 1])

  assert abs(up["a"].mean() - 0.5) < 0.01 and abs(up["b"].mean() - 0.5) < 0.01
  for name, c in (("row neighbours", corr(grid[:, :-1], grid[:, 1:])),
                  ("column neighbours", corr(grid[:-1], grid[1:])),
                  ("other tensor", corr(up["a"], up["b"])),
                  ("next step", corr(up["a"], up["a next"]))):
    assert abs(c) < 0.02, (name, c)


def test_the_key_advances_and_the_step_is_reproducible_from_the_state():
  batches = [jnp.full((64,), -2.0 ** -10)] * 3
  step, state, _ = _run("stochastic", jnp.ones((64,)), batches)
  again = step.init(jnp.ones((64,)))
  for batch in batches:
    again, _ = step(again, batch)
  np.testing.assert_array_equal(np.asarray(state.params, np.float32),
                                np.asarray(again.params, np.float32))
  np.testing.assert_array_equal(state.rounding_key, again.rounding_key)
  assert not np.array_equal(state.rounding_key,
                            step.init(jnp.ones((64,))).rounding_key)
  other = step.init(jnp.ones((64,)), rounding_seed=1)
  assert not np.array_equal(other.rounding_key,
                            step.init(jnp.ones((64,))).rounding_key)


def _carried(state):
  return (state.params, state.opt_state, state.rounding_key,
          state.compensation)


@pytest.mark.parametrize("rounding", ["stochastic", "kahan"])
def test_an_overflowed_step_leaves_parameters_and_key_bit_identical(rounding):
  step = amp.train_step(_linear, optax.adam(1e-3), "p=bf16,c=f16,o=f32",
                        update_rounding=rounding,
                        loss_scale=amp.DynamicLossScale(2.0 ** 8))
  state = step.init(jnp.linspace(1, 2, 256))
  state, _ = step(state, jnp.full((256,), 0.5))
  if rounding == "kahan":  # the buffer holds something to keep
    assert np.any(np.asarray(state.compensation, np.float32) != 0)
  after, metrics = step(state, jnp.full((256,), jnp.inf))
  assert not bool(metrics["grads_finite"])
  _assert_bit_identical(_carried(state), _carried(after))


@pytest.mark.parametrize("rounding", ["stochastic", "kahan"])
def test_a_checkpoint_holds_the_key_and_training_resumes_identically(
    rounding):
  serialization = pytest.importorskip("flax.serialization")
  batches = [jnp.full((128,), -2.0 ** -10 * (i + 1)) for i in range(6)]
  step = amp.train_step(_linear, optax.adam(1e-3), BF16,
                        update_rounding=rounding)
  straight = step.init(jnp.ones((128,)))
  for batch in batches:
    straight, _ = step(straight, batch)
  state = step.init(jnp.ones((128,)))
  for batch in batches[:3]:
    state, _ = step(state, batch)
  restored = serialization.from_bytes(step.init(jnp.ones((128,))),
                                      serialization.to_bytes(state))
  _assert_bit_identical(_carried(state), _carried(restored))
  for batch in batches[3:]:
    restored, _ = step(restored, batch)
  _assert_bit_identical(restored, straight)


def test_rounding_needs_bf16_parameters_and_a_state_with_its_buffers():
  with pytest.raises(ValueError, match=r"update_rounding='stochastic' rounds "
                     r"bf16 parameters, and policy p=f32,c=bf16,o=f32 keeps "
                     r"them in float32"):
    amp.train_step(_linear, optax.sgd(0.1), "p=f32,c=bf16,o=f32",
                   update_rounding="stochastic")
  with pytest.raises(ValueError, match=r"update_rounding='kahan' rounds "
                     r"bf16 parameters, and policy p=f32,c=bf16,o=f32"):
    amp.train_step(_linear, optax.sgd(0.1), "p=f32,c=bf16,o=f32",
                   update_rounding="kahan")
  with pytest.raises(ValueError,
                     match=r"accepted: nearest, stochastic, kahan"):
    amp.train_step(_linear, optax.sgd(0.1), BF16, update_rounding="up")
  nearest = amp.train_step(_linear, optax.sgd(0.1), BF16,
                           update_rounding="nearest")
  stochastic = amp.train_step(_linear, optax.sgd(0.1), BF16)  # the default
  kahan = amp.train_step(_linear, optax.sgd(0.1), BF16,
                         update_rounding="kahan")
  assert stochastic.init(jnp.ones(4)).rounding_key is not None
  assert nearest.init(jnp.ones(4)).rounding_key is None
  with pytest.raises(TypeError, match="holds no rounding key"):
    stochastic(nearest.init(jnp.ones(4)), jnp.ones(4))
  with pytest.raises(TypeError, match="holds no compensation buffer"):
    kahan(nearest.init(jnp.ones(4)), jnp.ones(4))


# -- compressed optimizer state ------------------------------------------------


def _mlp_loss(p, batch):
  x, y = batch
  return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)


def _mlp(seed=0, hidden=128, outputs=4):
  rng = np.random.default_rng(seed)
  params = {"w1": jnp.asarray(rng.normal(size=(32, hidden)) * 0.1, jnp.float32),
            "w2": jnp.asarray(rng.normal(size=(hidden, outputs)) * 0.1,
                              jnp.float32)}
  batch = (jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
           jnp.asarray(rng.normal(size=(64, outputs)), jnp.float32))
  return params, batch


def _state_bytes_per_parameter(state, params) -> float:
  count = sum(np.size(x) for x in jax.tree_util.tree_leaves(params))
  return sum(np.asarray(x).nbytes for x in
             jax.tree_util.tree_leaves(_carried(state))) / count


def test_bf16_weights_and_moments_take_six_bytes_per_parameter():
  params, batch = _mlp()
  f32 = amp.train_step(_mlp_loss, optax.adam(1e-3), "p=f32,c=bf16,o=f32")
  low = amp.train_step(_mlp_loss, optax.adam(1e-3), BF16,
                       update_rounding="stochastic", opt_state_dtype="bf16")
  f32_state, low_state = f32.init(params), low.init(params)
  losses = {}
  for name, step, state in (("f32", f32, f32_state), ("low", low, low_state)):
    for _ in range(30):
      state, metrics = step(state, batch)
    losses[name] = float(metrics["loss"])
    if name == "low":
      low_state = state
    else:
      f32_state = state
  assert _state_bytes_per_parameter(f32_state, params) == pytest.approx(12, abs=0.01)
  assert _state_bytes_per_parameter(low_state, params) <= 6.01
  adam = low_state.opt_state[0]
  assert adam.mu["w1"].dtype == adam.nu["w1"].dtype == jnp.bfloat16
  assert adam.count.dtype == jnp.int32  # non-float state is untouched
  # The update computes in f32: the loss follows f32's.
  assert abs(losses["low"] - losses["f32"]) < 0.02 * losses["f32"], losses


_KEEP_NU = {"keep_f32_state":
            lambda path, leaf: ".nu" in jax.tree_util.keystr(path)}


@pytest.mark.parametrize("policy, options, expected", [
    ("p=f32,c=bf16,o=f32", {}, 12),
    (BF16, {"update_rounding": "nearest"}, 10),
    (BF16, {}, 10),  # stochastic
    (BF16, {"update_rounding": "kahan"}, 12),
    (BF16, {"opt_state_dtype": "bf16", "update_rounding": "nearest"}, 6),
    (BF16, {"opt_state_dtype": "bf16"}, 6),
    (BF16, {"opt_state_dtype": "bf16", **_KEEP_NU}, 8),
    (BF16, {"opt_state_dtype": "bf16", "update_rounding": "kahan"}, 8),
    # 260 bytes per block of 256 moments: 4 + 2 * 4 / 256
    (BF16, {"opt_state_dtype": "f8"}, 4.03125),
], ids=["f32", "nearest", "stochastic", "kahan", "nearest-moments",
        "stochastic-moments", "stochastic-mu", "kahan-moments",
        "stochastic-f8-moments"])
def test_persistent_state_bytes_per_parameter(policy, options, expected):
  """The table in docs/low-precision-state.md: parameters, Adam's state,
  the rounding key (16 bytes in all) and Kahan buffers, per parameter,
  after a step."""
  params, batch = _mlp()
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), policy, **options)
  state, _ = step(step.init(params), batch)
  assert _state_bytes_per_parameter(state, params) == pytest.approx(
      expected, abs=0.01)


def _trained(step, params, batch, steps=6):
  """The state after `steps` steps from `params`, checking the loss fell."""
  state = step.init(params)
  first = None
  for _ in range(steps):
    state, metrics = step(state, batch)
    first = float(metrics["loss"]) if first is None else first
  assert float(metrics["loss"]) < first
  return state


@pytest.mark.parametrize("make", [
    lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)),
    lambda: optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2),
    lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-3),
    lambda: optax.sgd(1e-2, momentum=0.9),
    lambda: optax.chain(  # each leaf's state in one of the two
        optax.masked(optax.adam(1e-3), {"w1": True, "w2": False}),
        optax.masked(optax.sgd(1e-2, momentum=0.9),
                     {"w1": False, "w2": True})),
], ids=["chain", "multisteps", "inject_hyperparams", "momentum", "masked"])
@pytest.mark.parametrize("dtype", ["bf16", "f8"])
def test_any_optax_state_is_stored_low_and_trains(make, dtype):
  params, batch = _mlp()
  step = amp.train_step(_mlp_loss, make(), BF16, opt_state_dtype=dtype)
  state = _trained(step, params, batch)
  # Float tensors are stored low; scalars (hyperparameters: Adam's
  # b2 = 0.999 would be 1.0) and integer counters keep their dtype.
  low = jnp.dtype(jnp.bfloat16 if dtype == "bf16" else jnp.uint8)
  tensors = [leaf for leaf in jax.tree_util.tree_leaves(state.opt_state)
             if leaf.ndim]
  assert tensors and all(jnp.dtype(leaf.dtype) == low for leaf in tensors)
  for leaf in jax.tree_util.tree_leaves(state.opt_state):
    if not leaf.ndim and jnp.issubdtype(leaf.dtype, jnp.floating):
      assert jnp.dtype(leaf.dtype) == jnp.float32


def test_leaves_the_user_keeps_f32_stay_f32():
  """keep_f32_state(path, leaf) keeps Adam's second moment in f32 while
  the first is stored in bf16: 2 + 2 + 4 bytes per parameter."""
  params, batch = _mlp()
  keep_nu = lambda path, leaf: ".nu" in jax.tree_util.keystr(path)
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), BF16,
                        update_rounding="stochastic", opt_state_dtype="bf16",
                        keep_f32_state=keep_nu)
  state = _trained(step, params, batch)
  adam = state.opt_state[0]
  assert adam.mu["w1"].dtype == jnp.bfloat16
  assert adam.nu["w1"].dtype == adam.nu["w2"].dtype == jnp.float32
  assert _state_bytes_per_parameter(state, params) <= 8.01
  with pytest.raises(ValueError, match="add opt_state_dtype='bf16'"):
    amp.train_step(_mlp_loss, optax.adam(1e-3), BF16, keep_f32_state=keep_nu)
  with pytest.raises(TypeError, match="must be a function"):
    amp.train_step(_mlp_loss, optax.adam(1e-3), BF16,
                   opt_state_dtype="bf16", keep_f32_state=".nu")
  with pytest.raises(TypeError, match="on amp.train_step"):
    amp.value_and_grad(_mlp_loss, BF16, keep_f32_state=keep_nu)


@pytest.mark.parametrize("dtype", ["bf16", "f8"])
def test_an_overflowed_step_leaves_low_moments_bit_identical(dtype):
  params, batch = _mlp()
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), "p=bf16,c=f16,o=f32",
                        update_rounding="stochastic", opt_state_dtype=dtype,
                        loss_scale=amp.DynamicLossScale(2.0 ** 8))
  state, _ = step(step.init(params), batch)
  x, y = batch
  after, metrics = step(state, (x.at[0, 0].set(jnp.inf), y))
  assert not bool(metrics["grads_finite"])
  _assert_bit_identical((state.params, state.opt_state, state.rounding_key),
                        (after.params, after.opt_state, after.rounding_key))


@pytest.mark.parametrize("dtype", ["bf16", "f8"])
def test_a_checkpoint_of_low_moments_resumes_identically(dtype):
  serialization = pytest.importorskip("flax.serialization")
  params, batch = _mlp()
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), BF16,
                        update_rounding="stochastic", opt_state_dtype=dtype)
  straight = step.init(params)
  for _ in range(4):
    straight, _ = step(straight, batch)
  state = step.init(params)
  for _ in range(2):
    state, _ = step(state, batch)
  restored = serialization.from_bytes(step.init(params),
                                      serialization.to_bytes(state))
  for _ in range(2):
    restored, _ = step(restored, batch)
  _assert_bit_identical(restored, straight)


# -- block-scaled FP8 optimizer state ------------------------------------------


def _decode_f8(stored: np.ndarray, shape) -> np.ndarray:
  """The f32 values of state in the f8 layout: per row, 256 E4M3 codes of
  sign(x) * sqrt(|x|), then the f32 scale's 4 bytes."""
  stored = np.asarray(stored)
  codes = stored[:, :256].copy().view(ml_dtypes.float8_e4m3fn)
  scales = stored[:, 256:].copy().view(np.float32)
  roots = codes.astype(np.float32) * scales
  values = roots * np.abs(roots)
  return values.reshape(-1)[:int(np.prod(shape))].reshape(shape)


def test_f8_state_is_block_scaled_e4m3_bit_for_bit():
  """SGD with momentum from zero: after one step the trace is the gradient
  (here the batch, 600 values spanning 1e-4 to 1e2 in magnitude, so the
  last of 3 blocks is padded). The values are companded to
  r = sign(x) * sqrt(|x|); per block of 256 the stored scale is the largest
  |r| / 448 (to 1 ulp: XLA may multiply by 1/448) and the codes are
  exactly NumPy's r / scale rounded to nearest E4M3."""
  rng = np.random.default_rng(3)
  grad = (rng.choice([-1, 1], 600) *
          10.0 ** rng.uniform(-4, 2, 600)).astype(np.float32)
  step = amp.train_step(_linear, optax.sgd(1e-3, momentum=0.9), BF16,
                        opt_state_dtype="f8")
  state = step.init(jnp.ones((2, 300)))
  trace = state.opt_state[0].trace
  assert trace.dtype == jnp.uint8 and trace.shape == (3, 260)
  np.testing.assert_array_equal(np.asarray(trace), 0)
  state, _ = step(state, jnp.asarray(grad.reshape(2, 300)))
  padded = np.zeros(768, np.float32)
  padded[:600] = np.sign(grad) * np.sqrt(np.abs(grad))
  blocks = padded.reshape(3, 256)
  stored = np.asarray(state.opt_state[0].trace)
  scale = stored[:, 256:].copy().view(np.float32).reshape(3)
  np.testing.assert_allclose(
      scale, np.abs(blocks).max(axis=1) / np.float32(448), rtol=2.0 ** -23)
  codes = (blocks / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
  np.testing.assert_array_equal(stored[:, :256], codes.view(np.uint8))
  # Decoded: within twice E4M3's half ulp (2^-3 of the value: squared)
  # where the root is a normal E4M3 number after scaling (at least 2^-6 of
  # 448), and no value of the six decades flushed to zero.
  decoded = _decode_f8(state.opt_state[0].trace, (600,))
  roots = np.abs(padded[:600])
  normal = roots >= np.repeat(np.abs(blocks).max(axis=1), 256)[:600] * (
      2.0 ** -6 / 448)
  np.testing.assert_allclose(decoded[normal], grad[normal], rtol=2.0 ** -3)
  assert np.all(decoded != 0)


def test_f8_moments_train_like_f32_moments():
  params, batch = _mlp()
  losses = {}
  for dtype in ("f32", "f8"):
    step = amp.train_step(_mlp_loss, optax.adam(1e-3), BF16,
                          opt_state_dtype=dtype)
    state = step.init(params)
    for _ in range(30):
      state, metrics = step(state, batch)
    losses[dtype] = float(metrics["loss"])
  assert abs(losses["f8"] - losses["f32"]) < 0.02 * losses["f32"], losses


def test_f8_initial_state_is_encoded_as_the_pass_encodes():
  """rmsprop's ν starts at initial_scale: init encodes it (also under jit,
  as a sharded init runs it) into the bytes the step's own encoding gives
  the same values, and training runs from there."""
  params, batch = _mlp()
  start = {"w1": jnp.full((32, 128), 0.5), "w2": jnp.linspace(-3, 3, 512)
           .reshape(128, 4)}
  step = amp.train_step(_mlp_loss, optax.rmsprop(1e-3, initial_scale=1.0),
                        BF16, opt_state_dtype="f8")
  state = jax.jit(step.init)(params)
  nu = state.opt_state[0].nu
  for name in ("w1", "w2"):
    np.testing.assert_array_equal(_decode_f8(nu[name], params[name].shape),
                                  1.0)
  # The pass's encoding of known values (SGD's trace after one step is the
  # gradient, the batch) against init's encoding of the same values.
  sgd = amp.train_step(_linear, optax.sgd(1.0, momentum=0.5), BF16,
                       opt_state_dtype="f8")
  for values in start.values():
    stepped, _ = sgd(sgd.init(jnp.ones(values.shape)), values)
    by_pass = np.asarray(stepped.opt_state[0].trace)
    by_init = np.asarray(encode_f8(values))
    np.testing.assert_array_equal(by_pass[:, :256], by_init[:, :256])
    np.testing.assert_allclose(by_pass[:, 256:].copy().view(np.float32),
                               by_init[:, 256:].copy().view(np.float32),
                               rtol=2.0 ** -23)
  for _ in range(3):
    state, metrics = step(state, batch)
  assert np.isfinite(float(metrics["loss"]))



def test_f8_second_moments_are_never_flushed_to_zero():
  """One block whose gradients span 12 decades, then a step where they are
  all zero (a dead ReLU unit's are): Adam's second step is
  lr * m / (sqrt(v) + eps) from the stored moments alone. A second moment
  flushed to zero under a nonzero first moment would make it
  lr * m / eps; f8 moments keep every nonzero value at least E4M3's
  smallest code (rounded up: a smaller step), so every step stays within
  lr, and the large gradients' steps are f32's."""
  rng = np.random.default_rng(5)
  grad = (rng.choice([-1, 1], 256) *
          10.0 ** np.linspace(-10, 2, 256)).astype(np.float32)
  moved = {}
  for dtype in ("f32", "f8"):
    step = amp.train_step(_linear, optax.adam(1e-2), "p=f32,c=bf16,o=f32",
                          opt_state_dtype=dtype)
    state, _ = step(step.init(jnp.zeros(256)), jnp.asarray(grad))
    before = np.asarray(state.params)
    state, _ = step(state, jnp.zeros(256))
    moved[dtype] = np.asarray(state.params) - before
  assert np.all(np.isfinite(moved["f8"]))
  assert np.max(np.abs(moved["f8"])) <= 1.01e-2
  large = np.abs(grad) >= 1e-3
  np.testing.assert_allclose(moved["f8"][large], moved["f32"][large],
                             rtol=0.2)


# -- what XLA:CPU makes of a low-precision step --------------------------------


def _dot_operand_types(hlo_text: str) -> list[tuple[str, ...]]:
  """Element types of the operands of every dot XLA:CPU runs: plain `dot`s
  and the dots inside its YNNPACK fusions."""
  module = hlo.Module.parse(hlo_text)
  return [tuple(shape.element_type if shape else "?"
                for shape in computation.operand_shapes(ins))
          for computation in module.computations.values()
          for ins in computation.instructions if ins.opcode == "dot"]


def _copies_of_state(hlo_text: str) -> list[str]:
  """Instructions of the entry computation that only copy a float argument
  of the step (a parameter, a moment: the step's state; the batch is read,
  never copied) into a buffer of their own: a `copy` of it, or a fusion of
  it alone made of bitcasts and copies. An argument is an ENTRY
  `parameter`, whatever XLA names it. (A step that cannot skip passes its
  integer `skipped_steps` through, which XLA copies: a scalar, not what
  this is about.)"""
  module = hlo.Module.parse(hlo_text)
  found = []
  for ins in module.entry.instructions:
    if len(ins.operands) != 1:
      continue
    argument = module.entry.get(ins.operands[0])
    if argument is None or argument.opcode != "parameter":
      continue
    if not (ins.shape.element_type or "").startswith(("f", "bf")):
      continue
    if ins.opcode == "copy":
      found.append(ins.name)
    elif ins.opcode == "fusion":
      body = module.computations[ins.calls[0]]
      if {i.opcode for i in body.instructions} <= {"parameter", "bitcast",
                                                   "copy"}:
        found.append(ins.name)
  return found


# A step's ENTRY as XLA:CPU prints it, with every way an argument can be
# copied and the near misses: the helper below finds exactly the copies of
# float arguments, whatever their names.
_COPIES = r"""
HloModule step, entry_computation_layout={(f32[8,8]{1,0}, bf16[8,8]{1,0}, s32[], f32[8,8]{1,0})->(f32[8,8]{1,0})}

%copy_body (p: bf16[8,8]) -> bf16[8,8] {
  %p = bf16[8,8]{1,0} parameter(0)
  %b = bf16[8,8]{0,1} bitcast(%p)
  ROOT %c = bf16[8,8]{1,0} copy(%b)
}

%compute_body (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
  ROOT %n = f32[8,8]{1,0} negate(%p)
}

ENTRY %main (w.1: f32[8,8], mu.2: bf16[8,8], count: s32[], x: f32[8,8]) -> (f32[8,8]) {
  %w.1 = f32[8,8]{1,0} parameter(0)
  %mu.2 = bf16[8,8]{1,0} parameter(1)
  %count = s32[] parameter(2)
  %x = f32[8,8]{1,0} parameter(3)
  %copy.weight = f32[8,8]{1,0} copy(%w.1)
  %fusion.moment = bf16[8,8]{1,0} fusion(%mu.2), kind=kLoop, calls=%copy_body
  %copy.count = s32[] copy(%count)
  %fusion.compute = f32[8,8]{1,0} fusion(%w.1), kind=kLoop, calls=%compute_body
  %sum = f32[8,8]{1,0} add(%x, %fusion.compute)
  %copy.sum = f32[8,8]{1,0} copy(%sum)
  ROOT %t = (f32[8,8]{1,0}) tuple(%copy.sum)
}
"""


def test_the_copy_counter_finds_copies_of_any_argument_and_nothing_else():
  """The positive control of the test below: a copy of a float argument,
  named anything, and a fusion of one that only copies it, are found; an
  integer argument's copy, a fusion that computes and a copy of a
  computed value are not."""
  assert _copies_of_state(_COPIES) == ["copy.weight", "fusion.moment"]


# bf16 parameters: with the skip (a loss scale, or skip_nonfinite=True), the
# select on the new state orders every update after the backward pass. A
# step without a loss scale skips nothing, and then XLA:CPU copies a bf16
# weight the backward pass still reads (the last case; docs/training.md).
@pytest.mark.parametrize("policy, options, copies", [
    ("p=f32,c=bf16,o=f32", {}, 0),
    (BF16, {"skip_nonfinite": True}, 0),
    (BF16, {"opt_state_dtype": "bf16", "skip_nonfinite": True}, 0),
    (BF16, {}, 1),
], ids=["f32-state", "bf16-params", "bf16-moments", "bf16-params-no-skip"])
def test_xla_cpu_copies_no_state_and_keeps_bf16_dots(policy, options, copies):
  """The donated step updates its state in place: XLA:CPU copies no old
  parameter or moment to keep it for a second reader (the update reads the
  stored moment; a bf16 weight reaches the backward dot unbarriered), and
  every dot stays bf16. (f8 moments are copied: their update reads the f32
  value, see Passes.td.)"""
  params, batch = _mlp(hidden=64, outputs=16)  # every dot 8 wide: YNNPACK
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), policy, donate=True,
                        **options)
  text = step.lower(step.init(params), batch).compile().as_text()
  assert len(_copies_of_state(text)) == copies, _copies_of_state(text)
  dots = _dot_operand_types(text)
  assert dots and all(types == ("bf16", "bf16") for types in dots), dots
