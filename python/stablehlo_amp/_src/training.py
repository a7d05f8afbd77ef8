"""Mixed-precision training with loss scaling fused into the compiled step.

`value_and_grad` and `train_step` lower the function with the loss cotangent
seed as an argument (`jax.vjp`, then `vjp(seed)`), wrap the gradients in the
custom call `amp-loss-scale` looks for, and run the precision rewrite and the
loss-scale pass on the module: the scale enters the backward pass where
autodiff starts, gradients are unscaled and checked once, the scale is
updated and an overflowed step is skipped inside the program. A step is one
compiled program with no host round trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

import inspect
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
  import optax

from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import numerics
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src import program as prog
from stablehlo_amp._src import train_state as ts
from stablehlo_amp._src.loss_scale import (DynamicLossScale, LossScale,
                                           NoOpLossScale,
                                           check_loss_scale,
                                           default_loss_scale)
from stablehlo_amp._src.policy import Policy, as_policy
from stablehlo_amp._src.program import (Lowered, OuterJit, is_float,
                                        function_name)
from stablehlo_amp._src.train_state import TrainState


def _leaves(tree: Any) -> list:
  return jax.tree_util.tree_leaves(tree)


def _signature(step: Callable) -> prog.CallSignature:
  """The call signature of a function a program is lowered from, whose
  first argument holds the parameters (as `amp.transform`'s ``params=``
  selects them): no static arguments."""
  return prog.CallSignature(step, prog.Arguments(step, (), ()),
                            params=prog.Arguments(step, (0,), ()))


def _lowering_inputs(signature: prog.CallSignature, args: tuple,
                     f32_leaves: Mapping[int, Any] = {}
                     ) -> tuple[tuple, list, list]:
  """What a program is lowered and called with, for the call `args` of
  `signature`: the export specs of `args` (float parameter leaves as f32:
  the pass gives them the `p=` dtype, f64 parameters (x64) keep theirs;
  the flat leaves `f32_leaves`, optimizer state the pass stores low, as
  f32 of the shape given there), the parameter flag of each flat leaf, and
  the flat leaves."""
  leaves, (treedef, _) = signature.flatten(args, {})
  flags = [selected and is_float(x) and
           jnp.dtype(x.dtype) != jnp.dtype(jnp.float64)
           for selected, x in zip(signature.param_mask(args, {}), leaves)]
  avals = [jax.ShapeDtypeStruct(jnp.shape(f32_leaves.get(i, x)),
                                jax_compat.dtype_of(f32_leaves.get(i, x)))
           for i, x in enumerate(leaves)]
  as_f32 = [flag or i in f32_leaves for i, flag in enumerate(flags)]
  specs, _ = jax.tree_util.tree_unflatten(treedef,
                                          prog.export_specs(avals, as_f32))
  return tuple(specs), flags, leaves


def _check_flag(name: str, value: Any) -> None:
  """TypeError unless `value` is a bool: a string such as 'no' is truthy,
  and would silently mean True."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_keep_f32_state(keep: Any) -> None:
  """TypeError unless `keep` is a function that can be called as
  keep(path, leaf), as jax.tree_util.tree_map_with_path calls it."""
  usage = ("keep_f32_state must be a function (path, leaf) -> bool over the "
           "optimizer state's leaves, like jax.tree_util.tree_map_with_path"
           "'s")
  if not callable(keep):
    raise TypeError(f"{usage}, got a {type(keep).__name__}")
  try:
    inspect.signature(keep).bind(None, None)
  except TypeError:
    raise TypeError(f"{usage}; the function given cannot be called with "
                    "two arguments (for a test of the leaf alone, write "
                    "lambda path, leaf: ...)") from None
  except ValueError:  # no signature (a builtin): called as it is
    pass


def _optimizer_hint(optimizer: Any) -> str:
  """What to do with something passed as the optimizer that is not an optax
  GradientTransformation."""
  if not callable(optimizer):
    return ""
  name = getattr(optimizer, "__name__", "")
  qualname = getattr(optimizer, "__qualname__", name)
  module = getattr(optimizer, "__module__", "") or ""
  if "<locals>" in qualname or getattr(optimizer, "__self__", None):
    return (": pass the GradientTransformation itself (for example "
            "optax.sgd(0.1)), not its update or init function")
  if module.split(".")[0] == "optax" and name:
    return f": call it, e.g. optax.{name}(learning_rate)"
  return ""


def _traced_as(user_fun: Callable, module_fn: Callable) -> Callable:
  """`module_fn`, named for JAX's tracing errors as the user's function
  (a tracer error says "while tracing the function loss at model.py:12",
  not the driver's module_fn)."""
  # Its own signature (the arguments JAX names), the user's code location.
  module_fn.__signature__ = inspect.signature(module_fn)
  module_fn.__name__ = module_fn.__qualname__ = function_name(user_fun)
  module_fn.__wrapped__ = user_fun
  return module_fn


def _check_scalar_loss(loss: Any, fun: Callable, has_aux: bool) -> None:
  shape = jnp.shape(loss) if hasattr(loss, "shape") else None
  if shape != () or not jnp.issubdtype(jnp.result_type(loss), jnp.floating):
    got = (f"{jnp.result_type(loss)}{list(shape)}" if shape is not None
           else type(loss).__name__)
    hint = ("" if has_aux else
            "; if it returns (loss, aux), pass has_aux=True")
    raise TypeError(f"{function_name(fun)} must return a scalar float loss, "
                    f"got {got}{hint}")


