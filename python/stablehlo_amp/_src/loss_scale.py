"""Loss-scale state as pytrees of tensors, and the pure building blocks.

The update rule is the one `amp-loss-scale` builds into the module (PyTorch
GradScaler's, with jmp's floor and a ceiling): on overflow
``scale = max(min_scale, scale * backoff_factor)`` and the counter resets;
after `growth_interval` finite steps ``scale * growth_factor`` unless that
overflows f32 or passes `max_scale`. The scale is always f32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from stablehlo_amp._src.program import LossScaleOptions


def all_finite(tree: Any) -> jax.Array:
  """One boolean: every element of every float leaf is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(jnp.result_type(x), jnp.floating)]
  if not leaves:
    return jnp.asarray(True)
  return jnp.stack(leaves).all()


def select_tree(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  """`on_true` where `pred`, else `on_false`, leaf by leaf (jit-safe)."""
  return jax.tree_util.tree_map(lambda a, b: jax.lax.select(pred, a, b),
                                on_true, on_false)


def _scale_tree(tree: Any, factor: jax.Array) -> Any:
  def scale(x):
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
      return x
    return (x.astype(jnp.float32) * factor).astype(x.dtype)
  return jax.tree_util.tree_map(scale, tree)


@jax.tree_util.register_pytree_node_class
class NoOpLossScale:
  """No scaling (bf16 and f32 compute): the identity, a scale of 1."""

  loss_scale = property(lambda self: jnp.float32(1.0))

  def scale(self, tree: Any) -> Any:
    return tree

  def unscale(self, tree: Any) -> Any:
    return tree

  def adjust(self, grads_finite: jax.Array) -> "NoOpLossScale":
    del grads_finite
    return self

  def pass_options(self) -> LossScaleOptions:
    return LossScaleOptions("none")

  def state(self) -> tuple:
    return ()

  def with_state(self, outputs: list) -> "NoOpLossScale":
    return self

  def tree_flatten(self):
    return (), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls()

  def __repr__(self) -> str:
    return "NoOpLossScale()"


@jax.tree_util.register_pytree_node_class
class StaticLossScale:
  """A fixed scale (an f32 tensor)."""

  def __init__(self, loss_scale: float | jax.Array):
    self.loss_scale = jnp.asarray(loss_scale, jnp.float32)

  def scale(self, tree: Any) -> Any:
    return _scale_tree(tree, self.loss_scale)

  def unscale(self, tree: Any) -> Any:
    return _scale_tree(tree, 1.0 / self.loss_scale)

  def adjust(self, grads_finite: jax.Array) -> "StaticLossScale":
    del grads_finite
    return self

  def pass_options(self) -> LossScaleOptions:
    return LossScaleOptions("static")

  def state(self) -> tuple:
    return (self.loss_scale,)

  def with_state(self, outputs: list) -> "StaticLossScale":
    return self

  def tree_flatten(self):
    return (self.loss_scale,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0])

  def __repr__(self) -> str:
    return f"StaticLossScale({self.loss_scale!r})"


