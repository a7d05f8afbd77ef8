"""The contract with the C++ passes, read from the extension.

Everything the passes define and the Python side needs (attribute names, the
report's keys, the loss-scale fields, their defaults and the arguments and
results the loss-scale pass appends, option choices and defaults, decision
reasons) comes from `passes/Contract.{h,cpp}` through `_amp.contract()`.
Nothing here is a copy: this module only gives the JSON document names.
"""

from __future__ import annotations

import collections
import functools
import json
import pathlib
import re
from typing import Any, Mapping, NamedTuple

from stablehlo_amp import _amp
from stablehlo_amp._src import hlo


@functools.cache
def document() -> Mapping[str, Any]:
  """The whole contract, as the extension exports it."""
  return json.loads(_amp.contract())


def attribute(role: str) -> str:
  """The attribute (or custom-call target) name of `role`, e.g.
  ``attribute("loss_seed")``."""
  return document()["attributes"][role]


def option(pass_name: str, name: str) -> Mapping[str, Any]:
  """An option of a pass: ``{"default": ..., "choices": [...]}``."""
  return document()["passes"][pass_name]["options"][name]


def choices(pass_name: str, name: str) -> tuple[str, ...]:
  return tuple(option(pass_name, name)["choices"])


def default(pass_name: str, name: str) -> Any:
  return option(pass_name, name)["default"]


@functools.lru_cache(maxsize=None)
def f8_state_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape opt_state_dtype="f8" stores a tensor of `shape` as
  (`OptimizerStateBlocks::storedShape`): the tensor's leading dimensions
  that keep its blocks whole, then blocks of codes, each followed by its
  f32 scale's bytes."""
  return tuple(_amp.f8_state_shape([int(size) for size in shape]))


INSERT_CONVERTS = "amp-insert-converts"
LOSS_SCALE = "amp-loss-scale"
FP8_GEMMS = "amp-fp8-gemms"
REMATERIALIZE = "amp-rematerialize"
ROUND_STATE = "amp-round-state"
SIMPLIFY_CONVERTS = "amp-simplify-converts"
NUMERICS = "amp-numerics"


def gemm_stats_counts() -> tuple[str, ...]:
  """What amp-numerics counts per GEMM operand, in the order of the last
  dimension of its counts result: ("nonzero", "underflow", "saturated")."""
  return tuple(document()["gemm_stats_counts"])


def loss_scale_fields() -> tuple[Mapping[str, Any], ...]:
  """The configurable fields of the dynamic loss-scale rule, in order, each
  ``{"name", "option", "type", "default"}``: `name` is the Python keyword
  and the key `_amp.loss_scale_config` reads, `option` the `amp-loss-scale`
  option, `type` ``"int"`` or ``"float"``."""
  return tuple(document()["loss_scale"]["fields"])


def loss_scale_defaults() -> Mapping[str, Any]:
  """Defaults of the dynamic loss-scale rule by field name, and the
  `initial_scale` a front end starts from."""
  # JSON writes 2.0 as 2: a float field's default is made a float again.
  return {"initial_scale": float(document()["loss_scale"]["initial_scale"]),
          **{field["name"]: (float(field["default"])
                             if field["type"] == "float" else field["default"])
             for field in loss_scale_fields()}}


def loss_scale_layout(mode: str) -> Mapping[str, tuple[str, ...]]:
  """What `amp-loss-scale` in `mode` appends to `main`: ``arguments`` and
  ``results``, each a tuple of role attribute names, in order (mode
  ``none`` appends its check only with ``check-grads``; a program's own
  roles say whether it did)."""
  layout = document()["loss_scale"]["layouts"][mode]
  return {"arguments": tuple(layout["arguments"]),
          "results": tuple(layout["results"])}


def _keys(typename: str, by_role: Mapping[str, str]) -> NamedTuple:
  """`by_role` as a named tuple: ``keys.gemm_reason`` is the key of that
  role, and a role the contract does not declare is an AttributeError."""
  return collections.namedtuple(typename, by_role)(**by_role)


@functools.cache
def decision_keys() -> Any:
  """The keys of the ``amp.decision`` dictionary the passes put on an op
  (``precision``, ``reason``, ``gemm_reason``, ...), by role."""
  return _keys("DecisionKeys", document()["decisions"]["keys"])


@functools.cache
def report_keys() -> Any:
  """The top-level keys of the report JSON the extension hands over
  (``ops``, ``converts_inserted``, ...), by role."""
  return _keys("ReportKeys", document()["report"]["keys"])


@functools.cache
def report_op_keys() -> Any:
  """The keys of one op's record in the report's ``ops``: ``op``, ``loc``
  and the decision keys, by role."""
  return _keys("ReportOpKeys", document()["report"]["op_keys"])


