"""The one front end under `amp.transform`, `amp.train_step` and
`amp.value_and_grad`: signatures, programs and the call.

- Signatures: arguments flattened to leaves, static, donated and parameter
  arguments selected by position or name, export specs (parameter leaves as
  f32), shardings per leaf, and the key a program is cached by.
- Programs: the function lowered with the parameter leaves and the
  loss-scale seed and state marked for the passes, rewritten in process,
  verified, and rebuilt with the new dtypes and whatever arguments and
  results the passes appended.
- The call: `Program.call` binds the one call primitive, `amp_module_call`,
  whose lowering inlines the rewritten module; `OuterJit` is the jit around
  it, and `Lowered` what `.lower(...)` returns.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import time
import warnings
from typing import Any, Callable, Hashable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax.extend.mlir import ir
from jax.interpreters import ad, batching
from jax.interpreters import mlir as jax_mlir

from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src.policy import Policy
from stablehlo_amp._src.report import Report


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
  # FP8 amax histories (amp-fp8-gemms), the rounding key or compensation
  # buffers (amp-round-state), then the loss-scale state.
  extra_in_roles: tuple[str, ...] = ()
  extra_out_roles: tuple[str, ...] = ()
  # For each of them, the flat input leaf it belongs to (a Kahan
  # compensation buffer's parameter), else None.
  extra_in_owners: tuple[int | None, ...] = ()
  extra_out_owners: tuple[int | None, ...] = ()
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
  # Every flat input leaf's aval (the unused ones too), and the program of
  # the function batched along each leaf's axis (0 or None), built on first
  # use: what `jax.vmap` of a call makes of it. None where there is none
  # (a program built through jax.export).
  leaf_avals: tuple = ()
  batched: Callable[[tuple[int | None, ...], int], "Program"] | None = None
  # Where the rewrite wrote what XLA's SPMD partitioner cannot split (the
  # MXFP8 composite), or decided something by the partition count
  # (`amp.partition_dependent`): the program rewritten for a lowering over
  # that many partitions, built on first use. None where there is nothing
  # to redo.
  partitioned: Callable[[int], "Program"] | None = None
  # The program the latest lowering inlined (this one or a partitioned
  # one): what `Lowered` reports on.
  last_lowered: list = dataclasses.field(default_factory=list,
                                         compare=False, repr=False)

  def for_partitions(self, count: int) -> "Program":
    """The program to inline into a lowering over `count` partitions."""
    program = (self.partitioned(count)
               if count > 1 and self.partitioned is not None else self)
    self.last_lowered[:] = [program]
    return program

  def as_lowered(self) -> "Program":
    """The program the latest lowering of this one inlined."""
    return self.last_lowered[0] if self.last_lowered else self

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


def _batch_rule(args, dims, *, program: Program):
  """`jax.vmap` of a call: the program of the function batched the same
  way, rewritten in turn (its loss scale and finite check cover the whole
  batch). The appended inputs (loss-scale state, FP8 histories) cannot be
  batched: one state serves the batch."""
  dims = [d if isinstance(d, int) else None for d in dims]
  extra = len(program.extra_in_roles)
  main_args, extra_args = list(args[:len(args) - extra]), args[len(args) -
                                                                extra:]
  if any(d is not None for d in dims[len(main_args):]):
    raise NotImplementedError(
        f"jax.vmap of {program.name} over its loss-scale state or FP8 "
        "amax histories: one state serves the whole batch; map over the "
        "other arguments (in_axes=None for the loss scale)")
  if program.batched is None:
    raise NotImplementedError(
        f"jax.vmap of {program.name}, which was built through jax.export "
        "for explicit shardings: vmap the function before giving it "
        "shardings")
  size = next(np.shape(a)[d] for a, d in zip(main_args, dims)
              if d is not None)
  kept = program.kept if program.kept is not None else range(len(main_args))
  leaves: list = [jnp.zeros(a.shape, a.dtype) for a in program.leaf_avals]
  leaf_dims: list = [None] * len(leaves)
  for flat, arg, d in zip(kept, main_args, dims):
    leaves[flat] = arg if d is None else jnp.moveaxis(arg, d, 0)
    leaf_dims[flat] = None if d is None else 0
  outputs, extra_out = program.batched(tuple(leaf_dims), size).call(
      leaves, extra_args)
  return (list(outputs) + list(extra_out),
          [0] * len(outputs) + [None] * len(extra_out))


amp_module_call_p = jax_compat.primitive_class()("amp_module_call")
amp_module_call_p.multiple_results = True
amp_module_call_p.def_abstract_eval(
    lambda *avals, program: [jax_compat.shaped_array(tuple(a.shape), a.dtype)
                             for a in (program.module_out_avals or
                                       program.all_out_avals)])
amp_module_call_p.def_impl(
    lambda *args, program: jax.jit(
        lambda *xs: amp_module_call_p.bind(*xs, program=program))(*args))
batching.primitive_batchers[amp_module_call_p] = _batch_rule


def _jvp_rule(primals, tangents, *, program: Program):
  del primals, tangents
  raise TypeError(
      f"jax.grad or jax.jvp of {program.name}, whose program returns "
      "loss-scale state or measurements (numerics=) beside its results: "
      "differentiate the function itself (amp.value_and_grad, "
      "amp.train_step), or amp.transform it without numerics=")


ad.primitive_jvps[amp_module_call_p] = _jvp_rule


def _lower_call(ctx: Any, *args: Any, program: Program) -> list:
  """Inlines the rewritten module (rewritten again for a partitioned
  lowering where it has to be: `Program.partitioned`)."""
  program = program.for_partitions(jax_compat.partition_count(ctx))
  return jax_compat.call_module(
      ctx, program.bytecode, program.name, args,
      callbacks=(program.host_callbacks, program.indexed_callbacks))


jax_mlir.register_lowering(amp_module_call_p, _lower_call)


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


def aval_of_type(mlir_type, like=None) -> Any:
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


def _integer_value(attr: ir.Attribute) -> int | None:
  try:  # a cast: the attribute classes' isinstance differs across jaxlibs
    return ir.IntegerAttr(attr).value
  except ValueError:
    return None


def _appended_roles(module: ir.Module, first_argument: int,
                    first_result: int, kept: Sequence[int]
                    ) -> tuple[tuple[str, ...], tuple[str, ...],
                               tuple[int | None, ...], tuple[int | None, ...]]:
  """The role (amp attribute name) of each argument and result of main from
  `first_argument` / `first_result` on: what the passes appended. Then, for
  each of them, the flat input leaf it belongs to when its role attribute
  names an argument of main (`amp.compensation = N`: the leaf argument N
  takes), else None."""
  main = next(op for op in module.body.operations
              if op.operation.name == "func.func" and
              ir.StringAttr(op.attributes["sym_name"]).value == "main")
  roles, owners = [], []
  for name, first in (("arg_attrs", first_argument),
                      ("res_attrs", first_result)):
    found, owner = [], []
    attrs = (list(ir.ArrayAttr(main.attributes[name]))
             if name in main.attributes else [])
    for entry in attrs[first:]:
      entry = ir.DictAttr(entry)
      named = [entry[j] for j in range(len(entry))
               if entry[j].name.startswith("amp.")]
      if len(named) != 1:
        raise pl.RewriteError(f"an appended argument or result of main has "
                              f"no single amp role "
                              f"({[n.name for n in named]})")
      found.append(named[0].name)
      argument = _integer_value(named[0].attr)
      owner.append(None if argument is None else kept[argument])
    roles.append(tuple(found))
    owners.append(tuple(owner))
  return roles[0], roles[1], owners[0], owners[1]


def _flat_exported(exported: jax_export.Exported, module: ir.Module,
                   extra_in: int, extra_out: int) -> jax_export.Exported:
  """`exported` with the rewritten module, flat trees, new dtypes and the
  arguments/results the passes appended."""
  inputs, results = main_signature(module)
  kept = list(exported.module_kept_var_idx)
  in_avals = list(exported.in_avals)
  for position, flat in enumerate(kept):
    in_avals[flat] = aval_of_type(inputs[position], in_avals[flat])
  first_extra = len(in_avals)
  in_avals += [aval_of_type(t) for t in inputs[len(kept):len(kept) + extra_in]]
  kept += list(range(first_extra, first_extra + extra_in))
  out_avals = [aval_of_type(t, aval)
               for aval, t in zip(exported.out_avals, results)]
  out_avals += [aval_of_type(t) for t in results[len(exported.out_avals):]]
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
                 optimizer_state_leaves: Sequence[int] = (),
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
    for flat in optimizer_state_leaves:
      if flat in position:
        marks.setdefault(position[flat], []).append(
            contract.attribute("optimizer_state"))
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


def _rewritten_signature(module: ir.Module, context: ir.Context,
                         marked: Marked, exported: Any) -> tuple:
  """What the rewritten `module`'s main takes and returns: the roles and
  owners of what the passes appended (`_appended_roles`), the input and
  output avals, and `exported` rewritten to it (None when not exporting).
  RewriteError when main's arity is not the lowered one's plus what was
  appended."""
  kept, out_tree = marked.kept, marked.out_tree
  with context:
    roles = _appended_roles(module, len(kept), out_tree.num_leaves, kept)
    extra_in, extra_out = len(roles[0]), len(roles[1])
    inputs, results = main_signature(module)
    in_avals = tuple(aval_of_type(t) for t in inputs)
    all_out_avals = tuple(aval_of_type(t) for t in results)
    if exported is not None:
      exported = _flat_exported(exported, module, extra_in, extra_out)
      in_avals, all_out_avals = exported.in_avals, exported.out_avals
    elif (len(inputs) != len(kept) + extra_in or
          len(results) != out_tree.num_leaves + extra_out):
      raise pl.RewriteError("the rewritten module has an unexpected number "
                            "of arguments or results")
  return roles, in_avals, all_out_avals, exported


def build(jitted: Callable, export_args: Sequence, export_kwargs: dict, *,
          param_flags: Sequence[bool], policy: Policy,
          options: pl.RewriteOptions, source_name: str,
          seed_leaf: int | None = None,
          state_leaves: Sequence[tuple[int, int]] = (),
          optimizer_state_leaves: Sequence[int] = (),
          loss_scale: Any = None, use_export: bool = False,
          marked: Marked | None = None) -> Program:
  """Lowers `jitted`, rewrites it and returns the flat-called program.

  `param_flags[i]` says whether flat input leaf i takes the `p=` dtype;
  `seed_leaf` is the flat input leaf holding the loss cotangent seed;
  `state_leaves` pairs (flat output leaf, flat input leaf) whose new value
  has the input's dtype and is kept only if the gradients are finite;
  `optimizer_state_leaves` are the flat input leaves of optimizer state
  (`amp-round-state` may store them in a lower precision);
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
                          state_leaves=state_leaves,
                          optimizer_state_leaves=optimizer_state_leaves,
                          use_export=use_export)
  started = time.perf_counter()
  context = pl.ir_context()
  kept, out_tree, exported = marked.kept, marked.out_tree, marked.exported
  result = pl.rewrite_module(
      marked.module, policy, options, context=context, source_name=source_name,
      loss_scale=loss_scale.pass_options() if loss_scale else None)
  for diagnostic in result.diagnostics:
    warnings.warn(f"stablehlo-amp: {diagnostic}", stacklevel=4)
  roles, in_avals, all_out_avals, exported = _rewritten_signature(
      result.module, context, marked, exported)
  in_roles, out_roles, in_owners, out_owners = roles
  extra_out = len(out_roles)
  # Typed keys come out of `call` as keys, out of the module as data.
  key_avals, module_out_avals = (), ()
  if exported is None and any(a is not None for a in marked.out_key_avals):
    key_avals, module_out_avals = marked.out_key_avals, all_out_avals
    all_out_avals = tuple(
        key if key is not None else aval for key, aval in
        zip(key_avals + (None,) * (len(all_out_avals) - len(key_avals)),
            all_out_avals))
  # The form the lowering reads, made now: its cost is the rewrite's.
  bytecode = None if exported else jax_compat.bytecode_of(result.module)
  leaves = jax.tree_util.tree_leaves((export_args, export_kwargs))
  same = dict(param_flags=param_flags, policy=policy, options=options,
              source_name=source_name, seed_leaf=seed_leaf,
              state_leaves=state_leaves,
              optimizer_state_leaves=optimizer_state_leaves,
              loss_scale=loss_scale)
  batched = (_batched_builder(jitted, export_args, export_kwargs, same)
             if exported is None else None)
  partitioned = (_partitioned_builder(jitted, export_args, export_kwargs,
                                      marked, same)
                 if _depends_on_partitions(result, bytecode) else None)
  done = time.perf_counter()
  return Program(result.module, result,
                 Timings(lower=marked.lower_seconds, rewrite=done - started),
                 in_avals, all_out_avals, extra_out, out_tree,
                 name=source_name, exported=exported, bytecode=bytecode,
                 kept=None if exported else tuple(kept),
                 extra_in_roles=in_roles, extra_out_roles=out_roles,
                 extra_in_owners=in_owners, extra_out_owners=out_owners,
                 host_callbacks=marked.host_callbacks,
                 indexed_callbacks=marked.indexed_callbacks,
                 out_key_avals=key_avals,
                 module_out_avals=module_out_avals,
                 leaf_avals=tuple(jax_compat.aval_of(x) for x in leaves),
                 batched=batched, partitioned=partitioned)


