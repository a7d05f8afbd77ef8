"""End-to-end tests: real JAX programs through `amp.transform` and XLA.

For every program of `programs.PROGRAMS` under every policy: the rewritten
module verifies with jaxlib, compiles and runs through XLA:CPU, matches the
f32 program within the compute dtype's tolerance, keeps exp/log/sum
reductions (and the rest of the deny class) f32, lowers dots (and, on GPU,
convolutions), converts no value twice to one type, and its optimized HLO has
no dot XLA:CPU cannot execute (docs/xla-gpu.md, "Targets";
passes/CpuDotLayout.h).
Dots that feed a discrete decision (top_k, argmax, sort) or linear algebra
(Cholesky, triangular solve) stay f32 instead, with the report naming the
decision or routine, and integer outputs are bit-identical to the f32
program's on the same inputs.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re

import jax
import jax.export
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.interpreters import mlir as jax_mlir
from jax.extend.mlir import ir

import stablehlo_amp as amp
from stablehlo_amp._src import hlo
from mlir_checks import duplicate_converts, functions, walk
from programs import (ADAM_LR, FIGURES, PROGRAMS, PROGRAMS_BY_NAME, Figures,
                      Program, first_line, compute_dtype_name,
                      relative_error, tolerances)


# Bugs of the pass these tests found and that are not fixed yet:
# (test, program, policy or None for every policy) -> why. Each case is a
# strict xfail: a fix shows up as XPASS, which fails, and its entry goes.
KNOWN_BUGS: dict[tuple[str, str, str | None], str] = {
}


def _cases(test: str | None = None):
  for program in PROGRAMS:
    for policy in program.policies:
      reason = (KNOWN_BUGS.get((test, program.name, policy)) or
                KNOWN_BUGS.get((test, program.name, None)))
      marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
      yield pytest.param(program, policy, marks=marks,
                         id=f"{program.name}-{policy}")


def _program_cases():
  return [pytest.param(p, id=p.name) for p in PROGRAMS]


# amp.transform rewrites for, and compiles on, the host's default backend
# (the Makefile runs these tests with JAX_PLATFORMS=cpu). The tests marked
# with this check what XLA:CPU gets; on another backend they do not apply.
on_cpu_host = pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason=f"checks the rewrite for and the executable of XLA:CPU, the "
    f"default backend here is {jax.default_backend()} (run with "
    "JAX_PLATFORMS=cpu)")


# -- MLIR helpers --------------------------------------------------------------

FLOAT_TYPES = ("f16", "bf16", "f32", "f64")

# Ops that must stay f32 whatever the policy (Passes.td, deny class).
DENY_ELEMENTWISE = ("stablehlo.exponential", "stablehlo.log",
                    "stablehlo.log_plus_one", "stablehlo.exponential_minus_one",
                    "stablehlo.power", "stablehlo.rsqrt", "stablehlo.sqrt")
# Ops with a reduction body: a sum (or product) body makes them accumulate.
ACCUMULATING = ("stablehlo.reduce", "stablehlo.reduce_window",
                "stablehlo.scatter", "stablehlo.select_and_scatter")
ACCUMULATING_BODY = ("stablehlo.add", "stablehlo.multiply")


def _context() -> ir.Context:
  return jax_mlir.make_ir_context()


def parse_and_verify(text: str) -> ir.Module:
  """Parses StableHLO text with jaxlib and runs the real verifier."""
  context = _context()
  with context:
    module = ir.Module.parse(text, context)
    assert module.operation.verify()
  return module



def element_type(mlir_type) -> str | None:
  """`f32` for `tensor<4x8xf32>`; None for tokens, tuples and the like."""
  try:
    return str(ir.ShapedType(mlir_type).element_type)
  except ValueError:
    return None


def is_float(type_name: str | None) -> bool:
  return type_name is not None and (type_name in FLOAT_TYPES or
                                    type_name.startswith("f8"))


def float_types(op) -> list[str]:
  """Element types of every float operand, result and region argument."""
  types = [element_type(v.type) for v in op.operands]
  types += [element_type(r.type) for r in op.results]
  for region in op.regions:
    for block in region.blocks:
      types += [element_type(a.type) for a in block.arguments]
  return [t for t in types if is_float(t)]


def is_accumulating(op) -> bool:
  return op.name in ACCUMULATING and any(
      inner.name in ACCUMULATING_BODY for inner in walk(op))


def main_signature(module: ir.Module) -> tuple[list[str], list[str]]:
  for name, func in functions(module):
    if name == "main":
      ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
      return ([element_type(t) for t in ftype.inputs],
              [element_type(t) for t in ftype.results])
  raise AssertionError("module has no main function")


def op_names(module: ir.Module) -> collections.Counter:
  return collections.Counter(op.name for op in walk(module.operation))


def _describe(op) -> str:
  return op.get_asm(large_elements_limit=4).splitlines()[0].strip()[:300]


def deny_violations(module: ir.Module) -> list[str]:
  """Deny-class ops (exp, log, ..., sum/product reductions) not fully f32."""
  bad = []
  for op in walk(module.operation):
    if op.name in DENY_ELEMENTWISE or is_accumulating(op):
      if any(t != "f32" for t in float_types(op)):
        bad.append(_describe(op))
  return bad


def count_ops(module: ir.Module, name: str) -> int:
  return op_names(module)[name]


def check_allow_ops(module: ir.Module, name: str, operand_type: str) -> list[str]:
  """`name` ops with float operands whose operands are not `operand_type`
  or whose result is not f32 (f32 accumulation, the default dot_result)."""
  bad = []
  for op in walk(module.operation):
    if op.name != name:
      continue
    operands = [element_type(v.type) for v in op.operands]
    if not any(is_float(t) for t in operands):
      continue
    results = [element_type(r.type) for r in op.results]
    if operands != [operand_type] * len(operands) or results != ["f32"]:
      bad.append(_describe(op))
  return bad


# -- HLO (post-compile) dot check ----------------------------------------------

# XLA:CPU's DotThunk kernels: same-type float/int/complex dots and
# s8 x s8 -> s32. Any other dot runs only inside a YNN fusion.
_DOT_THUNK_TYPES = {"bf16", "f16", "f32", "f64", "c64", "c128", "s8", "s16",
                    "s32", "s64", "u8", "u16", "u32", "u64"}


@dataclasses.dataclass(frozen=True)
class HloDot:
  computation: str
  name: str
  lhs: str
  rhs: str
  result: str
  in_ynn: bool

  @property
  def thunk_supported(self) -> bool:
    if self.lhs == self.rhs == self.result:
      return self.result in _DOT_THUNK_TYPES
    return (self.lhs, self.rhs, self.result) == ("s8", "s8", "s32")

  def __str__(self) -> str:
    where = "in a YNN fusion" if self.in_ynn else "outside YNN"
    return (f"%{self.name} in %{self.computation} ({where}): "
            f"{self.lhs.upper()} x {self.rhs.upper()} = {self.result.upper()}")


def hlo_dots(hlo_text: str) -> list[HloDot]:
  """Every `dot(` of an HLO module (`compiled.as_text()`), with its element
  types and whether it runs inside a YNN fusion (reached, directly or through
  nested calls, from a fusion whose backend config kind names ynn)."""
  module = hlo.Module.parse(hlo_text)
  ynn_bodies = [callee for c in module.computations.values()
                for ins in c.instructions
                if ins.opcode == "fusion" and "ynn" in ins.backend_kind.lower()
                for callee in ins.called_computations]
  ynn = {c.name for c in module.reachable(ynn_bodies)}
  dots = []
  for computation in module.computations.values():
    for ins in computation.instructions:
      if ins.opcode != "dot":
        continue
      if len(ins.operands) != 2:
        raise ValueError(f"dot %{ins.name} with {len(ins.operands)} operands")
      shapes = computation.operand_shapes(ins)
      if None in shapes:
        raise ValueError(f"dot %{ins.name}: an operand's type is unknown")
      lhs, rhs = (shape.element_type for shape in shapes)
      dots.append(HloDot(computation.name, ins.name, lhs, rhs,
                         ins.shape.element_type, computation.name in ynn))
  return dots


def unsupported_dots(hlo_text: str) -> list[HloDot]:
  """Dots XLA:CPU would reject at run time: outside a YNN fusion and not in
  DotThunk's type table (e.g. BF16 x BF16 = F32)."""
  return [d for d in hlo_dots(hlo_text)
          if not d.in_ynn and not d.thunk_supported]


