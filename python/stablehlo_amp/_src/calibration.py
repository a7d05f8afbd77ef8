"""Accuracy-budgeted rewriting: keep the fewest op groups in f32 that bring
every output within a tolerance of f32 on calibration inputs.

A group is one matrix multiply the policy would lower and the ops painted low
with it (the report's `group`; `amp-insert-converts{keep-groups=...}` keeps
groups in f32). Calibration runs the f32 program and the mixed one on the
inputs; when some output is off by more than the tolerance (relative to its
f32 norm), it measures each group's contribution (the error with only that
group kept in f32), then keeps groups in order of contribution, finding the
shortest prefix that meets the tolerance by bisection. The cost is one
compile per group plus a few: `Calibration.compiles` says how many.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax.extend.mlir import ir

from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src import program as prog
from stablehlo_amp._src.policy import Policy


@dataclasses.dataclass(frozen=True)
class GroupEffect:
  """One group: its matrix multiply's location and how much keeping it in
  f32 alone lowers the largest relative output error."""
  group: int
  loc: str
  error_if_kept: float
  contribution: float


@dataclasses.dataclass(frozen=True)
class Calibration:
  """What calibration decided and what it cost."""
  tolerance: float
  error_f32_free: float          # largest relative error, no group kept
  error: float                   # with `kept` groups in f32
  kept: tuple[int, ...]          # STORAGE_GROUP: nothing stored low
  effects: tuple[GroupEffect, ...]
  compiles: int                  # programs compiled (the f32 one included)
  seconds: float
  seconds_per_compile: float     # the f32 program's compile and run

  @property
  def cost_in_compiles(self) -> float:
    """Calibration time as a multiple of one compile."""
    return self.seconds / max(self.seconds_per_compile, 1e-9)

  def __str__(self) -> str:
    lines = [f"calibration: tolerance {self.tolerance:g}, error without f32 "
             f"groups {self.error_f32_free:.3g}, with {len(self.kept)} of "
             f"{len(self.effects)} groups kept in f32 {self.error:.3g}; "
             f"{self.compiles} compiles, {self.seconds:.1f} s "
             f"({self.cost_in_compiles:.1f}x one compile)"]
    for effect in sorted(self.effects, key=lambda e: -e.contribution):
      mark = "kept f32" if effect.group in self.kept else "low"
      name = ("storage" if effect.group == STORAGE_GROUP else
              f"group {effect.group}")
      lines.append(f"  {name} ({mark}): error if kept "
                   f"{effect.error_if_kept:.3g}, contribution "
                   f"{effect.contribution:.3g}  {effect.loc}")
    return "\n".join(lines)


_FRAME = re.compile(r'"([^"(]+)"\("([^"]+)":(\d+):(\d+)')


def short_location(loc: str) -> str:
  """`f at model.py:12:7` for a location's innermost frame in the user's
  code (JAX's locations nest call sites), else the location as it is."""
  for function, file, line, column in _FRAME.findall(loc):
    if "/stablehlo_amp/" not in file and "/jax/" not in file:
      return f"{function} at {file}:{line}:{column}"
  match = re.match(r'loc\("([^"]+)":(\d+):(\d+)\)', loc)
  return f"{match[1]}:{match[2]}:{match[3]}" if match else loc


# The pseudo-group of the storage decision (group ids are >= 0).
STORAGE_GROUP = -1
# The reasons of the matrix multiplies that open calibration groups.
_GROUP_ROOT_REASONS = ("matrix_multiply", "matrix_multiply_compute")


def load_inputs(path: str) -> list[np.ndarray]:
  """Calibration inputs from an .npz: arrays arg0, arg1, ... in argument
  order (or, failing that, the file's order)."""
  with np.load(path) as data:
    names = list(data.files)
    numbered = sorted((n for n in names if n.startswith("arg") and
                       n[3:].isdigit()), key=lambda n: int(n[3:]))
    order = numbered if len(numbered) == len(names) else names
    if not order:
      raise ValueError("the file holds no arrays")
    return [np.asarray(data[name]) for name in order]


def _relative_error(got: Sequence[Any], want: Sequence[Any]) -> float:
  """The largest error over outputs, relative to each f32 output's norm;
  integer outputs must match exactly (else inf)."""
  worst = 0.0
  for g, w in zip(got, want):
    g, w = np.asarray(g), np.asarray(w)
    if not np.issubdtype(w.dtype, np.floating):
      if not np.array_equal(g, w):
        return float("inf")
      continue
    g, w = g.astype(np.float64), w.astype(np.float64)
    if not np.all(np.isfinite(g)):
      return float("inf")
    norm = np.linalg.norm(w)
    worst = max(worst, float(np.linalg.norm(g - w) / (norm if norm else 1.0)))
  return worst


def _runner(module: ir.Module):
  """A jitted callable running `module` (its public `main`) on arrays."""
  inputs, results = prog.main_signature(module)
  in_avals = [prog._aval(t) for t in inputs]
  out_avals = [prog._aval(t) for t in results]

  def placeholder(*args):
    del args
    return tuple(jnp.zeros(a.shape, a.dtype) for a in out_avals)

  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals]
  exported = jax_export.export(jax.jit(placeholder))(*specs)
  exported = jax_compat.replace_exported(
      exported, module, in_avals=in_avals, out_avals=out_avals,
      kept_var_idx=range(len(in_avals)), extra_in=0, extra_out=0)

  def call(*args):
    # Parameters may take another dtype in the rewritten module.
    return exported.call(*[jnp.asarray(x).astype(a.dtype)
                           for x, a in zip(args, in_avals)])
  return jax.jit(call)


