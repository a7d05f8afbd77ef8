"""The C++ library is the one source of truth for what the passes and the
Python package share: the Python sources hold none of its literals, the
contract the extension exports matches the passes' own declarations, and
the pass sources keep their functions short."""

from __future__ import annotations

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.extend.mlir import ir

import mlir_checks
import stablehlo_amp as amp
from stablehlo_amp import _amp
from stablehlo_amp._src import contract
from stablehlo_amp._src import pipeline as pl
from stablehlo_amp._src import report as report_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_SOURCES = sorted((ROOT / "python" / "stablehlo_amp").rglob("*.py"))
PASS_SOURCES = sorted((ROOT / "passes").glob("*.cpp"))


def _python_text() -> dict[pathlib.Path, str]:
  assert PYTHON_SOURCES, "no Python sources found"
  return {path: path.read_text() for path in PYTHON_SOURCES}


@pytest.mark.parametrize("role", sorted(contract.document()["attributes"]))
def test_no_attribute_name_is_written_in_python(role):
  name = contract.attribute(role)
  found = [str(p.relative_to(ROOT)) for p, text in _python_text().items()
           if re.search(rf"['\"]{re.escape(name)}['\"]", text)]
  assert not found, f"{name} is written in {found}; read it from the contract"


def test_report_readers_compare_no_precision_or_fp8_text_of_their_own():
  # The report and calibration read precision ids, reason ids and FP8
  # ineligibility ids from the contract; FP8 reasons are ids, not prose
  # matched by prefix.
  readers = {p: t for p, t in _python_text().items()
             if p.name in ("report.py", "calibration.py")}
  assert len(readers) == 2
  for path, text in readers.items():
    for precision in contract.precisions():
      assert not re.search(rf"==\s*['\"]{precision}['\"]", text), (
          f"{path.name} compares with the precision id {precision!r}")
    assert "not eligible" not in text, f"{path.name} matches FP8 prose"
    assert "matrix_multiply\"" not in text or path.name != "report.py"


def test_every_fp8_ineligibility_has_an_id_and_a_text():
  reasons = contract.document()["decisions"]["fp8_reasons"]
  assert set(reasons) == {"dimensions_unreadable", "dynamic_shapes",
                          "batch_dimensions", "size_not_multiple_of_16",
                          "both_e5m2", "contraction_not_multiple_of_32",
                          "too_small", "kept", "scope"}
  assert all(contract.fp8_reason_text(r) for r in reasons)


def test_every_entry_points_default_policy_is_the_contracts():
  import inspect
  general, training = (contract.default_policy(),
                       contract.default_policy(training=True))
  assert (general, training) == ("p=f32,c=bf16,o=f32", "p=f32,c=f16,o=f32")
  for entry, expected in ((amp.transform, general), (amp.rewrite, general),
                          (amp.train_step, training),
                          (amp.value_and_grad, training)):
    default = inspect.signature(entry).parameters["policy"].default
    assert default == expected, (entry.__name__, default)
  assert contract.default(contract.INSERT_CONVERTS, "policy") == general
  # And no entry point writes a policy default of its own.
  for path, text in _python_text().items():
    assert not re.search(r"policy: Policy \| str = ['\"]", text), path.name


def test_an_unknown_reason_id_is_refused():
  assert contract.reasons("matrix_multiply") == ("matrix_multiply",)
  with pytest.raises(KeyError, match="matrix_multiplication"):
    contract.reasons("matrix_multiplication")


# The loss-scale defaults as they could be spelled in Python.
_DEFAULT_SPELLINGS = {
    "growth_interval": [r"\b2000\b"],
    "max_scale": [r"\b16777216(\.0)?\b", r"2(\.0)?\s*\*\*\s*24\b"],
    "initial_scale": [r"\b32768(\.0)?\b", r"2(\.0)?\s*\*\*\s*15\b"],
}


@pytest.mark.parametrize("field", sorted(_DEFAULT_SPELLINGS))
def test_no_loss_scale_default_is_written_in_python(field):
  found = []
  for path, text in _python_text().items():
    for pattern in _DEFAULT_SPELLINGS[field]:
      if re.search(pattern, text):
        found.append(f"{path.relative_to(ROOT)}: {pattern}")
  assert not found, f"{field}'s default is written in Python: {found}"


