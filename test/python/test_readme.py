"""The README's Python examples run, in order, as a new user would paste
them (one namespace, each block after the ones before it)."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


GUIDES = sorted((README.parent / "docs").glob("*.md"))


def _python_blocks(path: pathlib.Path = README) -> list[str]:
  text = path.read_text()
  blocks = []
  for match in re.finditer(r"^( *)```python\n(.*?)^\1```$", text,
                           re.MULTILINE | re.DOTALL):
    indent = len(match.group(1))
    blocks.append("\n".join(line[indent:] for line in
                            match.group(2).splitlines()))
  return blocks


def _sample_report() -> list[str]:
  """The lines of README's sample report (the block after "The report
  for this on a CPU machine:")."""
  text = README.read_text()
  match = re.search(r"The report for this on a CPU machine:\n\n```\n(.*?)"
                    r"^```$", text, re.MULTILINE | re.DOTALL)
  assert match, "README has no sample report"
  return match.group(1).splitlines()


def _run_blocks(path: pathlib.Path, namespace: dict) -> None:
  """Runs `path`'s Python blocks in order in `namespace`, as a new user
  would paste them; an error names the block."""
  for number, block in enumerate(_python_blocks(path)):
    try:
      exec(compile(block, f"{path.name} python block {number}", "exec"),
           namespace)
    except Exception as error:  # name the block that failed
      raise AssertionError(f"{path.name} python block {number} failed:\n"
                           f"{block}") from error


def test_the_readme_has_python_examples():
  assert len(_python_blocks()) >= 5


def test_the_readme_python_examples_run(capsys):
  pytest.importorskip("optax")
  pytest.importorskip("flax")
  _run_blocks(README, {"__name__": "readme"})
  printed = capsys.readouterr().out
  # What the README says these print (the first on a CPU machine): every
  # line of its sample report, in order ("..." stands for lines left out).
  import jax
  if jax.default_backend() == "cpu":
    sample = _sample_report()
    assert sample[0] in printed
    start = printed.index(sample[0])
    lines = printed[start:].splitlines()
    at = 0
    for expected in sample:
      if expected.strip() == "...":
        continue
      assert expected in lines[at:], (
          f"README's sample report says {expected!r}; the report printed:\n"
          + "\n".join(lines[:len(sample) + 10]))
      at = lines.index(expected, at) + 1
  assert "FP8 GEMMs:" in printed
  assert "calibration: tolerance 0.0001" in printed


@pytest.mark.parametrize("guide", [g for g in GUIDES if _python_blocks(g)],
                         ids=lambda g: g.name)
def test_the_guides_python_examples_run(guide):
  """Each guide's Python blocks run in order, in a namespace of their own
  (on however many devices this process has: one, in the test run)."""
  pytest.importorskip("optax")
  _run_blocks(guide, {"__name__": guide.stem})
