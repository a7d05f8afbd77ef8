"""Test programs for stablehlo-amp: real JAX workloads with known structure.

Each `Program` is a function, a deterministic argument builder and the
structural facts its f32 StableHLO must show (so a program that stops
exercising what it was written for is noticed). `test_programs.py` runs every
program under every policy; `python test/python/programs.py` prints the table
of figures (ops lowered, kept f32, converts inserted, error against f32).

Programs 11-18 make discrete decisions or do linear algebra: a top-k
mixture of experts, an argmax classifier, a sort by a computed key (top
fraction and median), a Gaussian process with a Cholesky solve, each forward
and as an Adam training step. What feeds the decision or the solve must stay
f32 (their `decisions` and `kept_dots`), and their integer outputs must be
bit-identical to f32.

Shapes are small so the suite is fast on two cores, but every dot has
M, N >= 8 so XLA:CPU takes its native (YNNPACK) path for mixed dots (the
MoE's per-token expert products, batched matrix-vector products, run there
too; test_programs checks every dot of the optimized HLO).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

# The policies every program runs under, and the ones only some run under
# (a bf16 parameter dtype rounds the inputs themselves).
POLICIES = ("p=f32,c=bf16,o=f32", "p=f32,c=f16,o=f32")
BF16_PARAMS_POLICY = "p=bf16,c=bf16,o=f32"

ADAM_LR = 1e-3


@dataclasses.dataclass(frozen=True)
class Program:
  """One test program.

  Attributes:
    name: test id.
    fn: the f32 JAX function.
    make_args: builds the example arguments (deterministic PRNG keys).
    float_outputs: indices, in `jax.tree_util.tree_leaves(fn(*args))`, of the
      float outputs compared against f32.
    has_dot, has_conv, has_exp, has_log, has_sum: the f32 module contains a
      `dot_general`, `convolution`, `exponential`, `log`, and a sum reduction
      (`reduce`/`reduce_window`/`scatter` with an add body).
    has_while: the f32 module contains a `stablehlo.while` (scan).
    extra_policies: policies besides `POLICIES` this program runs under.
    steps: > 1 for a training step: the step is applied `steps` times, each
      time to its own previous outputs (`next_args` builds the arguments).
    next_args: (args, outputs) -> args of the next step.
    adam_params: for an Adam step: the output leaf indices that are
      parameters, compared with an allowance of 2 * lr per step.
    decisions: (reason id, detail pattern) pairs the report must show for
      ops kept f32: a discrete decision (`discrete_decision`, the decision
      named) or linear algebra (`linear_algebra`, the routine named).
    kept_dots: how many of the f32 module's dots stay f32 because they feed
      a discrete decision or linear algebra (the rest are lowered).
    same_inputs: compare each step with the f32 step applied to this run's
      own inputs, not the f32 run's: for a training step whose loss hangs
      on a discrete choice (routing, selection), the rounding that
      separates the two runs' parameters after one step may change a
      choice, after which the runs diverge by more than rounding.
  """
  name: str
  fn: Callable
  make_args: Callable[[], tuple]
  float_outputs: tuple[int, ...]
  has_dot: bool = True
  has_conv: bool = False
  has_exp: bool = False
  has_log: bool = False
  has_sum: bool = False
  has_while: bool = False
  extra_policies: tuple[str, ...] = ()
  steps: int = 1
  next_args: Callable[[tuple, Any], tuple] | None = None
  adam_params: tuple[int, ...] = ()
  decisions: tuple[tuple[str, str], ...] = ()
  kept_dots: int = 0
  same_inputs: bool = False

  @property
  def policies(self) -> tuple[str, ...]:
    return POLICIES + self.extra_policies


def _normal(key, shape, scale=1.0):
  return scale * jax.random.normal(key, shape, jnp.float32)


def _dense_init(key, fan_in, fan_out):
  return _normal(key, (fan_in, fan_out), 1.0 / np.sqrt(fan_in))


# -- 1. MLP ------------------------------------------------------------------

def mlp(params, x):
  h = jax.nn.gelu(x @ params["w1"] + params["b1"])
  return h @ params["w2"] + params["b2"]


def mlp_args():
  k = jax.random.split(jax.random.key(1), 5)
  params = {"w1": _dense_init(k[0], 32, 64), "b1": _normal(k[1], (64,), 0.1),
            "w2": _dense_init(k[2], 64, 16), "b2": _normal(k[3], (16,), 0.1)}
  return params, _normal(k[4], (16, 32))


# -- 2. CNN with batch norm --------------------------------------------------

def cnn_batchnorm(params, x):
  y = lax.conv_general_dilated(x, params["conv"], (1, 1), "SAME",
                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
  mean = jnp.mean(y, axis=(0, 1, 2))
  var = jnp.var(y, axis=(0, 1, 2))
  y = (y - mean) * lax.rsqrt(var + 1e-5) * params["gamma"] + params["beta"]
  y = jax.nn.relu(y)
  pooled = jnp.mean(y, axis=(1, 2))              # [N, C]
  return pooled @ params["dense"], mean, var


def cnn_batchnorm_args():
  k = jax.random.split(jax.random.key(2), 5)
  params = {"conv": _normal(k[0], (3, 3, 4, 16), 1.0 / np.sqrt(36)),
            "gamma": 1.0 + _normal(k[1], (16,), 0.1),
            "beta": _normal(k[2], (16,), 0.1),
            "dense": _dense_init(k[3], 16, 16)}
  return params, _normal(k[4], (8, 8, 8, 4))


# -- 3. Attention with softmax and causal mask -------------------------------

_HEADS = 4


def attention(params, x):
  b, s, d = x.shape
  hd = d // _HEADS
  def heads(w):
    return (x @ w).reshape(b, s, _HEADS, hd)
  q, k, v = heads(params["wq"]), heads(params["wk"]), heads(params["wv"])
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd).astype(np.float32)
  causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
  scores = jnp.where(causal, scores, -1e9)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, d)
  return out @ params["wo"]


def attention_args():
  k = jax.random.split(jax.random.key(3), 5)
  params = {name: _dense_init(key, 32, 32)
            for name, key in zip(("wq", "wk", "wv", "wo"), k[:4])}
  return params, _normal(k[4], (2, 16, 32))


# -- 4. Layer norm -----------------------------------------------------------

def layer_norm(params, x):
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  y = (x - mean) * lax.rsqrt(var + 1e-6) * params["gamma"] + params["beta"]
  return y @ params["w"]


def layer_norm_args():
  k = jax.random.split(jax.random.key(4), 4)
  params = {"gamma": 1.0 + _normal(k[0], (64,), 0.1),
            "beta": _normal(k[1], (64,), 0.1),
            "w": _dense_init(k[2], 64, 32)}
  # An offset mean, so the statistics matter.
  return params, 3.0 + _normal(k[3], (16, 64))


# -- 5. RMS norm -------------------------------------------------------------

def rms_norm(params, x):
  ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  y = x * lax.rsqrt(ms + 1e-6) * params["scale"]
  return y @ params["w"]


def rms_norm_args():
  k = jax.random.split(jax.random.key(5), 3)
  params = {"scale": 1.0 + _normal(k[0], (64,), 0.1),
            "w": _dense_init(k[1], 64, 32)}
  return params, _normal(k[2], (16, 64), 4.0)


# -- 6. Cross-entropy loss ---------------------------------------------------

def cross_entropy(params, x, labels):
  logits = x @ params["w"] + params["b"]
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
  return jnp.mean(nll), logp


def cross_entropy_args():
  k = jax.random.split(jax.random.key(6), 4)
  params = {"w": _dense_init(k[0], 32, 32), "b": _normal(k[1], (32,), 0.1)}
  return (params, _normal(k[2], (16, 32)),
          jax.random.randint(k[3], (16,), 0, 32, jnp.int32))


# -- 7. lax.scan RNN ---------------------------------------------------------

def scan_rnn(params, xs):
  def cell(h, x):
    h = jnp.tanh(x @ params["wx"] + h @ params["wh"] + params["b"])
    return h, h
  h0 = jnp.zeros((xs.shape[1], params["wh"].shape[0]), xs.dtype)
  h_last, hs = lax.scan(cell, h0, xs)
  return hs, h_last


def scan_rnn_args():
  k = jax.random.split(jax.random.key(7), 4)
  params = {"wx": _dense_init(k[0], 16, 32), "wh": _dense_init(k[1], 32, 32),
            "b": _normal(k[2], (32,), 0.1)}
  return params, _normal(k[3], (6, 8, 16))


# -- 8. cumsum ---------------------------------------------------------------

def cumsum(params, x):
  y = x @ params["w"]
  return jnp.cumsum(y, axis=1)


def cumsum_args():
  k = jax.random.split(jax.random.key(8), 2)
  return {"w": _dense_init(k[0], 32, 32)}, _normal(k[1], (16, 32))


# -- 9. Embedding lookup (gather) and its scatter-add ------------------------

def embedding(params, ids):
  table = params["table"]
  e = table[ids]                                    # gather [8, 4, 16]
  h = e.reshape(ids.shape[0], -1) @ params["w"]     # [8, 16]
  # The embedding-gradient pattern: scatter-add rows back into the table
  # (ids repeat, so rows accumulate).
  updates = e.reshape(-1, table.shape[1]) @ params["w_back"]   # [32, 16]
  table_grad = jnp.zeros_like(table).at[ids.reshape(-1)].add(updates)
  return h, table_grad


def embedding_args():
  k = jax.random.split(jax.random.key(9), 4)
  params = {"table": _normal(k[0], (24, 16)),
            "w": _dense_init(k[1], 64, 16),
            "w_back": _dense_init(k[2], 16, 16)}
  return params, jax.random.randint(k[3], (8, 4), 0, 24, jnp.int32)


# -- 10. value_and_grad + optax AdamW step ------------------------------------

_OPTIMIZER = optax.adamw(ADAM_LR, weight_decay=1e-4)


def _classifier_loss(params, x, labels):
  h = jax.nn.relu(x @ params["w1"] + params["b1"])
  logits = h @ params["w2"] + params["b2"]
  logp = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def adamw_step(params, opt_state, x, labels):
  loss, grads = jax.value_and_grad(_classifier_loss)(params, x, labels)
  updates, opt_state = _OPTIMIZER.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def adamw_step_args():
  k = jax.random.split(jax.random.key(10), 6)
  params = {"w1": _dense_init(k[0], 32, 64), "b1": _normal(k[1], (64,), 0.1),
            "w2": _dense_init(k[2], 64, 16), "b2": _normal(k[3], (16,), 0.1)}
  return (params, _OPTIMIZER.init(params), _normal(k[4], (16, 32)),
          jax.random.randint(k[5], (16,), 0, 16, jnp.int32))


def _adamw_next(args, outputs):
  new_params, new_state, _ = outputs
  return (new_params, new_state) + tuple(args[2:])


# -- 11. Mixture of experts with top-k routing ----------------------------------

# Batches are large enough that rounding the router, classifier or score
# dots would change some decision (it did before issue 12: 1 of 256 MoE
# tokens, 4 of 1024 predictions, 4 of the 128-row sort's indices under
# bf16).
_EXPERTS, _TOP_K, _TOKENS = 8, 2, 256


def moe_topk(params, x):
  """Router dot -> top_k -> gather the chosen experts' weights -> combine."""
  logits = x @ params["router"]                                 # [T, 8]
  top_logits, experts = lax.top_k(logits, _TOP_K)               # [T, 2]
  gates = jax.nn.softmax(top_logits, axis=-1)
  w1 = params["w1"][experts]                                    # [T, 2, 32, 32]
  h = jax.nn.gelu(jnp.einsum("td,tkdh->tkh", x, w1))
  out = jnp.einsum("tkh,tkhd->tkd", h, params["w2"][experts])   # [T, 2, 32]
  return jnp.einsum("tk,tkd->td", gates, out), experts


