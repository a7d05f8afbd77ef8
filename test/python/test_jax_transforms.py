"""JAX transformations of `amp.transform`ed functions.

`jax.grad`, `jax.vjp`, `jax.jvp`, `jax.vmap` (nested, and under `jax.jit`) of
a transformed function run derived programs that are rewritten with the same
policy. What is checked: gradients, tangents and batched results are within
the compute dtype's tolerance of the f32 ones; the derived programs' dots are
low precision (read from the lowered module); the dtype contract holds in
them (f16, bf16 and f64 values keep their dtypes unless named in params=);
custom_vjp rules apply; a derived program that cannot be rewritten runs
unchanged with a warning.
"""

from __future__ import annotations

import collections
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.mlir import ir

import stablehlo_amp as amp
from mlir_checks import walk

F32, BF16, F16, F64 = (np.dtype(jnp.float32), np.dtype(jnp.bfloat16),
                       np.dtype(jnp.float16), np.dtype(jnp.float64))
BF16_TOLERANCE = 5e-2  # relative to each leaf's largest magnitude

# -- models: dimensions >= 8 (XLA:CPU's mixed-precision dots want that) --------

_KEYS = jax.random.split(jax.random.key(11), 10)
MLP_PARAMS = {"w1": jax.random.normal(_KEYS[0], (16, 32)) / 4,
              "b1": jax.random.normal(_KEYS[1], (32,)) / 10,
              "w2": jax.random.normal(_KEYS[2], (32, 8)) / 5.6}
WIDTH, TOKENS = 16, 8
ATTENTION_PARAMS = {name: jax.random.normal(key, (WIDTH, WIDTH)) / 4
                    for name, key in zip(("wq", "wk", "wv", "wo"), _KEYS[3:7])}
X = jax.random.normal(_KEYS[7], (TOKENS, 16))
XS = jax.random.normal(_KEYS[8], (3, TOKENS, 16))


def mlp(params, x):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return h @ params["w2"]


def attention(params, x):
  q, k, v = x @ params["wq"], x @ params["wk"], x @ params["wv"]
  weights = jax.nn.softmax(q @ k.T / np.sqrt(WIDTH), axis=-1)
  return (weights @ v) @ params["wo"]


MODELS = {"mlp": (mlp, MLP_PARAMS), "attention": (attention, ATTENTION_PARAMS)}


def _loss(model):
  return lambda params, x: jnp.mean(model(params, x) ** 2)


# -- helpers -------------------------------------------------------------------


def _dot_operand_types(text: str) -> list[tuple[str, str]]:
  """The operand element types of every dot_general in a lowered module
  (every function, nested regions included), parsed by jaxlib."""
  from jax._src.interpreters import mlir as jax_mlir
  module = ir.Module.parse(text, jax_mlir.make_ir_context())
  assert module.operation.verify()
  types = []
  with module.context:
    for op in walk(module.operation):
      if op.name == "stablehlo.dot_general":
        types.append(tuple(str(ir.ShapedType(o.type).element_type)
                           for o in op.operands))
  return types


def _element_types(text: str) -> set[str]:
  """Every float element type that a value in the module has."""
  from jax._src.interpreters import mlir as jax_mlir
  module = ir.Module.parse(text, jax_mlir.make_ir_context())
  found = set()
  with module.context:
    for op in walk(module.operation):
      for value in list(op.results) + list(op.operands):
        if isinstance(value.type, ir.ShapedType):
          element = value.type.element_type
          if isinstance(element, ir.FloatType):
            found.add(str(element))
  return found


def _assert_tree_close(actual, expected, rtol=BF16_TOLERANCE):
  """Leaf by leaf, relative to each leaf's largest magnitude; same dtypes."""
  assert (jax.tree_util.tree_structure(actual) ==
          jax.tree_util.tree_structure(expected))
  for a, e in zip(jax.tree_util.tree_leaves(actual),
                  jax.tree_util.tree_leaves(expected)):
    assert a.shape == e.shape and a.dtype == e.dtype, (a, e)
    a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
    scale = float(np.max(np.abs(e)))
    np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * scale)