# -- running a program ---------------------------------------------------------

@dataclasses.dataclass
class Run:
  program: Program
  policy: str
  args: tuple
  lowered: amp.Lowered
  text: str                    # rewritten module, pretty
  report: amp.Report
  compiled: jax.stages.Compiled
  hlo: str

  @functools.cached_property
  def module(self) -> ir.Module:
    return parse_and_verify(self.text)

  def figures(self) -> Figures:
    key = (self.program.name, self.policy)
    if key not in FIGURES:
      FIGURES[key] = Figures(self.program.name, self.policy,
                             sum(self.report.lowered.values()),
                             sum(self.report.kept_f32.values()),
                             self.report.converts_inserted)
    return FIGURES[key]


@functools.cache
def _exact(program: Program) -> dict:
  """A program with discrete decisions is checked for the promise of
  decisions="exact": its integer outputs equal f32's, what feeds them is
  kept. The default ("gate") has its own tests (test_priced_defaults.py,
  test_corpus_decisions.py)."""
  return {"decisions": "exact"} if program.decisions else {}


def run(name: str, policy: str) -> Run:
  program = PROGRAMS_BY_NAME[name]
  args = program.make_args()
  fast = amp.transform(program.fn, policy, **_exact(program))
  lowered = fast.lower(*args)
  report = lowered.report()
  assert report is not None, "the rewrite fell back to the original program"
  compiled = lowered.compile()
  result = Run(program, policy, args, lowered, lowered.as_text(), report,
               compiled, compiled.as_text())
  result.figures()
  return result


