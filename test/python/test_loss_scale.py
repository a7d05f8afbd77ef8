"""Tests for the loss-scale state (`amp.DynamicLossScale`, `StaticLossScale`,
`NoOpLossScale`), `amp.all_finite`, `amp.select_tree`, and the update rule
`amp-loss-scale` compiles into the step.

The scale and counter, step by step over scripted finite/overflow sequences,
are checked against references written here in plain Python floats: PyTorch
GradScaler's update (`amp_update_scale_` in aten), jmp's
`DynamicLossScale.adjust`, and the contract (PyTorch's rule with jmp's floor
and a ceiling). They are checked both for `DynamicLossScale.adjust` and for
the compiled program, where gradients are made non-finite on chosen steps by
a batch value that is inf or nan on those steps.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp import _amp

F32_MAX = 3.4028234663852886e38  # np.finfo(np.float32).max, as a Python float


def _f32_finite(x: float) -> bool:
  """Whether `x` (a product of the scale) is finite once stored in f32."""
  return math.isfinite(x) and abs(x) <= F32_MAX


# -- reference update rules, in plain Python -----------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  initial_scale: float
  growth_interval: int = 2000
  growth_factor: float = 2.0
  backoff_factor: float = 0.5
  min_scale: float = 1.0
  max_scale: float = 2.0 ** 24

  def make(self) -> amp.DynamicLossScale:
    return amp.DynamicLossScale(
        self.initial_scale, growth_interval=self.growth_interval,
        growth_factor=self.growth_factor, backoff_factor=self.backoff_factor,
        min_scale=self.min_scale, max_scale=self.max_scale)


def pytorch_update(scale: float, growth_tracker: int, found_inf: bool,
                   c: Config) -> tuple[float, int]:
  """PyTorch GradScaler (`_amp_update_scale_`): no floor, no ceiling; growth
  only if the grown scale is finite in f32; the tracker resets at the
  interval whether or not the scale grew."""
  if found_inf:
    return scale * c.backoff_factor, 0
  successful = growth_tracker + 1
  if successful == c.growth_interval:
    new_scale = scale * c.growth_factor
    if _f32_finite(new_scale):
      scale = new_scale
    return scale, 0
  return scale, successful


def jmp_adjust(loss_scale: float, counter: int, grads_finite: bool,
               c: Config) -> tuple[float, int]:
  """jmp `DynamicLossScale.adjust`: one `factor` both ways (growth by
  `factor`, backoff by 1/factor), `period`, `min_loss_scale`; a grown scale
  that is inf in f32 is replaced by the old one."""
  factor, period = c.growth_factor, c.growth_interval
  if grads_finite:
    new = loss_scale * factor if counter == period - 1 else loss_scale
  else:
    new = max(c.min_scale, loss_scale / factor)
  if not _f32_finite(new):
    new = loss_scale
  return new, ((counter + 1) % period) * int(grads_finite)


def contract_update(scale: float, counter: int, finite: bool,
                    c: Config) -> tuple[float, int]:
  """The rule amp-loss-scale builds (Passes.td): on overflow
  max(min_scale, scale * backoff) and
  the counter resets; after growth_interval finite steps scale * growth
  unless that overflows f32 or passes max_scale."""
  if not finite:
    return max(c.min_scale, scale * c.backoff_factor), 0
  counter += 1
  if counter >= c.growth_interval:
    grown = scale * c.growth_factor
    if _f32_finite(grown) and grown <= c.max_scale:
      scale = grown
    counter = 0
  return scale, counter


REFERENCES = {
    "pytorch": lambda s, n, finite, c: pytorch_update(s, n, not finite, c),
    "jmp": jmp_adjust,
    "contract": contract_update,
}


def reference_sequence(rule: str, c: Config,
                       pattern: list[bool]) -> list[tuple[float, int]]:
  update = REFERENCES[rule]
  scale, counter, out = c.initial_scale, 0, []
  for finite in pattern:
    scale, counter = update(scale, counter, finite, c)
    out.append((scale, counter))
  return out


@dataclasses.dataclass(frozen=True)
class Scenario:
  name: str
  config: Config
  pattern: tuple[bool, ...]  # True: finite step, False: overflow
  anchors: tuple[str, ...]   # other rules that must agree on this sequence
  policy: str = "p=f32,c=f16,o=f32"


T, F = True, False
# Up to the ceiling, down to the floor and past it, then a random tail.
_MIXED_PATTERN = ((T,) * 12 + (F,) * 13 + tuple(
    bool(b) for b in np.random.default_rng(0).random(25) > 0.3))
SCENARIOS = [
    Scenario("growth_at_interval", Config(2.0 ** 10, growth_interval=3),
             (T,) * 7, ("pytorch", "jmp")),
    Scenario("backoff_resets_counter", Config(2.0 ** 10, growth_interval=3),
             (T, T, F, T, T, T, F, F, T, T, T), ("pytorch", "jmp")),
    Scenario("floor_at_default_min_scale", Config(4.0, growth_interval=2),
             (F, F, F, F, T, T, T), ("jmp",)),
    # metaseq's tuning: a floor below 1, and no stop at the floor.
    Scenario("floor_below_one", Config(1.0, growth_interval=4,
                                       min_scale=2.0 ** -5),
             (F,) * 8 + (T,) * 5, ("jmp",)),
    # Large scales would overflow f16 activations by themselves: f32 compute.
    Scenario("ceiling_at_max_scale", Config(2.0 ** 22, growth_interval=1),
             (T, T, T, T, F, T, T), (), "p=f32,c=f32,o=f32"),
    Scenario("ceiling_not_a_power_of_two",
             Config(3.0, growth_interval=1, max_scale=10.0),
             (T, T, T, F, T, T), ()),
    Scenario("growth_would_overflow_f32",
             Config(2.0 ** 125, growth_interval=1, max_scale=F32_MAX),
             (T, T, T, F, T, T), ("pytorch", "jmp"), "p=f32,c=f32,o=f32"),
    Scenario("separate_growth_and_backoff_factors",
             Config(2.0 ** 6, growth_interval=2, growth_factor=4.0,
                    backoff_factor=0.25),
             (T, T, T, T, F, T, F, F, F, T, T, T), ()),
    Scenario("long_mixed_sequence",
             Config(2.0 ** 6, growth_interval=3, min_scale=2.0 ** -3,
                    max_scale=2.0 ** 9),
             _MIXED_PATTERN, ()),
]


def test_scenarios_exercise_what_they_are_named_after():
  """The sequences reach the floor and the ceiling where they should, and the
  anchors differ from the contract where they are not listed."""
  by_name = {s.name: s for s in SCENARIOS}

  def scales(rule, name):
    scenario = by_name[name]
    return [s for s, _ in reference_sequence(rule, scenario.config,
                                             scenario.pattern)]

  assert scales("contract", "floor_below_one")[5:8] == [2.0 ** -5] * 3
  assert scales("pytorch", "floor_below_one")[7] == 2.0 ** -8
  assert scales("contract", "ceiling_at_max_scale")[:4] == [
      2.0 ** 23, 2.0 ** 24, 2.0 ** 24, 2.0 ** 24]
  assert scales("pytorch", "ceiling_at_max_scale")[3] == 2.0 ** 26
  assert scales("contract", "growth_would_overflow_f32")[:3] == [
      2.0 ** 126, 2.0 ** 127, 2.0 ** 127]
  assert {2.0 ** -3, 2.0 ** 9} <= set(scales("contract",
                                             "long_mixed_sequence"))


def _check_sequence(scenario: Scenario, got: list[tuple[float, int]]):
  expected = reference_sequence("contract", scenario.config, scenario.pattern)
  assert got == expected, f"contract rule: {scenario.name}"
  for rule in scenario.anchors:
    assert got == reference_sequence(rule, scenario.config, scenario.pattern), (
        f"{rule} rule: {scenario.name}")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_adjust_matches_the_reference_rules(scenario):
  ls = scenario.config.make()
  got = []
  for finite in scenario.pattern:
    ls = ls.adjust(jnp.asarray(finite))
    assert ls.loss_scale.dtype == jnp.float32 and ls.counter.dtype == jnp.int32
    got.append((float(ls.loss_scale), int(ls.counter)))
  _check_sequence(scenario, got)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_adjust_as_a_scan_carry_under_jit(scenario):
  """The state is a loop carry: same pytree type and dtypes in and out."""
  @jax.jit
  def run(ls, pattern):
    def body(ls, finite):
      ls = ls.adjust(finite)
      return ls, (ls.loss_scale, ls.counter)
    return jax.lax.scan(body, ls, pattern)

  final, (scales, counters) = run(scenario.config.make(),
                                  jnp.asarray(scenario.pattern))
  got = [(float(s), int(n)) for s, n in zip(scales, counters)]
  _check_sequence(scenario, got)
  assert (float(final.loss_scale), int(final.counter)) == got[-1]
  assert final.min_scale == scenario.config.min_scale


# -- the same sequences through the compiled pass -----------------------------


def _dot_loss(w, x):
  return jnp.mean((x @ w) ** 2)


_W = jnp.full((8, 8), 0.125, jnp.float32)


def _batch(step: int, finite: bool) -> jax.Array:
  """Finite: small values; overflow: inf or nan (alternating)."""
  if finite:
    return jnp.full((8, 8), 0.25, jnp.float32)
  return jnp.full((8, 8), jnp.inf if step % 2 else jnp.nan, jnp.float32)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_compiled_value_and_grad_matches_the_reference_rules(scenario):
  vg = amp.value_and_grad(_dot_loss, scenario.policy)
  ls, got, flags = scenario.config.make(), [], []
  for step, finite in enumerate(scenario.pattern):
    (_, grads), grads_finite, ls = vg(_W, _batch(step, finite), loss_scale=ls)
    assert isinstance(ls, amp.DynamicLossScale)
    assert grads.dtype == jnp.float32
    flags.append(bool(grads_finite))
    got.append((float(ls.loss_scale), int(ls.counter)))
  assert flags == list(scenario.pattern)
  _check_sequence(scenario, got)
  assert ls.min_scale == scenario.config.min_scale
  assert ls.max_scale == scenario.config.max_scale
  assert vg.rewrite_count == 1


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.name in (
    "backoff_resets_counter", "floor_below_one", "ceiling_at_max_scale")],
                         ids=lambda s: s.name)
def test_compiled_train_step_matches_the_reference_rules(scenario):
  step = amp.train_step(_dot_loss, optax.sgd(1e-3), scenario.policy,
                        loss_scale=scenario.config.make())
  state = step.init(_W)
  got, skipped = [], []
  for i, finite in enumerate(scenario.pattern):
    state, metrics = step(state, _batch(i, finite))
    assert bool(metrics["grads_finite"]) == finite
    assert float(metrics["loss_scale"]) == float(state.loss_scale.loss_scale)
    got.append((float(state.loss_scale.loss_scale),
                int(state.loss_scale.counter)))
    skipped.append(int(metrics["skipped_steps"]))
  _check_sequence(scenario, got)
  assert skipped == list(np.cumsum([not f for f in scenario.pattern]))


# -- the two implementations of the rule, in lockstep -------------------------
#
# The rule exists twice: `DynamicLossScale.adjust` (pure JAX, for loops users
# write themselves: it must trace under jit, scan and vmap, so it cannot call
# a compiled program) and the ops amp-loss-scale builds into a step. Here
# both take the same state at every step, so the first step where they
# differ fails, whatever a reference rule says.


LOCKSTEP = [
    # Down to the floor and held there; period boundaries with and without
    # growth; a reset mid-period; up to the ceiling and held there (the
    # interval still resets the counter).
    Scenario("floor_periods_and_ceiling",
             Config(4.0, growth_interval=3, max_scale=16.0),
             (F, F, F, F) + (T,) * 3 + (T, T, F) + (T,) * 12 + (T,) * 4
             + (F, T, T, T, F, F), (), "p=f32,c=f32,o=f32"),
] + [s for s in SCENARIOS if s.name in (
    "ceiling_not_a_power_of_two", "growth_would_overflow_f32",
    "separate_growth_and_backoff_factors", "long_mixed_sequence")]


@pytest.mark.parametrize("scenario", LOCKSTEP, ids=lambda s: s.name)
def test_adjust_and_the_compiled_rule_agree_at_every_step(scenario):
  vg = amp.value_and_grad(_dot_loss, scenario.policy)
  ls, seen = scenario.config.make(), []
  for step, finite in enumerate(scenario.pattern):
    python = ls.adjust(jnp.asarray(finite))
    (_, _), grads_finite, compiled = vg(_W, _batch(step, finite),
                                        loss_scale=ls)
    assert bool(grads_finite) == finite
    got = (float(compiled.loss_scale), int(compiled.counter))
    assert got == (float(python.loss_scale), int(python.counter)), (
        f"step {step} ({'finite' if finite else 'overflow'}) from "
        f"{(float(ls.loss_scale), int(ls.counter))}: compiled {got}, "
        f"adjust {(float(python.loss_scale), int(python.counter))}")
    seen.append(got)
    ls = compiled
  assert vg.rewrite_count == 1
  if scenario.name == "floor_periods_and_ceiling":
    scales = [scale for scale, _ in seen]
    c = scenario.config
    assert scales[2:4] == [c.min_scale] * 2, "the floor is not held"
    assert scales.count(c.max_scale) >= 4, "the ceiling is not held"
    # The counter wraps at the interval whether or not the scale grew.
    wraps = [i for i, (_, n) in enumerate(seen) if n == 0 and
             scenario.pattern[i]]
    assert any(seen[i][0] == seen[i - 1][0] == c.max_scale for i in wraps)
    assert any(seen[i][0] > seen[i - 1][0] for i in wraps)


# -- the configuration, by name ----------------------------------------------


def test_a_misspelt_missing_or_fractional_field_is_an_error_naming_it():
  """The configuration crosses into C++ by name: the extension refuses what
  is not exactly the contract's fields."""
  fields = amp.DynamicLossScale().config()
  with pytest.raises(ValueError, match=r"unknown loss-scale field "
                     r"'growth_intervl' \(fields: growth_interval, "):
    _amp.loss_scale_config("dynamic", {
        **{k: v for k, v in fields.items() if k != "growth_interval"},
        "growth_intervl": 3})
  with pytest.raises(ValueError, match="missing loss-scale field 'max_scale'"):
    _amp.loss_scale_config("dynamic", {k: v for k, v in fields.items()
                                       if k != "max_scale"})
  with pytest.raises(TypeError, match="'growth_interval' must be a number"):
    _amp.loss_scale_config("dynamic", {**fields, "growth_interval": True})
  # A fractional interval was truncated once; now it is refused.
  with pytest.raises(ValueError, match="invalid growth_interval: must be an "
                     "integer, got 2.5"):
    amp.DynamicLossScale(growth_interval=2.5)
  # NumPy numbers are numbers.
  ls = amp.DynamicLossScale(growth_interval=np.int64(3),
                            min_scale=np.float32(0.5))
  assert ls.config() == {**fields, "growth_interval": 3, "min_scale": 0.5}
  assert type(ls.growth_interval) is int and type(ls.min_scale) is float
  # The pass's options are named too: a misspelt one is refused.
  module = jax.jit(lambda w: jnp.sum(w ** 2)).lower(jnp.ones(4)).as_text()
  with pytest.raises(KeyError, match="amp-loss-scale has no option "
                     "'growth-intervl'"):
    amp.rewrite_module(module, "p=f32,c=f16", loss_scale={
        "mode": "dynamic", "growth-intervl": 3})


