"""A grammar of random JAX programs for fuzzing stablehlo-amp.

A `Spec` is a straight-line list of `Step`s over a pool of live float values
(all of shape [2, 8, 8]), plus integer and boolean inputs; control-flow steps
(`lax.scan`, `lax.fori_loop`, `lax.while_loop`, `lax.cond`, `lax.switch`,
`jax.checkpoint`, nested `jax.jit`) carry bodies that are themselves step
lists; loop bodies may call a jitted helper (a `func.call` inside the while
body), and reductions may have a body that calls a private function
(`lax.reduce`/`lax.reduce_window` with a jitted combiner). `build(spec)` turns it into a JAX function and its arguments;
`programs()` is the hypothesis strategy.

Numerics are kept sane by construction, so that a low-precision program can
only differ from the f32 one by rounding: every step maps values of magnitude
<= ~4 to values of magnitude <= ~4 (exp and log see tanh'd or squared-plus-one
arguments, sums are means, products are of 1 + 0.1 tanh, dots and
convolutions are scaled by 1/sqrt(K) and softly bounded by 4 tanh(v/4),
normalisations use eps = 1), so neither f16 nor bf16 overflows where f32
does not, and nothing cancels catastrophically. Discontinuous functions of
computed floats (floor, sign, comparisons feeding data-dependent control
flow or indices) are not generated: their output may legitimately jump under
rounding. Integer indices, loop trip counts and predicates come from the
integer and boolean inputs, so integer results that do not come from sorting
floats are exact and must be bit-identical. Sorting floats (argsort, top_k,
argmax) records its keys and indices, so a test can check that the indices
are exactly those of its own keys.

`Spec.grad` differentiates the program (a VJP against a fixed cotangent);
then only smooth steps are drawn (no sort, max, abs, relu, while_loop).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

B, S, D = 2, 8, 8
SHAPE = (B, S, D)
BOUND = 4.0

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}


# -- the program description -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Step:
  """One op of the grammar.

  Attributes:
    op: the name of the op (a key of `OPS`).
    args: operand selectors; selector s picks the (s mod n)-th most recent of
      the n live float values (0 is the latest).
    variant: which form of the op (axis, einsum spec, layout...).
    body, body2: the step lists of control-flow ops.
  """
  op: str
  args: tuple[int, ...] = ()
  variant: int = 0
  body: tuple["Step", ...] = ()
  body2: tuple["Step", ...] = ()

  def __repr__(self) -> str:
    parts = [repr(self.op)]
    if self.args:
      parts.append(f"args={self.args!r}")
    if self.variant:
      parts.append(f"variant={self.variant}")
    if self.body:
      parts.append(f"body={self.body!r}")
    if self.body2:
      parts.append(f"body2={self.body2!r}")
    return f"Step({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class Spec:
  """A random program: its steps, the dtype of its second float input `y`,
  which extra live values are outputs, whether it is differentiated, and
  the seed of its input data."""
  steps: tuple[Step, ...]
  y_dtype: str = "f32"
  outputs: tuple[int, ...] = ()
  grad: bool = False
  seed: int = 0

  def __repr__(self) -> str:
    return (f"Spec(steps={self.steps!r}, y_dtype={self.y_dtype!r}, "
            f"outputs={self.outputs!r}, grad={self.grad!r}, seed={self.seed})")

  def ops(self) -> set[str]:
    names: set[str] = set()
    def visit(steps):
      for step in steps:
        names.add(step.op)
        visit(step.body)
        visit(step.body2)
    visit(self.steps)
    return names

  def depth(self) -> int:
    """The number of ops the program applies, counting a loop body once per
    iteration (an upper bound on the ops on any path; sizes the
    tolerance)."""
    def count(steps) -> int:
      total = 0
      for step in steps:
        inner = max(count(step.body), count(step.body2))
        total += 1 + OPS[step.op].iterations * inner
      return total
    return count(self.steps)


# -- the ops -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Op:
  name: str
  fn: Callable        # fn(ctx, step, *operands) -> new float value or None
  arity: int = 1      # float operands
  variants: int = 1
  smooth: bool = True  # differentiable with a gradient continuous in values
  bodies: int = 0     # control flow: number of step-list bodies
  iterations: int = 1  # how many times a body may run (for `Spec.depth`)


class Context:
  """Trace-time state: the live values and what to output."""

  def __init__(self, floats: list, inputs: dict, record: bool,
               sorts: list | None, exact: list | None, meta: list | None):
    self.floats = floats
    self.inputs = inputs
    self.record = record
    self.sorts = sorts      # (keys, indices) pairs
    self.exact = exact      # integer/bool values that must be bit-identical
    self.meta = meta        # ("argsort"|"argsort_desc"|"top_k"|"argmax", axis)

  def pick(self, selector: int):
    return self.floats[-1 - selector % len(self.floats)]

  def child(self, carry) -> "Context":
    return Context([*self.floats, carry], self.inputs, False, None, None, None)

  @property
  def i(self):
    return self.inputs["i"]

  @property
  def b(self):
    return self.inputs["b"]


def soft(v):
  """Soft bound to [-4, 4] (identity near 0)."""
  return BOUND * jnp.tanh(v / BOUND)


def _axis(variant: int) -> int:
  return 1 + variant % 2


def _index8(ctx: Context):
  """An [8] int vector of indices in [0, 8) from the int input (repeats)."""
  return ctx.i[0, 0, :] % S


def _perm8(ctx: Context):
  """A permutation of [0, 8) from the int input."""
  return jnp.argsort(ctx.i[1, 0, :], stable=True).astype(jnp.int32)


def _offset(ctx: Context, row: int = 0):
  return ctx.i[0, row, 0] % S


# elementwise ---------------------------------------------------------------

def _unary(variant_fns):
  def fn(ctx, step, v):
    return variant_fns[step.variant % len(variant_fns)](v)
  return fn


_SMOOTH_UNARY = (
    jnp.tanh,                                     # tanh
    jax.nn.sigmoid,          # logistic (JAX 0.10 lowers it to 1 / (1 + exp(-v)))
    lambda v: jnp.exp(jnp.tanh(v)),               # exponential
    lambda v: jnp.log(1.0 + v * v),               # log
    lambda v: jnp.log1p(v * v),                   # log_plus_one
    lambda v: jnp.expm1(jnp.tanh(v)),             # exponential_minus_one
    lambda v: jnp.sqrt(v * v + 1.0),              # sqrt
    lambda v: lax.rsqrt(v * v + 1.0),             # rsqrt
    lambda v: (jax.nn.sigmoid(v) + 0.5) ** 1.5,   # power
    jnp.sin,
    jnp.cos,
    lax.erf,
    lambda v: jax.nn.gelu(v, approximate=True),
    lambda v: jax.nn.gelu(v, approximate=False),
    jax.nn.softplus,
    lambda v: v * v * 0.25,                       # square
    lambda v: -v,
    jax.nn.silu,
    lambda v: jnp.cbrt(1.0 + v * v),              # cbrt
    lambda v: jnp.arctan(v),
    lambda v: v * 0.5 + 0.25,
)
_NONSMOOTH_UNARY = (
    jnp.abs,
    jax.nn.relu,
    lambda v: jnp.clip(v, -1.0, 1.0),
    jax.nn.relu6,
    lambda v: jnp.maximum(v, 0.5 * v),            # leaky relu
)


def _binary(ctx, step, v, w):
  forms = (
      lambda: (v + w) * 0.5,
      lambda: (v - w) * 0.5,
      lambda: v * jnp.tanh(w),
      lambda: v / (1.0 + w * w),
      lambda: jnp.logaddexp(jnp.tanh(v), jnp.tanh(w)),
      lambda: v * 0.5 + w.astype(v.dtype) * 0.25,   # explicit cast
  )
  return forms[step.variant % len(forms)]()


def _minmax(ctx, step, v, w):
  forms = (jnp.maximum, jnp.minimum, lambda a, b: jnp.where(a > b, a, b))
  return forms[step.variant % len(forms)](v, w)


def _select(ctx, step, v, w):
  mask = ctx.b if step.variant % 2 == 0 else (ctx.i % 3 == 0)
  return jnp.where(mask, v, w)


def _low_cast(ctx, step, v):
  """A user's explicit cast to the low dtype of `y` (or f16 / bf16)."""
  low = (ctx.inputs["y"].dtype, jnp.bfloat16, jnp.float16)[step.variant % 3]
  return v.astype(low)


