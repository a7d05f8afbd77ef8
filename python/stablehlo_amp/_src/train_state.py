"""The training state as data.

`TrainState` is everything a step reads and writes. This module holds what
it is made of and how: the optimizer state stored low (bf16, or the f8
block layout of `amp-round-state`), the checks a step makes of a state it
is given, and the slots through which the state meets the arguments and
results the passes append to a step's program.

The contract's state roles (`contract.state_roles()`, from
`passes/Contract.cpp`) say, per appended argument or result, which field of
the state gives and takes it, whether there is one per parameter, and
whether a skipped step keeps its old value (the program selects it). A step
groups its program's appended values by field and hands each group to that
field's slot (`SLOTS`), so adding a role means adding its row to the
contract and, for a new field, one slot here.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src import program as prog
from stablehlo_amp._src.loss_scale import LossScale
from stablehlo_amp._src.policy import Policy
from stablehlo_amp._src.program import is_float


class TrainState(NamedTuple):
  """Everything a step reads and writes, as a pytree of tensors."""
  params: Any
  opt_state: Any
  loss_scale: LossScale
  skipped_steps: jax.Array  # int32: steps skipped for non-finite gradients
  model_state: Any = None   # e.g. BatchNorm statistics; None if unused
  # FP8 delayed scaling: one f32[amax_history] per FP8 operand, newest
  # first; None until the first step (which makes them).
  amax_history: Any = None
  # update_rounding="stochastic": the state of the random bits that round
  # the new bf16 parameters (uint32[4]); None otherwise.
  rounding_key: Any = None
  # update_rounding="kahan": a pytree like params with, at each bf16
  # parameter, a bf16 buffer of what rounding its updates lost (None at the
  # other leaves); None otherwise.
  compensation: Any = None

  def replace(self, **changes: Any) -> "TrainState":
    """A copy with the given fields replaced, as flax's struct.replace
    (and NamedTuple's _replace)."""
    return self._replace(**changes)


def _leaves(tree: Any) -> list:
  return jax.tree_util.tree_leaves(tree)


def _is_bf16(x: Any) -> bool:
  return is_float(x) and jnp.dtype(x.dtype) == jnp.dtype(jnp.bfloat16)


# -- the slots: where the passes' appended values live in the state ----------


@dataclasses.dataclass(frozen=True)
class StepContext:
  """What slots need to know of the step: its parameters' tree structure
  (per-parameter roles are indexed by flat parameter leaf) and options."""
  param_tree: Any
  options: pl.RewriteOptions


class Slot:
  """One field of the state that appended arguments read and appended
  results write. `given` returns the arguments of the field's roles
  (`roles` and their `owners`, in main's order); `taken` the field's value
  after the step from its results; `first` the value `init` makes."""

  def first(self, params: Any, options: pl.RewriteOptions,
            seed: int) -> Any:
    return None

  def given(self, value: Any, roles: Sequence[str],
            owners: Sequence[int | None], step: StepContext) -> list:
    raise NotImplementedError

  def taken(self, value: Any, results: Sequence[Any],
            owners: Sequence[int | None], step: StepContext) -> Any:
    raise NotImplementedError


class _LossScaleSlot(Slot):
  """The loss scale's state (its appended arguments, in its layout's
  order) and its results, from which it reads the finite flag."""

  def given(self, value, roles, owners, step):
    by_role = dict(zip(contract.loss_scale_layout(value.mode)["arguments"],
                       value.state()))
    return [by_role[role] for role in roles]

  def taken(self, value, results, owners, step):
    return value.with_state(results)


class _HistorySlot(Slot):
  """FP8 delayed scaling's amax histories: one per FP8 operand, made by
  the first step (all zeros: scale by the current amax)."""

  def given(self, value, roles, owners, step):
    if value is None:
      length = step.options.amax_history
      return [jnp.zeros((length,), jnp.float32) for _ in roles]
    if len(value) != len(roles):
      raise TypeError(f"the state holds {len(value)} amax histories, the "
                      f"step's program takes {len(roles)}")
    return list(value)

  def taken(self, value, results, owners, step):
    return tuple(results)


class _RoundingKeySlot(Slot):
  """The state of the random bits of stochastic rounding (uint32[4])."""

  def first(self, params, options, seed):
    if options.update_rounding != contract.values(
        "update_rounding").stochastic:
      return None
    return jnp.asarray(np.random.default_rng(seed).integers(
        0, 2 ** 32, size=4, dtype=np.uint32))

  def given(self, value, roles, owners, step):
    if value is None:
      raise TypeError("this step rounds its bf16 state stochastically and "
                      "the state holds no rounding key: make the state "
                      "with this step's init")
    return [value for _ in roles]

  def taken(self, value, results, owners, step):
    return results[-1]


class _CompensationSlot(Slot):
  """Kahan's buffers: a tree like the parameters, a bf16 buffer at each
  bf16 parameter (None elsewhere)."""

  def first(self, params, options, seed):
    if options.update_rounding != contract.values("update_rounding").kahan:
      return None
    return jax.tree_util.tree_map(
        lambda x: jnp.zeros_like(x) if _is_bf16(x) else None, params)

  def given(self, value, roles, owners, step):
    buffers = (step.param_tree.flatten_up_to(value) if value is not None
               else [])
    if any(leaf >= len(buffers) or buffers[leaf] is None for leaf in owners):
      raise TypeError("this step compensates the rounding of its bf16 "
                      "parameters (update_rounding='kahan') and the state "
                      "holds no compensation buffer for one of them: make "
                      "the state with this step's init")
    return [buffers[leaf] for leaf in owners]

  def taken(self, value, results, owners, step):
    buffers = step.param_tree.flatten_up_to(value)
    for leaf, result in zip(owners, results):
      buffers[leaf] = result
    return step.param_tree.unflatten(buffers)


# One slot per field that appended roles name (contract.state_roles()).
SLOTS: Mapping[str, Slot] = {
    "loss_scale": _LossScaleSlot(),
    "amax_history": _HistorySlot(),
    "rounding_key": _RoundingKeySlot(),
    "compensation": _CompensationSlot(),
}


def _by_field(roles: Sequence[str], owners: Sequence[int | None]
              ) -> dict[str, tuple[list[int], list[str], list]]:
  """Positions, roles and owners of appended values, by state field.
  Measurements (`numerics.measurements`) are no field of the state."""
  table = contract.state_roles()
  measured = contract.measurements()
  grouped: dict[str, tuple[list[int], list[str], list]] = {}
  for position, (role, owner) in enumerate(zip(roles, owners)):
    if role in measured:
      continue
    if role not in table:
      raise pl.RewriteError(f"the program appends {role}, which is no state "
                            "role of the contract")
    positions, named, owned = grouped.setdefault(table[role]["field"],
                                                 ([], [], []))
    positions.append(position)
    named.append(role)
    owned.append(owner)
  return grouped


def appended_inputs(program: prog.Program, fields: Mapping[str, Any],
                    step: StepContext) -> list:
  """The values of the arguments the passes appended to `program`, in
  main's order, from the state's `fields` (by name)."""
  inputs: list = [None] * len(program.extra_in_roles)
  grouped = _by_field(program.extra_in_roles, program.extra_in_owners)
  for field, (positions, roles, owners) in grouped.items():
    given = SLOTS[field].given(fields.get(field), roles, owners, step)
    for position, value in zip(positions, given):
      inputs[position] = value
  return inputs


def appended_results(program: prog.Program, extra: Sequence[Any]
                     ) -> dict[str, list]:
  """The results the passes appended, by state field, in main's order."""
  grouped = _by_field(program.extra_out_roles, program.extra_out_owners)
  return {field: [extra[i] for i in positions]
          for field, (positions, _, _) in grouped.items()}


def taken_fields(program: prog.Program, fields: Mapping[str, Any],
                 extra: Sequence[Any], step: StepContext) -> dict[str, Any]:
  """The new value of each field the program's appended results write."""
  grouped = _by_field(program.extra_out_roles, program.extra_out_owners)
  return {field: SLOTS[field].taken(fields.get(field),
                                    [extra[i] for i in positions], owners,
                                    step)
          for field, (positions, _, owners) in grouped.items()}


# -- the optimizer state, stored low ------------------------------------------


def stored_low_candidate(x: Any) -> bool:
  """Whether opt_state_dtype="bf16" or "f8" stores an optimizer-state leaf
  low: f32 tensors (moments, momentum, accumulated gradients). Scalars stay
  as they are: hyperparameters (Adam's b2 = 0.999 is 1.0 in bf16, and its
  bias correction would divide by zero) and counters."""
  return (is_float(x) and jnp.ndim(x) > 0 and
          jnp.dtype(jax_compat.dtype_of(x)) in (jnp.dtype(jnp.float32),
                                               jnp.dtype(jnp.bfloat16)))


def encode_f8(x: Any) -> jax.Array:
  """`x` (f32) in the f8 layout, as amp-round-state encodes a step's new
  state (RoundState.cpp, encodeBlocks; `test_update_rounding.py` holds the
  two to the same bytes): the first state, which the optimizer makes."""
  layout = contract.document()["optimizer_state_f8"]
  stored = contract.f8_state_shape(tuple(jnp.shape(x)))
  group = stored[:-1] + (layout["block"],)
  x = jnp.asarray(x, jnp.float32)
  roots = jnp.sign(x) * jnp.sqrt(jnp.abs(x))  # companded
  padded = int(np.prod(group, dtype=np.int64))
  if padded != roots.size:  # the flat layout, zero-padded
    roots = jnp.pad(jnp.ravel(roots), (0, padded - roots.size))
  grouped = roots.reshape(group)
  largest = jnp.max(jnp.abs(grouped), axis=-1)
  scale = largest / jnp.float32(layout["max"])
  divisor = jnp.where(largest > 0, scale, jnp.float32(1))
  scaled = grouped / divisor[..., None]
  lifted = jnp.sign(scaled) * jnp.maximum(jnp.abs(scaled),
                                          jnp.float32(layout["smallest"]))
  codes = jnp.clip(lifted, -layout["max"],
                   layout["max"]).astype(jnp.float8_e4m3fn)
  return jnp.concatenate(
      [jax.lax.bitcast_convert_type(codes, jnp.uint8),
       jax.lax.bitcast_convert_type(scale, jnp.uint8)], axis=-1)


def f8_block_sharding(sharding: Any, shape: Sequence[int]
                      ) -> tuple[Any, bool]:
  """How the f8 blocks of a tensor of `shape` sharded by `sharding` are
  sharded: like the tensor along the leading dimensions the layout keeps,
  and over the other dimensions' mesh axes along the blocks when their
  devices divide the block count (each device then holds the blocks of its
  own part of the tensor, when its part is whole blocks). Also whether
  any mesh axis could not be kept (the blocks are replicated over it).
  (None, False) for a sharding that is no NamedSharding (one device)."""
  from jax.sharding import NamedSharding, PartitionSpec
  if not isinstance(sharding, NamedSharding):
    return None, False
  stored = contract.f8_state_shape(tuple(shape))
  kept = len(stored) - 2
  spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
  merged = [axis for entry in spec[kept:] if entry is not None
            for axis in (entry if isinstance(entry, tuple) else (entry,))]
  devices = int(np.prod([sharding.mesh.shape[a] for a in merged], dtype=int))
  blocks_entry = None
  if merged and stored[-2] % devices == 0:
    blocks_entry = tuple(merged) if len(merged) > 1 else merged[0]
  lost = bool(merged) and blocks_entry is None
  return NamedSharding(sharding.mesh, PartitionSpec(
      *spec[:kept], blocks_entry, None)), lost


def _explicit(mesh: Any) -> bool:
  """Whether `mesh` has explicit axes (jax.make_mesh's default in newer
  JAX), under which a computation's shardings are part of its types."""
  return any("explicit" in str(kind).lower()
             for kind in getattr(mesh, "axis_types", None) or ())


def _encode_f8_like(x: Any, sharding: Any) -> jax.Array:
  """`encode_f8(x)`, sharded by `sharding` (an `f8_block_sharding`)."""
  if sharding is None:
    return encode_f8(x)
  encode = encode_f8
  if _explicit(sharding.mesh):
    # Under explicit axes the flattening would need a sharding per step;
    # the encoding is left to the partitioner, and its result placed.
    encode = jax.sharding.auto_axes(encode_f8, out_sharding=sharding)
  return jax.jit(encode, out_shardings=sharding)(x)


def optimizer_view(params: Any) -> Any:
  """What the optimizer sees of the parameters: the float leaves in f32 (f64
  kept) and None in place of the others, as `eqx.filter(params,
  eqx.is_inexact_array)` gives; so integer counters and PRNG keys get no
  optimizer state and no update."""
  def view(x):
    if not is_float(x):
      return None
    if jnp.dtype(x.dtype) == jnp.dtype(jnp.float64):
      return x
    return x.astype(jnp.float32)
  return jax.tree_util.tree_map(view, params)


# -- shardings the new state keeps --------------------------------------------

# The fields whose leaves the step carries with their shardings.
CARRIED = ("params", "opt_state", "model_state", "compensation")


def state_shardings(state: TrainState) -> tuple:
  """The NamedSharding of each leaf of the state the step carries
  (parameters, optimizer state, model state, compensation buffers), None
  where there is none (one device, or a tracer: a step inside a jit). The
  step's new state keeps them: XLA's sharding propagation would otherwise
  choose for values it computes (f8 blocks came back replicated)."""
  from jax.sharding import NamedSharding
  leaves = jax.tree_util.tree_leaves(tuple(getattr(state, field)
                                            for field in CARRIED))
  return tuple(
      x.sharding if isinstance(x, jax.Array) and
      not isinstance(x, jax.core.Tracer) and
      isinstance(getattr(x, "sharding", None), NamedSharding) else None
      for x in leaves)


def keep_shardings(tree: Any, shardings: tuple) -> Any:
  """`tree` with each leaf constrained to its sharding (None: left to
  XLA)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  if len(leaves) != len(shardings) or not any(shardings):
    return tree
  constrained = []
  for leaf, sharding in zip(leaves, shardings):
    if sharding is None:
      constrained.append(leaf)
    elif _explicit(sharding.mesh):
      constrained.append(jax.sharding.reshard(leaf, sharding))
    else:
      constrained.append(jax.lax.with_sharding_constraint(leaf, sharding))
  return jax.tree_util.tree_unflatten(treedef, constrained)


# -- the layout of one step's state, and its checks ---------------------------


class StateLayout:
  """The state one step makes and takes: how its optimizer state is stored
  (`opt_state_dtype`, leaves kept f32 by `keep_f32_state`), its parameter
  dtype and loss scaling. Makes the first state (`init`) and checks a
  state given to the step (`check`)."""

  def __init__(self, optimizer: Any, policy: Policy,
               options: pl.RewriteOptions, loss_scale: LossScale,
               keep_f32_state: Callable[[Any, Any], bool] | None):
    self.optimizer = optimizer
    self.policy = policy
    self.options = options
    self.loss_scale = loss_scale
    self._keep_f32_state = keep_f32_state
    self._expected: dict = {}  # by the parameters' signature

  @property
  def _dtype(self) -> str:
    return self.options.opt_state_dtype

  def stored_low(self, opt_state: Any) -> list[bool]:
    """Per optimizer-state leaf: whether it is stored low
    (opt_state_dtype="bf16" or "f8", a float tensor, and not kept f32 by
    keep_f32_state). `opt_state` as the optimizer makes it (f32)."""
    if self._dtype == contract.values("opt_state_dtype").f32:
      return [False] * len(_leaves(opt_state))
    keep = self._keep_f32_state or (lambda path, leaf: False)
    return [stored_low_candidate(leaf) and not keep(path, leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(
                opt_state)[0]]

  def low_leaves(self, params: Any) -> dict[int, Any]:
    """The optimizer-state leaves stored low, as the optimizer makes them
    (shapes and dtypes, f32), by flat leaf of ``(params, opt_state)``."""
    first = len(_leaves(params))
    made = jax.eval_shape(self.optimizer.init, optimizer_view(params))
    return {first + i: leaf for i, (leaf, low) in enumerate(zip(
        _leaves(made), self.stored_low(made))) if low}

  def init(self, params: Any, model_state: Any, *, copy: bool,
           rounding_seed: int) -> TrainState:
    """The first state (see `TrainStep.init`)."""
    copied = ((lambda x: jnp.array(x, copy=True)) if copy else
              (lambda x: x))
    params = jax.tree_util.tree_map(copied, params)
    opt_state = self._store(self.optimizer.init(optimizer_view(params)))
    params = jax.tree_util.tree_map(
        lambda x: x.astype(self.policy.param_dtype)
        if is_float(x) and jnp.dtype(x.dtype) != jnp.dtype(jnp.float64)
        else x, params)
    # Each state owns its loss-scale arrays: a donated step consumes them.
    state = TrainState(params, opt_state,
                       jax.tree_util.tree_map(copied, self.loss_scale),
                       jnp.zeros((), jnp.int32),
                       jax.tree_util.tree_map(copied, model_state))
    for field, slot in SLOTS.items():
      first = slot.first(params, self.options, rounding_seed)
      if first is not None:
        state = state._replace(**{field: first})
    return state

  def _store(self, opt_state: Any) -> Any:
    """`opt_state` (as the optimizer makes it) with the leaves stored low
    as opt_state_dtype stores them."""
    flags = iter(self.stored_low(opt_state))
    replicated: list[str] = []
    stored = jax.tree_util.tree_map_with_path(
        lambda path, x: self._store_low(path, x, replicated)
        if next(flags) else x, opt_state)
    if replicated:
      warnings.warn(
          "stablehlo-amp: opt_state_dtype='f8' cannot shard these "
          "optimizer-state leaves like their parameters and keeps them "
          f"replicated over some mesh axes: {', '.join(replicated)}. Their "
          f"blocks of {contract.document()['optimizer_state_f8']['block']} "
          "values run along the last dimensions, and the devices do not "
          "each hold whole blocks; keep them f32 (keep_f32_state) or bf16, "
          "or shard the parameter along an earlier dimension", stacklevel=4)
    return stored

  def _store_low(self, path: Any, x: Any, replicated: list[str]) -> Any:
    """An optimizer-state leaf as opt_state_dtype stores it: bf16, or the
    f8 layout, its blocks sharded over the devices the leaf is sharded
    over. `replicated` collects the sharded leaves of more than 64 KiB
    whose blocks cannot be (a bias's few blocks go without saying)."""
    if self._dtype == contract.values("opt_state_dtype").bf16:
      return x.astype(jnp.bfloat16)
    sharding, unsharded = (
        (None, False) if isinstance(x, jax.core.Tracer) else
        f8_block_sharding(getattr(x, "sharding", None), jnp.shape(x)))
    stored = contract.f8_state_shape(tuple(jnp.shape(x)))
    if unsharded and np.prod(stored) > 64 * 1024:
      replicated.append(f"opt_state{jax.tree_util.keystr(path)} "
                        f"(uint8{list(stored)})")
    return _encode_f8_like(x, sharding)

  def expected_opt_state(self, params: Any) -> Any:
    """The optimizer state this step takes for `params`, as shapes and
    dtypes: the optimizer's own, with the leaves stored low as they are
    stored (bf16, or the f8 layout)."""
    key = prog.signature_key(params)
    if key not in self._expected:
      made = jax.eval_shape(
          lambda p: self.optimizer.init(optimizer_view(p)), params)
      flags = iter(self.stored_low(made))

      def stored(x):
        if not next(flags):
          return x
        if self._dtype == contract.values("opt_state_dtype").bf16:
          return jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)
        return jax.ShapeDtypeStruct(contract.f8_state_shape(tuple(x.shape)),
                                    jnp.uint8)
      self._expected[key] = jax.tree_util.tree_map(stored, made)
    return self._expected[key]

  def check(self, state: Any) -> None:
    """TypeError unless `state` is a TrainState this step can take: its
    loss scaling, parameter dtypes and optimizer state are the ones this
    step's `init` makes."""
    if not isinstance(state, TrainState):
      raise TypeError(
          "a train step takes (state, batch), where state is the TrainState "
          "from step.init(params); got a "
          f"{type(state).__name__} as the state (the parameters? make the "
          "state once with state = step.init(params), then call "
          "state, metrics = step(state, batch))")
    expected = type(self.loss_scale).__name__
    given = type(state.loss_scale).__name__
    if given != expected:
      raise TypeError(
          f"this state carries a {given}, and this step (policy "
          f"{self.policy}) uses a {expected}: it was made by another step "
          "(an f16 step's state in a bf16 step?). Make the state with this "
          "step's init, or give both steps the same loss_scale=")
    want = jnp.dtype(self.policy.param_dtype)
    for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
      dtype = jax_compat.dtype_of(leaf)
      if (jnp.issubdtype(dtype, jnp.floating) and dtype != want and
          dtype != jnp.dtype(jnp.float64)):
        raise TypeError(
            f"the state's parameter {jax.tree_util.keystr(path) or 'params'} "
            f"is {dtype}, and this step's policy {self.policy} keeps "
            f"parameters in {want.name}: the state was made by another "
            "step; make it with this step's init")
    self._check_opt_state(state)

  def _check_opt_state(self, state: TrainState) -> None:
    """TypeError naming the first optimizer-state leaf that is not what
    this step's optimizer makes for the state's parameters, as this step
    stores it: a state of another step (f8 blocks under
    opt_state_dtype='bf16', a plain optax state under a low-precision
    one) or of other parameters."""
    expected = self.expected_opt_state(state.params)
    how = (f" (opt_state_dtype={self._dtype!r})"
           if self._dtype != contract.values("opt_state_dtype").f32 else "")
    remedy = ("Make the state with this step's init; to restore a "
              "checkpoint, restore into jax.eval_shape(step.init, params) "
              "with the options it was saved with")
    want, want_tree = jax.tree_util.tree_flatten_with_path(expected)
    got, got_tree = jax.tree_util.tree_flatten_with_path(state.opt_state)
    if want_tree != got_tree:
      raise TypeError(
          "the state's optimizer state does not have the structure this "
          f"step's optimizer makes for its parameters: expected {want_tree}, "
          f"got {got_tree}. {remedy}")
    for (path, a), (_, b) in zip(want, got):
      shape, dtype = tuple(jnp.shape(b)), jnp.dtype(jax_compat.dtype_of(b))
      if shape == tuple(a.shape) and dtype == jnp.dtype(a.dtype):
        continue
      where = f"opt_state{jax.tree_util.keystr(path)}"
      raise TypeError(
          f"the state's {where} is {dtype.name}{list(shape)}, and this step"
          f"{how} takes {jnp.dtype(a.dtype).name}{list(a.shape)} there: "
          + ("it was made for parameters of other shapes. "
             if dtype == jnp.dtype(a.dtype) else
             "it was made by another step or by the optimizer alone. ")
          + remedy)
