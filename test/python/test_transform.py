"""Tests for `amp.transform` (lower, rewrite, verify, compile, cache) and
`amp.rewrite` (text in, verified text out)."""

from __future__ import annotations

import contextlib
import re
import typing
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.mlir import ir

import stablehlo_amp as amp
from stablehlo_amp._src import hlo, jax_compat
from stablehlo_amp._src import pipeline as amp_pipeline
from jax_events import duration_events
from mlir_checks import walk

F32, BF16, F16 = np.dtype(jnp.float32), np.dtype(jnp.bfloat16), np.dtype(
    jnp.float16)

# Tolerances against the f32 run, by the lowest precision a policy uses: a
# dozen or so ulps of that dtype (bf16 eps 2**-8, f16 eps 2**-11).
TOLERANCE = {BF16: dict(rtol=5e-2, atol=5e-2), F16: dict(rtol=1e-2, atol=1e-2),
             F32: dict(rtol=1e-5, atol=1e-5)}
POLICIES = ["p=f32,c=bf16,o=f32", "p=f32,c=bf16,o=bf16", "p=bf16",
            "p=bf16,c=bf16,o=f32", "p=f32,c=f16,o=f32", "p=f16",
            "p=f32,c=f32,o=bf16"]


def _tolerance(policy: amp.Policy) -> dict:
  dtypes = {policy.param_dtype, policy.compute_dtype, policy.output_dtype}
  for dtype in (BF16, F16, F32):
    if dtype in dtypes:
      return TOLERANCE[dtype]
  raise ValueError(f"no tolerance for {policy}")


# -- functions and data ---------------------------------------------------------

_KEYS = jax.random.split(jax.random.key(0), 6)
PARAMS = {"w1": jax.random.normal(_KEYS[0], (16, 32)) / 4,
          "b1": jax.random.normal(_KEYS[1], (32,)) / 10,
          "w2": jax.random.normal(_KEYS[2], (32, 8)) / 5.6}
X = jax.random.normal(_KEYS[3], (4, 16))
W = jax.random.normal(_KEYS[4], (16, 16)) / 4


def mlp(params, x):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return jax.nn.softmax(h @ params["w2"], axis=-1)


def norm_and_logsumexp(w, x):
  y = x @ w
  mean = y.mean(-1, keepdims=True)
  var = ((y - mean)**2).mean(-1, keepdims=True)
  return (y - mean) * jax.lax.rsqrt(var + 1e-5), jnp.log(jnp.exp(y).sum())


def tanh_dot(w, x):
  return jnp.tanh(x @ w)


FUNCTIONS = {"mlp": (mlp, (PARAMS, X)),
             "norm": (norm_and_logsumexp, (W, X))}


# -- helpers --------------------------------------------------------------------


def _parse_verified(text: str) -> ir.Module:
  """Parses `text` with jaxlib's dialects and runs its verifier."""
  # jaxlib's own context (StableHLO, CHLO, Shardy, MHLO registered): the
  # verifier the contract names.
  from jax._src.interpreters import mlir as jax_mlir
  context = jax_mlir.make_ir_context()
  module = ir.Module.parse(text, context)
  assert module.operation.verify()
  return module


def _main_types(text: str) -> tuple[list[str], list[str]]:
  """Element types of the public main's arguments and results."""
  module = _parse_verified(text)
  with module.context:
    for op in module.body.operations:
      if (op.operation.name == "func.func" and
          ir.StringAttr(op.attributes["sym_name"]).value == "main"):
        function_type = ir.FunctionType(
            ir.TypeAttr(op.attributes["function_type"]).value)
        element = lambda t: str(ir.ShapedType(t).element_type)
        return ([element(t) for t in function_type.inputs],
                [element(t) for t in function_type.results])
  raise AssertionError("no main function in module")


def _op_result_types(text: str, op_name: str) -> list[str]:
  """Result element types of every `op_name` in pretty `text`."""
  types = []
  for line in text.splitlines():
    if f"= {op_name} " in line:
      types.append(re.findall(r"tensor<(?:\d+x)*(\w+)>$", line.strip())[-1])
  assert types, f"no {op_name} in module"
  return types


def _float_dtypes(tree) -> set:
  return {np.dtype(leaf.dtype) for leaf in jax.tree_util.tree_leaves(tree)
          if jnp.issubdtype(leaf.dtype, jnp.floating)}


@contextlib.contextmanager
def _count_jax_work():
  """Counts JAX tracing and XLA compilation events inside the block."""
  counts = {"trace": 0, "compile": 0}

  def listener(event: str, seconds: float, **kwargs):
    del seconds, kwargs
    if event.endswith("jaxpr_trace_duration"):
      counts["trace"] += 1
    elif event.endswith("backend_compile_duration"):
      counts["compile"] += 1

  with duration_events(listener):
    yield counts


@contextlib.contextmanager
def _no_warnings():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    yield


# -- numerics and output dtypes ----------------------------------------------


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("policy_text", POLICIES)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_outputs_close_to_f32_in_the_output_dtype(name, policy_text, level):
  fun, args = FUNCTIONS[name]
  policy = amp.Policy.parse(policy_text)
  fast = amp.transform(fun, policy=policy, level=level)
  with _no_warnings():
    got = fast(*args)
  want = jax.jit(fun)(*args)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
      want)
  assert _float_dtypes(got) == {policy.output_dtype}
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    assert g.shape == w.shape
    np.testing.assert_allclose(np.asarray(g, np.float32), w,
                               **_tolerance(policy))
  # The module really was rewritten, and verifies.
  text = fast.lower(*args).as_text()
  _parse_verified(text)
  compute = str(policy).split(",")[1][2:]
  if policy.compute_dtype != F32:
    assert f"x{compute}>" in text


def test_bf16_output_policy_gives_bf16_outputs_in_the_module_too():
  fast = amp.transform(norm_and_logsumexp, "p=f32,c=bf16,o=bf16")
  low = fast.lower(W, X)
  inputs, results = _main_types(low.as_text())
  assert inputs == ["f32", "f32"]
  assert results == ["bf16", "bf16"]
  normalized, lse = fast(W, X)
  assert normalized.dtype == BF16 and lse.dtype == BF16


