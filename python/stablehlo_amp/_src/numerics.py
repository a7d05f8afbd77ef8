"""What a step measures of its own numerics, and how people read it.

With ``numerics="stats"`` the `amp-numerics` pass reduces, inside the
compiled step, each low-precision GEMM operand to its amax and exact counts
of its nonzero values, of those its format's rounding sends to zero
(underflow) and of those it cannot hold (saturated). A training step
returns them as `GemmStats` in ``metrics["gemm_stats"]``: arrays indexed
``[gemm, operand]``, the GEMM being the report's ``stats_index`` and the
operand 0 (lhs) or 1 (rhs). `GemmStats.merge` accumulates them over steps;
`explain` ranks them against the report.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stablehlo_amp._src import contract
from stablehlo_amp._src.report import OpDecision, Report

_OPERANDS = ("lhs", "rhs")


class GemmStats(NamedTuple):
  """Range statistics of the low-precision GEMM operands of one step (or
  of several, merged), each an array of shape ``[gemms, 2]``."""
  amax: jax.Array       # f32: largest magnitude, before any FP8 scaling
  nonzero: jax.Array    # i32: values that are not zero
  underflow: jax.Array  # i32: nonzero values the rounding sends to zero
  saturated: jax.Array  # i32: values beyond the format's largest finite one

  @classmethod
  def from_results(cls, amax: jax.Array, counts: jax.Array) -> "GemmStats":
    """From amp-numerics' two results (``f32[G, 2]``, ``i32[G, 2, 3]``)."""
    columns = contract.gemm_stats_counts()
    return cls(amax, *(counts[..., columns.index(name)]
                       for name in ("nonzero", "underflow", "saturated")))

  def merge(self, other: "GemmStats") -> "GemmStats":
    """Both steps' statistics as one: the larger amax (NaN stays), the
    counts summed."""
    return GemmStats(jnp.maximum(self.amax, other.amax),
                     self.nonzero + other.nonzero,
                     self.underflow + other.underflow,
                     self.saturated + other.saturated)

  @property
  def underflow_fraction(self) -> jax.Array:
    """The fraction of nonzero values that underflow (0 where none is
    nonzero)."""
    return self.underflow / jnp.maximum(self.nonzero, 1)

  @property
  def saturation_fraction(self) -> jax.Array:
    """The fraction of nonzero values that saturate."""
    return self.saturated / jnp.maximum(self.nonzero, 1)

  def operands(self, report: Report) -> list["OperandStats"]:
    """Every measured operand with its GEMM's decision in `report` (the
    step's), worst first: by the larger of its underflow and saturation
    fractions, a non-finite amax before all."""
    return operand_stats(self, report)


@dataclasses.dataclass(frozen=True)
class OperandStats:
  """One GEMM operand's statistics, with the GEMM's decision."""
  gemm: OpDecision
  operand: str       # "lhs" or "rhs"
  format: str        # the format it is rounded to at the GEMM, or ""
  amax: float
  nonzero: int
  underflow: int
  saturated: int

  @property
  def underflow_fraction(self) -> float:
    return self.underflow / max(self.nonzero, 1)

  @property
  def saturation_fraction(self) -> float:
    return self.saturated / max(self.nonzero, 1)

  @property
  def loss(self) -> float:
    """What ranks it: the larger of the two fractions; a non-finite amax
    first of all."""
    return (np.inf if not np.isfinite(self.amax) else
            max(self.underflow_fraction, self.saturation_fraction))

  @property
  def gemm_name(self) -> str:
    """``"backward GEMM 3"``: the GEMM's phase and row."""
    phase = f"{self.gemm.phase} " if self.gemm.phase else ""
    return f"{phase}GEMM {self.gemm.stats_index}"

  @property
  def where(self) -> str:
    """The GEMM's `file:line` (relative to the working directory when
    under it), and its scope where that says more."""
    gemm = self.gemm
    where, scope = gemm.where, gemm.scope
    here = os.getcwd().rstrip(os.sep) + os.sep
    if where.startswith(here):
      where = where[len(here):]
    return where + (f" ({scope})" if scope and scope not in where else "")

  def measurement(self) -> str:
    """What was measured, without the GEMM."""
    if not self.format:
      return (f"computed in its own format (no rounding at the GEMM), "
              f"amax {self.amax:.3g}")
    return (f"-> {self.format}: {self.underflow:,} of {self.nonzero:,} "
            f"nonzero values underflow ({_percent(self.underflow_fraction)}), "
            f"{self.saturated:,} saturate "
            f"({_percent(self.saturation_fraction)}), amax {self.amax:.3g}")

  def __str__(self) -> str:
    return f"{self.gemm_name} at {self.where}, {self.operand} " + \
        self.measurement()


