"""One exported, rewritten and verified program per input signature.

Shared by `amp.transform` and the training API: export with `jax.export`,
mark arguments and results for the passes, rewrite in process, and rebuild
the `Exported` with the new dtypes and any arguments and results the
loss-scale pass appended, called with flat leaves.
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
from jax.extend.mlir import ir
from jax.interpreters import mlir as jax_mlir

from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src.policy import Policy


def mark_gradients(tree: Any) -> Any:
  """Wraps the float leaves of `tree` in the custom call `amp-loss-scale`
  looks for; the pass unscales and checks them, then removes the call."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  floats = [i for i, leaf in enumerate(leaves)
            if jnp.issubdtype(leaf.dtype, jnp.floating)]
  if not floats:
    return tree
  marked = jax_compat.ffi_call(
      contract.attribute("gradients_call"),
      [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in floats],
  )(*[leaves[i] for i in floats])
  for i, value in zip(floats, marked):
    leaves[i] = value
  return jax.tree_util.tree_unflatten(treedef, leaves)


@dataclasses.dataclass(frozen=True)
class Timings:
  """Seconds spent making the program of one signature."""
  lower: float = 0.0    # trace and lower to StableHLO
  rewrite: float = 0.0  # print, C++ passes, parse, verify, ready to call


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
  """A rewritten program for one signature, called with flat leaves.

  It is called through the primitive `amp_module_call`, whose lowering
  inlines the rewritten module into the caller's (MLIR bytecode, no
  portable-artifact round trip); a program with explicit shardings was
  built with `jax.export` and is called through `Exported.call`, which
  applies them."""
  module: ir.Module          # the rewritten, verified module
  result: pl.RewriteResult
  timings: Timings
  in_avals: tuple            # every argument of main (appended ones too)
  all_out_avals: tuple       # every result `call` returns (appended too)
  num_extra_outputs: int
  out_tree: Any              # the structure of the function's own outputs
  name: str = "amp"          # the function's name, for the inlined copy
  exported: jax_export.Exported | None = None
  bytecode: bytes | None = None  # MLIR bytecode the lowering inlines
  kept: tuple[int, ...] | None = None  # the leaves main takes (None: all)
  # What the passes appended to main, by the attribute on each (in order):
  # FP8 amax histories (amp-fp8-gemms), then the loss-scale state.
  extra_in_roles: tuple[str, ...] = ()
  extra_out_roles: tuple[str, ...] = ()
  # The host callbacks (debug prints, io callbacks) the module calls, and
  # how many of them its calls index: they move to whatever lowering
  # inlines it.
  host_callbacks: tuple[Any, ...] = ()
  indexed_callbacks: int = 0
  # Per output leaf of the function: the aval of a typed PRNG key (its
  # module returns the key's uint32 data), else None.
  out_key_avals: tuple[Any, ...] = ()
  # The results of main as the module has them (keys as their data); empty
  # when they are `all_out_avals`.
  module_out_avals: tuple = ()

  @property
  def out_avals(self) -> tuple:
    """The avals of the function's own outputs (not the appended ones)."""
    count = len(self.all_out_avals) - self.num_extra_outputs
    return tuple(self.all_out_avals[:count])

  def call(self, leaves: Sequence[Any], extra: Sequence[Any] = ()) -> tuple:
    """Runs on flat input leaves (+ the appended inputs); returns flat
    output leaves and the appended outputs."""
    if self.kept is not None:  # unused leaves are not arguments of main
      leaves = [leaves[i] for i in self.kept]
    if self.exported is not None:
      outputs = self.exported.call(*self._cast(leaves), *extra)
    else:
      # A typed PRNG key goes in as its data, which is what the lowered
      # module takes, and comes out wrapped again.
      leaves = [jax_compat.key_data(leaf) for leaf in leaves]
      outputs = list(amp_module_call_p.bind(*self._cast(leaves), *extra,
                                            program=self))
      for i, aval in enumerate(self.out_key_avals):
        outputs[i] = jax_compat.wrap_key(outputs[i], aval)
    count = len(outputs) - self.num_extra_outputs
    return list(outputs[:count]), list(outputs[count:])

  def _cast(self, leaves: Sequence[Any]) -> list:
    """Inputs arrive in whatever float dtype; the module takes its own."""
    return [leaf.astype(aval.dtype)
            if jnp.issubdtype(jax_compat.dtype_of(leaf), jnp.floating) and
            jax_compat.dtype_of(leaf) != aval.dtype else leaf
            for leaf, aval in zip(leaves, self.in_avals)]