def test_python_defaults_are_the_contracts():
  defaults = contract.loss_scale_defaults()
  scale = amp.DynamicLossScale()
  assert float(scale.loss_scale) == defaults["initial_scale"] == 2.0 ** 15
  assert scale.growth_interval == defaults["growth_interval"] == 2000
  assert scale.growth_factor == defaults["growth_factor"] == 2.0
  assert scale.backoff_factor == defaults["backoff_factor"] == 0.5
  assert scale.min_scale == defaults["min_scale"] == 1.0
  assert scale.max_scale == defaults["max_scale"] == 2.0 ** 24
  assert str(amp.Policy.parse(contract.default(contract.INSERT_CONVERTS,
                                               "policy"))) == \
      "p=f32,c=bf16,o=f32"


def test_loss_scale_fields_are_the_keywords_and_the_pass_options():
  """One list of named fields: the constructor's keywords (with the
  contract's defaults), the keys `pass_options` gives the options under,
  and the pass's own configuration options."""
  import inspect
  fields = contract.loss_scale_fields()
  names = [field["name"] for field in fields]
  keywords = {name: p.default for name, p in
              inspect.signature(amp.DynamicLossScale).parameters.items()
              if p.kind is p.KEYWORD_ONLY and name != "counter"}
  assert list(keywords) == names
  assert keywords == {name: value for name, value in
                      contract.loss_scale_defaults().items()
                      if name != "initial_scale"}
  options = set(contract.document()["passes"][contract.LOSS_SCALE]["options"])
  # (check-state and check-grads are train_step's skip_nonfinite and
  # check_grads, entry options.)
  assert options - {field["option"] for field in fields} == {
      "mode", "seed-arg", "gradient-results", "state-results", "check-state",
      "check-grads"}
  assert contract.options()["skip_nonfinite"]["option"] == "check-state"
  assert contract.options()["check_grads"]["option"] == "check-grads"
  ls = amp.DynamicLossScale(growth_interval=7)
  assert ls.pass_options() == {
      "mode": "dynamic",
      **{field["option"]: ls.config()[field["name"]] for field in fields}}
  assert ls.config()["growth_interval"] == 7
  assert {field["type"] for field in fields} == {"int", "float"}


def _declared_options() -> dict[str, set[str]]:
  """Pass name -> option names, from the reference TableGen generates
  (passes.md, what `amp-opt --help` prints)."""
  text = (pathlib.Path(amp.__file__).parent / "passes.md").read_text()
  options: dict[str, set[str]] = {}
  current = None
  for line in text.splitlines():
    heading = re.match(r"^#+ `-?([a-z0-9-]+)`", line)
    if heading:
      current = heading.group(1)
      options[current] = set()
      continue
    option = re.match(r"^-([a-z0-9-]+)\s*:", line)
    if option and current:
      options[current].add(option.group(1))
  return options


def test_contract_names_the_options_the_passes_declare():
  declared = _declared_options()
  passes = contract.document()["passes"]
  assert set(passes) <= set(declared), (set(passes), set(declared))
  for name, entry in passes.items():
    assert set(entry["options"]) == declared[name], name


def test_contract_choices_are_what_the_passes_accept():
  choices = [name for name, spec in contract.options().items()
             if spec["kind"] == "choice"]
  assert {"level", "target", "dot_result", "storage",
          "fp8_scaling"} <= set(choices)
  for name in choices:
    spec = contract.options()[name]
    assert tuple(spec["choices"]) == contract.choices(spec["pass"],
                                                      spec["option"])
    for choice in spec["choices"]:
      assert _amp.canonical_option(name, choice, "gpu") == choice
    with pytest.raises(ValueError, match="accepted: " + ", ".join(
        spec["choices"])):
      _amp.canonical_option(name, "nonsense", "gpu")


def test_validation_is_one_code_path():
  """The constructor and the pass reject the same values with the same
  words (the pass in its option spelling)."""
  with pytest.raises(ValueError) as python:
    amp.DynamicLossScale(min_scale=float("inf"), max_scale=float("inf"))
  assert "invalid min_scale: must be finite and positive, got inf" in str(
      python.value)
  module = jax.jit(lambda w: jnp.sum(w ** 2)).lower(jnp.ones(4)).as_text()
  with pytest.raises(amp.RewriteError) as pass_error:
    amp.rewrite_module(module, "p=f32,c=f16", loss_scale={
        "mode": "dynamic", "min_scale": "inf", "max_scale": "inf"})
  assert ("invalid option 'min-scale': must be finite and positive, got inf"
          in str(pass_error.value))


