"""What `explain` and the training warnings say when training goes wrong,
on the code users write: flax linen and nnx models, equinox modules,
optax losses and optimizers (issue 45).

- An optax loss's ops are the model's forward and backward pass, not the
  optimizer's: JAX's `jvp`/`transpose` markers decide the phase.
- An overflow of a value stored in f16 and read back in f32 is an f16
  overflow.
- A NaN in the batch is reported as the batch, with the leaf's path.
- The "not progressing" warning says what is known, without blaming a
  loss scale or a precision it does not know is at fault.
- `value_and_grad` keeps the params' tree structure (`None` stays `None`),
  as equinox's `eqx.partition` → optax pattern needs.
- An nnx Module given directly as the params: its RNG state is not frozen.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stablehlo_amp as amp

optax = pytest.importorskip("optax")
nn = pytest.importorskip("flax.linen")

V, D, B, T = 256, 64, 8, 16


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm()(x)
    x = x + nn.SelfAttention(num_heads=4)(h)
    h = nn.LayerNorm()(x)
    return x + nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(h)))


class _LM(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(V, D)(tokens)
    for _ in range(2):
      x = _Block()(x)
    return nn.Dense(V)(nn.LayerNorm()(x))


_MODEL = _LM()
_TOKENS = jnp.arange(B * T).reshape(B, T) % V


def _lm_loss(params, tokens):
  logits = _MODEL.apply(params, tokens).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.roll(tokens, 1, 1)).mean()


@pytest.fixture(scope="module")
def overflowing_lm():
  """A linen LM in f16 with a loss scale far too large (2^30): its loss's
  backward pass overflows f16 at once, in the optax loss."""
  step = amp.train_step(_lm_loss, optax.adam(1e-3), "p=f32,c=f16,o=f32",
                        loss_scale=amp.StaticLossScale(2.0 ** 30),
                        numerics="provenance")
  params = _MODEL.init(jax.random.key(0), _TOKENS)
  state = step.init(params)
  new_state, metrics = step(state, _TOKENS)
  return step, params, metrics, step.lower(state, _TOKENS).report()


def test_an_optax_loss_is_the_models_forward_and_backward(overflowing_lm):
  _, params, metrics, report = overflowing_lm
  region, _ = metrics["nonfinite"].first(report)
  assert region.phase == "backward", region.name
  assert "/optax/losses/" in region.loc
  text = amp.explain(metrics, report)
  first = text.splitlines()[1]
  assert first.startswith("First non-finite: backward of the step (add_any)"
                          " at test/python/test_diagnostics.py:"), text
  # The optax loss's ops are forward or backward, in regions and decisions;
  # only the optimizer's (optax's transforms and updates) are "optimizer".
  for located in (*report.regions, *report.decisions):
    if "/optax/losses/" in located.loc:
      assert located.phase in ("forward", "backward"), located.loc[:200]
  phases = collections.Counter(d.phase for d in report.decisions
                               if "/optax/losses/" in d.loc)
  assert phases["forward"] and phases["backward"], phases
  assert "site-packages" not in text
  # value_and_grad has no optimizer: no region of it is one.
  vg = amp.value_and_grad(_lm_loss, "p=f32,c=f16,o=f32",
                          numerics="provenance")
  scale = amp.StaticLossScale(2.0 ** 30)
  *_, measured = vg(params, _TOKENS, loss_scale=scale)
  vg_report = vg.lower(params, _TOKENS, loss_scale=scale).report()
  assert {r.phase for r in vg_report.regions if not r.is_input} == \
      {"forward", "backward"}
  assert "First non-finite: backward of the step (add_any)" in \
      amp.explain(measured, vg_report)


def test_an_f16_overflow_of_a_stored_value_is_f16(overflowing_lm):
  _, _, metrics, report = overflowing_lm
  region, what = metrics["nonfinite"].first(report)
  # The loss's gradient (2^30 / 128 tokens: 8.4e6 in f32) is stored in f16
  # and read back in f32: its check reads the f32 copy, and the infinity
  # is f16's.
  assert (region.format, what) == ("f16", "infinity"), (region.format, what)
  text = amp.explain(metrics, report)
  assert "(f16 overflow: max finite 65504)" in text, text
  assert "f32 overflow" not in text


def _mlp(params, x):
  for w, b in params[:-1]:
    x = jax.nn.gelu(x @ w + b)
  w, b = params[-1]
  return jax.nn.log_softmax(x @ w + b)


def _mlp_params():
  sizes = [(784, 512), (512, 512), (512, 10)]
  return [(jax.random.normal(k, s) / s[0] ** 0.5, jnp.zeros(s[1]))
          for k, s in zip(jax.random.split(jax.random.key(0), 3), sizes)]


def _mlp_loss(params, batch):
  x, labels = batch
  logp = _mlp(params, x)
  return -jnp.take_along_axis(logp, labels[:, None], 1).mean()


def _mlp_batch(nan_at=None):
  x = jax.random.normal(jax.random.key(1), (128, 784))
  if nan_at is not None:
    x = x.at[nan_at].set(jnp.nan)
  return (x, jnp.arange(128) % 10)


def test_a_nan_in_the_batch_is_the_batchs():
  """docs/numerics.md's MLP with one NaN in its batch: the batch, at its
  leaf, not the first layer (whose rounding of the batch hid it)."""
  step = amp.train_step(_mlp_loss, optax.adam(1e-3), "p=f32,c=bf16,o=f32",
                        numerics="provenance")
  state = step.init(_mlp_params())
  batch = _mlp_batch(nan_at=(3, 5))
  _, metrics = step(state, batch)
  report = step.lower(state, batch).report()
  region, what = metrics["nonfinite"].first(report)
  assert (region.is_input, region.name, region.argument, what) == \
      (True, "the batch", "batch[0]", "NaN"), region
  text = amp.explain(metrics, report)
  assert "First non-finite: the batch held a NaN (batch[0]), before the " \
      "step computed anything." in text, text
  assert "check the batch" in text
  # A bf16 step without a loss scale or skip_nonfinite skips nothing, and
  # explain says it applied the step.
  assert text.startswith("This step's gradients were not finite, and it "
                         "applied them: without a loss scale or "
                         "skip_nonfinite=True a step skips nothing.")
  # explain takes the step (its last program) or the Lowered too.
  lowered = step.lower(state, batch)
  assert amp.explain(metrics, step) == text
  assert amp.explain(metrics, lowered) == text
  with pytest.raises(TypeError, match=r"amp.explain\(metrics, step\) with "
                     r"the step that returned them"):
    amp.explain(metrics)
  with pytest.raises(TypeError, match=r"got str"):
    amp.explain(metrics, "report")
  fresh = amp.train_step(_mlp_loss, optax.adam(1e-3), numerics="provenance")
  with pytest.raises(ValueError, match=r"has built no program yet: call it"):
    amp.explain(metrics, fresh)
  # A clean batch: nothing, and the input regions have no phase.
  _, metrics = step(state, _mlp_batch())
  assert metrics["nonfinite"].first(report) is None
  assert all(r.phase == "" for r in report.regions if r.is_input)


class _BatchNormNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.Dense(32, name="inp")(x)
    x = nn.BatchNorm(use_running_average=not train)(x)
    return nn.Dense(1)(nn.relu(x))


def test_a_nan_in_the_batch_of_a_batchnorm_net_is_the_batchs():
  """A linen BatchNorm net (model state): the batch's leaf by its path,
  not `Net/inp`."""
  net = _BatchNormNet()
  x = jax.random.normal(jax.random.key(0), (16, 8))
  variables = net.init(jax.random.key(1), x)

  def loss_fn(params, stats, batch):
    out, updates = net.apply({"params": params, "batch_stats": stats},
                             batch["x"], mutable=["batch_stats"])
    return jnp.mean((out - batch["y"]) ** 2), updates["batch_stats"]

  step = amp.train_step(loss_fn, optax.sgd(1e-2), "p=f32,c=bf16,o=f32",
                        numerics="provenance")
  state = step.init(variables["params"],
                    model_state=variables["batch_stats"])
  for leaf in ("x", "y"):
    batch = {"x": x, "y": jnp.ones((16, 1))}
    batch[leaf] = batch[leaf].at[4, 0].set(jnp.nan)
    _, metrics = step(state, batch)
    report = step.lower(state, batch).report()
    region, what = metrics["nonfinite"].first(report)
    assert (region.name, region.argument, what) == \
        ("the batch", f"batch['{leaf}']", "NaN"), region
    assert f"First non-finite: the batch held a NaN (batch['{leaf}'])" in \
        amp.explain(metrics, report)


def _stuck_warnings(recwarn) -> list[str]:
  jax.effects_barrier()
  return [str(w.message) for w in recwarn
          if "training is not progressing" in str(w.message)]


def test_a_diverging_run_is_not_blamed_on_precision(recwarn):
  """A learning rate far too large: the loss goes non-finite as in a plain
  f32 jax.jit run. The warning says what is known, and how to tell a
  precision problem from a divergence; no loss scale (there is none), no
  advice to use bf16 (the run is bf16)."""
  params, batch, sgd = _mlp_params(), _mlp_batch(), optax.sgd(3e8)

  @jax.jit
  def plain(params, opt_state):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, batch)
    updates, opt_state = sgd.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  p, s, losses = params, sgd.init(params), []
  for _ in range(3):
    p, s, loss = plain(p, s)
    losses.append(float(loss))
  assert not np.isfinite(losses[-1]), losses  # f32 diverges too

  step = amp.train_step(_mlp_loss, sgd, "p=f32,c=bf16,o=f32",
                        skip_nonfinite=True)
  state = step.init(params)
  for _ in range(12):
    state, metrics = step(state, batch)
  assert not np.isfinite(float(metrics["loss"]))
  stuck = _stuck_warnings(recwarn)
  assert len(stuck) == 1, stuck
  message = stuck[0]
  assert "the loss is not finite at the current parameters" in message
  assert "numerics='provenance'" in message and "c=f32" in message
  assert "loss scale" not in message and "use bf16" not in message
  assert "overflows in bfloat16, which" not in message


def test_the_warning_in_f32_says_precision_is_not_the_cause(recwarn):
  step = amp.train_step(_mlp_loss, optax.sgd(3e8), "p=f32,c=f32,o=f32",
                        skip_nonfinite=True)
  state = step.init(_mlp_params())
  for _ in range(12):
    state, _ = step(state, _mlp_batch())
  stuck = _stuck_warnings(recwarn)
  assert len(stuck) == 1, stuck
  assert "The step computes in float32, so precision is not the cause" in \
      stuck[0]
  assert "c=f32" not in stuck[0] and "loss scale" not in stuck[0]


def test_value_and_grad_keeps_none_leaves_for_equinox_and_optax():
  """equinox's eqx.partition(model, eqx.is_inexact_array) leaves None where
  a leaf is not an array; the gradients keep that structure (as jax.grad's
  do), so optax and eqx.apply_updates take them."""
  eqx = pytest.importorskip("equinox")
  model = eqx.nn.MLP(4, 2, 16, 2, key=jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_inexact_array)
  x = jax.random.normal(jax.random.key(1), (8, 4))
  y = jnp.ones((8, 2))

  def loss(params, x, y):
    return jnp.mean((jax.vmap(eqx.combine(params, static))(x) - y) ** 2)

  vg = amp.value_and_grad(loss, "p=f32,c=bf16,o=f32")
  (value, grads), finite, _ = vg(params, x, y)
  want = jax.grad(loss)(params, x, y)
  assert jax.tree_util.tree_structure(grads) == \
      jax.tree_util.tree_structure(want) == \
      jax.tree_util.tree_structure(params)
  assert bool(finite)
  optimizer = optax.adam(1e-2)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  new = eqx.apply_updates(params, updates)
  assert float(loss(new, x, y)) < float(value)
  # A dict with a None leaf, and a tuple of arguments.
  vg = amp.value_and_grad(lambda p, q, x: jnp.sum(x @ p["w"]) * q,
                          argnums=(0, 1))
  (_, (gp, gq)), _, _ = vg({"w": jnp.ones((4, 2)), "b": None}, 2.0, x)
  assert gp["b"] is None and gp["w"].shape == (4, 2) and gq.shape == ()


def _nnx_model():
  nnx = pytest.importorskip("flax.nnx")

  class Model(nnx.Module):
    def __init__(self, rngs):
      self.linear = nnx.Linear(8, 16, rngs=rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)
      self.head = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
      return self.head(self.dropout(jax.nn.relu(self.linear(x))))

  return nnx, Model(nnx.Rngs(0, dropout=1))


def test_an_nnx_module_as_params_is_refused_with_how_to_split_it():
  """An nnx Module is a pytree, so it could be the params; its RNG state
  (RngKey, RngCount) would then pass through unchanged, and dropout would
  repeat each step. The error says how to carry it as model state, and
  that way its dropout changes every step."""
  nnx, model = _nnx_model()
  x = jax.random.normal(jax.random.key(2), (32, 8))
  y = jnp.ones((32, 1))

  def direct(model, batch):
    return jnp.mean((model(batch[0]) - batch[1]) ** 2)

  step = amp.train_step(direct, optax.sgd(0.0), "p=f32,c=bf16,o=f32")
  with pytest.raises(TypeError, match=r"params holds random state at "
                     r"\.dropout\.rngs\.count, \.dropout\.rngs\.key .*"
                     r"nnx\.split\(model, nnx\.Param, \.\.\.\).*"
                     r"model_state=rest"):
    step.init(model)
  vg = amp.value_and_grad(direct, "p=f32,c=bf16,o=f32")
  with pytest.raises(TypeError, match=r"argument 0 of \S*direct, which argnums "
                     r"differentiates, holds random state at "
                     r"\.dropout\.rngs\.count"):
    vg(model, (x, y))

  # The way the error says: the RNG state is model state, updated.
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_fn(params, rest, batch):
    model = nnx.merge(graphdef, params, rest, copy=True)
    loss = jnp.mean((model(batch[0]) - batch[1]) ** 2)
    return loss, nnx.state(model, nnx.Not(nnx.Param))

  step = amp.train_step(loss_fn, optax.sgd(0.0), "p=f32,c=bf16,o=f32")
  state = step.init(params, model_state=rest)
  losses = []
  for _ in range(4):  # learning rate 0, one batch: only dropout changes
    state, metrics = step(state, (x, y))
    losses.append(float(metrics["loss"]))
  assert len(set(losses)) == 4, losses
  assert int(state.model_state["dropout"]["rngs"]["count"].value) == 4


def test_explain_takes_a_transformed_function_and_value_and_grad():
  def loss(w, x):
    return jnp.mean(jnp.log(x @ w))

  w, x = jnp.ones((4, 2)), -jnp.ones((3, 4))  # log of negatives: NaN
  fast = amp.transform(loss, "p=f32,c=bf16,o=f32", numerics="provenance")
  _, measured = fast(w, x)
  text = amp.explain(measured, fast)
  assert text == amp.explain(measured, fast.lower(w, x))
  assert "First non-finite: forward of the step (" in text, text
  vg = amp.value_and_grad(loss, "p=f32,c=bf16,o=f32", numerics="provenance")
  *_, measured = vg(w, x)
  assert amp.explain(measured, vg) == amp.explain(measured, vg.lower(w, x))


def test_a_whole_equinox_module_says_to_partition_it():
  """An equinox Module's activation function is a pytree leaf: the error
  names its path and says how to split it off, for train_step and
  value_and_grad (JAX's own error named neither)."""
  eqx = pytest.importorskip("equinox")
  model = eqx.nn.MLP(4, 2, 16, 2, key=jax.random.key(0))
  x = jnp.ones((8, 4))

  def loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)

  message = (r"has a leaf that is not an array at \.activation: a "
             r"custom_jvp\. .*eqx\.partition\(model, eqx\.is_inexact_array\)")
  step = amp.train_step(loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32")
  with pytest.raises(TypeError, match="params " + message):
    step.init(model)
  with pytest.raises(TypeError, match=r"argument 0 of \S*loss " + message):
    amp.value_and_grad(loss)(model, x)


def test_the_fp8_options_say_the_same_thing_everywhere():
  def f(w, x):
    return jnp.sum(jnp.tanh(x @ w))

  w = x = jnp.ones((64, 64))
  # Scaling without FP8 GEMMs is refused, as keep_gemms is.
  for options in ({"fp8_scaling": "rowwise"}, {"keep_gemms": [0]}):
    with pytest.raises(ValueError, match=r"policy p=f32,c=bf16,o=f32 has "
                       r"none: add gemm=f8"):
      amp.transform(f, "p=f32,c=bf16,o=f32", **options)(w, x)
  # c=f8 lists only the dtypes it accepts, and says where FP8 goes.
  with pytest.raises(ValueError, match=r"\(accepted: f32, .*, float64\); "
                     r"FP8 is a GEMM operand format, not a compute dtype"):
    amp.transform(f, "p=f32,c=f8,o=f32")
  # keep_gemms= naming a GEMM the program lacks: an exported error.
  with pytest.raises(amp.OptionError, match=r"no low-precision dot 99"):
    amp.transform(f, "p=f32,c=bf16,o=f32,gemm=f8", keep_gemms=[99])(w, x)
  # fp8_fallback= is train_step's.
  with pytest.raises(TypeError, match=r"ValueAndGrad does not take "
                     r"fp8_fallback=: .*amp.train_step only"):
    amp.value_and_grad(f, "p=f32,c=bf16,o=f32,gemm=f8",
                       fp8_fallback=amp.Fp8Fallback())


def test_a_gpu_program_that_fails_on_cpu_says_it_was_built_for_gpu():
  """A target="gpu" rewrite may hold what XLA:CPU cannot run (before
  c0e446e, a linen attention block's bf16 x bf16 = f32 dots: "Unsupported
  element type for DotThunk::Execute"). A runtime failure of a program
  built for another target says which target it was built for; here the
  failure is a host callback's, which fails the same way."""
  if jax.default_backend() != "cpu":
    pytest.skip("the mismatch is a gpu program on a cpu backend")

  def fail(_):
    raise ValueError("the device failed")

  def f(w, x):
    y = jnp.tanh(x @ w)
    jax.debug.callback(fail, y)
    return y

  w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
  fast = amp.transform(f, "p=f32,c=bf16,o=f32", target="gpu")
  with pytest.raises(RuntimeError, match=r"this program was rewritten for "
                     r"target='gpu' and failed running on cpu: .*build it "
                     r"with target='cpu'"):
    fast(w, x)
  # Built for here, the same failure is XLA's own.
  with pytest.raises(jax.errors.JaxRuntimeError):
    jax.block_until_ready(amp.transform(f, "p=f32,c=bf16,o=f32")(w, x))


def test_an_f32_collective_of_a_low_op_on_cpu_says_why():
  from stablehlo_amp._src.report import Collective
  report = amp.transform(lambda w, x: jnp.tanh(x @ w), "p=f32,c=bf16,o=f32"
                         ).lower(jnp.ones((8, 8)), jnp.ones((4, 8))).report()
  moved = Collective("all-gather", "f32", "jvp()/dot_general", 2, 2 ** 20,
                     precision="low", reason="a dot")
  text = str(dataclasses.replace(report, target="cpu", collectives=(moved,)))
  assert "all-gather f32 1.0 MiB (2x) for jvp()/dot_general: low: a dot " \
      "(XLA:CPU runs bf16 collectives in f32)" in text, text
  text = str(dataclasses.replace(report, target="gpu", collectives=(moved,)))
  assert "XLA:CPU" not in text


# A data-parallel step's gradient all-reduce as XLA's combiner leaves it:
# one all-reduce of every layer's gradients, named after all of them (their
# common path, then the rest of each name in parentheses, joined by ':').
_COMBINED_ALL_REDUCE = r"""
HloModule step, entry_computation_layout={(f32[64,64]{1,0}, f32[64,64]{1,0}, f32[64]{0})->(f32[64,64]{1,0}, f32[64,64]{1,0}, f32[64]{0})}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (g0: f32[64,64], g1: f32[64,64], g2: f32[64]) -> (f32[64,64], f32[64,64], f32[64]) {
  %g0 = f32[64,64]{1,0} parameter(0)
  %g1 = f32[64,64]{1,0} parameter(1)
  %g2 = f32[64]{0} parameter(2)
  ROOT %all-reduce = (f32[64,64]{1,0}, f32[64,64]{1,0}, f32[64]{0}) all-reduce(%g0, %g1, %g2), replica_groups={{0,1}}, to_apply=%add, metadata={op_name="jit(traced)/amp_module_call/jit(loss)/(transpose(jvp())/dot_general:transpose(jvp())/dot_general:jvp()/reduce_sum)"}
}
"""


def test_a_combined_all_reduce_is_grouped_by_the_ops_of_its_values():
  """A combined all-reduce reads as how many values of which ops, each
  op with its decision, not as one line of every name XLA joined; a low
  op's value moved in f32 on CPU says that XLA:CPU did it."""
  def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w["a"]) @ w["b"])

  w = {"a": jnp.ones((64, 64)), "b": jnp.ones((64, 64))}
  report = amp.value_and_grad(loss, "p=f32,c=bf16,o=f32").lower(
      w, jnp.ones((8, 64))).report()
  report = dataclasses.replace(report.with_compiled(_COMBINED_ALL_REDUCE),
                               target="cpu")
  (moved,) = report.collectives
  assert (moved.kind, moved.dtype, moved.count, moved.bytes) == (
      "all-reduce", "f32", 1, 2 * 64 * 64 * 4 + 64 * 4)
  assert [(v.op, v.count, v.bytes, v.precision) for v in moved.values] == [
      ("transpose(jvp())/dot_general", 2, 2 * 64 * 64 * 4, "low"),
      ("jvp()/reduce_sum", 1, 64 * 4, "f32")]
  text = str(report)
  assert ("    all-reduce f32 0.0 MiB (1x) of 3 values combined "
          "(dot_general \N{MULTIPLICATION SIGN}2, reduce_sum "
          "\N{MULTIPLICATION SIGN}1): dot_general low: matrix multiply"
          in text), text
  assert "(XLA:CPU runs bf16 collectives in f32)" in text, text
  assert "dot_general:transpose" not in text, text

