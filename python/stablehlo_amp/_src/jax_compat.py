"""Everything stablehlo-amp needs from JAX beyond its public API, in one place.

The rest of the package uses public API only: `jax.export`,
`jax.jit(...).lower(...)`, `jax.extend`, `jax.interpreters.{ad,batching,mlir}`
and `jax.tree_util`. What remains private is here, with the JAX versions it
was checked against, so that a new JAX release breaks one small module with a
clear error instead of the whole package.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import export as jax_export
from jax.extend.mlir import ir

from stablehlo_amp._src import contract

# The JAX releases stablehlo-amp supports, as pyproject.toml declares them (a
# test checks they agree). `make test-jax-range` runs the driver, training and
# CLI tests at both ends (the newest, jax 0.11 and later, on Python >= 3.12).
# jax 0.4.35 fails one of them (f16 training without loss scaling still
# updates the parameters); before 0.4.30 there is no jax.export.
SUPPORTED = ">=0.4.36,<0.13"


class UnsupportedJaxError(ImportError):
  """This JAX release is outside the supported range."""


def _version(text: str) -> tuple[int, int, int]:
  parts = [int(part) for part in re.findall(r"\d+", text)[:3]]
  return tuple(parts + [0] * (3 - len(parts)))  # "0.13" is 0.13.0


_MINIMUM = _version(re.search(r">=([\d.]+)", SUPPORTED).group(1))
_LIMIT = _version(re.search(r"<([\d.]+)", SUPPORTED).group(1))


def check_version(version: str | None = None) -> None:
  """Raises UnsupportedJaxError naming the supported range."""
  version = version or jax.__version__
  if not _MINIMUM <= _version(version) < _LIMIT:
    raise UnsupportedJaxError(
        f"stablehlo-amp supports jax {SUPPORTED}; this is jax {version}. "
        f"Install a supported release, e.g. pip install 'jax{SUPPORTED}'.")


check_version()
_JAX = _version(jax.__version__)


# -- MLIR contexts and portable artifacts ------------------------------------


def make_ir_context() -> ir.Context:
  """A context with every dialect JAX emits (StableHLO, CHLO, Shardy, MHLO)."""
  from jax.interpreters import mlir as jax_mlir
  return jax_mlir.make_ir_context()


def _jaxlib_mlir():
  # The jaxlib extension's MLIR helpers, under this name in every release.
  from jax._src.export import _export
  return _export.xla_client._xla.mlir


def deserialize_portable_artifact(data: bytes) -> ir.Module:
  """A StableHLO module from a portable artifact (VHLO bytecode), in the
  current context (jaxlib < 0.10 returns text)."""
  module = _jaxlib_mlir().deserialize_portable_artifact(data)
  if isinstance(module, ir.Module):
    return module
  return ir.Module.parse(module)


def serialize_portable_artifact(module: ir.Module, target: str) -> bytes:
  """A portable artifact of `module` for StableHLO version `target`."""
  data = bytecode_of(module)
  return _jaxlib_mlir().serialize_portable_artifact(data, target)


def bytecode_of(module: ir.Module) -> bytes:
  """`module` as MLIR bytecode (not a portable artifact: for this jaxlib)."""
  import io
  buffer = io.BytesIO()
  module.operation.write_bytecode(buffer)
  return buffer.getvalue()


def portable_artifact_version(data: bytes) -> str | None:
  """The StableHLO version a portable artifact was written for
  ("1.10.3"), read from its producer string; None if `data` is not one."""
  match = re.match(rb"ML\xefR.{0,8}?StableHLO_v(\d+\.\d+\.\d+)", data[:64],
                   re.S)
  return match.group(1).decode() if match else None


def current_stablehlo_version() -> str:
  from jax._src.lib.mlir.dialects import hlo
  return hlo.get_current_version()


# -- Exported -------------------------------------------------------------------


def _to_bytecode(module: ir.Module) -> bytes:
  from jax._src.export import _export
  parameters = inspect.signature(_export._module_to_bytecode).parameters
  if "shardy_enabled" in parameters:  # jax 0.5.3 .. 0.6.1
    return _export._module_to_bytecode(
        module, jax.config.jax_use_shardy_partitioner)
  return _export._module_to_bytecode(module)


def _without_unit_attrs(module: ir.Module) -> ir.Module:
  """A copy without unit attributes (jaxlib < 0.7 cannot write them into a
  portable artifact; the ones we set are markers the passes consumed or
  labels the loss-scale pass put on what it appended)."""
  copy = ir.Module.parse(module.operation.get_asm(enable_debug_info=True),
                         module.context)

  def strip(op) -> None:
    op = op.operation
    for name in ("arg_attrs", "res_attrs"):
      if op.name == "func.func" and name in op.attributes:
        dicts = [ir.DictAttr(d) for d in ir.ArrayAttr(op.attributes[name])]
        op.attributes[name] = ir.ArrayAttr.get([ir.DictAttr.get(
            {d[j].name: d[j].attr for j in range(len(d))
             if not ir.UnitAttr.isinstance(d[j].attr)}) for d in dicts])
    for name in [a.name for a in op.attributes
                 if ir.UnitAttr.isinstance(a.attr)]:
      del op.attributes[name]
    for region in op.regions:
      for block in region.blocks:
        for child in block.operations:
          strip(child)

  for op in copy.body.operations:
    strip(op)
  return copy


def module_bytes(module: ir.Module) -> bytes:
  """`module` serialized the way `jax.export` serializes its modules."""
  if _JAX >= (0, 7, 0):
    return _to_bytecode(module)
  with module.context:
    return _to_bytecode(_without_unit_attrs(module))


def exported_module(exported: jax_export.Exported) -> ir.Module:
  """The StableHLO module of an `Exported`, in the current context."""
  return deserialize_portable_artifact(exported.mlir_module_serialized)


def replace_exported(exported: jax_export.Exported, module: ir.Module, *,
                     in_avals: Sequence[Any], out_avals: Sequence[Any],
                     kept_var_idx: Sequence[int], extra_in: int,
                     extra_out: int) -> jax_export.Exported:
  """`exported` with a rewritten module, flat trees, new avals and
  `extra_in`/`extra_out` appended arguments and results (no sharding).

  `Exported` has no public constructor that takes a module: its sharding
  fields and its VJP are private. The rewritten module's VJP is not the
  original's, so it is dropped (stablehlo-amp differentiates through its own
  rules)."""
  no_in, no_out = (None,) * extra_in, (None,) * extra_out
  fields = dict(
      in_tree=jax.tree_util.tree_structure((tuple(in_avals), {})),
      out_tree=jax.tree_util.tree_structure(tuple(out_avals)),
      in_avals=tuple(in_avals), out_avals=tuple(out_avals),
      in_shardings_hlo=tuple(exported.in_shardings_hlo) + no_in,
      out_shardings_hlo=tuple(exported.out_shardings_hlo) + no_out,
      module_kept_var_idx=tuple(kept_var_idx),
      mlir_module_serialized=module_bytes(module),
      _get_vjp=None,
      # jax >= 0.9: named shardings beside the HLO ones.
      _in_named_shardings=tuple(getattr(exported, "_in_named_shardings",
                                        ())) + no_in,
      _out_named_shardings=tuple(getattr(exported, "_out_named_shardings",
                                         ())) + no_out)
  names = {f.name for f in dataclasses.fields(exported)}
  return dataclasses.replace(
      exported, **{k: v for k, v in fields.items() if k in names})


# -- jax.jit -------------------------------------------------------------------


def jit_options(fun: Callable) -> dict[str, tuple]:
  """static/donate argnums and argnames of a `jax.jit`-wrapped function
  (empty for anything else)."""
  info = getattr(fun, "_jit_info", None)  # jax >= 0.6
  if info is None:
    info = _jit_info_from_closure(fun)
  if info is None:
    return {}
  return {name: tuple(getattr(info, name, ()) or ())
          for name in ("static_argnums", "static_argnames", "donate_argnums",
                       "donate_argnames")}


def _jit_info_from_closure(fun: Callable) -> Any:
  """jax < 0.6 keeps a jit's PjitInfo only in its cache-miss closure."""
  cache_miss = getattr(fun, "_cache_miss", None)
  if cache_miss is None:
    return None
  for cell in inspect.unwrap(cache_miss).__closure__ or ():
    try:
      contents = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    if hasattr(contents, "static_argnums") and hasattr(contents,
                                                        "donate_argnums"):
      return contents
  return None


