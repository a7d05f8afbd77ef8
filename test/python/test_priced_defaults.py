"""The defaults chosen by what they cost on the target (docs/results.md,
"Estimated step time"): GEMM results in the compute dtype where f32 buys
nothing, and the gradients they write kept there while forward values scale
them; discrete decisions that keep only their gate in f32; neither a check
nor a skip of a step without a loss scale."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import cli, contract
from stablehlo_amp._src import pipeline as pl

BF16 = "p=f32,c=bf16,o=f32"
F16 = "p=f32,c=f16,o=f32"


def _dot_results(text: str) -> list[str]:
  """The result element type of each dot_general in the pretty module."""
  return re.findall(r"stablehlo\.dot_general .*-> tensor<[0-9x]*x?(\w+)>",
                    text)


def _mlp(w1, w2, x):
  return jnp.tanh(x @ w1) @ w2 + x.sum()


MLP_ARGS = (jnp.ones((64, 64)) / 8, jnp.ones((64, 32)) / 8,
            jnp.ones((16, 64)))


@pytest.mark.parametrize("target, policy, expected", [
    ("gpu", BF16, "bf16"), ("tpu", BF16, "bf16"),
    ("gpu", F16, "f32"), ("cpu", BF16, "f32")])
def test_gemm_results_default_to_the_compute_dtype_where_f32_buys_nothing(
    target, policy, expected):
  text = amp.transform(_mlp, policy, target=target).lower(*MLP_ARGS).as_text()
  assert _dot_results(text) == [expected, expected], text
  # Asked for, f32 results stay.
  pinned = amp.transform(_mlp, policy, target=target,
                         dot_result="f32").lower(*MLP_ARGS).as_text()
  assert _dot_results(pinned) == ["f32", "f32"]


def test_a_bf16_gemm_result_costs_one_rounding():
  # Made in bf16 the result is the f32 result rounded once: on XLA:CPU
  # (which upcasts the GEMM) the two differ by at most half a bf16 ulp.
  f = amp.transform(_mlp, BF16, target="cpu", level="O2",
                    dot_result="compute")
  g = amp.transform(_mlp, BF16, target="cpu", level="O2", dot_result="f32")
  x = jax.random.normal(jax.random.key(0), (16, 64))
  w1 = jax.random.normal(jax.random.key(1), (64, 64)) / 8
  w2 = jax.random.normal(jax.random.key(2), (64, 32)) / 8
  np.testing.assert_allclose(f(w1, w2, x), g(w1, w2, x), rtol=2e-2,
                             atol=2e-2)


def _router(hidden, w, wr):
  """A toy MoE gate: a GEMM makes the hidden state, a router GEMM scores
  experts, top-2 decides."""
  h = jnp.tanh(hidden @ w)
  return jax.lax.top_k(h @ wr, 2)[1]


def _router_args():
  keys = jax.random.split(jax.random.key(3), 3)
  return (jax.random.normal(keys[0], (256, 64)),
          jax.random.normal(keys[1], (64, 64)) / 8,
          jax.random.normal(keys[2], (64, 8)))


def _pre_ln_loss(params, batch):
  # A layer norm with its gain, read by a matrix multiply: the backward pass
  # scales the multiply's dX (dy) by the gain, rstd and x - mean.
  h = batch @ params["w1"]
  mean = h.mean(-1, keepdims=True)
  centred = h - mean
  rstd = jax.lax.rsqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5)
  y = centred * rstd * params["gain"] + params["bias"]
  return jnp.tanh(y @ params["w2"]).mean()


PRE_LN = ({"w1": jax.random.normal(jax.random.key(0), (128, 128)) / 11,
           "w2": jax.random.normal(jax.random.key(1), (128, 128)) / 11,
           "gain": 1 + jax.random.normal(jax.random.key(2), (128,)) / 10,
           "bias": jnp.zeros(128)},
          jax.random.normal(jax.random.key(3), (256, 128)))


def _scaled_gradients(step, params, batch) -> list[str]:
  report = step.lower(step.init(params), batch).report()
  return [d.op for d in report.decisions
          if d.reason_id == "scales_low_gradient"]


@pytest.mark.parametrize("target, policy, options, lowered", [
    ("gpu", BF16, {}, True), ("tpu", BF16, {}, True),
    # f16's range is not f32's; a GEMM that writes f32; XLA:CPU.
    ("gpu", F16, {}, False), ("gpu", BF16, {"dot_result": "f32"}, False),
    ("cpu", BF16, {}, False)])
def test_a_gradient_a_gemm_wrote_in_bf16_stays_there_while_forward_values_scale_it(
    target, policy, options, lowered):
  params, batch = PRE_LN
  step = amp.train_step(_pre_ln_loss, optax.sgd(0.1), policy, target=target,
                        **options)
  scaled = _scaled_gradients(step, params, batch)
  assert (len(scaled) > 0) == lowered, scaled
  assert set(scaled) <= {"stablehlo.multiply"}


def test_gradient_products_in_bf16_cost_about_one_rounding():
  # The gpu rewrite run on XLA:CPU: the gain's gradient (a sum of dy * x̂)
  # and the first weight's (through the layer norm's backward pass) against
  # f32, with and without the products in bf16 (dot_result="f32" keeps
  # dy f32, and the products with it).
  params, batch = PRE_LN
  reference = jax.grad(_pre_ln_loss)(params, batch)

  def error(**options):
    vg = amp.value_and_grad(_pre_ln_loss, BF16, target="gpu", **options)
    (_, grads), _, _ = vg(params, batch)
    return {name: float(jnp.linalg.norm(grads[name] - reference[name]) /
                        jnp.linalg.norm(reference[name]))
            for name in ("w1", "gain")}

  products, pinned = error(), error(dot_result="f32")
  for name in products:
    assert 0 < products[name] < 0.02, (name, products, pinned)
    assert products[name] < 1.5 * pinned[name], (name, products, pinned)


def test_decisions_gate_keeps_the_router_f32_and_the_hidden_state_low():
  args = _router_args()
  report = amp.transform(_router, BF16, target="gpu").lower(*args).report()
  reasons = sorted(d.reason_id for d in report.decisions
                   if d.op.endswith("dot_general"))
  assert reasons == ["gates_decision", "matrix_multiply_compute"], str(report)
  assert ("the matrix multiply that gates a discrete decision (top_k)"
          in str(report)), str(report)
  text = amp.transform(_router, BF16, target="gpu").lower(*args).as_text()
  assert re.search(r"dot_general .*\(tensor<256x64xbf16>, tensor<64x64xbf16>\)",
                   text), text
  assert re.search(r"dot_general .*\(tensor<256x64xf32>, tensor<64x8xf32>\) "
                   r"-> tensor<256x8xf32>", text), text


def test_decisions_exact_keeps_everything_upstream_and_routes_equal_f32s():
  args = _router_args()
  exact = amp.transform(_router, BF16, target="cpu", level="O2",
                        decisions="exact")
  text = exact.lower(*args).as_text()
  assert "bf16" not in text, text
  np.testing.assert_array_equal(exact(*args), jax.jit(_router)(*args))
  # The gate alone agrees on most routes of this toy (the hidden state is
  # rounded to bf16 before the f32 router reads it).
  gate = amp.transform(_router, BF16, target="cpu", level="O2")
  agree = np.mean(np.asarray(gate(*args)) == np.asarray(jax.jit(_router)(
      *args)))
  assert agree >= 0.95, agree


def _moe_gate(hidden, scale, w_expert, w_router):
  """A layer norm makes the hidden state in f32; an expert's GEMM reads it
  in the compute dtype, and the router's GEMM decides top-2."""
  centred = hidden - hidden.mean(-1, keepdims=True)
  normed = centred * jax.lax.rsqrt((centred ** 2).mean(-1, keepdims=True)
                                   + 1e-6) * scale
  return normed @ w_expert, jax.lax.top_k(normed @ w_router, 2)[1]