@functools.cache
def f32_text(name: str) -> str:
  program = PROGRAMS_BY_NAME[name]
  return jax.jit(program.fn).lower(*program.make_args()).as_text()


@functools.cache
def f32_outputs(name: str) -> list:
  """The f32 program's outputs after `steps` steps (leaves)."""
  program = PROGRAMS_BY_NAME[name]
  step = jax.jit(program.fn)
  args = program.make_args()
  for _ in range(program.steps):
    outputs = step(*args)
    if program.next_args is not None:
      args = program.next_args(args, outputs)
  return jax.tree_util.tree_leaves(outputs)


# -- the f32 programs exercise what they claim ---------------------------------

@pytest.mark.parametrize("program", _program_cases())
def test_f32_program_has_expected_structure(program: Program):
  module = parse_and_verify(f32_text(program.name))
  ops = op_names(module)
  has_sum = any(is_accumulating(op) and "stablehlo.add" in
                {inner.name for inner in walk(op)}
                for op in walk(module.operation))
  facts = dict(has_dot=ops["stablehlo.dot_general"] > 0,
               has_conv=ops["stablehlo.convolution"] > 0,
               has_exp=ops["stablehlo.exponential"] > 0,
               has_log=ops["stablehlo.log"] > 0,
               has_sum=has_sum,
               has_while=ops["stablehlo.while"] > 0)
  expected = {key: getattr(program, key) for key in facts}
  assert facts == expected
  leaves = jax.tree_util.tree_leaves(
      jax.eval_shape(program.fn, *program.make_args()))
  floats = tuple(i for i, leaf in enumerate(leaves)
                 if jnp.issubdtype(leaf.dtype, jnp.floating))
  assert program.float_outputs == floats


# -- rewritten module ------------------------------------------------------------

@pytest.mark.parametrize("program, policy", list(_cases()))
def test_rewritten_module_verifies_with_jaxlib(program: Program, policy: str):
  r = run(program.name, policy)
  module = r.module  # parses and verifies
  params = dict(kv.split("=") for kv in policy.split(","))
  inputs, results = main_signature(module)
  # Float arguments take the param dtype, float results the output dtype.
  assert {t for t in inputs if is_float(t)} <= {params["p"]}
  assert {t for t in results if is_float(t)} == {params["o"]}


@pytest.mark.parametrize("program, policy", list(_cases()))
def test_exp_log_and_sum_reductions_stay_f32(program: Program, policy: str):
  r = run(program.name, policy)
  assert deny_violations(r.module) == []
  ops = op_names(r.module)
  # The deny-class ops are still there (not folded away or lost).
  if program.has_exp:
    assert ops["stablehlo.exponential"] > 0
  if program.has_log:
    assert ops["stablehlo.log"] > 0
  if program.has_sum:
    assert any(is_accumulating(op) for op in walk(r.module.operation))
  assert r.report.lowered["stablehlo.exponential"] == 0
  assert r.report.lowered["stablehlo.log"] == 0


@pytest.mark.parametrize(
    "program, policy",
    list(_cases("test_dots_lowered_and_convolutions_f32_on_cpu")))