def unwrap_jit(fun: Callable) -> Callable:
  """The Python function a `jax.jit` object wraps (or `fun` itself)."""
  return getattr(fun, "_fun", None) or getattr(fun, "__wrapped__", fun)


def lowered_text(lowered: Any, debug_info: bool = False) -> str:
  """`jax.stages.Lowered.as_text(debug_info=...)`; before jax 0.5 `as_text`
  takes no `debug_info` (and prints locations as the config says), so the
  module is printed here the same way."""
  if "debug_info" in inspect.signature(lowered.as_text).parameters:
    return lowered.as_text(debug_info=debug_info)
  return lowered.compiler_ir("stablehlo").operation.get_asm(
      enable_debug_info=debug_info)


@functools.cache
def primitive_class() -> type:
  """`jax.extend.core.Primitive` (jax.core.Primitive before it moved)."""
  try:
    from jax.extend.core import Primitive
  except ImportError:  # jax < 0.4.36
    from jax.core import Primitive  # type: ignore
  return Primitive


def shaped_array(shape: tuple, dtype: Any, weak_type: bool = False) -> Any:
  """`jax.core.ShapedArray`, the abstract value of an array."""
  return jax.core.ShapedArray(shape, dtype, weak_type=weak_type)


def ffi_call(target: str, result_shapes: Sequence[Any]) -> Callable:
  """A side-effect-free call of the custom call `target`."""
  ffi = getattr(jax, "ffi", None)
  if ffi is None:  # jax < 0.5
    from jax.extend import ffi  # type: ignore
  # Under jax.vmap it is one call on the batched operands (the loss-scale
  # pass reads it as a marker, whatever the shapes).
  return ffi.ffi_call(target, result_shapes, has_side_effect=False,
                      vmap_method="broadcast_all")