def test_default_policy_is_f32_params_bf16_compute_f32_outputs():
  fast = amp.transform(tanh_dot)
  assert str(fast.policy) == "p=f32,c=bf16,o=f32"
  low = fast.lower(W, X)
  assert _main_types(low.as_text()) == (["f32", "f32"], ["f32"])
  assert _op_result_types(low.as_text(), "stablehlo.convert") == [
      "bf16", "bf16"]


# -- caching -------------------------------------------------------------------


def test_second_call_with_the_same_signature_does_no_work():
  body_calls = []

  def fun(w, x):
    body_calls.append(1)
    return jnp.tanh(x @ w)

  fast = amp.transform(fun)
  first = fast(W, X)
  assert fast.rewrite_count == 1
  traced = len(body_calls)
  assert traced >= 1
  others = [W * scale for scale in (1.0, 2.0, 3.0)]
  with _count_jax_work() as work:
    # Same signature, other values: no lowering, rewriting or compiling.
    for w in others:
      again = fast(w, X)
    same = fast(W, X)
  assert fast.rewrite_count == 1
  assert len(body_calls) == traced
  assert work == {"trace": 0, "compile": 0}
  np.testing.assert_array_equal(same, first)
  np.testing.assert_allclose(again, jnp.tanh(X @ (W * 3.0)),
                             **TOLERANCE[BF16])


def test_new_signature_rewrites_once_more_and_old_ones_stay_cached():
  body_calls = []

  def fun(w, x):
    body_calls.append(x.shape)
    return jnp.tanh(x @ w)

  fast = amp.transform(fun)
  fast(W, X)
  fast(W, X[:2])  # new shape
  assert fast.rewrite_count == 2
  fast(W.astype(jnp.float16), X)  # new dtype
  assert fast.rewrite_count == 3
  calls = len(body_calls)
  with _count_jax_work() as work:
    fast(W, X)
    fast(W, X[:2])
    fast(W.astype(jnp.float16), X)
  assert fast.rewrite_count == 3
  assert len(body_calls) == calls
  assert work == {"trace": 0, "compile": 0}


def test_lower_after_call_does_not_rewrite_again():
  fast = amp.transform(tanh_dot)
  fast(W, X)
  low = fast.lower(W, X)
  assert fast.rewrite_count == 1
  fast(W, X)
  assert fast.rewrite_count == 1
  assert "tensor<4x16xf32>" in low.as_text()


def test_lower_returns_the_module_of_its_own_arguments():
  fast = amp.transform(tanh_dot)
  fast(W, X)  # signature A: x is 4x16
  fast(W, X[:2])  # signature B: x is 2x16
  low = fast.lower(W, X)  # A again
  inputs = [line for line in low.as_text().splitlines() if "@main" in line]
  assert "tensor<4x16xf32>" in inputs[0], inputs[0]
  assert "tensor<2x16xf32>" not in inputs[0], inputs[0]


# -- static and donated arguments ---------------------------------------------


def _repeat_tanh(w, x, n, *, mode="plain"):
  y = x @ w
  for _ in range(n):
    y = jnp.tanh(y)
  return y * 2.0 if mode == "double" else y


def test_static_argnums_rewrite_per_static_value():
  fast = amp.transform(_repeat_tanh, static_argnums=2)
  for n, count in [(1, 1), (1, 1), (3, 2), (1, 2), (3, 2)]:
    got = fast(W, X, n)
    np.testing.assert_allclose(got, _repeat_tanh(W, X, n), **TOLERANCE[BF16])
    assert fast.rewrite_count == count, n
  low = fast.lower(W, X, 3)
  assert low.as_text().count("stablehlo.tanh") == 3


def test_static_argnames_rewrite_per_static_value():
  fast = amp.transform(_repeat_tanh, static_argnums=2,
                       static_argnames="mode")
  fast(W, X, 1, mode="plain")
  fast(W, X, 1, mode="plain")
  assert fast.rewrite_count == 1
  got = fast(W, X, 1, mode="double")
  assert fast.rewrite_count == 2
  np.testing.assert_allclose(got, _repeat_tanh(W, X, 1, mode="double"),
                             **TOLERANCE[BF16])
  fast(W, X, 1, mode="plain")
  assert fast.rewrite_count == 2


def _static_by_name_positionally():
  fast = amp.transform(_repeat_tanh, static_argnames="n")
  return fast(W, X, 2), jax.jit(_repeat_tanh, static_argnames="n")(W, X, 2)


def _static_by_number_as_keyword():
  fast = amp.transform(_repeat_tanh, static_argnums=2)
  return fast(W, X, n=2), jax.jit(_repeat_tanh, static_argnums=2)(W, X, n=2)


@pytest.mark.parametrize("call", [
    pytest.param(_static_by_name_positionally),
    pytest.param(_static_by_number_as_keyword),
])
def test_static_arguments_as_jax_jit_resolves_them(call):
  got, want = call()
  np.testing.assert_allclose(got, want, **TOLERANCE[BF16])


def _add_dot(w, x):
  return x @ w + 1.0


def test_donate_argnums_deletes_the_donated_buffer():
  fast = amp.transform(_add_dot, donate_argnums=1)
  w, x = W + 0, X @ W  # fresh buffers
  want = _add_dot(w, x)
  got = fast(w, x)
  assert x.is_deleted()
  assert not w.is_deleted()
  np.testing.assert_allclose(got, want, **TOLERANCE[BF16])


@pytest.mark.parametrize("by_keyword", [
    True,
    pytest.param(False),
])
def test_donate_argnames_deletes_the_donated_buffer(by_keyword):
  fast = amp.transform(_add_dot, donate_argnames="x")
  w, x = W + 0, X @ W
  want = _add_dot(w, x)
  got = fast(w, x=x) if by_keyword else fast(w, x)
  np.testing.assert_allclose(got, want, **TOLERANCE[BF16])
  assert x.is_deleted()
  assert not w.is_deleted()