@on_cpu_host
def test_dots_lowered_and_convolutions_f32_on_cpu(program: Program, policy: str):
  r = run(program.name, policy)
  check_dots(r.module, r.report, program, policy)
  # amp.transform targets the backend it runs on: CPU keeps convolutions f32.
  assert check_allow_ops(r.module, "stablehlo.convolution", "f32") == []
  assert r.report.lowered["stablehlo.convolution"] == 0


@pytest.mark.parametrize("program, policy", list(_cases()))
def test_no_value_converted_twice_to_one_type(program: Program, policy: str):
  r = run(program.name, policy)
  assert duplicate_converts(r.module) == []
  assert r.report.converts_total == count_ops(r.module, "stablehlo.convert")


@pytest.mark.parametrize("program, policy", list(_cases()))
@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_rewrite_module_targets(program: Program, policy: str, target: str):
  """`amp.rewrite_module` on the f32 module text, per target: convolutions
  lowered on GPU and kept f32 on CPU; the other contracts hold on both."""
  # (dot_result="f32": the checks below read convolution results as f32;
  # the gpu default, bf16 results, is test_priced_defaults.py's.)
  result = amp.rewrite_module(f32_text(program.name), policy, target=target,
                              dot_result="f32", **_exact(program))
  module = parse_and_verify(result.text())
  compute = compute_dtype_name(policy)
  conv_type = compute if target == "gpu" else "f32"
  assert check_allow_ops(module, "stablehlo.convolution", conv_type) == []
  convs = count_ops(module, "stablehlo.convolution")
  assert convs == (1 if program.has_conv else 0)
  # (The jit text has chlo.top_k itself, not jax.export's composite.)
  check_dots(module, result.report, program, policy,
             results=("f32", compute) if target == "gpu" else ("f32",))
  assert missing_decisions(result.report, program) == []
  if target == "gpu":
    assert result.report.lowered["stablehlo.convolution"] == convs
  else:
    assert result.report.kept_f32["stablehlo.convolution"] == convs
  assert deny_violations(module) == []
  assert duplicate_converts(module) == []


def check_dots(module: ir.Module, report: amp.Report, program: Program,
               policy: str, results: tuple[str, ...] = ("f32",)) -> None:
  """Every dot of the f32 program is lowered (compute-dtype operands, a
  result in `results`: f32 accumulation, or on GPU also the compute dtype
  for a result stored low) except the `program.kept_dots` that feed a
  discrete decision or linear algebra: those stay f32 and the report says
  why."""
  f32_dots = count_ops(parse_and_verify(f32_text(program.name)),
                       "stablehlo.dot_general")
  compute = compute_dtype_name(policy)
  low, full, bad = [], [], []
  for op in walk(module.operation):
    if op.name != "stablehlo.dot_general":
      continue
    operands = [element_type(v.type) for v in op.operands]
    result = element_type(op.results[0].type)
    if operands == [compute] * 2 and result in results:
      low.append(_describe(op))
    elif operands == ["f32"] * 2 and result == "f32":
      full.append(_describe(op))
    else:
      bad.append(_describe(op))
  assert bad == [], "dots neither lowered nor f32"
  assert len(full) == program.kept_dots, full
  assert len(low) == f32_dots - program.kept_dots
  assert report.lowered["stablehlo.dot_general"] == (f32_dots -
                                                     program.kept_dots)
  kept = [d for d in report.decisions
          if d.op == "stablehlo.dot_general" and d.precision == "f32"]
  assert len(kept) == program.kept_dots
  # (jnp.linalg's solves ask for precision=HIGHEST, honoured as such.)
  assert {d.reason_id for d in kept} <= {"discrete_decision",
                                         "linear_algebra",
                                         "precision_requested"}, kept


def missing_decisions(report: amp.Report, program: Program) -> list:
  """The (reason id, detail pattern) pairs of `program.decisions` that no
  op the report keeps f32 shows."""
  kept = {(d.reason_id, d.detail) for d in report.decisions
          if d.precision == "f32"}
  return [(reason, pattern) for reason, pattern in program.decisions
          if not any(r == reason and re.search(pattern, detail)
                     for r, detail in kept)]


@functools.cache
def exported_text(name: str) -> str:
  program = PROGRAMS_BY_NAME[name]
  return jax.export.export(jax.jit(program.fn))(
      *program.make_args()).mlir_module()


@pytest.mark.parametrize("program, policy",
                         list(_cases("test_exported_module_keeps_decisions")))