def test_e4m3_gradients_of_a_step_without_a_loss_seed_say_why():
  """amp.transform of a jax.jit-style step (jax.value_and_grad inside)
  has no argument marked as the loss seed, so gemm=f8 knows no gradient
  and makes every operand e4m3fn, where train_step makes its gradients
  e5m2: the report says why. A forward pass alone, and train_step, say
  nothing of it."""
  def loss(w, x):
    return jnp.mean((jnp.tanh(x @ w["a"]) @ w["b"]) ** 2)

  def step(w, x):
    value, grads = jax.value_and_grad(loss)(w, x)
    return value, jax.tree.map(lambda a, g: a - 0.1 * g, w, grads)

  w = {"a": jnp.ones((256, 256)) / 16, "b": jnp.ones((256, 256)) / 16}
  x = jnp.ones((256, 256))
  f8 = dict(policy="p=f32,c=bf16,o=f32,gemm=f8", target="gpu",
            fp8_min_size=0)
  why = ("every FP8 operand is f8e4m3fn: gemm=f8 makes gradients f8e5m2, "
         "and a gradient is a value derived from an argument marked "
         "amp.loss_seed or amp.cotangent, which this module has none of")
  report = amp.transform(step, **f8).lower(w, x).report()
  assert {d.gemm.split(",")[0] for d in report.fp8_gemms} == {
      "f8e4m3fn x f8e4m3fn"}
  assert why in str(report), str(report)
  forward = amp.transform(loss, **f8).lower(w, x).report()
  assert forward.fp8_gemms and why not in str(forward)
  train = amp.train_step(loss, optax.sgd(0.1), **f8)
  report = train.lower(train.init(w), x).report()
  assert any("f8e5m2" in d.gemm for d in report.fp8_gemms)
  assert why not in str(report), str(report)
