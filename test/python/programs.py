"""Test programs for stablehlo-amp: real JAX workloads with known structure.

Each `Program` is a function, a deterministic argument builder and the
structural facts its f32 StableHLO must show (so a program that stops
exercising what it was written for is noticed). `test_programs.py` runs every
program under every policy; `python test/python/programs.py` prints the table
of figures (ops lowered, kept f32, converts inserted, error against f32).

Shapes are small so the suite is fast on two cores, but every dot has
M, N >= 8 so XLA:CPU takes its native (YNNPACK) path for mixed dots.
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


def _leaves_of(fn, make_args):
  return jax.tree_util.tree_leaves(jax.eval_shape(fn, *make_args()))


def _float_leaves(fn, make_args) -> tuple[int, ...]:
  return tuple(i for i, leaf in enumerate(_leaves_of(fn, make_args))
               if jnp.issubdtype(leaf.dtype, jnp.floating))


def _adam_param_leaves() -> tuple[int, ...]:
  # Outputs are (params, opt_state, loss): the first leaves are the params.
  return tuple(range(len(jax.tree_util.tree_leaves(adamw_step_args()[0]))))


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
  reference = jax.jit(program.fn)
  fast_args, ref_args = args, args
  try:
    for _ in range(program.steps):
      fast_out, ref_out = compiled(*fast_args), reference(*ref_args)
      if program.next_args is not None:
        fast_args = program.next_args(fast_args, fast_out)
        ref_args = program.next_args(ref_args, ref_out)
    fast_leaves = jax.block_until_ready(jax.tree_util.tree_leaves(fast_out))
  except Exception as error:  # report it in the table; the tests assert it
    figures.note = "fails at run time: " + first_line(error)
    return figures
  ref_leaves = jax.tree_util.tree_leaves(ref_out)
  figures.max_error = max(relative_error(fast_leaves[i], ref_leaves[i])
                          for i in program.float_outputs)
  return figures

if __name__ == "__main__":
  import sys
  only = sys.argv[1] if len(sys.argv) > 1 else None  # a policy, optionally
  for program in PROGRAMS:
    for policy in program.policies:
      if only is None or policy == only:
        FIGURES[(program.name, policy)] = collect_figures(program, policy)
  print(markdown_table())