def test_exported_module_keeps_decisions(program: Program, policy: str):
  """`amp.rewrite_module` on what `jax.export` produces (the other source
  of modules docs/amp-opt.md names; amp.transform lowers with jax.jit): the same dots
  lowered and kept, for the same reasons."""
  result = amp.rewrite_module(exported_text(program.name), policy,
                              target="cpu", **_exact(program))
  module = parse_and_verify(result.text())
  check_dots(module, result.report, program, policy)
  assert missing_decisions(result.report, program) == []


@pytest.mark.parametrize("program, policy",
                         list(_cases("test_report_names_the_decisions")))
def test_report_names_the_decisions(program: Program, policy: str):
  """What feeds a top_k, argmax, sort or Cholesky solve is kept f32 with
  the reason naming the decision (or the routine); a program without one
  has no such reason."""
  r = run(program.name, policy)
  assert missing_decisions(r.report, program) == []
  reasons = {d.reason_id for d in r.report.decisions if d.precision == "f32"}
  if not program.decisions:
    assert not reasons & {"discrete_decision", "linear_algebra"}
  for d in r.report.decisions:
    if d.reason_id in ("discrete_decision", "linear_algebra"):
      assert d.precision == "f32" and d.detail, d
      assert str(d.reason).startswith(
          "feeds a discrete decision" if d.reason_id == "discrete_decision"
          else "feeds linear algebra"), d.reason


# -- compiled and run ------------------------------------------------------------

@pytest.mark.parametrize("program, policy", list(_cases()))
@on_cpu_host
def test_compiled_hlo_has_no_dot_xla_cpu_cannot_run(program: Program,
                                                    policy: str):
  r = run(program.name, policy)
  dots = hlo_dots(r.hlo)
  if program.has_dot:
    assert dots, "the checker found no dot in the optimized HLO"
  bad = [str(d) for d in dots if not d.in_ynn and not d.thunk_supported]
  assert bad == []


# How far a training step's parameter update (the parameters minus their
# values before the steps) may be from the f32 program's, relative to the
# f32 update's norm. Adam's update m/sqrt(v) divides by the gradient's own
# magnitude, so an element whose gradient is near rounding level moves by up
# to lr the wrong way: measured at most 0.14 (bf16) and 0.04 (f16) over the
# training programs. A wrong update direction (gradient sign flipped: 2), a
# parameter left unmoved (its gradient zeroed: 1) or a step twice as long
# (1) is off by far more. A gradient scaled by a constant leaves Adam's
# update unchanged: the moment check below is what sees it.
ADAM_UPDATE_TOLERANCE = 0.25


def _check_outputs(program: Program, policy: str, actual: list,
                   expected: list, start: list,
                   steps: int | None = None) -> float:
  """Asserts the f32 comparison; returns the largest relative-norm error.

  `start` holds the leaves of the arguments the steps started from (a
  training step's parameters are its first argument leaves and its first
  output leaves)."""
  tol_norm, tol_elem = tolerances(policy)
  errors = []
  for i in program.float_outputs:
    a = np.asarray(actual[i], np.float32)
    e = np.asarray(expected[i], np.float32)
    assert a.shape == e.shape
    output_dtype = amp.Policy.parse(policy).output_dtype
    assert actual[i].dtype == output_dtype, f"output {i} is {actual[i].dtype}"
    assert np.all(np.isfinite(a)), f"output {i} has non-finite values"
    errors.append(relative_error(a, e))
    if i in program.adam_params:
      # The update the steps made, against the f32 program's (plain
      # jax.value_and_grad and optax, the same steps from the same start):
      # the parameters themselves are within a few lr of where they started,
      # so comparing them sees rounding of the start, not the update.
      before = np.asarray(start[i], np.float32)
      assert before.shape == a.shape, f"start leaf {i} is not parameter {i}"
      update_error = relative_error(a - before, e - before)
      assert update_error <= ADAM_UPDATE_TOLERANCE, (
          f"parameter output {i}: update off the f32 update by "
          f"{update_error:.3g} of its norm")
      # Per element: a small gradient whose sign flips in low precision
      # moves a parameter by up to 2 * lr per step the other way.
      np.testing.assert_allclose(a, e, rtol=1e-6,
                                 atol=2 * ADAM_LR * (steps or program.steps),
                                 err_msg=f"parameter output {i}")
    elif program.adam_params:
      # A training step's optimizer moments: Adam's second moment is the
      # square of the gradient, so its relative error is twice the
      # gradient's. This is what sees a gradient off by a constant factor,
      # which leaves the parameter update unchanged: the first moment is
      # then off by 1 of its norm for a gradient doubled or zeroed, 2 for
      # one negated.
      assert errors[-1] <= 2 * tol_norm, (
          f"output {i}: relative error {errors[-1]}")
    else:
      assert errors[-1] <= tol_norm, f"output {i}: relative error {errors[-1]}"
    if not program.adam_params:
      # (A training step's optimizer moments and loss: whole vectors only.)
      np.testing.assert_allclose(a, e, rtol=0,
                                 atol=tol_elem * float(np.max(np.abs(e))),
                                 err_msg=f"output {i}")
  return max(errors)