# -- pytrees -------------------------------------------------------------------


CUSTOM = dict(growth_interval=7, growth_factor=3.0, backoff_factor=0.25,
              min_scale=2.0 ** -5, max_scale=2.0 ** 20)


def _fields(ls: amp.DynamicLossScale) -> dict:
  return dict(loss_scale=float(ls.loss_scale), counter=int(ls.counter),
              growth_interval=ls.growth_interval,
              growth_factor=ls.growth_factor,
              backoff_factor=ls.backoff_factor, min_scale=ls.min_scale,
              max_scale=ls.max_scale)


def test_dynamic_defaults():
  ls = amp.DynamicLossScale()
  assert _fields(ls) == dict(loss_scale=2.0 ** 15, counter=0,
                             growth_interval=2000, growth_factor=2.0,
                             backoff_factor=0.5, min_scale=1.0,
                             max_scale=2.0 ** 24)
  assert ls.loss_scale.dtype == jnp.float32
  assert ls.counter.dtype == jnp.int32


def test_dynamic_flatten_unflatten_keeps_every_field():
  ls = amp.DynamicLossScale(123.0, counter=5, **CUSTOM)
  leaves, treedef = jax.tree_util.tree_flatten(ls)
  assert [(np.shape(x), x.dtype) for x in leaves] == [((), jnp.float32),
                                                      ((), jnp.int32)]
  back = jax.tree_util.tree_unflatten(treedef, leaves)
  assert isinstance(back, amp.DynamicLossScale)
  assert _fields(back) == _fields(ls)
  assert _fields(jax.tree_util.tree_map(lambda x: x, ls)) == _fields(ls)
  # Two states with different configurations are different pytree types
  # (jit retraces instead of mixing them up).
  other = amp.DynamicLossScale(123.0, counter=5)
  assert jax.tree_util.tree_structure(other) != treedef


