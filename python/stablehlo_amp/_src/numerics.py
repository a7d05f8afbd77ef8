"""What a step measures of its own numerics, and how people read it.

With ``numerics="stats"`` the `amp-numerics` pass reduces, inside the
compiled step, each low-precision GEMM operand to its amax and exact counts
of its nonzero values, of those its format's rounding sends to zero
(underflow) and of those it cannot hold (saturated). A training step
returns them as `GemmStats` in ``metrics["gemm_stats"]``: arrays indexed
``[gemm, operand]``, the GEMM being the report's ``stats_index`` and the
operand 0 (lhs) or 1 (rhs); `value_and_grad` and `transform` return them
beside their outputs. `GemmStats.merge` accumulates them over steps;
`explain` ranks them against the report.

With ``numerics="provenance"`` the pass checks, inside the step, every
value each region of the step hands on (a module's forward or backward pass
at one source line, an optimizer line) for NaN and infinity, and sets the
region's bits. A training step returns them as `NonFinite` in
``metrics["nonfinite"]`` (`value_and_grad` and `transform` beside their
outputs); `NonFinite.first` names the first region to go
non-finite: the earliest whose bits are set while every region it reads
handed on finite values.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from stablehlo_amp._src import contract
from stablehlo_amp._src import policy
from stablehlo_amp._src.report import OpDecision, Region, Report

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


class NonFinite(NamedTuple):
  """Which regions of one step handed on a NaN or an infinity (or of
  several steps, merged): bit r of word r // 32 is region r of the report's
  `regions`, region 0 the step's inputs."""
  nan: jax.Array  # i32[words]
  inf: jax.Array  # i32[words]

  @classmethod
  def from_result(cls, bits: jax.Array) -> "NonFinite":
    """From amp-numerics' result (``i32[2, words]``: NaN, infinity)."""
    return cls(bits[0], bits[1])

  def merge(self, other: "NonFinite") -> "NonFinite":
    """The regions that went non-finite in either step."""
    return NonFinite(self.nan | other.nan, self.inf | other.inf)

  def _bits(self, words: Any, count: int) -> list[bool]:
    words = np.asarray(words).astype(np.int64) & 0xFFFFFFFF
    return [bool(words[r // 32] >> (r % 32) & 1) for r in range(count)]

  def regions(self, report: Report) -> list[tuple[Region, str]]:
    """The regions that handed on a non-finite value, in program order,
    each with what it handed on: ``"NaN"``, ``"infinity"`` or ``"NaN and
    infinity"``."""
    regions = report.regions
    if not regions:
      raise ValueError("the report lists no regions: give the report of a "
                       "step built with numerics='provenance'")
    if np.asarray(self.nan).shape[-1] != (len(regions) + 31) // 32:
      raise ValueError(f"the bits are of {np.asarray(self.nan).shape[-1] * 32}"
                       f" regions at most and the report has {len(regions)}: "
                       "give the report of the step that returned them")
    nan, inf = (self._bits(w, len(regions)) for w in (self.nan, self.inf))
    names = {(True, False): "NaN", (False, True): "infinity",
             (True, True): "NaN and infinity"}
    return [(region, names[nan[r], inf[r]])
            for r, region in enumerate(regions) if nan[r] or inf[r]]

  def first(self, report: Report) -> tuple[Region, str] | None:
    """The first region to go non-finite, and what it handed on: the
    earliest, in program order, whose inputs (the regions it reads) were
    all finite; None when every region was finite."""
    flagged = self.regions(report)
    bad = {region.index for region, _ in flagged}
    for region, what in flagged:
      if not bad & set(region.inputs):
        return region, what
    return flagged[0] if flagged else None


def measurements(roles: Sequence[str], extra: Sequence[Any]
                 ) -> dict[str, Any]:
  """The metrics of the measurements among a program's appended results
  (`extra`, marked `roles`; `contract.measurements()`): ``gemm_stats``
  (`GemmStats`) and ``nonfinite`` (`NonFinite`), those the program has."""
  table = contract.measurements()
  measured = {role: value for role, value in zip(roles, extra)
              if role in table}
  metrics: dict[str, Any] = {}
  if contract.attribute("gemm_amax") in measured:
    metrics["gemm_stats"] = GemmStats.from_results(
        measured[contract.attribute("gemm_amax")],
        measured[contract.attribute("gemm_counts")])
  if contract.attribute("nonfinite") in measured:
    metrics["nonfinite"] = NonFinite.from_result(
        measured[contract.attribute("nonfinite")])
  return metrics


# The largest finite bf16 (f32's range, at 8 bits of precision).
_F32_MAX_ROUNDED = float(jnp.finfo(jnp.bfloat16).max)


def _limit(fmt: str, what: str) -> str:
  """Why a value of `fmt` (the contract's dtype name) is what it is, for
  people."""
  if "infinity" in what and fmt:
    try:
      largest = float(jnp.finfo(policy.dtype_of(fmt)).max)
    except KeyError:  # a format the contract has no name for
      return f"{fmt} {what}"
    kind = "overflow" if what == "infinity" else "overflow, then NaN"
    # bf16 has f32's range: what overflows it overflows f32 too.
    same = (", f32's too: not a precision problem"
            if fmt != "f32" and largest >= _F32_MAX_ROUNDED else "")
    return f"{fmt} {kind}: max finite {largest:.6g}{same}"
  return f"{fmt} {what}" if fmt else what


def explain_nonfinite(bits: NonFinite, report: Report) -> list[str]:
  """The lines of `explain` on provenance: the first region to go
  non-finite, where it is and why, and how many followed."""
  flagged = bits.regions(report)
  watched = sum(not region.is_input for region in report.regions)
  if not flagged:
    return [f"Every value of the {watched} regions watched was finite."]
  region, what = bits.first(report)
  if region.is_input:
    lines = _explain_input(region, what)
  else:
    where = _relative(region.where)
    at = f" at {where}" if where not in region.name else ""
    lines = [f"First non-finite: {region.name}{at} "
             f"({_limit(region.format, what)})."]
  if len(flagged) > 1:
    lines.append(f"Then {len(flagged) - 1} more of the "
                 f"{len(report.regions) - 1} regions handed on non-finite "
                 "values, the next:")
    for later, kind in flagged[:8]:
      if later is region:
        continue
      if later.is_input:
        at = f" at {later.argument}" if later.argument else ""
        lines.append(f"  {later.name}{at} ({kind})")
      else:
        lines.append(f"  {later.name} at {_relative(later.where)} ({kind})")
  return lines


def _explain_input(region: Region, what: str) -> list[str]:
  """The first non-finite value was an input: which, and what that means
  (a NaN in the batch is bad data, not precision)."""
  if region.index == 0:
    return [f"First non-finite: the inputs held {_article(what)} (an "
            "argument: a step's parameters, optimizer state or batch)."]
  at = (region.argument if region.values == 1 else
        f"one of its {region.values} arrays")
  lines = [f"First non-finite: {region.name} held {_article(what)} ({at}), "
           "before the step computed anything."]
  if region.tree in ("batch", "rest", "flat_leaves"):
    lines.append("The data is not finite, whatever the precision: check the "
                 "batch (jnp.isfinite) before the step.")
  return lines


def _article(what: str) -> str:
  return {"NaN": "a NaN", "infinity": "an infinity"}.get(what, what)


def _relative(path: str) -> str:
  """`path` relative to the working directory when under it, and an
  installed package's file relative to its ``site-packages``
  (``optax/_src/update.py:42``)."""
  here = os.getcwd().rstrip(os.sep) + os.sep
  if path.startswith(here):
    return path[len(here):]
  for packages in (f"{os.sep}site-packages{os.sep}",
                   f"{os.sep}dist-packages{os.sep}"):
    if packages in path:
      return path.rsplit(packages, 1)[1]
  return path


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
    """``"backward GEMM 3"``: the GEMM's phase and place among the
    program's low-precision GEMMs (what ``keep_gemms=`` takes)."""
    phase = f"{self.gemm.phase} " if self.gemm.phase else ""
    place = (self.gemm.gemm_index if self.gemm.gemm_index is not None
             else self.gemm.stats_index)
    return f"{phase}GEMM {place}"

  @property
  def where(self) -> str:
    """The GEMM's `file:line` (relative to the working directory when
    under it), and its scope where that says more."""
    gemm = self.gemm
    where, scope = _relative(gemm.where), gemm.scope
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


def _report_of(source: Any) -> Report:
  """The Report `explain` reads: `source` itself, a `Lowered`'s, or the
  one of the program a step (`train_step`, `value_and_grad`, `transform`)
  last built."""
  usage = ("amp.explain(metrics, step) with the step that returned them, "
           "amp.explain(metrics, step.lower(state, batch)), or its "
           "Report (.report())")
  if isinstance(source, Report):
    return source
  if source is None:
    raise TypeError("explain needs the step, to name the regions and GEMMs "
                    f"its metrics index: {usage}")
  last = getattr(source, "last_report", None)
  if callable(last):
    report = last()
    if report is None:
      raise ValueError(f"this {type(source).__name__} has built no program "
                       "yet: call it, then explain what it returned")
    return report
  lowered = getattr(source, "report", None)
  if callable(lowered):
    report = lowered()
    if report is None:
      raise ValueError("this Lowered has no report: its rewrite fell back "
                       "to the original program, which measures nothing")
    return report
  raise TypeError(f"explain needs {usage}; got {type(source).__name__}")


def _skips(metrics: Mapping[str, Any], step_skips: bool | None,
           report: Report) -> bool:
  """Whether the step skips a step that is not finite: with skip_nonfinite
  (whose ``state_finite`` says so) or a loss scale it does; without either
  it applies it, as a plain JAX step. The step says; from a report alone,
  its policy's default loss scale does (f16's is dynamic, the others'
  none)."""
  if isinstance(metrics, Mapping) and "state_finite" in metrics:
    return True
  if step_skips is not None:
    return step_skips
  return (jnp.dtype(policy.as_policy(report.policy).compute_dtype) ==
          jnp.dtype(jnp.float16))


def explain(metrics: Mapping[str, Any] | GemmStats | NonFinite,
            report: Any = None, *, top: int = 8) -> str:
  """What a step's metrics say of its numerics, for people: whether it was
  skipped and why; with ``numerics="provenance"``, the first region to go
  non-finite, where it is and why; with ``numerics="stats"``, its `top`
  low-precision GEMM operands ranked by the fraction of values their
  rounding lost (underflow) or could not hold (saturated). `metrics` is a
  `train_step`'s, or `GemmStats` or `NonFinite` (merged over steps);
  `report` the step's: the step itself (the program it last built), its
  `Lowered` (``step.lower(state, batch)``) or their `Report`."""
  step_skips = getattr(report, "skips_nonfinite", None)
  report = _report_of(report)
  skips = _skips(metrics, step_skips, report)
  if isinstance(metrics, (GemmStats, NonFinite)):
    metrics = {"gemm_stats" if isinstance(metrics, GemmStats)
               else "nonfinite": metrics}
  lines = []
  for key, what in (("grads_finite", "its gradients were not finite"),
                    ("state_finite", "its new state was not finite")):
    if key in metrics and not bool(np.asarray(metrics[key])):
      lines.append(
          f"This step was skipped: {what}." if skips else
          f"This step's {what[4:]}, and it applied them: without a loss "
          "scale or skip_nonfinite=True a step skips nothing.")
  if "nonfinite" in metrics:
    lines.extend(explain_nonfinite(metrics["nonfinite"], report))
  if "gemm_stats" in metrics:
    lines.extend(_explain_stats(metrics["gemm_stats"], report, top))
  if not {"nonfinite", "gemm_stats"} & set(metrics):
    lines.append("Nothing measured of the numerics: build the step with "
                 "numerics='provenance' or numerics='stats'.")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Fp8Fallback:
  """``train_step(..., fp8_fallback=Fp8Fallback())``: move an FP8 GEMM to
  the compute dtype once its measured statistics say FP8 loses too much,
  as Transformer Engine's AutoswitchGemm does.

  Every `check_every` steps the step reads the statistics of those steps
  (``numerics="stats"``, merged): a GEMM with an operand rounded to FP8 of
  whose nonzero values more than `underflow` went to zero, or more than
  `saturation` saturated, is kept in the compute dtype from the next step
  on (``keep_gemms``). The step is compiled again each time the set grows,
  never per step, and a GEMM does not go back to FP8. The report lists
  each move with the figures it was taken from."""
  underflow: float = 0.05
  saturation: float = 0.01
  check_every: int = 1

  def __post_init__(self):
    for name in ("underflow", "saturation"):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, float)) or
          not 0 <= value < 1):
        raise ValueError(f"Fp8Fallback({name}=...) is the fraction of an "
                         "operand's nonzero values above which its GEMM "
                         f"leaves FP8: 0 <= {name} < 1, got {value!r}")
    every = self.check_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
      raise ValueError("Fp8Fallback(check_every=...) is a number of steps, "
                       f"at least 1, got {every!r}")

  def exceeded(self, row: "OperandStats") -> bool:
    """Whether `row`, an operand rounded to FP8, lost too much."""
    return (row.underflow_fraction > self.underflow or
            row.saturation_fraction > self.saturation)


