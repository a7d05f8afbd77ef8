"""What `amp-insert-converts` decided for each op, as a record.

The pass hands over structured decisions (a precision, a reason id from the
contract, details); `Report` holds them with the regions and collectives of
the program, and report_text.py renders the text people read (its phrases
come from the contract too).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any, Mapping

from stablehlo_amp._src import contract
from stablehlo_amp._src import hlo
from stablehlo_amp._src import report_text
from stablehlo_amp._src import survival

# A frame in an MLIR location: "file":line:col.
_FRAME = re.compile(r'"([^"]+)":(\d+):\d+')
# The name JAX gives an op: `jit(f)/transpose(jvp(scope))/primitive`.
_NAME = re.compile(r'^loc\("([^"]*)"')
# Frames of these packages are not where the user's op is.
_LIBRARY_PATHS = ("/stablehlo_amp/", "/jax/", "/jaxlib/", "/flax/", "/optax/",
                  "/equinox/")
# Frames of these are not even where a library's op is.
_OWN_PATHS = ("/stablehlo_amp/", "/jax/", "/jaxlib/")
# JAX's transformation wrappers in op names, and the names of the functions
# the driver traces: neither is a scope the user wrote. The contract's
# (passes/Scopes.cpp), so the `scopes=` option matches what `scope` says.
_SCOPE_PATH = contract.document()["scope_path"]
_WRAPPER = re.compile(r"^(?:" + "|".join(map(re.escape,
                                             _SCOPE_PATH["wrappers"]))
                      + r")\((.*)\)$")
_DRIVER_NAMES = frozenset({"", *_SCOPE_PATH["driver_names"]})
# The precision ids the passes write (the contract's).
LOW, F32, UNCHANGED = contract.precisions()
# The keys of the report JSON and of each op's record in it (the contract's).
_KEY = contract.report_keys()
_OP_KEY = contract.report_op_keys()


def _unwrap(segment: str) -> str:
  while (match := _WRAPPER.match(segment)):
    segment = match[1]
  return segment


class Located:
  """Where an op is, read from its MLIR location (``loc``): its user
  `file:line`, its `jax.named_scope` path and its phase."""
  loc: str
  op: str

  @property
  def where(self) -> str:
    """`file:line` of the innermost frame of the location in the user's
    code (outside stablehlo_amp, JAX and the model libraries), else the
    innermost one outside stablehlo_amp and JAX (an optimizer's line in
    optax), else the op's name; never the raw location."""
    frames = _FRAME.findall(self.loc)
    for paths in (_LIBRARY_PATHS, _OWN_PATHS):
      for file, line in frames:
        if not any(part in file for part in paths):
          return f"{file}:{line}"
    return self.scope or self.op

  @property
  def scope(self) -> str:
    """The op's `jax.named_scope` path (``"model/attention"``), from the
    name JAX gives it, without JAX's transformation wrappers (jit, jvp,
    transpose, ...) and the primitive's own name; empty when it has none."""
    match = _NAME.match(self.loc)
    if not match:
      return ""
    parts = match[1].split("/")[:-1]
    # The first part, jit(f), names the function the module was lowered
    # from (the user's loss, or the driver's), not a scope.
    if parts and re.match(r"^p?jit\(", parts[0]):
      parts = parts[1:]
    segments = [_unwrap(part) for part in parts]
    return "/".join(part for part in segments if part not in _DRIVER_NAMES)

  @property
  def phase(self) -> str:
    """``"forward"``, ``"backward"`` or ``"optimizer"`` for an op of a
    program JAX traced; empty otherwise. JAX's autodiff markers decide
    first: its transpose is the backward pass and its `jvp` the forward
    pass, whichever library the op's lines are in (an optax loss is part
    of the model's passes). Of the other ops, those with optax frames are
    the optimizer's. An op whose name is only the passes' tags
    (``[amp_fp8=0]``: a module printed without JAX's locations) has no
    phase either."""
    match = _NAME.match(self.loc)
    if not match or not _TAG.sub("", match[1]):
      return ""
    if "transpose(" in match[1]:
      return "backward"
    if "jvp(" in match[1]:
      return "forward"
    if any("/optax/" in file for file, _ in _FRAME.findall(self.loc)):
      return "optimizer"
    return "forward"