@pytest.mark.parametrize("program, policy",
                         list(_cases("test_runs_through_xla_and_matches_f32")))
def test_runs_through_xla_and_matches_f32(program: Program, policy: str):
  r = run(program.name, policy)
  args = r.args
  errors = []
  try:
    for step in range(program.steps):
      outputs = r.compiled(*args)
      check_integer_outputs(program, args, outputs, step)
      if program.same_inputs:
        # One step from the same inputs: the allowance of one Adam step.
        errors.append(_check_outputs(
            program, policy, jax.tree_util.tree_leaves(outputs),
            jax.tree_util.tree_leaves(_f32_step(program.name)(*args)),
            start=jax.tree_util.tree_leaves(args), steps=1))
      if program.next_args is not None:
        args = program.next_args(args, outputs)
    actual = jax.block_until_ready(jax.tree_util.tree_leaves(outputs))
  except AssertionError as error:
    r.figures().note = "does not match f32: " + first_line(error)
    raise
  except Exception as error:
    r.figures().note = "fails at run time: " + first_line(error)
    raise
  if not program.same_inputs:
    errors.append(_check_outputs(program, policy, actual,
                                 f32_outputs(program.name),
                                 start=jax.tree_util.tree_leaves(r.args)))
  r.figures().max_error = max(errors)


@functools.cache
def _f32_step(name: str):
  return jax.jit(PROGRAMS_BY_NAME[name].fn)


def check_integer_outputs(program: Program, args: tuple, outputs,
                          step: int) -> None:
  """Integer and boolean outputs (expert indices, predictions, sort
  indices, Adam's count) are bit-identical to the f32 program's on the same
  inputs. (For a training step, each step against the f32 step applied to
  this run's own inputs: after the first step the parameters differ by
  rounding, and a decision on different parameters may differ.)"""
  actual = jax.tree_util.tree_leaves(outputs)
  expected = jax.tree_util.tree_leaves(_f32_step(program.name)(*args))
  for i, (a, e) in enumerate(zip(actual, expected)):
    if i not in program.float_outputs:
      assert a.dtype == e.dtype, f"output {i}: {a.dtype} vs {e.dtype}"
      mismatches = int(np.sum(np.asarray(a) != np.asarray(e)))
      assert mismatches == 0, (f"step {step}: integer output {i} differs in "
                               f"{mismatches} of {np.size(e)} elements")


@pytest.mark.parametrize("program, policy", list(_cases()))
def test_transformed_call_equals_compiled(program: Program, policy: str):
  """`fast(*args)`, the user's path, runs the executable the checks saw."""
  r = run(program.name, policy)
  fast = amp.transform(program.fn, policy, **_exact(program))
  for got, want in zip(jax.tree_util.tree_leaves(fast(*r.args)),
                       jax.tree_util.tree_leaves(r.compiled(*r.args))):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# -- the post-compile checker catches the known-bad dot ----------------------------

# These checker tests are about XLA:CPU's executables on any host: their
# arrays are committed to the CPU device, so jax.jit compiles them for XLA:CPU
# even where the default backend is a GPU.
_CPU = jax.devices("cpu")[0]
_A = jax.device_put(
    jax.random.normal(jax.random.key(11), (16, 32), jnp.bfloat16), _CPU)
_B = jax.device_put(
    jax.random.normal(jax.random.key(12), (32, 24), jnp.bfloat16), _CPU)

_F32 = jnp.float32


def _dg(a, b, contracting, **kwargs):
  return lax.dot_general(a, b, (contracting, ((), ())), **kwargs)


# The known-bad form (a mixed dot whose result is transposed, which
# XLA folds into a dot YNNPACK does not claim), written two ways.
_KNOWN_BAD = {
    "dot_general_then_transpose": lambda a, b: _dg(
        a, b, ((1,), (0,)), preferred_element_type=_F32).T,
    "einsum_then_transpose": lambda a, b: jnp.einsum(
        "ij,jk->ik", a, b, preferred_element_type=_F32).T,
}

