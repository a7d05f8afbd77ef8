"""Structural checks on jaxlib modules, shared by the test files."""

from __future__ import annotations

import collections
from typing import Iterator

from jax.extend.mlir import ir


def walk(op) -> Iterator:
  """Every operation nested in `op` (regions, blocks), in order."""
  for region in op.regions:
    for block in region.blocks:
      for nested in block.operations:
        nested = nested.operation
        yield nested
        yield from walk(nested)


def functions(module: ir.Module):
  """(name, op) of every func.func in the module."""
  for op in module.body.operations:
    op = op.operation
    if op.name == "func.func":
      yield ir.StringAttr(op.attributes["sym_name"]).value, op


def convert_problems(module: ir.Module) -> tuple[list[str], list[str]]:
  """(duplicates, identities): values converted more than once to one type
  within a function (regions included), and converts to a value's own type."""
  duplicates, identities = [], []
  for name, func in functions(module):
    seen: collections.Counter = collections.Counter()
    for op in walk(func):
      if op.name != "stablehlo.convert":
        continue
      source, result = op.operands[0], op.results[0]
      if source.type == result.type:
        identities.append(f"@{name}: convert to its own type: "
                          f"{source.get_name()} : {result.type}")
      seen[(source, str(result.type))] += 1
    for (source, result_type), count in seen.items():
      if count > 1:
        duplicates.append(f"@{name}: {source.get_name()} converted {count} "
                          f"times to {result_type}")
  return duplicates, identities


def duplicate_converts(module: ir.Module) -> list[str]:
  """Every convert problem: duplicates, then converts to their own type."""
  duplicates, identities = convert_problems(module)
  return duplicates + identities
