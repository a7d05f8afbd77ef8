"""Finer FP8 scaling (`fp8_scaling="rowwise"`, `"mxfp8"`) and FP8 only where
it pays (`fp8_min_size`).

XLA:CPU runs the FP8 GEMMs upcast, so the numerics are checked against NumPy
references of the same quantization: MXFP8's codes and scales bit for bit
(a product with the identity returns the dequantized operand exactly), the
rowwise form op for op. On CPU the GEMM's operands are the bf16 values of
the precision rewrite (XLA:CPU's dot layout reads them through a barrier),
so the references quantize x rounded to bf16.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from bench import fp8 as fp8_bench
from stablehlo_amp._src import jax_compat

F8 = "p=f32,c=bf16,o=f32,gemm=f8"
BF16 = "p=f32,c=bf16,o=f32"
E4M3 = ml_dtypes.float8_e4m3fn


def bf16(x: np.ndarray) -> np.ndarray:
  return x.astype(ml_dtypes.bfloat16).astype(np.float32)
FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def mx_quantize(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
  """MXFP8 of `x` in blocks of 32 along `axis`: (E4M3 codes, f32 power-of-two
  scales), each block's scale the smallest power of two that keeps its amax
  within 448, from 2^-126 (f32's least normal) to 2^127."""
  moved = np.moveaxis(x.astype(np.float32), axis, -1)
  blocks = moved.reshape(moved.shape[:-1] + (moved.shape[-1] // 32, 32))
  amax = np.abs(blocks).max(-1)
  bits = amax.view(np.int32)
  exponent = (bits >> 23) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000)
  exponent = np.clip(exponent, -126, 127)
  scale = np.ldexp(np.float32(1), exponent).astype(np.float32)
  codes = np.clip(blocks / scale[..., None], -448, 448).astype(E4M3)
  return codes, scale


def mx_dequantize(codes: np.ndarray, scale: np.ndarray,
                  axis: int) -> np.ndarray:
  blocks = codes.astype(np.float32) * scale[..., None]
  moved = blocks.reshape(blocks.shape[:-2] + (-1,))
  return np.moveaxis(moved, -1, axis)


def _outliers(seed: int, m: int = 256, k: int = 1024, n: int = 256):
  """Activations with outlier rows (2 rows 3000x the rest) and channels (8
  channels 30x), as in LLMs, a weight N(0, 1/k), and which rows are
  ordinary: bench/fp8.py's GEMM (seed 0 is the issue's NumPy emulation:
  per-tensor 0.085, rowwise 0.033, MXFP8 0.037)."""
  x, w, _, ordinary = fp8_bench.outlier_data(seed, m, k, n)
  return x, w, ordinary


@pytest.fixture(params=["composite", "dequantize"])
def mx_form(request, monkeypatch):
  """Both forms of an MXFP8 GEMM: the composite (target gpu, where this JAX
  has jax.lax.scaled_dot; XLA:CPU runs its decomposition) and the
  dequantized dot every JAX and target runs."""
  if (request.param == "composite" and
      jax_compat.mx_form("gpu") != "composite"):
    pytest.skip("this JAX has no jax.lax.scaled_dot")
  monkeypatch.setattr(jax_compat, "mx_form", lambda target: request.param)
  return request.param


def test_mxfp8_codes_and_scales_match_numpy_bit_for_bit(mx_form):
  x = _outliers(0, 64, 256)[0]
  x[5, :32] = 0.0                      # an all-zero block: the least scale
  x[6, 32:64] *= 1e-30                 # a block of tiny values
  eye = np.eye(x.shape[1], dtype=np.float32)
  mx = amp.transform(lambda a, b: a @ b, F8, fp8_scaling="mxfp8")
  # The identity quantizes exactly (1 = 256 * 2^-8), so x @ I is x's
  # dequantized MXFP8 codes, summed exactly.
  got = np.asarray(mx(x, eye))
  codes, scale = mx_quantize(bf16(x), axis=1)
  np.testing.assert_array_equal(got, mx_dequantize(codes, scale, axis=1))
  # The rhs blocks along its own contraction (its rows).
  w = _outliers(1, 64, 256)[0].T
  got = np.asarray(mx(np.eye(256, dtype=np.float32), w))
  codes, scale = mx_quantize(bf16(w), axis=0)
  np.testing.assert_array_equal(got, mx_dequantize(codes, scale, axis=0))


def test_mxfp8_scales_are_rounded_up_powers_of_two():
  x = np.full((1, 32), 448.0, np.float32)
  x[0, 0] = 449.0    # just above 448 * 2^0: the scale rounds up to 2
  codes, scale = mx_quantize(x, axis=1)
  assert scale.item() == 2.0
  x[0, 0] = 448.0    # exactly 448: scale 1, no rounding
  assert mx_quantize(x, axis=1)[1].item() == 1.0


def test_rowwise_matches_numpy_op_for_op():
  x = _outliers(2, 64, 256)[0]
  eye = np.eye(x.shape[1], dtype=np.float32)
  rows = amp.transform(lambda a, b: a @ b, F8, fp8_scaling="rowwise")
  got = np.asarray(rows(x, eye))
  x = bf16(x)
  # The scale: amax / 448 (XLA multiplies by the f32 reciprocal of the
  # constant 448), at least FLT_MIN.
  scale = np.maximum(np.abs(x).max(1) * (np.float32(1) / np.float32(448)),
                     FLT_MIN)
  codes = np.clip(x / scale[:, None], -448, 448).astype(E4M3)
  # The identity's columns: amax 1, codes 448, scale 1/448.
  eye_scale = np.float32(1) * (np.float32(1) / np.float32(448))
  product = codes.astype(np.float32) * np.float32(448)
  want = product * scale[:, None] * eye_scale
  np.testing.assert_array_equal(got, want)


def _median_row_error(got: np.ndarray, want: np.ndarray,
                      rows: np.ndarray) -> float:
  error = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
  return float(np.median(error[rows]))


def test_rowwise_and_mxfp8_halve_per_tensor_error_on_outlier_activations():
  x, w, ordinary = _outliers(0)
  want = x.astype(np.float64) @ w.astype(np.float64)
  errors = {}
  for scaling in ("current", "rowwise", "mxfp8"):
    f = amp.transform(lambda a, b: a @ b, F8, fp8_scaling=scaling)
    errors[scaling] = _median_row_error(np.asarray(f(x, w)), want, ordinary)
  assert errors["rowwise"] <= errors["current"] / 2, errors
  assert errors["mxfp8"] <= errors["current"] / 2, errors


def _loss(params, x):
  return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"]) ** 2)


@pytest.mark.parametrize("scaling", ["rowwise", "mxfp8"])
def test_value_and_grad_and_train_step_take_the_scaling(scaling):
  rng = np.random.default_rng(5)
  params = {"w1": jnp.asarray(rng.standard_normal((64, 128)) / 8, jnp.float32),
            "w2": jnp.asarray(rng.standard_normal((128, 32)) / 11, jnp.float32)}
  x = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
  f8 = amp.value_and_grad(_loss, F8, fp8_scaling=scaling)
  bf16 = amp.value_and_grad(_loss, BF16)
  (loss, grads), *_ = f8(params, x)
  (loss16, grads16), *_ = bf16(params, x)
  assert abs(float(loss) - float(loss16)) < 0.05 * float(loss16)
  for name in params:
    rel = (np.linalg.norm(grads[name] - grads16[name]) /
           np.linalg.norm(grads16[name]))
    assert rel < 0.1, (name, rel)
  report = f8.lower(params, x).report()
  assert report.fp8_gemms, str(report)
  assert all(scaling in g.gemm for g in report.fp8_gemms), str(report)
  step = amp.train_step(_loss, optax.sgd(0.1), F8, fp8_scaling=scaling,
                        check_grads=True)
  state, metrics = step(step.init(params), x)
  assert bool(metrics["grads_finite"])


def test_mxfp8_on_a_contraction_not_a_multiple_of_32_says_why():
  # K = 48: a multiple of 16 (FP8 eligible), not of 32 (no MXFP8 blocks).
  args = (jnp.ones((32, 48)), jnp.ones((48, 16)))
  report = amp.transform(lambda a, b: a @ b, F8, fp8_scaling="mxfp8",
                         target="gpu", fp8_min_size=0).lower(*args).report()
  dots = [d for d in report.decisions if d.op == "stablehlo.dot_general"]
  assert [d.gemm_reason_id for d in dots] == [
      "contraction_not_multiple_of_32"]
  assert "    contraction of 48: 1 op" in str(report), str(report)


def test_the_shape_filter_keeps_small_gemms_out_of_fp8_and_says_why():
  def f(x, w, v, u):
    return (x @ w).sum() + (v @ u).sum()

  small = (jnp.ones((32, 64)), jnp.ones((64, 16)))
  large = (jnp.ones((2048, 256)), jnp.ones((256, 2048)))
  report = amp.transform(f, F8, target="gpu").lower(*small, *large).report()
  dots = {d.gemm_reason_id for d in report.decisions
          if d.op == "stablehlo.dot_general"}
  assert dots == {"too_small", ""}, str(report)
  assert len(report.fp8_gemms) == 1
  text = str(report)
  assert "32x64x16 GEMM, M*N/(M+N) = 10 < 886: FP8 would be slower" in text
  # fp8_min_size overrides the roofline; 0 turns the filter off.
  report = amp.transform(f, F8, target="gpu",
                         fp8_min_size=0).lower(*small, *large).report()
  assert len(report.fp8_gemms) == 2
  # XLA:CPU emulates FP8: no roofline there.
  report = amp.transform(f, F8, target="cpu").lower(*small, *large).report()
  assert len(report.fp8_gemms) == 2


def test_backward_gemms_read_the_fp8_copies_the_forward_gemm_made():
  # x @ w (2048x1024x2048, M*N/(M+N) = 1024) pays on its own. Its two
  # backward GEMMs (M*N/(M+N) = 682 < 886 alone) each read an operand it
  # quantizes anyway, x or w: quantizing the other, g, costs what a GEMM
  # whose free size is 1024 earns back. Rowwise scales run along each
  # GEMM's own contraction: nothing is shared, and the roofline keeps both
  # out.
  def loss(w, x):
    return jnp.sum((x @ w) ** 2)

  grad = jax.grad(loss, argnums=(0, 1))
  args = (jnp.ones((1024, 2048)), jnp.ones((2048, 1024)))
  report = amp.transform(grad, F8, target="gpu").lower(*args).report()
  assert len(report.fp8_gemms) == 3, str(report)
  assert "too small" not in str(report)
  report = amp.transform(grad, F8, target="gpu",
                         fp8_scaling="rowwise").lower(*args).report()
  assert len(report.fp8_gemms) == 1, str(report)
  assert "M*N/(M+N) = 682 < 886: FP8 would be slower: 2 ops" in str(report)


def test_the_roofline_thresholds_come_from_the_contract():
  from stablehlo_amp._src import contract
  rooflines = {r["device"]: r for r in contract.document()["rooflines"]}
  assert rooflines["H100 SXM"]["min_size"] == 886
  assert rooflines["B200"]["min_size"] == 844
  assert contract.options()["fp8_min_size"]["target_defaults"]["gpu"] == 886


@pytest.mark.parametrize("options, error, match", [
    ({"fp8_scaling": "rowise"}, ValueError,
     r"unknown fp8_scaling 'rowise' \(accepted: current, delayed, rowwise, "
     r"mxfp8\)"),
    ({"fp8_min_size": -1}, ValueError,
     r"fp8_min_size must be an integer of at least 0, got -1"),
    ({"fp8_scaling": "delayed"}, ValueError,
     r"fp8_scaling='delayed' keeps state across steps, which only "
     r"amp.train_step carries; here use current, rowwise, mxfp8"),
])
def test_bad_scaling_options_are_clear_errors(options, error, match):
  with pytest.raises(error, match=match):
    amp.transform(lambda a, b: a @ b, F8, **options)


def test_mxfp8_needs_e4m3_data():
  with pytest.raises(ValueError, match="fp8_scaling='mxfp8' stores E4M3 data "
                     "and policy p=f32,c=bf16,o=f32,gemm=f8e5m2 asks for e5m2 "
                     "operands: use gemm=f8 or gemm=f8e4m3fn with it"):
    amp.transform(lambda a, b: a @ b, "p=f32,c=bf16,o=f32,gemm=f8e5m2",
                  fp8_scaling="mxfp8")
