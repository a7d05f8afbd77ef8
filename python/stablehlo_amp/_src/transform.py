"""`amp.transform`: lower a JAX function, rewrite it, recompile it through XLA.

A transformed function is one JAX primitive, `amp_call`, bound on the flat
leaves of its arguments. Its rules make it a citizen of JAX's
transformations, each derived program mixed precision in turn:

- evaluation and lowering: the function is lowered once per input
  signature (`jax.jit(...).lower`; through `jax.export` where shardings
  are explicit), rewritten by the C++ passes, verified by jaxlib and
  inlined where it is called (the `amp_module_call` primitive's lowering,
  or `Exported.call`);
- `jax.jvp`: the tangent program ``jvp(fun)`` is transformed the same way;
  it is linear in the tangents. Its transpose (what `jax.grad` and `jax.vjp`
  need) is the transformed ``vjp(fun)`` program, made by reverse mode on the
  function itself, so `custom_vjp` rules apply and under `jax.grad` the
  tangent program is never built;
- `jax.vmap`: the batched program ``vmap(fun)`` is transformed.

So `jax.grad(lambda w: fast(w, x).sum())` runs a rewritten forward and a
rewritten backward program, and nesting works the same way. A derived
program that cannot be rewritten (an ordered effect in a backward rule)
runs unchanged, with a warning, as the function itself does.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Hashable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching
from jax.interpreters import mlir as jax_mlir

from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import numerics
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src import program as prog
from stablehlo_amp._src.policy import Policy, as_policy


def warn_running_original(name: str, error: Exception, stacklevel: int) -> None:
  """Never a wrong result: a program that cannot be rewritten runs as it is,
  and the warning says why."""
  warnings.warn(f"stablehlo-amp: cannot rewrite {name} ({error}); running "
                "the original program", stacklevel=stacklevel)


# -- the primitive -----------------------------------------------------------


class _Spec:
  """A flat function (leaves in, leaves out) and how to rewrite it; one
  program per input signature, and one derived spec per transformation."""

  def __init__(self, fun: Callable, *, name: str, policy: Policy,
               options: pl.RewriteOptions,
               param_rule: Callable[[Sequence[Any]], list[bool]],
               in_shardings: Sequence[Any] | None = None,
               out_shardings: Callable[[], Sequence[Any]] | None = None,
               tangent_of: tuple["_Spec", tuple[bool, ...]] | None = None,
               derived: bool = False):
    self.fun = fun
    # A derived program (a JVP, VJP or batched program) that cannot be
    # rewritten runs unchanged, with a warning, as the function itself does.
    self.derived = derived
    # Per input leaf, and (once the outputs are known) per output leaf: the
    # shardings the user asked `jax.jit` for, so the export carries them.
    self.in_shardings = in_shardings
    self.out_shardings = out_shardings
    self.name = name
    self.policy = policy
    self.options = options
    self.param_rule = param_rule
    # For a tangent program: the spec it is the derivative of, and which of
    # that spec's inputs are floats (they have tangents).
    self.tangent_of = tangent_of
    self._programs: dict[Hashable, prog.Program | None] = {}
    self._children: dict[Hashable, _Spec] = {}
    self._bind = None
    # Calibration's decisions, by input signature (see `calibrate`).
    self.calibrations: dict[Hashable, Any] = {}
    self._options_by_key: dict[Hashable, pl.RewriteOptions] = {}
    self.builds = 0  # programs built (cache misses)

  def program(self, avals: Sequence[Any]) -> prog.Program | None:
    """The rewritten program for these avals; None for a derived program
    that cannot be rewritten (it runs as it is)."""
    key = prog.aval_key(avals)
    if key in self._programs:
      return self._programs[key]
    try:
      program = self._build(avals)
    except (pl.VerificationError, pl.OptionError):
      raise
    except pl.RewriteError as error:
      if not self.derived:
        raise
      warn_running_original(self.name, error, stacklevel=3)
      program = None
    self._programs[key] = program
    return program

  def _build(self, avals: Sequence[Any]) -> prog.Program:
    flags = self.param_rule(avals)
    specs = prog.export_specs(avals, flags, self.in_shardings)
    jit_options = {}
    if self.out_shardings is not None:
      jax.eval_shape(self.fun, *specs)  # the output structure, for
      jit_options["out_shardings"] = self.out_shardings()
    # Explicit shardings travel through jax.export, whose Exported.call
    # applies them; everything else is lowered and inlined directly.
    use_export = self.in_shardings is not None or bool(jit_options)
    options = self._options_by_key.get(prog.aval_key(avals), self.options)
    program = prog.build(jax.jit(self.fun, **jit_options), specs, {},
                         param_flags=flags,
                         policy=self.policy, options=options,
                         source_name=self.name, use_export=use_export)
    self.builds += 1
    return program

  def out_avals(self, avals: Sequence[Any]) -> list[Any]:
    """The avals of the outputs, without building a program where they are
    known: a tangent program's outputs are the tangents of its primal
    program's float outputs, in their dtypes. (Under `jax.grad` the tangent
    program is only transposed, never run, so it is never built.)"""
    if self.tangent_of is not None:
      primal, float_in = self.tangent_of
      outputs = primal.out_avals(avals[:len(float_in)])
      return [a for a in outputs if jnp.issubdtype(a.dtype, jnp.floating)]
    program = self.program(avals)
    outputs = (program.out_avals if program is not None else
               jax.eval_shape(self.fun, *avals))
    return [jax_compat.shaped_array(tuple(a.shape), a.dtype) for a in outputs]

  def calibrate(self, avals: Sequence[Any], inputs: Sequence[Any],
                tolerance: float, measure: str = "norm") -> Any:
    """Keeps in f32 a minimal set of groups that brings every output within
    `tolerance` of f32 on `inputs` (the flat leaves), for these avals; the
    program built next uses the decision."""
    from stablehlo_amp._src import calibration
    key = prog.aval_key(avals)
    if key in self.calibrations:
      return self.calibrations[key]
    flags = self.param_rule(avals)
    specs = prog.export_specs(avals, flags)
    marked = prog.lower_marked(jax.jit(self.fun), specs, {},
                               param_flags=flags)
    inputs = [np.asarray(inputs[i]) for i in marked.kept]
    _, decided = calibration.calibrate(
        marked.module, self.policy, self.options, inputs,
        tolerance=tolerance, context=pl.ir_context(), source_name=self.name,
        measure=measure)
    self._options_by_key[key] = self.options.replace(
        keep_groups=tuple(g for g in decided.kept
                          if g != calibration.STORAGE_GROUP),
        storage=("f32" if calibration.STORAGE_GROUP in decided.kept else
                 self.options.storage))
    self.calibrations[key] = decided
    self._programs.pop(key, None)
    return decided

  def cached_program(self, avals: Sequence[Any]) -> prog.Program | None:
    return self._programs.get(prog.aval_key(avals))

  def derive(self, key: Hashable, make: Callable[[], "_Spec"]) -> "_Spec":
    child = self._children.get(key)
    if child is None:
      child = self._children[key] = make()
    return child

  def child(self, fun: Callable, suffix: str,
            param_rule: Callable[[Sequence[Any]], list[bool]],
            tangent_of: tuple["_Spec", tuple[bool, ...]] | None = None
            ) -> "_Spec":
    return _Spec(fun, name=f"{self.name}.{suffix}", policy=self.policy,
                 options=self.options, param_rule=param_rule,
                 tangent_of=tangent_of, derived=True)

  def bind_jitted(self) -> Callable:
    if self._bind is None:
      self._bind = jax.jit(lambda *args: amp_call_p.bind(*args, spec=self))
    return self._bind


amp_call_p = jax_compat.primitive_class()("amp_call")
amp_call_p.multiple_results = True


def _abstract_eval(*avals, spec: _Spec):
  return spec.out_avals(avals)


def _impl(*args, spec: _Spec):
  return spec.bind_jitted()(*args)


def _lowering(ctx, *args, spec: _Spec):
  program = spec.program(ctx.avals_in)
  dtypes = [a.dtype for a in ctx.avals_out]

  def call(*leaves):
    outputs = (program.call(leaves)[0] if program is not None else
               spec.fun(*leaves))
    # Where the avals were known without the program (tangents), the
    # program's own dtypes are the same; the cast makes it certain.
    return [o.astype(dtype) if o.dtype != dtype else o
            for o, dtype in zip(outputs, dtypes)]
  return jax_mlir.lower_fun(call, multiple_results=True)(ctx, *args)


amp_call_p.def_abstract_eval(_abstract_eval)
amp_call_p.def_impl(_impl)
jax_mlir.register_lowering(amp_call_p, _lowering)


def _float_inputs(avals: Sequence[Any]) -> tuple[bool, ...]:
  return tuple(bool(jnp.issubdtype(a.dtype, jnp.floating)) for a in avals)


def _jvp_spec(spec: _Spec, float_in: tuple[bool, ...]) -> _Spec:
  """The tangent program: primals and the float inputs' tangents in, the
  float outputs' tangents out; linear in the tangents. Built only when
  forward mode runs it (`jax.jvp`, `jax.jacfwd`, `jax.linearize`)."""
  n = len(float_in)

  def tangents_fun(*leaves):
    primals = leaves[:n]
    given = iter(leaves[n:])
    tangents = [next(given).astype(p.dtype) if is_float else
                np.zeros(np.shape(p), jax.dtypes.float0)
                for p, is_float in zip(primals, float_in)]
    outputs, out_tangents = jax.jvp(spec.fun, tuple(primals), tuple(tangents))
    return [t for o, t in zip(outputs, out_tangents) if prog.is_float(o)]

  def param_rule(avals):
    return list(spec.param_rule(avals[:n])) + [False] * (len(avals) - n)

  return spec.child(tangents_fun, "jvp", param_rule,
                    tangent_of=(spec, float_in))


def _jvp_rule(primals, tangents, *, spec: _Spec):
  outputs = amp_call_p.bind(*primals, spec=spec)
  float_in = _float_inputs([jax_compat.aval_of(p) for p in primals])
  given = [ad.instantiate_zeros(t) for t, is_float in zip(tangents, float_in)
           if is_float]
  tangent_spec = spec.derive(("jvp", float_in),
                             lambda: _jvp_spec(spec, float_in))
  out_tangents = iter(amp_call_p.bind(*primals, *given, spec=tangent_spec))
  result = []
  for output in outputs:
    if jnp.issubdtype(jnp.result_type(output), jnp.floating):
      result.append(next(out_tangents))
    else:
      result.append(jax_compat.zero_tangent(output))
  return outputs, result


def _vjp_spec(primal: _Spec, float_in: tuple[bool, ...],
              wanted: tuple[bool, ...]) -> _Spec:
  """The transpose of `primal`'s tangent program, as `primal`'s own VJP:
  primals and the float outputs' cotangents in, the cotangents of the float
  inputs `wanted` selects out. It differentiates the function in reverse
  mode (custom_vjp rules apply), never through its JVP."""
  n = len(float_in)
  floats = [i for i, is_float in enumerate(float_in) if is_float]

  def cotangents_fun(*leaves):
    primals, cotangents = list(leaves[:n]), leaves[n:]

    def of_floats(*values):
      args = list(primals)
      for i, value in zip(floats, values):
        args[i] = value
      return [o for o in primal.fun(*args) if prog.is_float(o)]

    outputs, vjp = jax.vjp(of_floats, *[primals[i] for i in floats])
    grads = vjp([c.astype(o.dtype) for c, o in zip(cotangents, outputs)])
    return [g for g, keep in zip(grads, wanted) if keep]

  def param_rule(avals):
    return list(primal.param_rule(avals[:n])) + [False] * (len(avals) - n)

  return primal.child(cotangents_fun, "vjp", param_rule)


def _transpose_spec(spec: _Spec, linear: tuple[bool, ...],
                    linear_avals: tuple[Any, ...]) -> _Spec:
  """The transpose of a spec linear in its `linear` inputs, by reverse mode
  through it (for tangent programs that went through `jax.vmap` first, and
  `jax.linear_transpose` of a linear function): the other inputs and the
  output cotangents in, the linear inputs' cotangents out."""
  k = linear.count(False)

  def merge(fixed, moving):
    fixed, moving = iter(fixed), iter(moving)
    return [next(moving) if is_linear else next(fixed) for is_linear in linear]

  def cotangents_fun(*leaves):
    fixed, cotangents = leaves[:k], leaves[k:]
    zeros = [jnp.zeros(a.shape, a.dtype) for a in linear_avals]
    outputs, vjp = jax.vjp(lambda *moving: spec.fun(*merge(fixed, moving)),
                           *zeros)
    cotangents = [c.astype(o.dtype) for c, o in zip(cotangents, outputs)]
    return list(vjp(list(cotangents)))

  def param_rule(avals):
    flags = spec.param_rule(merge(avals[:k], linear_avals))
    return [f for f, is_linear in zip(flags, linear) if not is_linear] + \
        [False] * (len(avals) - k)

  return spec.child(cotangents_fun, "transpose", param_rule)


