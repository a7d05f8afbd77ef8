"""The rewrite options come from the contract: every entry point takes the
same ones, by the same names, checked by the same code, and none of them is
written in Python. A pass option becomes an option of amp.transform,
amp.train_step, amp.value_and_grad and amp-opt by one row of the contract's
entry-option table."""

import inspect
import re

import jax
import jax.numpy as jnp
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import cli
from stablehlo_amp._src import contract
from stablehlo_amp._src import pipeline as pl


def _user_options(stateful: bool) -> list[str]:
  return [name for name, spec in contract.options().items()
          if not spec["internal"] and (stateful or not spec["stateful"])]


def test_each_entry_option_sets_a_real_pass_option():
  passes = contract.document()["passes"]
  for name, spec in contract.options().items():
    assert spec["pass"] in passes, name
    # An empty spelling switches the pass on or off.
    assert not spec["option"] or spec["option"] in passes[spec["pass"]][
        "options"], name
    # The help users read is the pass's own description (Passes.td).
    assert spec["help"], name


def test_python_writes_no_option_name():
  """The entry points take options by keyword and check them against the
  contract: no signature lists one, so adding one touches no Python."""
  names = set(contract.options())
  for entry in (amp.transform, amp.train_step, amp.value_and_grad):
    parameters = inspect.signature(entry).parameters
    assert not names & set(parameters), entry.__name__
    assert any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def _loss(w, x):
  with jax.named_scope("layer"):  # what `scopes=` names
    return jnp.sum(jnp.tanh(x @ w))


def _example_value(name: str):
  spec = contract.options()[name]
  if name == "target":
    return "cpu"
  kind = spec["kind"]
  if kind == "int":
    return spec["minimum"] + 3
  if kind == "choice":
    return spec["choices"][-1]
  if kind == "op_names":
    return ["tanh"]
  if kind == "ints":
    return [0]
  if kind == "scopes":
    return {"layer": spec["choices"][0]}
  assert kind == "bool", kind
  return True


@pytest.mark.parametrize("name", _user_options(stateful=True))
def test_every_entry_point_takes_the_same_options(name):
  value = _example_value(name)
  if name == "force_compute":
    value = ["exponential"]
  w, x = jnp.ones((4, 4)), jnp.ones((2, 4))
  stateful = contract.options()[name]["stateful"]
  # The policy the option applies to: FP8 scaling needs FP8 GEMMs, state
  # rounding bf16 parameters.
  policy = {contract.FP8_GEMMS: "p=f32,c=bf16,o=f32,gemm=f8",
            contract.ROUND_STATE: "p=bf16,c=bf16,o=f32"}.get(
                contract.options()[name]["pass"], "p=f32,c=bf16,o=f32")
  step = amp.train_step(_loss, optax.sgd(0.1), policy, **{name: value})
  assert getattr(step._options, name) is not None
  if stateful:
    # Only the train step carries the state such an option configures, or
    # checks itself (check_grads, skip_nonfinite).
    for make in (lambda: amp.transform(_loss, policy, **{name: value}),
                 lambda: amp.value_and_grad(_loss, policy, **{name: value})):
      with pytest.raises(TypeError, match=rf"unexpected options: {name} "
                         r"\(.*what only amp.train_step has"):
        make()
    return
  fast = amp.transform(_loss, policy, **{name: value})
  assert fast.lower(w, x).report() is not None
  vg = amp.value_and_grad(_loss, policy, **{name: value})
  if value in contract.options()[name].get("measured_values", ()):
    # Measurements come back beside the function's own outputs, as one
    # more element, under the names train_step's metrics give them.
    out, measured = fast(w, x)
    assert out.shape == () and measured
    *_, vg_measured = vg(w, x)
    assert set(vg_measured) == set(measured)
    assert set(measured) <= set(step(step.init(w), x)[1])
  else:
    assert fast(w, x).shape == () and len(vg(w, x)) == 3
  assert cli.option_flag(name) in cli._build_parser().format_help()


def test_amp_opt_has_a_flag_for_each_option_and_no_other():
  text = cli._build_parser().format_help()
  flags = set(re.findall(r"^  (--[a-z0-9-]+)", text, re.M))
  options = {cli.option_flag(n) for n in _user_options(False)}
  assert options <= flags
  own = {"--help", "--output", "--policy", "--calibrate", "--tolerance",
         "--error-measure", "--emit", "--debug-info", "--report",
         "--split-input-file", "--pass-pipeline", "--version"}
  assert flags - own == options


def test_a_misspelt_option_names_the_nearest_everywhere():
  for make in (lambda: amp.transform(_loss, storag="f32"),
               lambda: amp.value_and_grad(_loss, storag="f32"),
               lambda: amp.train_step(_loss, optax.sgd(0.1), storag="f32"),
               lambda: pl.RewriteOptions.make(storag="f32")):
    with pytest.raises(TypeError, match=r"unexpected options: storag "
                       r"\(nearest: storage; accepted: "):
      make()


def test_a_bad_value_names_the_accepted_ones_everywhere():
  for make in (lambda: amp.transform(_loss, dot_result="f16"),
               lambda: amp.train_step(_loss, optax.sgd(0.1),
                                      dot_result="f16")):
    with pytest.raises(ValueError, match=r"accepted: f32, compute"):
      make()
  assert cli.main(["-", "--dot-result", "f16"]) == 2


def test_defaults_follow_the_target():
  for target in ("cpu", "gpu", "tpu"):
    options = pl.RewriteOptions.make(target=target)
    for name, spec in contract.options().items():
      if "target_defaults" in spec:
        assert getattr(options, name) == spec["target_defaults"][target]


def test_the_docstring_lists_the_options_from_the_contract():
  for name in _user_options(stateful=False):
    assert f"``{name}``" in amp.transform.__doc__


def _stored_across_a_dot(x, w1, w2):
  e = jnp.exp(x @ w1)  # read again across the second dot: stored low
  return e * (x @ w2)


def test_storage_min_elements_reaches_the_pass_from_every_entry_point(
    tmp_path):
  """The option added by one row of the contract: 64x128 = 8192 elements
  are stored at the default threshold and at 8192, not above."""
  args = (jnp.ones((64, 64)), jnp.ones((64, 128)), jnp.ones((64, 128)))

  def stored(**options) -> int:
    report = amp.transform(_stored_across_a_dot, target="gpu",
                           **options).lower(*args).report()
    return sum(d.stored for d in report.decisions)
  assert stored() == 1
  assert stored(storage_min_elements=8192) == 1
  assert stored(storage_min_elements=8193) == 0
  with pytest.raises(ValueError, match="storage_min_elements must be an "
                     "integer of at least 1, got 0"):
    amp.transform(_stored_across_a_dot, storage_min_elements=0)

  import jax
  source = tmp_path / "storage.mlir"
  source.write_text(jax.jit(_stored_across_a_dot).lower(*args).as_text())
  for threshold, expected in (("8192", 1), ("8193", 0)):
    out = tmp_path / f"out-{threshold}.mlir"
    assert cli.main([str(source), "--target", "gpu", "--storage-min-elements",
                     threshold, "-o", str(out)]) == 0
    assert out.read_text().count("amp_stored") == expected
