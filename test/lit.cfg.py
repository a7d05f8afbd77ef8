# lit configuration for the stablehlo-amp FileCheck tests.
#
# `make lit` runs `lit -sv test/passes test/cli test/plugin`; lit walks up to
# this file for each of those directories. Tools resolve through PATH: the
# project venv (`amp-opt`) first, then LLVM 22 (`FileCheck`, `mlir-opt`,
# `not`), then whatever PATH lit was started with.

import os
import shutil
import subprocess
import sys

import lit.formats

config.name = "stablehlo-amp"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["lit.cfg.py", "python", "Inputs", "Output"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
# Output/ next to each test directory (ignored by git).
config.test_exec_root = config.test_source_root

repo_root = os.path.dirname(config.test_source_root)
llvm_prefix = os.environ.get("LLVM_PREFIX", "/usr/lib/llvm-22")
search_path = [
    os.path.join(repo_root, ".venv", "bin"),
    # The interpreter running lit (the venv's when lit comes from the venv).
    os.path.dirname(os.path.abspath(sys.executable)),
    os.path.join(llvm_prefix, "bin"),
]
config.environment["PATH"] = os.pathsep.join(
    [p for p in search_path if os.path.isdir(p)] +
    [config.environment.get("PATH", os.environ.get("PATH", ""))])
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"
# Every amp-opt run imports JAX; pin the backend so that tests which rely on
# the default target behave the same on machines with and without a GPU.
config.environment["JAX_PLATFORMS"] = "cpu"
# PYTHONPATH and the sanitizer settings carry `make sanitize`'s instrumented
# build into every tool the tests run.
for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "PYTHONPATH", "LD_PRELOAD",
             "ASAN_OPTIONS", "UBSAN_OPTIONS"):
  if name in os.environ:
    config.environment[name] = os.environ[name]

for tool in ("amp-opt", "FileCheck", "mlir-opt", "not"):
  if not shutil.which(tool, path=config.environment["PATH"]):
    lit_config.fatal(f"'{tool}' not found on PATH "
                     f"({config.environment['PATH']}); run `make build`")


def _plugin_path() -> str:
  """The pass plugin, as the installed package reports it."""
  code = "import stablehlo_amp; print(stablehlo_amp.plugin_path())"
  pythons = [os.path.join(repo_root, ".venv", "bin", "python"),
             sys.executable,
             shutil.which("python3", path=config.environment["PATH"])]
  errors = []
  for python in pythons:
    if not python or not os.path.exists(python):
      continue
    result = subprocess.run([python, "-c", code], capture_output=True,
                            text=True, env=dict(config.environment))
    if result.returncode == 0 and result.stdout.strip():
      return result.stdout.strip()
    errors.append(f"{python}: {result.stderr.strip().splitlines()[-1:]}")
  lit_config.fatal("cannot locate the stablehlo-amp pass plugin "
                   f"({'; '.join(errors) or 'no python found'}); "
                   "run `make build`")


amp_plugin = _plugin_path()
if not os.path.exists(amp_plugin):
  lit_config.fatal(f"pass plugin {amp_plugin} does not exist; run `make build`")
config.substitutions.append(("%amp_plugin", amp_plugin))
