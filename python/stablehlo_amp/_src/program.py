"""One exported, rewritten and verified program per input signature.

Shared by `amp.transform` and the training API: export with `jax.export`,
mark arguments and results for the passes, rewrite in process, and rebuild
the `Exported` with the new dtypes and any arguments/results the loss-scale
pass added, called with flat leaves.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax._src.export import _export as jax_export_internal
from jax.extend.mlir import ir

from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src.policy import Policy

GRADIENTS_MARKER = "stablehlo_amp.gradients"

# MLIR element type names to dtypes, for the rewritten signature.
_MLIR_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16,
                "f64": jnp.float64, "f8E4M3FN": jnp.float8_e4m3fn,
                "f8E5M2": jnp.float8_e5m2, "i32": jnp.int32, "i1": jnp.bool_}


def mark_gradients(tree: Any) -> Any:
  """Wraps the float leaves of `tree` in the custom call `amp-loss-scale`
  looks for; the pass unscales and checks them, then removes the call."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  floats = [i for i, leaf in enumerate(leaves)
            if jnp.issubdtype(leaf.dtype, jnp.floating)]
  if not floats:
    return tree
  marked = jax.ffi.ffi_call(
      GRADIENTS_MARKER,
      [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in floats],
      has_side_effect=False)(*[leaves[i] for i in floats])
  for i, value in zip(floats, marked):
    leaves[i] = value
  return jax.tree_util.tree_unflatten(treedef, leaves)


@dataclasses.dataclass(frozen=True)
class Timings:
  """Seconds spent making the program of one signature."""
  lower: float = 0.0    # jax.export: trace and lower to StableHLO
  rewrite: float = 0.0  # print, C++ passes, parse and verify


@dataclasses.dataclass(frozen=True)
class LossScaleOptions:
  """What `amp-loss-scale` is asked to do (see Passes.td)."""
  mode: str  # dynamic | static | none
  growth_interval: int = 2000
  growth_factor: float = 2.0
  backoff_factor: float = 0.5
  min_scale: float = 1.0
  max_scale: float = 2.0 ** 24

  def pass_text(self, state_pairs: Sequence[tuple[int, int]] = ()) -> str:
    options = [f"mode={self.mode}"]
    if self.mode == "dynamic":
      options += [f"growth-interval={self.growth_interval}",
                  f"growth-factor={self.growth_factor!r}",
                  f"backoff-factor={self.backoff_factor!r}",
                  f"min-scale={self.min_scale!r}",
                  f"max-scale={self.max_scale!r}"]
    if state_pairs:
      options.append("state-results=" +
                     ",".join(f"{r}:{a}" for r, a in state_pairs))
    return "amp-loss-scale{" + " ".join(options) + "}"

  @property
  def extra_inputs(self) -> int:
    return {"dynamic": 2, "static": 1, "none": 0}[self.mode]

  @property
  def extra_outputs(self) -> int:
    return 3 if self.mode == "dynamic" else 1


@dataclasses.dataclass(frozen=True)
class Program:
  """A rewritten program for one signature, called with flat leaves."""
  exported: jax_export.Exported
  result: pl.RewriteResult
  timings: Timings
  num_extra_outputs: int
  out_tree: Any  # the structure of the function's own outputs

  def call(self, leaves: Sequence[Any], extra: Sequence[Any] = ()) -> tuple:
    """Runs on flat input leaves (+ the loss-scale inputs); returns flat
    output leaves and the loss-scale outputs."""
    avals = self.exported.in_avals
    # Inputs arrive in whatever float dtype; the module takes its own.
    cast = [leaf.astype(aval.dtype)
            if jnp.issubdtype(jnp.result_type(leaf), jnp.floating) and
            jnp.result_type(leaf) != aval.dtype else leaf
            for leaf, aval in zip(leaves, avals)]
    outputs = self.exported.call(*cast, *extra)
    count = len(outputs) - self.num_extra_outputs
    return list(outputs[:count]), list(outputs[count:])


def main_signature(module: ir.Module) -> tuple[list, list]:
  for op in module.body.operations:
    if (op.operation.name == "func.func" and
        ir.StringAttr(op.attributes["sym_name"]).value == "main"):
      function_type = ir.FunctionType(
          ir.TypeAttr(op.attributes["function_type"]).value)
      return list(function_type.inputs), list(function_type.results)
  raise pl.RewriteError("module has no main function")


def _aval(mlir_type, like=None) -> jax.core.ShapedArray:
  shaped = ir.ShapedType(mlir_type)
  element = str(shaped.element_type)
  dtype = _MLIR_DTYPES.get(element)
  if dtype is None:
    if like is None:
      raise pl.RewriteError(f"unexpected element type {element} in the "
                            "rewritten signature")
    return like
  aval = jax.core.ShapedArray(tuple(shaped.shape), np.dtype(dtype))
  if like is not None and like.dtype == aval.dtype:
    return like
  return aval