def test_dynamic_survives_jit_including_min_scale():
  """jmp drops `min_loss_scale` on flatten (it comes back as 1.0): here a
  floor of 2**-5 must still hold after the state went through `jit`."""
  ls = amp.DynamicLossScale(2.0 ** -3, **CUSTOM)
  same = jax.jit(lambda s: s)(ls)
  assert _fields(same) == _fields(ls)
  backed_off = jax.jit(
      lambda s: s.adjust(False).adjust(False).adjust(False))(ls)
  assert float(backed_off.loss_scale) == 2.0 ** -5
  assert _fields(backed_off)["min_scale"] == 2.0 ** -5
  # Non-finite steps at the floor keep it there, under jit too.
  again = jax.jit(lambda s: s.adjust(False))(backed_off)
  assert float(again.loss_scale) == 2.0 ** -5


def test_scale_is_float32_whatever_it_is_built_from():
  """An f16 scale breaks `lax.select` against f32 and cannot hold 2**16
  (jmp issue 47): the scale is always f32."""
  assert float(amp.DynamicLossScale(2.0 ** 16).loss_scale) == 65536.0
  for ls in (amp.DynamicLossScale(jnp.float16(8.0)),
             amp.StaticLossScale(jnp.float16(1024.0)),
             amp.StaticLossScale(1024), amp.NoOpLossScale()):
    assert jnp.asarray(ls.loss_scale).dtype == jnp.float32, ls
  ls = amp.DynamicLossScale(jnp.float16(8.0)).adjust(jnp.asarray(False))
  assert ls.loss_scale.dtype == jnp.float32