def test_the_gate_reads_the_hidden_state_as_the_experts_do():
  keys = jax.random.split(jax.random.key(4), 3)
  args = (jax.random.normal(keys[0], (256, 64)), jnp.ones((64,)),
          jax.random.normal(keys[1], (64, 128)) / 8,
          jax.random.normal(keys[2], (64, 8)))
  text = amp.transform(_moe_gate, BF16, target="gpu").lower(*args).as_text()
  # The router's GEMM stays f32 and reads the experts' bf16 copy, held by a
  # barrier (or XLA would fold the round trip into the f32 original).
  held = re.search(r"(%\S+) = stablehlo\.optimization_barrier \S+ : "
                   r"tensor<256x64xbf16>", text)
  assert held, text
  widened = re.search(r"(%\S+) = stablehlo\.convert " +
                      re.escape(held[1]) + " ", text)
  assert widened, text
  assert re.search(r"stablehlo\.dot_general " + re.escape(widened[1]) +
                   r", .*\(tensor<256x64xf32>, tensor<64x8xf32>\) -> "
                   r"tensor<256x8xf32>", text), text
  exact = amp.transform(_moe_gate, BF16, target="gpu", decisions="exact")
  assert "optimization_barrier" not in exact.lower(*args).as_text()
  # The routes: those of a bf16 hidden state, nearly all f32's.
  routes = np.asarray(amp.transform(_moe_gate, BF16, target="cpu",
                                    level="O2")(*args)[1])
  f32_routes = np.asarray(jax.jit(_moe_gate)(*args)[1])
  assert np.mean(routes == f32_routes) >= 0.95