# -- grad, vjp, jvp ------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_grad_is_close_to_f32_and_its_dots_are_bf16(name):
  model, params = MODELS[name]
  fast = amp.transform(model, "p=f32,c=bf16,o=f32")
  loss, loss32 = _loss(fast), _loss(model)
  grad = jax.jit(jax.grad(loss))
  _assert_tree_close(grad(params, X), jax.jit(jax.grad(loss32))(params, X))
  # The forward program and the backward (VJP) program; the tangent program
  # is transposed, never built. Both are cached for the signature.
  assert fast.rewrite_count == 2
  jax.grad(loss)(params, X + 1)
  assert fast.rewrite_count == 2

  ours = _dot_operand_types(grad.lower(params, X).as_text())
  reference = _dot_operand_types(jax.jit(jax.grad(loss32)).lower(
      params, X).as_text())
  assert reference and set(reference) == {("f32", "f32")}
  # Every dot of the forward and the backward is bf16, and none is missing
  # (the backward program recomputes what it needs of the forward).
  assert set(ours) == {("bf16", "bf16")}, collections.Counter(ours)
  assert len(ours) >= len(reference)


def test_vjp_backward_program_alone_has_bf16_dots():
  model, params = MODELS["attention"]
  fast = amp.transform(model, "p=f32,c=bf16,o=f32")
  out, pullback = jax.vjp(fast, params, X)
  out32, pullback32 = jax.vjp(model, params, X)
  _assert_tree_close(out, out32)
  cotangent = jnp.cos(out32)
  _assert_tree_close(pullback(cotangent), pullback32(cotangent))
  backward = _dot_operand_types(jax.jit(pullback).lower(cotangent).as_text())
  # At least a weight gradient and an input gradient per forward dot.
  forward = _dot_operand_types(jax.jit(model).lower(params, X).as_text())
  assert len(backward) >= 2 * len(forward)
  assert set(backward) == {("bf16", "bf16")}, collections.Counter(backward)


def test_jvp_and_linearize_are_close_to_f32_with_bf16_tangent_dots():
  fast = amp.transform(attention, "p=f32,c=bf16,o=f32")
  tangents = (jax.tree_util.tree_map(jnp.sin, ATTENTION_PARAMS), jnp.cos(X))
  primals = (ATTENTION_PARAMS, X)
  jvp = jax.jit(lambda p, t: jax.jvp(fast, p, t))
  out, out_tangent = jvp(primals, tangents)
  out32, out_tangent32 = jax.jvp(attention, primals, tangents)
  _assert_tree_close((out, out_tangent), (out32, out_tangent32))
  dots = _dot_operand_types(jvp.lower(primals, tangents).as_text())
  assert len(dots) >= 3 * 6  # forward, and tangent with its primal part
  assert set(dots) == {("bf16", "bf16")}, collections.Counter(dots)

  out, linear = jax.linearize(fast, *primals)
  _assert_tree_close(linear(*tangents), out_tangent32)


# -- vmap ----------------------------------------------------------------------


@pytest.mark.parametrize("in_axes, out_axes", [
    ((None, 0), 1), ((0, 0), 0), ((0, None), 2)])
def test_vmap_equals_vmap_of_the_f32_function(in_axes, out_axes):
  fast = amp.transform(mlp, "p=f32,c=bf16,o=f32")
  params = (jax.tree_util.tree_map(lambda w: jnp.stack([w, -w, 2 * w]),
                                   MLP_PARAMS) if in_axes[0] == 0
            else MLP_PARAMS)
  x = XS if in_axes[1] == 0 else X
  batched = jax.jit(jax.vmap(fast, in_axes=in_axes, out_axes=out_axes))
  got = batched(params, x)
  want = jax.vmap(mlp, in_axes=in_axes, out_axes=out_axes)(params, x)
  _assert_tree_close(got, want)
  dots = _dot_operand_types(batched.lower(params, x).as_text())
  assert dots and set(dots) == {("bf16", "bf16")}, collections.Counter(dots)


def test_nested_vmap():
  fast = amp.transform(attention)
  xs = jnp.stack([XS, -XS])  # [2, 3, T, D]
  inner = lambda x: fast(ATTENTION_PARAMS, x)
  got = jax.vmap(jax.vmap(inner))(xs)
  want = jax.vmap(jax.vmap(lambda x: attention(ATTENTION_PARAMS, x)))(xs)
  _assert_tree_close(got, want)


# -- nesting -------------------------------------------------------------------


def _scalar_loss(fun):
  return lambda w2: jnp.sum(jnp.tanh(fun({**MLP_PARAMS, "w2": w2}, X)))