@pytest.mark.parametrize("kwargs, name, bad", [
    (dict(growth_interval=0), "growth_interval", "0"),
    (dict(growth_factor=0.5), "growth_factor", "0.5"),
    (dict(growth_factor=float("inf")), "growth_factor", "inf"),
    (dict(backoff_factor=2.0), "backoff_factor", "2.0"),
    (dict(backoff_factor=0.0), "backoff_factor", "0.0"),
    (dict(min_scale=0.0), "min_scale", "0.0"),
    (dict(min_scale=4.0, max_scale=2.0), "max_scale", "2.0"),
    (dict(min_scale=float("inf"), max_scale=float("inf")), "min_scale",
     "inf"),
])
def test_invalid_configuration_is_rejected_naming_the_value(kwargs, name, bad):
  """Checked at construction by the pass's own validation (one code path for
  Python and amp-opt): the message names the keyword and the value."""
  with pytest.raises(ValueError, match=f"invalid {name}: ") as info:
    amp.DynamicLossScale(**kwargs)
  assert str(info.value).endswith(f"got {bad}")


def test_static_loss_scale():
  ls = amp.StaticLossScale(1024.0)
  assert float(ls.loss_scale) == 1024.0
  assert float(ls.scale(jnp.float32(3.0))) == 3072.0
  np.testing.assert_array_equal(ls.unscale(jnp.full((3,), 2048.0)),
                                np.full((3,), 2.0, np.float32))
  for finite in (True, False):
    assert float(ls.adjust(jnp.asarray(finite)).loss_scale) == 1024.0
  leaves, treedef = jax.tree_util.tree_flatten(ls)
  assert len(leaves) == 1 and leaves[0].dtype == jnp.float32
  back = jax.tree_util.tree_unflatten(treedef, leaves)
  assert isinstance(back, amp.StaticLossScale)
  assert float(back.loss_scale) == 1024.0
  jitted = jax.jit(lambda s: s.adjust(jnp.asarray(False)))(ls)
  assert isinstance(jitted, amp.StaticLossScale)
  assert float(jitted.loss_scale) == 1024.0
  # Unflattened from leaves that are no arrays (a lowering's argument
  # descriptions): lowering a step whose state holds one failed so.
  assert jax.tree_util.tree_unflatten(treedef, [None]).loss_scale is None
  step = amp.train_step(lambda p, b: jnp.mean((b @ p) ** 2),
                        optax.sgd(0.1), "p=f32,c=f16,o=f32", loss_scale=ls)
  state = step.init(jnp.ones((4, 2)))
  assert step.lower(state, jnp.ones((3, 4))).report() is not None


