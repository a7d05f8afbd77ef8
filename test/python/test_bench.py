"""bench/ is a package of the project: its scripts import the public API
and bench's own helpers, never test modules, never by editing sys.path, and
each has the --smoke mode `make bench-smoke` (part of `make test`) runs.

Reads the sources only (the smoke runs are `make bench-smoke`'s)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py")
                 if p.name not in ("__init__.py", "common.py"))
TEST_MODULES = {p.stem for p in (ROOT / "test" / "python").glob("*.py")}


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
  """Every module an import statement of `path` names, with its line."""
  names = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names += [(alias.name, node.lineno) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names.append((node.module, node.lineno))
      names += [(f"{node.module}.{alias.name}", node.lineno)
                for alias in node.names]
  return names


def _sys_path_edits(path: pathlib.Path) -> list[int]:
  """Lines that call a method of sys.path (insert, append, extend...)."""
  lines = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "path"
        and isinstance(node.func.value.value, ast.Name)
        and node.func.value.value.id == "sys"):
      lines.append(node.lineno)
  return lines


def test_bench_is_a_package():
  assert (BENCH / "__init__.py").is_file()
  assert SCRIPTS, "no benchmark scripts found"


@pytest.mark.parametrize("path", [*SCRIPTS, BENCH / "common.py"],
                         ids=lambda p: p.name)
def test_imports_public_api_and_bench_helpers(path):
  for name, line in _imports(path):
    top = name.split(".")[0]
    where = f"{path.name}:{line}: import of {name}"
    assert top not in TEST_MODULES, f"{where}: a test module"
    if top == "stablehlo_amp" and any(part.startswith("_")
                                      for part in name.split(".")[1:]):
      # Internals only in bench/common.py's amp_internals().
      assert path.name == "common.py", f"{where}: use bench.common"
    if top == "examples":
      assert path.name == "common.py", f"{where}: use bench.common.lm"
    if top in {p.stem for p in SCRIPTS} | {"common"}:
      raise AssertionError(f"{where}: import it as `from bench import ...`")


@pytest.mark.parametrize("path", [*SCRIPTS, BENCH / "common.py"],
                         ids=lambda p: p.name)
def test_no_sys_path_edits(path):
  edits = _sys_path_edits(path)
  if path.name == "gpu.py":
    # The one exception: wheels installed into a temporary directory on the
    # GPU machine (libraries, not this repository's code).
    assert len(edits) == 1, edits
    return
  assert not edits, f"{path.name}: sys.path edited at lines {edits}"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_script_has_a_smoke_mode(path):
  text = path.read_text()
  assert '"--smoke"' in text, f"{path.name} has no --smoke"
  assert 'if __name__ == "__main__":' in text


def test_make_test_runs_bench_smoke():
  makefile = (ROOT / "Makefile").read_text()
  stages = re.search(r"^TEST_STAGES := ((?:.*\\\n)*.*)$", makefile, re.M).group(1)
  assert "bench-smoke" in stages.replace("\\\n", " ").split()
  assert re.search(r"^test:.*\n(?:\t.*\n)*\t.*\$\(TEST_STAGES\)", makefile, re.M)
  assert re.search(r"^bench-smoke:", makefile, re.M)


def test_readme_commands_run_the_package():
  text = (BENCH / "README.md").read_text()
  stale = re.findall(r"python3? bench/\w+\.py", text)
  assert not stale, f"bench/README.md: {stale} (python -m bench.NAME)"