def test_the_loss_scale_layout_is_what_the_pass_appends():
  step = amp.train_step(lambda w, b: jnp.mean((b @ w) ** 2), optax.sgd(0.1),
                        "p=f32,c=f16,o=f32")
  state = step.init(jnp.ones((8, 8)))
  text = step.lower(state, jnp.ones((4, 8))).as_text()
  main = next(line for line in text.splitlines()
              if "func.func public @main" in line)
  arguments, results = main.split(") -> (")
  layout = contract.loss_scale_layout("dynamic")
  assert re.findall(r"\{(amp\.[a-z_]+)\}", arguments) == list(
      layout["arguments"])
  assert re.findall(r"\{(amp\.[a-z_]+)\}", results) == list(layout["results"])


def _function_lengths(path: pathlib.Path) -> list[tuple[str, int]]:
  """(signature, body lines) of every function defined in a C++ file: a
  line ending in `{` that closes a parameter list opens a body, and braces
  are balanced from there (comments and strings hold no braces here)."""
  lines = path.read_text().splitlines()
  functions, i = [], 0
  while i < len(lines):
    line = lines[i]
    stripped = line.strip()
    is_function = (stripped.endswith("{") and ")" in stripped and
                   not stripped.startswith(("if", "for", "while", "switch",
                                            "else", "}", "case", "//")) and
                   "=" not in stripped.split("(")[0] and
                   not re.search(r"\[[^\]]*\]\s*\(", stripped))
    if not is_function:
      i += 1
      continue
    depth, start = 0, i
    while i < len(lines):
      depth += lines[i].count("{") - lines[i].count("}")
      i += 1
      if depth == 0:
        break
    functions.append((stripped, i - start))
  return functions


def test_no_function_in_passes_is_longer_than_about_100_lines():
  found = [(path.name, name, n) for path in PASS_SOURCES
           for name, n in _function_lengths(path)]
  assert len(found) > 50, "the scanner found too few functions"
  long = [f for f in found if f[2] > 100]
  assert not long, long


# -- the report's schema -------------------------------------------------------

def _schema_program(x, w, v, w2):
  """Writes every decision key: a sum reduction kept f32 (`detail`), a
  lowered dot (`group`), exp stored in bf16 across a dot (`stored`), an FP8
  dot (`gemm`, `fp8`) and one whose 30 rows keep it bf16 (`gemm_reason`,
  `gemm_detail`); with numerics="stats", every low-precision dot's row in
  the statistics (`gemm_stats`, `gemm_stats_formats`)."""
  h = jnp.exp(x @ w) * (x @ w2)
  return h.sum() + (v @ w).sum()


_SCHEMA_ARGS = (jnp.ones((64, 64)), jnp.ones((64, 128)), jnp.ones((30, 64)),
                jnp.ones((64, 128)))
_SCHEMA_POLICY = "p=f32,c=bf16,o=f32,gemm=f8"


@pytest.fixture(scope="module")
def report_json() -> str:
  """The report JSON the extension hands over for `_schema_program`, taken
  on its way into report.py from a real `amp.transform(...).lower(...)`."""
  captured = []
  original = report_module.Report.from_json.__func__

  def capture(cls, text, **info):
    captured.append(text)
    return original(cls, text, **info)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(report_module.Report, "from_json", classmethod(capture))
    # rewrite_module: the statistics' GEMM rows (numerics="stats") are
    # results only a training step or a module rewrite returns.
    amp.rewrite_module(jax.jit(_schema_program).lower(*_SCHEMA_ARGS).as_text(),
                       _SCHEMA_POLICY, target="gpu", fp8_min_size=0,
                       numerics="stats").report
  assert len(captured) == 1
  return captured[0]


def _declared(keys) -> set[str]:
  return set(keys._asdict().values())