def test_noop_loss_scale():
  ls = amp.NoOpLossScale()
  tree = {"a": jnp.arange(3.0), "b": jnp.arange(3)}
  assert ls.scale(tree) is tree and ls.unscale(tree) is tree
  assert float(ls.loss_scale) == 1.0
  assert jnp.asarray(ls.loss_scale).dtype == jnp.float32
  assert isinstance(ls.adjust(jnp.asarray(False)), amp.NoOpLossScale)
  assert jax.tree_util.tree_leaves(ls) == []
  assert isinstance(jax.jit(lambda s: s)(ls), amp.NoOpLossScale)


def test_scale_and_unscale_keep_dtypes_and_leave_ints_alone():
  ls = amp.DynamicLossScale(2.0 ** 10)
  assert float(ls.scale(jnp.float32(3.0))) == 3.0 * 2 ** 10
  tree = {"f32": jnp.array([1.0, -2.0, 0.5], jnp.float32) * 2 ** 10,
          "f16": jnp.array([4.0, 8.0], jnp.float16) * 2 ** 10,
          "bf16": jnp.array([1.0], jnp.bfloat16) * 2 ** 10,
          "int": jnp.array([3, 1024], jnp.int32)}
  out = ls.unscale(tree)
  assert jax.tree_util.tree_map(lambda x: x.dtype, out) == (
      jax.tree_util.tree_map(lambda x: x.dtype, tree))
  np.testing.assert_array_equal(out["f32"], [1.0, -2.0, 0.5])
  np.testing.assert_array_equal(out["f16"], np.array([4.0, 8.0], np.float16))
  np.testing.assert_array_equal(out["bf16"].astype(np.float32), [1.0])
  np.testing.assert_array_equal(out["int"], [3, 1024])
  x = jnp.array([0.1, 3.7, -1e-3], jnp.float32)
  np.testing.assert_array_equal(ls.unscale(ls.scale(x)), x)
  # Inside jit, as a step would use them.
  np.testing.assert_array_equal(
      jax.jit(lambda s, t: s.unscale(t))(ls, tree)["f32"], [1.0, -2.0, 0.5])


