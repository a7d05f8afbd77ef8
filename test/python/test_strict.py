"""strict=True: the compiled program computes exactly the roundings of the
painted IR. Each rewritten module is run by XLA:CPU and by a NumPy
interpreter of the same module (each op in f32, rounded to its result type;
transcendentals by XLA's own f32 kernels, op by op), and the two must agree
bit for bit. Without strict, XLA's excess precision drops roundings between
low-precision ops, and they must not agree: the check can fail.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import pipeline as pl

from jax.extend.mlir import ir

_DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16,
           "f16": np.float16, "i32": np.int32, "i1": np.bool_}
# Transcendentals by XLA's own f32 kernels: the interpreter agrees with the
# compiled program on everything but the roundings it checks.
_XLA_F32 = {"stablehlo.tanh": jax.jit(jnp.tanh),
            "stablehlo.exponential": jax.jit(jnp.exp),
            "stablehlo.log": jax.jit(jnp.log),
            "stablehlo.rsqrt": jax.jit(jax.lax.rsqrt)}
_BINARY = {"stablehlo.add": np.add, "stablehlo.subtract": np.subtract,
           "stablehlo.multiply": np.multiply, "stablehlo.divide": np.divide,
           "stablehlo.maximum": np.maximum, "stablehlo.minimum": np.minimum}


def _dtype(type_: ir.Type):
  return _DTYPES[str(ir.ShapedType(type_).element_type)]


def _ints(attr) -> list[int]:
  return [int(v) for v in ir.DenseI64ArrayAttr(attr)]


def _dot(lhs, rhs, text: str):
  """dot_general from its printed dimension numbers, in f32."""
  def dims(key):
    match = re.search(key + r" = \[([\d, ]*)\]", text)
    return [int(v) for v in match.group(1).split(",") if v.strip()] if match \
        else []
  lb, rb = dims("lhs_batching_dimensions"), dims("rhs_batching_dimensions")
  lc, rc = dims("lhs_contracting_dimensions"), dims("rhs_contracting_dimensions")
  lf = [d for d in range(lhs.ndim) if d not in lb + lc]
  rf = [d for d in range(rhs.ndim) if d not in rb + rc]
  batch = [lhs.shape[d] for d in lb]
  a = lhs.transpose(lb + lf + lc).reshape(
      [int(np.prod(batch))] + [int(np.prod([lhs.shape[d] for d in lf]))] +
      [int(np.prod([lhs.shape[d] for d in lc]))])
  b = rhs.transpose(rb + rc + rf).reshape(
      [int(np.prod(batch))] + [int(np.prod([rhs.shape[d] for d in rc]))] +
      [int(np.prod([rhs.shape[d] for d in rf]))])
  out = np.matmul(a.astype(np.float32), b.astype(np.float32))
  return out.reshape(batch + [lhs.shape[d] for d in lf] +
                     [rhs.shape[d] for d in rf])


def _reduce_precision(x, exponent: int, mantissa: int):
  if (exponent, mantissa) == (8, 7):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)
  if (exponent, mantissa) == (5, 10):  # XLA flushes what f16 holds subnormal
    y = x.astype(np.float16).astype(np.float32)
    return np.where(np.abs(y) < 2.0 ** -14, np.copysign(0.0, y), y)
  raise NotImplementedError((exponent, mantissa))


def interpret(module: ir.Module, args: list[np.ndarray]) -> list[np.ndarray]:
  """Runs `main` of a rewritten module: every op computes in f32 on its
  operands and rounds to its result type."""
  main = next(op for op in module.body.operations
              if ir.StringAttr(op.attributes["sym_name"]).value == "main")
  block = main.regions[0].blocks[0]
  env = {}
  for arg, value in zip(block.arguments, args):
    env[arg] = np.asarray(value, _dtype(arg.type))
  for op in block.operations:
    name = op.operation.name
    ins = [env[v] for v in op.operands]
    wide = [x.astype(np.float32) if x.dtype != np.bool_ else x for x in ins]
    attrs = op.attributes
    if name == "func.return":
      return [env[v] for v in op.operands]
    if name == "stablehlo.constant":
      value = ir.DenseElementsAttr(attrs["value"])
      shape = ir.ShapedType(op.results[0].type).shape
      out = (np.full(shape, ir.FloatAttr(value.get_splat_value()).value)
             if value.is_splat else np.asarray(value))
    elif name == "stablehlo.optimization_barrier":
      for result, value in zip(op.results, ins):
        env[result] = value
      continue
    elif name in _BINARY:
      out = _BINARY[name](*wide)
    elif name in _XLA_F32:
      out = np.asarray(_XLA_F32[name](wide[0]))
    elif name == "stablehlo.negate":
      out = -wide[0]
    elif name == "stablehlo.convert":
      out = ins[0]
    elif name == "stablehlo.reduce_precision":
      out = _reduce_precision(wide[0], int(ir.IntegerAttr(
          attrs["exponent_bits"]).value), int(ir.IntegerAttr(
              attrs["mantissa_bits"]).value))
    elif name == "stablehlo.broadcast_in_dim":
      shape = ir.ShapedType(op.results[0].type).shape
      dims = _ints(attrs["broadcast_dimensions"])
      src = ins[0]
      expanded = src.reshape([src.shape[dims.index(d)] if d in dims else 1
                              for d in range(len(shape))])
      out = np.broadcast_to(expanded, shape)
    elif name == "stablehlo.transpose":
      out = ins[0].transpose(_ints(attrs["permutation"]))
    elif name == "stablehlo.reshape":
      out = ins[0].reshape(ir.ShapedType(op.results[0].type).shape)
    elif name == "stablehlo.dot_general":
      out = _dot(wide[0], wide[1], str(attrs["dot_dimension_numbers"]))
    else:
      raise NotImplementedError(f"the interpreter has no {name}")
    env[op.results[0]] = np.asarray(out).astype(_dtype(op.results[0].type))
  raise AssertionError("main has no return")


def program(x, y, w, p):
  """A dot on integers (its sums are exact in any order), painted
  arithmetic and transcendentals, and a dot that picks one product per
  output (a scaled permutation): every rounding is in the elementwise
  work and the stored values."""
  d = x @ w
  a = jnp.tanh(d * 0.01)
  b = a * y + x * 0.5
  c = jnp.exp(b)
  e = c @ p
  return e * b + c


def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  x = rng.integers(-4, 5, (64, 128)).astype(np.float32)
  w = rng.integers(-4, 5, (128, 128)).astype(np.float32)
  y = rng.standard_normal((64, 128)).astype(np.float32)
  p = np.eye(128, dtype=np.float32)[rng.permutation(128)] * 2.0
  return x, y, w, p


def _rewritten(strict: bool, policy: str, level: str, target: str):
  # dot_result="f32": at O2 the elementwise work then stays f32 (bf16 GEMM
  # results, the gpu default, would paint it low as O3 does).
  fast = amp.transform(program, policy, level=level, target=target,
                       strict=strict, dot_result="f32")
  args = _inputs()
  lowered = fast.lower(*args)
  module = ir.Module.parse(lowered.as_text(), pl.ir_context())
  return fast, module, args


@pytest.mark.parametrize("level,target", [("O3", "cpu"), ("O2", "gpu"),
                                          ("O3", "gpu")])
def test_strict_computes_the_painted_ir_bit_for_bit(level, target):
  """bf16: the strict program equals the interpreter run on the painted
  (default) module, and on its own module."""
  fast, module, args = _rewritten(True, "p=f32,c=bf16,o=f32", level, target)
  _, painted, _ = _rewritten(False, "p=f32,c=bf16,o=f32", level, target)
  # At O3 the elementwise work is painted low: its roundings are explicit.
  assert ("stablehlo.reduce_precision" in str(module)) == (level == "O3")
  compiled = np.asarray(fast(*args)).view(np.uint32)
  for ir_module in (painted, module):
    emulated = interpret(ir_module, list(args))[0]
    np.testing.assert_array_equal(compiled,
                                  emulated.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("level,target", [("O3", "cpu"), ("O3", "gpu")])
def test_strict_f16_matches_its_module_bit_for_bit(level, target):
  """f16: reduce_precision flushes what f16 holds as subnormals (XLA's
  semantics), so the strict module is the reference."""
  fast, module, args = _rewritten(True, "p=f32,c=f16,o=f32", level, target)
  compiled = np.asarray(fast(*args)).view(np.uint32)
  emulated = interpret(module, list(args))[0]
  np.testing.assert_array_equal(compiled,
                                emulated.astype(np.float32).view(np.uint32))


def test_without_strict_xla_drops_roundings():
  """The same check on the default form finds XLA's excess precision: the
  interpreter rounds after each bf16 op, XLA:CPU does not."""
  fast, module, args = _rewritten(False, "p=f32,c=bf16,o=f32", "O3", "cpu")
  compiled = np.asarray(fast(*args))
  emulated = interpret(module, list(args))[0]
  differ = int((compiled.view(np.uint32) !=
                emulated.astype(np.float32).view(np.uint32)).sum())
  assert differ > compiled.size // 100, differ


def test_strict_keeps_every_rounding_in_the_compiled_program():
  """strict on a training step: the report's stored values survive, and
  the step trains like the default form (same decisions, f32 holding
  compute-dtype values)."""
  import optax
  params = jnp.asarray(_inputs()[2]) * 0.01
  batch = jnp.asarray(_inputs()[0])
  loss = lambda w, b: jnp.mean(jnp.tanh(b @ w) ** 2)
  for strict in (False, True):
    step = amp.train_step(loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32",
                          level="O3", strict=strict)
    state = step.init(params)
    for _ in range(3):
      state, metrics = step(state, batch)
    if not strict:
      reference = float(metrics["loss"])
  assert abs(float(metrics["loss"]) - reference) <= 1e-2 * abs(reference)


def test_amp_opt_strict_and_rematerialize_flags(tmp_path, capfd):
  from stablehlo_amp._src import cli
  source = tmp_path / "program.mlir"
  source.write_text(jax.jit(program).lower(*_inputs()).as_text())
  outputs = {}
  for flags in ((), ("--strict",)):
    out = tmp_path / f"out{len(flags)}.mlir"
    status = cli.main([str(source), "--level", "O3", "--target", "cpu",
                       *flags, "-o", str(out)])
    assert status == 0, capfd.readouterr().err
    outputs[flags] = out.read_text()
  assert "reduce_precision" not in outputs[()]
  assert "reduce_precision" in outputs[("--strict",)]
  assert cli.main([str(source), "--rematerialize", "off", "-o",
                   str(tmp_path / "r.mlir")]) == 0
  assert cli.main([str(source), "--strict", "--pass-pipeline",
                   "builtin.module(amp-simplify-converts)"]) == 2
  assert "--strict does not apply with --pass-pipeline" in (
      capfd.readouterr().err)
