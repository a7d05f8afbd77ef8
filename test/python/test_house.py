"""The Python package stays a house a newcomer can find their way in: no
function longer than 80 lines, `TrainStep` within 150, option values
compared through the contract's ids and never as literals, and the
training state's appended roles described by the contract and served by
one slot per field (`train_state.py`)."""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import contract
from stablehlo_amp._src import train_state

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "stablehlo_amp"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _trees() -> dict[pathlib.Path, ast.Module]:
  assert len(SOURCES) > 10, "no Python sources found"
  return {path: ast.parse(path.read_text()) for path in SOURCES}


def _lengths(tree: ast.Module, kinds) -> list[tuple[str, int, int]]:
  return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
          for node in ast.walk(tree) if isinstance(node, kinds)]


def test_no_function_in_the_package_is_longer_than_80_lines():
  found = [(path.relative_to(ROOT), name, line, length)
           for path, tree in _trees().items()
           for name, line, length in _lengths(
               tree, (ast.FunctionDef, ast.AsyncFunctionDef))]
  assert len(found) > 300, "the scanner found too few functions"
  long = [f for f in found if f[3] > 80]
  assert not long, long


def test_train_step_is_at_most_150_lines():
  tree = ast.parse((PACKAGE / "_src" / "training.py").read_text())
  lengths = {name: length for name, _, length in _lengths(tree, ast.ClassDef)}
  assert lengths["TrainStep"] <= 150, lengths["TrainStep"]


def _option_attributes() -> set[str]:
  """Names under which Python reads an option value (the entry options,
  and the policy's gemm)."""
  return set(contract.options()) | {"gemm"}


def _strings(node: ast.AST) -> list[str]:
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return [node.value]
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return [s for element in node.elts for s in _strings(element)]
  return []


def literal_option_comparisons(tree: ast.Module) -> list[tuple[int, str]]:
  """(line, literal) of each comparison of an option value (an attribute
  named like an option: ``options.storage``) with a string literal."""
  names = _option_attributes()
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Compare):
      continue
    operands = [node.left, *node.comparators]
    if not any(isinstance(o, ast.Attribute) and o.attr in names
               for o in operands):
      continue
    found += [(node.lineno, s) for o in operands for s in _strings(o)]
  return found


def test_the_literal_scanner_finds_a_literal_option_value():
  # The test below can fail: it sees each way of writing one.
  for source in ('if options.storage == "f32": pass',
                 'x = self._options.update_rounding != "kahan"',
                 'y = policy.gemm in ("compute", other)'):
    assert literal_option_comparisons(ast.parse(source)), source
  assert not literal_option_comparisons(ast.parse(
      'if options.storage == contract.values("storage").f32: pass'))


def test_no_option_value_is_compared_as_a_literal():
  found = {str(path.relative_to(ROOT)): hits
           for path, tree in _trees().items()
           if (hits := literal_option_comparisons(tree))}
  assert not found, (f"compare option values through contract.values(...): "
                     f"{found}")


def test_option_value_ids_are_the_contracts_choices():
  for name, spec in contract.options().items():
    if spec.get("choices"):
      assert list(contract.values(name)) == list(spec["choices"])
  assert contract.values("gemm").compute == "compute"
  with pytest.raises(AttributeError):
    contract.values("update_rounding").round_up


# -- the training state's roles ----------------------------------------------


def test_every_state_role_names_a_field_with_a_slot():
  roles = contract.state_roles()
  appended = {contract.attribute(name) for name in (
      "loss_scale", "loss_scale_counter", "grads_finite", "state_finite",
      "amax_history", "rounding_key", "compensation")}
  assert set(roles) == appended
  # Measurements are returned, not carried: no role of the state.
  assert set(contract.measurements()) == {contract.attribute("gemm_amax"),
                                          contract.attribute("gemm_counts"),
                                          contract.attribute("nonfinite")}
  for role, spec in roles.items():
    assert spec["field"] in amp.TrainState._fields, role
    assert spec["field"] in train_state.SLOTS, role
  assert set(train_state.SLOTS) == {spec["field"] for spec in roles.values()}
  per_parameter = {spec["field"] for spec in roles.values()
                   if spec["per_parameter"]}
  assert per_parameter == {"compensation"}


def _skip_one_step(policy: str, **options) -> tuple:
  """A state after one finite step, and the state after a step whose
  gradients overflow (an inf in the batch)."""
  step = amp.train_step(lambda w, b: jnp.mean((b @ w) ** 2),
                        optax.adam(1e-2), policy,
                        loss_scale=amp.DynamicLossScale(2.0 ** 8), **options)
  batch = jax.random.normal(jax.random.PRNGKey(0), (32, 32))
  state = step.init(jax.random.normal(jax.random.PRNGKey(1), (32, 32)))
  state, _ = step(state, batch)
  skipped, metrics = step(state, batch.at[0, 0].set(jnp.inf))
  assert not bool(metrics["grads_finite"])
  return state, skipped


@pytest.mark.parametrize("policy, options, fields", [
    ("p=bf16,c=bf16,o=f32,gemm=f8",
     dict(fp8_scaling="delayed", update_rounding="kahan"),
     {"loss_scale", "amax_history", "compensation"}),
    ("p=bf16,c=bf16,o=f32", dict(update_rounding="stochastic"),
     {"loss_scale", "rounding_key"}),
])
def test_a_skipped_step_keeps_what_the_contract_says_it_keeps(policy,
                                                              options,
                                                              fields):
  before, after = _skip_one_step(policy, **options)
  checked = set()
  for role, spec in contract.state_roles().items():
    old, new = getattr(before, spec["field"]), getattr(after, spec["field"])
    if old is None:  # a role this step does not append
      continue
    same = all(np.array_equal(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new)))
    assert same == spec["kept_on_skip"], (role, spec)
    checked.add(spec["field"])
  assert checked == fields