def _same_keys(used: set[str], keys, verb: str) -> None:
  """`used` is exactly the contract's `keys`, or the failure says which
  differ."""
  undeclared = sorted(used - _declared(keys))
  unused = sorted(_declared(keys) - used)
  assert not undeclared, f"{verb} but not in the contract: {undeclared}"
  assert not unused, f"in the contract but not {verb}: {unused}"


def test_the_extension_writes_exactly_the_report_keys_of_the_contract(
    report_json):
  data = json.loads(report_json)
  record_keys = set().union(*(record.keys() for record in
                              data[contract.report_keys().ops]))
  # Every key written is declared, and the program writes every declared key
  # (so the contract declares none that nothing writes).
  for written, keys in ((set(data), contract.report_keys()),
                        (record_keys, contract.report_op_keys())):
    _same_keys(written, keys, "written")


def test_the_decision_attribute_has_exactly_the_keys_of_the_contract():
  """The `amp.decision` dictionaries the passes write, read before the
  extension's report turns them into JSON."""
  text = jax.jit(_schema_program).lower(*_SCHEMA_ARGS).as_text()
  policy = amp.Policy.parse(_SCHEMA_POLICY)
  options = pl.RewriteOptions.make(target="gpu", fp8_min_size=0,
                                   numerics="stats")
  context = pl.ir_context()
  with context:
    module = pl.parse_module(text, context, "<schema>", pl.SourceForm())
    generic = pl.generic_text(module, "<schema>")
  ok, output, _, diagnostics = _amp.run_pipeline(
      generic, pl.build_pipeline(policy, options, report=True), "<schema>",
      False)
  assert ok, diagnostics
  written = set()
  with context:
    for op in mlir_checks.walk(ir.Module.parse(output).operation):
      if contract.attribute("decision") in op.attributes:
        decision = ir.DictAttr(op.attributes[contract.attribute("decision")])
        written |= {decision[i].name for i in range(len(decision))}
  _same_keys(written, contract.decision_keys(), "written")
  assert _declared(contract.decision_keys()) < _declared(
      contract.report_op_keys())


class _Reads(dict):
  """A JSON object that notes each key read from it into `seen`."""

  def __init__(self, data: dict, seen: set[str]):
    super().__init__(data)
    self.seen = seen

  def __getitem__(self, key):
    self.seen.add(key)
    return super().__getitem__(key)

  def get(self, key, default=None):
    self.seen.add(key)
    return super().get(key, default)

  def __contains__(self, key):
    self.seen.add(key)
    return super().__contains__(key)


def test_report_py_reads_exactly_the_report_keys_of_the_contract(report_json):
  """A key report.py reads that the contract does not declare (a typo read
  with `.get` would silently give its default) fails here, and so does a
  declared key report.py never reads."""
  seen_report, seen_op = set(), set()
  ops_key = contract.report_keys().ops

  def loads(text):
    data = json.loads(text)
    data[ops_key] = [_Reads(record, seen_op) for record in data[ops_key]]
    return _Reads(data, seen_report)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(report_module, "json", type("Json", (), {
        "loads": staticmethod(loads)}))
    report = report_module.Report.from_json(
        report_json, policy=_SCHEMA_POLICY, level="O1", target="gpu")
  _same_keys(seen_report, contract.report_keys(), "read")
  _same_keys(seen_op, contract.report_op_keys(), "read")
  # What was read is what the program decided.
  assert report.fp8_gemms and report.stored_low and report.groups
  assert {d.gemm_reason_id for d in report.decisions} >= {
      "size_not_multiple_of_16"}
  assert any(d.detail for d in report.decisions)


def test_report_py_writes_no_report_key_of_its_own():
  """report.py reads the JSON only through the contract's keys: no
  subscript, `.get` or `in` with a key literal."""
  text = (ROOT / "python" / "stablehlo_amp" / "_src" / "report.py").read_text()
  keys = _declared(contract.report_keys()) | _declared(
      contract.report_op_keys())
  literal = r"""["'](%s)["']""" % "|".join(map(re.escape, sorted(keys)))
  reads = [m[0] for m in re.finditer(
      rf"\[\s*{literal}\s*\]|\.get\(\s*{literal}|"
      rf"{literal}\s+(?:not\s+)?in\b", text)]
  assert not reads, f"report.py reads keys by literal: {reads}"