@dataclasses.dataclass(frozen=True)
class OpDecision(Located):
  """The precision chosen for one op, why, and where the op is."""
  op: str
  precision: str  # LOW, F32 or UNCHANGED ("low", "f32", "unchanged")
  reason_id: str
  loc: str
  detail: str = ""
  group: int | None = None  # calibration group
  stored: bool = False      # its result is stored in the compute dtype
  gemm: str = ""            # FP8 operand formats, or why not FP8
  gemm_reason_id: str = ""  # why not FP8, as the contract's id
  gemm_detail: str = ""     # this GEMM's detail of why (its sizes)
  # The indices of its survival markers (the stored value's rounding, the
  # FP8 dot) in the program XLA compiles: see `Report.with_compiled`.
  stored_index: int | None = None
  fp8_index: int | None = None
  # A low-precision GEMM's place among the program's low-precision GEMMs,
  # in program order, FP8 or not: what ``keep_gemms=`` names.
  gemm_index: int | None = None
  # numerics="stats": the GEMM's row in the step's statistics, and per
  # operand the format it is rounded to there ("" where it is not).
  stats_index: int | None = None
  stats_formats: tuple[str, ...] = ()

  @property
  def reason(self) -> str:
    """The reason as people read it ("sum reduction" details included,
    "kept f32 by scopes['head']", "precision=HIGHEST requested at
    model.py:12")."""
    text = contract.reason_text(self.reason_id)
    if "{detail}" in text or "{where}" in text:
      return text.replace("{detail}", self.detail).replace(
          "{where}", self.where)
    return f"{text} ({self.detail})" if self.detail else text


# An input region's location: the name JAX gives its (first) argument.
_ARGUMENT = re.compile(r'^loc\("([^"]*)"\)$')
# The argument trees of the programs the driver lowers, as people read them
# (value_and_grad's are its function's positional arguments, transform's
# their flattened leaves).
_TREES = {"params": "the parameters", "opt_state": "the optimizer state",
          "model_state": "the model state", "batch": "the batch",
          "seed": "the loss scale", "diff": "the arguments",
          "rest": "the arguments", "flat_leaves": "the inputs"}


@dataclasses.dataclass(frozen=True)
class Region(Located):
  """One region of a step that ``numerics="provenance"`` watches: ops of
  one name scope and phase at one source line (``op`` names the first).
  Region 0 is the step's inputs that have no name; the regions after it
  that have no primitives are its named inputs (`is_input`): each argument
  tree (``params``, ``batch``), or each leaf of a tree of at most 16."""
  index: int
  loc: str
  op: str
  primitives: tuple[str, ...]  # the JAX primitives of its ops, in order
  format: str                  # the narrowest float type it hands on
  inputs: tuple[int, ...]      # the regions it reads
  values: int                  # how many values it hands on (each checked)

  @property
  def argument(self) -> str:
    """A named input region's argument path (``"batch[0]"``, ``"argument
    1['x']"``): of its only array where `values` is 1, else of its first;
    empty for the other regions."""
    match = (_ARGUMENT.match(self.loc)
             if self.index and not (self.primitives or self.inputs) else None)
    if not match:
      return ""
    path = match[1]
    if (position := re.match(r"^(?:diff|rest)\[(\d+)\](.*)$", path)):
      return f"argument {position[1]}{position[2]}"
    if (leaf := re.match(r"^flat_leaves\[(\d+)\]$", path)):
      return f"input leaf {leaf[1]}"
    return path

  @property
  def is_input(self) -> bool:
    """Whether it is one of the step's inputs (region 0, or a named one)."""
    return self.index == 0 or bool(self.argument)

  @property
  def tree(self) -> str:
    """A named input region's argument tree (``"batch"``); else empty."""
    match = _ARGUMENT.match(self.loc) if self.argument else None
    return re.split(r"[\[.]", match[1], maxsplit=1)[0] if match else ""

  @property
  def phase(self) -> str:
    return "" if self.is_input else super().phase

  @property
  def name(self) -> str:
    """``"backward of Model/Block_3/attn (exp, reduce_max)"``, ``"the
    batch"``, ``"the step's inputs"``."""
    if self.index == 0:
      return "the step's inputs"
    if self.is_input:
      return _TREES.get(self.tree, f"the argument `{self.tree}`")
    what = ", ".join(self.primitives[:4]) + (
        ", ..." if len(self.primitives) > 4 else "")
    scope = f"`{self.scope}`" if self.scope else "the step"
    phase = f"{self.phase} of " if self.phase else ""
    return f"{phase}{scope} ({what})" if what else f"{phase}{scope}"