def test_negative_static_argnums_count_from_the_end():
  fast = amp.transform(_repeat_tanh, static_argnums=-1)
  for n, count in [(1, 1), (3, 2), (1, 2)]:
    got = fast(W, X, n)
    np.testing.assert_allclose(got, _repeat_tanh(W, X, n), **TOLERANCE[BF16])
    assert fast.rewrite_count == count
  assert fast.lower(W, X, 3).as_text().count("stablehlo.tanh") == 3


def test_static_and_donated_arguments_are_inherited_from_jax_jit():
  jitted = jax.jit(_repeat_tanh, static_argnums=2, static_argnames="mode",
                   donate_argnums=1)
  fast = amp.transform(jitted)
  w, x = W + 0, X @ W  # fresh buffers
  want = _repeat_tanh(w, x, 2, mode="double")
  got = fast(w, x, 2, mode="double")  # n and mode static, as jax.jit has them
  np.testing.assert_allclose(got, want, **TOLERANCE[BF16])
  assert x.is_deleted() and not w.is_deleted()
  fast(w, X + 0, 2, mode="double")
  assert fast.rewrite_count == 1
  fast(w, X + 0, 3, mode="double")
  assert fast.rewrite_count == 2
  # The rewrite is of the function jax.jit wraps: the module is bf16.
  assert "bf16" in fast.lower(w, X, 2, mode="double").as_text()
  # Given again to transform: merged with jax.jit's, which are not lost.
  again = amp.transform(jitted, static_argnums=2, static_argnames="n")
  w, x = W + 0, X @ W
  np.testing.assert_allclose(again(w, x, n=1), _repeat_tanh(W, X @ W, 1),
                             **TOLERANCE[BF16])
  assert x.is_deleted() and not w.is_deleted()


def _user_bug(w, x):
  return {"y": x @ w}["missing"]


def _shape_bug(w, x):
  return x @ w[:3]


@pytest.mark.parametrize("fun, error, message", [
    (_user_bug, KeyError, "missing"),
    (_shape_bug, TypeError, "dot_general requires contracting dimensions"),
])
def test_user_exceptions_surface_as_themselves_without_a_warning(
    fun, error, message):
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no "cannot rewrite" warning before it
    with pytest.raises(error, match=message):
      amp.transform(fun)(W, X)
    with pytest.raises(error, match=message):
      amp.transform(fun).lower(W, X)
    with pytest.raises(error, match=message):
      jax.grad(lambda w: amp.transform(fun)(w, X).sum())(W)


# -- pytrees, parameters and input dtypes ---------------------------------------


class Batch(typing.NamedTuple):
  x: jax.Array
  labels: jax.Array
  valid: jax.Array


def _with_non_float_leaves(state, batch, use_bias):
  logits = batch.x @ state["w"]
  if use_bias:
    logits = logits + state["b"]
  hits = (jnp.argmax(logits, -1) == batch.labels) & batch.valid
  return {"logits": logits, "hits": hits, "step": state["step"] + 1,
          "labels": batch.labels, "big": state["big"],
          "valid": Batch(batch.x[:0], batch.labels, batch.valid),
          "flag": state["flag"]}


def _state_and_batch():
  state = {"w": W, "b": PARAMS["b1"][:16],
           "step": jnp.array(7, jnp.int32),
           "big": jnp.array([2**31 - 1, -2**31, 123456789], jnp.int32),
           "flag": True}  # a Python bool leaf
  batch = Batch(X, jnp.array([0, 3, 5, 15], jnp.int32),
                jnp.array([True, False, True, True]))
  return state, batch


@pytest.mark.parametrize("policy_text", ["p=f32,c=bf16,o=f32", "p=bf16",
                                         "p=f16,c=f16,o=f32"])
def test_pytrees_with_non_float_leaves_pass_through(policy_text):
  policy = amp.Policy.parse(policy_text)
  fun = lambda state, batch: _with_non_float_leaves(state, batch, True)
  fast = amp.transform(fun, policy)
  state, batch = _state_and_batch()
  got = fast(state, batch)
  want = jax.jit(fun)(state, batch)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
      want)
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    if jnp.issubdtype(w.dtype, jnp.floating):
      assert g.dtype == policy.output_dtype
      np.testing.assert_allclose(np.asarray(g, np.float32), w,
                                 **_tolerance(policy))
    else:
      # int32 and bool leaves: same dtype, bit-identical values.
      assert g.dtype == w.dtype
      np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(got["hits"], want["hits"])
  inputs, results = _main_types(fast.lower(state, batch).as_text())
  # step, big, labels (i32); valid, flag (i1).
  assert sorted(t for t in inputs if t[0] in "iu") == ["i1", "i1", "i32",
                                                       "i32", "i32"]
  assert {t for t in inputs if t[0] not in "iu"} == {
      str(policy).split(",")[0][2:]}
  # hits, valid.valid, flag (i1); step, labels, big, valid.labels (i32).
  assert sorted(t for t in results if t[0] in "iu") == ["i1", "i1", "i1",
                                                        "i32", "i32", "i32",
                                                        "i32"]


def test_p_bf16_makes_the_module_take_bf16_parameters():
  fast = amp.transform(mlp, "p=bf16,c=bf16,o=f32")
  inputs, results = _main_types(fast.lower(PARAMS, X).as_text())
  assert inputs == ["bf16"] * 4
  assert results == ["f32"]


@pytest.mark.parametrize("params, expected", [
    (None, ["bf16", "bf16"]),  # default: every float input
    (0, ["bf16", "f32"]),
    ((1,), ["f32", "bf16"]),
    ([0, 1], ["bf16", "bf16"]),
    ((), ["f32", "f32"]),
])
def test_params_selects_which_arguments_take_the_param_dtype(params, expected):
  fast = amp.transform(tanh_dot, "p=bf16,c=bf16,o=f32", params=params)
  inputs, _ = _main_types(fast.lower(W, X).as_text())
  assert inputs == expected
  got = fast(W, X)
  assert got.dtype == F32
  np.testing.assert_allclose(got, tanh_dot(W, X), **TOLERANCE[BF16])