def _up_cast(ctx, step, v):
  return v.astype(jnp.float32)


def _int_mix(ctx, step, v):
  """An exact int -> float conversion mixed into a float value."""
  return (v + (ctx.i % 5).astype(v.dtype) * 0.25) * 0.5


# contractions ----------------------------------------------------------------

_EINSUMS = (
    # (spec, uses the weight matrix instead of a second live value)
    ("bij,jk->bik", True),
    ("bij,bjk->bik", False),
    ("bij,bkj->bik", False),
    ("bji,bjk->bik", False),
    ("bij,bkj->bki", False),
    ("bij,kj->bik", True),
    ("bij,bik->bjk", False),
    ("bij,jk->bki", True),
    ("bji,jk->bik", True),
)


def _dot(ctx, step, v, w):
  n_forms = len(_EINSUMS) + 4
  form = step.variant % n_forms
  scale = 1.0 / math.sqrt(S)
  if form < len(_EINSUMS):
    spec, weight = _EINSUMS[form]
    rhs = ctx.inputs["w"] if weight else w
    return soft(jnp.einsum(spec, v, rhs) * scale)
  form -= len(_EINSUMS)
  if form == 0:   # two contracting dims: [b, c] inner products, then a scale
    g = jnp.einsum("bij,cij->bc", v, w) / (S * D)
    return v * jnp.tanh(g[:, :1, None])
  if form == 1:   # matrix-vector: N = 1
    mv = jnp.einsum("bij,j->bi", v, ctx.inputs["w"][:, 0]) * scale
    return soft(v * 0.5 + mv[:, :, None] * 0.5)
  if form == 2:   # lax.dot_general with f32 accumulation requested
    out = lax.dot_general(v, w, (((2,), (1,)), ((0,), (0,))),
                          preferred_element_type=jnp.float32)
    return soft(out * scale)
  # form 3: precision=HIGHEST on a matmul against the weights
  return soft(jnp.matmul(v, ctx.inputs["w"], precision=lax.Precision.HIGHEST)
              * scale)


