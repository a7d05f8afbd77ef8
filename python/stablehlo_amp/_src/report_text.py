"""The text of a `Report`: what `str(report)` and ``amp-opt --report``
print.

report.py holds the record (decisions, regions, collectives); this module
only reads it, so that a change of wording is a change here and the
record's fields stay what programs read.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Mapping

from stablehlo_amp._src import contract
from stablehlo_amp._src import survival

if TYPE_CHECKING:
  from stablehlo_amp._src.report import Collective, OpDecision, Report

# The precision ids the passes write (the contract's).
LOW, F32, UNCHANGED = contract.precisions()
# The phases of a training step, in report order.
PHASES = ("forward", "backward", "optimizer")
# Ops that follow their neighbours and would swamp the headline counts.
_FOLLOWERS = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.constant",
                        "stablehlo.iota"})
# XLA's name of the f32 element type (an HLO dtype, not a precision id).
_XLA_F32 = "f32"
# How many collective groups the text lists (the rest are summed).
_SHOWN_COLLECTIVES = 10


def _ops(count: int) -> str:
  return f"{count} op" if count == 1 else f"{count} ops"


def _mib(count: int) -> str:
  return f"{count / 2**20:.1f} MiB"


def _names(counter: collections.Counter) -> str:
  """``"dot_general 3, add 1"``: op names without their dialect."""
  return ", ".join(f"{op.split('.', 1)[-1]} {n}"
                   for op, n in counter.most_common())


def _compute(report: Report) -> str:
  """The policy's compute dtype as it writes it (``bf16``)."""
  return report.policy.split("c=")[1].split(",")[0]


def render(report: Report) -> str:
  """The report as people read it: what went low, what stayed f32 and
  why, what is stored low, the FP8 GEMMs, the converts, the sizes, and
  after compile() what XLA kept and what moves between devices."""
  compute = _compute(report)
  lowered = report.lowered
  lines = [
      f"amp-insert-converts: policy {report.policy}, level {report.level}, "
      f"target {report.target}",
      f"  lowered to {compute}: {_ops(sum(lowered.values()))}"
      + (f" ({_names(lowered)})" if lowered else ""),
  ]
  lines += _kept_lines(report.decisions)
  stored = report.stored_low
  if stored:
    lines.append(f"  f32 results stored in {compute}: "
                 f"{_ops(sum(stored.values()))} ({_names(stored)})")
  lines += _fp8_lines(report, compute)
  unchanged = report.unchanged
  if unchanged:
    lines.append(f"  left as they are (no f32 values, or already low "
                 f"precision): {_ops(sum(unchanged.values()))} "
                 f"({_names(unchanged)})")
  lines.append(f"  converts inserted: {report.converts_inserted} "
               f"(module has {report.converts_total})")
  if report.bytes_before or report.bytes_after:
    # A size of the program, not its memory: XLA reuses buffers and fuses
    # values away (compile() adds its figures on the next line).
    lines.append("  float values computed, by dtype (every SSA value "
                 "once, not memory use): before "
                 f"{_by_dtype(report.bytes_before)}; after "
                 f"{_by_dtype(report.bytes_after)}")
  lines += _compiled_lines(report, compute)
  lines += _collective_lines(report)
  return "\n".join(lines)


def _by_dtype(table: Mapping[str, int]) -> str:
  return ", ".join(f"{dtype} {_mib(n)}" for dtype, n in
                   sorted(table.items(), key=lambda kv: -kv[1])) or "none"


def _kept_lines(decisions: tuple[OpDecision, ...]) -> list[str]:
  """The ops kept f32 (broadcasts and constants apart), by reason; by
  phase, then reason, for a training step."""
  kept = [d for d in decisions
          if d.precision == F32 and d.op not in _FOLLOWERS]
  followers = sum(1 for d in decisions
                  if d.precision == F32 and d.op in _FOLLOWERS)
  lines = [f"  kept f32: {_ops(len(kept))}"
           + (f" (and {followers} broadcasts and constants, which follow "
              "their readers)" if followers else "")]
  phases = {phase: [d for d in kept if d.phase == phase] for phase in PHASES}
  if all(d.phase for d in kept) and sum(map(bool, phases.values())) > 1:
    for phase, in_phase in phases.items():
      if in_phase:
        lines.append(f"    {phase}: {_ops(len(in_phase))}")
        lines += _reason_lines(in_phase, "      ")
  else:
    lines += _reason_lines(kept, "    ")
  return lines


