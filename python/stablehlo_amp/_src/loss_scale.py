"""Loss-scale state as pytrees of tensors, and the pure building blocks.

The update rule is the one `amp-loss-scale` builds into the module (PyTorch
GradScaler's, with jmp's floor and a ceiling): on overflow
``scale = max(min_scale, scale * backoff_factor)`` and the counter resets;
after `growth_interval` finite steps ``scale * growth_factor`` unless that
overflows f32 or passes `max_scale`. The scale is always f32. The fields of
the configuration (by name), their defaults, the validation and the order of
the state the pass appends come from the pass's contract.
"""

from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp

from stablehlo_amp import _amp
from stablehlo_amp._src import contract

_DEFAULTS = contract.loss_scale_defaults()
_FIELDS = contract.loss_scale_fields()


def _checked_config(mode: str, fields: Mapping[str, Any]) -> tuple:
  """`fields` (the rule's configuration by name) checked by the pass's own
  code, as hashable pytree data: ((name, value), ...) in the contract's
  order. An unknown, missing or invalid field is a ValueError naming it."""
  def plain(value):
    # NumPy and JAX scalars cross as Python numbers; a fractional interval
    # stays fractional so that the check refuses it instead of truncating.
    if isinstance(value, bool):
      return value
    try:
      return operator.index(value)
    except TypeError:
      return float(value)
  return tuple(_amp.loss_scale_config(
      mode, {name: plain(value) for name, value in fields.items()}).items())


def _config_field(name: str) -> property:
  return property(lambda self: dict(self._config)[name],
                  doc=f"The `{name}` of the update rule (static).")


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


class _LossScaleBase:
  """What every loss scale tells the training-step builders."""

  mode: str  # the amp-loss-scale mode

  def pass_options(self) -> dict[str, Any]:
    """The options of the `amp-loss-scale` pass for this loss scale."""
    return {"mode": self.mode}

  def _roles(self) -> Mapping[str, Any]:
    return {}

  def state(self) -> tuple:
    """The tensors the pass's appended arguments take, in its order."""
    roles = self._roles()
    return tuple(roles[role] for role in
                 contract.loss_scale_layout(self.mode)["arguments"])

  def results(self, outputs: Sequence[Any]) -> dict[str, Any]:
    """The pass's appended results by role attribute name."""
    return dict(zip(contract.loss_scale_layout(self.mode)["results"],
                    outputs))

  def grads_finite(self, outputs: Sequence[Any]) -> jax.Array:
    return self.results(outputs)[contract.attribute("grads_finite")]

  def with_state(self, outputs: Sequence[Any]):
    """The state after a step, from the pass's appended results."""
    return self


@jax.tree_util.register_pytree_node_class
class NoOpLossScale(_LossScaleBase):
  """No scaling (bf16 and f32 compute): the identity, a scale of 1."""

  mode = "none"
  loss_scale = property(lambda self: jnp.float32(1.0))

  def scale(self, tree: Any) -> Any:
    return tree

  def unscale(self, tree: Any) -> Any:
    return tree

  def adjust(self, grads_finite: jax.Array) -> "NoOpLossScale":
    del grads_finite
    return self

  def tree_flatten(self):
    return (), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls()

  def __repr__(self) -> str:
    return "NoOpLossScale()"