def moe_topk_args():
  k = jax.random.split(jax.random.key(11), 4)
  params = {"router": _dense_init(k[0], 32, _EXPERTS),
            "w1": _normal(k[1], (_EXPERTS, 32, 32), 1.0 / np.sqrt(32)),
            "w2": _normal(k[2], (_EXPERTS, 32, 32), 1.0 / np.sqrt(32))}
  return params, _normal(k[3], (_TOKENS, 32))


# -- 12. Classifier head with argmax -----------------------------------------

def argmax_classifier(params, x):
  h = jax.nn.relu(x @ params["w1"] + params["b1"])
  logits = h @ params["w2"] + params["b2"]
  return logits, jnp.argmax(logits, axis=-1)


def argmax_classifier_args():
  k = jax.random.split(jax.random.key(12), 5)
  params = {"w1": _dense_init(k[0], 32, 64), "b1": _normal(k[1], (64,), 0.1),
            "w2": _dense_init(k[2], 64, 16), "b2": _normal(k[3], (16,), 0.1)}
  return params, _normal(k[4], (1024, 32))


# -- 13. Sort by a computed key: top fraction and median -----------------------

_ROWS, _KEEP = 128, 32   # the top quarter


def sort_select(params, x):
  """Rows ranked by a computed score (per score column): the top quarter's
  scores and indices, the median score, and the best rows pooled."""
  h = jnp.tanh(x @ params["w_in"])                         # [128, 16]
  scores = h @ params["w_score"]                           # [128, 8]
  order = jnp.argsort(scores, axis=0, descending=True)     # sort by the key
  top = order[:_KEEP]                                      # [32, 8]
  picked = jnp.take_along_axis(scores, top, axis=0)
  median = jnp.median(scores, axis=0)
  pooled = h[top[:, 0]] @ params["w_out"]                  # [32, 16]
  return pooled, picked, median, top