def _flat_exported(exported: jax_export.Exported, module: ir.Module,
                   extra_in: int, extra_out: int) -> jax_export.Exported:
  """`exported` with the rewritten module, flat trees, new dtypes and the
  arguments/results the passes appended."""
  inputs, results = main_signature(module)
  kept = list(exported.module_kept_var_idx)
  in_avals = list(exported.in_avals)
  for position, flat in enumerate(kept):
    in_avals[flat] = _aval(inputs[position], in_avals[flat])
  first_extra = len(in_avals)
  in_avals += [_aval(t) for t in inputs[len(kept):len(kept) + extra_in]]
  kept += list(range(first_extra, first_extra + extra_in))
  out_avals = [_aval(t, aval) for aval, t in zip(exported.out_avals, results)]
  out_avals += [_aval(t) for t in results[len(exported.out_avals):]]
  if len(out_avals) != len(exported.out_avals) + extra_out:
    raise pl.RewriteError("the rewritten module has an unexpected number of "
                          "results")
  no_in, no_out = (None,) * extra_in, (None,) * extra_out
  return dataclasses.replace(
      exported,
      in_tree=jax.tree_util.tree_structure((tuple(in_avals), {})),
      out_tree=jax.tree_util.tree_structure(tuple(out_avals)),
      in_avals=tuple(in_avals), out_avals=tuple(out_avals),
      _in_named_shardings=tuple(exported._in_named_shardings) + no_in,
      _out_named_shardings=tuple(exported._out_named_shardings) + no_out,
      in_shardings_hlo=tuple(exported.in_shardings_hlo) + no_in,
      out_shardings_hlo=tuple(exported.out_shardings_hlo) + no_out,
      module_kept_var_idx=tuple(kept),
      mlir_module_serialized=jax_export_internal._module_to_bytecode(module),
      _get_vjp=None)


def build(jitted: Callable, export_args: Sequence, export_kwargs: dict, *,
          param_flags: Sequence[bool], policy: Policy, options: dict,
          source_name: str, seed_leaf: int | None = None,
          state_leaves: Sequence[tuple[int, int]] = (),
          loss_scale: LossScaleOptions | None = None) -> Program:
  """Exports `jitted`, rewrites it and returns the flat-called program.

  `param_flags[i]` says whether flat input leaf i takes the `p=` dtype;
  `seed_leaf` is the flat input leaf holding the loss cotangent seed;
  `state_leaves` pairs (flat output leaf, flat input leaf) whose new value is
  kept only if the gradients are finite.

  Raises `RewriteError` when the function cannot be exported or rewritten
  (the caller decides whether to fall back) and `VerificationError` when
  the rewritten module is invalid (a bug).
  """
  start = time.perf_counter()
  disabled = [jax_export.DisabledSafetyCheck.custom_call(GRADIENTS_MARKER)]
  try:
    exported = jax_export.export(jitted, disabled_checks=disabled)(
        *export_args, **export_kwargs)
  except (NotImplementedError, ValueError) as error:
    # Host callbacks, unsupported effects: jax.export says what.
    raise pl.RewriteError(f"jax.export cannot export it: {error}") from error
  lowered_at = time.perf_counter()
  kept = exported.module_kept_var_idx
  position = {flat: i for i, flat in enumerate(kept)}
  context = pl.ir_context()
  with context:
    module = jax_export_internal._jax.mlir.deserialize_portable_artifact(
        exported.mlir_module_serialized)
    if len(main_signature(module)[0]) != len(kept):
      raise pl.RewriteError("the exported module has extra arguments "
                            "(effect tokens or a platform index)")
    marks: dict[int, list[str]] = {}
    for i, flat in enumerate(kept):
      if not param_flags[flat]:
        marks.setdefault(i, []).append("amp.keep_dtype")
    if seed_leaf is not None:
      if seed_leaf not in position:
        raise pl.RewriteError("the loss does not depend on the seed")
      marks.setdefault(position[seed_leaf], []).append("amp.loss_seed")
    pl.mark_arguments(module, marks)
    state_pairs = [(out, position[arg]) for out, arg in state_leaves
                   if arg in position]
    result = pl.rewrite_module(
        module, policy, context=context, source_name=source_name,
        loss_scale=(loss_scale.pass_text(state_pairs)
                    if loss_scale else None),
        **options)
    for diagnostic in result.diagnostics:
      warnings.warn(f"stablehlo-amp: {diagnostic}", stacklevel=4)
    program = _flat_exported(
        exported, result.module,
        loss_scale.extra_inputs if loss_scale else 0,
        loss_scale.extra_outputs if loss_scale else 0)
  done = time.perf_counter()
  return Program(program, result,
                 Timings(lower=lowered_at - start, rewrite=done - lowered_at),
                 loss_scale.extra_outputs if loss_scale else 0,
                 exported.out_tree)
