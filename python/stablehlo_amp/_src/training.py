"""Mixed-precision training with loss scaling fused into the compiled step.

`value_and_grad` and `train_step` lower the function with the loss cotangent
seed as an argument (`jax.vjp`, then `vjp(seed)`), wrap the gradients in the
marker `amp-loss-scale` looks for, and run the precision rewrite and the
loss-scale pass on the module: the scale enters the backward pass where
autodiff starts, gradients are unscaled and checked once, the scale is updated
and an overflowed step is skipped inside the program. A step is one compiled
program with no host round trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
  import optax

from stablehlo_amp._src import program as prog
from stablehlo_amp._src.loss_scale import LossScale, default_loss_scale
from stablehlo_amp._src.policy import Policy, as_policy
from stablehlo_amp._src.transform import (Lowered, _is_float, _name,
                                          _signature, check_options)


def _float_flags(tree: Any, selected: bool) -> list[bool]:
  return [selected and _is_float(x) for x in jax.tree_util.tree_leaves(tree)]


def _spec(tree: Any, as_param: bool) -> Any:
  """Abstract values for export: parameters in f32, the rest as they are."""
  def spec(x):
    dtype = jnp.float32 if as_param and _is_float(x) else jnp.result_type(x)
    return jax.ShapeDtypeStruct(jnp.shape(x), dtype)
  return jax.tree_util.tree_map(spec, tree)


class _LossScaledProgram:
  """Common machinery: an outer jit whose trace builds (once per signature)
  the rewritten program and calls it."""

  def __init__(self, fun: Callable, policy: Policy | str, options: dict):
    self.fun = fun
    self.policy = as_policy(policy)
    self._options = check_options(
        options.pop("level", "O2"), options.pop("target", None),
        options.pop("dot_result", "f32"), options.pop("keep_f32", ()),
        options.pop("force_compute", ()))
    if options:
      raise TypeError(f"unexpected options: {', '.join(sorted(options))}")
    # Rewritten programs by input signature, for `lower`.
    self._programs: dict = {}
    self.rewrite_count = 0

  @staticmethod
  def _key(*inputs) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(inputs)
    return _signature(leaves, treedef, None)

  def _build(self, key: Any, inner: Callable, export_args: tuple,
             param_flags: list, seed_leaf: int, loss_scale: LossScale,
             state_leaves=()) -> prog.Program:
    self.rewrite_count += 1
    program = prog.build(inner, export_args, {}, param_flags=param_flags,
                         policy=self.policy, options=self._options,
                         source_name=_name(self.fun), seed_leaf=seed_leaf,
                         state_leaves=state_leaves,
                         loss_scale=loss_scale.pass_options())
    self._programs[key] = program
    return program


class ValueAndGrad(_LossScaledProgram):
  """`amp.value_and_grad(loss_fn, policy)`: call as
  ``(loss, grads), grads_finite, loss_scale = vg(params, *args, loss_scale=ls)``.
  """

  def __init__(self, fun: Callable, policy: Policy | str, *, has_aux: bool,
               **options):
    super().__init__(fun, policy, options)
    self.has_aux = has_aux

    def module_fn(params, args, seed):
      if has_aux:
        loss, vjp, aux = jax.vjp(lambda p: fun(p, *args), params, has_aux=True)
      else:
        loss, vjp = jax.vjp(lambda p: fun(p, *args), params)
        aux = None
      (grads,) = vjp(seed.astype(jnp.result_type(loss)))
      return loss, aux, prog.mark_gradients(grads)

    self._inner = jax.jit(module_fn)
    self._outer = jax.jit(self._traced)

  def __call__(self, params, *args, loss_scale: LossScale | None = None):
    if loss_scale is None:
      loss_scale = default_loss_scale(self.policy.compute_dtype)
    return self._outer(params, args, loss_scale)

  def lower(self, params, *args, loss_scale: LossScale | None = None) -> Lowered:
    if loss_scale is None:
      loss_scale = default_loss_scale(self.policy.compute_dtype)
    jax_lowered = self._outer.lower(params, args, loss_scale)
    return Lowered(jax_lowered,
                   self._programs.get(self._key(params, args, loss_scale)))

  def _traced(self, params, args, loss_scale):
    seed = jnp.ones((), jnp.float32)
    export_args = (_spec(params, True), _spec(args, False), _spec(seed, False))
    flags = _float_flags(params, True) + _float_flags(args, False) + [False]
    leaves = jax.tree_util.tree_leaves((params, args)) + [seed]
    program = self._build(self._key(params, args, loss_scale), self._inner,
                          export_args, flags, len(leaves) - 1, loss_scale)
    outputs, extra = program.call(leaves, loss_scale.state())
    loss, aux, grads = jax.tree_util.tree_unflatten(program.out_tree, outputs)
    value = (loss, aux) if self.has_aux else loss
    return (value, grads), extra[0], loss_scale.with_state(extra)


def value_and_grad(fun: Callable, policy: Policy | str = "p=f32,c=f16,o=f32",
                   *, has_aux: bool = False, **options) -> ValueAndGrad:
  """Like `jax.value_and_grad(fun)` on the first argument, rewritten to
  `policy` with loss scaling inside the compiled program.

  Returns a function ``vg(params, *args, loss_scale=ls)`` giving
  ``(loss, grads), grads_finite, new_loss_scale``: gradients unscaled, in f32
  for f32 parameters; `loss_scale` defaults to `DynamicLossScale()` for f16
  compute and `NoOpLossScale()` otherwise. `options` are those of
  `amp.transform` (level, target, keep_f32, force_compute, dot_result).

  >>> import jax.numpy as jnp, stablehlo_amp as amp
  >>> vg = amp.value_and_grad(lambda w, x: jnp.sum((x @ w) ** 2))
  >>> (loss, grads), finite, ls = vg(jnp.ones((8, 8)), jnp.ones((4, 8)),
  ...                                loss_scale=amp.DynamicLossScale(2.0 ** 10))
  >>> float(loss), grads.dtype, bool(finite), float(ls.loss_scale)
  (2048.0, dtype('float32'), True, 1024.0)
  """
  return ValueAndGrad(fun, policy, has_aux=has_aux, **options)


class TrainState(NamedTuple):
  """Everything a step reads and writes, as a pytree of tensors."""
  params: Any
  opt_state: Any
  loss_scale: LossScale
  skipped_steps: jax.Array  # int32: steps skipped for non-finite gradients


class TrainStep(_LossScaledProgram):
  """`amp.train_step(...)`: ``state = step.init(params)``, then
  ``state, metrics = step(state, batch)``."""

  def __init__(self, loss_fn: Callable, optimizer: "optax.GradientTransformation",
               policy: Policy | str, loss_scale: LossScale | None,
               donate: bool, **options):
    super().__init__(loss_fn, policy, options)
    self.optimizer = optimizer
    self._initial_loss_scale = (loss_scale if loss_scale is not None else
                                default_loss_scale(self.policy.compute_dtype))

    import optax  # only the training step needs it

    def module_fn(params, opt_state, batch, seed):
      loss, vjp = jax.vjp(lambda p: loss_fn(p, batch), params)
      (grads,) = vjp(seed.astype(jnp.result_type(loss)))
      grads = prog.mark_gradients(grads)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return loss, optax.apply_updates(params, updates), opt_state

    self._inner = jax.jit(module_fn)
    self._outer = jax.jit(self._traced, donate_argnums=(0,) if donate else ())

  def init(self, params: Any) -> TrainState:
    """The first state: parameters, optimizer state, loss-scale state."""
    return TrainState(params, self.optimizer.init(params),
                      self._initial_loss_scale, jnp.zeros((), jnp.int32))

  def __call__(self, state: TrainState, batch: Any):
    return self._outer(state, batch)

  def lower(self, state: TrainState, batch: Any) -> Lowered:
    jax_lowered = self._outer.lower(state, batch)
    return Lowered(jax_lowered, self._programs.get(self._key(state, batch)))

  def _traced(self, state: TrainState, batch):
    seed = jnp.ones((), jnp.float32)
    params, opt_state = state.params, state.opt_state
    export_args = (_spec(params, True), _spec(opt_state, False),
                   _spec(batch, False), _spec(seed, False))
    num_params = len(jax.tree_util.tree_leaves(params))
    num_opt = len(jax.tree_util.tree_leaves(opt_state))
    flags = (_float_flags(params, True) + _float_flags(opt_state, False) +
             _float_flags(batch, False) + [False])
    leaves = jax.tree_util.tree_leaves((params, opt_state, batch)) + [seed]
    # Output leaf 1 + i is the new value of input leaf i (params, then
    # optimizer state): the pass keeps the old one when gradients overflow.
    state_leaves = [(1 + i, i) for i in range(num_params + num_opt)]
    program = self._build(self._key(state, batch), self._inner, export_args,
                          flags, len(leaves) - 1, state.loss_scale,
                          state_leaves)
    outputs, extra = program.call(leaves, state.loss_scale.state())
    loss, new_params, new_opt_state = jax.tree_util.tree_unflatten(
        program.out_tree, outputs)
    finite = extra[0]
    loss_scale = state.loss_scale.with_state(extra)
    skipped = state.skipped_steps + jnp.where(finite, 0, 1).astype(jnp.int32)
    metrics = {"loss": loss, "grads_finite": finite,
               "loss_scale": jnp.asarray(loss_scale.loss_scale, jnp.float32),
               "skipped_steps": skipped}
    return TrainState(new_params, new_opt_state, loss_scale, skipped), metrics


def train_step(loss_fn: Callable, optimizer: "optax.GradientTransformation",
               policy: Policy | str = "p=f32,c=f16,o=f32", *,
               loss_scale: LossScale | None = None, donate: bool = False,
               **options) -> TrainStep:
  """One compiled mixed-precision training step with loss scaling inside.

  `loss_fn(params, batch)` returns a scalar loss. Gradient transformations in
  `optimizer` (clipping in an optax chain) see unscaled gradients; an
  overflowed step leaves parameters and optimizer state unchanged and counts
  in `metrics["skipped_steps"]`. `loss_scale` defaults to
  `DynamicLossScale()` for f16 compute and `NoOpLossScale()` otherwise.

  >>> import jax.numpy as jnp, optax, stablehlo_amp as amp
  >>> step = amp.train_step(lambda w, b: jnp.mean((b @ w) ** 2),
  ...                       optax.sgd(0.1), "p=f32,c=f16,o=f32")
  >>> state = step.init(jnp.ones((8, 8)))
  >>> state, metrics = step(state, jnp.ones((4, 8)))
  >>> sorted(metrics), int(metrics["skipped_steps"])
  (['grads_finite', 'loss', 'loss_scale', 'skipped_steps'], 0)
  """
  return TrainStep(loss_fn, optimizer, policy, loss_scale, donate, **options)


class PrecisionHandler:
  """The eformer/MindSpore-style handler, built on the compiler pass.

  `inference_wrapper(fn)` is `amp.transform(fn, policy)`;
  `training_step_wrapper(loss_fn)` returns ``step(params, *args) ->
  (loss, grads, grads_finite)`` with the scale applied before
  differentiation, keeping the loss-scale state in `self.loss_scale`.
  """

  def __init__(self, policy: Policy | str, loss_scale: LossScale | None = None,
               **options):
    self.policy = as_policy(policy)
    self.loss_scale = (loss_scale if loss_scale is not None else
                       default_loss_scale(self.policy.compute_dtype))
    self._options = options

  def inference_wrapper(self, fn: Callable, **jit_options):
    from stablehlo_amp._src.transform import transform
    return transform(fn, self.policy, **self._options, **jit_options)

  def training_step_wrapper(self, loss_fn: Callable, has_aux: bool = False):
    vg = value_and_grad(loss_fn, self.policy, has_aux=has_aux,
                        **self._options)

    def step(params, *args):
      (loss, grads), finite, self.loss_scale = vg(
          params, *args, loss_scale=self.loss_scale)
      return loss, grads, finite
    return step
