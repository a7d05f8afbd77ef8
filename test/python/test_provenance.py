"""Tests for `numerics="provenance"`: which region of a step first handed
on a NaN or an infinity, from inside the compiled step (amp-numerics),
`amp.NonFinite` and `amp.explain`.

What is checked, on a 4-layer transformer whose batch holds switches that
make one chosen region non-finite from finite inputs (forward: the scores of
layer 2's attention; backward: the gradient of layer 1's MLP, whose forward
pass stays finite; optimizer: Adam with eps=0 on a gradient of zeros): for the f32,
bf16 and f16 policies, the first region reported is that one, and with the
switches off no bit is set. The step's inputs (a poisoned parameter) are
reported as such. The injected region's op is inside a fused kernel and its
bit is still set. The compiled step has no host transfer. The bits, the
report and `explain` agree; every error.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp

D, T, B, LAYERS = 32, 8, 4, 4
POLICIES = {"f32": "p=f32,c=f32,o=f32", "bf16": "p=f32,c=bf16,o=f32",
            "f16": "p=f32,c=f16,o=f32"}
# The switches in the batch: 1 leaves the step finite.
CLEAN = np.array([1.0, 1.0, 1.0], np.float32)
FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2


def _layer_norm(x):
  mean = jnp.mean(x, -1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + 1e-5)


def _attention(p, x, switch):
  with jax.named_scope("attn"):
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    scores = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(D)
    if switch is not None:  # log(-1): NaN, made here from finite values
      scores = scores + jnp.log(switch)
    return jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores), v) @ p["wo"]


@jax.custom_vjp
def _poison_gradient(x, switch):
  """The identity; its gradient is multiplied by 1 + log(switch): itself
  where the switch is 1, an infinity where it is 0, made in the backward
  pass alone (JAX would compute a derivative of an op like sqrt in the
  forward pass, for the backward pass to read)."""
  return x


def _poison_forward(x, switch):
  return x, switch


def _poison_backward(switch, g):
  return g * (1.0 + jnp.log(switch)), jnp.zeros_like(switch)


_poison_gradient.defvjp(_poison_forward, _poison_backward)


def _mlp(p, x, switch):
  with jax.named_scope("mlp"):
    h = jax.nn.gelu(x @ p["w1"])
    if switch is not None:
      h = _poison_gradient(h, switch)
    return h @ p["w2"]


def transformer_loss(params, batch):
  x, y, switches = batch
  for i, p in enumerate(params["layers"]):
    with jax.named_scope(f"layers_{i}"):
      x = x + _attention(p, _layer_norm(x),
                         switches[FORWARD] if i == 2 else None)
      x = x + _mlp(p, _layer_norm(x), switches[BACKWARD] if i == 1 else None)
  # A parameter whose gradient is the optimizer switch: zero when it is
  # off, and Adam without eps divides zero by zero.
  unused = switches[OPTIMIZER] * jnp.sum(params["bias"]) * 1e-3
  return jnp.mean((x - y) ** 2) + unused


def _params(seed: int = 0):
  keys = iter(jax.random.split(jax.random.key(seed), 6 * LAYERS))
  def dense(n, m):
    return jax.random.normal(next(keys), (n, m)) / np.sqrt(n)
  layers = [{"wq": dense(D, D), "wk": dense(D, D), "wv": dense(D, D),
             "wo": dense(D, D), "w1": dense(D, 4 * D), "w2": dense(4 * D, D)}
            for _ in range(LAYERS)]
  return {"layers": layers, "bias": jnp.ones((D,))}


def _batch(switches=CLEAN):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((B, T, D)).astype(np.float32)
  return (jnp.asarray(x), jnp.asarray(np.tanh(x)), jnp.asarray(switches))


def _switched(which: int) -> np.ndarray:
  switches = CLEAN.copy()
  switches[which] = -1.0 if which == FORWARD else 0.0
  return switches


@pytest.fixture(scope="module", params=sorted(POLICIES))
def built(request):
  policy = POLICIES[request.param]
  loss_scale = amp.DynamicLossScale() if request.param == "f16" else None
  step = amp.train_step(transformer_loss, optax.adam(1e-3, eps=0.0), policy,
                        numerics="provenance", loss_scale=loss_scale)
  state = step.init(_params())
  lowered = step.lower(state, _batch())
  return step, state, lowered.report(), lowered


def _first(step, state, report, switches):
  _, metrics = step(state, _batch(switches))
  return metrics, metrics["nonfinite"].first(report)


def test_a_clean_step_sets_no_bit(built):
  step, state, report, _ = built
  metrics, first = _first(step, state, report, CLEAN)
  assert first is None
  assert metrics["nonfinite"].regions(report) == []
  assert not np.asarray(metrics["nonfinite"].nan).any()
  assert not np.asarray(metrics["nonfinite"].inf).any()
  assert "Every value of the" in amp.explain(metrics, report)
  # Every phase has regions, each named by its scope.
  phases = {region.phase for region in report.regions
            if not region.is_input}
  assert phases == {"forward", "backward", "optimizer"}
  scopes = {region.scope for region in report.regions}
  assert {f"layers_{i}/{part}" for i in range(LAYERS)
          for part in ("attn", "mlp")} <= scopes


def test_forward_nan_is_reported_where_it_is_made(built):
  step, state, report, _ = built
  metrics, (region, what) = _first(step, state, report, _switched(FORWARD))
  assert (region.phase, region.scope) == ("forward", "layers_2/attn")
  assert "NaN" in what
  # Everything before it in program order is finite; later regions are not.
  flagged = [r.index for r, _ in metrics["nonfinite"].regions(report)]
  assert min(flagged) == region.index and len(flagged) > 1
  text = amp.explain(metrics, report)
  assert "First non-finite: forward of `layers_2/attn` (" in text
  assert "test_provenance.py:" in text


def test_backward_nan_is_reported_where_it_is_made(built):
  step, state, report, _ = built
  metrics, (region, what) = _first(step, state, report, _switched(BACKWARD))
  assert (region.phase, region.scope) == ("backward", "layers_1/mlp")
  assert what in ("NaN", "infinity", "NaN and infinity")
  # The forward pass was finite: no forward region is set.
  assert all(r.phase != "forward"
             for r, _ in metrics["nonfinite"].regions(report))
  # f16's loss scale skips the step; bf16 and f32, without one, apply it.
  f16 = jnp.dtype(step.policy.compute_dtype) == jnp.float16
  assert ("This step was skipped: its gradients were not finite." if f16
          else "This step's gradients were not finite, and it applied "
          "them") in amp.explain(metrics, report)
  assert amp.explain(metrics, report) == amp.explain(metrics, step)


def test_optimizer_nan_is_reported_where_it_is_made(built):
  step, state, report, _ = built
  metrics, (region, what) = _first(step, state, report, _switched(OPTIMIZER))
  assert region.phase == "optimizer"
  assert "div" in region.primitives and "/optax/" in region.loc
  assert what == "NaN"
  assert bool(metrics["grads_finite"])  # the gradients were finite
  assert all(r.phase == "optimizer"
             for r, _ in metrics["nonfinite"].regions(report))


def test_a_poisoned_input_is_reported_as_the_inputs(built):
  step, _, report, _ = built
  params = _params()
  params["layers"][3]["w1"] = params["layers"][3]["w1"].at[0, 0].set(jnp.inf)
  _, metrics = step(step.init(params), _batch())
  region, what = metrics["nonfinite"].first(report)
  assert region.is_input and what == "infinity"
  assert region.name == "the parameters"
  assert "First non-finite: the parameters held an infinity (one of its 25 " \
      "arrays)" in amp.explain(metrics, report)


def test_the_bit_survives_fusion_and_nothing_goes_to_the_host(built):
  step, state, report, lowered = built
  hlo = lowered.compile().as_text()
  # No host transfer: the same as the step without provenance has (none
  # but the callback train_step makes when a skipped step is stuck at the
  # loss scale's floor, inside a conditional).
  f16 = jnp.dtype(step.policy.compute_dtype) == jnp.float16
  plain = amp.train_step(transformer_loss, optax.adam(1e-3, eps=0.0),
                         step.policy,
                         loss_scale=amp.DynamicLossScale() if f16 else None)
  plain_hlo = plain.lower(plain.init(_params()), _batch()).compile().as_text()
  for transfer in ("outfeed", "infeed", " send(", " recv(", "callback("):
    assert hlo.count(transfer) == plain_hlo.count(transfer)
  assert "nonfinite" not in hlo and "outfeed" not in hlo
  # The injected log is inside a fused kernel, and its region's bit is set.
  fused = [body for body in re.split(r"\n\n", hlo)
           if re.search(r"\](\{[^}]*\})? log\(.*jvp\(layers_2\)/attn/log", body)]
  assert len(fused) == 1 and fused[0].lstrip().startswith("%fused_")
  _, (region, _) = _first(step, state, report, _switched(FORWARD))
  assert region.scope == "layers_2/attn"


def test_bits_merge_and_errors():
  step = amp.train_step(transformer_loss, optax.adam(1e-3, eps=0.0),
                        POLICIES["bf16"], numerics="provenance")
  state = step.init(_params())
  report = step.lower(state, _batch()).report()
  _, clean = step(state, _batch())
  _, bad = step(state, _batch(_switched(FORWARD)))
  merged = clean["nonfinite"].merge(bad["nonfinite"])
  assert merged.first(report) == bad["nonfinite"].first(report)
  assert "First non-finite" in amp.explain(merged, report)
  # A report of another step, or one without regions.
  other = amp.train_step(transformer_loss, optax.sgd(1e-3), POLICIES["bf16"])
  with pytest.raises(ValueError, match="numerics='provenance'"):
    bad["nonfinite"].regions(
        other.lower(other.init(_params()), _batch()).report())
  with pytest.raises(ValueError, match="accepted: none, stats, provenance"):
    amp.train_step(transformer_loss, optax.sgd(1e-3), numerics="provenace")


def test_transform_returns_the_bits_beside_its_outputs():
  fast = amp.transform(transformer_loss, POLICIES["bf16"],
                       numerics="provenance")
  params = _params()
  report = fast.lower(params, _batch()).report()
  loss, measured = fast(params, _batch())
  assert np.isfinite(loss) and measured["nonfinite"].first(report) is None
  loss, measured = jax.jit(fast)(params, _batch(_switched(FORWARD)))
  region, what = measured["nonfinite"].first(report)
  assert (region.phase, region.scope, what) == ("forward", "layers_2/attn",
                                                "NaN")
  assert not np.isfinite(loss)
  assert "First non-finite: forward of `layers_2/attn`" in \
      amp.explain(measured, report)
  # No backward region: the function has no backward pass.
  assert {r.phase for r in report.regions if not r.is_input} == {"forward"}
  # Measurements have no derivative; the error says what to do instead.
  with pytest.raises(TypeError, match=r"amp.value_and_grad, amp.train_step"):
    jax.grad(lambda p: fast(p, _batch())[0])(params)


def _scores_loss(x, y):
  with jax.named_scope("scores"):
    scores = x @ y  # 4096 x 4096 f32: 64 MiB
  with jax.named_scope("act"):
    return jnp.sum(jnp.tanh(scores))


def test_a_large_value_is_read_after_its_check():
  """A value of 64 MiB or more is read by its first elementwise reader
  after its check, `select(all(v == v or v != v), v, -v)`, so XLA cannot
  keep it for a check it puts off; what the program computes is the same,
  and the bits still name the region that made an infinity there."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4096, 8), np.float32)
  y = rng.standard_normal((8, 4096), np.float32)
  policy = POLICIES["f32"]
  fast = amp.transform(_scores_loss, policy, numerics="provenance")
  text = fast.lower(x, y).as_text()
  held = re.search(r"(%\S+) = stablehlo.negate (%\S+) : tensor<4096x4096xf32>",
                   text)
  assert held, "the scores are not read after their check"
  assert re.search(rf"stablehlo.select %\S+, {held[2]}, {held[1]} :", text)
  plain = amp.transform(_scores_loss, policy)
  loss, measured = fast(x, y)
  assert float(loss) == float(plain(x, y))
  report = fast.lower(x, y).report()
  assert measured["nonfinite"].first(report) is None
  x[5], y[:, 7] = 1e30, 1e30  # finite inputs whose product overflows
  _, measured = fast(x, y)
  region, what = measured["nonfinite"].first(report)
  assert (region.scope, what) == ("scores", "infinity"), (region, what)


def test_value_and_grad_returns_the_bits_as_a_fourth_element():
  vg = amp.value_and_grad(transformer_loss, POLICIES["f16"],
                          numerics="provenance")
  params = _params()
  report = vg.lower(params, _batch()).report()
  (_, grads), finite, _, measured = vg(params, _batch(_switched(BACKWARD)))
  region, _ = measured["nonfinite"].first(report)
  assert (region.phase, region.scope) == ("backward", "layers_1/mlp")
  assert not bool(finite)
  (_, grads), finite, _, measured = vg(params, _batch())
  assert bool(finite) and measured["nonfinite"].regions(report) == []
  assert jax.tree_util.tree_structure(grads) == \
      jax.tree_util.tree_structure(params)


def test_the_example_finds_the_overflow(capsys):
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[2] / "examples" / \
      "provenance.py"
  spec = importlib.util.spec_from_file_location("provenance_example", path)
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  example.main(["--steps", "2", "--d-model", "32", "--layers", "1"])
  out = capsys.readouterr().out
  assert "step 0" in out and "This step was skipped" in out
  assert "First non-finite: backward of `log_softmax`" in out
  assert "(f16 overflow: max finite 65504)" in out