def _transpose_rule(cotangents, *args, spec: _Spec):
  linear = tuple(ad.is_undefined_primal(a) for a in args)
  fixed = [a for a, is_linear in zip(args, linear) if not is_linear]
  cotangents = [ad.instantiate_zeros(c) for c in cotangents]
  if spec.tangent_of is not None and not any(linear[:len(spec.tangent_of[1])]):
    # A tangent program, transposed in its tangents: the primal's VJP. The
    # tangents that are not linear (instantiated zeros) do not enter it.
    primal, float_in = spec.tangent_of
    n = len(float_in)
    wanted = linear[n:]
    fixed = list(args[:n])
    transpose_spec = primal.derive(("vjp", float_in, wanted),
                                   lambda: _vjp_spec(primal, float_in, wanted))
  else:
    linear_avals = tuple(a.aval for a in args if ad.is_undefined_primal(a))
    transpose_spec = spec.derive(
        ("transpose", linear, prog.aval_key(linear_avals)),
        lambda: _transpose_spec(spec, linear, linear_avals))
  results = iter(amp_call_p.bind(*fixed, *cotangents, spec=transpose_spec))
  return [next(results).astype(a.aval.dtype) if is_linear else None
          for a, is_linear in zip(args, linear)]


def _batch_rule(args, dims, *, spec: _Spec):
  dims = tuple(d if isinstance(d, int) else None for d in dims)

  def make() -> _Spec:
    batched = jax.vmap(spec.fun, in_axes=dims, out_axes=0)
    return spec.child(batched, "vmap", spec.param_rule)

  batched_spec = spec.derive(("vmap", dims), make)
  outputs = amp_call_p.bind(*args, spec=batched_spec)
  return outputs, [0] * len(outputs)