def test_params_selects_whole_pytree_arguments():
  fast = amp.transform(mlp, "p=bf16,c=bf16,o=f32", params=0)
  inputs, _ = _main_types(fast.lower(PARAMS, X).as_text())
  # b1, w1, w2 (arg 0, flattened in key order), then x.
  assert inputs == ["bf16", "bf16", "bf16", "f32"]


def test_params_by_name_for_keyword_arguments():
  fast = amp.transform(tanh_dot, "p=bf16,c=bf16,o=f32", params="x")
  inputs, _ = _main_types(fast.lower(W, x=X).as_text())
  assert inputs == ["f32", "bf16"]


@pytest.mark.parametrize("params, call, expected", [
    pytest.param("x", lambda fast: fast.lower(W, X), ["f32", "bf16"],
                 id="name-positional"),
    pytest.param("w", lambda fast: fast.lower(w=W, x=X), ["bf16", "f32"],
                 id="name-keyword"),
    pytest.param(1, lambda fast: fast.lower(W, x=X), ["f32", "bf16"],
                 id="number-keyword"),
])
def test_params_resolve_names_and_numbers_like_jax_jit(params, call,
                                                       expected):
  fast = amp.transform(tanh_dot, "p=bf16,c=bf16,o=f32", params=params)
  inputs, _ = _main_types(call(fast).as_text())
  assert inputs == expected


@pytest.mark.parametrize("policy_text", ["p=f32,c=bf16,o=f32",
                                         "p=bf16,c=bf16,o=f32",
                                         "p=f16,c=f16,o=f32"])
@pytest.mark.parametrize("arrive", [BF16, F16])
def test_inputs_in_another_float_dtype_keep_it_by_default(policy_text, arrive):
  """Only f32 values take the policy: bf16 or f16 inputs (not named in
  params=) are computed as the function computes them, exactly."""
  fast = amp.transform(tanh_dot, policy_text)
  w, x = W.astype(arrive), X.astype(arrive)
  name = {BF16: "bf16", F16: "f16"}[arrive]
  assert _main_types(fast.lower(w, x).as_text())[0] == [name, name]
  got = fast(w, x)
  expected = jax.jit(tanh_dot)(w, x)
  assert got.dtype == expected.dtype == arrive
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("policy_text, arrive, module", [
    ("p=f32,c=bf16,o=f32", BF16, "f32"),
    ("p=f32,c=bf16,o=f32", F16, "f32"),
    ("p=bf16,c=bf16,o=f32", F32, "bf16"),
    ("p=bf16,c=bf16,o=f32", F16, "bf16"),
    ("p=f16,c=f16,o=f32", F32, "f16"),
])
def test_inputs_named_in_params_are_cast_once_at_the_boundary(
    policy_text, arrive, module):
  fast = amp.transform(tanh_dot, policy_text, params=("w", "x"))
  w, x = W.astype(arrive), X.astype(arrive)
  low = fast.lower(w, x)
  assert _main_types(low.as_text())[0] == [module, module]
  got = fast(w, x)
  assert got.dtype == F32
  # One cast to the param dtype: the same bits as the caller casting first.
  param = amp.Policy.parse(policy_text).param_dtype
  np.testing.assert_array_equal(got, fast(w.astype(param), x.astype(param)))
  np.testing.assert_allclose(got, tanh_dot(w.astype(F32), x.astype(F32)),
                             **TOLERANCE[BF16])


def test_python_scalars_and_weak_types():
  fast = amp.transform(lambda w, x, s: (x @ w) * s)
  got = fast(W, X, 0.5)
  assert got.dtype == F32
  np.testing.assert_allclose(got, (X @ W) * 0.5, **TOLERANCE[BF16])


# -- levels and options ----------------------------------------------------------


@pytest.mark.parametrize("policy_text", ["p=f32,c=bf16,o=f32",
                                         "p=f32,c=f16,o=f32"])
def test_level_o0_changes_nothing(policy_text):
  fast = amp.transform(mlp, policy_text, level="O0")
  low = fast.lower(PARAMS, X)
  text = low.as_text()
  assert "stablehlo.convert" not in text
  assert "bf16" not in text and "f16" not in text
  np.testing.assert_array_equal(fast(PARAMS, X), jax.jit(mlp)(PARAMS, X))
  report = low.report()
  assert report.level == "O0"
  assert sum(report.lowered.values()) == 0
  assert report.converts_inserted == 0


def _two_layers(w, x):
  return jnp.exp(jnp.tanh(x @ w) @ w)


def test_keep_f32_reaches_the_pass():
  # Painting (O2) lowers the tanh between the dots; keep_f32 keeps it.
  default = amp.transform(_two_layers, level="O2").lower(W, X)
  assert default.report().lowered["stablehlo.tanh"] == 1
  assert _op_result_types(default.as_text(), "stablehlo.tanh") == ["bf16"]
  for name in ("tanh", "stablehlo.tanh"):
    low = amp.transform(_two_layers, keep_f32=[name], level="O2").lower(W, X)
    report = low.report()
    assert "stablehlo.tanh" not in report.lowered
    assert report.kept_f32["stablehlo.tanh"] == 1
    reasons = [r for r, ops in report.kept_f32_reasons.items()
               if "stablehlo.tanh" in ops]
    assert len(reasons) == 1 and "keep" in reasons[0], reasons
    assert _op_result_types(low.as_text(), "stablehlo.tanh") == ["f32"]
    assert report.lowered["stablehlo.dot_general"] == 2


def test_force_compute_reaches_the_pass():
  default = amp.transform(_two_layers).lower(W, X)
  assert default.report().kept_f32["stablehlo.exponential"] == 1
  assert _op_result_types(default.as_text(), "stablehlo.exponential") == [
      "f32"]
  for name in ("exponential", "stablehlo.exponential"):
    fast = amp.transform(_two_layers, force_compute=[name])
    low = fast.lower(W, X)
    assert low.report().lowered["stablehlo.exponential"] == 1
    assert "stablehlo.exponential" not in low.report().kept_f32
    assert _op_result_types(low.as_text(), "stablehlo.exponential") == [
        "bf16"]
    np.testing.assert_allclose(fast(W, X), _two_layers(W, X),
                               **TOLERANCE[BF16])