@dataclasses.dataclass(frozen=True)
class Fp8FallbackEvent:
  """One GEMM `fp8_fallback` moved to the compute dtype: after which step,
  and the operand statistics that moved it."""
  step: int
  gemm_index: int
  operand: OperandStats
  fallback: Fp8Fallback

  def __str__(self) -> str:
    row = self.operand
    measured = (f"{_percent(row.underflow_fraction)} of its nonzero values "
                f"underflow (limit {_percent(self.fallback.underflow)})"
                if row.underflow_fraction > self.fallback.underflow else
                f"{_percent(row.saturation_fraction)} saturate (limit "
                f"{_percent(self.fallback.saturation)})")
    return (f"{row.gemm_name} at {row.where}: after step "
            f"{self.step}, its {row.operand} -> {row.format}: {measured}")


class Fp8FallbackWatch:
  """What `fp8_fallback` has measured so far, and what it moved."""

  def __init__(self, fallback: Fp8Fallback):
    self.fallback = fallback
    self.events: list[Fp8FallbackEvent] = []
    self._window: GemmStats | None = None
    self._steps = 0

  @property
  def kept(self) -> tuple[int, ...]:
    return tuple(sorted(e.gemm_index for e in self.events))

  def observe(self, stats: GemmStats, report: Report) -> bool:
    """Adds one step's statistics; every `check_every` steps, moves the
    GEMMs that lost too much. True when the set grew (the step must be
    built again)."""
    if any(isinstance(x, jax.core.Tracer) for x in stats):
      raise TypeError("fp8_fallback decides between steps, from the "
                      "statistics they returned: call the training step "
                      "outside jax.jit")
    self._window = stats if self._window is None else \
        self._window.merge(stats)
    self._steps += 1
    if self._steps % self.fallback.check_every:
      return False
    rows = operand_stats(self._window, report)
    self._window = None
    kept = set(self.kept)
    grew = False
    for row in rows:  # worst first: an event names the worst operand
      index = row.gemm.gemm_index
      if (index is None or index in kept or not row.format.startswith("f8")
          or not self.fallback.exceeded(row)):
        continue
      kept.add(index)
      self.events.append(Fp8FallbackEvent(self._steps, index, row,
                                          self.fallback))
      grew = True
    return grew


def _explain_stats(stats: GemmStats, report: Report, top: int) -> list[str]:
  rows = stats.operands(report)
  measured = [row for row in rows if row.format]
  lines = [f"Low-precision GEMMs: {len(rows) // 2}, "
           f"{len(measured)} operands rounded at the GEMM."]
  lossy = _grouped([row for row in measured if row.loss > 0])
  if not lossy:
    return lines + ["No operand lost a value to underflow or saturation."]
  lines.append(f"Worst {min(top, len(lossy))} of {len(lossy)} roundings "
               "that lost values:")
  for group in lossy[:top]:
    first = group[0]
    readers = ", ".join(f"{row.gemm_name} {row.operand}" for row in group)
    lines.append(f"  {first.where}, {readers} {first.measurement()}")
  return lines