# XLA names an instruction it makes for an op of the inlined module
# `jit(outer)/amp_module_call/jit(f)/...`; decisions' names start at
# `jit(f)/...`. Both are compared without their jit(...) heads and the
# decision tags (`[amp_stored=3]`).
_TAG = re.compile(r"\[amp_\w+=[\d,]+\]")


def _op_path(name: str) -> str:
  name = _TAG.sub("", name.rsplit("amp_module_call/", 1)[-1])
  parts = name.split("/")
  if parts and re.match(r"^p?jit\(", parts[0]):
    parts = parts[1:]
  return "/".join(parts)


@dataclasses.dataclass(frozen=True)
class Collective:
  """Collectives of one kind and dtype that XLA's SPMD partitioner made
  for one op of the program (by the name XLA gives them), and what each
  device moves (an all-gather by its result, the others by their
  operands)."""
  kind: str          # "all-gather", "reduce-scatter", "all-reduce", ...
  dtype: str         # what moves: "bf16", "f32", "f8e4m3fn", ...
  op: str            # the op XLA moved the value for, "jvp()/dot_general"
  count: int
  bytes: int
  # The decision for that op (its precision, and why, as people read
  # it): the one that left the value in this dtype. Empty where the op made
  # no decision (the loss scale's own, or an op XLA named otherwise), and
  # for a combined collective, whose values each have their own.
  precision: str = ""
  reason: str = ""
  # A collective XLA's combiner made of several (a gradient all-reduce of
  # every layer): the values it moves, one group per op they come from
  # (`count` values of that op, their bytes, its decision). `op` is then
  # the combined name XLA gives it. Empty for any other.
  values: tuple["Collective", ...] = ()


def _combined_names(name: str) -> tuple[str, ...]:
  """The names of the ops a collective XLA's combiner made joins, each
  whole; `(name,)` for one it did not make. The combiner names it after
  them: their common path, then the rest of each name in parentheses,
  joined by ':' (`jit(f)/(transpose(jvp())/dot_general:jvp()/reduce_sum)`)."""
  start = next((i for i, char in enumerate(name)
                if char == "(" and (i == 0 or name[i - 1] == "/")), None)
  if start is None or not name.endswith(")"):
    return (name,)
  names, depth, begin = [], 0, start + 1
  for i, char in enumerate(name[start + 1:-1], start + 1):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if char == ":" and depth == 0:
      names.append(name[begin:i])
      begin = i + 1
  names.append(name[begin:-1])
  if len(names) < 2 or depth != 0:
    return (name,)
  return tuple(name[:start] + part for part in names)


def _decisions_by_op(decisions: tuple[OpDecision, ...]
                     ) -> dict[str, tuple[str, str]]:
  """Op path -> the decision (precision, reason as people read it) of
  that name: the most common one among the decisions of that name (the
  same op in every layer)."""
  by_op: dict[str, collections.Counter] = {}
  for d in decisions:
    match = _NAME.match(d.loc)
    if match:
      by_op.setdefault(_op_path(match[1]), collections.Counter())[
          (d.precision, d.reason)] += 1
  return {op: counter.most_common(1)[0][0] for op, counter in by_op.items()}


def _values(names: tuple[str, ...], moved: tuple[hlo.Shape, ...],
            dtype: str) -> list[tuple[str, int]]:
  """The op and bytes of each value of `dtype` a combined collective
  moves: XLA names its ops in the order of the arrays it moves. Where
  their counts differ, every name with no bytes (the whole keeps them)."""
  if len(names) != len(moved):
    return [(_op_path(name), 0) for name in names]
  return [(_op_path(name), array.nbytes)
          for name, array in zip(names, moved) if array.dtype == dtype]


def _merge_values(group: Collective, values: list[tuple[str, int]],
                  decided: Mapping[str, tuple[str, str]]
                  ) -> tuple[Collective, ...]:
  """`group`'s values with `values` added, one record per op, largest
  first."""
  merged = {c.op: c for c in group.values}
  for op, nbytes in values:
    seen = merged.get(op) or Collective(group.kind, group.dtype, op, 0, 0,
                                        *decided.get(op, ("", "")))
    merged[op] = dataclasses.replace(seen, count=seen.count + 1,
                                     bytes=seen.bytes + nbytes)
  return tuple(sorted(merged.values(), key=lambda c: (-c.bytes, -c.count)))