def _reason_lines(decisions: list[OpDecision], indent: str) -> list[str]:
  by_reason: dict[str, collections.Counter] = {}
  for d in decisions:
    by_reason.setdefault(d.reason, collections.Counter())[d.op] += 1
  return [f"{indent}{reason}: {sum(ops.values())} ({_names(ops)})"
          for reason, ops in sorted(by_reason.items(),
                                    key=lambda item: -sum(item[1].values()))]


def _fp8_lines(report: Report, compute: str) -> list[str]:
  """The lines on FP8 GEMMs: which, in what formats and why, why not,
  what moved."""
  lines = []
  fp8 = report.fp8_gemms
  if fp8:
    formats = collections.Counter(d.gemm for d in fp8)
    lines.append(f"  FP8 GEMMs: {_ops(len(fp8))} (" + ", ".join(
        f"{text}: {n}" for text, n in formats.most_common()) + ")")
    lines += _gradient_format_lines(report, fp8)
  ineligible = collections.Counter(
      d.gemm_reason_id for d in report.decisions if d.gemm_reason_id)
  for reason_id, n in ineligible.most_common():
    text = contract.fp8_reason_text(reason_id)
    lines.append(f"  kept in {compute}, not FP8: {text}: {_ops(n)}")
    # Each GEMM's own detail (its sizes).
    details = collections.Counter(
        d.gemm_detail for d in report.decisions
        if d.gemm_reason_id == reason_id and d.gemm_detail)
    lines += [f"    {detail}: {_ops(count)}"
              for detail, count in details.most_common()]
  if report.fp8_fallbacks:
    lines.append(f"  moved to {compute} by fp8_fallback, from measured "
                 "statistics (the step was compiled again):")
    lines += [f"    {line}" for line in report.fp8_fallbacks]
  return lines


def _gradient_format_lines(report: Report, fp8: list[OpDecision]
                           ) -> list[str]:
  """Why gemm=f8 made no operand e5m2 where some GEMMs are (or may be) a
  backward pass's: amp-fp8-gemms knows a gradient only as a value derived
  from an argument marked as the loss seed or a cotangent, which
  train_step and value_and_grad mark and a jax.jit step does not."""
  gemm = report.policy.partition("gemm=")[2].split(",")[0]
  if (gemm != contract.values("gemm").f8
      or any(contract.values("gemm").f8e5m2 in d.gemm for d in fp8)):
    return []
  # GEMMs known to be forward (or optimizer) ones read no gradient; one
  # of no known phase (no JAX locations) may.
  if all(d.phase in ("forward", "optimizer") for d in fp8):
    return []
  seed, cotangent = (contract.attribute("loss_seed"),
                     contract.attribute("cotangent"))
  return [f"    every FP8 operand is f8e4m3fn: gemm=f8 makes gradients "
          "f8e5m2, and a gradient is a value derived from an argument "
          f"marked {seed} or {cotangent}, which this module has none of "
          "(amp.train_step and amp.value_and_grad lower a step with its "
          "loss seed as such an argument; a jax.jit step seeds its "
          "backward pass with a constant)"]


def _compiled_lines(report: Report, compute: str) -> list[str]:
  """What compile() added: XLA's memory figures, and which decisions the
  compiled program kept."""
  lines = []
  if report.memory:
    lines.append("  XLA memory (after compile()): " + ", ".join(
        f"{k} {_mib(v)}" for k, v in report.memory.items()))
  xla = report.xla
  if xla is not None:
    kept = sum(v == survival.KEPT for v in xla.stored.values())
    gemms = sum(v == survival.FP8_GEMM for v in xla.fp8.values())
    emulated = sum(v == survival.EMULATED for v in xla.fp8.values())
    parts = []
    if xla.stored:
      parts.append(f"{kept} of {len(xla.stored)} stored values are "
                   f"{compute} buffers")
    if xla.fp8:
      parts.append(f"{gemms} of {len(xla.fp8)} FP8 dots are FP8 GEMMs"
                   + (f", {emulated} emulated (FP8 operands widened)"
                      if emulated else ""))
    if parts:
      lines.append("  kept by XLA: " + "; ".join(parts))
    lines += [f"    not kept: {line}" for line in lost_in_xla(report)]
  return lines