def sort_select_args():
  k = jax.random.split(jax.random.key(13), 4)
  params = {"w_in": _dense_init(k[0], 16, 16),
            "w_score": _dense_init(k[1], 16, 8),
            "w_out": _dense_init(k[2], 16, 16)}
  return params, _normal(k[3], (_ROWS, 16))


# -- 14. Gaussian process regression with a Cholesky solve -------------------

_GP_JITTER = 1e-4


def _sq_dists(a, b):
  """Pairwise squared distances: two norms and a dot, then a subtraction."""
  aa = jnp.sum(a * a, axis=-1)
  bb = jnp.sum(b * b, axis=-1)
  return aa[:, None] + bb[None, :] - 2.0 * (a @ b.T)


def _rbf(params, a, b):
  return jnp.exp(2.0 * params["log_amp"]) * jnp.exp(
      -0.5 * _sq_dists(a, b) * jnp.exp(-2.0 * params["log_ls"]))


def gp_regression(params, x, y, x_test):
  """A GP with an RBF kernel on learned features: the posterior mean at
  `x_test` and the negative log marginal likelihood."""
  z, z_test = x @ params["proj"], x_test @ params["proj"]
  n = x.shape[0]
  noise = jnp.exp(2.0 * params["log_noise"]) + _GP_JITTER
  k = _rbf(params, z, z) + noise * jnp.eye(n, dtype=x.dtype)
  chol = jnp.linalg.cholesky(k)
  alpha = jax.scipy.linalg.cho_solve((chol, True), y)      # [32, 8]
  mean = _rbf(params, z_test, z) @ alpha                   # [16, 8]
  nll = (0.5 * jnp.sum(y * alpha) +
         y.shape[1] * jnp.sum(jnp.log(jnp.diagonal(chol))) +
         0.5 * y.size * np.log(2 * np.pi).astype(np.float32)) / y.size
  return mean, nll