def test_conflicting_keep_f32_and_force_compute_is_an_error():
  with pytest.raises(ValueError, match="tanh"):
    amp.transform(_two_layers, keep_f32=["tanh"], force_compute=["tanh"])


@pytest.mark.parametrize("option", ["keep_f32", "force_compute"])
def test_a_string_is_one_op_name(option):
  op = "tanh" if option == "keep_f32" else "exponential"
  # At O2, where both names change what the pass does.
  as_string = amp.transform(_two_layers, level="O2",
                            **{option: op}).lower(W, X)
  as_list = amp.transform(_two_layers, level="O2",
                          **{option: [op]}).lower(W, X)
  without = amp.transform(_two_layers, level="O2").lower(W, X)
  assert as_string.as_text() != without.as_text(), f"{option} had no effect"
  assert as_string.as_text() == as_list.as_text()
  assert as_string.report().lowered == as_list.report().lowered
  # Not split at commas: "tanh,exponential" is one (unknown) name.
  with pytest.raises(ValueError,
                     match=rf"invalid option '{option}': unknown op 'tanh,exponential' "):
    amp.transform(_two_layers, **{option: "tanh,exponential"})


@pytest.mark.parametrize("option, name, nearest", [
    ("keep_f32", "tanhh", "stablehlo.tanh, stablehlo.tan, stablehlo.atan2"),
    ("keep_f32", ["tanh", "stablehlo.logistc"], "stablehlo.logistic"),
    ("force_compute", "expo", "stablehlo.exponential"),
])
def test_unknown_op_names_list_the_nearest(option, name, nearest):
  bad = name if isinstance(name, str) else name[-1]
  with pytest.raises(ValueError, match=re.escape(
      f"invalid option '{option}': unknown op '{bad}' (nearest: {nearest}")):
    amp.transform(_two_layers, **{option: name})


def test_op_names_that_are_not_strings_are_a_type_error():
  with pytest.raises(TypeError, match="keep_f32 must be a string or a list of "
                     "strings, got int"):
    amp.transform(_two_layers, keep_f32=3)