ad.primitive_jvps[amp_call_p] = _jvp_rule
ad.primitive_transposes[amp_call_p] = _transpose_rule
batching.primitive_batchers[amp_call_p] = _batch_rule


# -- transform ---------------------------------------------------------------


class Transformed:
  """A function rewritten to a precision policy; call it like `jax.jit(fun)`.

  Build it with `stablehlo_amp.transform`.
  """

  def __init__(self, fun: Callable, policy: Policy, *, params: tuple | None,
               options: pl.RewriteOptions, static_argnums: tuple,
               static_argnames: tuple, donate_argnums: tuple,
               donate_argnames: tuple, in_shardings: Any, out_shardings: Any,
               calibrate: Any = None, tolerance: float | None = None,
               error_measure: str = "norm"):
    self.fun = fun
    self.policy = policy
    self._options = options
    # None, True (the first call's inputs) or the arguments to calibrate on.
    self._calibrate = calibrate
    self._tolerance = tolerance
    self._error_measure = error_measure
    static = prog.Arguments(fun, static_argnums, static_argnames)
    self._signature = prog.CallSignature(
        fun, static, None if params is None else prog.Arguments(
            fun, [p for p in params if isinstance(p, int)],
            [p for p in params if isinstance(p, str)]))
    donate = prog.Arguments(fun, donate_argnums, donate_argnames)
    jit_options: dict[str, Any] = dict(static_argnums=static.nums,
                                       static_argnames=static.names)
    if in_shardings is not None:
      jit_options["in_shardings"] = in_shardings
    if out_shardings is not None:
      jit_options["out_shardings"] = out_shardings
    self._in_shardings, self._out_shardings = in_shardings, out_shardings
    self._inner = jax.jit(fun, **jit_options)
    self._outer = prog.OuterJit(self._traced, options,
                                donate_argnums=donate.nums,
                                donate_argnames=donate.names, **jit_options)
    self._specs: dict[Hashable, tuple[_Spec, list]] = {}

  @property
  def rewrite_count(self) -> int:
    """Programs built so far for this function and what was derived from it
    (cache misses)."""
    def count(spec: _Spec) -> int:
      return spec.builds + sum(count(c) for c in spec._children.values())
    return sum(count(spec) for spec, _ in self._specs.values())

  def __call__(self, *args, **kwargs):
    if self._calibrate is not None:
      self._calibrated(args, kwargs)
    return self._outer(*args, **kwargs)

  def lower(self, *args, **kwargs) -> prog.Lowered:
    """Lowers and rewrites for these arguments without running."""
    if self._calibrate is not None:
      self._calibrated(args, kwargs)
    jax_lowered = self._outer.lower(*args, **kwargs)
    leaves, spec, _ = self._flat(args, kwargs)
    avals = [jax_compat.aval_of(x) for x in leaves]
    return prog.Lowered(jax_lowered,
                   spec.cached_program(avals) if spec else None,
                   spec.calibrations.get(prog.aval_key(avals))
                   if spec else None)

  def last_report(self) -> Any:
    """The report of the program last traced with ``numerics=`` (what
    ``amp.explain(measured, fast)`` reads); None before."""
    last = getattr(self, "_last", None)
    program = last[0].cached_program(last[1]) if last else None
    return program.as_lowered().result.report if program else None

  def _calibrated(self, args: Sequence, kwargs: dict) -> None:
    """Calibrates this signature once, on the first call's inputs or the
    ones `calibrate=` gave."""
    spec, _ = self._spec(args, kwargs)
    leaves, _, _ = self._flat(args, kwargs)
    avals = [jax_compat.aval_of(x) for x in leaves]
    if prog.aval_key(avals) in spec.calibrations:
      return
    if self._calibrate is True:
      inputs = leaves
      if any(isinstance(x, jax.core.Tracer) or
             isinstance(x, jax.ShapeDtypeStruct) for x in inputs):
        raise TypeError(
            "calibrate=True calibrates on the first call's inputs, which "
            "must be arrays, not tracers or shapes (call the transformed "
            "function outside jax.jit once, or pass calibrate=(args...))")
    else:
      given = (self._calibrate if isinstance(self._calibrate, tuple)
               else (self._calibrate,))
      calibration_leaves, _, key = self._flat(given, {})
      if key != self._flat(args, kwargs)[2]:
        raise TypeError("the calibrate= arguments do not have the structure "
                        "(or static arguments) of the call")
      inputs = calibration_leaves
    spec.calibrate(avals, inputs, self._tolerance, self._error_measure)

  # -- tracing -------------------------------------------------------------

  def _flat(self, args: Sequence, kwargs: dict):
    """The flat dynamic leaves, their spec (None if not made yet) and the
    key of the spec."""
    leaves, key = self._signature.flatten(args, kwargs)
    entry = self._specs.get(key)
    return leaves, entry[0] if entry else None, key

  def _spec(self, args: Sequence, kwargs: dict) -> tuple[_Spec, list]:
    leaves, spec, key = self._flat(args, kwargs)
    if spec is not None:
      return spec, self._specs[key][1]
    flat_fun, out_trees = self._signature.flat_function(key)
    mask = self._signature.param_mask(args, kwargs)
    explicit = self._signature.params is not None

    def param_rule(avals):
      # Only f32 values take the policy, unless named in params=.
      return [selected and (prog.is_float(a) if explicit else prog.is_f32(a))
              for selected, a in zip(mask, avals)]

    out_shardings = None
    if self._out_shardings is not None:
      out_prefix = self._out_shardings
      out_shardings = lambda: prog.leaf_shardings(
          out_prefix, jax.tree_util.tree_unflatten(
              out_trees[0], [0] * out_trees[0].num_leaves))

    spec = _Spec(flat_fun, name=prog.function_name(self.fun),
                 policy=self.policy, options=self._options,
                 param_rule=param_rule,
                 in_shardings=self._signature.in_shardings(
                     self._in_shardings, args, kwargs),
                 out_shardings=out_shardings)
    self._specs[key] = (spec, out_trees)
    return spec, out_trees

  def _traced(self, *args, **kwargs):
    spec, out_trees = self._spec(args, kwargs)
    leaves, _, _ = self._flat(args, kwargs)
    avals = [jax_compat.aval_of(x) for x in leaves]
    try:
      spec.program(avals)
    except (pl.VerificationError, pl.OptionError):
      raise
    except pl.RewriteError as error:
      warn_running_original(spec.name, error, stacklevel=4)
      return self._inner(*args, **kwargs)
    if pl.returns_measurements(self._options):
      self._last = (spec, avals)
      return self._measured(spec, avals, leaves, out_trees[0])
    outputs = amp_call_p.bind(*leaves, spec=spec)
    return jax.tree_util.tree_unflatten(out_trees[0], outputs)

  @staticmethod
  def _measured(spec: _Spec, avals: list, leaves: list, out_tree: Any
                ) -> tuple[Any, dict[str, Any]]:
    """The outputs and what the program measured of them (``numerics=``).
    The program is called directly, not through the differentiable
    primitive: measurements have no derivative, and `jax.grad` of such a
    call says so."""
    program = spec.program(avals)
    outputs, extra = program.call(leaves)
    return (jax.tree_util.tree_unflatten(out_tree, outputs),
            numerics.measurements(program.extra_out_roles, extra))


