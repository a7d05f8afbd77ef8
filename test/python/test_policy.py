"""Tests for `amp.Policy`: the `p=...,c=...,o=...` grammar and pytree casts."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stablehlo_amp as amp

F32, BF16, F16, F64 = (np.dtype(jnp.float32), np.dtype(jnp.bfloat16),
                       np.dtype(jnp.float16), np.dtype(jnp.float64))
F8E4M3FN, F8E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)

# Every accepted spelling of every dtype, with the dtype it names.
DTYPE_SPELLINGS = [
    ("f32", F32), ("float32", F32), ("full", F32),
    ("bf16", BF16), ("bfloat16", BF16),
    ("f16", F16), ("float16", F16), ("half", F16),
    ("f64", F64), ("float64", F64),
]
# FP8 names a GEMM operand format (`gemm=`), never a param/compute/output
# dtype.
FP8_SPELLINGS = ["f8e4m3fn", "float8_e4m3fn", "f8e5m2", "float8_e5m2"]
GEMM_SPELLINGS = [("compute", "compute"), ("f8", "f8"), ("fp8", "f8"),
                  ("f8e4m3fn", "f8e4m3fn"), ("float8_e4m3fn", "f8e4m3fn"),
                  ("f8e5m2", "f8e5m2"), ("float8_e5m2", "f8e5m2")]
CANONICAL = {F32: "f32", BF16: "bf16", F16: "f16", F64: "f64",
             F8E4M3FN: "f8e4m3fn", F8E5M2: "f8e5m2"}
PARAM_KEYS = ("p", "params", "param")
COMPUTE_KEYS = ("c", "compute")
OUTPUT_KEYS = ("o", "output")


def _dtypes(policy: amp.Policy) -> tuple:
  return policy.param_dtype, policy.compute_dtype, policy.output_dtype


# -- parsing -------------------------------------------------------------------


@pytest.mark.parametrize("spelling, dtype", DTYPE_SPELLINGS)
@pytest.mark.parametrize("key_index", range(3), ids=["param", "compute",
                                                     "output"])
def test_parse_every_dtype_spelling_in_every_slot(spelling, dtype, key_index):
  # The other two slots are given explicitly so no cascading is involved.
  values = ["f32", "f32", "f32"]
  values[key_index] = spelling
  policy = amp.Policy.parse(f"p={values[0]},c={values[1]},o={values[2]}")
  expected = [F32, F32, F32]
  expected[key_index] = dtype
  assert _dtypes(policy) == tuple(expected)
  assert all(isinstance(d, np.dtype) for d in _dtypes(policy))


@pytest.mark.parametrize("p_key", PARAM_KEYS)
@pytest.mark.parametrize("c_key", COMPUTE_KEYS)
@pytest.mark.parametrize("o_key", OUTPUT_KEYS)
def test_parse_every_key_spelling(p_key, c_key, o_key):
  policy = amp.Policy.parse(f"{p_key}=f16,{c_key}=bf16,{o_key}=f64")
  assert _dtypes(policy) == (F16, BF16, F64)


def test_parse_key_order_does_not_matter():
  assert (amp.Policy.parse("o=f16,c=bf16,p=f64") ==
          amp.Policy.parse("p=f64,c=bf16,o=f16"))


def test_parse_tolerates_spaces_around_entries():
  assert _dtypes(amp.Policy.parse(" p = f32 , c = bf16 , o = f32 ")) == (
      F32, BF16, F32)


@pytest.mark.parametrize("text, expected", [
    ("p=f32", (F32, F32, F32)),
    ("p=bf16", (BF16, BF16, BF16)),
    ("p=f16", (F16, F16, F16)),
    ("c=bf16", (F32, BF16, BF16)),  # params default to f32
    ("o=f16", (F32, F32, F16)),
    ("p=f32,c=bf16", (F32, BF16, BF16)),  # output follows compute
    ("p=bf16,o=f32", (BF16, BF16, F32)),  # compute follows params
    ("p=f64,c=f16", (F64, F16, F16)),
    ("params=float32,compute=half", (F32, F16, F16)),
    ("p=f32,c=bf16,o=f32", (F32, BF16, F32)),
])
def test_parse_cascading_defaults(text, expected):
  assert _dtypes(amp.Policy.parse(text)) == expected


# -- printing ------------------------------------------------------------------


@pytest.mark.parametrize("spelling, dtype", DTYPE_SPELLINGS)
def test_str_prints_canonical_names(spelling, dtype):
  name = CANONICAL[dtype]
  assert str(amp.Policy.parse(f"p=f32,c={spelling},o=f32")) == (
      f"p=f32,c={name},o=f32")
  # Cascaded fields are printed explicitly.
  assert str(amp.Policy.parse(f"p={spelling}")) == f"p={name},c={name},o={name}"


@pytest.mark.parametrize("text", [
    "p=f32,c=bf16,o=f32", "p=bf16", "c=bf16", "o=f16", "p=f32,c=f16",
    "params=float32,compute=bfloat16,output=half", "param=full",
    "p=f64,c=f32,o=f64", "p=f32,c=bf16,o=f32,gemm=f8",
    "p=f32,c=bf16,gemm=float8_e5m2", "gemm=f8e4m3fn,c=f16",
])
def test_str_round_trips(text):
  policy = amp.Policy.parse(text)
  again = amp.Policy.parse(str(policy))
  assert again == policy
  assert str(again) == str(policy)
  assert re.fullmatch(r"p=\w+,c=\w+,o=\w+(,gemm=\w+)?", str(policy))


@pytest.mark.parametrize("spelling, canonical", GEMM_SPELLINGS)
def test_gemm_key_takes_every_gemm_spelling(spelling, canonical):
  policy = amp.Policy.parse(f"p=f32,c=bf16,o=f32,gemm={spelling}")
  assert policy.gemm == canonical
  expected = "p=f32,c=bf16,o=f32" + (
      "" if canonical == "compute" else f",gemm={canonical}")
  assert str(policy) == expected


@pytest.mark.parametrize("spelling", FP8_SPELLINGS)
@pytest.mark.parametrize("key", ["p", "c", "o"])
def test_fp8_as_a_param_compute_or_output_dtype_points_to_the_gemm_key(
    spelling, key):
  with pytest.raises(ValueError) as info:
    amp.Policy.parse(f"{key}={spelling}")
  message = str(info.value)
  assert f"FP8 dtype '{spelling}' cannot be the" in message
  assert "gemm=f8" in message


def test_gemm_key_rejects_a_dtype_that_is_not_a_gemm_format():
  with pytest.raises(ValueError, match=r"unknown GEMM operand dtype 'bf16' "
                     r"for key 'gemm' \(accepted: compute, f8, fp8, "):
    amp.Policy.parse("c=bf16,gemm=bf16")


def test_str_of_constructed_policy_round_trips():
  policy = amp.Policy(jnp.float32, jnp.bfloat16, jnp.float32)
  assert str(policy) == "p=f32,c=bf16,o=f32"
  assert amp.Policy.parse(str(policy)) == policy


def test_parse_accepts_a_policy():
  policy = amp.Policy.parse("p=f32,c=bf16")
  assert amp.Policy.parse(policy) is policy


def test_same_grammar_as_amp_opt(tmp_path, capsys):
  """`amp-opt --policy` parses and prints the policy exactly as Python."""
  from stablehlo_amp._src import cli
  text = jax.jit(lambda w, x: x @ w).lower(jnp.ones((8, 8)),
                                           jnp.ones((4, 8))).as_text()
  path = tmp_path / "in.mlir"
  path.write_text(text)
  for spelling in ["params=float32,compute=half", "p=bf16", "c=bfloat16"]:
    capsys.readouterr()
    assert cli.main([str(path), "--policy", spelling, "--report",
                     "-o", str(tmp_path / "out.mlir")]) == 0
    report = capsys.readouterr().err
    assert f"policy {amp.Policy.parse(spelling)}," in report
  # A bad policy is rejected by amp-opt with the message Python raises.
  with pytest.raises(ValueError) as python_error:
    amp.Policy.parse("p=f32,c=int8")
  assert cli.main([str(path), "--policy", "p=f32,c=int8"]) == 2
  assert str(python_error.value) in capsys.readouterr().err


# -- errors --------------------------------------------------------------------


@pytest.mark.parametrize("text, key", [
    ("x=f32", "x"), ("p=f32,q=bf16", "q"), ("precision=bf16", "precision"),
    ("p=f32,c=bf16,out=f32", "out"),
])
def test_unknown_key_names_it_and_lists_accepted_keys(text, key):
  with pytest.raises(ValueError) as error:
    amp.Policy.parse(text)
  message = str(error.value)
  assert f"'{key}'" in message
  for accepted in ("p", "params", "c", "compute", "o", "output"):
    assert re.search(rf"\b{accepted}\b", message.split("accepted", 1)[-1]), (
        accepted, message)


def test_unknown_key_lists_every_accepted_key_spelling():
  with pytest.raises(ValueError) as error:
    amp.Policy.parse("x=f32")
  accepted = str(error.value).split("accepted", 1)[-1]
  for key in PARAM_KEYS + COMPUTE_KEYS + OUTPUT_KEYS:
    assert re.search(rf"\b{key}\b", accepted), (key, str(error.value))


@pytest.mark.parametrize("text, key, value", [
    ("p=int8", "p", "int8"), ("c=fp32", "c", "fp32"),
    ("p=f32,c=bf16,o=f128", "o", "f128"), ("compute=bool", "compute", "bool"),
    ("p=f32,c=float", "c", "float"),
])
def test_unknown_dtype_names_it_and_lists_accepted_dtypes(text, key, value):
  with pytest.raises(ValueError) as error:
    amp.Policy.parse(text)
  message = str(error.value)
  assert f"'{value}'" in message
  assert f"'{key}'" in message
  accepted = message.split("accepted", 1)[-1]
  for spelling, _ in DTYPE_SPELLINGS:
    assert re.search(rf"\b{spelling}\b", accepted), (spelling, message)


@pytest.mark.parametrize("text, key", [
    ("p=f32,p=bf16", "p"),
    ("p=f32,params=bf16", "params"),  # two spellings of the same key
    ("c=bf16,compute=bf16", "compute"),  # even with the same value
    ("p=f32,c=bf16,o=f32,o=f32", "o"),
])
def test_duplicate_key_is_an_error(text, key):
  with pytest.raises(ValueError, match=rf"'{key}'.*twice"):
    amp.Policy.parse(text)


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_policy_is_an_error(text):
  with pytest.raises(ValueError, match="empty policy") as error:
    amp.Policy.parse(text)
  # The message says what a policy looks like.
  assert "p=" in str(error.value) and "c=" in str(error.value)


@pytest.mark.parametrize("text", ["p", "p=", "=bf16", "p=f32,,c=bf16",
                                  "p=f32,c=bf16,", "p:f32", "p=f32;c=bf16"])
def test_malformed_entry_is_an_error(text):
  with pytest.raises(ValueError):
    amp.Policy.parse(text)


@pytest.mark.parametrize("value", [None, 3, jnp.float32, ("p", "f32")])
def test_parse_rejects_non_strings(value):
  with pytest.raises(TypeError, match=type(value).__name__):
    amp.Policy.parse(value)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.complex64,
                                   jnp.uint8])
def test_constructor_rejects_dtypes_without_a_policy_name(dtype):
  with pytest.raises(ValueError, match=np.dtype(dtype).name) as error:
    amp.Policy(jnp.float32, dtype, jnp.float32)
  assert "bf16" in str(error.value) and "f32" in str(error.value)


# -- the dataclass -------------------------------------------------------------


def test_policy_is_a_frozen_dataclass():
  policy = amp.Policy.parse("p=f32,c=bf16,o=f32")
  assert dataclasses.is_dataclass(policy)
  assert [f.name for f in dataclasses.fields(policy)] == [
      "param_dtype", "compute_dtype", "output_dtype", "gemm"]
  with pytest.raises(dataclasses.FrozenInstanceError):
    policy.compute_dtype = F16  # type: ignore[misc]
  with pytest.raises(dataclasses.FrozenInstanceError):
    del policy.param_dtype  # type: ignore[misc]
  assert policy.compute_dtype == BF16


def test_policy_equality_and_hash_follow_the_dtypes():
  a = amp.Policy.parse("p=f32,c=bf16,o=f32")
  b = amp.Policy.parse("params=float32,compute=bfloat16,output=full")
  c = amp.Policy(jnp.float32, jnp.bfloat16, jnp.float32)
  assert a == b == c
  assert len({a, b, c}) == 1
  assert a != amp.Policy.parse("p=f32,c=f16,o=f32")


def test_constructor_normalises_dtypes():
  policy = amp.Policy("float32", jnp.bfloat16, np.float16)
  assert _dtypes(policy) == (F32, BF16, F16)
  assert all(isinstance(d, np.dtype) for d in _dtypes(policy))


# -- casts on pytrees ----------------------------------------------------------


def _tree():
  return {
      "w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7,
      "half": jnp.ones((3,), jnp.float16) / 3,
      "np": np.linspace(0, 1, 4, dtype=np.float32),
      "ids": jnp.arange(5, dtype=jnp.int32),
      "count": np.int64(3),
      "mask": jnp.array([True, False]),
      "flag": True,
      "scale": 2.5,  # a Python float has no dtype: left as it is
      "nested": [np.zeros((2,), np.float64), (jnp.uint8(7), None)],
  }


CASTS = [("cast_to_param", "p=f16,c=bf16,o=f32", F16),
         ("cast_to_compute", "p=f16,c=bf16,o=f32", BF16),
         ("cast_to_output", "p=f16,c=bf16,o=f32", F32)]


@pytest.mark.parametrize("method, text, dtype", CASTS)
def test_cast_changes_only_float_leaves(method, text, dtype):
  tree = _tree()
  cast = getattr(amp.Policy.parse(text), method)(tree)
  assert jax.tree_util.tree_structure(cast) == jax.tree_util.tree_structure(
      tree)
  for path, before in jax.tree_util.tree_leaves_with_path(tree):
    after = _leaf(cast, path)
    is_float_array = (hasattr(before, "dtype") and
                      jnp.issubdtype(before.dtype, jnp.floating))
    if is_float_array:
      assert after.dtype == dtype, path
      np.testing.assert_allclose(np.asarray(after, np.float64),
                                 np.asarray(before, np.float64),
                                 rtol=1e-2, atol=1e-3)
    else:
      # Integer, bool and non-array leaves pass through untouched.
      assert after is before or (type(after) is type(before) and
                                 np.array_equal(after, before)), path
      if hasattr(before, "dtype"):
        assert after.dtype == before.dtype, path


def _leaf(tree, path):
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      tree = tree[key.key]
    else:
      tree = tree[key.idx]
  return tree


@pytest.mark.parametrize("method, text, dtype", CASTS)
def test_cast_of_int_leaves_is_bit_identical(method, text, dtype):
  ids = jnp.array([0, 1, 2**31 - 1, -5], jnp.int32)
  mask = jnp.array([True, False, True])
  out = getattr(amp.Policy.parse(text), method)((ids, mask))
  assert out[0].dtype == jnp.int32 and out[1].dtype == jnp.bool_
  np.testing.assert_array_equal(out[0], ids)
  np.testing.assert_array_equal(out[1], mask)


def test_casts_work_under_jit():
  policy = amp.Policy.parse("p=f32,c=bf16,o=f16")
  tree = {"x": jnp.ones((2, 2)), "i": jnp.arange(2)}
  out = jax.jit(policy.cast_to_compute)(tree)
  assert out["x"].dtype == BF16 and out["i"].dtype == tree["i"].dtype
  out = jax.jit(policy.cast_to_output)(tree)
  assert out["x"].dtype == F16


@pytest.mark.parametrize("text", ["p=f32,c=f32,o=f32,gemm=f8",
                                  "p=f32,gemm=f8e4m3fn", "p=f64,gemm=f8"])
def test_fp8_gemms_need_a_low_precision_compute_dtype(text):
  with pytest.raises(ValueError, match=r"gemm=f8\S* needs a low-precision "
                     r"compute dtype \(c=bf16 or c=f16.*no matrix multiply "
                     r"is lowered"):
    amp.Policy.parse(text)
