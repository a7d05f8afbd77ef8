"""`amp.transform`: lower a JAX function, rewrite it, recompile it through XLA.

Per input signature the function is exported once (`jax.export`), rewritten
in process by the C++ passes, verified by jaxlib and called through
`Exported.call` inside an outer `jax.jit`, so JAX's own cache makes a second
call with the same signature do no lowering, rewriting or compiling.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp

from stablehlo_amp._src import program as prog
from stablehlo_amp._src.policy import Policy, as_policy, check_level
from stablehlo_amp._src.program import Timings
from stablehlo_amp._src.report import Report


def _as_tuple(value: int | str | Iterable | None) -> tuple:
  if value is None:
    return ()
  if isinstance(value, (int, str)):
    return (value,)
  return tuple(value)


def _is_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _name(fun: Callable) -> str:
  return getattr(fun, "__qualname__", None) or getattr(fun, "__name__", "fun")


class Lowered:
  """A rewritten function lowered for one signature, before compilation."""

  def __init__(self, jax_lowered: jax.stages.Lowered, program: prog.Program):
    self._jax_lowered = jax_lowered
    self._program = program

  def as_text(self, debug_info: bool = False) -> str:
    """The rewritten module, pretty StableHLO."""
    if self._program.result is None:
      return self._program.exported.mlir_module()
    return self._program.result.text("pretty", debug_info)

  def report(self) -> Report | None:
    """What was lowered, kept f32 and why; None if the rewrite fell back."""
    return self._program.result and self._program.result.report

  @property
  def timings(self) -> Timings:
    """Seconds spent exporting and rewriting (XLA compile: time `compile`)."""
    return self._program.timings

  def compile(self) -> jax.stages.Compiled:
    """The XLA executable (`memory_analysis()`, `as_text()`, ...)."""
    return self._jax_lowered.compile()


class _Staged:
  """Shared by `Transformed` and the training API: static/dynamic argument
  handling, the inner jit that is exported, the outer jit that calls the
  rewritten program."""

  def __init__(self, fun: Callable, *, static_argnums: tuple,
               static_argnames: tuple, donate_argnums: tuple = (),
               donate_argnames: tuple = (), in_shardings: Any = None,
               out_shardings: Any = None):
    self.fun = fun
    self._static_argnums = static_argnums
    self._static_argnames = static_argnames
    jit_options: dict[str, Any] = dict(static_argnums=static_argnums,
                                       static_argnames=static_argnames)
    if in_shardings is not None:
      jit_options["in_shardings"] = in_shardings
    if out_shardings is not None:
      jit_options["out_shardings"] = out_shardings
    self._inner = jax.jit(fun, **jit_options)
    self._outer = jax.jit(self._traced, donate_argnums=donate_argnums,
                          donate_argnames=donate_argnames, **jit_options)
    self._last: prog.Program | None = None
    self.rewrite_count = 0  # signatures rewritten so far (cache misses)

  def __call__(self, *args, **kwargs):
    return self._outer(*args, **kwargs)

  def lower(self, *args, **kwargs) -> Lowered:
    """Lowers and rewrites for these arguments without running."""
    jax_lowered = self._outer.lower(*args, **kwargs)
    return Lowered(jax_lowered, self._last)

  def _is_static(self, index: int | None, name: str | None) -> bool:
    return ((index is not None and index in self._static_argnums) or
            (name is not None and name in self._static_argnames))

  def _dynamic(self, args: Sequence, kwargs: dict) -> tuple[list, dict]:
    return ([a for i, a in enumerate(args) if not self._is_static(i, None)],
            {k: v for k, v in kwargs.items() if not self._is_static(None, k)})

  def _export_args(self, args: Sequence, kwargs: dict, flags: Sequence[bool]):
    """Abstract arguments for jax.export: parameters as f32 (the policy's
    full precision), static arguments as they are."""
    flag_iter = iter(flags)
    def spec(x):
      dtype = jnp.float32 if next(flag_iter) else x.dtype
      return jax.ShapeDtypeStruct(x.shape, dtype,
                                  weak_type=getattr(x, "weak_type", False))
    dynamic_args, dynamic_kwargs = self._dynamic(args, kwargs)
    specs_args, specs_kwargs = jax.tree_util.tree_map(
        spec, (dynamic_args, dynamic_kwargs))
    specs_args = iter(specs_args)
    export_args = [a if self._is_static(i, None) else next(specs_args)
                   for i, a in enumerate(args)]
    export_kwargs = {k: v if self._is_static(None, k) else specs_kwargs[k]
                     for k, v in kwargs.items()}
    return export_args, export_kwargs

  def _traced(self, *args, **kwargs):
    raise NotImplementedError


class Transformed(_Staged):
  """A function rewritten to a precision policy; call it like `jax.jit(fun)`.

  Build it with `stablehlo_amp.transform`.
  """

  def __init__(self, fun: Callable, policy: Policy, *, params: tuple | None,
               level: str, target: str | None, keep_f32: tuple,
               force_compute: tuple, dot_result: str, **staging):
    super().__init__(fun, **staging)
    self.policy = policy
    self._params = params
    self._options = dict(level=level, target=target, keep_f32=keep_f32,
                         force_compute=force_compute, dot_result=dot_result)

  def _param_flags(self, args: Sequence, kwargs: dict) -> list[bool]:
    """Per dynamic leaf: is it a parameter (gets the `p=` dtype)?"""
    def flags(tree, selected: bool):
      return jax.tree_util.tree_map(lambda x: selected and _is_float(x), tree)
    chosen = self._params
    args_flags = [flags(a, chosen is None or i in chosen)
                  for i, a in enumerate(args) if not self._is_static(i, None)]
    kwargs_flags = {k: flags(v, chosen is None or k in chosen)
                    for k, v in kwargs.items() if not self._is_static(None, k)}
    return jax.tree_util.tree_leaves((args_flags, kwargs_flags))

  def _traced(self, *args, **kwargs):
    self.rewrite_count += 1
    flags = self._param_flags(args, kwargs)
    export_args, export_kwargs = self._export_args(args, kwargs, flags)
    def fallback(error: Exception) -> None:
      warnings.warn(f"stablehlo-amp: cannot rewrite {_name(self.fun)} "
                    f"({error}); running the original program", stacklevel=6)
    program = prog.build(self._inner, export_args, export_kwargs,
                         param_flags=flags, policy=self.policy,
                         options=self._options, source_name=_name(self.fun),
                         fallback=fallback)
    self._last = program
    leaves = jax.tree_util.tree_leaves(self._dynamic(args, kwargs))
    outputs, _ = program.call(leaves)
    return jax.tree_util.tree_unflatten(program.out_tree, outputs)


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
      fun, policy, params=param_selection, level=level, target=target,
      keep_f32=tuple(keep_f32), force_compute=tuple(force_compute),
      dot_result=dot_result, static_argnums=_as_tuple(static_argnums),
      static_argnames=_as_tuple(static_argnames),
      donate_argnums=_as_tuple(donate_argnums),
      donate_argnames=_as_tuple(donate_argnames), in_shardings=in_shardings,
      out_shardings=out_shardings)