def test_an_unknown_decisions_value_names_the_accepted_ones():
  with pytest.raises(ValueError, match=r"unknown decisions 'route' "
                     r"\(accepted: exact, gate\)"):
    amp.transform(_router, BF16, decisions="route").lower(*_router_args())
  with pytest.raises(ValueError, match=r"accepted: exact, gate"):
    amp.train_step(lambda p, b: (b @ p).sum(), optax.sgd(0.1), BF16,
                   decisions="route")
  assert cli.main(["-", "--decisions", "route"]) == 2


def _nan_grad_loss(params, batch):
  # sqrt(x) at x = 0 has an infinite derivative: the gradient of w is NaN
  # while the loss is finite.
  return jnp.sqrt(jnp.abs(batch @ params["w"] - 1.0)).sum()


def test_without_a_loss_scale_a_step_checks_and_skips_nothing():
  params = {"w": jnp.ones((4, 2))}
  batch = jnp.full((3, 4), 0.25)          # batch @ w == 1: sqrt'(0)
  step = amp.train_step(_nan_grad_loss, optax.sgd(0.1), BF16, target="cpu")
  state = step.init(params)
  # No reduction over the gradients is compiled: a kernel each on a GPU.
  assert "is_finite" not in step.lower(state, batch).as_text()
  state, metrics = step(state, batch)
  assert "grads_finite" not in metrics
  assert int(metrics["skipped_steps"]) == 0
  assert not np.isfinite(np.asarray(state.params["w"])).all()
  # check_grads asks for the check, and still skips nothing.
  checking = amp.train_step(_nan_grad_loss, optax.sgd(0.1), BF16,
                            target="cpu", check_grads=True)
  state = checking.init(params)
  assert "is_finite" in checking.lower(state, batch).as_text()
  state, metrics = checking(state, batch)
  assert not bool(metrics["grads_finite"])
  assert int(metrics["skipped_steps"]) == 0
  assert not np.isfinite(np.asarray(state.params["w"])).all()
  # skip_nonfinite asks for the skip: the old parameters stay.
  skipping = amp.train_step(_nan_grad_loss, optax.sgd(0.1), BF16,
                            target="cpu", skip_nonfinite=True)
  state, metrics = skipping(skipping.init(params), batch)
  assert not bool(metrics["grads_finite"])
  assert int(metrics["skipped_steps"]) == 1
  np.testing.assert_array_equal(state.params["w"], params["w"])
  # A loss scale (f16's default) skips as before.
  scaled = amp.train_step(_nan_grad_loss, optax.sgd(0.1), F16, target="cpu")
  state, metrics = scaled(scaled.init(params), batch)
  assert int(metrics["skipped_steps"]) == 1
  np.testing.assert_array_equal(state.params["w"], params["w"])