def _conv(ctx, step, v):
  k = ctx.inputs["k"]                      # [3, 8, 8] (W, I, O)
  form = step.variant % 5
  if form == 0:     # 1-D, NWC / WIO, SAME
    out = lax.conv_general_dilated(v, k.astype(v.dtype), (1,), "SAME",
                                   dimension_numbers=("NWC", "WIO", "NWC"))
    return soft(out / math.sqrt(3 * D))
  if form == 1:     # 2-D, NHWC, 4 output features averaged
    kernel = k[:, :3, :4][:, :, None, :].astype(v.dtype)   # [3, 3, 1, 4]
    out = lax.conv_general_dilated(v[..., None], kernel, (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return soft(jnp.mean(out, axis=-1) / 3.0)
  if form == 2:     # strided, then repeated back to 8 positions
    out = lax.conv_general_dilated(v, k.astype(v.dtype), (2,), "SAME",
                                   dimension_numbers=("NWC", "WIO", "NWC"))
    return soft(jnp.repeat(out, 2, axis=1) / math.sqrt(3 * D))
  if form == 3:     # grouped: 2 groups of 4 input features
    kernel = k[:, :4, :].astype(v.dtype)
    out = lax.conv_general_dilated(v, kernel, (1,), "SAME",
                                   dimension_numbers=("NWC", "WIO", "NWC"),
                                   feature_group_count=2)
    return soft(out / math.sqrt(3 * 4))
  # form 4: NCW / OIW with rhs dilation
  kernel = jnp.transpose(k, (2, 1, 0)).astype(v.dtype)   # [O, I, W]
  out = lax.conv_general_dilated(v, kernel, (1,), "SAME", rhs_dilation=(2,),
                                 dimension_numbers=("NCW", "OIW", "NCW"))
  return soft(out / math.sqrt(3 * D))


# reductions ------------------------------------------------------------------

def _reduce(ctx, step, v):
  form, axis = divmod(step.variant, 2)
  axis += 1
  form %= 6
  if form == 0:
    r = jnp.mean(v, axis=axis, keepdims=True)
    return jnp.broadcast_to(r, v.shape) * 0.5 + v * 0.5
  if form == 1:
    return (v - jnp.mean(v, axis=(1, 2), keepdims=True)) * 0.5
  if form == 2:
    r = jnp.prod(1.0 + 0.1 * jnp.tanh(v), axis=axis, keepdims=True)
    return v * 0.5 + jnp.broadcast_to(r, v.shape)
  if form == 3:   # layer norm, eps = 1
    mean = jnp.mean(v, axis=axis, keepdims=True)
    var = jnp.var(v, axis=axis, keepdims=True)
    return (v - mean) * lax.rsqrt(var + 1.0)
  if form == 4:
    return soft(jax.nn.logsumexp(v, axis=axis, keepdims=True) - v)
  # form 5: sum over both axes of a small slice
  return v + jnp.sum(v[:, :2, :2], axis=(1, 2), keepdims=True) * 0.125


def _reduce_max(ctx, step, v):
  form, axis = divmod(step.variant, 2)
  axis += 1
  if form % 3 == 0:
    return jnp.broadcast_to(jnp.max(v, axis=axis, keepdims=True), v.shape)
  if form % 3 == 1:
    return v - jnp.min(v, axis=axis, keepdims=True) * 0.5
  # argmax: indices recorded, the float path takes the max value itself
  index = jnp.argmax(v, axis=axis, keepdims=True)
  if ctx.record:
    ctx.sorts.append((v, index))
    ctx.meta.append(("argmax", axis))
  return jnp.broadcast_to(jnp.take_along_axis(v, index, axis=axis), v.shape)


def _softmax(ctx, step, v):
  form, axis = divmod(step.variant, 2)
  axis += 1
  if form % 2 == 0:
    return jax.nn.softmax(v, axis=axis) * 4.0
  return soft(jax.nn.log_softmax(v, axis=axis))


def _window(ctx, step, v):
  form = step.variant % 6
  if form == 0:   # max pool 2 (SAME)
    return lax.reduce_window(v, -jnp.inf, lax.max, (1, 2, 1), (1, 1, 1), "SAME")
  if form == 1:   # average pool 3
    total = lax.reduce_window(v, 0.0, lax.add, (1, 3, 1), (1, 1, 1), "SAME")
    return total / 3.0
  if form == 2:   # strided sum pool, repeated back
    total = lax.reduce_window(v, 0.0, lax.add, (1, 1, 2), (1, 1, 2), "VALID")
    return jnp.repeat(total * 0.5, 2, axis=2)
  if form == 3:
    return jnp.cumsum(v, axis=1) / S
  if form == 4:
    return jnp.cumprod(1.0 + 0.1 * jnp.tanh(v), axis=2)
  return soft(lax.cumlogsumexp(v, axis=2))


def _window_nonsmooth(ctx, step, v):
  if step.variant % 2 == 0:
    return lax.cummax(v, axis=1)
  return lax.reduce_window(v, jnp.inf, lax.min, (1, 2, 2), (1, 1, 1), "SAME")


# Reduction bodies that call a private function: lax.reduce and
# lax.reduce_window take any JAX function as the body, and a jitted one
# stays a `func.call` inside the body (nested: a call of a call).
_add_call = jax.jit(lambda a, b: a + b)
_max_call = jax.jit(jnp.maximum)
_logaddexp_call = jax.jit(lambda a, b: _add_call(jnp.maximum(a, b), jnp.log1p(
    jnp.exp(-jnp.abs(a - b)))))


def _reduce_call(ctx, step, v):
  form = step.variant % 5
  zero = jnp.zeros((), v.dtype)
  low = jnp.array(-jnp.inf, v.dtype)
  if form == 0:   # a sum whose body calls an add: a mean
    r = lax.reduce(v, zero, _add_call, (2,)) / D
    return v * 0.5 + r[:, :, None] * 0.5
  if form == 1:   # a max whose body calls maximum
    return jnp.broadcast_to(lax.reduce(v, low, _max_call, (1,))[:, None, :],
                            v.shape)
  if form == 2:   # logsumexp whose body calls a function that calls another
    r = lax.reduce(v, low, _logaddexp_call, (2,))
    return soft(r[:, :, None] - v)
  if form == 3:   # a sum pool whose window body calls an add
    total = lax.reduce_window(v, zero, _add_call, (1, 3, 1), (1, 1, 1),
                              "SAME")
    return total / 3.0
  # a max pool whose window body calls maximum
  return lax.reduce_window(v, low, _max_call, (1, 2, 2), (1, 1, 1), "SAME")


# indexing --------------------------------------------------------------------

def _gather(ctx, step, v, w):
  form = step.variant % 6
  if form == 0:
    return jnp.take(v, _index8(ctx), axis=1)
  if form == 1:
    return jnp.take_along_axis(v, ctx.i % D, axis=2)
  if form == 2:   # embedding-style row lookup of a [16, 8] table
    rows = v.reshape(B * S, D)[ctx.i[:, :, 0] % (B * S)]
    return rows
  if form == 3:   # scatter-add with repeated indices
    return soft(jnp.zeros_like(v).at[:, _index8(ctx)].add(w.astype(v.dtype))
                * 0.5)
  if form == 4:   # scatter-set through a permutation (no repeated index)
    return v.at[:, _perm8(ctx)].set(w.astype(v.dtype))
  # scatter-multiply (unique indices, so it is differentiable)
  return v.at[:, _perm8(ctx)].multiply(
      (1.0 + 0.1 * jnp.tanh(w)).astype(v.dtype), unique_indices=True)


def _scatter_max(ctx, step, v, w):
  if step.variant % 2 == 0:
    return v.at[:, _index8(ctx)].max(w.astype(v.dtype))
  return v.at[:, _index8(ctx)].min(w.astype(v.dtype))


def _dynamic(ctx, step, v, w):
  form = step.variant % 3
  if form == 0:
    a = lax.dynamic_slice_in_dim(v, _offset(ctx, 0), 4, axis=1)
    c = lax.dynamic_slice_in_dim(w, _offset(ctx, 1), 4, axis=1)
    return jnp.concatenate([a, c.astype(a.dtype)], axis=1)
  if form == 1:
    return lax.dynamic_update_slice_in_dim(v, w[:, :3].astype(v.dtype),
                                           _offset(ctx, 2), axis=1)
  return lax.dynamic_slice(jnp.concatenate([v, w.astype(v.dtype)], axis=2),
                           (0, 0, _offset(ctx, 3)), SHAPE)


# sorting ---------------------------------------------------------------------

def _sort(ctx, step, v):
  form, axis = divmod(step.variant, 2)
  axis += 1
  form %= 4
  if form == 0:
    return jnp.sort(v, axis=axis)
  if form in (1, 2):
    descending = form == 2
    index = jnp.argsort(v, axis=axis, stable=True, descending=descending)
    if ctx.record:
      ctx.sorts.append((v, index))
      ctx.meta.append(("argsort_desc" if descending else "argsort", axis))
    return jnp.take_along_axis(v, index, axis=axis)
  values, index = lax.top_k(v, 4)
  if ctx.record:
    ctx.sorts.append((v, index))
    ctx.meta.append(("top_k", 2))
  return jnp.concatenate([values, -values[..., ::-1]], axis=-1)


# data movement ---------------------------------------------------------------

def _shape(ctx, step, v, w):
  form = step.variant % 10
  if form == 0:
    return jnp.swapaxes(v, 1, 2)
  if form == 1:   # reshape shuffle
    return v.reshape(B, 4, 16).transpose(0, 2, 1).reshape(SHAPE)
  if form == 2:
    return jnp.concatenate([v[:, :4], w[:, 4:].astype(v.dtype)], axis=1)
  if form == 3:
    return jnp.pad(v[:, 1:-1, :], ((0, 0), (1, 1), (0, 0)))
  if form == 4:   # interior padding
    return lax.pad(v[:, :4], jnp.zeros((), v.dtype),
                   ((0, 0, 0), (0, 1, 1), (0, 0, 0)))
  if form == 5:
    return jnp.flip(v, axis=2)
  if form == 6:
    return jnp.roll(v, 3, axis=1)
  if form == 7:
    return jnp.tile(v[:, 4:], (1, 2, 1))
  if form == 8:   # an iota and a broadcast row
    return v * 0.5 + jnp.arange(D, dtype=v.dtype) * 0.25
  return jnp.pad(v[:, 2:, 1:], ((0, 0), (1, 1), (0, 1)), mode="edge")


# control flow ----------------------------------------------------------------

def run_steps(ctx: Context, steps) -> Any:
  for step in steps:
    op = OPS[step.op]
    operands = [ctx.pick(a) for a in step.args[:op.arity]]
    operands += [ctx.floats[-1]] * (op.arity - len(operands))
    out = op.fn(ctx, step, *operands)
    if out is not None:
      ctx.floats.append(out)
  return ctx.floats[-1]


def _body(ctx: Context, steps, carry):
  out = run_steps(ctx.child(carry), steps)
  return out.astype(carry.dtype)


def _scan_rnn(ctx, step, v):
  w = ctx.inputs["w"].astype(v.dtype) / math.sqrt(D)
  def cell(h, x_t):
    h = jnp.tanh(h @ w + x_t)
    return h, h * 2.0
  xs = jnp.swapaxes(v, 0, 1)                  # [S, B, D]
  h0 = jnp.zeros((B, D), v.dtype)
  reverse = step.variant % 2 == 1
  _, ys = lax.scan(cell, h0, xs, reverse=reverse)
  return jnp.swapaxes(ys, 0, 1)


def _scan(ctx, step, v):
  def cell(c, _):
    c = _body(ctx, step.body, c)
    return c, c
  last, ys = lax.scan(cell, v, None, length=2)
  return (last + ys[0]) * 0.5


def _loop_body(ctx, step):
  """The loop's body function: variant 1 calls it as a jitted helper, which
  stays a `func.call` inside the while body."""
  def body(c):
    return _body(ctx, step.body, c)
  return jax.jit(body) if step.variant % 2 == 1 else body


def _fori(ctx, step, v):
  body = _loop_body(ctx, step)
  return lax.fori_loop(0, 2, lambda j, c: body(c), v)


def _while(ctx, step, v):
  n = ctx.i[0, 0, 0] % 3 + 1
  loop_body = _loop_body(ctx, step)
  def cond(carry):
    return carry[0] < n
  def body(carry):
    j, c = carry
    return j + 1, loop_body(c)
  return lax.while_loop(cond, body, (jnp.int32(0), v))[1]


def _cond(ctx, step, v):
  pred = ctx.b[0, 0, 0] if step.variant % 2 == 0 else ctx.i[0, 1, 1] > 50
  return lax.cond(pred, lambda c: _body(ctx, step.body, c),
                  lambda c: _body(ctx, step.body2, c), v)


def _switch(ctx, step, v):
  index = ctx.i[1, 1, 1] % 3
  return lax.switch(index, [lambda c: _body(ctx, step.body, c),
                            lambda c: _body(ctx, step.body2, c),
                            lambda c: c * 0.5], v)


def _remat(ctx, step, v):
  return jax.checkpoint(lambda c: _body(ctx, step.body, c))(v)


def _call(ctx, step, v):
  return jax.jit(lambda c: _body(ctx, step.body, c))(v)


# integer and boolean values (exact) ------------------------------------------

def _int_ops(ctx, step, v):
  """Integer/boolean arithmetic on the int and bool inputs: recorded as exact
  outputs; the float path is unchanged."""
  i, b = ctx.i, ctx.b
  forms = (
      lambda: (i * 3 + 7) % 11 - (i >> 1),
      lambda: (i % 3 == 0) | b,
      lambda: jnp.sum(i, axis=1),
      lambda: jnp.max(i, axis=2),
      lambda: jnp.sort(i, axis=2),
      lambda: jnp.cumsum(i, axis=2),
      lambda: jnp.argsort(i, axis=1, stable=True),
      lambda: jnp.where(b, i, -i).astype(jnp.int8),
      lambda: jnp.logical_xor(b, i > 40).astype(jnp.uint8),
  )
  if ctx.record:
    ctx.exact.append(forms[step.variant % len(forms)]())
  return None


OPS: dict[str, Op] = {op.name: op for op in (
    # Simple ops first: hypothesis shrinks a sampled op towards the first.
    Op("unary", _unary(_SMOOTH_UNARY), variants=len(_SMOOTH_UNARY)),
    Op("binary", _binary, arity=2, variants=6),
    Op("dot", _dot, arity=2, variants=len(_EINSUMS) + 4),
    Op("reduce", _reduce, variants=12),
    Op("softmax", _softmax, variants=4),
    Op("window", _window, variants=6),
    Op("shape", _shape, arity=2, variants=10),
    Op("gather", _gather, arity=2, variants=6),
    Op("dynamic", _dynamic, arity=2, variants=3),
    Op("select", _select, arity=2, variants=2),
    Op("conv", _conv, variants=5),
    Op("int_mix", _int_mix),
    Op("low_cast", _low_cast, variants=3),
    Op("up_cast", _up_cast),
    Op("int_ops", _int_ops, variants=9),
    Op("scan_rnn", _scan_rnn, variants=2),
    Op("scan", _scan, bodies=1, iterations=2),
    Op("fori", _fori, variants=2, bodies=1, iterations=2),
    Op("cond", _cond, variants=2, bodies=2),
    Op("switch", _switch, bodies=2),
    Op("remat", _remat, bodies=1),
    Op("call", _call, bodies=1),
    Op("while", _while, variants=2, bodies=1, iterations=3, smooth=False),
    Op("nonsmooth", _unary(_NONSMOOTH_UNARY), variants=len(_NONSMOOTH_UNARY),
       smooth=False),
    Op("minmax", _minmax, arity=2, variants=3, smooth=False),
    Op("reduce_max", _reduce_max, variants=6, smooth=False),
    Op("window_max", _window_nonsmooth, variants=2, smooth=False),
    Op("scatter_max", _scatter_max, arity=2, variants=2, smooth=False),
    Op("sort", _sort, variants=8, smooth=False),
    # (JAX has no derivative for a reduction with a general body.)
    Op("reduce_call", _reduce_call, variants=5, smooth=False),
)}


# -- building a program ----------------------------------------------------------

@dataclasses.dataclass
class Built:
  """A built program: `fn(*args)` returns {"f": floats, "e": exact ints,
  "s": (keys, indices) pairs}; `meta` describes each pair (filled when `fn`
  is traced)."""
  fn: Callable
  args: tuple
  meta: list
  spec: Spec

  @property
  def low_input_dtypes(self) -> set[str]:
    """Float dtypes below f32 that the f32 program itself computes in."""
    names = set()
    if self.spec.y_dtype != "f32":
      names.add(self.spec.y_dtype)
    if "low_cast" in self.spec.ops():
      names |= {"bf16", "f16"}
    return names


def make_args(spec: Spec) -> tuple:
  rng = np.random.default_rng(spec.seed)
  x = np.clip(rng.standard_normal(SHAPE), -3, 3).astype(np.float32)
  y = np.clip(rng.standard_normal(SHAPE), -3, 3)
  w = rng.standard_normal((D, D)).astype(np.float32)
  k = rng.standard_normal((3, D, D)).astype(np.float32)
  i = rng.integers(0, 100, SHAPE).astype(np.int32)
  b = rng.random(SHAPE) < 0.5
  return (jnp.asarray(x), jnp.asarray(y, DTYPES[spec.y_dtype]),
          jnp.asarray(w), jnp.asarray(k), jnp.asarray(i), jnp.asarray(b))


def build(spec: Spec) -> Built:
  meta: list = []
  cotangent = np.random.default_rng(spec.seed + 1).standard_normal(
      SHAPE).astype(np.float32)

  def forward(x, y, w, k, i, b, record: bool):
    inputs = {"x": x, "y": y, "w": w, "k": k, "i": i, "b": b}
    sorts: list = []
    exact: list = []
    if record:
      meta.clear()
    ctx = Context([y, x], inputs, record, sorts, exact, meta)
    last = run_steps(ctx, spec.steps)
    live = ctx.floats
    # (Not deduplicated: whether two live values are the same object
    # depends on the input dtypes, which `amp.transform` changes.)
    floats = [last] + [live[-1 - s % len(live)] for s in spec.outputs]
    return floats, exact, sorts

  def fn(x, y, w, k, i, b):
    if not spec.grad:
      floats, exact, sorts = forward(x, y, w, k, i, b, True)
      return {"f": tuple(floats), "e": tuple(exact),
              "s": tuple(tuple(p) for p in sorts)}
    def loss(x, y, w, k):
      floats, _, _ = forward(x, y, w, k, i, b, False)
      return jnp.sum(floats[0].astype(jnp.float32) * cotangent)
    value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, y, w, k)
    return {"f": (value, *grads), "e": (), "s": ()}

  return Built(fn, make_args(spec), meta, spec)


# -- hypothesis strategies -------------------------------------------------------

def _strategies():
  from hypothesis import strategies as st

  names = list(OPS)
  smooth_names = [n for n in names if OPS[n].smooth]

  @st.composite
  def steps(draw, depth: int, smooth: bool, max_size: int):
    pool = smooth_names if smooth else names
    if depth > 0:   # no nested control flow below one level
      pool = [n for n in pool if OPS[n].bodies == 0 and n != "scan_rnn"]
    count = draw(st.integers(1, max_size))
    result = []
    for _ in range(count):
      name = draw(st.sampled_from(pool))
      op = OPS[name]
      args = tuple(draw(st.integers(0, 5)) for _ in range(op.arity))
      variant = draw(st.integers(0, op.variants - 1)) if op.variants > 1 else 0
      body = body2 = ()
      if op.bodies >= 1:
        body = tuple(draw(steps(depth + 1, smooth, 3)))
      if op.bodies >= 2:
        body2 = tuple(draw(steps(depth + 1, smooth, 3)))
      result.append(Step(name, args, variant, body, body2))
    return result

  @st.composite
  def programs(draw, max_steps: int = 6):
    grad = draw(st.integers(0, 3)) == 0   # a quarter are differentiated
    body = tuple(draw(steps(0, grad, max_steps)))
    y_dtype = draw(st.sampled_from(("f32", "bf16", "f16")))
    outputs = tuple(draw(st.lists(st.integers(0, 9), max_size=2)))
    seed = draw(st.integers(0, 2 ** 16))
    return Spec(body, y_dtype, outputs, grad, seed)

  return programs


def programs(max_steps: int = 6):
  """The hypothesis strategy of random `Spec`s."""
  return _strategies()(max_steps)


POLICY_DTYPES = {"c": ("bf16", "f16"), "p": ("f32", "bf16"),
                 "o": ("f32", "bf16")}


def policies():
  from hypothesis import strategies as st
  return st.builds(lambda c, p, o: f"p={p},c={c},o={o}",
                   st.sampled_from(POLICY_DTYPES["c"]),
                   st.sampled_from(POLICY_DTYPES["p"]),
                   st.sampled_from(POLICY_DTYPES["o"]))