amp_module_call_p = jax_compat.primitive_class()("amp_module_call")
amp_module_call_p.multiple_results = True
amp_module_call_p.def_abstract_eval(
    lambda *avals, program: [jax_compat.shaped_array(tuple(a.shape), a.dtype)
                             for a in (program.module_out_avals or
                                       program.all_out_avals)])
amp_module_call_p.def_impl(
    lambda *args, program: jax.jit(
        lambda *xs: amp_module_call_p.bind(*xs, program=program))(*args))
jax_mlir.register_lowering(
    amp_module_call_p,
    lambda ctx, *args, program: jax_compat.call_module(
        ctx, program.bytecode, program.name, args,
        callbacks=(program.host_callbacks, program.indexed_callbacks)))


def main_signature(module: ir.Module) -> tuple[list, list]:
  for op in module.body.operations:
    if (op.operation.name == "func.func" and
        ir.StringAttr(op.attributes["sym_name"]).value == "main"):
      function_type = ir.FunctionType(
          ir.TypeAttr(op.attributes["function_type"]).value)
      return list(function_type.inputs), list(function_type.results)
  raise pl.RewriteError("module has no main function")


def _mlir_dtype(element: ir.Type) -> np.dtype | None:
  """The dtype of an MLIR element type (f32, bf16, f8E4M3FN, i32, ui8, i1)."""
  text = str(element)
  if text == "i1":
    name = "bool"
  elif text == "bf16":
    name = "bfloat16"
  elif text.startswith("f8"):
    name = "float8_" + text[2:].lower()
  elif text[:1] == "f" and text[1:].isdigit():
    name = "float" + text[1:]
  elif text[:2] == "ui" and text[2:].isdigit():
    name = "uint" + text[2:]
  elif text[:1] == "i" and text[1:].isdigit():
    name = "int" + text[1:]
  else:
    return None
  try:
    return jnp.dtype(name)
  except TypeError:
    return None


def _aval(mlir_type, like=None) -> Any:
  shaped = ir.ShapedType(mlir_type)
  dtype = _mlir_dtype(shaped.element_type)
  if dtype is None:
    if like is None:
      raise pl.RewriteError(f"unexpected element type {shaped.element_type} "
                            "in the rewritten signature")
    return like
  aval = jax_compat.shaped_array(tuple(shaped.shape), dtype)
  if like is not None and like.dtype == aval.dtype:
    return like
  return aval


def _appended_roles(module: ir.Module, first_argument: int,
                    first_result: int) -> tuple[tuple[str, ...], ...]:
  """The role (amp attribute name) of each argument and result of main from
  `first_argument` / `first_result` on: what the passes appended."""
  main = next(op for op in module.body.operations
              if op.operation.name == "func.func" and
              ir.StringAttr(op.attributes["sym_name"]).value == "main")
  roles = []
  for name, first in (("arg_attrs", first_argument),
                      ("res_attrs", first_result)):
    found = []
    attrs = (list(ir.ArrayAttr(main.attributes[name]))
             if name in main.attributes else [])
    for entry in attrs[first:]:
      entry = ir.DictAttr(entry)
      names = [entry[j].name for j in range(len(entry))
               if entry[j].name.startswith("amp.")]
      if len(names) != 1:
        raise pl.RewriteError(f"an appended argument or result of main has "
                              f"no single amp role ({names})")
      found.append(names[0])
    roles.append(tuple(found))
  return tuple(roles)


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
  return jax_compat.replace_exported(
      exported, module, in_avals=in_avals, out_avals=out_avals,
      kept_var_idx=kept, extra_in=extra_in, extra_out=extra_out)


