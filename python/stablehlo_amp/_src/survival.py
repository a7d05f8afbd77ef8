"""What XLA kept of the pass's decisions, read from a compiled program.

`amp-insert-converts` marks the rounding convert of each value it stores in
the compute dtype, and `amp-fp8-gemms` each FP8 dot, with an XLA frontend
attribute (`amp_stored = "N"`, `amp_fp8 = "N"`; the names come from the
contract). XLA carries frontend attributes through its passes onto the
instructions of the optimized program, fused ones included, so the
program's text says for each decision whether it survived:

- a stored value survived if its rounded (bf16/f16) value is a buffer: an
  instruction outside any fusion, or an output of the fusion that computes
  it. A convert that is gone, or fused away inside a consumer, left no
  low-precision buffer;
- an FP8 dot survived if it is a GEMM on FP8 operands: a dot inside a GEMM
  fusion (Triton) or a cuBLASLt FP8 custom call. A dot whose operands XLA
  widened from FP8 values kept the FP8 rounding (XLA:CPU has no FP8 GEMM:
  EMULATED); one whose operands are no FP8 values lost it (UPCAST).

In an SPMD-partitioned program a stored value may cross devices: a
collective that carries the marker, or moves the low-precision value, is
read like any other instruction (an async `-start` by its result), and a
value XLA:CPU widens to f32 only to move it, narrowing it back after the
collective, is KEPT: the buffer the program reads is low-precision.

hlo.py reads the text `Compiled.as_text()` prints.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping

from stablehlo_amp._src import contract, hlo

# Statuses of one decision in the compiled program.
KEPT = "kept"                # stored value: a low-precision buffer
FUSED_AWAY = "fused away"    # stored value: rounded inside a fusion only
FP8_GEMM = "FP8 GEMM"        # FP8 dot: a GEMM on FP8 operands
EMULATED = "emulated"        # FP8 dot: XLA widened its FP8 operands and
                             # runs the GEMM wider (XLA:CPU has no FP8 GEMM)
UPCAST = "upcast"            # FP8 dot: its operands are no FP8 values
DROPPED = "dropped"          # the marked instruction is gone

# What counts as an FP8 decision XLA kept.
KEPT_FP8 = (FP8_GEMM, EMULATED)

# Ops that re-view a fusion output without computing it.
_VIEWS = ("bitcast", "copy", "reshape", "transpose", "tuple",
          "get-tuple-element")
# Those of them that keep one array one array.
_ARRAY_VIEWS = ("bitcast", "copy", "reshape", "transpose")


def _markers(ins: hlo.Instruction, key: str) -> list[int]:
  """The decision indices `ins` is marked with: its frontend attribute
  `key` (a comma-separated list where XLA combined marked instructions,
  such as collectives), else `[key=N]` in its op_name (the passes set both;
  an instruction layout normalization rebuilds keeps the op_name, and the
  attribute may have gone with a folded bitcast)."""
  value = ins.frontend_attributes.get(key)
  if value is None:
    return [int(n) for n in
            re.findall(rf"\[{re.escape(key)}=(\d+)\]", ins.op_name or "")]
  indices = value.split(",")
  if not all(index.strip().isdigit() for index in indices):
    raise ValueError(f"%{ins.name}: frontend attribute {key}={value!r} is "
                     "not a list of decision indices")
  return [int(index) for index in indices]


@dataclasses.dataclass(frozen=True)
class Survival:
  """For each marked decision (by its index in program order), its status
  in the compiled program: `stored` maps stored values to KEPT, FUSED_AWAY
  or DROPPED; `fp8` maps FP8 dots to FP8_GEMM, EMULATED, UPCAST or
  DROPPED."""
  stored: Mapping[int, str]
  fp8: Mapping[int, str]

  def lost(self) -> list[str]:
    """One line per decision XLA did not keep."""
    lines = [f"stored value {i}: {status}"
             for i, status in sorted(self.stored.items()) if status != KEPT]
    lines += [f"FP8 GEMM {i}: {status}"
              for i, status in sorted(self.fp8.items())
              if status not in KEPT_FP8]
    return lines


class _Program:
  """A compiled program, and who calls each fusion."""

  def __init__(self, module: hlo.Module):
    self.module = module
    # fused computation -> [(calling computation, fusion instruction)]
    self.callers = module.fusion_callers

  def _body(self, fusion: hlo.Instruction
            ) -> tuple[hlo.Computation, hlo.Instruction] | None:
    """The computation a fusion runs and its root."""
    body = (self.module.computations.get(fusion.calls[0])
            if fusion.opcode == "fusion" and fusion.calls else None)
    root = body.root if body else None
    return (body, root) if root else None

  def producers(self, computation: hlo.Computation, name: str,
                depth: int = 0
                ) -> list[tuple[hlo.Computation, hlo.Instruction]]:
    """What computes value `name` of `computation`: through views, fusion
    parameters (to the fusion's operand in its callers) and fusions (to
    their root)."""
    ins = computation.get(name)
    if ins is None or depth > 32:
      return []
    if ins.opcode in _VIEWS and ins.operands:
      return self.producers(computation, ins.operands[0], depth + 1)
    if ins.parameter_number is not None:
      return [p for caller, fusion in self.callers.get(computation.name, ())
              if ins.parameter_number < len(fusion.operands)
              for p in self.producers(
                  caller, fusion.operands[ins.parameter_number], depth + 1)]
    if ins.opcode == "fusion" and ins.calls:
      body = self._body(ins)
      return self.producers(body[0], body[1].name, depth + 1) if body else []
    return [(computation, ins)]

  def is_fp8_gemm(self, computation: hlo.Computation,
                  ins: hlo.Instruction) -> bool:
    """A dot whose operands are FP8, or a cuBLASLt FP8 GEMM call; a
    reduction of one (XLA's split-K GEMM adds up partial products); an
    MXFP8 GEMM's E8M0 scale that a block-scaled GEMM (`scaled-dot`) reads
    (XLA turns the `xla.scaled_dot` composite into one and keeps no marker
    of its own on it: amp-fp8-gemms marks the lhs's scale too)."""
    if ins.opcode == "custom-call":
      return "f8" in (ins.custom_call_target or "")
    if ins.opcode == "scaled-dot":
      shapes = [s for s in computation.operand_shapes(ins)[:2]
                if s is not None]
      return bool(shapes) and all(_is_fp8(s) for s in shapes)
    if not ins.shape.is_tuple and ins.shape.dtype == "f8e8m0fnu":
      return self._reaches(computation, ins, "scaled-dot")
    if ins.opcode == "dot":
      shapes = [s for s in computation.operand_shapes(ins) if s is not None]
      return bool(shapes) and all(_is_fp8(s) for s in shapes)
    if ins.opcode == "reduce" and ins.operands:
      return any(self.is_fp8_gemm(c, p)
                 for c, p in self.producers(computation, ins.operands[0]))
    return False

  def widens_fp8(self, computation: hlo.Computation,
                 ins: hlo.Instruction) -> bool:
    """A dot (or split-K reduction of one) each of whose operands is an FP8
    value that XLA converted to a wider type, or such a widened value."""
    if ins.opcode == "reduce" and ins.operands:
      return any(self.widens_fp8(c, p)
                 for c, p in self.producers(computation, ins.operands[0]))
    if ins.opcode == "dot":
      return bool(ins.operands) and all(
          self._from_fp8(computation, o) for o in ins.operands)
    # An MXFP8 scale is no operand: kept only where a block-scaled GEMM
    # reads it (is_fp8_gemm).
    if not ins.shape.is_tuple and ins.shape.dtype == "f8e8m0fnu":
      return False
    # XLA:CPU widens the dot's operands with converts that carry the dot's
    # attributes; an FP8 value widened is the FP8 rounding kept.
    return self._from_fp8(computation, ins.name)

  def _reaches(self, computation: hlo.Computation, ins: hlo.Instruction,
               opcode: str, depth: int = 0) -> bool:
    """Whether the value of `ins` is read by an `opcode` instruction:
    through views, into fusions (their parameters) and out of them (a
    fusion's root is the fusion's value in its callers)."""
    if depth > 32:
      return False
    for user, operand in _view_users(computation, ins):
      if user.opcode == opcode:
        return True
      body = self._body(user)
      if body is None:
        continue
      for parameter in body[0].instructions:
        number = parameter.parameter_number
        if (number is not None and number < len(user.operands) and
            user.operands[number] == operand and
            self._reaches(body[0], parameter, opcode, depth + 1)):
          return True
    if _under_views(computation, computation.root) is ins:
      return any(self._reaches(caller, fusion, opcode, depth + 1)
                 for caller, fusion in self.callers.get(computation.name, ()))
    return False

  def _from_fp8(self, computation: hlo.Computation, name: str,
                depth: int = 0) -> bool:
    """Whether value `name` is an FP8 value, or one converted (or viewed)
    from one, or such a value times its scale (MXFP8 dequantized), through
    fusion parameters and fusions."""
    ins = computation.get(name)
    if ins is None or depth > 32:
      return False
    if _is_fp8(ins.shape):
      return True
    if ins.opcode in _VIEWS + ("convert",) and ins.operands:
      return self._from_fp8(computation, ins.operands[0], depth + 1)
    if ins.opcode == "multiply" and ins.operands:
      return any(self._from_fp8(computation, o, depth + 1)
                 for o in ins.operands)
    if ins.parameter_number is not None:
      return any(self._from_fp8(caller, fusion.operands[ins.parameter_number],
                                depth + 1)
                 for caller, fusion in self.callers.get(computation.name, ())
                 if ins.parameter_number < len(fusion.operands))
    if ins.opcode == "fusion" and ins.calls:
      body = self._body(ins)
      return bool(body) and self._from_fp8(body[0], body[1].name, depth + 1)
    return False

  def moved_widened(self, computation: hlo.Computation,
                    ins: hlo.Instruction) -> bool:
    """Whether fused low-precision value `ins`, no output of its fusion,
    leaves the fusion only widened (the root is `ins` converted to a wider
    type, through views), into a collective whose result is narrowed back
    to the type of `ins`. XLA:CPU moves bf16 and f16 values between devices
    that way: the low-precision buffer is the collective's narrowed result,
    the value a sharded program reads."""
    widened = _under_views(computation, computation.root)
    if (widened is None or widened.opcode != "convert" or
        widened.shape.dtype not in ("f32", "f64") or
        _under_views(computation, computation.get(widened.operands[0]))
        is not ins):
      return False
    return any(
        user.collective_kind is not None and
        self._narrowed_back(caller, user, ins.result.dtype)
        for caller, fusion in self.callers.get(computation.name, ())
        for user, _ in _view_users(caller, fusion))

  def _narrowed_back(self, computation: hlo.Computation,
                     collective: hlo.Instruction, dtype: str) -> bool:
    """Whether a reader of the collective's result (its `-done`'s, if it is
    asynchronous) converts it to `dtype`: a convert, or a fusion whose
    root is that convert of the value."""
    results = ([collective] if not collective.opcode.endswith("-start") else
               [u for u in computation.users.get(collective.name, ())
                if u.opcode.endswith("-done")])
    for result in results:
      for user, operand in _view_users(computation, result):
        if user.opcode == "convert" and user.shape.dtype == dtype:
          return True
        body = self._body(user)
        convert = _under_views(*body) if body else None
        if (convert is None or convert.opcode != "convert" or
            convert.shape.dtype != dtype):
          continue
        read = _under_views(body[0], body[0].get(convert.operands[0]))
        number = read.parameter_number if read is not None else None
        if (number is not None and number < len(user.operands) and
            user.operands[number] == operand):
          return True
    return False


def _under_views(computation: hlo.Computation,
                 ins: hlo.Instruction | None) -> hlo.Instruction | None:
  """The instruction `ins` re-views (through bitcasts, copies, reshapes and
  transposes), or `ins` itself."""
  while ins is not None and ins.opcode in _ARRAY_VIEWS and ins.operands:
    ins = computation.get(ins.operands[0])
  return ins


def _view_users(computation: hlo.Computation, ins: hlo.Instruction
                ) -> list[tuple[hlo.Instruction, str]]:
  """The instructions that read the value of `ins` other than to re-view
  it, each with the name of the operand (`ins` or a view of it) it reads."""
  found, pending = [], [ins]
  while pending:
    value = pending.pop()
    for user in computation.users.get(value.name, ()):
      if user.opcode in _ARRAY_VIEWS:
        pending.append(user)
      else:
        found.append((user, value.name))
  return found


def _is_fp8(shape: hlo.Shape) -> bool:
  return not shape.is_tuple and hlo.is_fp8(shape.dtype)


def _is_low(ins: hlo.Instruction) -> bool:
  """Whether the value `ins` produces (an async collective's result, not
  its operands) is bf16 or f16 arrays."""
  types = ins.result.element_types
  return bool(types) and all(t in hlo.LOW_FLOATS for t in types)


def read(hlo_text: "str | hlo.Module", stored: Iterable[int] = (),
         fp8: Iterable[int] = ()) -> Survival:
  """The status of stored values `stored` and FP8 dots `fp8` (marker
  indices; a decision whose marker is missing is DROPPED) in `hlo_text`,
  the optimized program `Compiled.as_text()` prints (or its parsed
  module)."""
  program = _Program(hlo_text if isinstance(hlo_text, hlo.Module) else
                     hlo.Module.parse(hlo_text))
  stored_marker = contract.attribute("stored_marker")
  fp8_marker = contract.attribute("fp8_marker")
  stored_status = {i: DROPPED for i in stored}
  fp8_status = {i: DROPPED for i in fp8}
  rank = {DROPPED: 0, FUSED_AWAY: 1, UPCAST: 1, EMULATED: 2, KEPT: 3,
          FP8_GEMM: 3}

  def note(table: dict, index: int, status: str) -> None:
    if index in table and rank[status] > rank[table[index]]:
      table[index] = status

  for computation in program.module.computations.values():
    outputs = (_fusion_outputs(computation)
               if computation.name in program.callers else None)
    for ins in computation.instructions:
      indices = _markers(ins, stored_marker)
      if indices:
        low = _is_low(ins)
        materialized = (outputs is None or ins.name in outputs or
                        (low and program.moved_widened(computation, ins)) or
                        (low and _feeds_low_output(computation, ins,
                                                   outputs)))
        for index in indices:
          note(stored_status, index, KEPT if low and materialized else
               FUSED_AWAY if low else DROPPED)
      indices = _markers(ins, fp8_marker)
      if indices:
        status = (FP8_GEMM if program.is_fp8_gemm(computation, ins) else
                  EMULATED if program.widens_fp8(computation, ins) else
                  UPCAST)
        for index in indices:
          note(fp8_status, index, status)
  return Survival(stored_status, fp8_status)


def _feeds_low_output(computation: hlo.Computation, ins: hlo.Instruction,
                      outputs: set[str]) -> bool:
  """Whether the rounded value `ins` makes inside a fusion reaches one of
  its low-precision outputs (XLA:CPU fused `bf16(q)` into the fusion that
  writes `bf16(q * scale)`, which is what stays in memory): the rounding
  happened, and what leaves the fusion is low-precision."""
  pending, seen = [ins], set()
  while pending:
    value = pending.pop()
    if value.name in seen:
      continue
    seen.add(value.name)
    if value.name in outputs and value is not ins and _is_low(value):
      return True
    pending.extend(computation.users.get(value.name, ()))
  return False


def _fusion_outputs(computation: hlo.Computation) -> set[str]:
  """The instructions of a fused computation whose values leave it: the
  root and, through tuples and views, what the root is made of."""
  outputs: set[str] = set()
  pending = [computation.root] if computation.root else []
  while pending:
    ins = pending.pop()
    if ins.name in outputs:
      continue
    outputs.add(ins.name)
    if ins.opcode in _VIEWS:
      pending.extend(computation.by_name[o] for o in ins.operands
                     if o in computation.by_name)
  return outputs