def gp_regression_args():
  k = jax.random.split(jax.random.key(14), 4)
  params = {"proj": _dense_init(k[0], 8, 8),
            "log_ls": jnp.float32(0.3), "log_amp": jnp.float32(0.0),
            "log_noise": jnp.float32(-2.0)}
  x = _normal(k[1], (32, 8))
  x_test = _normal(k[2], (16, 8))
  # Smooth targets of the inputs, plus noise.
  y = jnp.sin(x @ jnp.ones((8, 8), jnp.float32) * 0.3) + _normal(
      k[3], (32, 8), 0.1)
  return params, x, y, x_test


# -- 15-18. The same four as training steps (value_and_grad + optax Adam) ----

_ADAM = optax.adam(ADAM_LR)


def _adam_train_step(loss_fn: Callable) -> Callable:
  """(params, opt_state, *batch) -> (params, opt_state, loss, aux)."""
  def step(params, opt_state, *batch):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params,
                                                                   *batch)
    updates, opt_state = _ADAM.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, aux
  return step


def _train_args(make_args: Callable,
                extra: Callable[[], tuple] = tuple) -> Callable[[], tuple]:
  """The training step's arguments: the forward program's, with the Adam
  state after the params and `extra()` (targets, labels) after the batch."""
  def make():
    params, *batch = make_args()
    return (params, _ADAM.init(params), *batch, *extra())
  return make