def export(jitted: Callable, args: Sequence, kwargs: dict) -> Any:
  """`jax.export` of `jitted`. Errors raised by the function itself
  propagate as they are; what jax.export cannot export (host callbacks,
  effects) is a RewriteError."""
  # Trace first: an exception from the user's own code surfaces as itself.
  jitted.trace(*args, **kwargs)
  disabled = [jax_export.DisabledSafetyCheck.custom_call(
      contract.attribute("gradients_call"))]
  try:
    return jax_export.export(jitted, disabled_checks=disabled)(*args, **kwargs)
  except (NotImplementedError, ValueError) as error:
    raise pl.RewriteError(f"jax.export cannot export it: {error}") from error


def _lower(jitted: Callable, args: Sequence, kwargs: dict):
  """(module, kept leaf indices, output tree, host callbacks and how many
  the module indexes) of `jitted` lowered for `args`: its StableHLO as JAX
  emits it, no portable-artifact round trip. Errors raised by the function
  itself propagate as they are."""
  lowered = jitted.lower(*args, **kwargs)
  module = lowered.compiler_ir("stablehlo")
  # Custom-call targets are plain strings in MLIR bytecode's string table;
  # writing bytecode costs about a tenth of printing text (20k ops: 0.015 s
  # against 0.13 s).
  bytecode = jax_compat.bytecode_of(module)
  callbacks: tuple = ()
  indexed = 0
  if any(target.encode() in bytecode
         for target in jax_compat.HOST_CALLBACK_TARGETS):
    # A debug print or io callback: its Python function moves with the
    # rewritten module to the lowering that inlines it.
    found = jax_compat.host_callbacks(lowered)
    if not found or not found[0]:
      raise pl.RewriteError("it calls back into Python (a host callback), "
                            "and this JAX does not say which callbacks the "
                            "program holds")
    callbacks, indexed = found
  count = len(jax.tree_util.tree_leaves((args, kwargs)))
  key_avals = tuple(jax_compat.key_aval(info)
                    for info in jax.tree_util.tree_leaves(lowered.out_info))
  return (module, lowered.out_tree, jax_compat.kept_arguments(lowered, count),
          callbacks, indexed, key_avals)


@dataclasses.dataclass
class Marked:
  """A function's StableHLO, lowered and marked for the passes, before any
  rewrite."""
  module: ir.Module
  kept: tuple[int, ...]   # the flat input leaves main takes
  out_tree: Any
  exported: jax_export.Exported | None
  lower_seconds: float
  host_callbacks: tuple[Any, ...] = ()
  indexed_callbacks: int = 0
  out_key_avals: tuple[Any, ...] = ()


def lower_marked(jitted: Callable, args: Sequence, kwargs: dict, *,
                 param_flags: Sequence[bool], seed_leaf: int | None = None,
                 state_leaves: Sequence[tuple[int, int]] = (),
                 use_export: bool = False) -> Marked:
  """Lowers `jitted` and marks its main for the passes (see `build`)."""
  start = time.perf_counter()
  exported = None
  callbacks, indexed, key_avals = (), 0, ()
  if use_export:
    exported = export(jitted, args, kwargs)
    kept, out_tree = exported.module_kept_var_idx, exported.out_tree
    with pl.ir_context():
      module = jax_compat.exported_module(exported)
  else:
    module, out_tree, kept, callbacks, indexed, key_avals = _lower(
        jitted, args, kwargs)
  lowered = time.perf_counter() - start
  position = {flat: i for i, flat in enumerate(kept)}
  with module.context:
    if len(main_signature(module)[0]) != len(kept):
      raise pl.RewriteError(
          "the lowered module takes extra arguments: effect tokens (an "
          "ordered effect, such as jax.debug.print(..., ordered=True) or "
          "io_callback(..., ordered=True); unordered callbacks are "
          "rewritten) or a platform index")
    marks: dict[int, list[str]] = {}
    for i, flat in enumerate(kept):
      if not param_flags[flat]:
        marks.setdefault(i, []).append(contract.attribute("keep_dtype"))
    if seed_leaf is not None:
      if seed_leaf not in position:
        raise pl.RewriteError("the loss does not depend on the seed")
      marks.setdefault(position[seed_leaf], []).append(
          contract.attribute("loss_seed"))
    i32 = ir.IntegerType.get_signless(32, module.context)
    result_marks = {
        out: {contract.attribute("state_of"): ir.IntegerAttr.get(
            i32, position[arg])}
        for out, arg in state_leaves if arg in position}
    pl.mark_arguments(module, marks, result_marks)
  return Marked(module, tuple(kept), out_tree, exported, lowered,
                callbacks, indexed, key_avals)