def _ln_loss(params, batch):
  # A layer norm whose output the weight gradient's matrix multiply reads:
  # free to keep, costly to recompute (its statistics are reductions').
  h = batch @ params["w1"]
  mean = h.mean(-1, keepdims=True)
  centred = h - mean
  normed = centred * jax.lax.rsqrt((centred ** 2).mean(-1, keepdims=True)
                                   + 1e-6)
  return jnp.tanh(normed @ params["w2"]).sum()


def _barrier_leaves(step, params, batch) -> list[str]:
  """The operand types of each optimization barrier in the step."""
  text = step.lower(step.init(params), batch).as_text()
  return re.findall(r"stablehlo\.optimization_barrier [^:]*: (.*)", text)


def test_rematerialization_is_priced_and_memory_asks_for_the_old_trade():
  params = {"w1": jnp.ones((128, 128)) / 8, "w2": jnp.ones((128, 128)) / 8}
  batch = jnp.ones((64, 128))
  def build(**options):
    return amp.train_step(_ln_loss, optax.sgd(0.1), BF16, target="gpu",
                          **options)
  statistic = "tensor<64xf32>"            # a row's mean or variance
  # Speed (the default) recomputes nothing from a reduction's result: XLA
  # fuses the norm into one kernel, which a barrier on it would split.
  speed = _barrier_leaves(build(), params, batch)
  assert not any(statistic in leaves for leaves in speed), speed
  # Memory recomputes the normalised values from the statistics.
  memory = _barrier_leaves(build(rematerialize_for="memory"), params, batch)
  assert any(statistic in leaves for leaves in memory), memory
  # Off, only the stored values' own barriers remain.
  off = _barrier_leaves(build(rematerialize=False), params, batch)
  assert len(off) < len(speed) <= len(memory)


def _gelu_mlp_loss(params, batch):
  return (jax.nn.gelu(batch @ params["w1"]) @ params["w2"]).mean()


def test_an_fp8_gemms_activation_is_recomputed_from_its_result_and_scales():
  keys = jax.random.split(jax.random.key(0), 3)
  params = {"w1": jax.random.normal(keys[0], (128, 256)) / 10,
            "w2": jax.random.normal(keys[1], (256, 128)) / 16}
  batch = jax.random.normal(keys[2], (64, 128))
  def build(**options):
    return amp.train_step(_gelu_mlp_loss, optax.sgd(0.1), BF16 + ",gemm=f8",
                          target="gpu", fp8_min_size=0, **options)
  step, kept = build(), build(rematerialize=False)
  text = step.lower(step.init(params), batch).as_text()
  kept_text = kept.lower(kept.init(params), batch).as_text()
  # The GELU's tanh, read by the backward pass, is recomputed there, not
  # written by the forward pass's amax kernel and read back.
  assert text.count("stablehlo.tanh") == 2
  assert kept_text.count("stablehlo.tanh") == 1
  # From the GEMM's result and the scales' amaxes (scalars), which are
  # taken once: no maximum over a whole tensor is recomputed.
  leaves = _barrier_leaves(step, params, batch)
  assert any("tensor<f32>" in held and "tensor<64x256xbf16>" in held
             for held in leaves), leaves
  maxima = "applies stablehlo.maximum across dimensions = [0, 1]"
  assert text.count(maxima) == kept_text.count(maxima) > 0
  # The same step: the recomputation repeats the forward pass's ops.
  new, _ = step(step.init(params), batch)
  old, _ = kept(kept.init(params), batch)
  for name in params:
    np.testing.assert_allclose(new.params[name], old.params[name],
                               rtol=0, atol=1e-6)