def _calibration_budget(calibrate: Any, tolerance: float | None,
                        error_measure: str) -> tuple[Any, float | None]:
  """`calibrate` (None when off) and its tolerance (default 1e-2); a
  TypeError for a budget given without calibration, a ValueError for a
  bad one."""
  if tolerance is not None and calibrate is None:
    raise TypeError("tolerance= is the calibration's budget: it needs "
                    "calibrate=True or calibrate=(args...)")
  from stablehlo_amp._src.calibration import (ERROR_MEASURES,
                                              check_measure)
  if error_measure != ERROR_MEASURES[0] and calibrate is None:
    raise TypeError("error_measure= measures the calibration's budget: it "
                    "needs calibrate=True or calibrate=(args...)")
  check_measure(error_measure)
  if calibrate is False:
    calibrate = None
  if calibrate is not None:
    tolerance = 1e-2 if tolerance is None else float(tolerance)
    if not tolerance > 0:
      raise ValueError(f"tolerance must be positive, got {tolerance}")
  return calibrate, tolerance


def transform(fun: Callable,
              policy: Policy | str = contract.default_policy(), *,
              static_argnums: int | Sequence[int] | None = None,
              static_argnames: str | Iterable[str] | None = None,
              donate_argnums: int | Sequence[int] | None = None,
              donate_argnames: str | Iterable[str] | None = None,
              in_shardings: Any = None, out_shardings: Any = None,
              params: int | str | Iterable[int | str] | None = None,
              calibrate: Any = None, tolerance: float | None = None,
              error_measure: str = "norm", **options: Any) -> Transformed:
  """Rewrites `fun` to a mixed-precision policy; use it like `jax.jit(fun)`.

  Args:
    fun: the function, as you would pass it to `jax.jit` (a `jax.jit`-wrapped
      function lends its static and donated arguments).
    policy: a `Policy` or its text, ``"p=f32,c=bf16,o=f32"``.
    static_argnums, static_argnames, donate_argnums, donate_argnames,
      in_shardings, out_shardings: as for `jax.jit`.
    params: the arguments (positions or names) that are parameters and take
      the ``p=`` dtype; default: every f32 input. Inputs in other dtypes
      (f64, f16, bf16) keep their dtype unless named here.
    options: the rewrite options, by keyword (the passes' own options; a
      target left out is `jax.default_backend()`):
OPTIONS
    calibrate, tolerance, error_measure: the accuracy budget (opt in). With
      ``calibrate=True`` the first call's inputs, or with
      ``calibrate=(args...)`` the given ones, are run through the f32 and
      the mixed program, and a minimal set of matrix-multiply groups is kept
      in f32 that brings every output within `tolerance` (default 1e-2) of
      f32: by backward elimination, from every group in f32, each group is
      lowered if the budget still holds. `error_measure` is ``"norm"``
      (``|got - f32| / |f32|`` in the 2-norm, default) or ``"max_abs"``
      (the largest elementwise difference over the largest f32 magnitude).
      The decision is made once per input signature and cached with the
      program; ``.lower(...).calibration`` says what was kept and what it
      cost (one compile per group, plus three).

  The result composes with `jax.jit`, `jax.grad`, `jax.vjp`, `jax.jvp` and
  `jax.vmap`: each derived program is lowered and rewritten with the same
  policy (calibration applies to the function itself). With ``numerics=``
  it returns ``(outputs, measured)``, for `jax.jit` and `jax.vmap` only.
  Host callbacks (``jax.debug.print``) run inside the rewritten program; a
  function with an ordered effect runs unchanged, with a warning.

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> fast = amp.transform(lambda w, x: jnp.tanh(x @ w), "p=f32,c=bf16,o=f32")
  >>> y = fast(jnp.ones((8, 8)), jnp.ones((4, 8)))
  >>> y.dtype, y.shape
  (dtype('float32'), (4, 8))
  >>> print(fast.lower(jnp.ones((8, 8)), jnp.ones((4, 8))).report())  # doctest: +ELLIPSIS
  amp-insert-converts: policy p=f32,c=bf16,o=f32, level ..., target ...
    lowered to bf16: 1 op (dot_general 1)
  ...
  """
  policy = as_policy(policy)
  if not callable(fun):
    raise TypeError(f"transform expects a callable, got {type(fun).__name__}")
  inherited = jax_compat.jit_options(fun)
  if inherited:
    fun = jax_compat.unwrap_jit(fun)
  pl.check_option_names(options, stateful=False)
  options = pl.RewriteOptions.make(**options)
  options.check_policy(policy)
  params_tuple = None if params is None else prog.as_tuple(params, "params")
  if params_tuple is not None:
    prog.check_params(fun, params_tuple)
  calibrate, tolerance = _calibration_budget(calibrate, tolerance,
                                            error_measure)

  def merged(name: str, given: Any) -> tuple:
    return tuple(dict.fromkeys(prog.as_tuple(given) + inherited.get(name, ())))

  return Transformed(
      fun, policy, params=params_tuple, options=options,
      static_argnums=merged("static_argnums", static_argnums),
      static_argnames=merged("static_argnames", static_argnames),
      donate_argnums=merged("donate_argnums", donate_argnums),
      donate_argnames=merged("donate_argnames", donate_argnames),
      in_shardings=in_shardings, out_shardings=out_shardings,
      calibrate=calibrate, tolerance=tolerance, error_measure=error_measure)


transform.__doc__ = transform.__doc__.replace(
    "OPTIONS", pl.options_help(stateful=False, indent=6))