def _moe_loss(params, x, target):
  y, experts = moe_topk(params, x)
  return jnp.mean(jnp.square(y - target)), experts


def _classifier_ce_loss(params, x, labels):
  logits, preds = argmax_classifier(params, x)
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))
  return nll, preds


def _sort_select_loss(params, x, target):
  pooled, picked, median, top = sort_select(params, x)
  loss = (jnp.mean(jnp.square(pooled - target)) + 0.1 * jnp.mean(picked)
          - 0.1 * jnp.mean(median))
  return loss, top


def _gp_loss(params, x, y, x_test):
  _, nll = gp_regression(params, x, y, x_test)
  return nll, ()


moe_topk_step = _adam_train_step(_moe_loss)
argmax_classifier_step = _adam_train_step(_classifier_ce_loss)
sort_select_step = _adam_train_step(_sort_select_loss)
gp_regression_step = _adam_train_step(_gp_loss)

moe_topk_step_args = _train_args(
    moe_topk_args, lambda: (_normal(jax.random.key(15), (_TOKENS, 32)),))
argmax_classifier_step_args = _train_args(
    argmax_classifier_args,
    lambda: (jax.random.randint(jax.random.key(16), (1024,), 0, 16,
                                jnp.int32),))
sort_select_step_args = _train_args(
    sort_select_args, lambda: (_normal(jax.random.key(17), (_KEEP, 16)),))
gp_regression_step_args = _train_args(gp_regression_args)


def _step_next(args, outputs):
  """The next step's arguments: the new params and state, the same batch."""
  return (outputs[0], outputs[1]) + tuple(args[2:])


# The decisions each program's report must name: (reason id, a pattern of the
# detail). The linear-algebra routines are the backend's (LAPACK on CPU,
# cuSOLVER/cuBLAS on GPU, or the StableHLO ops).
_TOP_K_DECISION = ("discrete_decision", r"top_k")
_ARGMAX_DECISION = ("discrete_decision", r"^argmax/argmin$")
_SORT_DECISION = ("discrete_decision", r"^sort$")
_GP_DECISIONS = (("linear_algebra", r"potrf|cholesky"),
                 ("linear_algebra", r"trsm|triangular_solve"))


def _leaves_of(fn, make_args):
  return jax.tree_util.tree_leaves(jax.eval_shape(fn, *make_args()))


def _float_leaves(fn, make_args) -> tuple[int, ...]:
  return tuple(i for i, leaf in enumerate(_leaves_of(fn, make_args))
               if jnp.issubdtype(leaf.dtype, jnp.floating))


def _adam_param_leaves(make_args=adamw_step_args) -> tuple[int, ...]:
  # Outputs are (params, opt_state, loss, ...): the first leaves are the
  # params.
  return tuple(range(len(jax.tree_util.tree_leaves(make_args()[0]))))


def _step(name: str, fn: Callable, make_args: Callable, **facts) -> Program:
  """A training step of the Adam steps above, applied three times."""
  return Program(name, fn, make_args,
                 float_outputs=_float_leaves(fn, make_args), steps=3,
                 next_args=_step_next,
                 adam_params=_adam_param_leaves(make_args), **facts)


