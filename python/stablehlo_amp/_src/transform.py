"""`amp.transform`: lower a JAX function, rewrite it, recompile it through XLA.

Per input signature the function is exported once (`jax.export`), rewritten
in process by the C++ passes, verified by jaxlib and called through
`Exported.call` inside an outer `jax.jit`, so JAX's own cache makes a second
call with the same signature do no lowering, rewriting or compiling.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax._src.export import _export as jax_export_internal

from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src.policy import Policy, as_policy, check_level
from stablehlo_amp._src.report import Report

# MLIR element type names to dtypes, for the rewritten signature.
_MLIR_FLOATS = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16,
                "f64": jnp.float64, "f8E4M3FN": jnp.float8_e4m3fn,
                "f8E5M2": jnp.float8_e5m2}


def _as_tuple(value: int | str | Iterable | None) -> tuple:
  if value is None:
    return ()
  if isinstance(value, (int, str)):
    return (value,)
  return tuple(value)


def _is_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


@dataclasses.dataclass(frozen=True)
class Timings:
  """Seconds spent on the first call of one signature."""
  lower: float = 0.0    # jax.export: trace and lower to StableHLO
  rewrite: float = 0.0  # print, C++ passes, parse and verify
  compile: float = 0.0  # XLA (filled by `Lowered.compile`)


@dataclasses.dataclass(frozen=True)
class _Rewritten:
  exported: jax_export.Exported
  result: pl.RewriteResult | None  # None when falling back
  timings: Timings


class Lowered:
  """A rewritten function lowered for one signature, before compilation."""

  def __init__(self, jax_lowered: jax.stages.Lowered, rewritten: _Rewritten):
    self._jax_lowered = jax_lowered
    self._rewritten = rewritten

  def as_text(self, debug_info: bool = False) -> str:
    """The rewritten module, pretty StableHLO."""
    if self._rewritten.result is None:
      return self._rewritten.exported.mlir_module()
    return self._rewritten.result.text("pretty", debug_info)

  def report(self) -> Report | None:
    """What was lowered, kept f32 and why; None if the rewrite fell back."""
    return self._rewritten.result and self._rewritten.result.report

  @property
  def timings(self) -> Timings:
    return self._rewritten.timings

  def compile(self) -> jax.stages.Compiled:
    """The XLA executable (`memory_analysis()`, `as_text()`, ...)."""
    return self._jax_lowered.compile()


class Transformed:
  """A function rewritten to a precision policy; call it like `jax.jit(fun)`.

  Build it with `stablehlo_amp.transform`.
  """

  def __init__(self, fun: Callable, policy: Policy, *, static_argnums: tuple,
               static_argnames: tuple, donate_argnums: tuple,
               donate_argnames: tuple, in_shardings: Any, out_shardings: Any,
               params: tuple | None, level: str, target: str | None,
               keep_f32: tuple, force_compute: tuple, dot_result: str):
    self.fun = fun
    self.policy = policy
    self._static_argnums = static_argnums
    self._static_argnames = static_argnames
    self._params = params
    self._options = dict(level=level, target=target, keep_f32=keep_f32,
                         force_compute=force_compute, dot_result=dot_result)
    jit_options: dict[str, Any] = dict(static_argnums=static_argnums,
                                       static_argnames=static_argnames)
    if in_shardings is not None:
      jit_options["in_shardings"] = in_shardings
    if out_shardings is not None:
      jit_options["out_shardings"] = out_shardings
    self._inner = jax.jit(fun, **jit_options)
    self._outer = jax.jit(self._traced, donate_argnums=donate_argnums,
                          donate_argnames=donate_argnames, **jit_options)
    self._last: _Rewritten | None = None
    self.rewrite_count = 0  # signatures rewritten so far (cache misses)

  def __call__(self, *args, **kwargs):
    return self._outer(*args, **kwargs)

  def lower(self, *args, **kwargs) -> Lowered:
    """Lowers and rewrites for these arguments without running."""
    jax_lowered = self._outer.lower(*args, **kwargs)
    return Lowered(jax_lowered, self._last)

  # -- tracing -------------------------------------------------------------

  def _is_static(self, index: int | None, name: str | None) -> bool:
    return ((index is not None and index in self._static_argnums) or
            (name is not None and name in self._static_argnames))

  def _param_flags(self, args: Sequence, kwargs: dict) -> tuple:
    """Per dynamic leaf: is it a parameter (gets the `p=` dtype)?"""
    def flags(tree, selected: bool):
      return jax.tree_util.tree_map(lambda x: selected and _is_float(x), tree)
    chosen = self._params
    args_flags = tuple(
        flags(a, chosen is None or i in chosen)
        for i, a in enumerate(args) if not self._is_static(i, None))
    kwargs_flags = {k: flags(v, chosen is None or k in chosen)
                    for k, v in kwargs.items() if not self._is_static(None, k)}
    return jax.tree_util.tree_leaves((args_flags, kwargs_flags))

  def _traced(self, *args, **kwargs):
    rewritten = self._rewrite(args, kwargs)
    self._last = rewritten
    dynamic_args = [a for i, a in enumerate(args)
                    if not self._is_static(i, None)]
    dynamic_kwargs = {k: v for k, v in kwargs.items()
                      if not self._is_static(None, k)}
    leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
    avals = rewritten.exported.in_avals
    # Inputs arrive in whatever float dtype; the module takes the param dtype.
    leaves = [leaf.astype(aval.dtype)
              if _is_float(leaf) and leaf.dtype != aval.dtype else leaf
              for leaf, aval in zip(leaves, avals)]
    dynamic_args, dynamic_kwargs = jax.tree_util.tree_unflatten(tree, leaves)
    return rewritten.exported.call(*dynamic_args, **dynamic_kwargs)

  def _export_args(self, args: Sequence, kwargs: dict, flags: list):
    """Abstract arguments for jax.export: parameters as f32 (the policy's
    full precision), static arguments as they are."""
    flag_iter = iter(flags)
    def spec(x):
      is_param = next(flag_iter)
      dtype = jnp.float32 if is_param else x.dtype
      return jax.ShapeDtypeStruct(x.shape, dtype,
                                  weak_type=getattr(x, "weak_type", False))
    export_args = [a if self._is_static(i, None) else
                   jax.tree_util.tree_map(spec, a)
                   for i, a in enumerate(args)]
    export_kwargs = {k: v if self._is_static(None, k) else
                     jax.tree_util.tree_map(spec, v)
                     for k, v in kwargs.items()}
    return export_args, export_kwargs

  def _rewrite(self, args: Sequence, kwargs: dict) -> _Rewritten:
    self.rewrite_count += 1
    flags = self._param_flags(args, kwargs)
    export_args, export_kwargs = self._export_args(args, kwargs, flags)
    start = time.perf_counter()
    exported = jax_export.export(self._inner)(*export_args, **export_kwargs)
    lowered_at = time.perf_counter()
    try:
      kept = exported.module_kept_var_idx
      keep_dtype = [i for i, flat in enumerate(kept) if not flags[flat]]
      context = pl.ir_context()
      with context:
        module = jax_export_internal._jax.mlir.deserialize_portable_artifact(
            exported.mlir_module_serialized)
        if len(_main_signature(module)[0]) != len(kept):
          raise pl.RewriteError("the exported module has extra arguments "
                                "(effect tokens or a platform index)")
        pl.mark_kept_arguments(module, keep_dtype)
        result = pl.rewrite_module(module, self.policy, context=context,
                                   source_name=_name(self.fun),
                                   **self._options)
        rewritten = _replace_module(exported, result.module)
    except pl.VerificationError:
      raise
    except pl.RewriteError as error:
      warnings.warn(f"stablehlo-amp: cannot rewrite {_name(self.fun)} "
                    f"({error}); running the original program", stacklevel=4)
      return _Rewritten(exported, None,
                        Timings(lower=lowered_at - start))
    done = time.perf_counter()
    return _Rewritten(rewritten, result,
                      Timings(lower=lowered_at - start, rewrite=done - lowered_at))


def _name(fun: Callable) -> str:
  return getattr(fun, "__qualname__", None) or getattr(fun, "__name__", "fun")


def _main_signature(module) -> tuple[list, list]:
  from jax.extend.mlir import ir
  for op in module.body.operations:
    if (op.operation.name == "func.func" and
        ir.StringAttr(op.attributes["sym_name"]).value == "main"):
      function_type = ir.FunctionType(
          ir.TypeAttr(op.attributes["function_type"]).value)
      return list(function_type.inputs), list(function_type.results)
  raise pl.RewriteError("module has no main function")


def _with_dtype(aval, mlir_type) -> Any:
  from jax.extend.mlir import ir
  element = str(ir.ShapedType(mlir_type).element_type)
  dtype = _MLIR_FLOATS.get(element)
  if dtype is None or np.dtype(dtype) == aval.dtype:
    return aval
  return aval.update(dtype=np.dtype(dtype))


def _replace_module(exported: jax_export.Exported, module) -> Any:
  """`exported` with the rewritten module and its new argument/result dtypes."""
  inputs, results = _main_signature(module)
  in_avals = list(exported.in_avals)
  for position, flat in enumerate(exported.module_kept_var_idx):
    in_avals[flat] = _with_dtype(in_avals[flat], inputs[position])
  out_avals = [_with_dtype(aval, t)
               for aval, t in zip(exported.out_avals, results)]
  return dataclasses.replace(
      exported,
      mlir_module_serialized=jax_export_internal._module_to_bytecode(module),
      in_avals=tuple(in_avals), out_avals=tuple(out_avals),
      _get_vjp=None)


def transform(fun: Callable, policy: Policy | str = "p=f32,c=bf16,o=f32", *,
              static_argnums: int | Sequence[int] | None = None,
              static_argnames: str | Iterable[str] | None = None,
              donate_argnums: int | Sequence[int] | None = None,
              donate_argnames: str | Iterable[str] | None = None,
              in_shardings: Any = None, out_shardings: Any = None,
              params: int | str | Iterable[int | str] | None = None,
              level: str = "O2", target: str | None = None,
              keep_f32: Iterable[str] = (), force_compute: Iterable[str] = (),
              dot_result: str = "f32") -> Transformed:
  """Rewrites `fun` to a mixed-precision policy; use it like `jax.jit(fun)`.

  Args:
    fun: the function, as you would pass it to `jax.jit`.
    policy: a `Policy` or its text, ``"p=f32,c=bf16,o=f32"``.
    static_argnums, static_argnames, donate_argnums, donate_argnames,
      in_shardings, out_shardings: as for `jax.jit`.
    params: the arguments (positions or names) that are parameters and take
      the ``p=`` dtype; default: every float input.
    level: ``O0`` (no change) to ``O3`` (every float op in the compute dtype);
      ``O2`` paints.
    target: ``cpu``, ``gpu`` or ``tpu``; default: `jax.default_backend()`.
    keep_f32, force_compute: op names to keep f32 / force into the compute
      dtype (``"tanh"`` or ``"stablehlo.tanh"``).
    dot_result: ``"f32"`` (f32 accumulation, default) or ``"compute"``.

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> fast = amp.transform(lambda w, x: jnp.tanh(x @ w), "p=f32,c=bf16,o=f32")
  >>> y = fast(jnp.ones((8, 8)), jnp.ones((4, 8)))
  >>> y.dtype, y.shape
  (dtype('float32'), (4, 8))
  >>> print(fast.lower(jnp.ones((8, 8)), jnp.ones((4, 8))).report())  # doctest: +ELLIPSIS
  amp-insert-converts: policy p=f32,c=bf16,o=f32, level O2, target cpu
    lowered to bf16: 1 ops (dot_general 1)
  ...
  """
  policy = as_policy(policy)
  check_level(level)
  if not callable(fun):
    raise TypeError(f"transform expects a callable, got {type(fun).__name__}")
  param_selection = None if params is None else _as_tuple(params)
  return Transformed(
      fun, policy, static_argnums=_as_tuple(static_argnums),
      static_argnames=_as_tuple(static_argnames),
      donate_argnums=_as_tuple(donate_argnums),
      donate_argnames=_as_tuple(donate_argnames), in_shardings=in_shardings,
      out_shardings=out_shardings, params=param_selection, level=level,
      target=target, keep_f32=tuple(keep_f32),
      force_compute=tuple(force_compute), dot_result=dot_result)