def _depends_on_partitions(result: pl.RewriteResult,
                           bytecode: bytes | None) -> bool:
  """Whether a lowering over several partitions needs the program
  rewritten for that count: it holds the MXFP8 composite XLA cannot
  partition, or a decision the pass takes by the partition count."""
  return bytecode is not None and (
      contract.attribute("scaled_dot_composite").encode() in bytecode or
      result.partition_dependent)


def _partitioned_builder(jitted: Callable, export_args: Sequence,
                         export_kwargs: dict, marked: Marked,
                         build_options: dict) -> Callable[[int], Program]:
  """Builds, once per partition count, the program rewritten from the same
  marked module declared split into that many partitions
  (`mhlo.num_partitions`): the passes then write only what XLA's SPMD
  partitioner can split (amp-fp8-gemms: MXFP8 dequantized, not the
  composite), and make in bf16 the normalisation terms it moves between
  devices (amp-insert-converts, reason `partitioned_norm_term`)."""
  programs: dict[int, Program] = {}

  def make(count: int) -> Program:
    if count not in programs:
      module = jax_compat.with_partition_count(marked.module, count)
      programs[count] = build(jitted, export_args, export_kwargs,
                              **build_options,
                              marked=dataclasses.replace(marked,
                                                         module=module))
    return programs[count]

  return make


