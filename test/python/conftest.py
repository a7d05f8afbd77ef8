"""Prints the table of figures the program tests measured (for the notes)."""

from programs import FIGURES, markdown_table


def pytest_terminal_summary(terminalreporter):
  if FIGURES:
    terminalreporter.write_sep("-", "stablehlo-amp program figures")
    terminalreporter.write_line(markdown_table())
