"""`amp.transform`: lower a JAX function, rewrite it, recompile it through XLA.

Per input signature the function is exported once (`jax.export`), rewritten
in process by the C++ passes, verified by jaxlib and called through
`Exported.call` inside an outer `jax.jit`, so JAX's own cache makes a second
call with the same signature do no lowering, rewriting or compiling.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Hashable, Iterable, Sequence

import jax
import jax.numpy as jnp

from stablehlo_amp import _amp
from stablehlo_amp._src import pipeline as pl
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


class _Arguments:
  """Which arguments of `fun` a set of numbers and names selects, whether they
  are passed by position or by keyword (as `jax.jit` resolves them)."""

  def __init__(self, fun: Callable, nums: Iterable[int], names: Iterable[str]):
    nums, names = set(nums), set(names)
    try:
      parameters = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
      parameters = []
    positional = [p.name for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword_ok = {p.name for p in parameters
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    nums |= {positional.index(n) for n in names if n in positional}
    names |= {positional[i] for i in nums
              if i < len(positional) and positional[i] in keyword_ok}
    self.nums, self.names = tuple(sorted(nums)), tuple(sorted(names))

  def __contains__(self, key: int | str) -> bool:
    return key in (self.nums if isinstance(key, int) else self.names)


def _signature(leaves: Sequence[Any], treedef, statics: Hashable) -> Hashable:
  avals = tuple((tuple(a.shape), str(a.dtype), bool(a.weak_type))
                for a in map(jax.typeof, leaves))
  return treedef, avals, statics


class Lowered:
  """A rewritten function lowered for one signature, before compilation."""

  def __init__(self, jax_lowered: jax.stages.Lowered,
               program: prog.Program | None):
    self._jax_lowered = jax_lowered
    self._program = program

  def as_text(self, debug_info: bool = False) -> str:
    """The rewritten module, pretty StableHLO (the original one if the
    rewrite fell back)."""
    if self._program is None:
      return self._jax_lowered.as_text(debug_info=debug_info)
    return self._program.result.text("pretty", debug_info)

  def report(self) -> Report | None:
    """What was lowered, kept f32 and why; None if the rewrite fell back."""
    return self._program.result.report if self._program else None

  @property
  def timings(self) -> Timings:
    """Seconds spent exporting and rewriting (XLA compile: time `compile`)."""
    return self._program.timings if self._program else Timings()

  def compile(self) -> jax.stages.Compiled:
    """The XLA executable (`memory_analysis()`, `as_text()`, ...)."""
    return self._jax_lowered.compile()


class Transformed:
  """A function rewritten to a precision policy; call it like `jax.jit(fun)`.

  Build it with `stablehlo_amp.transform`.
  """

  def __init__(self, fun: Callable, policy: Policy, *, params: tuple | None,
               options: dict, static_argnums: tuple, static_argnames: tuple,
               donate_argnums: tuple, donate_argnames: tuple,
               in_shardings: Any, out_shardings: Any):
    self.fun = fun
    self.policy = policy
    self._options = options
    self._static = _Arguments(fun, static_argnums, static_argnames)
    self._params = None if params is None else _Arguments(
        fun, [p for p in params if isinstance(p, int)],
        [p for p in params if isinstance(p, str)])
    donate = _Arguments(fun, donate_argnums, donate_argnames)
    jit_options: dict[str, Any] = dict(static_argnums=self._static.nums,
                                       static_argnames=self._static.names)
    if in_shardings is not None:
      jit_options["in_shardings"] = in_shardings
    if out_shardings is not None:
      jit_options["out_shardings"] = out_shardings
    self._inner = jax.jit(fun, **jit_options)
    self._outer = jax.jit(self._traced, donate_argnums=donate.nums,
                          donate_argnames=donate.names, **jit_options)
    # Rewritten programs by signature (None: fell back to the original).
    self._programs: dict[Hashable, prog.Program | None] = {}
    self.rewrite_count = 0  # signatures rewritten so far (cache misses)

  def __call__(self, *args, **kwargs):
    return self._outer(*args, **kwargs)

  def lower(self, *args, **kwargs) -> Lowered:
    """Lowers and rewrites for these arguments without running."""
    jax_lowered = self._outer.lower(*args, **kwargs)
    return Lowered(jax_lowered, self._programs.get(self._key(args, kwargs)))

  # -- tracing -------------------------------------------------------------

  def _split(self, args: Sequence, kwargs: dict):
    """(dynamic args, dynamic kwargs, static values as a hashable)."""
    dynamic_args = [a for i, a in enumerate(args) if i not in self._static]
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self._static}
    statics = (tuple((i, a) for i, a in enumerate(args) if i in self._static),
               tuple(sorted((k, v) for k, v in kwargs.items()
                            if k in self._static)))
    return dynamic_args, dynamic_kwargs, statics

  def _key(self, args: Sequence, kwargs: dict) -> Hashable:
    dynamic_args, dynamic_kwargs, statics = self._split(args, kwargs)
    leaves, treedef = jax.tree_util.tree_flatten((dynamic_args,
                                                  dynamic_kwargs))
    return _signature(leaves, treedef, statics)

  def _param_flags(self, args: Sequence, kwargs: dict) -> list[bool]:
    """Per dynamic leaf: is it a parameter (gets the `p=` dtype)?"""
    def flags(tree, selected: bool):
      return jax.tree_util.tree_map(lambda x: selected and _is_float(x), tree)
    chosen = self._params
    args_flags = [flags(a, chosen is None or i in chosen)
                  for i, a in enumerate(args) if i not in self._static]
    kwargs_flags = {k: flags(v, chosen is None or k in chosen)
                    for k, v in kwargs.items() if k not in self._static}
    return jax.tree_util.tree_leaves((args_flags, kwargs_flags))

  def _export_args(self, args: Sequence, kwargs: dict, flags: Sequence[bool]):
    """Abstract arguments for jax.export: parameters as f32 (the policy's
    full precision), static arguments as they are."""
    flag_iter = iter(flags)
    def spec(x):
      dtype = jnp.float32 if next(flag_iter) else x.dtype
      return jax.ShapeDtypeStruct(x.shape, dtype,
                                  weak_type=getattr(x, "weak_type", False))
    dynamic_args, dynamic_kwargs, _ = self._split(args, kwargs)
    specs_args, specs_kwargs = jax.tree_util.tree_map(
        spec, (dynamic_args, dynamic_kwargs))
    specs_args = iter(specs_args)
    export_args = [a if i in self._static else next(specs_args)
                   for i, a in enumerate(args)]
    export_kwargs = {k: v if k in self._static else specs_kwargs[k]
                     for k, v in kwargs.items()}
    return export_args, export_kwargs

  def _traced(self, *args, **kwargs):
    self.rewrite_count += 1
    key = self._key(args, kwargs)
    flags = self._param_flags(args, kwargs)
    export_args, export_kwargs = self._export_args(args, kwargs, flags)
    try:
      program = prog.build(self._inner, export_args, export_kwargs,
                           param_flags=flags, policy=self.policy,
                           options=self._options, source_name=_name(self.fun))
    except pl.VerificationError:
      raise
    except pl.RewriteError as error:
      # Never a wrong result: the original program runs, and we say why.
      warnings.warn(f"stablehlo-amp: cannot rewrite {_name(self.fun)} "
                    f"({error}); running the original program",
                    stacklevel=2)
      self._programs[key] = None
      return self._inner(*args, **kwargs)
    self._programs[key] = program
    dynamic_args, dynamic_kwargs, _ = self._split(args, kwargs)
    outputs, _ = program.call(
        jax.tree_util.tree_leaves((dynamic_args, dynamic_kwargs)))
    return jax.tree_util.tree_unflatten(program.out_tree, outputs)


def check_options(level: str, target: str | None, dot_result: str,
                  keep_f32: Iterable[str],
                  force_compute: Iterable[str]) -> dict:
  """Validates rewrite options up front (ValueError names the bad one)."""
  level = check_level(level)
  if target is not None and target not in pl.TARGETS:
    raise ValueError(f"unknown target {target!r} (accepted: "
                     f"{', '.join(pl.TARGETS)})")
  if dot_result not in pl.DOT_RESULTS:
    raise ValueError(f"unknown dot_result {dot_result!r} (accepted: "
                     f"{', '.join(pl.DOT_RESULTS)})")
  keep_f32, force_compute = tuple(keep_f32), tuple(force_compute)
  qualify = _amp.qualified_op_name  # the pass's own reading of the names
  both = {qualify(n) for n in keep_f32} & {qualify(n) for n in force_compute}
  if both:
    raise ValueError(f"ops named in both keep_f32 and force_compute: "
                     f"{', '.join(sorted(both))}")
  return dict(level=level, target=target, keep_f32=keep_f32,
              force_compute=force_compute, dot_result=dot_result)


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

  The result composes with `jax.jit` and shardings; `jax.vmap` and `jax.grad`
  of it are not supported (differentiate first, then transform the step).
  Functions `jax.export` cannot export (host callbacks) run unchanged, with a
  warning.

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> fast = amp.transform(lambda w, x: jnp.tanh(x @ w), "p=f32,c=bf16,o=f32")
  >>> y = fast(jnp.ones((8, 8)), jnp.ones((4, 8)))
  >>> y.dtype, y.shape
  (dtype('float32'), (4, 8))
  >>> print(fast.lower(jnp.ones((8, 8)), jnp.ones((4, 8))).report())  # doctest: +ELLIPSIS
  amp-insert-converts: policy p=f32,c=bf16,o=f32, level O2, target cpu
    lowered to bf16: 1 op (dot_general 1)
  ...
  """
  policy = as_policy(policy)
  if not callable(fun):
    raise TypeError(f"transform expects a callable, got {type(fun).__name__}")
  options = check_options(level, target, dot_result, keep_f32, force_compute)
  return Transformed(
      fun, policy, params=None if params is None else _as_tuple(params),
      options=options, static_argnums=_as_tuple(static_argnums),
      static_argnames=_as_tuple(static_argnames),
      donate_argnums=_as_tuple(donate_argnums),
      donate_argnames=_as_tuple(donate_argnames), in_shardings=in_shardings,
      out_shardings=out_shardings)