def lost_in_xla(report: Report, fused_away: bool = True) -> list[str]:
  """`Report.lost_in_xla`: one line per stored value or FP8 GEMM that XLA
  did not keep."""
  if report.xla is None:
    return []
  ignored = (None, survival.KEPT) + (() if fused_away else
                                     (survival.FUSED_AWAY,))
  lines = []
  for d in report.decisions:
    status = (report.xla.stored.get(d.stored_index)
              if d.stored_index is not None else None)
    if status not in ignored:
      lines.append(f"stored value of {d.op} at {d.where}: {status}")
    status = (report.xla.fp8.get(d.fp8_index)
              if d.fp8_index is not None else None)
    if status not in (None,) + survival.KEPT_FP8:
      lines.append(f"FP8 GEMM {d.op} at {d.where}: {status}")
  return lines


def _collective_lines(report: Report) -> list[str]:
  """Bytes moved per device by kind and dtype, then the largest groups
  with the decision that set their dtype."""
  if not report.collectives:
    return []
  totals: collections.Counter = collections.Counter()
  for c in report.collectives:
    totals[f"{c.kind} {c.dtype}"] += c.bytes
  lines = [f"  collectives per device: {_mib(sum(totals.values()))} ("
           + ", ".join(f"{name} {_mib(n)}" for name, n in
                       totals.most_common()) + ")"]
  shown = report.collectives[:_SHOWN_COLLECTIVES]
  lines += [f"    {c.kind} {c.dtype} {_mib(c.bytes)} ({c.count}x) "
            + _collective_why(report, c) for c in shown]
  rest = report.collectives[_SHOWN_COLLECTIVES:]
  if rest:
    lines.append(f"    and {len(rest)} more groups, "
                 f"{_mib(sum(c.bytes for c in rest))}")
  return lines


def _collective_why(report: Report, c: Collective) -> str:
  """``for OP: DECISION``; for a collective XLA combined of several, how
  many values of which ops, and each op's decision."""
  if not c.values:
    return f"for {c.op or '?'}: {_decision(report, c)}"
  # The same op of every layer reads as one primitive (its last name).
  by_primitive: dict[str, list[Collective]] = {}
  for value in c.values:
    by_primitive.setdefault(value.op.rsplit("/", 1)[-1] or "?",
                            []).append(value)
  counts = {name: sum(v.count for v in values)
            for name, values in by_primitive.items()}
  moved = {name: sum(v.bytes for v in values)
           for name, values in by_primitive.items()}
  order = sorted(counts, key=lambda name: (-moved[name], -counts[name]))
  why = []
  for name in order:
    decided = collections.Counter(
        _decision(report, v) for v in by_primitive[name]
        for _ in range(v.count))
    why.append(f"{name} {decided.most_common(1)[0][0]}")
  return (f"of {sum(counts.values())} values combined ("
          + ", ".join(f"{name} \N{MULTIPLICATION SIGN}{counts[name]}"
                      for name in order)
          + "): " + "; ".join(why))


def _decision(report: Report, c: Collective) -> str:
  """The decision that left a moved value in its dtype, as people read
  it, and where XLA:CPU moved a low value in f32, that it was XLA."""
  if not c.precision:
    return "no decision of ours"
  why = f"{c.precision}: {c.reason}"
  # A low op's value moved in f32: on CPU that is XLA's doing, not the
  # decision's (docs/sharding.md).
  if (report.target == contract.values("target").cpu
      and c.dtype == _XLA_F32 and c.precision == LOW):
    why += " (XLA:CPU runs bf16 collectives in f32)"
  return why
