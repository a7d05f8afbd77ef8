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

The parser reads the text `Compiled.as_text()` prints; it needs instruction
names, shapes, operands, `calls=` and frontend attributes, nothing else.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping

from stablehlo_amp._src import contract

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

_LOW_FLOATS = ("bf16", "f16")
_FP8 = re.compile(r"\bf8e\w+\[")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(ROOT )?%?([\w.\-]+) = (.*)$")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_OPERAND = re.compile(r"%([\w.\-]+)")
# Ops that re-view a fusion output without computing it.
_VIEWS = ("bitcast", "copy", "reshape", "transpose", "tuple",
          "get-tuple-element")


@dataclasses.dataclass
class _Instruction:
  name: str
  shape: str
  opcode: str
  operands: list[str]
  attributes: str
  root: bool
  parameter: int | None = None  # N of `parameter(N)`


def _split_shape(rest: str) -> tuple[str, str]:
  """`(f32[2], bf16[3]) tuple(...)` -> the shape and what follows it."""
  if rest.startswith("("):
    depth = 0
    for i, char in enumerate(rest):
      depth += char == "("
      depth -= char == ")"
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  shape, _, after = rest.partition(" ")
  return shape, after


def _parse_instruction(line: str) -> _Instruction | None:
  match = _INSTRUCTION.match(line)
  if not match:
    return None
  shape, after = _split_shape(match.group(3))
  opcode, _, tail = after.partition("(")
  depth, end = 1, len(tail)
  for i, char in enumerate(tail):
    depth += char == "("
    depth -= char == ")"
    if depth == 0:
      end = i
      break
  opcode = opcode.strip()
  inside = tail[:end]
  return _Instruction(match.group(2), shape, opcode, _OPERAND.findall(inside),
                      tail[end + 1:], bool(match.group(1)),
                      int(inside) if opcode == "parameter" and
                      inside.isdigit() else None)


def _computations(hlo_text: str) -> dict[str, list[_Instruction]]:
  computations: dict[str, list[_Instruction]] = {}
  current: list[_Instruction] | None = None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = computations.setdefault(header.group(1), [])
    elif line.startswith("}"):
      current = None
    elif current is not None:
      instruction = _parse_instruction(line)
      if instruction is not None:
        current.append(instruction)
  return computations


def _marker_values(attributes: str, key: str) -> list[int]:
  return [int(v) for v in re.findall(rf'\b{re.escape(key)}="(\d+)"',
                                     attributes)]