@pytest.mark.parametrize("derivative", [
    pytest.param(lambda f: jax.jit(jax.hessian(f)), id="hessian"),
    pytest.param(lambda f: jax.grad(lambda w: jnp.sum(jax.grad(f)(w) ** 2)),
                 id="grad-of-grad"),
    pytest.param(lambda f: jax.jacrev(f), id="jacrev"),
])
def test_nested_derivatives_are_close_to_f32(derivative):
  fast = amp.transform(mlp, "p=f32,c=bf16,o=f32")
  w2 = MLP_PARAMS["w2"][:, :4]  # a smaller Hessian: [32, 4, 32, 4]
  got = derivative(_scalar_loss(fast))(w2)
  want = derivative(_scalar_loss(mlp))(w2)
  _assert_tree_close(got, want, rtol=2 * BF16_TOLERANCE)
  # Every derived program, to the second order, is rewritten.
  text = jax.jit(derivative(_scalar_loss(fast))).lower(w2).as_text()
  dots = _dot_operand_types(text)
  assert dots and set(dots) == {("bf16", "bf16")}, collections.Counter(dots)


def test_vmap_of_grad_and_grad_of_vmap():
  fast = amp.transform(mlp)
  per_example = jax.jit(jax.vmap(jax.grad(_loss(fast)), in_axes=(None, 0)))
  want = jax.jit(jax.vmap(jax.grad(_loss(mlp)), in_axes=(None, 0)))(
      MLP_PARAMS, XS)
  _assert_tree_close(per_example(MLP_PARAMS, XS), want)
  dots = _dot_operand_types(per_example.lower(MLP_PARAMS, XS).as_text())
  assert set(dots) == {("bf16", "bf16")}, collections.Counter(dots)

  batched_loss = lambda fun: lambda p: jnp.sum(
      jax.vmap(fun, in_axes=(None, 0))(p, XS) ** 2)
  _assert_tree_close(jax.grad(batched_loss(fast))(MLP_PARAMS),
                     jax.jit(jax.grad(batched_loss(mlp)))(MLP_PARAMS))


def test_grad_through_scan_and_checkpoint():
  fast = amp.transform(mlp)

  def scanned(fun):
    def loss(params):
      def body(carry, x):
        return carry + jnp.mean(fun(params, x) ** 2), None
      return jax.lax.scan(body, 0.0, XS)[0]
    return loss

  grad = lambda loss: jax.jit(jax.grad(loss))(MLP_PARAMS)
  _assert_tree_close(grad(scanned(fast)), grad(scanned(mlp)))
  remat = lambda fun: jax.checkpoint(lambda p: _loss(fun)(p, X))
  _assert_tree_close(grad(remat(fast)), grad(remat(mlp)))


# -- what the derived programs keep and honour ---------------------------------


def _counter_fn(w, x, n):
  """A float output and an integer one; an integer input."""
  return jnp.tanh(x @ w) * n, n + 1


def test_integer_inputs_and_outputs_under_grad_vjp_jvp_and_vmap():
  fast = amp.transform(_counter_fn)
  w, n = MLP_PARAMS["w1"], jnp.int32(3)
  grad = jax.grad(lambda w: jnp.sum(fast(w, X, n)[0]))(w)
  want = jax.grad(lambda w: jnp.sum(_counter_fn(w, X, n)[0]))(w)
  _assert_tree_close(grad, want)

  (y, m), pullback = jax.vjp(lambda w: fast(w, X, n), w)
  assert m.dtype == jnp.int32 and int(m) == 4
  float0 = np.zeros((), jax.dtypes.float0)
  (grad_w,) = pullback((jnp.ones_like(y), float0))
  _assert_tree_close(grad_w, grad)

  (_, m), (t, m_tangent) = jax.jvp(lambda w: fast(w, X, n), (w,),
                                   (jnp.ones_like(w),))
  assert m_tangent.dtype == jax.dtypes.float0
  _assert_tree_close(t, jax.jvp(lambda w: _counter_fn(w, X, n)[0], (w,),
                                (jnp.ones_like(w),))[1])
  counts = jax.vmap(lambda n: fast(w, X, n)[1])(
      jnp.arange(3, dtype=jnp.int32))
  np.testing.assert_array_equal(counts, [1, 2, 3])


def test_grad_with_respect_to_a_python_scalar():
  fast = amp.transform(lambda w, x, s: jnp.tanh(x @ w) * s)
  w = MLP_PARAMS["w1"]
  got = jax.grad(lambda s: jnp.sum(fast(w, X, s)))(0.5)
  want = jax.grad(lambda s: jnp.sum(jnp.tanh(X @ w) * s))(0.5)
  assert got.dtype == F32
  np.testing.assert_allclose(got, want, rtol=BF16_TOLERANCE)