# -- all_finite and select_tree -----------------------------------------------


@pytest.mark.parametrize("tree, expected", [
    ({"a": jnp.ones((2, 3)), "n": jnp.arange(4), "s": [jnp.float16(1.0)]},
     True),
    ({"a": jnp.ones((2, 3)), "n": jnp.arange(4),
      "s": [jnp.array([1.0, jnp.inf], jnp.float16)]}, False),
    ({"a": jnp.array([1.0, jnp.nan]), "n": jnp.arange(4)}, False),
    ({"a": jnp.array([-jnp.inf], jnp.bfloat16)}, False),
    ({"n": jnp.arange(4), "m": jnp.array([2 ** 31 - 1], jnp.int32)}, True),
    ({}, True),
    ((jnp.zeros((0,)), jnp.ones(())), True),
], ids=["finite_with_ints", "f16_inf", "nan", "bf16_neg_inf", "ints_only",
        "empty", "empty_leaf"])
def test_all_finite(tree, expected):
  got = amp.all_finite(tree)
  assert jnp.shape(got) == () and jnp.asarray(got).dtype == jnp.bool_
  assert bool(got) is expected
  assert bool(jax.jit(amp.all_finite)(tree)) is expected


def test_select_tree_with_int_and_low_precision_leaves():
  a = {"w": jnp.ones((2, 2), jnp.float32), "n": jnp.array(3, jnp.int32),
       "h": [jnp.full((3,), 2.0, jnp.float16)]}
  b = {"w": jnp.zeros((2, 2), jnp.float32), "n": jnp.array(7, jnp.int32),
       "h": [jnp.full((3,), -1.0, jnp.float16)]}
  for pred, expected in ((True, a), (False, b)):
    for select in (amp.select_tree, jax.jit(amp.select_tree)):
      got = select(jnp.asarray(pred), a, b)
      assert (jax.tree_util.tree_structure(got) ==
              jax.tree_util.tree_structure(a))
      for x, y in zip(jax.tree_util.tree_leaves(got),
                      jax.tree_util.tree_leaves(expected)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_all_finite_and_select_tree_skip_an_overflowed_update():
  """The jmp-style manual loop: unscale, check, keep the old params on
  overflow, adjust the scale; all inside one jit."""
  @jax.jit
  def apply(params, grads, ls):
    grads = ls.unscale(grads)
    finite = amp.all_finite(grads)
    new = {"w": params["w"] - 0.1 * grads["w"], "step": params["step"] + 1}
    return amp.select_tree(finite, new, params), ls.adjust(finite)

  params = {"w": jnp.ones(3), "step": jnp.array(0)}
  ls = amp.DynamicLossScale(2.0 ** 4)
  good = {"w": jnp.full(3, 2.0 ** 4), "step": jnp.array(0)}
  bad = {"w": jnp.array([1.0, jnp.inf, 1.0]), "step": jnp.array(0)}
  new, ls1 = apply(params, good, ls)
  np.testing.assert_allclose(new["w"], np.full(3, 0.9, np.float32))
  assert float(ls1.loss_scale) == 2.0 ** 4 and int(ls1.counter) == 1
  kept, ls2 = apply(params, bad, ls1)
  np.testing.assert_array_equal(kept["w"], params["w"])
  assert float(ls2.loss_scale) == 2.0 ** 3 and int(ls2.counter) == 0


# -- Static and NoOp through the compiled pass ---------------------------------


def test_compiled_static_scale_unscales_and_does_not_update():
  x = jax.random.normal(jax.random.key(0), (8, 8))
  w = jax.random.normal(jax.random.key(1), (8, 8)) / 3
  vg = amp.value_and_grad(_dot_loss, "p=f32,c=f16,o=f32")
  ls = amp.StaticLossScale(1024.0)
  (loss, grads), finite, ls1 = vg(w, x, loss_scale=ls)
  ref_loss, ref_grads = jax.value_and_grad(_dot_loss)(w, x)
  assert bool(finite) and isinstance(ls1, amp.StaticLossScale)
  assert float(ls1.loss_scale) == 1024.0
  assert grads.dtype == jnp.float32
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-2)
  np.testing.assert_allclose(grads, ref_grads, rtol=1e-2, atol=1e-2 *
                             float(jnp.max(jnp.abs(ref_grads))))
  (_, _), finite, ls2 = vg(w, x.at[0, 0].set(jnp.inf), loss_scale=ls1)
  assert not bool(finite) and float(ls2.loss_scale) == 1024.0


