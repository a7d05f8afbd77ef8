"""The contract with the C++ passes, read from the extension.

Everything the passes define and the Python side needs (attribute names, the
loss-scale defaults and the arguments and results the loss-scale pass
appends, option choices and defaults, decision reasons) comes from
`passes/Contract.{h,cpp}` through `_amp.contract()`. Nothing here is a copy:
this module only gives the JSON document names.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from stablehlo_amp import _amp


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


INSERT_CONVERTS = "amp-insert-converts"
LOSS_SCALE = "amp-loss-scale"
FP8_GEMMS = "amp-fp8-gemms"
REMATERIALIZE = "amp-rematerialize"
SIMPLIFY_CONVERTS = "amp-simplify-converts"


def loss_scale_defaults() -> Mapping[str, Any]:
  """Defaults of the dynamic loss-scale rule, by Python field name."""
  data = document()["loss_scale"]
  return {k: v for k, v in data.items() if k != "layouts"}


def loss_scale_layout(mode: str) -> Mapping[str, tuple[str, ...]]:
  """What `amp-loss-scale` in `mode` appends to `main`: ``arguments`` and
  ``results``, each a tuple of role attribute names, in order."""
  layout = document()["loss_scale"]["layouts"][mode]
  return {"arguments": tuple(layout["arguments"]),
          "results": tuple(layout["results"])}


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