PROGRAMS: tuple[Program, ...] = (
    Program("mlp", mlp, mlp_args, float_outputs=(0,),
            extra_policies=(BF16_PARAMS_POLICY,)),
    Program("cnn_batchnorm", cnn_batchnorm, cnn_batchnorm_args,
            float_outputs=(0, 1, 2), has_conv=True, has_sum=True),
    Program("attention", attention, attention_args, float_outputs=(0,),
            has_exp=True, has_sum=True, extra_policies=(BF16_PARAMS_POLICY,)),
    Program("layer_norm", layer_norm, layer_norm_args, float_outputs=(0,),
            has_sum=True, extra_policies=(BF16_PARAMS_POLICY,)),
    Program("rms_norm", rms_norm, rms_norm_args, float_outputs=(0,),
            has_sum=True),
    Program("cross_entropy", cross_entropy, cross_entropy_args,
            float_outputs=(0, 1), has_exp=True, has_log=True, has_sum=True),
    Program("scan_rnn", scan_rnn, scan_rnn_args, float_outputs=(0, 1),
            has_while=True),
    Program("cumsum", cumsum, cumsum_args, float_outputs=(0,), has_sum=True),
    Program("embedding", embedding, embedding_args, float_outputs=(0, 1),
            has_sum=True),
    Program("adamw_step", adamw_step, adamw_step_args,
            float_outputs=_float_leaves(adamw_step, adamw_step_args),
            has_exp=True, has_log=True, has_sum=True, steps=3,
            next_args=_adamw_next, adam_params=_adam_param_leaves()),
    # Discrete decisions and linear algebra (what feeds them stays f32).
    Program("moe_topk", moe_topk, moe_topk_args, float_outputs=(0,),
            has_exp=True, has_sum=True, decisions=(_TOP_K_DECISION,),
            kept_dots=1),
    Program("argmax_classifier", argmax_classifier, argmax_classifier_args,
            float_outputs=(0,), decisions=(_ARGMAX_DECISION,), kept_dots=2),
    Program("sort_select", sort_select, sort_select_args,
            float_outputs=(0, 1, 2), decisions=(_SORT_DECISION,),
            kept_dots=2),
    Program("gp_regression", gp_regression, gp_regression_args,
            float_outputs=(0, 1), has_exp=True, has_log=True, has_sum=True,
            decisions=_GP_DECISIONS, kept_dots=2),
    _step("moe_topk_step", moe_topk_step, moe_topk_step_args, has_exp=True,
          has_sum=True, decisions=(_TOP_K_DECISION,), kept_dots=1,
          same_inputs=True),
    _step("argmax_classifier_step", argmax_classifier_step,
          argmax_classifier_step_args, has_exp=True, has_log=True,
          has_sum=True, decisions=(_ARGMAX_DECISION,), kept_dots=2),
    _step("sort_select_step", sort_select_step, sort_select_step_args,
          has_exp=False, has_sum=True, decisions=(_SORT_DECISION,),
          kept_dots=2, same_inputs=True),
    _step("gp_regression_step", gp_regression_step, gp_regression_step_args,
          has_exp=True, has_log=True, has_sum=True, decisions=_GP_DECISIONS,
          kept_dots=5),
)

PROGRAMS_BY_NAME = {p.name: p for p in PROGRAMS}


# -- error measures and tolerances -------------------------------------------

# Unit roundoff of the compute dtype.
EPS = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11, "f32": 2.0 ** -24}


def compute_dtype_name(policy: str) -> str:
  return dict(kv.split("=") for kv in policy.split(","))["c"]


def tolerances(policy: str) -> tuple[float, float]:
  """(relative-norm tolerance, elementwise tolerance relative to max |ref|).

  A few roundings of each operand to the compute dtype, accumulated in f32,
  give a relative error of a small multiple of its unit roundoff u:
  bf16 (u = 2^-8): 8u = 3.1e-2 in norm, 16u = 6.3e-2 of the largest
  magnitude per element; f16 (u = 2^-11): 3.9e-3 and 7.8e-3.
  """
  eps = EPS[compute_dtype_name(policy)]
  return 8 * eps, 16 * eps