def _split_floats(tree: Any) -> tuple[list, Callable]:
  """The float leaves of `tree`, and a function putting new float leaves
  back with the non-float leaves unchanged."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  floats = [i for i, leaf in enumerate(leaves) if is_float(leaf)]

  def rebuild(new_floats: Sequence[Any]) -> Any:
    rebuilt = list(leaves)
    for i, value in zip(floats, new_floats):
      rebuilt[i] = value
    return jax.tree_util.tree_unflatten(treedef, rebuilt)
  return [leaves[i] for i in floats], rebuild


def _grad_of_floats(loss_fn: Callable, params: Any, seed: jax.Array, *,
                    has_aux: bool, user_fun: Callable) -> tuple[Any, Any, Any]:
  """(loss, aux, grads): `grads` has params' structure, with gradients on
  the float leaves and None on the others (integer counters, PRNG keys)."""
  floats, rebuild = _split_floats(params)
  fun = lambda *f: loss_fn(rebuild(f))
  if has_aux:
    loss, vjp, aux = jax.vjp(fun, *floats, has_aux=True)
  else:
    loss, vjp = jax.vjp(fun, *floats)
    aux = None
  _check_scalar_loss(loss, user_fun, has_aux)
  grads = vjp(seed.astype(jnp.result_type(loss)))
  leaves, treedef = jax.tree_util.tree_flatten(params)
  marked = iter(prog.mark_gradients(list(grads)))
  grads_tree = jax.tree_util.tree_unflatten(
      treedef, [next(marked) if is_float(x) else None for x in leaves])
  return loss, aux, grads_tree


def _random_state_paths(tree: Any) -> list[str]:
  """The paths of `tree`'s random state: PRNG keys, and a flax nnx
  Module's RNG state (its `RngKey`s and `RngCount`s, the latter uint32)."""
  nnx = sys.modules.get("flax.nnx")
  rng_state = getattr(nnx, "RngState", None)
  rng_types = (rng_state,) if isinstance(rng_state, type) else ()
  leaves, _ = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, rng_types))
  return [jax.tree_util.keystr(path) or "the root" for path, leaf in leaves
          if isinstance(leaf, rng_types) or jax.dtypes.issubdtype(
              jax_compat.dtype_of(leaf), jax.dtypes.prng_key)]


def _random_state_hint(paths: list[str], where: str) -> str:
  shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more"
                                  if len(paths) > 3 else "")
  return (f"{where} holds random state at {shown} (a PRNG key, or an nnx "
          "Module's Rngs): passed through unchanged, it would repeat the "
          "same dropout masks and random numbers every step")


