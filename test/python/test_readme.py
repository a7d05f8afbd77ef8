"""The README's and the guides' Python examples run, in order, as a new user
would paste them (the README's in one namespace, each guide's in one of its
own); docs/reference.md is what its generator prints; links resolve."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"
REFERENCE = DOCS / "reference.md"


GUIDES = sorted(DOCS.glob("*.md"))

# What a guide's examples print, beyond running: strings that must appear.
GUIDE_PRINTS = {
    "fp8.md": ["FP8 GEMMs:"],
    "calibration.md": ["calibration: tolerance 0.0001"],
    # The walk-through's three diagnoses, as the guide shows them.
    "numerics.md": [
        "First non-finite: the batch held a NaN (batch[0]), before the step "
        "computed anything.",
        "(bf16 overflow, then NaN: max finite 3.38953e+38, f32's too: not a "
        "precision problem)",
        "First non-finite: backward of `log_softmax` (neg, reduce_sum, "
        "reshape, div, ...) at numerics.md python block",
        "(f16 overflow: max finite 65504)"],
}


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
  assert len(_python_blocks()) >= 2


def test_the_readme_python_examples_run(capsys):
  pytest.importorskip("optax")
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


@pytest.mark.parametrize("guide", [g for g in GUIDES if _python_blocks(g)],
                         ids=lambda g: g.name)
def test_the_guides_python_examples_run(guide, capsys):
  """Each guide's Python blocks run in order, in a namespace of their own
  (on however many devices this process has: one, in the test run), and
  print what the guide says they print."""
  pytest.importorskip("optax")
  if any(re.search(r"^\s*(import|from) flax", block, re.MULTILINE)
         for block in _python_blocks(guide)):
    pytest.importorskip("flax")
  _run_blocks(guide, {"__name__": guide.stem})
  printed = capsys.readouterr().out
  for expected in GUIDE_PRINTS.get(guide.name, []):
    assert expected in printed, (
        f"{guide.name}'s examples should print {expected!r}; they printed:\n"
        + printed)


def test_the_guides_that_check_prints_exist():
  for name in GUIDE_PRINTS:
    assert _python_blocks(DOCS / name), f"docs/{name} has no Python blocks"


def test_the_reference_is_what_its_generator_prints():
  """docs/reference.md is generated from the contract, Passes.td and
  amp-opt's parser: an option, flag or pass added there and missing from
  the file fails here until the file is regenerated."""
  from stablehlo_amp._src import reference
  expected = reference.markdown()
  assert REFERENCE.read_text() == expected, (
      f"docs/reference.md is out of date: run `{reference.COMMAND}` from "
      "the repository root")


def test_amp_opt_md_shows_the_parsers_usage():
  from stablehlo_amp._src import reference
  text = (DOCS / "amp-opt.md").read_text()
  match = re.search(r"## `amp-opt`\n\n```\n(.*?)\n```", text, re.DOTALL)
  assert match, "docs/amp-opt.md has no usage block under ## `amp-opt`"
  assert match[1] == reference.amp_opt_usage(), (
      "docs/amp-opt.md's usage block is out of date: replace it with what "
      f"`{reference.USAGE_COMMAND}` prints")


def test_every_amp_opt_flag_is_in_the_reference():
  from stablehlo_amp._src import cli
  help_text = cli._build_parser().format_help()
  options = help_text.split("\npolicy grammar:")[0]  # before the pass docs
  flags = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", options))
  assert {"--policy", "--pass-pipeline", "--storage"} <= flags
  text = REFERENCE.read_text()
  missing = sorted(flag for flag in flags
                   if not re.search(rf"`{re.escape(flag)}[ `]", text))
  assert not missing, f"amp-opt flags missing from docs/reference.md: {missing}"


def _anchors(path: pathlib.Path) -> set[str]:
  """The anchors GitHub makes of `path`'s headings."""
  anchors: set[str] = set()
  seen: dict[str, int] = {}
  in_fence = False
  for line in path.read_text().splitlines():
    if line.lstrip().startswith("```"):
      in_fence = not in_fence
    if in_fence:
      continue
    heading = re.match(r"^#{1,6} (.*)$", line)
    if not heading:
      continue
    slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
    slug = slug.replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f"{slug}-{count}")
  return anchors


@pytest.mark.parametrize("page", [README, README.parent / "bench" /
                                  "README.md", *GUIDES],
                         ids=lambda p: str(p.relative_to(README.parent)))
def test_links_resolve(page):
  """Every relative link of the README, bench/README.md and the guides
  names a file of the repository (and a heading of it), and none leaves
  the repository."""
  root = README.parent.resolve()
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target):
      continue
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    assert resolved.is_relative_to(root), f"{target} leaves the repository"
    assert resolved.exists(), f"{page.name}: {target} does not exist"
    if anchor and resolved.suffix == ".md":
      assert anchor in _anchors(resolved), (
          f"{page.name}: {target}: no heading makes #{anchor}")