# Forms that run: the checker must not flag them (no false positives).
_KNOWN_GOOD = {
    "dot_general_nn": lambda a, b: _dg(a, b, ((1,), (0,)),
                                       preferred_element_type=_F32),
    "dot_general_tn": lambda a, b: _dg(a.T, b, ((0,), (0,)),
                                       preferred_element_type=_F32),
    "dot_general_nt": lambda a, b: _dg(a, b.T, ((1,), (1,)),
                                       preferred_element_type=_F32),
    "einsum_transposed_output": lambda a, b: jnp.einsum(
        "ij,jk->ki", a, b, preferred_element_type=_F32),
    "bf16_result_transposed": lambda a, b: (a @ b).T,
    "f16_then_transpose": lambda a, b: _dg(
        a.astype(jnp.float16), b.astype(jnp.float16), ((1,), (0,)),
        preferred_element_type=_F32).T,
}


@pytest.mark.parametrize("form", list(_KNOWN_BAD))
def test_checker_flags_known_bad_dot_and_it_fails_at_run_time(form: str):
  compiled = jax.jit(_KNOWN_BAD[form]).lower(_A, _B).compile()
  bad = unsupported_dots(compiled.as_text())
  assert [(d.lhs, d.rhs, d.result, d.in_ynn) for d in bad] == [
      ("bf16", "bf16", "f32", False)]
  with pytest.raises(Exception, match=r"UNIMPLEMENTED.*DotThunk.*BF16 x BF16 "
                                      r"= F32"):
    jax.block_until_ready(compiled(_A, _B))


@pytest.mark.parametrize("form", list(_KNOWN_GOOD))
def test_checker_does_not_flag_dots_that_run(form: str):
  compiled = jax.jit(_KNOWN_GOOD[form]).lower(_A, _B).compile()
  assert hlo_dots(compiled.as_text()), "the checker found no dot"
  assert unsupported_dots(compiled.as_text()) == []
  out = jax.block_until_ready(compiled(_A, _B))
  assert np.all(np.isfinite(np.asarray(out, np.float32)))


def test_checker_accepts_native_mixed_dot():
  """The NT-canonical bf16 x bf16 -> f32 dot (CpuDotLayout.h) runs in a YNN
  fusion: the checker finds it there, does not flag it, and it runs."""
  b_t = jax.device_put(jnp.asarray(_B.T), _CPU)  # [24, 32], materialized
  compiled = jax.jit(lambda a, bt: lax.dot_general(
      a, bt, (((1,), (1,)), ((), ())),
      preferred_element_type=jnp.float32)).lower(_A, b_t).compile()
  dots = hlo_dots(compiled.as_text())
  assert [(d.lhs, d.rhs, d.result, d.in_ynn) for d in dots] == [
      ("bf16", "bf16", "f32", True)]
  assert unsupported_dots(compiled.as_text()) == []
  out = compiled(_A, b_t)
  np.testing.assert_allclose(
      np.asarray(out),
      np.asarray(_A, np.float32) @ np.asarray(_B, np.float32),
      rtol=1e-5, atol=1e-4)