@jax.custom_vjp
def _clip_gradient(x):
  return x


def _clip_gradient_fwd(x):
  return x, None


def _clip_gradient_bwd(_, cotangent):
  return (jnp.clip(cotangent, -0.01, 0.01),)


_clip_gradient.defvjp(_clip_gradient_fwd, _clip_gradient_bwd)


def test_custom_vjp_rules_apply_in_the_backward_program():
  def clipped(w, x):
    return _clip_gradient(x @ w) ** 2

  fast = amp.transform(clipped)
  loss = lambda fun: lambda w: jnp.sum(fun(w, X))
  w = MLP_PARAMS["w1"]
  got = jax.grad(loss(fast))(w)

  # The reference rounds the dot's operands as the policy does, so that the
  # clip (a discrete decision) sees the same values: how XLA computes the
  # bf16 dot differs across jaxlib releases, and a cotangent at the clip
  # boundary can land on either side of it.
  def rounded(w, x):
    y = jnp.dot(x.astype(BF16), w.astype(BF16), preferred_element_type=F32)
    return _clip_gradient(y) ** 2

  _assert_tree_close(got, jax.grad(loss(rounded))(w))
  unclipped = jax.grad(lambda w: jnp.sum((X @ w) ** 2))(w)
  assert not np.allclose(got, unclipped, rtol=0.5)  # the rule made a difference
  assert fast.rewrite_count == 2