def _batched_builder(jitted: Callable, export_args: Sequence,
                     export_kwargs: dict, build_options: dict
                     ) -> Callable[[tuple, int], Program]:
  """Builds, once per batching, the program of `jitted` vmapped along
  axis 0 of the flat input leaves whose dim is 0 (a batch of `size`; the
  others unbatched), with the same marks, on flat leaves and outputs."""
  programs: dict[tuple, Program] = {}

  def make(dims: tuple[int | None, ...], size: int) -> Program:
    if (dims, size) not in programs:
      specs, treedef = jax.tree_util.tree_flatten((export_args,
                                                   export_kwargs))
      specs = [spec if d is None else jax.ShapeDtypeStruct(
          (size, *spec.shape), spec.dtype) for spec, d in zip(specs, dims)]

      def flat(*leaves):
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return jax.tree_util.tree_leaves(jitted(*args, **kwargs))

      batched = jax.vmap(flat, in_axes=dims, out_axes=0)
      programs[dims, size] = build(jax.jit(batched), specs, {},
                                   **build_options)
    return programs[dims, size]

  return make


# -- signatures: what every entry point does with its arguments -------------
#
# `amp.transform`, `amp.train_step` and `amp.value_and_grad` all flatten their
# arguments to leaves, give the parameter leaves f32 specs (the pass gives
# them the `p=` dtype), key a program by the leaves' avals, build it with
# `build` and call it with `Program.call`; they differ only in which leaves
# are parameters and what the program computes.