@pytest.mark.parametrize("params, message", [
    (["wieght"], "params names 'wieght', which is not an argument of "
                 "_named (nearest: weight, x)"),
    ("inputs", "params names 'inputs', which is not an argument of _named "
               "(nearest: weight, x)"),
    (2, "params names argument 2, but _named takes 2 positional arguments"),
    (-3, "params names argument -3, but _named takes 2 positional "
         "arguments"),
])
def test_params_that_match_no_argument_are_errors(params, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    amp.transform(_named, params=params)


@pytest.mark.parametrize("params", [[1.5], True, [None]])
def test_params_of_another_type_are_a_type_error(params):
  with pytest.raises(TypeError, match=r"params must name arguments by "
                     r"position \(int\) or name \(str\), got "):
    amp.transform(_named, params=params)


def _named(weight, x):
  return jnp.tanh(x @ weight)


def test_a_string_in_params_is_one_name_and_negative_numbers_count_back():
  by_name = amp.transform(_named, "p=bf16,c=bf16,o=f32", params="weight")
  by_negative = amp.transform(_named, "p=bf16,c=bf16,o=f32", params=-2)
  assert _main_types(by_name.lower(W, X).as_text())[0] == ["bf16", "f32"]
  assert _main_types(by_negative.lower(W, X).as_text())[0] == ["bf16", "f32"]


# -- the report, the target and compilation ---------------------------------------


def test_the_cpu_target_defaults_to_o1_and_gpu_to_o2():
  """XLA:CPU computes low-precision elementwise arithmetic in f32, so on cpu
  only the dots are lowered by default; gpu paints."""
  cpu = amp.transform(mlp, "p=f32,c=bf16,o=f32").lower(PARAMS, X).report()
  gpu = amp.transform(mlp, "p=f32,c=bf16,o=f32",
                      target="gpu").lower(PARAMS, X).report()
  assert (cpu.level, gpu.level) == ("O1", "O2")
  assert set(cpu.lowered) == {"stablehlo.dot_general"}
  assert gpu.lowered["stablehlo.tanh"] == 1


def _library_fusion_ops(hlo_text: str) -> set[str]:
  """The ops inside XLA:CPU's YNNPACK library fusions of a compiled text."""
  module = hlo.Module.parse(hlo_text)
  return {ins.opcode for name, computation in module.computations.items()
          if module.fusion_kind(name) == "__ynn_fusion"
          for ins in computation.instructions}


def _softmax_block(w, x):
  h = jnp.tanh(x @ w)
  return (jax.nn.softmax(h - h.mean(-1, keepdims=True)) @ w.T).sum()


@pytest.mark.skipif(jax.default_backend() != "cpu" or
                    not jax_compat.cpu_storage_compiler_options(),
                    reason="XLA:CPU without the YNN fusion option")
def test_on_cpu_library_fusions_hold_only_dots_when_storage_is_low():
  """XLA:CPU's default fuses elementwise readers into YNNPACK dot fusions,
  which read f32 and make XLA keep an f32 copy of a value stored in bf16;
  a top-level call compiles with single-dot library fusions instead."""
  w, x = jnp.ones((256, 256)), jnp.ones((128, 256))
  plain = jax.jit(_softmax_block).lower(w, x).compile().as_text()
  assert _library_fusion_ops(plain) - {"dot", "parameter"}, \
      "XLA's default no longer fuses elementwise ops into YNN fusions"
  low = amp.transform(_softmax_block).lower(w, x).compile().as_text()
  assert _library_fusion_ops(low) == {"dot", "parameter"}
  f32 = amp.transform(_softmax_block, storage="f32").lower(w, x).compile()
  assert _library_fusion_ops(f32.as_text()) - {"dot", "parameter"}
  # Inside the user's jit (no compiler options there) it runs all the same.
  np.testing.assert_allclose(
      jax.jit(amp.transform(_softmax_block))(w, x),
      amp.transform(_softmax_block)(w, x), rtol=1e-6)


_STORED_EXP = """
func.func public @main(%x: tensor<64x64xf32>, %w1: tensor<64x128xf32>, %w2: tensor<64x128xf32>) -> tensor<64x128xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %1 = stablehlo.exponential %0 : tensor<64x128xf32>
  %2 = stablehlo.dot_general %x, %w2, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
  %3 = stablehlo.multiply %1, %2 : tensor<64x128xf32>
  return %3 : tensor<64x128xf32>
}
"""


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_report_counts_a_stored_value_once_in_its_stored_dtype(target):
  """exp(x @ w1), read across the second dot, is stored in bf16: against
  storage=f32 the report's bytes lose its f32 copy and gain its bf16 copy,
  and its f32 read-back (fused into the reader) is not counted."""
  stored = amp.rewrite_module(_STORED_EXP, "p=f32,c=bf16,o=f32",
                              target=target).report
  kept_f32 = amp.rewrite_module(_STORED_EXP, "p=f32,c=bf16,o=f32",
                                target=target, storage="f32").report
  assert stored.stored_low, "the exp was not stored low"
  elements = 64 * 128
  assert kept_f32.bytes_after["f32"] - stored.bytes_after["f32"] == 4 * elements
  assert stored.bytes_after["bf16"] - kept_f32.bytes_after["bf16"] == 2 * elements
  assert stored.bytes_before == kept_f32.bytes_before


def test_report_says_what_was_lowered_and_kept():
  low = amp.transform(mlp, "p=f32,c=bf16,o=f32", level="O2").lower(PARAMS, X)
  report = low.report()
  assert isinstance(report, amp.Report)
  assert report.policy == "p=f32,c=bf16,o=f32"
  assert report.level == "O2"
  # The target defaults to the backend JAX runs on.
  backend = jax.default_backend()
  assert report.target == ("gpu" if backend in ("gpu", "cuda", "rocm")
                           else backend)
  assert report.lowered["stablehlo.dot_general"] == 2
  assert report.lowered["stablehlo.tanh"] == 1
  # Softmax's exponential and sum reduction stay f32.
  assert report.kept_f32["stablehlo.exponential"] == 1
  assert "stablehlo.exponential" not in report.lowered
  assert all(isinstance(d, amp.OpDecision) for d in report.decisions)
  assert {d.precision for d in report.decisions} == {"low", "f32"}
  assert all(d.reason for d in report.decisions)
  assert sum(report.lowered.values()) + sum(report.kept_f32.values()) == len(
      report.decisions)
  text = low.as_text()
  assert report.converts_total == text.count("stablehlo.convert")
  assert 0 < report.converts_inserted <= report.converts_total
  summary = str(report)
  assert summary.splitlines()[0] == (
      "amp-insert-converts: policy p=f32,c=bf16,o=f32, level O2, target cpu")
  assert f"lowered to bf16: {sum(report.lowered.values())} ops" in summary
  assert "dot_general 2" in summary
  followers = sum(n for op, n in report.kept_f32.items()
                  if op in ("stablehlo.broadcast_in_dim", "stablehlo.constant",
                            "stablehlo.iota"))
  assert f"kept f32: {sum(report.kept_f32.values()) - followers} ops" in summary
  as_dict = report.to_dict()
  assert as_dict["lowered"]["stablehlo.dot_general"] == 2
  assert as_dict["target"] == "cpu"
  assert as_dict["converts_total"] == report.converts_total


def test_report_names_an_explicit_target():
  report = amp.transform(tanh_dot, target="gpu").lower(W, X).report()
  assert report.target == "gpu"
  assert report.lowered["stablehlo.dot_general"] == 1


@pytest.mark.parametrize("policy_text, out_bytes", [
    ("p=f32,c=bf16,o=f32", 4 * 16 * 4), ("p=f32,c=bf16,o=bf16", 4 * 16 * 2)])
def test_compile_gives_the_rewritten_executable(policy_text, out_bytes):
  fast = amp.transform(tanh_dot, policy_text)
  compiled = fast.lower(W, X).compile()
  stats = compiled.memory_analysis()
  assert stats is not None
  assert stats.argument_size_in_bytes == W.nbytes + X.nbytes
  assert stats.output_size_in_bytes == out_bytes
  np.testing.assert_array_equal(compiled(W, X), fast(W, X))


# -- composition --------------------------------------------------------------------


def test_callable_inside_jax_jit():
  fast = amp.transform(mlp, "p=f32,c=bf16,o=bf16")
  outer = jax.jit(lambda params, x: fast(params, x).sum(-1) * 2)
  got = outer(PARAMS, X)
  assert got.dtype == BF16
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             mlp(PARAMS, X).sum(-1) * 2, **TOLERANCE[BF16])
  outer(PARAMS, X)
  assert fast.rewrite_count == 1


def test_vmap_runs_a_rewritten_batched_program():
  fast = amp.transform(tanh_dot)
  xs = jnp.stack([X, 2 * X, -X])
  batched = jax.vmap(fast, in_axes=(None, 0))
  got = batched(W, xs)
  assert got.shape == (3, 4, 16) and got.dtype == F32
  np.testing.assert_allclose(got, jax.vmap(tanh_dot, in_axes=(None, 0))(
      W, xs), **TOLERANCE[BF16])
  # The batched program is rewritten too: its dot is bf16.
  text = jax.jit(batched).lower(W, xs).as_text()
  assert _op_result_types(text, "stablehlo.convert").count("bf16") >= 2
  assert any("stablehlo.dot_general" in line and "xbf16>" in line
             for line in text.splitlines())


# -- errors and fallback ----------------------------------------------------------


def test_bad_policy_raises_value_error():
  with pytest.raises(ValueError, match="int8"):
    amp.transform(tanh_dot, "p=f32,c=int8")
  with pytest.raises(ValueError, match="accepted"):
    amp.transform(tanh_dot, "x=bf16")


def test_bad_level_raises_value_error():
  with pytest.raises(ValueError, match="O7.*O0, O1, O2, O3"):
    amp.transform(tanh_dot, level="O7")


def test_bad_target_raises_value_error():
  with pytest.raises(ValueError, match="'bogus'.*cpu, gpu, tpu"):
    # Checked when the transform is built or at the latest on the first call.
    amp.transform(tanh_dot, target="bogus")(W, X)