def _attention_loss(params, x):
  b, s, d = x.shape
  q, k, v = (t.reshape(b, s, 4, d // 4)
             for t in jnp.split(x @ params["qkv"], 3, axis=-1))
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
  causal = jnp.tril(jnp.ones((s, s), bool))
  logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
  y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
  return jnp.sum(jnp.tanh(y.reshape(b, s, d) @ params["out"]) ** 2)


@pytest.mark.parametrize("policy", ["p=f32,c=f32,o=f32", BF16])
def test_a_softmax_backward_reads_the_probabilities_it_keeps(policy):
  keys = jax.random.split(jax.random.key(0), 3)
  params = {"qkv": jax.random.normal(keys[0], (64, 192)) / 4,
            "out": jax.random.normal(keys[1], (64, 64)) / 8}
  x = jax.random.normal(keys[2], (4, 128, 64))
  def build(**options):
    return amp.train_step(_attention_loss, optax.sgd(1.0), policy,
                          target="gpu", **options)
  step, kept = build(), build(rematerialize=False)
  text = step.lower(step.init(params), x).as_text()
  kept_text = kept.lower(kept.init(params), x).as_text()
  # No exponential is recomputed from the logits and none is kept: the
  # backward pass reads the probabilities the P V matrix multiply keeps
  # anyway, through a barrier, and sums their rows once more.
  assert text.count("stablehlo.exponential") == 1
  dtype = "f32" if "c=f32" in policy else "bf16"
  assert f"tensor<4x4x128x128x{dtype}>" in _barrier_leaves(step, params, x)
  row_sums = "applies stablehlo.add across dimensions = [3]"
  assert text.count(row_sums) == kept_text.count(row_sums) + 1
  # Softmax is shift-invariant: the same derivative (to f32 rounding where
  # everything is f32), and no further from f32's where it is bf16.
  exact = jax.grad(_attention_loss)(params, x)
  def error(candidate):
    updated, _ = candidate(candidate.init(params), x)
    return max(float(jnp.linalg.norm(params[k] - updated.params[k] - exact[k])
                     / jnp.linalg.norm(exact[k])) for k in params)
  if dtype == "f32":
    assert error(step) < 1e-5
  else:
    assert error(step) <= 1.05 * error(kept)


def test_an_unknown_rematerialize_for_names_the_accepted_ones():
  with pytest.raises(ValueError, match=r"accepted: speed, memory"):
    amp.train_step(lambda p, b: (b @ p).sum(), optax.sgd(0.1), BF16,
                   rematerialize_for="fast")
  assert cli.main(["-", "--rematerialize-for", "fast"]) == 2


# A layer norm's backward term (x - mean) * dvar, the loss seed marked.
_NORM_TERM = """
func.func public @main(%x: tensor<64x128xf32>, %g: tensor<64x128xf32>,
                       %seed: tensor<f32> {amp.loss_seed}) -> tensor<64x128xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %n = stablehlo.constant dense<0.0078125> : tensor<64xf32>
  %mean = stablehlo.multiply %sum, %n : tensor<64xf32>
  %mb = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %c = stablehlo.subtract %x, %mb : tensor<64x128xf32>
  %s = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<64x128xf32>
  %ds = stablehlo.multiply %g, %s : tensor<64x128xf32>
  %p = stablehlo.multiply %ds, %c : tensor<64x128xf32>
  %dvar = stablehlo.reduce(%p init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<64x128xf32>, tensor<f32>) -> tensor<64xf32>
  %db = stablehlo.broadcast_in_dim %dvar, dims = [0] : (tensor<64xf32>) -> tensor<64x128xf32>
  %term = stablehlo.multiply %c, %db : tensor<64x128xf32>
  %dx = stablehlo.subtract %ds, %term : tensor<64x128xf32>
  return %dx : tensor<64x128xf32>
}
"""


@pytest.mark.parametrize("partitions, low", [(None, False), (1, False),
                                             (8, True)])
def test_norm_terms_are_bf16_only_in_a_partitioned_module(partitions, low):
  """The term is made in bf16 where `mhlo.num_partitions` > 1; elsewhere
  it stays f32, and the rewrite says a partitioned lowering would decide
  differently (the pass's marker, read and removed)."""
  text = _NORM_TERM if partitions is None else (
      f"module attributes {{mhlo.num_partitions = {partitions} : i32}} {{"
      f"{_NORM_TERM}}}")
  result = pl.rewrite_module(text, BF16, target="gpu")
  out = str(result.module)
  assert ("tensor<64x128xbf16>" in out) == low
  assert result.partition_dependent == (not low)
  assert contract.attribute("partition_dependent") not in out
  assert contract.attribute("partition_dependent") not in amp.rewrite(
      text, BF16, target="gpu")
  # f16 and cpu: no such term, and nothing to redo.
  for policy, target in ((F16, "gpu"), (BF16, "cpu")):
    assert not pl.rewrite_module(text, policy,
                                 target=target).partition_dependent