def group_collectives(decisions: tuple[OpDecision, ...],
                      module: hlo.Module) -> tuple[Collective, ...]:
  """The program's collectives grouped by kind, dtype and the op they
  serve (counted in the group of the dtype of the first array they move),
  each with that op's decision, largest first; a combined one with its
  values grouped by their ops (`Collective.values`)."""
  decided = _decisions_by_op(decisions)
  groups: dict[tuple[str, str, str], Collective] = {}
  for collective in module.collectives():
    name = _TAG.sub("", collective.op_name)
    names, op = _combined_names(name), _op_path(name)
    moved = collective.moved
    first = moved[0].dtype if moved else ""
    for dtype in dict.fromkeys([first, *(a.dtype for a in moved)]):
      key = (collective.kind, dtype, op)
      group = groups.get(key) or Collective(
          collective.kind, dtype, op, 0, 0,
          *(decided.get(op, ("", "")) if len(names) == 1 else ("", "")))
      values = (_values(names, moved, dtype)
                if len(names) > 1 and (dtype == first or
                                       len(names) == len(moved)) else [])
      groups[key] = dataclasses.replace(
          group, count=group.count + (dtype == first),
          bytes=group.bytes + sum(a.nbytes for a in moved
                                  if a.dtype == dtype),
          values=_merge_values(group, values, decided) if values
          else group.values)
  return tuple(sorted(groups.values(), key=lambda c: -c.bytes))