def test_non_callable_raises_type_error():
  with pytest.raises(TypeError, match="callable"):
    amp.transform(3)


def test_unsupported_module_falls_back_with_a_warning(monkeypatch):
  """When the pipeline rejects a module, the original program runs."""

  def reject(*args, **kwargs):
    raise amp.RewriteError("error: unsupported op 'stablehlo.fancy'")

  monkeypatch.setattr(amp_pipeline, "rewrite_module", reject)
  fast = amp.transform(mlp)
  with pytest.warns(UserWarning, match=r"mlp.*unsupported op "
                    r"'stablehlo\.fancy'.*original"):
    got = fast(PARAMS, X)
  np.testing.assert_array_equal(got, jax.jit(mlp)(PARAMS, X))
  low = fast.lower(PARAMS, X)
  assert low.report() is None
  assert "stablehlo.convert" not in low.as_text()
  assert "bf16" not in low.as_text()


def test_host_callbacks_run_inside_the_rewritten_program(capfd):
  def noisy(w, x):
    jax.debug.print("sum {}", x.sum())
    return jnp.tanh(x @ w)

  fast = amp.transform(noisy)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = fast(W, X)
    jax.effects_barrier()
  assert f"sum {float(X.sum())}" in capfd.readouterr().out
  np.testing.assert_allclose(got, jax.jit(noisy)(W, X), **TOLERANCE[BF16])
  report = fast.lower(W, X).report()
  assert report is not None and report.lowered["stablehlo.dot_general"] == 1
  # Inside an outer jit, and twice in one program: each callback keeps its
  # own Python function.
  twice = jax.jit(lambda w, x: fast(w, x) + amp.transform(
      lambda w, x: (jax.debug.print("max {}", x.max()), x @ w)[1])(w, x))
  twice(W, X)
  jax.effects_barrier()
  out = capfd.readouterr().out
  assert f"sum {float(X.sum())}" in out and f"max {float(X.max())}" in out


def test_ordered_host_callbacks_fall_back_with_a_warning():
  def noisy(w, x):
    jax.debug.print("sum {}", x.sum(), ordered=True)
    return jnp.tanh(x @ w)

  fast = amp.transform(noisy)
  with pytest.warns(UserWarning, match=r"noisy .*ordered effect, such as "
                    r"jax.debug.print\(\.\.\., ordered=True\)"):
    got = fast(W, X)
  np.testing.assert_allclose(got, jax.jit(noisy)(W, X), **TOLERANCE[BF16])


def _corrupt_tanh_results(monkeypatch):
  """Makes the pipeline return a module whose tanh has an f32 operand and a
  bf16 result, which jaxlib's verifier rejects."""
  real = amp_pipeline._amp.run_pipeline

  def run_pipeline(generic, pipeline, source_name, report):
    ok, output, report_json, diagnostics = real(generic, pipeline,
                                                source_name, report)
    with amp_pipeline.ir_context(), ir.Location.unknown():
      module = ir.Module.parse(output)
      for op in walk(module.operation):
        if op.name == "stablehlo.tanh":
          shape = ir.RankedTensorType(op.result.type).shape
          op.result.set_type(ir.RankedTensorType.get(shape, ir.BF16Type.get()))
      output = module.operation.get_asm(print_generic_op_form=True,
                                        enable_debug_info=True,
                                        assume_verified=True)
    return ok, output, report_json, diagnostics

  monkeypatch.setattr(amp_pipeline._amp, "run_pipeline", run_pipeline)


def _check_verification_error(error: amp.VerificationError):
  message = str(error)
  assert isinstance(error, amp.AmpError)
  assert "'stablehlo.tanh'" in message  # the op
  assert re.search(r'test_transform\.py":\d+:\d+', message), message  # where
  assert "amp-insert-converts{" in message  # the pipeline
  assert "amp-simplify-converts" in message
  assert error.diagnostics


def test_verification_failure_raises_from_transform(monkeypatch):
  _corrupt_tanh_results(monkeypatch)
  fast = amp.transform(tanh_dot)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # raises: no fallback
    with pytest.raises(amp.VerificationError) as error:
      fast(W, X)
  _check_verification_error(error.value)


def test_verification_failure_raises_from_rewrite(monkeypatch):
  text = jax_compat.lowered_text(jax.jit(tanh_dot).lower(W, X), True)
  _corrupt_tanh_results(monkeypatch)
  with pytest.raises(amp.VerificationError) as error:
    amp.rewrite(text)
  _check_verification_error(error.value)


# -- amp.rewrite -------------------------------------------------------------------


@pytest.mark.parametrize("form", ["pretty", "generic"])
@pytest.mark.parametrize("policy_text, inputs, results", [
    ("p=f32,c=bf16,o=f32", ["f32", "f32"], ["f32"]),
    ("p=bf16,c=bf16,o=f32", ["bf16", "bf16"], ["f32"]),
    ("p=f32,c=f16,o=f16", ["f32", "f32"], ["f16"]),
])
def test_rewrite_returns_verified_text(form, policy_text, inputs, results):
  lowered = jax.jit(tanh_dot).lower(W, X)
  text = lowered.as_text()
  if form == "generic":
    with amp_pipeline.ir_context() as context:
      text = ir.Module.parse(text, context).operation.get_asm(
          print_generic_op_form=True)
  out = amp.rewrite(text, policy_text)
  assert isinstance(out, str)
  _parse_verified(out)
  assert _main_types(out) == (inputs, results)
  compute = str(amp.Policy.parse(policy_text)).split(",")[1][2:]
  assert re.search(rf"stablehlo\.dot_general .*x{compute}>, tensor<[0-9x]+"
                   rf"x{compute}>\) ->", out), out
  # No analysis or report annotation (amp.decision, amp.inserted, ...) is
  # left behind in the returned module.
  assert not _AMP_ATTRIBUTE.search(out), out


# An `amp.` attribute in an attribute dictionary: with a value
# (`amp.decision = "..."`) or a unit attribute, which MLIR prints by its
# name alone (`{amp.inserted}`).
_AMP_ATTRIBUTE = re.compile(r"[{,]\s*amp\.[a-z_]+\s*(?:=|,|\})")