@functools.cache
def report_region_keys() -> Any:
  """The keys of one record of the report's ``nonfinite_regions``
  (``numerics="provenance"``): ``loc``, ``primitives``, ``format``,
  ``inputs``, ``values``."""
  return _keys("ReportRegionKeys", document()["report"]["region_keys"])


def reason_text(reason_id: str) -> str:
  return document()["decisions"]["reasons"][reason_id]


def reasons(*reason_ids: str) -> tuple[str, ...]:
  """`reason_ids`, each checked against the contract's report reasons."""
  known = document()["decisions"]["reasons"]
  unknown = [r for r in reason_ids if r not in known]
  if unknown:
    raise KeyError(f"not report reasons of the contract: {unknown}")
  return reason_ids


def precisions() -> tuple[str, str, str]:
  """The report's precision ids: low, f32 and unchanged, in that order."""
  low, full, unchanged = document()["decisions"]["precisions"]
  return low, full, unchanged


def fp8_reason_text(reason_id: str) -> str:
  """Why a lowered dot is not an FP8 GEMM, for its `gemm_reason` id."""
  return document()["decisions"]["fp8_reasons"][reason_id]


def default_policy(training: bool = False) -> str:
  """The policy an entry point uses when none is given: transform, rewrite
  and amp-opt take bf16 compute; train_step and value_and_grad f16 with
  dynamic loss scaling."""
  return document()["policy"]["training_default" if training else "default"]


def policy_grammar() -> str:
  return document()["policy"]["grammar"]


@functools.cache
def options() -> Mapping[str, Mapping[str, Any]]:
  """The rewrite options the entry points take, by Python name, in order:
  each with its pass and pass spelling (an empty spelling switches the pass
  on or off), kind, default, choices, help (the option's description in
  Passes.td), and whether it configures state only `train_step` carries
  (``stateful``) or is set by stablehlo-amp itself (``internal``)."""
  described = _pass_option_help()
  return {spec["name"]: {"help": described.get((spec["pass"],
                                                 spec["option"]), ""),
                         **spec}
          for spec in document()["options"]}


def _pass_option_help() -> dict[tuple[str, str], str]:
  """(pass, option) -> the option's description, from the passes.md that
  mlir-tblgen writes from Passes.td (shipped with the package)."""
  text = (pathlib.Path(__file__).parent.parent / "passes.md").read_text()
  found, current = {}, None
  for line in text.splitlines():
    heading = re.match(r"^#+ `-?([a-z0-9-]+)`", line)
    if heading:
      current = heading.group(1)
      continue
    option = re.match(r"^-([a-z0-9-]+)\s*: (.*)$", line)
    if option and current:
      found[(current, option.group(1))] = option.group(2).strip()
  return found


@functools.cache
def values(name: str) -> Any:
  """The values of the choice option `name` (or of the policy's ``gemm``)
  as a named tuple of ids: ``values("update_rounding").kahan`` is
  ``"kahan"``. Python compares option values through these, never as
  literals, so a value the contract drops or renames fails where it is
  used (AttributeError)."""
  if name == "gemm":
    choices = [entry["name"] for entry in document()["policy"]["gemm_dtypes"]]
  else:
    choices = options()[name]["choices"]
  return _keys(f"{name}_values", {choice: choice for choice in choices})


def state_roles() -> Mapping[str, Mapping[str, Any]]:
  """Per role attribute a pass appends to a training step's main: the
  `TrainState` field that gives its argument and takes its result
  (``field``), the pass, whether there is one per parameter
  (``per_parameter``) and whether a skipped step keeps the old value
  (``kept_on_skip``, which the program does)."""
  return document()["state_roles"]


def measurements() -> Mapping[str, Mapping[str, Any]]:
  """Per attribute of a result a pass appends to main that is a measurement,
  not state (amp-numerics'): the pass (``pass``). A step returns them, in
  its metrics, and nothing gives them back."""
  return document()["measurements"]


def target_option() -> str:
  """The option naming the backend, which other options' defaults follow."""
  return next(name for name, spec in options().items() if spec.get("target"))


def roofline_names() -> tuple[str, ...]:
  """The targets the step estimate has figures for: ("h100", "b200")."""
  return tuple(entry["name"] for entry in document()["rooflines"])


def roofline(name: str) -> hlo.Roofline:
  """The roofline of target `name` (`roofline_names()`), with the achieved
  fractions of peak bandwidth applied, for `hlo.estimate`."""
  table = {entry["name"]: entry for entry in document()["rooflines"]}
  if name not in table:
    raise ValueError(f"no roofline for target {name!r} (known: "
                     f"{', '.join(table)})")
  entry = table[name]
  return hlo.Roofline(
      device=entry["device"], matrix_flops=dict(entry["matrix_flops"]),
      hbm_bytes_per_second=entry["bytes_per_second"] *
      entry["hbm_efficiency"],
      interconnect_bytes_per_second=entry["interconnect_bytes_per_second"] *
      entry["interconnect_efficiency"],
      launch_seconds=entry["launch_seconds"])