def calibrate(module: ir.Module, policy: Policy, options: pl.RewriteOptions,
              inputs: Sequence[Any], *, tolerance: float,
              context: ir.Context, source_name: str = "<module>"
              ) -> tuple[pl.RewriteResult, Calibration]:
  """Rewrites `module` keeping the fewest groups in f32 that bring every
  output within `tolerance` of f32 on `inputs` (see the module doc)."""
  if not tolerance > 0:
    raise ValueError(f"tolerance must be positive, got {tolerance}")
  start = time.perf_counter()
  compiles = 0

  def run(m: ir.Module) -> list:
    nonlocal compiles
    compiles += 1
    return [np.asarray(x) for x in _runner(m)(*inputs)]

  reference = run(module)
  per_compile = time.perf_counter() - start

  def rewrite(groups: Sequence[int]) -> pl.RewriteResult:
    # Group -1 stands for the storage decision: kept, nothing is stored low.
    return pl.rewrite_module(module, policy, options.replace(
        keep_groups=tuple(sorted(g for g in groups if g >= 0)),
        storage="f32" if STORAGE_GROUP in groups else options.storage),
        context=context, source_name=source_name)

  def error_of(groups: Sequence[int]) -> tuple[pl.RewriteResult, float]:
    result = rewrite(groups)
    return result, _relative_error(run(result.module), reference)

  base, base_error = error_of(())
  report = base.report
  groups = {d.group: short_location(d.loc) for d in report.decisions
            if d.group is not None and d.precision == "low"
            and d.reason_id in _GROUP_ROOT_REASONS}
  if options.storage != "f32" and any(d.stored for d in report.decisions):
    # Rounding stored results is an error source of its own: a candidate
    # like the groups, so calibration can reach f32 when it must.
    groups[STORAGE_GROUP] = "results stored in the compute dtype"
  effects, kept, result, error = [], (), base, base_error
  if base_error > tolerance and groups:
    for group, loc in sorted(groups.items()):
      _, kept_error = error_of((group,))
      effects.append(GroupEffect(group, loc, kept_error,
                                 base_error - kept_error))
    ranked = [e.group for e in sorted(effects, key=lambda e: -e.contribution)]
    # The shortest prefix of the ranking that meets the tolerance.
    low, high = 1, len(ranked)
    best = None
    while low <= high:
      middle = (low + high) // 2
      candidate, candidate_error = error_of(ranked[:middle])
      if candidate_error <= tolerance:
        best = (tuple(sorted(ranked[:middle])), candidate, candidate_error)
        high = middle - 1
      else:
        low = middle + 1
    if best is None:  # even everything in f32 is off: keep all
      everything = tuple(sorted(ranked))
      result, error = error_of(everything)
      kept = everything
    else:
      kept, result, error = best
  elif groups:
    effects = [GroupEffect(g, loc, base_error, 0.0)
               for g, loc in sorted(groups.items())]
  seconds = time.perf_counter() - start
  return result, Calibration(tolerance, base_error, error, kept,
                             tuple(effects), compiles, seconds, per_compile)


def calibrate_module(source: str | bytes, policy: Policy,
                     options: pl.RewriteOptions, inputs: Sequence[Any], *,
                     tolerance: float, source_name: str,
                     context: ir.Context) -> pl.RewriteResult:
  """`amp-opt --calibrate`: parse, calibrate, and return the rewrite; its
  report gains the calibration (printed with --report)."""
  form = pl.SourceForm()
  with context:
    module = pl.parse_module(source, context, source_name, form)
    expected = len(prog.main_signature(module)[0])
    if len(inputs) != expected:
      raise pl.RewriteError(
          f"{source_name}: error: main takes {expected} arguments, the "
          f"calibration inputs hold {len(inputs)} arrays")
    result, calibration = calibrate(module, policy, options, inputs,
                                    tolerance=tolerance, context=context,
                                    source_name=source_name)
  result.form = form
  result.calibration = calibration
  return result
