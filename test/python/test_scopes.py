"""Per-layer control: `scopes={pattern: choice}` keeps a scope f32, forces
one into the compute dtype or makes it the only FP8 one, forward and
backward, from every entry point; a dot's own `precision=HIGHEST` is
honoured with no option; each bad input gets its error."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stablehlo_amp as amp
from stablehlo_amp._src import cli
from stablehlo_amp._src import contract
from stablehlo_amp._src import report as report_module

POLICY = "p=f32,c=bf16,o=f32"
F8_POLICY = POLICY + ",gemm=f8"
LOW, F32, _ = contract.precisions()


def _model(params, x, precision=None):
  with jax.named_scope("Net"):
    with jax.named_scope("mlp"):
      h = jnp.tanh(x @ params["w1"])
    with jax.named_scope("Block_1"):
      h = jnp.tanh(h @ params["w2"])
    with jax.named_scope("Block_2"):
      h = jnp.tanh(h @ params["w3"])
    with jax.named_scope("head"):
      return jnp.matmul(h, params["w4"], precision=precision)


def _loss(params, x):
  return jnp.mean(_model(params, x) ** 2)


def _highest_loss(params, x):
  return jnp.mean(_model(params, x, jax.lax.Precision.HIGHEST) ** 2)


@pytest.fixture(scope="module")
def args():
  keys = jax.random.split(jax.random.key(0), 5)
  params = {f"w{i}": jax.random.normal(keys[i], (32, 32)) / 6
            for i in range(1, 5)}
  return params, jax.random.normal(keys[0], (16, 32))


def _dots(lowered) -> list[tuple[str, str, str]]:
  """(scope, phase, operand element types) of each dot_general of the
  rewritten module, read from its text and locations."""
  text = lowered.as_text(debug_info=True)
  names = dict(re.findall(r'^(#loc\d+) = loc\("([^"]*)"', text, re.M))
  found = []
  for operands, loc in re.findall(
      r"stablehlo\.dot_general .*?: \((tensor<[^)]*)\) -> .* loc\((#loc\d+)\)",
      text):
    types = ",".join(re.findall(r"tensor<(?:[0-9?]+x)*(\w+)>", operands))
    where = report_module.OpDecision(op="", precision="", reason_id="",
                                     loc=f'loc("{names.get(loc, "")}")')
    found.append((where.scope, where.phase, types))
  return found


def _dot_decisions(report):
  return [d for d in report.decisions if d.op == "stablehlo.dot_general"]


def test_a_scope_in_f32_forward_and_backward(args):
  lowered = amp.value_and_grad(_loss, POLICY, target="gpu",
                               scopes={"head": "f32"}).lower(*args)
  dots = _dots(lowered)
  head = [d for d in dots if d[0] == "Net/head"]
  # The head's forward dot and both of its backward ones.
  assert sorted(phase for _, phase, _ in head) == ["backward", "backward",
                                                   "forward"]
  assert all(types == "f32,f32" for *_, types in head), head
  others = [d for d in dots if d[0] != "Net/head"]
  assert others and all(types == "bf16,bf16" for *_, types in others), dots
  for d in _dot_decisions(lowered.report()):
    if d.scope == "Net/head":
      assert (d.precision, d.reason_id) == (F32, "scope_f32")
      assert d.reason == "kept f32 by scopes['head']"
    else:
      assert d.precision == LOW
  assert "kept f32 by scopes['head']" in str(lowered.report())


def test_a_scope_kept_f32_is_close_to_f32(args):
  (value, grads), finite, _ = amp.value_and_grad(
      _loss, POLICY, scopes={"head": "f32"})(*args)
  assert finite
  want_value, want_grads = jax.value_and_grad(_loss)(*args)
  np.testing.assert_allclose(value, want_value, rtol=3e-2)
  for name in want_grads:
    np.testing.assert_allclose(grads[name], want_grads[name], rtol=5e-2,
                               atol=5e-3)


def test_a_regex_over_two_scopes_and_the_longest_match(args):
  scopes = {"Block_(1|2)": "compute", "Net/Block_2": "f32", "Net": "f32"}
  lowered = amp.value_and_grad(_loss, POLICY, target="gpu",
                               scopes=scopes).lower(*args)
  by_scope = {}
  for d in _dot_decisions(lowered.report()):
    by_scope.setdefault(d.scope, set()).add((d.precision, d.reason))
  # "Net/Block_2" matches 11 characters of Net/Block_2, "Block_(1|2)" 7,
  # "Net" 3: the longest match decides.
  assert by_scope["Net/Block_2"] == {(F32, "kept f32 by scopes['Net/Block_2']")}
  assert by_scope["Net/Block_1"] == {
      (LOW, "forced into the compute dtype by scopes['Block_(1|2)']")}
  assert by_scope["Net/mlp"] == {(F32, "kept f32 by scopes['Net']")}
  assert by_scope["Net/head"] == {(F32, "kept f32 by scopes['Net']")}


def test_only_the_f8_scopes_gemms_go_fp8(args):
  lowered = amp.value_and_grad(_loss, F8_POLICY, target="gpu",
                               fp8_min_size=0,
                               scopes={"mlp": "f8"}).lower(*args)
  report = lowered.report()
  fp8 = {d.scope for d in report.fp8_gemms}
  assert fp8 == {"Net/mlp"}
  kept = [d for d in _dot_decisions(report) if d.scope != "Net/mlp"]
  assert kept and all(d.gemm_reason_id == "scope" and
                      d.gemm_detail == "not in a scope marked f8"
                      for d in kept)
  # Without scopes, every one of these GEMMs is FP8.
  everything = amp.value_and_grad(_loss, F8_POLICY, target="gpu",
                                  fp8_min_size=0).lower(*args).report()
  assert len(everything.fp8_gemms) == len(_dot_decisions(everything))


def test_a_compute_scope_stays_out_of_fp8(args):
  report = amp.value_and_grad(_loss, F8_POLICY, target="gpu",
                              fp8_min_size=0,
                              scopes={"head": "compute"}).lower(
                                  *args).report()
  for d in _dot_decisions(report):
    if d.scope == "Net/head":
      assert d.fp8_index is None and d.gemm_detail == "scopes['head']"
    else:
      assert d.fp8_index is not None


def test_precision_highest_is_honoured_with_no_option(args):
  lowered = amp.value_and_grad(_highest_loss, POLICY,
                               target="gpu").lower(*args)
  head = [d for d in _dots(lowered) if d[0] == "Net/head"]
  assert len(head) == 3 and all(t == "f32,f32" for *_, t in head), head
  decisions = [d for d in _dot_decisions(lowered.report())
               if d.scope == "Net/head"]
  assert {d.reason_id for d in decisions} == {"precision_requested"}
  line = [d.where for d in decisions][0]
  assert line.startswith(__file__) and all(
      d.reason == f"precision=HIGHEST requested at {line}"
      for d in decisions)
  # The dot's own precision wins over an op-name override...
  named = amp.value_and_grad(_highest_loss, POLICY, target="gpu",
                             force_compute=["dot_general"]).lower(*args)
  assert {t for s, _, t in _dots(named) if s == "Net/head"} == {"f32,f32"}
  assert {t for s, _, t in _dots(named) if s != "Net/head"} == {"bf16,bf16"}
  # ...and a scope's choice over the dot's own precision.
  forced = amp.value_and_grad(_highest_loss, POLICY, target="gpu",
                              scopes={"head": "compute"}).lower(*args)
  assert all(t == "bf16,bf16" for *_, t in _dots(forced))


def test_precision_high_stays_f32_too(args):
  def loss(params, x):
    return jnp.mean(_model(params, x, jax.lax.Precision.HIGH) ** 2)
  report = amp.transform(loss, POLICY, target="gpu").lower(*args).report()
  head = [d for d in _dot_decisions(report) if d.scope == "Net/head"]
  assert head and all(d.reason.startswith("precision=HIGH requested at ")
                      for d in head)


def test_train_step_and_transform_take_scopes(args):
  params, x = args
  step = amp.train_step(_loss, optax.sgd(0.1), POLICY,
                        scopes={"head": "f32"})
  state, metrics = step(step.init(params), x)
  assert np.isfinite(float(metrics["loss"]))
  report = amp.transform(_loss, POLICY, target="gpu",
                         scopes={"head": "f32"}).lower(*args).report()
  assert {d.precision for d in _dot_decisions(report)
          if d.scope == "Net/head"} == {F32}


@pytest.mark.parametrize("scopes, error, message", [
    ({"hed": "f32"}, amp.RewriteError,
     r"pattern 'hed' matches no scope \(nearest: Net/head, "),
    ({"he(ad": "f32"}, ValueError,
     r"pattern 'he\(ad' is not a regular expression: parentheses"),
    ({"head": "bf16"}, ValueError,
     r"unknown choice 'bf16' for 'head' \(accepted: f32, compute, f8\)"),
    ({"head": "f8"}, ValueError,
     r"f8 puts a scope's GEMMs in FP8, and policy p=f32,c=bf16,o=f32 has "
     r"none: add gemm=f8"),
    ({"head": "f32", "hea.": "compute"}, amp.RewriteError,
     r"'head' and 'hea\.' match scope 'Net/head' equally"),
    ("head=f32", TypeError, r"scopes must be a dict \{pattern: choice\}"),
    ({"head": 3}, TypeError, r"maps patterns \(str\) to choices \(str\)"),
])
def test_each_bad_input_gets_its_error(args, scopes, error, message):
  with pytest.raises(error, match=message):
    amp.value_and_grad(_loss, POLICY, target="gpu",
                       scopes=scopes).lower(*args)


def test_a_module_without_scopes_says_so():
  with pytest.raises(amp.RewriteError, match=r"pattern 'head' matches no "
                     r"scope: the module's ops have no named scopes"):
    amp.transform(lambda w, x: x @ w, POLICY, scopes={"head": "f32"}).lower(
        jnp.ones((8, 8)), jnp.ones((4, 8)))


def test_the_cli_round_trips_scope(args, tmp_path, capsys):
  text = jax.jit(_loss).lower(*args).as_text(debug_info=True)
  path = tmp_path / "loss.mlir"
  path.write_text(text)
  out = tmp_path / "out.mlir"
  assert cli.main([str(path), "--target", "gpu", "--scope", "head=f32",
                   "--scope", "Block_(1|2)=compute", "-o", str(out)]) == 0
  want = amp.rewrite(text, POLICY, target="gpu",
                     scopes={"head": "f32", "Block_(1|2)": "compute"})
  assert out.read_text() == want
  assert want != amp.rewrite(text, POLICY, target="gpu")
  dots = re.findall(r"stablehlo\.dot_general .*?: \((.*?)\) ->", want)
  assert sum("xf32>, tensor" in d for d in dots) == 1  # the head's
  capsys.readouterr()
  with pytest.raises(SystemExit) as usage:
    cli.main([str(path), "--scope", "head"])
  assert usage.value.code == 2
  assert "expected PATTERN=CHOICE" in capsys.readouterr().err
  assert cli.main([str(path), "--target", "gpu", "--scope", "hed=f32",
                   "-o", str(tmp_path / "bad.mlir")]) != 0
  assert "matches no scope (nearest: Net/head" in capsys.readouterr().err


# -- flax linen: module paths are scopes ----------------------------------------


def test_a_flax_module_path(args):
  nn = pytest.importorskip("flax.linen")

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = jnp.tanh(nn.Dense(32, name="mlp")(x))
      x = jnp.tanh(nn.Dense(32, name="router")(x))
      return nn.Dense(32, name="head")(x)

  net = Net()
  x = args[1]
  params = net.init(jax.random.key(1), x)

  def loss(params, x):
    return jnp.mean(net.apply(params, x) ** 2)

  lowered = amp.value_and_grad(loss, POLICY, target="gpu", scopes={
      "Net/head": "f32", "router|head": "compute"}).lower(params, x)
  dots = _dots(lowered)
  assert {scope for scope, *_ in dots} == {"Net/mlp", "Net/router",
                                           "Net/head"}
  for scope, phase, types in dots:
    want = "f32,f32" if scope == "Net/head" else "bf16,bf16"
    assert types == want, (scope, phase, types)
  assert sorted(p for s, p, _ in dots if s == "Net/head") == [
      "backward", "backward", "forward"]
  report = lowered.report()
  reasons = {d.scope: d.reason for d in _dot_decisions(report)}
  assert reasons["Net/head"] == "kept f32 by scopes['Net/head']"
  assert reasons["Net/router"] == (
      "forced into the compute dtype by scopes['router|head']")
  fp8 = amp.value_and_grad(loss, F8_POLICY, target="gpu", fp8_min_size=0,
                           scopes={"mlp": "f8"}).lower(params, x).report()
  assert {d.scope for d in fp8.fp8_gemms} == {"Net/mlp"}
