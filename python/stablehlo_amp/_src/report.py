"""What `amp-insert-converts` decided for each op, summarised for people."""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any


def _ops(count: int) -> str:
  return f"{count} op" if count == 1 else f"{count} ops"


@dataclasses.dataclass(frozen=True)
class OpDecision:
  """The precision chosen for one op, why, and where the op is."""
  op: str
  precision: str  # "low" or "f32"
  reason: str
  loc: str


@dataclasses.dataclass(frozen=True)
class Report:
  """The decisions of one rewrite.

  ``lowered`` and ``kept_f32`` count ops by name; ``kept_f32_reasons`` groups
  the kept ops by the reason they stayed f32.
  """
  policy: str
  level: str
  target: str
  decisions: tuple[OpDecision, ...]
  converts_inserted: int
  converts_total: int

  @classmethod
  def from_json(cls, text: str, *, policy: str, level: str,
                target: str) -> "Report":
    data = json.loads(text)
    decisions = tuple(OpDecision(**op) for op in data["ops"])
    return cls(policy, level, target, decisions, data["converts_inserted"],
               data["converts_total"])

  @property
  def lowered(self) -> collections.Counter:
    return collections.Counter(
        d.op for d in self.decisions if d.precision == "low")

  @property
  def kept_f32(self) -> collections.Counter:
    return collections.Counter(
        d.op for d in self.decisions if d.precision == "f32")

  @property
  def unchanged(self) -> collections.Counter:
    """Ops with float values but none in f32 (f64, or already low
    precision): the policy does not apply to them."""
    return collections.Counter(
        d.op for d in self.decisions if d.precision == "unchanged")

  @property
  def kept_f32_reasons(self) -> dict[str, collections.Counter]:
    reasons: dict[str, collections.Counter] = {}
    for d in self.decisions:
      if d.precision == "f32":
        reasons.setdefault(d.reason, collections.Counter())[d.op] += 1
    return reasons

  def to_dict(self) -> dict[str, Any]:
    return {
        "policy": self.policy, "level": self.level, "target": self.target,
        "lowered": dict(self.lowered), "kept_f32": dict(self.kept_f32),
        "unchanged": dict(self.unchanged),
        "kept_f32_reasons": {k: dict(v) for k, v in
                             self.kept_f32_reasons.items()},
        "converts_inserted": self.converts_inserted,
        "converts_total": self.converts_total,
    }

  def __str__(self) -> str:
    def names(counter: collections.Counter) -> str:
      return ", ".join(f"{op.split('.', 1)[-1]} {n}"
                       for op, n in counter.most_common())
    compute = self.policy.split("c=")[1].split(",")[0]
    lowered, kept = self.lowered, self.kept_f32
    lines = [
        f"amp-insert-converts: policy {self.policy}, level {self.level}, "
        f"target {self.target}",
        f"  lowered to {compute}: {_ops(sum(lowered.values()))}"
        + (f" ({names(lowered)})" if lowered else ""),
        f"  kept f32: {_ops(sum(kept.values()))}",
    ]
    for reason, ops in sorted(self.kept_f32_reasons.items(),
                              key=lambda item: -sum(item[1].values())):
      lines.append(f"    {reason}: {sum(ops.values())} ({names(ops)})")
    unchanged = self.unchanged
    if unchanged:
      lines.append(f"  left as they are (no f32 values): "
                   f"{_ops(sum(unchanged.values()))} ({names(unchanged)})")
    lines.append(f"  converts inserted: {self.converts_inserted} "
                 f"(module has {self.converts_total})")
    return "\n".join(lines)