def as_tuple(value: int | str | Iterable | None, what: str = "") -> tuple:
  if value is None:
    return ()
  if isinstance(value, (int, str)):
    return (value,)
  try:
    return tuple(value)
  except TypeError:
    raise TypeError(f"{what or 'the value'} must be an argument position "
                    "(int), name (str) or a sequence of them, got "
                    f"{value!r} ({type(value).__name__})") from None


def is_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def is_f32(x: Any) -> bool:
  return hasattr(x, "dtype") and jax_compat.dtype_of(x) == jnp.float32


def function_name(fun: Callable) -> str:
  return getattr(fun, "__qualname__", None) or getattr(fun, "__name__", "fun")


def aval_key(avals: Sequence[Any]) -> Hashable:
  # str, not np.dtype: a typed PRNG key's dtype is no NumPy dtype.
  return tuple((tuple(a.shape), str(a.dtype),
                bool(getattr(a, "weak_type", False))) for a in avals)




def export_specs(avals: Sequence[Any], param_flags: Sequence[bool],
                 shardings: Sequence[Any] | None = None) -> list:
  """The `jax.ShapeDtypeStruct` each leaf is lowered with: parameter leaves
  as f32 (the pass gives them the `p=` dtype), the others as they are, with
  their weak type and the sharding asked for."""
  shardings = shardings or [None] * len(avals)
  return [jax.ShapeDtypeStruct(
      tuple(jnp.shape(a)), jnp.float32 if flag else jax_compat.dtype_of(a),
      weak_type=bool(getattr(a, "weak_type", False)), sharding=sharding)
          for a, flag, sharding in zip(avals, param_flags, shardings)]