@pytest.mark.parametrize("text, found", [
    ('%1 = stablehlo.convert %0 {amp.inserted} : (tensor<2xf32>)', True),
    ('"stablehlo.convert"(%0) {amp.inserted} : (tensor<2xf32>)', True),
    ('%1 = stablehlo.tanh %0 {amp.decision = "f32", amp.inserted}', True),
    ('%1 = stablehlo.tanh %0 {mhlo.frontend_attributes = {x = "1"}, '
     'amp.stored = 3 : i64}', True),
    ('%arg0: tensor<f32> {amp.loss_seed}', True),
    ('%1 = stablehlo.tanh %0 {mhlo.frontend_attributes = {amp_stored = '
     '"3"}} loc("tanh[amp_stored=3]")', False),
    ('stablehlo.custom_call @amp.gradient(%0)', False),
])
def test_the_annotation_check_sees_unit_attributes(text, found):
  """The check above sees every form an annotation prints in, a unit
  attribute's included; the survival markers (XLA frontend attributes
  such as `amp_stored`, which the returned module keeps for XLA, and the
  tags in op names) and custom-call targets are no annotation."""
  assert bool(_AMP_ATTRIBUTE.search(text)) == found


def test_rewrite_accepts_options():
  text = jax.jit(_two_layers).lower(W, X).as_text()
  out = amp.rewrite(text, "p=f32,c=bf16,o=f32", keep_f32=["tanh"],
                    force_compute=["exponential"], level="O2", target="tpu")
  assert _op_result_types(out, "stablehlo.tanh") == ["f32"]
  assert _op_result_types(out, "stablehlo.exponential") == ["bf16"]
  assert "stablehlo.convert" not in amp.rewrite(text, level="O0")


def test_rewrite_bad_policy_and_target_raise_value_error():
  text = jax.jit(tanh_dot).lower(W, X).as_text()
  with pytest.raises(ValueError, match="'nope'.*accepted"):
    amp.rewrite(text, "p=f32,c=nope")
  with pytest.raises(ValueError, match="'bogus'.*cpu, gpu, tpu"):
    amp.rewrite(text, target="bogus")


_BAD_MODULES = {
    "syntax": ("module {\n  func.func @main(%a: tensor<2xf32>) -> "
               "tensor<2xf32> {\n    %0 = stablehlo.add %a, %a : \n"
               "    return %0 : tensor<2xf32>\n  }\n}\n", 3),
    "types": ("module {\n  func.func @main(%a: tensor<2xf32>) -> "
              "tensor<2xf32> {\n    %0 = stablehlo.add %a, %a : tensor<3xf32>"
              "\n    return %0 : tensor<2xf32>\n  }\n}\n", 3),
    "verifier": ("module {\n  func.func @main(%a: tensor<2xf32>) -> "
                 "tensor<2xf32> {\n    %0 = stablehlo.tanh %a : "
                 "(tensor<2xf32>) -> tensor<2xbf16>\n"
                 "    return %a : tensor<2xf32>\n  }\n}\n", 3),
    "unknown op": ("module {\n  func.func @main(%a: tensor<2xf32>) -> "
                   "tensor<2xf32> {\n    %0 = stablehlo.frobnicate %a : "
                   "tensor<2xf32>\n    return %0 : tensor<2xf32>\n  }\n}\n",
                   3),
    "garbage": ("this is not mlir", 1),
}


@pytest.mark.parametrize("name", _BAD_MODULES)
def test_rewrite_of_invalid_text_raises_invalid_ir_error(name):
  text, line = _BAD_MODULES[name]
  with pytest.raises(amp.InvalidIRError) as error:
    amp.rewrite(text)
  message = str(error.value)
  assert re.match(rf"^[^\s:]+:{line}:\d+: error: \S", message), message
  assert isinstance(error.value, amp.AmpError)
  assert error.value.diagnostics


def test_rewrite_of_empty_text_raises_invalid_ir_error():
  with pytest.raises(amp.InvalidIRError, match="empty"):
    amp.rewrite("  \n")


def test_typed_prng_keys_pass_through():
  """`jax.random.key` arrays (dtype key<fry>) go in and come out as keys,
  under jit and grad too; the rest of the function is rewritten."""
  def noisy(w, x, key):
    key, sub = jax.random.split(key)
    return jnp.tanh(x @ w) + 0.01 * jax.random.normal(sub, (X.shape[0],
                                                            W.shape[1])), key

  fast = amp.transform(noisy)
  key = jax.random.key(3)
  got, new_key = fast(W, X, key)
  want, want_key = jax.jit(noisy)(W, X, key)
  assert jax.dtypes.issubdtype(new_key.dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(new_key),
                                jax.random.key_data(want_key))
  np.testing.assert_allclose(got, want, **TOLERANCE[BF16])
  assert fast.lower(W, X, key).report().lowered["stablehlo.dot_general"] == 1
  grads = jax.grad(lambda w: fast(w, X, key)[0].sum())(W)
  assert grads.shape == W.shape
  assert jax.jit(fast)(W, X, key)[1].dtype == key.dtype


def test_a_flax_nnx_module_with_rngs_is_an_argument():
  nnx = pytest.importorskip("flax.nnx")

  class Model(nnx.Module):
    def __init__(self, rngs):
      self.linear = nnx.Linear(X.shape[1], 16, rngs=rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
      return self.dropout(jax.nn.relu(self.linear(x)))

  model = Model(nnx.Rngs(0, dropout=1))
  model.eval()
  fast = amp.transform(lambda m, x: m(x))
  got = fast(model, X)
  np.testing.assert_allclose(got, jax.jit(lambda m, x: m(x))(model, X),
                             **TOLERANCE[BF16])
  assert fast.lower(model, X).report().lowered["stablehlo.dot_general"] == 1


def test_params_that_name_nothing_say_what_they_must_be():
  with pytest.raises(TypeError, match=r"params must be an argument position "
                     r"\(int\), name \(str\) or a sequence of them, got 1.5 "
                     r"\(float\)"):
    amp.transform(mlp, params=1.5)
