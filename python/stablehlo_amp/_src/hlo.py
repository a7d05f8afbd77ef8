"""A typed model of XLA's optimized HLO text (`Compiled.as_text()`).

The text is XLA's human-readable print of the program it compiled, not a
stable format, and several readers need it: survival.py (what XLA kept of
the pass's decisions), the benchmarks (dots, kernels, collectives) and the
tests of the executable. They all read it here, so that a change of XLA's
printer is one fix.

    module = Module.parse(compiled.as_text())
    module.entry.root.opcode              # 'tuple'
    module.collective_bytes()             # {('all-gather', 'bf16'): 4096}

Shapes are what the text says: in an SPMD-partitioned program, the shape
of one device's part. The module imports the standard library only:
bench/common.py loads it by path where the package does not import
(bench/gpu.py's fallback on a machine that has only JAX).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Iterable, Mapping

# Bytes per element, XLA's names. Sub-byte types (s4, u4, f4e2m1fn...) are
# left out: their size depends on the layout's packing.
DTYPE_BYTES: Mapping[str, int] = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
    "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e3m4": 1,
    "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1, "f8e8m0fnu": 1,
    "token": 0,
}
LOW_FLOATS = ("bf16", "f16")


def is_fp8(dtype: str | None) -> bool:
  """Whether `dtype` is one of XLA's 8-bit floats (f8e4m3fn, f8e5m2...)."""
  return dtype is not None and dtype.startswith("f8")


# The collectives whose traffic is counted, and what each moves per device:
# an all-gather its result (what it assembles), the others their operands.
COLLECTIVE_KINDS = ("all-gather", "all-reduce", "reduce-scatter",
                    "all-to-all", "collective-permute")
# Ops that move or relabel a value without computing: a collective's JAX
# op is found through them (`Computation.named_source`), the collectives
# themselves included.
_RELABELLING = ("bitcast", "copy", "reshape", "transpose", "get-tuple-element",
                "copy-start", "copy-done", "async-start",
                *COLLECTIVE_KINDS, *(f"{kind}-start" for kind in
                                     COLLECTIVE_KINDS))
# Instructions of ENTRY that launch no work of their own.
_NOT_KERNELS = ("parameter", "constant", "bitcast", "get-tuple-element",
                "tuple", "opt-barrier")
# Attributes that name computations an instruction runs.
_CALLING_ATTRIBUTES = ("calls", "to_apply", "body", "condition",
                       "true_computation", "false_computation",
                       "branch_computations", "called_computations")