def signature_key(tree: Any) -> Hashable:
  """The program cache key of a pytree of arguments: its structure and the
  avals of its leaves."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, aval_key([jax_compat.aval_of(x) for x in leaves])


def leaf_shardings(prefix: Any, tree: Any) -> list:
  """A sharding per leaf of `tree`, from a pytree prefix of it (as
  `jax.jit`'s in_shardings/out_shardings take them)."""
  if prefix is None:
    return [None] * len(jax.tree_util.tree_leaves(tree))
  per_subtree = jax.tree_util.tree_map(
      lambda sharding, subtree: [sharding] * len(
          jax.tree_util.tree_leaves(subtree)),
      prefix, tree, is_leaf=lambda x: x is None)
  return [s for group in jax.tree_util.tree_leaves(
      per_subtree, is_leaf=lambda x: isinstance(x, list)) for s in group]


class Arguments:
  """Which arguments of `fun` a set of numbers and names selects, whether they
  are passed by position or by keyword (as `jax.jit` resolves them).
  Negative numbers count from the end of the positional parameters."""

  def __init__(self, fun: Callable, nums: Iterable[int], names: Iterable[str]):
    parameters = _parameters(fun)
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword_ok = {p.name for p in parameters
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    nums = {n + len(positional) if n < 0 and positional else n for n in nums}
    names = set(names)
    nums |= {positional.index(n) for n in names if n in positional}
    names |= {positional[i] for i in nums
              if 0 <= i < len(positional) and positional[i] in keyword_ok}
    self.nums, self.names = tuple(sorted(nums)), tuple(sorted(names))

  def __contains__(self, key: int | str) -> bool:
    return key in (self.nums if isinstance(key, int) else self.names)


def _parameters(fun: Callable) -> list[inspect.Parameter]:
  try:
    return list(inspect.signature(fun).parameters.values())
  except (TypeError, ValueError):
    return []


def check_params(fun: Callable, params: tuple) -> None:
  """Names in `params=` must name arguments; ValueError lists the nearest."""
  for entry in params:
    if isinstance(entry, bool) or not isinstance(entry, (int, str)):
      raise TypeError(f"params must name arguments by position (int) or name "
                      f"(str), got {entry!r} ({type(entry).__name__})")
  parameters = _parameters(fun)
  if not parameters or any(p.kind == p.VAR_KEYWORD for p in parameters):
    return
  accepted = [p.name for p in parameters if p.kind != p.VAR_POSITIONAL]
  for name in params:
    if isinstance(name, str) and name not in accepted:
      nearest = difflib.get_close_matches(name, accepted, n=3, cutoff=0) or \
          accepted
      raise ValueError(f"params names {name!r}, which is not an argument of "
                       f"{function_name(fun)} (nearest: {', '.join(nearest)})")
  positional = [p for p in parameters if p.kind in (
      p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  if any(p.kind == p.VAR_POSITIONAL for p in parameters):
    return
  for index in params:
    if isinstance(index, int) and not -len(positional) <= index < len(
        positional):
      raise ValueError(f"params names argument {index}, but "
                       f"{function_name(fun)} takes {len(positional)} "
                       "positional arguments")


class CallSignature:
  """A call of `fun` as `jax.jit` sees it: the static arguments (by position
  or name) split off into a hashable key, the dynamic ones flattened to
  leaves; which leaves are parameters (`params`: the selected arguments,
  or every argument when None); and the flat function of those leaves a
  program is built from."""

  def __init__(self, fun: Callable, static: Arguments,
               params: Arguments | None = None):
    self.fun = fun
    self.static = static
    self.params = params

  def split(self, args: Sequence, kwargs: dict) -> tuple[list, dict, tuple]:
    """(dynamic args, dynamic kwargs, static values as a hashable)."""
    static = self.static
    dynamic_args = [a for i, a in enumerate(args) if i not in static]
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in static}
    statics = (tuple((i, a) for i, a in enumerate(args) if i in static),
               tuple(sorted((k, v) for k, v in kwargs.items()
                            if k in static)))
    return dynamic_args, dynamic_kwargs, statics

  def flatten(self, args: Sequence, kwargs: dict) -> tuple[list, Hashable]:
    """The dynamic leaves and the key of the call's structure (the pytree
    structure of the dynamic arguments and the static values)."""
    dynamic_args, dynamic_kwargs, statics = self.split(args, kwargs)
    leaves, treedef = jax.tree_util.tree_flatten((dynamic_args,
                                                  dynamic_kwargs))
    return leaves, (treedef, statics)

  def param_mask(self, args: Sequence, kwargs: dict) -> list[bool]:
    """Per dynamic leaf: is it in an argument `params` selects?"""
    chosen = self.params

    def mask(tree, selected: bool):
      return jax.tree_util.tree_map(lambda _: selected, tree)
    args_mask = [mask(a, chosen is None or i in chosen)
                 for i, a in enumerate(args) if i not in self.static]
    kwargs_mask = {k: mask(v, chosen is None or k in chosen)
                   for k, v in kwargs.items() if k not in self.static}
    return jax.tree_util.tree_leaves((args_mask, kwargs_mask))

  def in_shardings(self, prefix: Any, args: Sequence,
                   kwargs: dict) -> list | None:
    """A sharding per dynamic leaf from `jax.jit`'s in_shardings (a prefix
    of the positional arguments; keyword arguments get none)."""
    if prefix is None:
      return None
    dynamic_args, dynamic_kwargs, _ = self.split(args, kwargs)
    prefix = tuple(prefix) if isinstance(prefix, list) else prefix
    return (leaf_shardings(prefix, tuple(dynamic_args)) +
            [None] * len(jax.tree_util.tree_leaves(dynamic_kwargs)))

  def flat_function(self, key: Hashable) -> tuple[Callable, list]:
    """The function of the dynamic leaves of calls with this `key`, and a
    list that holds the pytree structure of its outputs once traced."""
    treedef, (static_args, static_kwargs) = key
    static_args, static_kwargs = dict(static_args), dict(static_kwargs)
    out_trees: list = []
    fun = self.fun

    def flat_fun(*flat_leaves):
      dynamic_args, dynamic_kwargs = jax.tree_util.tree_unflatten(
          treedef, flat_leaves)
      dynamic = iter(dynamic_args)
      count = len(dynamic_args) + len(static_args)
      call_args = [static_args[i] if i in static_args else next(dynamic)
                   for i in range(count)]
      outputs = fun(*call_args, **dynamic_kwargs, **static_kwargs)
      out_leaves, out_tree = jax.tree_util.tree_flatten(outputs)
      out_trees[:] = [out_tree]
      return out_leaves
    return flat_fun, out_trees


# -- running: the jit around a program, and what `lower` returns -------------


def outer_compiler_options(options: pl.RewriteOptions) -> dict:
  """Compiler options for the jit that runs rewritten programs: on XLA:CPU
  with low-precision storage, the fusion choice that keeps stored values in
  their low-precision dtype (jax_compat.cpu_storage_compiler_options)."""
  if (options.target != contract.values("target").cpu or
      options.storage == contract.values("storage").f32 or
      jax.default_backend() != "cpu"):
    return {}
  compiler_options = jax_compat.cpu_storage_compiler_options()
  return {"compiler_options": compiler_options} if compiler_options else {}


class OuterJit:
  """The jit that runs a rewritten program: called at the top level it
  compiles with `outer_compiler_options` and donates what it was asked to;
  called inside another trace (the user's jit, grad or vmap), where
  compiler options are not allowed, as a plain nested jit that donates
  nothing: under `jax.grad` the backward pass reads the arguments again
  (a donated one would be deleted), and inside a jit donation has no
  meaning."""

  def __init__(self, fun: Callable, options: pl.RewriteOptions, *,
               donate_argnums: tuple = (), donate_argnames: tuple = (),
               **jit_options):
    self._plain = jax.jit(fun, **jit_options)
    compiler_options = outer_compiler_options(options)
    donate = {}
    if donate_argnums:
      donate["donate_argnums"] = donate_argnums
    if donate_argnames:
      donate["donate_argnames"] = donate_argnames
    self._top = (jax.jit(fun, **jit_options, **donate, **compiler_options)
                 if compiler_options or donate else self._plain)
    self._target = options.target

  def __call__(self, *args, **kwargs):
    here = pl.default_target()
    if self._top is self._plain and self._target == here:
      return self._plain(*args, **kwargs)  # nothing to choose
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    nested = any(isinstance(x, jax.core.Tracer) for x in leaves)
    call = self._plain if nested else self._top
    if nested or self._target == here:
      return call(*args, **kwargs)
    try:  # waits: the failure would otherwise surface when read
      return jax.block_until_ready(call(*args, **kwargs))
    except jax.errors.JaxRuntimeError as error:
      # A program rewritten for another backend may hold what this one
      # cannot run (a gpu rewrite's bf16 x bf16 = f32 dots on XLA:CPU).
      raise RuntimeError(
          f"this program was rewritten for target={self._target!r} and "
          f"failed running on {here}: {str(error).splitlines()[0]}. A "
          f"program for {self._target} may hold what {here} cannot run: "
          f"build it with target={here!r} (the default here) to run it "
          "here") from error

  def lower(self, *args, **kwargs):
    return self._top.lower(*args, **kwargs)


class Lowered:
  """A rewritten function lowered for one signature, before compilation."""

  def __init__(self, jax_lowered: Any, program: Program | None,
               calibration: Any = None, fp8_fallbacks: tuple[str, ...] = ()):
    self._jax_lowered = jax_lowered
    self._fp8_fallbacks = fp8_fallbacks  # what fp8_fallback moved, if set
    # The program the lowering inlined (for a partitioned one, maybe the
    # partitioned rewrite).
    self._program = program.as_lowered() if program is not None else None
    self.calibration = calibration  # what calibration kept, if it ran
    self._compiled = None

  def as_text(self, debug_info: bool = False) -> str:
    """The rewritten module, pretty StableHLO (the original one if the
    rewrite fell back)."""
    if self._program is None:
      return jax_compat.lowered_text(self._jax_lowered, debug_info)
    return self._program.result.text("pretty", debug_info)

  def report(self) -> Report | None:
    """What was lowered, kept f32 and why, and what is stored low (with
    XLA's memory figures once `compile()` ran); None if the rewrite fell
    back. Built on first call."""
    if self._program is None:
      return None
    report = self._program.result.report
    if self._fp8_fallbacks and report is not None:
      report = dataclasses.replace(report, fp8_fallbacks=self._fp8_fallbacks)
    if self._compiled is not None and report is not None:
      memory = self._compiled.memory_analysis()
      if memory is not None:
        report = report.with_memory({
            "arguments": memory.argument_size_in_bytes,
            "outputs": memory.output_size_in_bytes,
            "aliased": memory.alias_size_in_bytes,
            "temporaries": memory.temp_size_in_bytes})
      try:
        report = report.with_compiled(self._compiled.as_text())
      except ValueError as error:  # XLA printed what hlo.py cannot read
        warnings.warn("stablehlo-amp: cannot read XLA's optimized program "
                      f"to check what it kept of the decisions ({error}); "
                      "the executable itself is fine", stacklevel=3)
    return report

  @property
  def timings(self) -> Timings:
    """Seconds spent exporting and rewriting (XLA compile: time `compile`)."""
    return self._program.timings if self._program else Timings()

  def compile(self, compiler_options: dict | None = None) -> Any:
    """The XLA executable (`memory_analysis()`, `as_text()`, ...).

    A stored value whose rounding XLA dropped, or an FP8 dot it ran on
    wider operands, is a warning: the memory or speed it was for is lost
    (the report lists every decision's fate; a rounding XLA fused into
    its readers is listed there, not warned about: nothing is stored
    then, in either precision)."""
    if self._compiled is None:
      self._compiled = self._jax_lowered.compile(
          **({"compiler_options": compiler_options}
             if compiler_options else {}))
      report = self.report()
      lost = (report.lost_in_xla(fused_away=False) if report is not None
              else [])
      if lost:
        warnings.warn(f"stablehlo-amp: XLA did not keep {len(lost)} "
                      "decision(s): " + "; ".join(lost[:3]) +
                      (" ..." if len(lost) > 3 else "") +
                      " (Lowered.report() lists them all)", stacklevel=2)
    return self._compiled