def test_compiled_noop_scale_still_checks_gradients():
  """mode=none: no scale argument, but the predicate and the returned state
  are still there."""
  vg = amp.value_and_grad(_dot_loss, "p=f32,c=f16,o=f32")
  w, x = jnp.full((8, 8), 0.125), jnp.full((8, 8), 0.5)
  (_, grads), finite, ls = vg(w, x, loss_scale=amp.NoOpLossScale())
  assert bool(finite) and isinstance(ls, amp.NoOpLossScale)
  assert grads.dtype == jnp.float32
  np.testing.assert_allclose(grads, jax.grad(_dot_loss)(w, x), rtol=1e-2)
  (_, _), finite, _ = vg(w, jnp.full((8, 8), jnp.nan), loss_scale=ls)
  assert not bool(finite)


# -- checkpoints -------------------------------------------------------------------


def _checkpoint_setup():
  keys = jax.random.split(jax.random.key(7), 3)
  params = {"w": jax.random.normal(keys[0], (32, 16)) / 6,
            "b": jnp.zeros(16)}
  batches = [(jax.random.normal(k, (8, 32)),) for k in
             jax.random.split(keys[1], 6)]

  def loss(p, batch):
    (x,) = batch
    return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)

  step = amp.train_step(loss, optax.adam(1e-2), "p=f32,c=f16,o=f32",
                        loss_scale=amp.DynamicLossScale(2.0 ** 8,
                                                        growth_interval=2))
  return step, params, batches