@jax.tree_util.register_pytree_node_class
class StaticLossScale(_LossScaleBase):
  """A fixed scale (an f32 tensor)."""

  mode = "static"

  def __init__(self, loss_scale: float | jax.Array):
    self.loss_scale = jnp.asarray(loss_scale, jnp.float32)

  def scale(self, tree: Any) -> Any:
    return _scale_tree(tree, self.loss_scale)

  def unscale(self, tree: Any) -> Any:
    return _scale_tree(tree, 1.0 / self.loss_scale)

  def adjust(self, grads_finite: jax.Array) -> "StaticLossScale":
    del grads_finite
    return self

  def _roles(self) -> Mapping[str, Any]:
    return {contract.attribute("loss_scale"): self.loss_scale}

  def tree_flatten(self):
    return (self.loss_scale,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    # Not through __init__: JAX unflattens with leaves that are no arrays
    # (a lowering's argument descriptions, tracers, None).
    new = object.__new__(cls)
    new.loss_scale = children[0]
    return new

  def __repr__(self) -> str:
    return f"StaticLossScale({self.loss_scale!r})"


@jax.tree_util.register_pytree_node_class
class DynamicLossScale(_LossScaleBase):
  """A scale that backs off on overflow and grows after finite steps.

  `loss_scale` (f32) and `counter` (i32) are tensors; the configuration is
  static pytree data, so every field survives flatten/unflatten and `jit`.
  The configuration is checked when it is made, by the same code the
  `amp-loss-scale` pass runs.

  >>> import jax, jax.numpy as jnp, stablehlo_amp as amp
  >>> ls = amp.DynamicLossScale(initial_scale=8.0, growth_interval=2)
  >>> ls = ls.adjust(jnp.array(False)); float(ls.loss_scale)
  4.0
  >>> ls = ls.adjust(jnp.array(True)).adjust(jnp.array(True))
  >>> float(ls.loss_scale), int(ls.counter)
  (8.0, 0)
  """

  mode = "dynamic"

  def __init__(self, initial_scale: float | jax.Array =
               _DEFAULTS["initial_scale"], *,
               growth_interval: int = _DEFAULTS["growth_interval"],
               growth_factor: float = _DEFAULTS["growth_factor"],
               backoff_factor: float = _DEFAULTS["backoff_factor"],
               min_scale: float = _DEFAULTS["min_scale"],
               max_scale: float = _DEFAULTS["max_scale"],
               counter: int | jax.Array = 0):
    self._config = _checked_config(self.mode, dict(
        growth_interval=growth_interval, growth_factor=growth_factor,
        backoff_factor=backoff_factor, min_scale=min_scale,
        max_scale=max_scale))
    self.loss_scale = jnp.asarray(initial_scale, jnp.float32)
    self.counter = jnp.asarray(counter, jnp.int32)

  growth_interval = _config_field("growth_interval")
  growth_factor = _config_field("growth_factor")
  backoff_factor = _config_field("backoff_factor")
  min_scale = _config_field("min_scale")
  max_scale = _config_field("max_scale")

  def config(self) -> dict[str, Any]:
    """The update rule's configuration by the contract's field names."""
    return dict(self._config)

  def scale(self, tree: Any) -> Any:
    return _scale_tree(tree, self.loss_scale)

  def unscale(self, tree: Any) -> Any:
    return _scale_tree(tree, 1.0 / self.loss_scale)

  def adjust(self, grads_finite: jax.Array) -> "DynamicLossScale":
    """The next state; the same rule the pass builds into the module."""
    scale, counter = self.loss_scale, self.counter
    grown_counter = counter + 1
    at_interval = grown_counter >= self.growth_interval
    grown = scale * jnp.float32(self.growth_factor)
    grow = at_interval & jnp.isfinite(grown) & (grown <= self.max_scale)
    finite_scale = jnp.where(grow, grown, scale)
    finite_counter = jnp.where(at_interval, 0, grown_counter)
    backed_off = jnp.maximum(scale * jnp.float32(self.backoff_factor),
                             jnp.float32(self.min_scale))
    return self._replace(jnp.where(grads_finite, finite_scale, backed_off),
                         jnp.where(grads_finite, finite_counter, 0))

  def pass_options(self) -> dict[str, Any]:
    """The `amp-loss-scale` options by name: each field under the option the
    contract gives it."""
    config = self.config()
    return {"mode": self.mode,
            **{field["option"]: config[field["name"]] for field in _FIELDS}}

  def _roles(self) -> Mapping[str, Any]:
    return {contract.attribute("loss_scale"): self.loss_scale,
            contract.attribute("loss_scale_counter"): self.counter}

  def with_state(self, outputs: Sequence[Any]) -> "DynamicLossScale":
    results = self.results(outputs)
    return self._replace(results[contract.attribute("loss_scale")],
                         results[contract.attribute("loss_scale_counter")])

  def _replace(self, loss_scale, counter) -> "DynamicLossScale":
    new = object.__new__(DynamicLossScale)
    new._config = self._config
    new.loss_scale, new.counter = loss_scale, counter
    return new

  def tree_flatten(self):
    return (self.loss_scale, self.counter), self._config

  @classmethod
  def tree_unflatten(cls, config, children):
    new = object.__new__(cls)
    new._config = config
    new.loss_scale, new.counter = children
    return new

  def __repr__(self) -> str:
    config = ", ".join(f"{name}={value}" for name, value in self._config)
    return (f"DynamicLossScale(loss_scale={self.loss_scale!r}, "
            f"counter={self.counter!r}, {config})")


LossScale = NoOpLossScale | StaticLossScale | DynamicLossScale


def check_loss_scale(value: Any, where: str = "loss_scale") -> Any:
  """`value` if it is a loss scale (or None), else a TypeError that says
  which object to pass instead."""
  if value is None or isinstance(value, (NoOpLossScale, StaticLossScale,
                                         DynamicLossScale)):
    return value
  accepted = ("amp.NoOpLossScale(), amp.StaticLossScale(scale) or "
              "amp.DynamicLossScale(initial_scale, ...)")
  if isinstance(value, str) and value.strip().lower() in ("dynamic",
                                                          "static", "none"):
    hint = {"dynamic": "amp.DynamicLossScale()",
            "static": "amp.StaticLossScale(scale)",
            "none": "amp.NoOpLossScale()"}[value.strip().lower()]
    raise TypeError(f"{where}={value!r}: pass a loss-scale object, "
                    f"{hint} (accepted: {accepted})")
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    raise TypeError(f"{where}={value!r}: pass a loss-scale object: "
                    f"amp.StaticLossScale({value!r}) for a fixed scale, or "
                    f"amp.DynamicLossScale({value!r}) for one that adapts "
                    f"(accepted: {accepted})")
  raise TypeError(f"{where}={value!r} ({type(value).__name__}): expected "
                  f"{accepted}")


def default_loss_scale(compute_dtype) -> LossScale:
  """f16 compute gets dynamic scaling; bf16 and f32 need none."""
  if jnp.dtype(compute_dtype) == jnp.float16:
    return DynamicLossScale()
  return NoOpLossScale()


def _register_flax_serialization() -> None:
  """`flax.serialization.to_bytes`/`from_bytes` of loss scales, and so of a
  whole `TrainState`, when flax is installed (flax stores unregistered
  objects as opaque leaves msgpack cannot write). The configuration is
  saved with the tensors and restored from the checkpoint."""
  import importlib.util
  if importlib.util.find_spec("flax") is None:
    return
  from flax import serialization

  def dynamic_to_state(ls: DynamicLossScale) -> dict:
    return {"loss_scale": serialization.to_state_dict(ls.loss_scale),
            "counter": serialization.to_state_dict(ls.counter),
            **ls.config()}

  def dynamic_from_state(target: DynamicLossScale,
                         state: dict) -> DynamicLossScale:
    # A field the checkpoint lacks (saved before it existed) is the target's.
    config = {name: state.get(name, value)
              for name, value in target.config().items()}
    return DynamicLossScale(
        serialization.from_state_dict(target.loss_scale, state["loss_scale"]),
        counter=serialization.from_state_dict(target.counter,
                                              state["counter"]),
        **config)

  def static_to_state(ls: StaticLossScale) -> dict:
    return {"loss_scale": serialization.to_state_dict(ls.loss_scale)}

  def static_from_state(target: StaticLossScale,
                        state: dict) -> StaticLossScale:
    return StaticLossScale(serialization.from_state_dict(target.loss_scale,
                                                         state["loss_scale"]))

  serialization.register_serialization_state(
      DynamicLossScale, dynamic_to_state, dynamic_from_state, override=True)
  serialization.register_serialization_state(
      StaticLossScale, static_to_state, static_from_state, override=True)
  serialization.register_serialization_state(
      NoOpLossScale, lambda ls: {}, lambda target, state: target,
      override=True)


_register_flax_serialization()