def aval_of(x: Any) -> Any:
  """The abstract value of an array, tracer, Python scalar or
  `jax.ShapeDtypeStruct`."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return shaped_array(tuple(x.shape), x.dtype,
                        bool(getattr(x, "weak_type", False)))
  typeof = getattr(jax, "typeof", None)
  if typeof is not None:
    return typeof(x)
  return jax.core.get_aval(x)  # type: ignore


def zero_tangent(primal: Any) -> Any:
  """A symbolic zero tangent for `primal` (float0 for integers)."""
  from jax.interpreters import ad
  if hasattr(ad.Zero, "from_primal_value"):
    return ad.Zero.from_primal_value(primal)
  return ad.Zero(aval_of(primal).to_tangent_aval())  # type: ignore


# The custom calls that run Python. The FFI ones name their callback by its
# index in the lowering's host-callback list (`mhlo.backend_config`'s
# `index`); the older ones (jax 0.4.x) take a descriptor operand that stays
# valid while the callback object lives.
HOST_CALLBACK_TARGETS = ("xla_python_cpu_callback", "xla_python_gpu_callback",
                         "xla_ffi_python_cpu_callback",
                         "xla_ffi_python_gpu_callback",
                         "xla_ffi_partitioned_python_cpu_callback",
                         "xla_ffi_partitioned_python_gpu_callback")


def host_callbacks(lowered: Any) -> tuple[tuple[Any, ...], int] | None:
  """The host callbacks (debug prints, io/pure callbacks) a
  `jax.jit(...).lower(...)` registered, in index order, then what it keeps
  alive for them, and how many of them the module's calls index; None
  where this JAX does not say."""
  compile_args = getattr(getattr(lowered, "_lowering", None), "compile_args",
                         None)
  if compile_args is None or "host_callbacks" not in compile_args:
    return None
  indexed = tuple(compile_args["host_callbacks"])
  return indexed + tuple(compile_args.get("keepalive") or ()), len(indexed)


def _operations(block_owner: Any):
  for region in block_owner.regions:
    for block in region.blocks:
      for op in block.operations:
        yield op
        yield from _operations(op.operation)


def _move_host_callbacks(module_context: Any, submodule: ir.Module,
                         callbacks: Sequence[Any], count: int) -> None:
  """Registers the first `count` of `callbacks` (the ones indexed by the
  submodule's callback calls; the rest only kept alive) with the lowering
  that inlines the submodule, and renumbers the FFI calls' indices."""
  first = len(module_context.host_callbacks)
  for callback in callbacks:
    module_context.add_host_callback(callback)
  u64 = ir.IntegerType.get_unsigned(64)
  for op in _operations(submodule.operation):
    if op.operation.name != "stablehlo.custom_call":
      continue
    target = ir.StringAttr(op.attributes["call_target_name"]).value
    if (target not in HOST_CALLBACK_TARGETS or
        "mhlo.backend_config" not in op.attributes):
      continue
    config = op.attributes["mhlo.backend_config"]
    if not isinstance(config, ir.DictAttr) and not ir.DictAttr.isinstance(
        config):
      continue
    config = ir.DictAttr(config)
    entries = {config[i].name: config[i].attr for i in range(len(config))}
    if "index" in entries:
      index = ir.IntegerAttr(entries["index"]).value
      if not 0 <= index < count:
        raise ValueError(f"host callback index {index} outside the "
                         f"{count} callbacks of the program")
      entries["index"] = ir.IntegerAttr.get(u64, first + index)
      op.attributes["mhlo.backend_config"] = ir.DictAttr.get(entries)


def call_module(ctx: Any, bytecode: bytes, name: str,
                args: Sequence[Any],
                callbacks: tuple[Sequence[Any], int] = ((), 0)) -> list:
  """Lowering rule body: `bytecode`'s public `main` (MLIR bytecode of a
  module for this jaxlib) merged into the module being lowered as a private
  function named after `name`, and called on `args`. `callbacks` are the
  host callbacks the module calls (and how many of them it indexes):
  they move to the lowering that inlines it."""
  from jax.extend.mlir.dialects import func as func_dialect
  from jax.interpreters import mlir as jax_mlir
  module_context = ctx.module_context
  submodule = ir.Module.parse(bytecode, module_context.context)
  if callbacks[0]:
    _move_host_callbacks(module_context, submodule, *callbacks)
  main = next(op for op in submodule.body.operations
              if ir.StringAttr(op.attributes["sym_name"]).value == "main")
  callee_type = ir.FunctionType(ir.TypeAttr(main.attributes[
      "function_type"]).value)
  merge = jax_mlir.merge_mlir_modules
  symbol = re.sub(r"[^A-Za-z0-9_]", "_", f"amp_{name}")
  if "dst_symtab" in inspect.signature(merge).parameters:
    fn = merge(module_context.module, symbol, submodule,
               dst_symtab=module_context.symbol_table)
  else:
    fn = merge(module_context.module, symbol, submodule)
  call = func_dialect.CallOp(list(callee_type.results),
                             ir.FlatSymbolRefAttr.get(fn), list(args))
  return list(call.results)


def dtype_of(x: Any) -> Any:
  """The dtype of an array, tracer, ShapeDtypeStruct or Python scalar, typed
  PRNG keys (`key<fry>`, which NumPy cannot interpret) included."""
  dtype = getattr(x, "dtype", None)
  return jnp.result_type(x) if dtype is None else dtype


def is_key(x: Any) -> bool:
  """True for a typed PRNG key (`jax.random.key`)."""
  return jax.dtypes.issubdtype(dtype_of(x), jax.dtypes.prng_key)


def key_data(x: Any) -> Any:
  """A typed key's raw uint32 data (what its lowered program takes); other
  leaves as they are."""
  return jax.random.key_data(x) if is_key(x) else x


def key_aval(x: Any) -> Any:
  """The aval of a typed key (array, tracer or shape); None for anything
  else."""
  if not is_key(x):
    return None
  return shaped_array(tuple(x.shape), dtype_of(x))


def wrap_key(data: Any, aval: Any) -> Any:
  """`data` as the typed key `aval` describes (None: `data` as it is)."""
  if aval is None:
    return data
  # The dtype of a typed key holds its PRNG implementation.
  return jax.random.wrap_key_data(data, impl=aval.dtype._impl)


def kept_arguments(lowered: Any, count: int) -> tuple[int, ...]:
  """The flat arguments `jax.jit(...).lower(...)` kept in its module (it
  drops unused ones, and dead code with them)."""
  compile_args = getattr(getattr(lowered, "_lowering", None), "compile_args",
                         None) or {}
  kept = compile_args.get("kept_var_idx")
  if kept is None:
    return tuple(range(count))
  return tuple(sorted(kept))


# XLA:CPU puts only dots in its YNNPACK library fusions with this option, so
# the converts around a value stored in bf16 fuse into its readers and XLA
# keeps the bf16 buffer (bench/peak.py: LM layer norm 54 -> 32 MiB, softmax
# 44 -> 20 MiB); the default fuses elementwise readers into YNN fusions that
# read f32, and XLA then keeps an f32 copy. Experimental in XLA, so probed.
_CPU_STORAGE_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type":
        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


@functools.cache
def cpu_storage_compiler_options() -> dict:
  """The XLA:CPU compiler options for low-precision storage, if this jaxlib
  knows them and `jax.jit` takes compiler options; else {}."""
  if "compiler_options" not in inspect.signature(jax.jit).parameters:
    return {}
  try:
    jax.jit(lambda x: x + 1, compiler_options=_CPU_STORAGE_OPTIONS).lower(
        jax.ShapeDtypeStruct((2,), "float32")).compile()
  except Exception:  # an XLA without the option rejects it  # noqa: BLE001
    return {}
  return dict(_CPU_STORAGE_OPTIONS)


def partition_count(ctx: Any) -> int:
  """How many partitions the lowering of `ctx` (a lowering rule's context)
  is for: the devices of its sharded jit (`ShardingContext`) or of its
  shard_map mesh, 1 for an unsharded one."""
  axis_context = ctx.module_context.axis_context
  count = getattr(axis_context, "num_devices", None)
  if count is None:
    mesh = getattr(axis_context, "mesh", None)
    count = getattr(mesh, "size", 1) if mesh is not None else 1
  return int(count)


def with_partition_count(module: ir.Module, count: int) -> ir.Module:
  """A copy of `module` declaring that XLA's SPMD partitioner splits it
  into `count` partitions (`mhlo.num_partitions`, as JAX writes it for a
  sharded jit)."""
  with module.context:
    copy = ir.Module.parse(bytecode_of(module))
    copy.operation.attributes[contract.attribute("num_partitions")] = (
        ir.IntegerAttr.get(ir.IntegerType.get_signless(32), count))
  return copy


def mx_composite(target: str) -> bool:
  """Whether amp-fp8-gemms writes an MXFP8 GEMM for `target` under this JAX
  as the ``xla.scaled_dot`` composite: on gpu where JAX has
  `jax.lax.scaled_dot` (0.9.1 on: its XLA makes it a block-scaled GEMM).
  Elsewhere the dequantized operands feed the dot (XLA:CPU would only run
  the composite's decomposition, the same dot)."""
  return (target == contract.values("target").gpu
          and hasattr(jax.lax, "scaled_dot"))


def mx_form(target: str) -> str:
  """amp-fp8-gemms' `mx-form` for `target` under this JAX (the pass itself
  writes the dequantized form into a partitioned program)."""
  composite, dequantize = contract.choices(contract.FP8_GEMMS, "mx-form")
  return composite if mx_composite(target) else dequantize