def _three_steps_and_six():
  """The step, its inputs, the state after all six batches and the state
  after the first three (the one a checkpoint holds)."""
  step, params, batches = _checkpoint_setup()
  straight = step.init(params)
  for batch in batches:
    straight, _ = step(straight, batch)
  state = step.init(params)
  for batch in batches[:3]:
    state, _ = step(state, batch)
  return step, params, batches, straight, state


def _leaves_equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in
             zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_flax_serialization_round_trips_a_train_state_and_resumes():
  serialization = pytest.importorskip("flax.serialization")
  step, params, batches, straight, state = _three_steps_and_six()
  data = serialization.to_bytes(state)
  restored = serialization.from_bytes(step.init(params), data)
  assert isinstance(restored.loss_scale, amp.DynamicLossScale)
  assert restored.loss_scale.growth_interval == 2
  assert _leaves_equal(restored, state)
  for batch in batches[3:]:
    restored, _ = step(restored, batch)
  assert _leaves_equal(restored, straight)
  # The configuration comes from the checkpoint, not from the target.
  other = step.init(params)._replace(loss_scale=amp.DynamicLossScale())
  assert serialization.from_bytes(other, data).loss_scale.growth_interval == 2


@pytest.mark.parametrize("loss_scale", [amp.NoOpLossScale(),
                                        amp.StaticLossScale(128.0)])
def test_flax_serialization_of_the_other_loss_scales(loss_scale):
  serialization = pytest.importorskip("flax.serialization")
  restored = serialization.from_bytes(loss_scale,
                                      serialization.to_bytes(loss_scale))
  assert type(restored) is type(loss_scale)
  assert float(restored.loss_scale) == float(loss_scale.loss_scale)


def test_orbax_round_trips_a_train_state_and_resumes(tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  step, params, batches, straight, state = _three_steps_and_six()
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", state)
  checkpointer.wait_until_finished()
  abstract = jax.eval_shape(step.init, params)
  restored = checkpointer.restore(tmp_path / "ckpt", abstract)
  assert isinstance(restored.loss_scale, amp.DynamicLossScale)
  assert _leaves_equal(restored, state)
  for batch in batches[3:]:
    restored, _ = step(restored, batch)
  assert _leaves_equal(restored, straight)


@pytest.mark.parametrize("value, hint", [
    (1024.0, r"amp.StaticLossScale\(1024.0\) for a fixed scale"),
    (2 ** 15, r"amp.DynamicLossScale\(32768\) for one that adapts"),
    ("dynamic", r"amp.DynamicLossScale\(\)"),
    ("static", r"amp.StaticLossScale\(scale\)"),
    (jnp.float32(8.0), r"expected amp.NoOpLossScale\(\), "
     r"amp.StaticLossScale\(scale\) or amp.DynamicLossScale"),
])
def test_a_loss_scale_that_is_not_one_is_an_error_when_made(value, hint):
  loss = lambda p, b: jnp.sum(p * b)
  with pytest.raises(TypeError, match=hint):
    amp.train_step(loss, optax.sgd(0.1), "p=f32,c=f16,o=f32",
                   loss_scale=value)
  with pytest.raises(TypeError, match=hint):
    amp.value_and_grad(loss, "p=f32,c=f16,o=f32")(jnp.ones(3), jnp.ones(3),
                                                  loss_scale=value)
  with pytest.raises(TypeError, match=hint):
    amp.PrecisionHandler("p=f32,c=f16,o=f32", loss_scale=value)
