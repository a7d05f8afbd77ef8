"""Shared test configuration.

- Prints the table of figures the program tests measured (for the notes).
- With AMP_REQUIRE_TEST_DEPS=1 (the Makefile sets it, so `make test` and CI
  run with it), `pytest.importorskip` fails instead of skipping: a test
  dependency missing from the environment is an error there, not a silently
  smaller run. Outside it, a missing optional dependency skips as usual.
  `missing_dependency` does the same for what is no module (a tool, root).
"""

import os
from typing import NoReturn

import pytest

from programs import FIGURES, markdown_table

REQUIRE_TEST_DEPS = os.environ.get("AMP_REQUIRE_TEST_DEPS", "") not in (
    "", "0")

if REQUIRE_TEST_DEPS:
  _importorskip = pytest.importorskip

  def _importorfail(modname, *args, **kwargs):
    try:
      return _importorskip(modname, *args, **kwargs)
    except pytest.skip.Exception as skipped:
      pytest.fail(f"test dependency missing: {skipped} (AMP_REQUIRE_TEST_DEPS "
                  "is set: install the test dependencies, or unset it to "
                  "skip these tests)", pytrace=False)

  pytest.importorskip = _importorfail


def missing_dependency(what: str, remedy: str) -> NoReturn:
  """Ends a test that needs `what`, which this machine lacks (a tool, a
  privilege): it fails where test dependencies are required, as a
  missing module does, and skips elsewhere. `remedy` says how to provide
  it."""
  if REQUIRE_TEST_DEPS:
    pytest.fail(f"test dependency missing: {what} (AMP_REQUIRE_TEST_DEPS "
                f"is set: {remedy}, or unset it to skip these tests)",
                pytrace=False)
  pytest.skip(what)


def pytest_report_header(config):
  del config
  if REQUIRE_TEST_DEPS:
    return "AMP_REQUIRE_TEST_DEPS: a missing test dependency fails its tests"
  return None


def pytest_terminal_summary(terminalreporter):
  if FIGURES:
    terminalreporter.write_sep("-", "stablehlo-amp program figures")
    terminalreporter.write_line(markdown_table())