@dataclasses.dataclass(frozen=True)
class Survival:
  """For each marked decision (by its index in program order), its status
  in the compiled program: `stored` maps stored values to KEPT, FUSED_AWAY
  or DROPPED; `fp8` maps FP8 dots to FP8_GEMM, UPCAST or DROPPED."""
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
  """The computations of a compiled program, and who calls each fusion."""

  def __init__(self, hlo_text: str):
    self.computations = _computations(hlo_text)
    self.by_name = {name: {ins.name: ins for ins in instructions}
                    for name, instructions in self.computations.items()}
    # fused computation -> [(calling computation, fusion instruction)]
    self.callers: dict[str, list[tuple[str, _Instruction]]] = {}
    for name, instructions in self.computations.items():
      for ins in instructions:
        called = _CALLS.search(ins.attributes)
        if ins.opcode == "fusion" and called:
          self.callers.setdefault(called.group(1), []).append((name, ins))

  def root(self, computation: str) -> _Instruction | None:
    return next((ins for ins in self.computations.get(computation, ())
                 if ins.root), None)

  def producers(self, computation: str, name: str,
                depth: int = 0) -> list[_Instruction]:
    """What computes value `name` of `computation`: through views, fusion
    parameters (to the fusion's operand in its callers) and fusions (to
    their root)."""
    ins = self.by_name.get(computation, {}).get(name)
    if ins is None or depth > 32:
      return []
    if ins.opcode in _VIEWS and ins.operands:
      return self.producers(computation, ins.operands[0], depth + 1)
    if ins.parameter is not None:
      return [p for caller, fusion in self.callers.get(computation, ())
              if ins.parameter < len(fusion.operands)
              for p in self.producers(caller, fusion.operands[ins.parameter],
                                      depth + 1)]
    called = _CALLS.search(ins.attributes)
    if ins.opcode == "fusion" and called:
      root = self.root(called.group(1))
      return (self.producers(called.group(1), root.name, depth + 1)
              if root else [])
    return [(computation, ins)]

  def is_fp8_gemm(self, computation: str, ins: _Instruction) -> bool:
    """A dot whose operands are FP8, or a cuBLASLt FP8 GEMM call; a
    reduction of one (XLA's split-K GEMM adds up partial products)."""
    if ins.opcode == "custom-call":
      target = _TARGET.search(ins.attributes)
      return bool(target) and "f8" in target.group(1)
    if ins.opcode == "dot":
      shapes = [self.by_name[computation][o].shape for o in ins.operands
                if o in self.by_name[computation]]
      return bool(shapes) and all(_is_fp8(s) for s in shapes)
    if ins.opcode == "reduce" and ins.operands:
      return any(self.is_fp8_gemm(c, p)
                 for c, p in self.producers(computation, ins.operands[0]))
    return False

  def widens_fp8(self, computation: str, ins: _Instruction) -> bool:
    """A dot (or split-K reduction of one) each of whose operands is an FP8
    value that XLA converted to a wider type, or such a widened value."""
    if ins.opcode == "reduce" and ins.operands:
      return any(self.widens_fp8(c, p)
                 for c, p in self.producers(computation, ins.operands[0]))
    if ins.opcode == "dot":
      return bool(ins.operands) and all(
          self._from_fp8(computation, o) for o in ins.operands)
    # XLA:CPU widens the dot's operands with converts that carry the dot's
    # attributes; an FP8 value widened is the FP8 rounding kept.
    return ins.opcode != "dot" and self._from_fp8(computation, ins.name)

  def _from_fp8(self, computation: str, name: str, depth: int = 0) -> bool:
    """Whether value `name` is an FP8 value, or one converted (or viewed)
    from one, through fusion parameters and fusions."""
    ins = self.by_name.get(computation, {}).get(name)
    if ins is None or depth > 32:
      return False
    if _is_fp8(ins.shape):
      return True
    if ins.opcode in _VIEWS + ("convert",) and ins.operands:
      return self._from_fp8(computation, ins.operands[0], depth + 1)
    if ins.parameter is not None:
      return any(self._from_fp8(caller, fusion.operands[ins.parameter],
                                depth + 1)
                 for caller, fusion in self.callers.get(computation, ())
                 if ins.parameter < len(fusion.operands))
    called = _CALLS.search(ins.attributes)
    if ins.opcode == "fusion" and called:
      root = self.root(called.group(1))
      return bool(root) and self._from_fp8(called.group(1), root.name,
                                           depth + 1)
    return False


def _is_fp8(shape: str) -> bool:
  return bool(_FP8.match(shape))


def read(hlo_text: str, stored: Iterable[int] = (),
         fp8: Iterable[int] = ()) -> Survival:
  """The status of stored values `stored` and FP8 dots `fp8` (marker
  indices; a decision whose marker is missing is DROPPED) in `hlo_text`,
  the optimized program `Compiled.as_text()` prints."""
  program = _Program(hlo_text)
  stored_marker = contract.attribute("stored_marker")
  fp8_marker = contract.attribute("fp8_marker")
  stored_status = {i: DROPPED for i in stored}
  fp8_status = {i: DROPPED for i in fp8}
  rank = {DROPPED: 0, FUSED_AWAY: 1, UPCAST: 1, EMULATED: 2, KEPT: 3,
          FP8_GEMM: 3}

  def note(table: dict, index: int, status: str) -> None:
    if index in table and rank[status] > rank[table[index]]:
      table[index] = status

  for name, instructions in program.computations.items():
    outputs = (_fusion_outputs(instructions) if name in program.callers
               else None)
    for ins in instructions:
      for index in _marker_values(ins.attributes, stored_marker):
        low = ins.shape.split("[")[0] in _LOW_FLOATS
        materialized = outputs is None or ins.name in outputs
        note(stored_status, index,
             KEPT if low and materialized else FUSED_AWAY if low else DROPPED)
      for index in _marker_values(ins.attributes, fp8_marker):
        note(fp8_status, index,
             FP8_GEMM if program.is_fp8_gemm(name, ins) else
             EMULATED if program.widens_fp8(name, ins) else UPCAST)
  return Survival(stored_status, fp8_status)


def _fusion_outputs(instructions: list[_Instruction]) -> set[str]:
  """The instructions of a fused computation whose values leave it: the
  root and, through tuples and views, what the root is made of."""
  by_name = {ins.name: ins for ins in instructions}
  root = next((ins for ins in instructions if ins.root), None)
  outputs: set[str] = set()
  pending = [root] if root else []
  while pending:
    ins = pending.pop()
    if ins.name in outputs:
      continue
    outputs.add(ins.name)
    if ins.opcode in _VIEWS:
      pending.extend(by_name[o] for o in ins.operands if o in by_name)
  return outputs