def build(jitted: Callable, export_args: Sequence, export_kwargs: dict, *,
          param_flags: Sequence[bool], policy: Policy,
          options: pl.RewriteOptions, source_name: str,
          seed_leaf: int | None = None,
          state_leaves: Sequence[tuple[int, int]] = (),
          loss_scale: Any = None, use_export: bool = False,
          marked: Marked | None = None) -> Program:
  """Lowers `jitted`, rewrites it and returns the flat-called program.

  `param_flags[i]` says whether flat input leaf i takes the `p=` dtype;
  `seed_leaf` is the flat input leaf holding the loss cotangent seed;
  `state_leaves` pairs (flat output leaf, flat input leaf) whose new value
  has the input's dtype and is kept only if the gradients are finite;
  `loss_scale` is the loss scale whose `amp-loss-scale` pass to run.
  `use_export` builds through `jax.export` and calls through
  `Exported.call` (for explicit shardings, which it applies). `marked` is
  the function already lowered and marked (calibration did it).

  Raises `RewriteError` when the function cannot be lowered for rewriting
  or rewritten (the caller decides whether to fall back) and
  `VerificationError` when the rewritten module is invalid (a bug).
  """
  if marked is None:
    marked = lower_marked(jitted, export_args, export_kwargs,
                          param_flags=param_flags, seed_leaf=seed_leaf,
                          state_leaves=state_leaves, use_export=use_export)
  started = time.perf_counter()
  context = pl.ir_context()
  module, kept, out_tree, exported = (marked.module, marked.kept,
                                      marked.out_tree, marked.exported)
  result = pl.rewrite_module(
      module, policy, options, context=context, source_name=source_name,
      loss_scale=loss_scale.pass_options() if loss_scale else None)
  for diagnostic in result.diagnostics:
    warnings.warn(f"stablehlo-amp: {diagnostic}", stacklevel=4)
  with context:
    in_roles, out_roles = _appended_roles(result.module, len(kept),
                                          out_tree.num_leaves)
    extra_in, extra_out = len(in_roles), len(out_roles)
    inputs, results = main_signature(result.module)
    in_avals = tuple(_aval(t) for t in inputs)
    all_out_avals = tuple(_aval(t) for t in results)
    if exported is not None:
      exported = _flat_exported(exported, result.module, extra_in, extra_out)
      in_avals, all_out_avals = exported.in_avals, exported.out_avals
    elif (len(inputs) != len(kept) + extra_in or
          len(results) != out_tree.num_leaves + extra_out):
      raise pl.RewriteError("the rewritten module has an unexpected number "
                            "of arguments or results")
  # Typed keys come out of `call` as keys, out of the module as data.
  key_avals, module_out_avals = (), ()
  if exported is None and any(a is not None for a in marked.out_key_avals):
    key_avals = marked.out_key_avals
    module_out_avals = all_out_avals
    all_out_avals = tuple(
        key if key is not None else aval for key, aval in
        zip(key_avals + (None,) * (len(all_out_avals) - len(key_avals)),
            all_out_avals))
  # The form the lowering reads, made now: its cost is the rewrite's.
  bytecode = None if exported else jax_compat.bytecode_of(result.module)
  done = time.perf_counter()
  return Program(result.module, result,
                 Timings(lower=marked.lower_seconds, rewrite=done - started),
                 in_avals, all_out_avals, extra_out, out_tree,
                 name=source_name, exported=exported, bytecode=bytecode,
                 kept=None if exported else tuple(kept),
                 extra_in_roles=in_roles, extra_out_roles=out_roles,
                 host_callbacks=marked.host_callbacks,
                 indexed_callbacks=marked.indexed_callbacks,
                 out_key_avals=key_avals,
                 module_out_avals=module_out_avals)