def test_derived_program_with_a_host_callback_is_rewritten():
  @jax.custom_vjp
  def host_tanh(x):
    return jnp.tanh(x)

  def fwd(x):
    return jnp.tanh(x), x

  def bwd(x, cotangent):
    derivative = jax.pure_callback(
        lambda a: (1 - np.tanh(a) ** 2).astype(a.dtype),
        jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return (cotangent * derivative,)

  host_tanh.defvjp(fwd, bwd)

  def fun(w, x):
    return host_tanh(x @ w)

  fast = amp.transform(fun)
  w = MLP_PARAMS["w1"]
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    forward = fast(w, X)  # the forward program is rewritten: no warning
  _assert_tree_close(forward, fun(w, X))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = jax.grad(lambda w: jnp.sum(fast(w, X)))(w)
  # The backward program (with its pure_callback) is rewritten to bf16 too:
  # bf16's error, not f32's.
  want = jax.grad(lambda w: jnp.sum(fun(w, X)))(w)
  error = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
  assert 1e-5 < error < 2e-2, error
  low = jax.jit(jax.grad(lambda w: jnp.sum(fast(w, X)))).lower(w).as_text()
  assert "bf16" in low


def test_user_errors_in_a_derived_program_surface_as_themselves():
  @jax.custom_vjp
  def picky(x):
    return x

  def bad_bwd(_, cotangent):
    raise KeyError("my backward rule has a bug")

  picky.defvjp(lambda x: (x, None), bad_bwd)
  fast = amp.transform(lambda w, x: picky(x @ w))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with pytest.raises(KeyError, match="my backward rule has a bug"):
      jax.grad(lambda w: jnp.sum(fast(w, X)))(MLP_PARAMS["w1"])


# -- the dtype contract in derived programs ------------------------------------


def _derived_texts(fast, w, x) -> dict[str, str]:
  """The lowered grad (forward and VJP), jvp and vmap programs."""
  loss = lambda w, x: jnp.sum(fast(w, x))
  return {
      "grad": jax.jit(jax.grad(loss, argnums=(0, 1))).lower(w, x).as_text(),
      "jvp": jax.jit(lambda w, x: jax.jvp(fast, (w, x), (w, x))).lower(
          w, x).as_text(),
      "vmap": jax.jit(jax.vmap(fast, in_axes=(None, 0))).lower(
          w, jnp.stack([x, x])).as_text(),
  }


@pytest.mark.parametrize("policy_text, arrive, foreign", [
    ("p=f32,c=bf16,o=f32", F16, "bf16"),
    ("p=f32,c=f16,o=f32", BF16, "f16"),
])
def test_f16_and_bf16_inputs_keep_their_dtype_in_derived_programs(
    policy_text, arrive, foreign):
  fast = amp.transform(mlp, policy_text)
  params = jax.tree_util.tree_map(lambda a: a.astype(arrive), MLP_PARAMS)
  x = X.astype(arrive)
  for name, text in _derived_texts(fast, params, x).items():
    types = _element_types(text)
    assert foreign not in types, (name, types)
    dots = _dot_operand_types(text)
    assert dots and set(dots) == {(str(ir_name(arrive)),) * 2}, (name, dots)
  grads = jax.grad(lambda p: jnp.sum(fast(p, x)))(params)
  want = jax.jit(jax.grad(lambda p: jnp.sum(mlp(p, x))))(params)
  assert {g.dtype for g in jax.tree_util.tree_leaves(grads)} == {arrive}
  _assert_tree_close(grads, want, rtol=1e-2)


def ir_name(dtype: np.dtype) -> str:
  return {F32: "f32", BF16: "bf16", F16: "f16", F64: "f64"}[np.dtype(dtype)]


def _with_f16_internals(w, x):
  """f32 inputs; one dot the program itself computes in f16, one result it
  returns in bf16."""
  low = x.astype(jnp.float16) @ w.astype(jnp.float16)
  return jnp.tanh(x @ w), low, low.astype(jnp.bfloat16)


def test_internals_and_outputs_the_program_types_keep_their_dtype():
  fast = amp.transform(_with_f16_internals, "p=f32,c=bf16,o=f32")
  w = MLP_PARAMS["w1"]
  outputs = fast(w, X)
  assert [o.dtype for o in outputs] == [F32, F16, BF16]
  forward = _dot_operand_types(jax.jit(fast).lower(w, X).as_text())
  assert collections.Counter(forward) == {("f16", "f16"): 1,
                                          ("bf16", "bf16"): 1}

  def loss(fun):
    return lambda w: sum(jnp.sum(o.astype(jnp.float32)) for o in fun(w, X))
  # The backward program has JAX's dots: the f32 ones in bf16, the f16 ones
  # (the f16 dot's gradient) in f16.
  ours = collections.Counter(_dot_operand_types(
      jax.jit(jax.grad(loss(fast))).lower(w).as_text()))
  reference = collections.Counter(_dot_operand_types(
      jax.jit(jax.grad(loss(_with_f16_internals))).lower(w).as_text()))
  assert set(reference) == {("f32", "f32"), ("f16", "f16")}
  assert ours == {("bf16", "bf16"): reference[("f32", "f32")],
                  ("f16", "f16"): reference[("f16", "f16")]}


def test_inputs_named_in_params_take_the_policy_in_derived_programs():
  fast = amp.transform(mlp, "p=f32,c=bf16,o=f32", params="params")
  params = jax.tree_util.tree_map(lambda a: a.astype(F16), MLP_PARAMS)
  x = X.astype(F32)
  grad = jax.jit(jax.grad(lambda p: jnp.sum(fast(p, x))))
  dots = _dot_operand_types(grad.lower(params).as_text())
  assert dots and set(dots) == {("bf16", "bf16")}, dots
  grads = grad(params)
  assert {g.dtype for g in jax.tree_util.tree_leaves(grads)} == {F16}


def _enable_x64():
  if hasattr(jax, "enable_x64"):  # jax >= 0.8
    return jax.enable_x64(True)
  from jax.experimental import enable_x64
  return enable_x64()


def test_f64_programs_are_left_as_they_are_under_x64():
  with _enable_x64():
    fast = amp.transform(mlp, "p=f32,c=bf16,o=f32")
    params = jax.tree_util.tree_map(lambda a: a.astype(F64), MLP_PARAMS)
    x = X.astype(F64)
    for name, text in _derived_texts(fast, params, x).items():
      assert _element_types(text) == {"f64"}, name
    grads = jax.grad(lambda p: jnp.sum(fast(p, x)))(params)
    want = jax.jit(jax.grad(lambda p: jnp.sum(mlp(p, x))))(params)
    assert {g.dtype for g in jax.tree_util.tree_leaves(grads)} == {F64}
    _assert_tree_close(grads, want, rtol=1e-12)


def test_grad_of_a_donating_transform_keeps_its_arguments():
  def f(w, x):
    return jnp.tanh(x @ w) @ w.T  # x's shape: the donation is usable

  fast = amp.transform(f, donate_argnums=1)
  w = MLP_PARAMS["w1"]
  x = X + 0.0
  # The backward pass reads x again: it must not have been donated.
  got = jax.grad(lambda w, x: jnp.sum(fast(w, x)))(w, x)
  want = jax.grad(lambda w, x: jnp.sum(f(w, x)))(w, X)
  assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < 2e-2
  assert not x.is_deleted()
  # At the top level the argument is donated, as with jax.jit.
  fast(w, x)
  assert x.is_deleted()