@jax.tree_util.register_pytree_node_class
class DynamicLossScale:
  """A scale that backs off on overflow and grows after finite steps.

  `loss_scale` (f32) and `counter` (i32) are tensors; the configuration is
  static pytree data, so every field survives flatten/unflatten and `jit`.

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> ls = amp.DynamicLossScale(initial_scale=8.0, growth_interval=2)
  >>> ls = ls.adjust(jnp.array(False)); float(ls.loss_scale)
  4.0
  >>> ls = ls.adjust(jnp.array(True)).adjust(jnp.array(True))
  >>> float(ls.loss_scale), int(ls.counter)
  (8.0, 0)
  """

  def __init__(self, initial_scale: float | jax.Array = 2.0 ** 15, *,
               growth_interval: int = 2000, growth_factor: float = 2.0,
               backoff_factor: float = 0.5, min_scale: float = 1.0,
               max_scale: float = 2.0 ** 24,
               counter: int | jax.Array = 0):
    options = LossScaleOptions("dynamic", int(growth_interval),
                               float(growth_factor), float(backoff_factor),
                               float(min_scale), float(max_scale))
    _validate(options)
    self._options = options
    self.loss_scale = jnp.asarray(initial_scale, jnp.float32)
    self.counter = jnp.asarray(counter, jnp.int32)

  growth_interval = property(lambda self: self._options.growth_interval)
  growth_factor = property(lambda self: self._options.growth_factor)
  backoff_factor = property(lambda self: self._options.backoff_factor)
  min_scale = property(lambda self: self._options.min_scale)
  max_scale = property(lambda self: self._options.max_scale)

  def scale(self, tree: Any) -> Any:
    return _scale_tree(tree, self.loss_scale)

  def unscale(self, tree: Any) -> Any:
    return _scale_tree(tree, 1.0 / self.loss_scale)

  def adjust(self, grads_finite: jax.Array) -> "DynamicLossScale":
    """The next state; the same rule the pass builds into the module."""
    o = self._options
    scale, counter = self.loss_scale, self.counter
    grown_counter = counter + 1
    at_interval = grown_counter >= o.growth_interval
    grown = scale * jnp.float32(o.growth_factor)
    grow = at_interval & jnp.isfinite(grown) & (grown <= o.max_scale)
    finite_scale = jnp.where(grow, grown, scale)
    finite_counter = jnp.where(at_interval, 0, grown_counter)
    backed_off = jnp.maximum(scale * jnp.float32(o.backoff_factor),
                             jnp.float32(o.min_scale))
    return self._replace(jnp.where(grads_finite, finite_scale, backed_off),
                         jnp.where(grads_finite, finite_counter, 0))

  def pass_options(self) -> LossScaleOptions:
    return self._options

  def state(self) -> tuple:
    return (self.loss_scale, self.counter)

  def with_state(self, outputs: list) -> "DynamicLossScale":
    """The state after a step, from the pass's appended results."""
    return self._replace(outputs[1], outputs[2])

  def _replace(self, loss_scale, counter) -> "DynamicLossScale":
    new = object.__new__(DynamicLossScale)
    new._options = self._options
    new.loss_scale, new.counter = loss_scale, counter
    return new

  def tree_flatten(self):
    return (self.loss_scale, self.counter), self._options

  @classmethod
  def tree_unflatten(cls, options, children):
    new = object.__new__(cls)
    new._options = options
    new.loss_scale, new.counter = children
    return new

  def __repr__(self) -> str:
    o = self._options
    return (f"DynamicLossScale(loss_scale={self.loss_scale!r}, "
            f"counter={self.counter!r}, growth_interval={o.growth_interval}, "
            f"growth_factor={o.growth_factor}, "
            f"backoff_factor={o.backoff_factor}, min_scale={o.min_scale}, "
            f"max_scale={o.max_scale})")


LossScale = NoOpLossScale | StaticLossScale | DynamicLossScale


def _validate(o: LossScaleOptions) -> None:
  if o.growth_interval < 1:
    raise ValueError(f"growth_interval must be at least 1, got "
                     f"{o.growth_interval}")
  if not o.growth_factor >= 1:
    raise ValueError(f"growth_factor must be at least 1, got "
                     f"{o.growth_factor}")
  if not 0 < o.backoff_factor <= 1:
    raise ValueError(f"backoff_factor must be in (0, 1], got "
                     f"{o.backoff_factor}")
  if not 0 < o.min_scale <= o.max_scale:
    raise ValueError(f"need 0 < min_scale <= max_scale, got min_scale="
                     f"{o.min_scale}, max_scale={o.max_scale}")


def default_loss_scale(compute_dtype) -> LossScale:
  """f16 compute gets dynamic scaling; bf16 and f32 need none."""
  if jnp.dtype(compute_dtype) == jnp.float16:
    return DynamicLossScale()
  return NoOpLossScale()