def relative_error(actual, expected) -> float:
  """||actual - expected|| / ||expected|| in f64 (0 when both are 0)."""
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  norm = np.linalg.norm(expected.ravel())
  diff = np.linalg.norm((actual - expected).ravel())
  return float(diff / norm) if norm else float(diff)


# -- figures for the closing note --------------------------------------------

@dataclasses.dataclass
class Figures:
  """What one (program, policy) run produced."""
  program: str
  policy: str
  lowered: int
  kept_f32: int
  converts_inserted: int
  max_error: float | None = None  # largest relative-norm error of an output
  note: str = ""                  # why there is no error figure


FIGURES: dict[tuple[str, str], Figures] = {}


def markdown_table(figures: dict[tuple[str, str], Figures] | None = None,
                   policy: str | None = None) -> str:
  """The table of figures: one row per program (and policy)."""
  figures = FIGURES if figures is None else figures
  rows = ["| program | policy | ops lowered | kept f32 | converts inserted "
          "| max error vs f32 |",
          "|---|---|---:|---:|---:|---:|"]
  for (name, pol), f in sorted(figures.items(),
                               key=lambda item: _order(*item[0])):
    if policy is not None and pol != policy:
      continue
    error = (f.note or "n/a") if f.max_error is None else f"{f.max_error:.2e}"
    rows.append(f"| {name} | {pol} | {f.lowered} | {f.kept_f32} | "
                f"{f.converts_inserted} | {error} |")
  return "\n".join(rows)


def _order(name: str, policy: str) -> tuple[int, int]:
  """Registry order, then the program's policy order."""
  names = [p.name for p in PROGRAMS]
  if name not in names:
    return len(names), 0
  policies = PROGRAMS_BY_NAME[name].policies
  return names.index(name), (policies.index(policy)
                             if policy in policies else len(policies))


def first_line(error: BaseException) -> str:
  """The error's message without XLA's dispatch prefixes."""
  line = str(error).splitlines()[0]
  return re.sub(r"^(INTERNAL: )?(Error dispatching computation: )*", "", line)


def collect_figures(program: Program, policy: str) -> Figures:
  """Transforms, runs and measures one program (for the standalone table)."""
  import stablehlo_amp as amp
  args = program.make_args()
  fast = amp.transform(program.fn, policy)
  lowered = fast.lower(*args)
  report = lowered.report()
  figures = Figures(program.name, policy, sum(report.lowered.values()),
                    sum(report.kept_f32.values()), report.converts_inserted)
  compiled = lowered.compile()
  try:
    steps = list(compare_steps(program, compiled, jax.jit(program.fn), args))
  except Exception as error:  # report it in the table; the tests assert it
    figures.note = "fails at run time: " + first_line(error)
    return figures
  figures.max_error = max(
      relative_error(fast[i], ref[i])
      for fast, ref in (steps if program.same_inputs else steps[-1:])
      for i in program.float_outputs)
  return figures


def compare_steps(program: Program, fast: Callable, reference: Callable,
                  args: tuple):
  """Runs `program.steps` steps of `fast` and of the f32 `reference`; yields
  each step's (fast leaves, reference leaves). The reference runs on its own
  outputs, or with `program.same_inputs` on the fast run's inputs."""
  fast_args, ref_args = args, args
  for _ in range(program.steps):
    fast_out = fast(*fast_args)
    ref_out = reference(*(fast_args if program.same_inputs else ref_args))
    yield (jax.block_until_ready(jax.tree_util.tree_leaves(fast_out)),
           jax.tree_util.tree_leaves(ref_out))
    if program.next_args is not None:
      fast_args = program.next_args(fast_args, fast_out)
      ref_args = program.next_args(ref_args, ref_out)


if __name__ == "__main__":
  import sys
  only = sys.argv[1] if len(sys.argv) > 1 else None  # a policy, optionally
  for program in PROGRAMS:
    for policy in program.policies:
      if only is None or policy == only:
        FIGURES[(program.name, policy)] = collect_figures(program, policy)
  print(markdown_table())
