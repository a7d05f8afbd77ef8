"""Accuracy-budgeted rewriting: keep a small set of op groups in f32 that
brings every output within a tolerance of f32 on calibration inputs.

A group is one matrix multiply the policy would lower and the ops painted low
with it (the report's `group`; `amp-insert-converts{keep-groups=...}` keeps
groups in f32); storage precision is one more group. Calibration runs the f32
program and the mixed one on the inputs. When some output is off by more
than the tolerance, it searches by backward elimination: start from every
group in f32, then, one group at a time in program order, lower the group and
keep it low if the budget still holds. Groups that matter only together
(two dots whose results cancel) stay f32 together, which ranking groups by
their effect alone cannot see. The result is minimal: lowering any one kept
group breaks the budget. The cost is one compile per group plus three:
`Calibration.compiles` says how many.

Two error measures, per output, the largest over outputs:
  "norm"     ||got - f32|| / ||f32|| (the default)
  "max_abs"  max |got - f32| / max |f32|
Integer outputs must match exactly.
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

from stablehlo_amp._src import contract
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src import program as prog
from stablehlo_amp._src import report as report_mod
from stablehlo_amp._src.policy import Policy


@dataclasses.dataclass(frozen=True)
class GroupEffect:
  """One group: its matrix multiply's location and the error measured when
  the search lowered it (with the groups decided before it), or None when it
  was not measured (the budget held with every group low, or not even all
  groups in f32 met it)."""
  group: int
  loc: str
  error_if_low: float | None
  kept: bool


# The error measures (see the module doc).
ERROR_MEASURES = ("norm", "max_abs")


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
  measure: str = "norm"          # one of ERROR_MEASURES

  @property
  def cost_in_compiles(self) -> float:
    """Calibration time as a multiple of one compile."""
    return self.seconds / max(self.seconds_per_compile, 1e-9)

  def __str__(self) -> str:
    lines = [f"calibration: tolerance {self.tolerance:g} ({self.measure}), "
             f"error without f32 groups {self.error_f32_free:.3g}, with "
             f"{len(self.kept)} of {len(self.effects)} groups kept in f32 "
             f"{self.error:.3g}; {self.compiles} compiles, "
             f"{self.seconds:.1f} s ({self.cost_in_compiles:.1f}x one "
             "compile)"]
    for effect in self.effects:
      mark = "kept f32" if effect.kept else "low"
      name = ("storage" if effect.group == STORAGE_GROUP else
              f"group {effect.group}")
      measured = ("not measured" if effect.error_if_low is None else
                  f"error if low {effect.error_if_low:.3g}")
      lines.append(f"  {name} ({mark}): {measured}  {effect.loc}")
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
_GROUP_ROOT_REASONS = contract.reasons("matrix_multiply",
                                      "matrix_multiply_compute")


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


def _relative_error(got: Sequence[Any], want: Sequence[Any],
                    measure: str = "norm") -> float:
  """The largest error over outputs, relative to each f32 output (its norm,
  or its largest magnitude for "max_abs"); integer outputs must match
  exactly (else inf)."""
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
    if measure == "max_abs":
      error, scale = np.max(np.abs(g - w), initial=0.0), np.max(
          np.abs(w), initial=0.0)
    else:
      error, scale = np.linalg.norm(g - w), np.linalg.norm(w)
    worst = max(worst, float(error / (scale if scale else 1.0)))
  return worst


def check_measure(measure: str) -> str:
  if measure not in ERROR_MEASURES:
    raise ValueError(f"error_measure={measure!r}: expected one of "
                     f"{', '.join(map(repr, ERROR_MEASURES))}")
  return measure


def _runner(module: ir.Module):
  """A jitted callable running `module` (its public `main`) on arrays."""
  inputs, results = prog.main_signature(module)
  in_avals = [prog.aval_of_type(t) for t in inputs]
  out_avals = [prog.aval_of_type(t) for t in results]

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
              context: ir.Context, source_name: str = "<module>",
              measure: str = "norm"
              ) -> tuple[pl.RewriteResult, Calibration]:
  """Rewrites `module` keeping a minimal set of groups in f32 that brings
  every output within `tolerance` of f32 on `inputs` (see the module doc)."""
  if not tolerance > 0:
    raise ValueError(f"tolerance must be positive, got {tolerance}")
  check_measure(measure)
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
    return result, _relative_error(run(result.module), reference, measure)

  base, base_error = error_of(())
  report = base.report
  groups = {d.group: short_location(d.loc) for d in report.decisions
            if d.group is not None and d.precision == report_mod.LOW
            and d.reason_id in _GROUP_ROOT_REASONS}
  if options.storage != contract.values("storage").f32 and any(d.stored for d in report.decisions):
    # Rounding stored results is an error source of its own: a candidate
    # like the groups, so calibration can reach f32 when it must.
    groups[STORAGE_GROUP] = "results stored in the compute dtype"
  order = sorted(groups)  # storage first, then the groups in program order
  kept, result, error = (), base, base_error
  measured: dict[int, float] = {}
  if base_error > tolerance and groups:
    result, error = error_of(order)
    kept = tuple(order)
    if error <= tolerance:
      # Backward elimination: lower each group in turn while the budget
      # holds with it low.
      for group in order:
        candidate = tuple(g for g in kept if g != group)
        candidate_result, candidate_error = error_of(candidate)
        measured[group] = candidate_error
        if candidate_error <= tolerance:
          kept, result, error = candidate, candidate_result, candidate_error
  effects = tuple(GroupEffect(g, groups[g], measured.get(g), g in kept)
                  for g in order)
  seconds = time.perf_counter() - start
  return result, Calibration(tolerance, base_error, error, kept, effects,
                             compiles, seconds, per_compile, measure)


def calibrate_module(source: str | bytes, policy: Policy,
                     options: pl.RewriteOptions, inputs: Sequence[Any], *,
                     tolerance: float, source_name: str,
                     context: ir.Context,
                     measure: str = "norm") -> pl.RewriteResult:
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
                                    source_name=source_name, measure=measure)
  result.form = form
  result.calibration = calibration
  return result