@dataclasses.dataclass(frozen=True)
class Report:
  """The decisions of one rewrite: a record, whose text (`str(report)`)
  report_text.py renders.

  ``lowered`` and ``kept_f32`` count ops by name; ``kept_f32_reasons`` groups
  the kept ops by the reason they stayed f32; ``bytes_before`` and
  ``bytes_after`` give the bytes of the module's float values by dtype, each
  value once, in the dtype it is kept in (a value rounded right after it is
  made counts as its rounded copy; a widening convert is fused into its
  readers).
  """
  policy: str
  level: str
  target: str
  decisions: tuple[OpDecision, ...]
  converts_inserted: int
  converts_total: int
  bytes_before: Mapping[str, int] = dataclasses.field(default_factory=dict)
  bytes_after: Mapping[str, int] = dataclasses.field(default_factory=dict)
  memory: Mapping[str, int] | None = None  # XLA's memory_analysis, if compiled
  # What XLA kept of the stored values and FP8 GEMMs, if compiled.
  xla: survival.Survival | None = None
  # What the compiled program moves between devices, if it is partitioned.
  collectives: tuple[Collective, ...] = ()
  # numerics="provenance": the step's regions, in bit order.
  regions: tuple[Region, ...] = ()
  # fp8_fallback: the GEMMs a training step moved to the compute dtype
  # from their measured statistics, one line each.
  fp8_fallbacks: tuple[str, ...] = ()

  @classmethod
  def from_json(cls, text: str, *, policy: str, level: str,
                target: str) -> "Report":
    data = json.loads(text)
    decisions = tuple(_decision_from_json(d) for d in data[_KEY.ops])
    r = contract.report_region_keys()
    regions = tuple(
        Region(index=i, loc=d[r.loc],
               op=(d[r.primitives] or [""])[0],
               primitives=tuple(d[r.primitives]), format=d[r.format],
               inputs=tuple(d[r.inputs]), values=d[r.values])
        for i, d in enumerate(data.get(_KEY.nonfinite_regions, ())))
    return cls(policy, level, target, decisions,
               data[_KEY.converts_inserted], data[_KEY.converts_total],
               data.get(_KEY.bytes_before, {}),
               data.get(_KEY.bytes_after, {}), regions=regions)

  def with_memory(self, memory: Mapping[str, int]) -> "Report":
    return dataclasses.replace(self, memory=dict(memory))

  def with_compiled(self, hlo_text: str) -> "Report":
    """The report with what XLA kept, read from the optimized program
    (`Compiled.as_text()`): whether each stored value is a low-precision
    buffer and each FP8 dot an FP8 GEMM, and what it moves between
    devices."""
    module = hlo.Module.parse(hlo_text)
    return dataclasses.replace(
        self, xla=survival.read(
            module,
            stored=[d.stored_index for d in self.decisions
                    if d.stored_index is not None],
            fp8=[d.fp8_index for d in self.decisions
                 if d.fp8_index is not None]),
        collectives=group_collectives(self.decisions, module))

  def lost_in_xla(self, fused_away: bool = True) -> list[str]:
    """One line per stored value or FP8 GEMM that XLA did not keep, with
    the op and its location; empty if not compiled. `fused_away=False`
    leaves out the stored values whose rounding XLA computed inside the
    fusion that reads them: nothing is stored there, in either precision
    (XLA:CPU does it with f16, and with values it reads right away)."""
    return report_text.lost_in_xla(self, fused_away)

  @property
  def lowered(self) -> collections.Counter:
    return collections.Counter(
        d.op for d in self.decisions if d.precision == LOW)

  @property
  def kept_f32(self) -> collections.Counter:
    return collections.Counter(
        d.op for d in self.decisions if d.precision == F32)

  @property
  def unchanged(self) -> collections.Counter:
    """Ops with float values but none in f32 (f64, or already low
    precision): the policy does not apply to them."""
    return collections.Counter(
        d.op for d in self.decisions if d.precision == UNCHANGED)

  @property
  def stored_low(self) -> collections.Counter:
    """Ops whose f32 result is stored in the compute dtype."""
    return collections.Counter(d.op for d in self.decisions if d.stored)

  @property
  def fp8_gemms(self) -> list[OpDecision]:
    """The dots that take FP8 operands (`gemm` names the formats)."""
    return [d for d in self.decisions if d.fp8_index is not None]

  @property
  def kept_f32_reasons(self) -> dict[str, collections.Counter]:
    reasons: dict[str, collections.Counter] = {}
    for d in self.decisions:
      if d.precision == F32:
        reasons.setdefault(d.reason, collections.Counter())[d.op] += 1
    return reasons

  @property
  def groups(self) -> dict[int, list[OpDecision]]:
    """Calibration groups: each lowered matrix multiply and the ops painted
    low with it."""
    groups: dict[int, list[OpDecision]] = {}
    for d in self.decisions:
      if d.group is not None:
        groups.setdefault(d.group, []).append(d)
    return groups

  def to_dict(self) -> dict[str, Any]:
    # Python's own summary (the passes never read it): its keys are this
    # API's, not the contract's report keys, and stay put if those change.
    return {
        "policy": self.policy, "level": self.level, "target": self.target,
        "lowered": dict(self.lowered), "kept_f32": dict(self.kept_f32),
        "unchanged": dict(self.unchanged),
        "stored_low": dict(self.stored_low),
        "kept_f32_reasons": {k: dict(v) for k, v in
                             self.kept_f32_reasons.items()},
        "converts_inserted": self.converts_inserted,
        "converts_total": self.converts_total,
        "bytes_before": dict(self.bytes_before),
        "bytes_after": dict(self.bytes_after),
        "memory": dict(self.memory) if self.memory else None,
        "collectives": [dataclasses.asdict(c) for c in self.collectives],
        "fp8_fallbacks": list(self.fp8_fallbacks),
        "decisions": [{"op": d.op, "precision": d.precision,
                       "reason": d.reason_id, "where": d.where,
                       "scope": d.scope, "phase": d.phase}
                      for d in self.decisions],
    }

  def __str__(self) -> str:
    return report_text.render(self)


def _decision_from_json(d: Mapping[str, Any]) -> OpDecision:
  """One op's decision from its record in the report JSON."""
  k = _OP_KEY
  return OpDecision(op=d[k.op], precision=d[k.precision],
                    reason_id=d[k.reason], loc=d[k.loc],
                    detail=d.get(k.detail, ""), group=d.get(k.group),
                    stored=k.stored in d, gemm=d.get(k.gemm, ""),
                    gemm_reason_id=d.get(k.gemm_reason, ""),
                    gemm_detail=d.get(k.gemm_detail, ""),
                    stored_index=d.get(k.stored), fp8_index=d.get(k.fp8),
                    gemm_index=d.get(k.gemm_index),
                    stats_index=d.get(k.gemm_stats),
                    stats_formats=tuple(d.get(k.gemm_stats_formats, ())))