def _check_array_leaves(tree: Any, what: str) -> None:
  """Every leaf of a step's arguments is an array or a number: TypeError
  naming the first that is not (an equinox Module's function), and how to
  split it off."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  for path, leaf in leaves:
    if isinstance(leaf, (bool, int, float, complex)) or (
        hasattr(leaf, "dtype") and hasattr(leaf, "shape")):
      continue
    at = jax.tree_util.keystr(path) or "the root"
    raise TypeError(
        f"{what} has a leaf that is not an array at {at}: a "
        f"{type(leaf).__name__}. Every leaf must be an array or a number; "
        "an equinox Module keeps functions and other static fields as "
        "leaves: split them off with `params, static = eqx.partition("
        "model, eqx.is_inexact_array)`, pass `params`, and rebuild the "
        "model in the loss with `eqx.combine(params, static)`")


def _check_no_random_state_in_params(params: Any) -> None:
  """train_step's params: random state there would be frozen (the step
  passes non-float leaves through), so it must be model state."""
  paths = _random_state_paths(params)
  if paths:
    raise TypeError(
        _random_state_hint(paths, "params") + ". Carry it as model state, "
        "which the loss returns updated: for an nnx Module, `graphdef, "
        "params, rest = nnx.split(model, nnx.Param, ...)`, "
        "`step.init(params, model_state=rest)`, and a loss "
        "`loss_fn(params, rest, batch)` that runs `model = nnx.merge("
        "graphdef, params, rest, copy=True)` and returns `(loss, "
        "nnx.state(model, nnx.Not(nnx.Param)))`; for a key, "
        "`model_state=key` and the loss returns the next key")


def _check_same_types(what: str, given: Any, returned: Any) -> None:
  """A step's new state must have the structure, shapes and dtypes of the
  state it was given (it is kept or discarded leaf by leaf, and the next
  step takes it). TypeError naming the first leaf that differs."""
  def describe(x) -> str:
    return f"{x.dtype}{list(x.shape)}"
  prefix = f"{what} with the structure, shapes and dtypes of the one given"
  given_paths = jax.tree_util.tree_flatten_with_path(given)
  returned_paths = jax.tree_util.tree_flatten_with_path(returned)
  if given_paths[1] != returned_paths[1]:
    raise TypeError(f"{prefix}: expected the structure {given_paths[1]}, "
                    f"got {returned_paths[1]}")
  for (path, a), (_, b) in zip(given_paths[0], returned_paths[0]):
    if a.shape != b.shape or a.dtype != b.dtype:
      raise TypeError(f"{prefix}: at {jax.tree_util.keystr(path) or 'the root'}"
                      f" expected {describe(a)}, got {describe(b)}")


class _LossScaledProgram:
  """Common machinery: an outer jit whose trace builds (once per signature)
  the rewritten program and calls it."""

  # Whether the step carries state across calls (FP8 amax histories), so
  # that options configuring such state apply.
  _stateful = False
  # Options the entry point sets itself, whatever the user gives.
  _fixed_options: dict = {}

  def __init__(self, fun: Callable, policy: Policy | str, options: dict):
    self.fun = fun
    self.policy = as_policy(policy)
    unknown = set(options) - set(pl.accepted_options(self._stateful))
    elsewhere = {
        "params": "params= selects the parameter arguments of amp.transform; "
                  "here the parameters are the params pytree (argnums for "
                  "value_and_grad), and every float leaf of it takes the p= "
                  "dtype",
        "calibrate": "calibrate= belongs to amp.transform: calibrate the "
                     "loss with amp.transform(loss, calibrate=...) and pass "
                     "what it keeps in f32 as keep_f32=",
        "tolerance": "tolerance= is calibration's budget, on amp.transform",
        "error_measure": "error_measure= measures calibration's budget, on "
                         "amp.transform",
        "keep_f32_state": "keep_f32_state= selects optimizer-state leaves "
                          "kept in f32, on amp.train_step",
        "fp8_fallback": "fp8_fallback= moves GEMMs out of FP8 between "
                        "steps, from the statistics they returned: "
                        "amp.train_step only (here, pass keep_gemms= the "
                        "GEMMs to keep in the compute dtype)"}
    for name in sorted(unknown):
      if name in elsewhere:
        raise TypeError(f"{type(self).__name__} does not take {name}=: "
                        f"{elsewhere[name]}")
    pl.check_option_names(options, self._stateful)
    # Options whose default differs where the state keeps bf16 parameters
    # (update_rounding: stochastic), from the contract.
    bf16_params = (self._stateful and jnp.dtype(self.policy.param_dtype) ==
                   jnp.dtype(jnp.bfloat16))
    defaults = {name: spec["bf16_params_default"]
                for name, spec in contract.options().items()
                if bf16_params and "bf16_params_default" in spec and
                name not in options}
    self._options = pl.RewriteOptions.make(**options, **defaults,
                                           **self._fixed_options)
    if (self._stateful and "check_grads" not in options and
        pl.returns_measurements(self._options)):
      # A step that measures its numerics checks its gradients too:
      # `explain` says whether they were finite, and whether applied.
      self._options = pl.RewriteOptions.make(**options, **defaults,
                                             check_grads=True)
    self._options.check_policy(self.policy)
    self._programs: dict = {}  # by input signature, for `lower`
    self.rewrite_count = 0

  def _build(self, key: Any, inner: Callable, export_args: tuple,
             param_flags: list, seed_leaf: int, loss_scale: LossScale,
             state_leaves=(), optimizer_state_leaves=()) -> prog.Program:
    if key in self._programs:  # the outer jit traced again (committedness)
      self._last_key = key
      return self._programs[key]
    self.rewrite_count += 1
    program = prog.build(inner, export_args, {}, param_flags=param_flags,
                         policy=self.policy, options=self._options,
                         source_name=function_name(self.fun),
                         seed_leaf=seed_leaf,
                         state_leaves=state_leaves,
                         optimizer_state_leaves=optimizer_state_leaves,
                         loss_scale=loss_scale)
    self._programs[key] = program
    self._last_key = key
    return program

  def last_report(self) -> "Report | None":
    """The report of the program this step last traced (what
    ``amp.explain(metrics, step)`` reads); None before the first call."""
    key = getattr(self, "_last_key", None)
    if key is None:
      return None
    return self._programs[key].as_lowered().result.report


class ValueAndGrad(_LossScaledProgram):
  """`amp.value_and_grad(loss_fn, policy)`: call as
  ``(value, grads), grads_finite, loss_scale = vg(*args, loss_scale=ls)``,
  and with ``numerics=`` set, ``..., loss_scale, measured = vg(...)``.
  """

  # grads_finite is part of what it returns, with a loss scale or without.
  _fixed_options = {"check_grads": True}

  def __init__(self, fun: Callable, policy: Policy | str, *, has_aux: bool,
               argnums: int | Sequence[int], **options):
    super().__init__(fun, policy, options)
    _check_flag("has_aux", has_aux)
    self.has_aux = has_aux
    self.argnums = argnums
    if isinstance(argnums, int):
      nums = (argnums,)
    else:
      nums = tuple(argnums)
      if not nums:
        raise ValueError("argnums must name at least one argument, got ()")
    if not all(isinstance(n, int) for n in nums):
      raise TypeError(f"argnums must be an int or a sequence of ints, got "
                      f"{argnums!r}")
    self._nums = nums

    def module_fn(diff: dict, rest: dict, kwargs: dict, seed):
      # `diff` and `rest` map positions to arguments: the positions are
      # pytree keys, so they are part of the signature the program is for.
      def loss_of(d):
        merged = {**d, **rest}
        return fun(*[merged[i] for i in range(len(merged))], **kwargs)
      return _grad_of_floats(loss_of, diff, seed, has_aux=has_aux,
                             user_fun=fun)

    self._signature = _signature(module_fn)
    self._inner = jax.jit(_traced_as(fun, module_fn))
    self._outer = OuterJit(self._traced, self._options)

  def _positions(self, count: int) -> tuple[int, ...]:
    """`argnums` as positions among `count` positional arguments."""
    for n in self._nums:
      if not -count <= n < count:
        raise ValueError(
            f"argnums={self.argnums!r} needs at least "
            f"{(n if n >= 0 else -n - 1) + 1} positional arguments, "
            f"{function_name(self.fun)} was called with {count}")
    return tuple(n % count for n in self._nums)

  def _split(self, args: tuple) -> tuple[dict, dict]:
    positions = set(self._positions(len(args)))
    return ({i: a for i, a in enumerate(args) if i in positions},
            {i: a for i, a in enumerate(args) if i not in positions})

  def _check_random_state(self, args: tuple) -> None:
    """Random state among the differentiated arguments would not advance
    (and has no gradient): TypeError saying how to pass it instead."""
    for position, argument in enumerate(args):
      _check_array_leaves(argument, f"argument {position} of "
                          f"{function_name(self.fun)}")
    for position, argument in self._split(args)[0].items():
      if (paths := _random_state_paths(argument)):
        raise TypeError(
            _random_state_hint(paths, f"argument {position} of "
                               f"{function_name(self.fun)}, which argnums "
                               "differentiates,") + ", and it has no "
            "gradient. Pass it as another argument and return its new "
            "value (has_aux=True): for an nnx Module, `graphdef, params, "
            "rest = nnx.split(model, nnx.Param, ...)`, differentiate "
            "`params`, and merge them in the function with `nnx.merge("
            "graphdef, params, rest, copy=True)`")

  def __call__(self, *args, loss_scale: LossScale | None = None, **kwargs):
    self._check_random_state(args)
    check_loss_scale(loss_scale)
    if loss_scale is None:
      loss_scale = default_loss_scale(self.policy.compute_dtype)
    return self._outer(args, kwargs, loss_scale)

  def lower(self, *args, loss_scale: LossScale | None = None,
            **kwargs) -> Lowered:
    self._check_random_state(args)
    check_loss_scale(loss_scale)
    if loss_scale is None:
      loss_scale = default_loss_scale(self.policy.compute_dtype)
    jax_lowered = self._outer.lower(args, kwargs, loss_scale)
    diff, rest = self._split(args)
    return Lowered(jax_lowered, self._programs.get(
        prog.signature_key((diff, rest, kwargs, loss_scale))))

  def _traced(self, args, kwargs, loss_scale):
    diff, rest = self._split(args)
    for position, argument in diff.items():
      leaves = jax.tree_util.tree_leaves(argument)
      if not any(jnp.issubdtype(jax_compat.dtype_of(x), jnp.inexact)
                 for x in leaves):
        dtypes = sorted({str(jax_compat.dtype_of(x)) for x in leaves})
        raise TypeError(
            f"argnums selects argument {position} of "
            f"{function_name(self.fun)}, "
            f"which has no float values ({', '.join(dtypes) or 'no arrays'})"
            ": gradients are taken with respect to float arguments only, as "
            "in jax.grad; choose argnums among the float arguments")
    seed = jnp.ones((), jnp.float32)
    export_args, flags, leaves = _lowering_inputs(
        self._signature, (diff, rest, kwargs, seed))
    program = self._build(prog.signature_key((diff, rest, kwargs, loss_scale)),
                          self._inner, export_args, flags, len(leaves) - 1,
                          loss_scale)
    outputs, extra = program.call(leaves, ts.appended_inputs(
        program, {"loss_scale": loss_scale}, None))
    loss, aux, grads = jax.tree_util.tree_unflatten(program.out_tree, outputs)
    # Leaves that are not floats (integer counters) get zeros of their own
    # dtype (jax.grad(allow_int=True) gives float0, which optimizers reject).
    # A None in the arguments stays None (equinox's eqx.partition leaves
    # None where a leaf is not an array), as in jax.grad.
    grads = jax.tree_util.tree_map(
        lambda g, x: None if x is None else
        jnp.zeros(jnp.shape(x), jnp.result_type(x)) if g is None else g,
        grads, diff, is_leaf=lambda g: g is None)
    positions = self._positions(len(args))
    grads = (grads[positions[0]] if isinstance(self.argnums, int) else
             tuple(grads[i] for i in positions))
    value = (loss, aux) if self.has_aux else loss
    measured = numerics.measurements(program.extra_out_roles, extra)
    extra = ts.appended_results(program, extra).get("loss_scale", [])
    result = ((value, grads), loss_scale.grads_finite(extra),
              loss_scale.with_state(extra))
    # numerics= adds what it measured, as train_step's metrics hold it.
    return (result + (measured,) if pl.returns_measurements(self._options)
            else result)


def value_and_grad(fun: Callable,
                   policy: Policy | str = contract.default_policy(
                       training=True),
                   *, argnums: int | Sequence[int] = 0, has_aux: bool = False,
                   **options) -> ValueAndGrad:
  """Like `jax.value_and_grad(fun, argnums, has_aux)`, rewritten to `policy`
  with loss scaling inside the compiled program.

  Returns a function ``vg(*args, loss_scale=ls, **kwargs)`` giving
  ``(value, grads), grads_finite, new_loss_scale``: gradients unscaled, in
  f32 for f32, bf16 and f16 arguments alike (they are unscaled and checked
  in f32; a cast to f16 could overflow after the check). As in JAX,
  `argnums` is a position (negative ones count from the end) or a sequence
  of them (`grads` is then a tuple in that order), and keyword arguments
  are not differentiated. The float leaves of the differentiated arguments
  are the parameters (they take the ``p=`` dtype, f64 kept); their other
  leaves get zero gradients of their own dtype. `loss_scale` defaults to
  `DynamicLossScale()` for f16 compute and `NoOpLossScale()` otherwise.
  `options` are the rewrite options of `amp.transform`. With
  ``numerics="provenance"`` or ``"stats"`` a fourth element holds what the
  program measured, as in `train_step`'s metrics: ``{"nonfinite":
  NonFinite}`` or ``{"gemm_stats": GemmStats}``, read with `amp.explain`
  and ``vg.lower(...).report()``. The length is fixed when `vg` is made,
  never per call. It is not the same for every ``numerics=`` because a
  fourth element present always would break the three-element unpacking
  every loop without measurements writes (``(value, grads), finite, ls =
  vg(...)``, as this docstring's example and `PrecisionHandler` do);
  measuring is asked for, like `amp.transform(f, numerics=...)`, which
  returns ``(outputs, measured)`` in place of ``outputs``.

  >>> import jax.numpy as jnp, stablehlo_amp as amp
  >>> vg = amp.value_and_grad(lambda w, x: jnp.sum((x @ w) ** 2))
  >>> (loss, grads), finite, ls = vg(jnp.ones((8, 8)), jnp.ones((4, 8)),
  ...                                loss_scale=amp.DynamicLossScale(2.0 ** 10))
  >>> float(loss), grads.dtype, bool(finite), float(ls.loss_scale)
  (2048.0, dtype('float32'), True, 1024.0)
  """
  return ValueAndGrad(fun, policy, has_aux=has_aux, argnums=argnums,
                      **options)


# With a fixed loss scale (or none), this many skipped steps make the step
# warn that training is not progressing; dynamic scaling warns once its
# scale has backed off to its minimum.


STUCK_STEPS = 10


def _check_step_options(policy: Policy, options: pl.RewriteOptions,
                        given: Mapping[str, Any], optimizer: Any,
                        keep_f32_state: Any) -> None:
  """The errors of `train_step`'s arguments that no single option can see:
  options that configure state or GEMMs the step does not have, and an
  optimizer that is not a GradientTransformation."""
  if keep_f32_state is not None:
    _check_keep_f32_state(keep_f32_state)
    if options.opt_state_dtype == contract.values("opt_state_dtype").f32:
      raise ValueError(
          "keep_f32_state= selects optimizer-state leaves to keep in f32 "
          "when the rest are stored low: add opt_state_dtype='bf16' (or "
          "'f8')")
  fp8_options = sorted(name for name in given if contract.options()[
      name]["pass"] == contract.FP8_GEMMS)
  if fp8_options and policy.gemm == contract.values("gemm").compute:
    raise ValueError(
        f"{', '.join(fp8_options)} configure"
        f"{'s' if len(fp8_options) == 1 else ''} FP8 GEMMs, and policy "
        f"{policy} has none: add gemm=f8 (for example "
        "p=f32,c=bf16,o=f32,gemm=f8)")
  if (options.update_rounding != contract.values("update_rounding").nearest
      and jnp.dtype(policy.param_dtype) != jnp.dtype(jnp.bfloat16)):
    raise ValueError(
        f"update_rounding={options.update_rounding!r} rounds bf16 "
        f"parameters, and policy {policy} keeps them in "
        f"{jnp.dtype(policy.param_dtype).name}: use p=bf16 (for example "
        "p=bf16,c=bf16,o=f32)")
  if not (callable(getattr(optimizer, "init", None)) and
          callable(getattr(optimizer, "update", None))):
    name = getattr(optimizer, "__name__", type(optimizer).__name__)
    raise TypeError(
        "optimizer must be an optax GradientTransformation (with init and "
        f"update), got {name!r}" + _optimizer_hint(optimizer))


def _outer_jit(step: "TrainStep") -> OuterJit:
  """The jit a TrainStep's calls go through: a function of its own each
  time, so that a step built again (with GEMMs fp8_fallback moved) is
  traced again, not found in jit's cache."""
  def traced(state, batch, shardings):
    return step._traced(state, batch, shardings)
  # The third argument, static: the shardings of the state's leaves, which
  # the new state keeps (see train_state.state_shardings).
  return OuterJit(traced, step._options,
                  donate_argnums=(0,) if step.donate else (),
                  static_argnums=(2,))


def _fp8_fallback_watch(fallback: Any, policy: Policy | str,
                        options: dict[str, Any]) -> tuple:
  """What watches the statistics for `fp8_fallback=` (None without it),
  and the options with the statistics it needs; the errors of a value
  that is not an `Fp8Fallback`, no FP8 GEMMs to move, statistics it cannot
  have, or state that would change shape."""
  if fallback is None:
    return None, options
  if not isinstance(fallback, numerics.Fp8Fallback):
    raise TypeError("fp8_fallback must be amp.Fp8Fallback(underflow=..., "
                    "saturation=..., check_every=...), got "
                    f"{type(fallback).__name__}")
  policy = as_policy(policy)
  if policy.gemm == contract.values("gemm").compute:
    raise ValueError(f"fp8_fallback moves FP8 GEMMs to the compute dtype, "
                     f"and policy {policy} has none: add gemm=f8 (for "
                     "example p=f32,c=bf16,o=f32,gemm=f8)")
  given = options.get("numerics")
  if given is not None and given != contract.values("numerics").stats:
    raise ValueError(f"fp8_fallback decides from the GEMMs' statistics "
                     f"(numerics='stats'), and numerics={given!r} asks for "
                     "something else: a step measures one of them")
  if options.get("fp8_scaling") == contract.values("fp8_scaling").delayed:
    raise ValueError("fp8_fallback cannot move GEMMs with "
                     "fp8_scaling='delayed': each FP8 GEMM's amax history "
                     "is state, which would change shape; use 'current' "
                     "(the default) or 'rowwise'")
  if given is None:
    options = {**options, "numerics": contract.values("numerics").stats}
  return numerics.Fp8FallbackWatch(fallback), options


def _loss_with_model_state(loss_fn: Callable, has_aux: bool, model_state: Any,
                           batch: Any) -> Callable:
  """``params -> (loss, (new_model_state, aux))`` for a loss that takes and
  returns model state; a TypeError for a loss that returns no pair."""
  def loss_of(params):
    returned = loss_fn(params, model_state, batch)
    if not (isinstance(returned, tuple) and len(returned) == 2):
      shape = getattr(returned, "shape", None)
      raise TypeError(
          f"with a model state, {function_name(loss_fn)}(params, "
          "model_state, batch) must return (loss, new_model_state)"
          + (" (with has_aux=True: (loss, (new_model_state, aux)))"
             if has_aux else "")
          + "; it returned "
          + (f"an array of shape {tuple(shape)}" if shape is not None
             else f"a {type(returned).__name__}")
          + ". Return the model state unchanged if the loss does not "
          "update it")
    loss, out = returned
    new_state, aux = out if has_aux else (out, None)
    return loss, (new_state, aux)
  return loss_of


class StepOutputs(NamedTuple):
  """What a training step's program returns. A NamedTuple is a pytree
  whose leaves flatten in field order, and that order is the program's:
  the loss and aux first, then the new state, each leaf of which
  amp-loss-scale keeps only where the gradients are finite (the step
  pairs them with its inputs by position after the first two)."""
  loss: Any
  aux: Any           # the loss function's aux; None without has_aux
  params: Any        # the new parameters
  opt_state: Any     # the new optimizer state
  model_state: Any   # the new model state; None without one


def _step_function(loss_fn: Callable, optimizer: Any, has_aux: bool,
                   with_state: bool) -> Callable:
  """The step the program is lowered from: ``(params, opt_state,
  model_state, batch, seed) -> StepOutputs``, the optimizer working on f32
  values of the float parameters (`optimizer_view`); the other leaves pass
  through."""
  import optax

  def step(params, opt_state, model_state, batch, seed):
    if with_state:
      loss, (new_state, aux), grads = _grad_of_floats(
          _loss_with_model_state(loss_fn, has_aux, model_state, batch),
          params, seed, has_aux=True, user_fun=loss_fn)
    else:
      loss, aux, grads = _grad_of_floats(
          lambda p: loss_fn(p, batch), params, seed, has_aux=has_aux,
          user_fun=loss_fn)
      new_state = None
    view = ts.optimizer_view(params)
    updates, opt_state = optimizer.update(grads, opt_state, view)
    new_params = jax.tree_util.tree_map(
        lambda new, old: old if new is None else new,
        optax.apply_updates(view, updates), params,
        is_leaf=lambda x: x is None)
    return StepOutputs(loss, aux, new_params, opt_state, new_state)
  return step


class _StuckWatch:
  """Warns once when training is not progressing: skipped steps that no
  loss scale can fix (dynamic scaling at its floor, or a fixed scale)."""

  def __init__(self, policy: Policy, loss_scale: LossScale,
               options: pl.RewriteOptions):
    self.policy, self.options = policy, options
    self.dynamic = isinstance(loss_scale, DynamicLossScale)
    self.scaled = not isinstance(loss_scale, NoOpLossScale)
    self.count, self.warned = 0, False

  def watch(self, finite, loss, loss_scale, skipped) -> None:
    """A skipped step at the floor calls back to the host. Nothing runs on
    finite steps. Only where the step runs on this machine's backend: a
    host callback cannot be compiled for another (a deviceless GPU compile
    on a CPU host)."""
    if self.options.target != pl.default_target():
      return
    if isinstance(loss_scale, DynamicLossScale):
      floor = loss_scale.loss_scale <= jnp.float32(loss_scale.min_scale)
    else:
      floor = jnp.asarray(True)
    jax.lax.cond(
        jnp.logical_and(jnp.logical_not(finite), floor),
        lambda: jax.debug.callback(self._stuck, skipped, jnp.isfinite(loss),
                                   loss_scale.loss_scale),
        lambda: None)

  def _stuck(self, skipped, loss_finite, scale) -> None:
    self.count += 1
    if self.warned or (not self.dynamic and self.count < STUCK_STEPS):
      return
    self.warned = True
    at_scale = (f", the last ones at a loss scale of {float(scale):g}"
                + (" (its minimum)" if self.dynamic else "")
                if self.scaled else "")
    warnings.warn(
        f"stablehlo-amp: {int(skipped)} steps skipped so far{at_scale}: "
        + self._why(bool(loss_finite)) + ". Skipped steps leave the "
        "parameters unchanged, so training is not progressing",
        stacklevel=2)

  def _why(self, loss_finite: bool) -> str:
    """What is known of why, and how to find out the rest: values that are
    not finite may be a low-precision overflow or a run that diverges (a
    learning rate too large, bad data); only provenance or a run in f32
    tells them apart."""
    if loss_finite:
      known = "the gradients are not finite while the loss is"
      if self.scaled and not self.dynamic:
        known += " (a smaller loss scale, or DynamicLossScale, may fix it)"
    else:
      known = "the loss is not finite at the current parameters"
      if self.scaled:
        known += ", which no loss scale can fix"
    see = ("numerics='provenance' and amp.explain(metrics, step) say where "
           "the first NaN or infinity came from")
    compute = jnp.dtype(self.policy.compute_dtype)
    if compute.itemsize >= 4:
      return (f"{known}. The step computes in {compute.name}, so precision "
              "is not the cause: a learning rate too large or bad data is "
              f"likely; {see}")
    return (f"{known}. It may be an overflow in {compute.name} or a run "
            "that diverges (a learning rate too large, bad data): "
            f"{see}, and the same steps with c=f32 tell the two apart")


class TrainStep(_LossScaledProgram):
  """`amp.train_step(...)`: ``state = step.init(params)``, then
  ``state, metrics = step(state, batch)``. What the state holds and how it
  is checked is `train_state.StateLayout`'s; this class lowers, rewrites
  and calls the step."""

  _stateful = True

  def __init__(self, loss_fn: Callable,
               optimizer: "optax.GradientTransformation",
               policy: Policy | str, loss_scale: LossScale | None,
               donate: bool, has_aux: bool,
               keep_f32_state: Callable[[Any, Any], bool] | None = None,
               fp8_fallback: numerics.Fp8Fallback | None = None,
               **options):
    self._fp8_watch, options = _fp8_fallback_watch(fp8_fallback, policy,
                                                   options)
    super().__init__(loss_fn, policy, options)
    _check_flag("donate", donate)
    _check_flag("has_aux", has_aux)
    _check_step_options(self.policy, self._options, options, optimizer,
                        keep_f32_state)
    check_loss_scale(loss_scale)
    self.optimizer, self.has_aux, self.donate = optimizer, has_aux, donate
    if loss_scale is None:
      loss_scale = default_loss_scale(self.policy.compute_dtype)
    self.layout = ts.StateLayout(optimizer, self.policy, self._options,
                                 loss_scale, keep_f32_state)
    self._watch = _StuckWatch(self.policy, loss_scale, self._options)
    steps = {with_state: _step_function(loss_fn, optimizer, has_aux,
                                        with_state)
             for with_state in (False, True)}
    self._signature = _signature(steps[False])
    self._inner = {with_state: jax.jit(_traced_as(loss_fn, step))
                   for with_state, step in steps.items()}
    self._outer = _outer_jit(self)

  @property
  def skips_nonfinite(self) -> bool:
    """Whether a non-finite step is skipped (a loss scale, skip_nonfinite)
    or applied, as in a plain JAX step."""
    return self._watch.scaled or self._options.skip_nonfinite

  @property
  def fp8_fallbacks(self) -> tuple[numerics.Fp8FallbackEvent, ...]:
    """The GEMMs `fp8_fallback` moved so far, when, and on what figures."""
    return tuple(self._fp8_watch.events) if self._fp8_watch else ()

  def init(self, params: Any, model_state: Any = None, *,
           rounding_seed: int = 0) -> TrainState:
    """The first state: parameters (float leaves in the `p=` dtype, f64
    kept), optimizer state (made from the float parameters in f32, None in
    place of the others), loss-scale state, model state, and with
    ``update_rounding="stochastic"`` the state of the random bits that
    round the parameters (from `rounding_seed`), with
    ``update_rounding="kahan"`` a zero compensation buffer per bf16
    parameter.

    With `donate=True` the step consumes its state, so `init` copies the
    arrays it is given: the caller's `params` stay valid."""
    _check_array_leaves(params, "params")
    _check_array_leaves(model_state, "model_state")
    _check_no_random_state_in_params(params)
    return self.layout.init(params, model_state, copy=self.donate,
                            rounding_seed=rounding_seed)

  def __call__(self, state: TrainState, batch: Any):
    self.layout.check(state)
    if self._fp8_watch is None:
      return self._outer(state, batch, ts.state_shardings(state))
    key = self._program_key(state, batch)
    state, metrics = self._outer(state, batch, ts.state_shardings(state))
    if self._fp8_watch.observe(
        metrics["gemm_stats"], self._programs[key].as_lowered().result.report):
      # GEMMs left FP8: the next call builds and compiles the step again.
      self._options = self._options.replace(keep_gemms=tuple(sorted(
          set(self._options.keep_gemms) | set(self._fp8_watch.kept))))
      self._programs, self._outer = {}, _outer_jit(self)
    return state, metrics

  def lower(self, state: TrainState, batch: Any) -> Lowered:
    self.layout.check(state)
    jax_lowered = self._outer.lower(state, batch, ts.state_shardings(state))
    return Lowered(jax_lowered,
                   self._programs.get(self._program_key(state, batch)),
                   fp8_fallbacks=tuple(map(str, self.fp8_fallbacks)))

  def _program_key(self, state: TrainState, batch: Any) -> Any:
    # The amax histories appear after the first step; the program is the
    # same with or without them.
    return prog.signature_key((state._replace(amax_history=None), batch))

  def _program(self, state: TrainState, batch: Any) -> tuple:
    """The rewritten program of the step for this state and batch, and
    the flat leaves it is called with. Optimizer-state leaves stored low
    are lowered in f32, as the optimizer makes them (amp-round-state
    stores them)."""
    seed = jnp.ones((), jnp.float32)
    low_state = self.layout.low_leaves(state.params)
    export_args, flags, leaves = _lowering_inputs(
        self._signature, (state.params, state.opt_state, state.model_state,
                          batch, seed), f32_leaves=low_state)
    inner = self._inner[state.model_state is not None]
    _, opt_state, model_state, _, _ = export_args
    out = jax.eval_shape(inner, *export_args)
    _check_same_types(f"{function_name(self.fun)} must return a new model "
                      "state", model_state, out.model_state)
    _check_same_types("the optimizer's update must return an optimizer state",
                      opt_state, out.opt_state)
    # The new parameters, optimizer state and model state are the outputs
    # after the loss and aux (StepOutputs' order); each is the new value of
    # the input leaf in the same place, kept only when the gradients are
    # finite.
    loss_aux = len(_leaves((out.loss, out.aux)))
    carried = len(_leaves((state.params, state.opt_state,
                           state.model_state)))
    program = self._build(self._program_key(state, batch), inner,
                          export_args, flags, len(leaves) - 1,
                          state.loss_scale,
                          [(loss_aux + i, i) for i in range(carried)],
                          optimizer_state_leaves=sorted(low_state))
    return program, leaves

  def _traced(self, state: TrainState, batch, shardings: tuple):
    program, leaves = self._program(state, batch)
    step = ts.StepContext(jax.tree_util.tree_structure(state.params),
                          self._options)
    fields = state._asdict()
    outputs, extra = program.call(
        leaves, ts.appended_inputs(program, fields, step))
    out: StepOutputs = jax.tree_util.tree_unflatten(program.out_tree,
                                                    outputs)
    state = state._replace(params=out.params, opt_state=out.opt_state,
                           model_state=out.model_state,
                           **ts.taken_fields(program, fields, extra, step))
    state = state._replace(**dict(zip(
        ts.CARRIED, ts.keep_shardings(tuple(getattr(state, f) for f in
                                            ts.CARRIED), shardings))))
    state, finite, state_finite = _count_skip(self, program, fields, extra,
                                              state, out.loss)
    # A check the step did not make (None) is no metric.
    metrics = {k: v for k, v in (
        ("loss", out.loss), ("grads_finite", finite),
        ("loss_scale", jnp.asarray(state.loss_scale.loss_scale, jnp.float32)),
        ("skipped_steps", state.skipped_steps),
        ("state_finite", state_finite)) if v is not None}
    metrics.update(numerics.measurements(program.extra_out_roles, extra))
    if self.has_aux:
      metrics["aux"] = out.aux
    return state, metrics


def _count_skip(step: TrainStep, program, fields: dict, extra, state,
                loss) -> tuple:
  """The step's state with a skipped step counted, whether its gradients
  were finite (None where the step did not check them: no loss scale,
  check_grads=False), and with skip_nonfinite whether its new state was
  (the program's last appended result; else None). Without a loss scale
  the program skips nothing unless skip_nonfinite asks (amp-loss-scale
  keeps the old state only then), and nothing is counted."""
  finite = (fields["loss_scale"].grads_finite(
      ts.appended_results(program, extra)["loss_scale"])
            if contract.attribute("grads_finite") in program.extra_out_roles
            else None)
  state_finite = (extra[program.extra_out_roles.index(
      contract.attribute("state_finite"))]
                  if step._options.skip_nonfinite else None)
  kept = finite if state_finite is None else finite & state_finite
  if fields["loss_scale"].mode != "none" or state_finite is not None:
    state = state._replace(skipped_steps=state.skipped_steps + jnp.where(
        kept, 0, 1).astype(jnp.int32))
    step._watch.watch(kept, loss, state.loss_scale, state.skipped_steps)
  return state, finite, state_finite


def train_step(loss_fn: Callable, optimizer: "optax.GradientTransformation",
               policy: Policy | str = contract.default_policy(
                   training=True), *,
               loss_scale: LossScale | None = None, donate: bool = False,
               has_aux: bool = False,
               keep_f32_state: Callable[[Any, Any], bool] | None = None,
               fp8_fallback: numerics.Fp8Fallback | None = None,
               **options) -> TrainStep:
  """One compiled mixed-precision training step with loss scaling inside.

  `loss_fn(params, batch)` returns a scalar loss, or ``(loss, aux)`` with
  ``has_aux=True`` (aux comes back as ``metrics["aux"]``). With model state
  (BatchNorm statistics), ``state = step.init(params, model_state=...)`` and
  ``loss_fn(params, model_state, batch)`` returns ``(loss, new_model_state)``
  or, with ``has_aux=True``, ``(loss, (new_model_state, aux))``.

  Gradient transformations in `optimizer` (clipping in an optax chain) see
  unscaled gradients. With a loss scale, an overflowed step leaves
  parameters, optimizer state and model state bit-identical and counts in
  ``metrics["skipped_steps"]``. Without one (`NoOpLossScale`, the default
  for bf16) the step skips nothing, as a plain JAX step, and checks
  nothing: a check of every gradient costs a kernel each, and a skip
  would hold every update until all are checked. ``check_grads=True``
  (the default with ``numerics=``) checks them (``metrics["grads_finite"]``,
  which a loss scale always reports); ``skip_nonfinite=True`` skips a step
  whose gradients or new state are not finite.
  Non-float leaves of `params` (integer counters) pass through unchanged:
  the optimizer sees None in their place (as with `eqx.filter`), so they
  have no optimizer state; the new model state must have the structure,
  shapes and dtypes of the one given.
  ``p=bf16`` stores the parameters in bf16 (the update is computed in f32
  and rounded once per step: by default without bias,
  ``update_rounding="stochastic"``; with ``"kahan"`` to nearest with a
  bf16 buffer per parameter carrying what the rounding lost; with
  ``"nearest"`` to nearest, losing updates below half a bf16 ulp). ``opt_state_dtype="bf16"`` stores the
  optimizer's float tensors in bf16 (updated in f32); the leaves for which
  ``keep_f32_state(path, leaf)`` is true (a function like
  `jax.tree_util.tree_map_with_path`'s) stay f32. `loss_scale`
  defaults to `DynamicLossScale()` for f16 compute and `NoOpLossScale()`
  otherwise.

  With an FP8 policy (``gemm=f8``), ``fp8_scaling="delayed"`` scales each
  FP8 operand by the max of its last `amax_history` amaxes (default 16),
  carried in ``state.amax_history`` (made by the first step, which
  therefore compiles a second time; an overflowed step leaves them as they
  were); the default ``"current"`` scales by this step's amax.
  ``fp8_fallback=amp.Fp8Fallback()`` measures the GEMMs (``numerics=
  "stats"``) and moves one whose FP8 operand underflows or saturates too
  much to the compute dtype from the next step on, compiling the step again
  when that set grows (``step.fp8_fallbacks`` and the report list each move
  and its figures); ``keep_gemms=`` names such GEMMs by hand.

  The rewrite options, by keyword (those of `amp.transform`, and the ones
  that configure the state a step carries):
OPTIONS

  >>> import jax.numpy as jnp, optax, stablehlo_amp as amp
  >>> step = amp.train_step(lambda w, b: jnp.mean((b @ w) ** 2),
  ...                       optax.sgd(0.1), "p=f32,c=f16,o=f32")
  >>> state = step.init(jnp.ones((8, 8)))
  >>> state, metrics = step(state, jnp.ones((4, 8)))
  >>> sorted(metrics), int(metrics["skipped_steps"])
  (['grads_finite', 'loss', 'loss_scale', 'skipped_steps'], 0)
  """
  return TrainStep(loss_fn, optimizer, policy, loss_scale, donate, has_aux,
                   keep_f32_state, fp8_fallback, **options)


class PrecisionHandler:
  """The eformer/MindSpore-style handler, built on the compiler pass.

  - `inference_wrapper(fn)` is `amp.transform(fn, policy)`;
  - `training_step(loss_fn)` is functional and works under `jax.jit`:
    ``step(params, *args, loss_scale=ls) -> (loss, grads, grads_finite,
    new_loss_scale)``;
  - `training_step_wrapper(loss_fn)` keeps the loss-scale state on the
    handler for eager loops: ``step(params, *args) -> (loss, grads,
    grads_finite)``. It cannot run under `jax.jit` (the state would be a
    tracer); it raises a TypeError pointing to `training_step` there.
  """

  def __init__(self, policy: Policy | str, loss_scale: LossScale | None = None,
               **options):
    self.policy = as_policy(policy)
    check_loss_scale(loss_scale)
    self.loss_scale = (loss_scale if loss_scale is not None else
                       default_loss_scale(self.policy.compute_dtype))
    self._options = options

  def inference_wrapper(self, fn: Callable, **jit_options):
    from stablehlo_amp._src.transform import transform
    return transform(fn, self.policy, **self._options, **jit_options)

  def training_step(self, loss_fn: Callable, has_aux: bool = False):
    vg = value_and_grad(loss_fn, self.policy, has_aux=has_aux,
                        **self._options)

    def step(params, *args, loss_scale: LossScale | None = None):
      loss_scale = self.loss_scale if loss_scale is None else loss_scale
      (loss, grads), finite, loss_scale = vg(params, *args,
                                             loss_scale=loss_scale)
      return loss, grads, finite, loss_scale
    return step

  def training_step_wrapper(self, loss_fn: Callable, has_aux: bool = False):
    functional = self.training_step(loss_fn, has_aux)

    def step(params, *args):
      leaves = jax.tree_util.tree_leaves((params, args))
      if any(isinstance(x, jax.core.Tracer) for x in leaves):
        raise TypeError(
            "PrecisionHandler.training_step_wrapper keeps the loss scale on "
            "the handler and cannot run under jax.jit or other "
            "transformations; use handler.training_step(loss_fn), which "
            "takes and returns the loss scale")
      loss, grads, finite, self.loss_scale = functional(params, *args)
      return loss, grads, finite
    return step


train_step.__doc__ = train_step.__doc__.replace(
    "OPTIONS", pl.options_help(stateful=True, indent=4))