_HEADER = re.compile(
    r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(%{]+)\s*(?:\(.*\)\s*->.*)?\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?P<root>ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*(?P<opcode>[a-z][a-z0-9\-]*)\(")
_DTYPE = re.compile(r"[a-z][a-z0-9]*(?=\[)")
_COMMENT = re.compile(r"/\*.*?\*/")
_QUOTED = r'"((?:[^"\\]|\\.)*)"'
# What bracket matching looks at: a quoted string (skipped whole), a
# bracket or a comma.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[()\[\]{},]')
_KEY_VALUE = re.compile(r"([\w.\-]+)=" + _QUOTED)
_OP_NAME = re.compile(r"\bop_name=" + _QUOTED)
_STACK_FRAME = re.compile(r"\bstack_frame_id=(\d+)")
_BACKEND_KIND = re.compile(r'"kind"\s*:\s*"([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Shape:
  """An array shape (`f32[8,128]{1,0}`) or a tuple of shapes, as printed:
  `text` is the printed form, layout and `/*index=N*/` comments included."""
  text: str
  dtype: str | None = None             # None for a tuple
  dims: tuple[int, ...] = ()           # a bounded dynamic dim: its bound
  elements: tuple[Shape, ...] = ()     # a tuple's element shapes

  @classmethod
  def parse(cls, text: str) -> Shape:
    shape, end = _parse_shape(text, 0)
    if text[end:].strip():
      raise ValueError(f"unexpected {text[end:]!r} after the HLO shape "
                       f"{text[:end]!r}")
    return shape

  @property
  def is_tuple(self) -> bool:
    return self.dtype is None

  def arrays(self) -> tuple[Shape, ...]:
    """The array shapes it is made of, in order (itself for an array)."""
    if not self.is_tuple:
      return (self,)
    return tuple(a for element in self.elements for a in element.arrays())

  @property
  def element_type(self) -> str | None:
    """The element type of its first array (None for an empty tuple):
    what a reader of `f32[8]` or `(bf16[2], f32[3])` means by its type."""
    arrays = self.arrays()
    return arrays[0].dtype if arrays else None

  @property
  def element_types(self) -> tuple[str, ...]:
    return tuple(a.dtype for a in self.arrays())

  @property
  def nbytes(self) -> int:
    """Bytes of its arrays, unpadded."""
    total = 0
    for array in self.arrays():
      if array.dtype not in DTYPE_BYTES:
        raise ValueError(f"no byte size for element type {array.dtype!r} "
                         f"in {self.text!r}; known: {sorted(DTYPE_BYTES)}")
      total += DTYPE_BYTES[array.dtype] * math.prod(array.dims)
    return total


def _skip(text: str, pos: int) -> int:
  """Past spaces and `/*...*/` comments."""
  while True:
    while pos < len(text) and text[pos] == " ":
      pos += 1
    if not text.startswith("/*", pos):
      return pos
    end = text.find("*/", pos)
    if end < 0:
      raise ValueError(f"unclosed comment in {text!r}")
    pos = end + 2


def _parse_shape(text: str, pos: int) -> tuple[Shape, int]:
  """The shape starting at `pos` (after spaces and comments) and where it
  ends."""
  pos = _skip(text, pos)
  start = pos
  if text.startswith("(", pos):
    elements = []
    pos = _skip(text, pos + 1)
    while not text.startswith(")", pos):
      element, pos = _parse_shape(text, pos)
      elements.append(element)
      pos = _skip(text, pos)
      if text.startswith(",", pos):
        pos += 1
      elif not text.startswith(")", pos):
        raise ValueError(f"expected ',' or ')' at {pos} in the HLO shape "
                         f"{text!r}")
    return Shape(text[start:pos + 1], None, (), tuple(elements)), pos + 1
  dtype = _DTYPE.match(text, pos)
  if not dtype:
    raise ValueError(f"no HLO shape at {pos} in {text!r}")
  close = text.find("]", dtype.end())
  if close < 0:
    raise ValueError(f"unclosed dimensions in the HLO shape {text!r}")
  dims = tuple(_dimension(d, text)
               for d in text[dtype.end() + 1:close].split(",") if d.strip())
  pos = close + 1
  if text.startswith("{", pos):
    pos = _closing(text, pos) + 1
  return Shape(text[start:pos], dtype.group(), dims), pos


def _dimension(text: str, shape: str) -> int:
  digits = text.strip().removeprefix("<=")
  if not digits.isdigit():
    raise ValueError(f"dimension {text!r} of the HLO shape {shape!r} is not "
                     "a size or a bound (<=N)")
  return int(digits)


def _closing(text: str, pos: int) -> int:
  """The index of the bracket closing the one at `pos`, past quoted
  strings and nested brackets of every kind."""
  depth = 0
  for token in _TOKEN.finditer(text, pos):
    char = token.group()[0]
    if char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
      if depth == 0:
        return token.start()
  raise ValueError(f"unbalanced {text[pos]!r} at {pos} in {text!r}")


def _split_top(text: str) -> list[str]:
  """`text` split at the commas outside brackets and quoted strings."""
  parts, start, depth = [], 0, 0
  for token in _TOKEN.finditer(text):
    char = token.group()[0]
    if char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
    elif char == "," and depth == 0:
      parts.append(text[start:token.start()])
      start = token.end()
  parts.append(text[start:])
  return [p.strip() for p in parts if p.strip()]


def _names(value: str) -> tuple[str, ...]:
  """`%a` or `{%a, %b}` -> ('a', 'b')."""
  value = value.strip()
  if value.startswith("{"):
    value = value[1:-1]
  return tuple(n.strip().lstrip("%") for n in value.split(",") if n.strip())


@dataclasses.dataclass(frozen=True, eq=False)
class Instruction:
  """One instruction: `[ROOT] %name = shape opcode(operands), attributes`."""
  name: str
  shape: Shape
  opcode: str
  operands: tuple[str, ...]                  # names, without the %
  operand_shapes: tuple[Shape | None, ...]   # where printed inline
  attributes: Mapping[str, str]              # key -> value text as printed
  root: bool
  parameter_number: int | None               # N of `parameter(N)`

  @classmethod
  def parse(cls, line: str) -> Instruction:
    head = _INSTRUCTION.match(line)
    if not head:
      raise ValueError(f"not an HLO instruction: {line!r}")
    shape, pos = _parse_shape(line, head.end())
    opcode = _OPCODE.match(line, pos)
    if not opcode:
      raise ValueError(f"no opcode after the shape in {line!r}")
    close = _closing(line, opcode.end() - 1)
    inside = _COMMENT.sub("", line[opcode.end():close])
    names, shapes, number = [], [], None
    if opcode["opcode"] == "parameter":
      number = int(inside)
    elif opcode["opcode"] != "constant":    # a constant's operand is a literal
      for operand in _split_top(inside):
        typed, _, name = operand.rpartition(" ")
        names.append(name.lstrip("%"))
        shapes.append(Shape.parse(typed) if typed.strip() else None)
    attributes = {}
    for item in _split_top(line[close + 1:]):
      key, equals, value = item.partition("=")
      if not equals:
        raise ValueError(f"attribute {item!r} is not key=value in {line!r}")
      attributes[key.strip()] = value.strip()
    return cls(head["name"].lstrip("%"), shape, opcode["opcode"],
               tuple(names), tuple(shapes), attributes, bool(head["root"]),
               number)

  @functools.cached_property
  def frontend_attributes(self) -> Mapping[str, str]:
    return dict(_KEY_VALUE.findall(self.attributes.get(
        "frontend_attributes", "")))

  @property
  def calls(self) -> tuple[str, ...]:
    """What `calls=` names: a fusion's body, an async op's wrapped
    computation."""
    return _names(self.attributes.get("calls", ""))

  @property
  def called_computations(self) -> tuple[str, ...]:
    """Every computation it runs: calls=, to_apply=, a while's body and
    condition, a conditional's branches, a custom call's computations."""
    return tuple(name for key in _CALLING_ATTRIBUTES
                 for name in _names(self.attributes.get(key, "")))

  @property
  def custom_call_target(self) -> str | None:
    target = self.attributes.get("custom_call_target")
    return target.strip('"') if target is not None else None

  @property
  def fusion_kind(self) -> str | None:
    """`kLoop`, `kInput`, `kOutput`, `kCustom`; None if no fusion."""
    return self.attributes.get("kind")

  @property
  def backend_kind(self) -> str:
    """The kind its backend config names (`__triton_gemm`, `__ynn_fusion`,
    ...); empty if none."""
    kind = _BACKEND_KIND.search(self.attributes.get("backend_config", ""))
    return kind.group(1) if kind else ""

  @property
  def op_name(self) -> str:
    """The JAX op it comes from (metadata op_name), as printed; empty if
    none."""
    name = _OP_NAME.search(self.attributes.get("metadata", ""))
    return name.group(1) if name else ""

  @property
  def stack_frame_id(self) -> int | None:
    """Its source location: an index into the module's StackFrames
    table."""
    frame = _STACK_FRAME.search(self.attributes.get("metadata", ""))
    return int(frame.group(1)) if frame else None

  @property
  def collective_kind(self) -> str | None:
    """The collective it starts or is (`all-gather` for `all-gather` and
    `all-gather-start`); None for anything else, `-done` halves included."""
    kind = self.opcode.removesuffix("-start")
    return kind if kind in COLLECTIVE_KINDS else None

  @property
  def result(self) -> Shape:
    """The value it produces: for an async `-start`, whose shape is a tuple
    (operands, result, context...), the result; else its shape.
    `all-reduce-start` is shaped as its result."""
    if (self.opcode.endswith("-start") and self.opcode != "all-reduce-start"
        and self.shape.is_tuple and len(self.shape.elements) >= 2):
      return self.shape.elements[1]
    return self.shape


@dataclasses.dataclass(frozen=True, eq=False)
class Computation:
  """A computation: ENTRY, a fusion body, a loop body, a reducer..."""
  name: str
  entry: bool
  instructions: tuple[Instruction, ...]

  @functools.cached_property
  def by_name(self) -> Mapping[str, Instruction]:
    return {ins.name: ins for ins in self.instructions}

  def get(self, name: str) -> Instruction | None:
    return self.by_name.get(name)

  @functools.cached_property
  def root(self) -> Instruction | None:
    return next((ins for ins in self.instructions if ins.root), None)

  def operand_shapes(self, ins: Instruction) -> tuple[Shape | None, ...]:
    """The shape of each operand of `ins`: printed inline, or its
    instruction's here (None if neither)."""
    return tuple(
        shape if shape is not None else
        (self.by_name[name].shape if name in self.by_name else None)
        for name, shape in zip(ins.operands, ins.operand_shapes))

  def named_source(self, ins: Instruction) -> Instruction:
    """The instruction whose JAX op `ins` stands for: itself if it has an
    op_name, else, through the ops that only move or relabel a value
    (bitcasts, copies, reshapes, transposes, tuple elements, the other half
    of an async pair), the first one that has (XLA names no async
    collective and few of the bitcasts it adds). `ins` if none has."""
    current, seen = ins, set()
    while not current.op_name and current.name not in seen:
      seen.add(current.name)
      if current.opcode not in _RELABELLING or not current.operands:
        break
      operand = self.get(current.operands[0])
      if operand is None:
        break
      current = operand
    return current if current.op_name else ins

  @functools.cached_property
  def users(self) -> Mapping[str, tuple[Instruction, ...]]:
    """Instruction name -> the instructions here that take it as an
    operand."""
    users: dict[str, list[Instruction]] = {}
    for ins in self.instructions:
      for name in dict.fromkeys(ins.operands):
        users.setdefault(name, []).append(ins)
    return {name: tuple(found) for name, found in users.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class Collective:
  """One collective the program runs: a plain op or an async `-start` (its
  `-done` is not another one)."""
  kind: str                     # one of COLLECTIVE_KINDS
  instruction: Instruction
  computation: Computation
  moved: tuple[Shape, ...]      # the arrays it moves, per device

  @property
  def asynchronous(self) -> bool:
    return self.instruction.opcode.endswith("-start")

  @property
  def op_name(self) -> str:
    """The JAX op whose value it moves: its own op_name, or its operand's
    (`Computation.named_source`); empty if neither has one."""
    return (self.instruction.op_name or self.computation.named_source(
        self.instruction).op_name)

  @property
  def in_backward_pass(self) -> bool:
    """Whether it moves a value the backward pass computes (JAX names those
    ops `transpose(...)`): a reduction of weight gradients, or under tensor
    parallelism of activation gradients."""
    return "transpose(" in self.op_name

  @property
  def dtypes(self) -> tuple[str, ...]:
    return tuple(sorted({a.dtype for a in self.moved}))

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for a in self.moved)


@dataclasses.dataclass(frozen=True, eq=False)
class Module:
  """An HLO module: its computations, ENTRY among them."""
  name: str
  computations: Mapping[str, Computation]   # in printed order

  @classmethod
  def parse(cls, text: str) -> Module:
    """The module `text` prints; ValueError for a line inside a computation
    that is no instruction."""
    name, computations = "", {}
    current: tuple[str, bool, list[Instruction]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
      if current is None:
        if line.startswith("HloModule "):
          name = line.split()[1].rstrip(",")
        header = _HEADER.match(line)
        if header and not line.startswith(("HloModule", " ")):
          current = (header["name"], bool(header["entry"]), [])
      elif line.startswith("}"):
        computations[current[0]] = Computation(current[0], current[1],
                                               tuple(current[2]))
        current = None
      elif line.strip():
        try:
          current[2].append(Instruction.parse(line))
        except ValueError as error:
          raise ValueError(f"HLO line {number}: {error}") from None
    if current is not None:
      raise ValueError(f"HLO computation %{current[0]} is not closed")
    return cls(name, computations)

  @property
  def entry(self) -> Computation:
    found = [c for c in self.computations.values() if c.entry]
    if len(found) != 1:
      raise ValueError(f"expected one ENTRY computation, found {len(found)}")
    return found[0]

  @functools.cached_property
  def fusion_callers(self) -> Mapping[str,
                                      tuple[tuple[Computation, Instruction],
                                            ...]]:
    """Fused computation -> the (computation, fusion instruction) pairs that
    call it. A computation not here is no fusion body."""
    callers: dict[str, list[tuple[Computation, Instruction]]] = {}
    for computation in self.computations.values():
      for ins in computation.instructions:
        if ins.opcode == "fusion" and ins.calls:
          callers.setdefault(ins.calls[0], []).append((computation, ins))
    return {name: tuple(found) for name, found in callers.items()}

  def fusion_kind(self, computation: str) -> str | None:
    """The backend kind (`__triton_gemm`, ...) of the fusion whose body is
    `computation`: empty for a plain fusion, None for no fusion body."""
    callers = self.fusion_callers.get(computation)
    return callers[0][1].backend_kind if callers else None

  def reachable(self, roots: Iterable[str] | None = None
                ) -> tuple[Computation, ...]:
    """The computations `roots` (ENTRY's name by default) run, themselves
    included, through every call: fusions, calls, loops, conditionals,
    reducers, async wrappers."""
    pending = list(roots) if roots is not None else [self.entry.name]
    seen: dict[str, Computation] = {}
    while pending:
      name = pending.pop()
      if name in seen or name not in self.computations:
        continue
      seen[name] = self.computations[name]
      pending.extend(callee for ins in seen[name].instructions
                     for callee in ins.called_computations)
    return tuple(c for name, c in self.computations.items() if name in seen)

  def collectives(self) -> tuple[Collective, ...]:
    """Every collective in the computations ENTRY runs (each counted once
    where it is: in a loop body it runs once per iteration), including
    those fused or wrapped by a generic `async-start` (counted inside its
    wrapped computation)."""
    found = []
    for computation in self.reachable():
      for ins in computation.instructions:
        kind = ins.collective_kind
        if kind is None:
          continue
        if kind == "all-gather":
          moved = ins.result.arrays()
        else:
          shapes = computation.operand_shapes(ins)
          if None in shapes:
            raise ValueError(f"%{ins.name}: an operand's shape is unknown")
          moved = tuple(a for shape in shapes for a in shape.arrays())
        found.append(Collective(kind, ins, computation, moved))
    return tuple(found)

  def collective_bytes(self) -> dict[tuple[str, str], int]:
    """Bytes each device moves, by (collective kind, element type)."""
    total: dict[tuple[str, str], int] = {}
    for collective in self.collectives():
      for array in collective.moved:
        key = (collective.kind, array.dtype)
        total[key] = total.get(key, 0) + array.nbytes
    return total

  def kernel_kinds(self) -> dict[str, int]:
    """The launches of `kernels()` by what they run: `gemm` (a GEMM fusion
    or call: a dot or scaled-dot inside, or a cuBLAS call), `fp8_quantize`
    (a fusion that converts to an 8-bit float or takes an amax: a max of
    absolute values) and `other`."""
    kinds = {"gemm": 0, "fp8_quantize": 0, "other": 0}
    for kernel in self.device_kernels():
      kinds[kernel.kind] += kernel.launches
    return kinds

  def kernels(self) -> int:
    """Kernel launches of one run of ENTRY (fusions, multi-output fusions,
    GEMM calls, copies...): a proxy for launches and scheduling freedom
    where no device times the step. A loop's kernels count once per trip
    where XLA knows the trip count. Collectives are not counted here
    (`collectives()`)."""
    return sum(kernel.launches for kernel in self.device_kernels())

  def device_kernels(self) -> tuple[Kernel, ...]:
    """Every kernel ENTRY launches, in program order, with the matrix flops
    it computes and the bytes it reads and writes: through calls, loop
    bodies (times their known trip count) and every branch of a
    conditional."""
    found: list[Kernel] = []
    _collect_kernels(self, self.entry, 1, found, 0)
    return tuple(found)


# -- kernels and their cost --------------------------------------------------

# What runs no kernel of its own besides _NOT_KERNELS: the halves of async
# pairs that wait, and ids XLA folds into the kernels that read them.
_NOT_LAUNCHED = ("after-all", "partition-id", "replica-id", "add-dependency",
                 "domain")
# Instructions that run computations rather than a kernel of their own.
_CONTROL_FLOW = ("while", "conditional", "call", "async-start",
                 "async-update")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_GEMM_TARGET_WORDS = ("gemm", "matmul", "cublas")
_CONTRACTING = re.compile(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]')
_SLICING = ("slice", "dynamic-slice")
_PASS_THROUGH = ("bitcast", "reshape")


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
  """One kernel the step launches: what it computes and what it moves."""
  instruction: Instruction
  kind: str                    # gemm, fp8_quantize or other
  flops: Mapping[str, int]     # matrix flops by operand class (f8, bf16, f32, f64)
  bytes_read: int
  bytes_written: int
  launches: int = 1            # per run of ENTRY: a loop body's, per trip

  @property
  def hbm_bytes(self) -> int:
    return self.bytes_read + self.bytes_written


def _nbytes(shape: Shape) -> int:
  """Bytes of `shape`, 0 for element types of no fixed size (sub-byte)."""
  try:
    return shape.nbytes
  except ValueError:
    return 0


def _add_flops(total: dict[str, int], more: Mapping[str, int]) -> None:
  for key, value in more.items():
    total[key] = total.get(key, 0) + value


def flops_class(dtype: str | None) -> str:
  """The peak a matrix operation on `dtype` operands runs at: f8 (8-bit
  floats and integers), bf16 (bf16 and f16), f32 (as TF32) or f64."""
  if dtype is None:
    return "f32"
  if is_fp8(dtype) or dtype in ("s8", "u8"):
    return "f8"
  if dtype in LOW_FLOATS:
    return "bf16"
  if dtype in ("f64", "c128"):
    return "f64"
  return "f32"


def _widest_class(dtypes: Iterable[str | None]) -> str:
  order = ("f8", "bf16", "f32", "f64")
  return max((flops_class(d) for d in dtypes), key=order.index,
             default="f32")


def _dims(text: str) -> tuple[int, ...]:
  return tuple(int(d) for d in re.findall(r"\d+", text))


def _per_output(ins: Instruction, kernel: Shape) -> int:
  """A convolution's multiply-adds per output element: its kernel's
  elements per output feature (`dim_labels`' kernel part names it `o`)."""
  labels = ins.attributes.get("dim_labels", "")
  kernel_labels = labels.split("_")[1].split("->")[0] if "_" in labels else ""
  per_output = math.prod(kernel.dims)
  if "o" in kernel_labels and len(kernel_labels) == len(kernel.dims):
    per_output //= max(kernel.dims[kernel_labels.index("o")], 1)
  return per_output


def _instruction_flops(computation: Computation, ins: Instruction
                       ) -> dict[str, int]:
  """2 * M * N * K of a dot (K the product of the lhs contracting
  dimensions) or 2 * outputs * (kernel elements per output feature) of a
  convolution, by operand class; {} for anything else."""
  if ins.opcode not in ("dot", "scaled-dot", "convolution"):
    return {}
  shapes = computation.operand_shapes(ins)
  if not shapes or shapes[0] is None or ins.shape.is_tuple:
    return {}
  outputs = math.prod(ins.shape.dims)
  cls = _widest_class(s.dtype for s in shapes[:2] if s is not None)
  if ins.opcode == "convolution":
    if len(shapes) < 2 or shapes[1] is None:
      return {}
    return {cls: 2 * outputs * _per_output(ins, shapes[1])}
  contracting = _dims(ins.attributes.get("lhs_contracting_dims", ""))
  k = math.prod(shapes[0].dims[d] for d in contracting
                if d < len(shapes[0].dims))
  return {cls: 2 * outputs * k}


def _custom_call_flops(computation: Computation, ins: Instruction
                       ) -> dict[str, int]:
  """A cuBLAS GEMM call's flops, from its result and the lhs contracting
  dimensions in its backend config; a cuDNN convolution's as a
  convolution's."""
  target = (ins.custom_call_target or "").lower()
  shapes = computation.operand_shapes(ins)
  if not shapes or shapes[0] is None:
    return {}
  result = ins.shape.arrays()[0] if ins.shape.arrays() else None
  if result is None:
    return {}
  cls = _widest_class(s.dtype for s in shapes[:2] if s is not None)
  if any(word in target for word in _GEMM_TARGET_WORDS):
    found = _CONTRACTING.search(ins.attributes.get("backend_config", ""))
    contracting = _dims(found.group(1)) if found else (len(shapes[0].dims) - 1,)
    k = math.prod(shapes[0].dims[d] for d in contracting
                  if d < len(shapes[0].dims))
    return {cls: 2 * math.prod(result.dims) * k}
  if "conv" in target and len(shapes) > 1 and shapes[1] is not None:
    return {cls: 2 * math.prod(result.dims) * _per_output(ins, shapes[1])}
  return {}


def _fused_reads(body: Computation) -> dict[int, int]:
  """Parameter number -> bytes the fused body reads of it, for parameters
  it reads only through slices (through bitcasts and reshapes): the
  slices' bytes. Others are read whole."""
  reads: dict[int, int] = {}
  for ins in body.instructions:
    if ins.opcode != "parameter" or ins.parameter_number is None:
      continue
    total, pending, whole = 0, [ins], False
    while pending and not whole:
      current = pending.pop()
      for user in body.users.get(current.name, ()):
        if user.opcode in _SLICING and user.operands[0] == current.name:
          total += _nbytes(user.shape)
        elif user.opcode in _PASS_THROUGH:
          pending.append(user)
        else:
          whole = True
          break
    if not whole and body.users.get(ins.name):
      reads[ins.parameter_number] = total
  return reads


def _in_place_updates(body: Computation) -> tuple[set[int], int | None]:
  """For a fused body whose results are all dynamic-update-slices of its
  parameters (XLA writes them in place): those parameters' numbers, and
  the bytes the updates write; (set(), None) otherwise."""
  root = body.root
  if root is None:
    return set(), None
  outputs = ([body.get(name) for name in root.operands]
             if root.opcode == "tuple" else [root])
  params, written = set(), 0
  for out in outputs:
    if out is None or out.opcode != "dynamic-update-slice":
      return set(), None
    buffer = body.get(out.operands[0])
    while buffer is not None and buffer.opcode in _PASS_THROUGH:
      buffer = body.get(buffer.operands[0])
    update = body.get(out.operands[1])
    if buffer is None or buffer.opcode != "parameter" or update is None:
      return set(), None
    params.add(buffer.parameter_number)
    written += _nbytes(update.shape)
  return params, written


def _collect_kernels(module: Module, computation: Computation, launches: int,
                     found: list[Kernel], depth: int) -> None:
  """Appends to `found` the kernels `computation` launches, each
  `launches` times: through calls, loop bodies (times their known trip
  count) and every branch of a conditional (`Module.device_kernels`)."""
  for ins in computation.instructions:
    if ins.opcode in _NOT_KERNELS or ins.collective_kind is not None or \
       ins.opcode.endswith("-done") or ins.opcode in _NOT_LAUNCHED:
      continue
    if ins.opcode in _CONTROL_FLOW:
      if depth >= 16:
        continue
      times = launches
      if ins.opcode == "while":
        trips = _TRIP_COUNT.search(ins.attributes.get("backend_config", ""))
        times *= int(trips.group(1)) if trips else 1
      for name in ins.called_computations:
        if name in module.computations:
          _collect_kernels(module, module.computations[name], times,
                           found, depth + 1)
      continue
    found.append(_kernel(module, computation, ins, launches))


def _kernel(module: Module, computation: Computation, ins: Instruction,
            launches: int) -> Kernel:
  """The kernel `ins` launches: its matrix flops, kind and traffic."""
  opcodes, dtypes = _contents(module, ins)
  target = (ins.custom_call_target or "").lower()
  flops: dict[str, int] = {}
  if ins.opcode == "custom-call":
    _add_flops(flops, _custom_call_flops(computation, ins))
  else:
    for name in ins.calls if ins.opcode == "fusion" else ():
      _fused_flops(module, name, flops, 0)
    _add_flops(flops, _instruction_flops(computation, ins))
  if flops or any(word in target for word in _GEMM_TARGET_WORDS):
    kind = "gemm"
  elif any(is_fp8(d) for d in dtypes) or {"reduce", "abs"} <= opcodes:
    kind = "fp8_quantize"
  else:
    kind = "other"
  read, written = _traffic(module, computation, ins)
  return Kernel(ins, kind, flops, read, written, launches)


def _contents(module: Module, ins: Instruction, depth: int = 0
              ) -> tuple[set[str], set[str]]:
  """The opcodes `ins` runs (itself and, through the computations it
  calls, theirs) and the dtypes its converts write."""
  opcodes = {ins.opcode}
  dtypes = ({ins.shape.dtype} if ins.opcode == "convert" and
            not ins.shape.is_tuple else set())
  if depth < 8:
    for name in ins.calls:
      body = module.computations.get(name)
      for inner in body.instructions if body else ():
        more, written = _contents(module, inner, depth + 1)
        opcodes |= more
        dtypes |= written
  return opcodes, dtypes


def _fused_flops(module: Module, name: str, flops: dict[str, int],
                 depth: int) -> None:
  """Adds to `flops` the matrix flops of the fused computation `name`
  and of the fusions inside it."""
  body = module.computations.get(name)
  if body is None or depth > 8:
    return
  for inner in body.instructions:
    _add_flops(flops, _instruction_flops(body, inner))
    for called in inner.calls if inner.opcode == "fusion" else ():
      _fused_flops(module, called, flops, depth + 1)


def _traffic(module: Module, computation: Computation, ins: Instruction
             ) -> tuple[int, int]:
  """Bytes `ins` reads and writes in HBM: each distinct operand once
  (only the slices of one its fused body reads only through slices;
  nothing of the buffer an in-place dynamic-update-slice writes into),
  and its results (a GEMM call's workspace excluded; only the update of
  an in-place dynamic-update-slice)."""
  shapes = dict(zip(ins.operands, computation.operand_shapes(ins)))
  body = (module.computations.get(ins.calls[0])
          if ins.opcode == "fusion" and ins.calls else None)
  read_of = _fused_reads(body) if body is not None else {}
  in_place, update_bytes = (_in_place_updates(body) if body is not None
                            else (set(), None))
  read = 0
  for number, name in enumerate(ins.operands):
    if name in ins.operands[:number]:
      continue
    shape = shapes.get(name)
    if shape is None:
      continue
    if number in in_place:
      continue
    read += min(read_of.get(number, shape.nbytes), shape.nbytes)
  results = ins.shape.arrays()
  if (ins.opcode == "custom-call" and ins.shape.is_tuple and
      len(results) > 1 and results[-1].dtype in ("s8", "u8")):
    results = results[:-1]    # the GEMM's workspace
  written = (update_bytes if update_bytes is not None else
             sum(_nbytes(a) for a in results))
  return read, written


@dataclasses.dataclass(frozen=True)
class Roofline:
  """A target's figures for pricing kernels: peak matrix flops by operand
  class, achieved HBM bandwidth (peak times efficiency), the interconnect
  bandwidth per device and direction, and a launch overhead per kernel."""
  device: str
  matrix_flops: Mapping[str, float]   # FLOP/s for f8, bf16, f32 (TF32), f64
  hbm_bytes_per_second: float
  interconnect_bytes_per_second: float
  launch_seconds: float

  def kernel_seconds(self, kernel: Kernel) -> float:
    """max(flops / peak, bytes / bandwidth) + launch, per launch."""
    compute = sum(count / self.matrix_flops[cls]
                  for cls, count in kernel.flops.items())
    memory = kernel.hbm_bytes / self.hbm_bytes_per_second
    return max(compute, memory) + self.launch_seconds


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A step priced kernel by kernel on a roofline: an estimate, not a
  measurement. Collectives are priced at the interconnect's bandwidth and
  added, as if nothing overlapped them."""
  device: str
  kernels: int
  compute_seconds: float
  collective_seconds: float
  hbm_bytes: int
  collective_bytes: int
  flops: Mapping[str, int]

  @property
  def seconds(self) -> float:
    return self.compute_seconds + self.collective_seconds


def estimate(module: Module, roofline: Roofline) -> Estimate:
  """The step time of `module` on `roofline`'s device, priced from its
  optimized HLO (see `Roofline.kernel_seconds`)."""
  kernels = module.device_kernels()
  flops: dict[str, int] = {}
  for kernel in kernels:
    _add_flops(flops, {k: v * kernel.launches for k, v in kernel.flops.items()})
  moved = sum(c.nbytes for c in module.collectives())
  collective_count = len(module.collectives())
  return Estimate(
      roofline.device,
      kernels=sum(k.launches for k in kernels),
      compute_seconds=sum(roofline.kernel_seconds(k) * k.launches
                          for k in kernels),
      collective_seconds=(moved / roofline.interconnect_bytes_per_second +
                          collective_count * roofline.launch_seconds),
      hbm_bytes=sum(k.hbm_bytes * k.launches for k in kernels),
      collective_bytes=moved, flops=flops)