_HAND_WRITTEN_HLO = """\
HloModule m, entry_computation_layout={(bf16[8,16]{1,0}, bf16[16,8]{1,0})->f32[8,8]{1,0}}

%inner (p0: bf16[8,16], p1: bf16[16,8]) -> f32[8,8] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,8]{1,0} dot(bf16[8,16]{1,0} %p0, bf16[16,8]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%ynn_body (q0: bf16[8,16], q1: bf16[16,8]) -> f32[8,8] {
  %q0 = bf16[8,16]{1,0} parameter(0)
  %q1 = bf16[16,8]{1,0} parameter(1)
  ROOT %call.1 = f32[8,8]{1,0} call(%q0, %q1), to_apply=%inner
}

%other_body (s0: bf16[8,16], s1: bf16[16,8]) -> f32[8,8] {
  %s0 = bf16[8,16]{1,0} parameter(0)
  %s1 = bf16[16,8]{1,0} parameter(1)
  ROOT %dot.3 = f32[8,8]{1,0} dot(%s0, %s1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%loop_body (r0: f32[8,16], r1: f32[16,8]) -> f32[8,8] {
  %r0 = f32[8,16]{1,0} parameter(0)
  %r1 = f32[16,8]{1,0} parameter(1)
  ROOT %dot.2 = f32[8,8]{1,0} dot(%r0, %r1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="dot(x)"}
}

ENTRY %main (a: bf16[8,16], b: bf16[16,8]) -> f32[8,8] {
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,8]{1,0} parameter(1)
  %fast = f32[8,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%ynn_body, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %other = f32[8,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%other_body, backend_config={"fusion_config":{"kind":"__other"}}
  %fa = f32[8,16]{1,0} convert(%a)
  %fb = f32[16,8]{1,0} convert(%b)
  %f32dot = f32[8,8]{1,0} fusion(%fa, %fb), kind=kLoop, calls=%loop_body
  ROOT %bad = f32[8,8]{1,0} dot(%a, /*index=1*/%b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_checker_parses_typed_operands_nested_calls_and_fusion_kinds():
  dots = {d.name: d for d in hlo_dots(_HAND_WRITTEN_HLO)}
  assert set(dots) == {"dot.1", "dot.2", "dot.3", "bad"}
  # Typed operands, reached from the YNN fusion through a call: YNN.
  assert (dots["dot.1"].lhs, dots["dot.1"].rhs, dots["dot.1"].result,
          dots["dot.1"].in_ynn) == ("bf16", "bf16", "f32", True)
  # An f32 dot in a loop fusion runs on DotThunk.
  assert not dots["dot.2"].in_ynn and dots["dot.2"].thunk_supported
  # A custom fusion of another kind is not YNN.
  assert not dots["dot.3"].in_ynn and not dots["dot.3"].thunk_supported
  # Untyped operands (with an /*index=*/ comment) resolved by name.
  assert (dots["bad"].lhs, dots["bad"].rhs, dots["bad"].result) == (
      "bf16", "bf16", "f32")
  assert sorted(d.name for d in unsupported_dots(_HAND_WRITTEN_HLO)) == [
      "bad", "dot.3"]


# -- the MLIR checks catch what they look for --------------------------------------

_BAD_MODULE = """
func.func @main(%arg0: tensor<8x16xbf16>) -> (tensor<8x16xbf16>, tensor<8xbf16>, tensor<8xbf16>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xbf16>) {
  %0 = stablehlo.exponential %arg0 : tensor<8x16xbf16>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
  %1 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<8x16xbf16>, tensor<bf16>) -> tensor<8xbf16>
  %2 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<8x16xbf16>, tensor<bf16>) -> tensor<8xbf16>
  %3 = stablehlo.convert %arg0 : (tensor<8x16xbf16>) -> tensor<8x16xf32>
  %4 = stablehlo.convert %arg0 : (tensor<8x16xbf16>) -> tensor<8x16xf32>
  %5 = stablehlo.convert %arg0 : tensor<8x16xbf16>
  return %0, %1, %2, %3, %4, %5 : tensor<8x16xbf16>, tensor<8xbf16>, tensor<8xbf16>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xbf16>
}
"""

_GOOD_MODULE = """
func.func @main(%arg0: tensor<8x16xbf16>) -> (tensor<8x16xf32>, tensor<8xf32>, tensor<8xbf16>) {
  %0 = stablehlo.convert %arg0 : (tensor<8x16xbf16>) -> tensor<8x16xf32>
  %1 = stablehlo.exponential %0 : tensor<8x16xf32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %cst) across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
   reducer(%a: tensor<f32>, %b: tensor<f32>) {
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }
  %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
  %3 = stablehlo.reduce(%arg0 init: %cst_0) applies stablehlo.maximum across dimensions = [1] : (tensor<8x16xbf16>, tensor<bf16>) -> tensor<8xbf16>
  return %1, %2, %3 : tensor<8x16xf32>, tensor<8xf32>, tensor<8xbf16>
}
"""


def test_mlir_checks_flag_low_precision_deny_ops_and_duplicate_converts():
  bad = parse_and_verify(_BAD_MODULE)
  violations = deny_violations(bad)
  assert len(violations) == 2
  assert "stablehlo.exponential" in violations[0]
  assert "stablehlo.add" in violations[1]        # the sum, not the max
  duplicates = duplicate_converts(bad)
  assert len(duplicates) == 2
  assert any("converted 2 times to tensor<8x16xf32>" in d for d in duplicates)
  assert any("convert to its own type" in d for d in duplicates)
  good = parse_and_verify(_GOOD_MODULE)
  assert deny_violations(good) == []
  assert duplicate_converts(good) == []