def _percent(fraction: float) -> str:
  if fraction == 0:
    return "0%"
  return "<0.01%" if fraction < 1e-4 else f"{fraction:.2%}"


def _grouped(rows: list[OperandStats]) -> list[list[OperandStats]]:
  """Rows that measured one rounding (read by several GEMMs: a weight in
  the forward and the backward pass), together, in the rows' order."""
  groups: dict[tuple, list[OperandStats]] = {}
  for row in rows:
    key = (row.where, row.format, row.amax, row.nonzero, row.underflow,
           row.saturated)
    groups.setdefault(key, []).append(row)
  return list(groups.values())


def operand_stats(stats: GemmStats, report: Report) -> list[OperandStats]:
  """Every measured operand with its GEMM's decision, worst first."""
  gemms = {d.stats_index: d for d in report.decisions
           if d.stats_index is not None}
  amax, nonzero, underflow, saturated = (np.asarray(a) for a in stats)
  if amax.shape[0] != len(gemms):
    raise ValueError(f"the statistics are of {amax.shape[0]} GEMMs and the "
                     f"report measures {len(gemms)}: give the report of the "
                     "step that returned them")
  rows = [OperandStats(gemms[g], _OPERANDS[k], gemms[g].stats_formats[k],
                       float(amax[g, k]), int(nonzero[g, k]),
                       int(underflow[g, k]), int(saturated[g, k]))
          for g in range(amax.shape[0]) for k in range(2)]
  return sorted(rows, key=lambda row: -row.loss)


def explain(metrics: Mapping[str, Any] | GemmStats, report: Report, *,
            top: int = 8) -> str:
  """What a step's metrics say of its numerics, for people: whether it was
  skipped and why, then its `top` low-precision GEMM operands ranked by
  the fraction of values their rounding lost (underflow) or could not hold
  (saturated). `metrics` is a `train_step`'s (with ``numerics="stats"``),
  or `GemmStats` (merged over steps); `report` the step's
  (``step.lower(state, batch).report()``)."""
  if not isinstance(report, Report):
    raise TypeError(f"explain needs the step's Report, got "
                    f"{type(report).__name__}")
  stats = metrics if isinstance(metrics, GemmStats) else metrics.get(
      "gemm_stats")
  lines = []
  if not isinstance(metrics, GemmStats):
    for key, what in (("grads_finite", "its gradients were not finite"),
                      ("state_finite", "its new state was not finite")):
      if key in metrics and not bool(np.asarray(metrics[key])):
        lines.append(f"This step was skipped: {what}.")
  if stats is None:
    lines.append("No GEMM statistics: build the step with "
                 "numerics='stats'.")
    return "\n".join(lines)
  rows = stats.operands(report)
  measured = [row for row in rows if row.format]
  lines.append(f"Low-precision GEMMs: {len(rows) // 2}, "
               f"{len(measured)} operands rounded at the GEMM.")
  lossy = _grouped([row for row in measured if row.loss > 0])
  if not lossy:
    lines.append("No operand lost a value to underflow or saturation.")
    return "\n".join(lines)
  lines.append(f"Worst {min(top, len(lossy))} of {len(lossy)} roundings "
               "that lost values:")
  for group in lossy[:top]:
    first = group[0]
    readers = ", ".join(f"{row.gemm_name} {row.operand}" for row in group)
    lines.append(f"  {first.where}, {readers} {first.measurement()}")
  return "\n".join(lines)
