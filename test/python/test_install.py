"""Packaging checks on the installed stablehlo-amp (the project venv's build,
or the wheel from `make wheel` in `make test-jax-oldest`'s venv).

What is checked: the extension needs only the C and C++ runtimes; the plugin
ships ungrafted, needing LLVM 22's libMLIR/libLLVM; the JAX range declared in
the package metadata and pyproject.toml is the one jax_compat enforces, with
a clear error outside it; with LLVM 22 hidden from the machine (a mount
namespace), transform, train_step and amp-opt work and plugin_path() says
which libraries are missing; CI runs fail on missing test dependencies.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import stablehlo_amp as amp
from stablehlo_amp import _amp
from stablehlo_amp._src import jax_compat
from stablehlo_amp._src import plugin as amp_plugin

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(amp.__file__).parent
# The C runtime, the C++ runtime and the dynamic loader, on any Linux arch.
RUNTIME = re.compile(r"(libc|libm|libstdc\+\+|libgcc_s)\.so\.\d+$|"
                     r"ld-linux[-\w.]*\.so\.\d+$")


def _readelf_needed(path) -> list[str]:
  out = subprocess.run(["readelf", "-d", str(path)], capture_output=True,
                       text=True, check=True).stdout
  return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


# -- what the binaries link against ------------------------------------------------


def test_extension_needs_only_the_c_and_cxx_runtimes():
  needed = amp_plugin.needed_libraries(_amp.__file__)
  assert needed and all(RUNTIME.match(name) for name in needed), needed
  assert not any(name.startswith(("libMLIR", "libLLVM")) for name in needed)


def test_plugin_ships_ungrafted_against_llvm_22():
  plugin = amp_plugin.plugin_path(check=False)
  assert pathlib.Path(plugin).parent == PACKAGE
  needed = amp_plugin.needed_libraries(plugin)
  llvm = [name for name in needed if name.startswith(("libMLIR", "libLLVM"))]
  # Debian's sonames are versioned (libMLIR.so.22.1), the PyPI wheels' not.
  assert sorted(name.split(".so")[0] for name in llvm) == ["libLLVM",
                                                           "libMLIR"], needed
  assert all(RUNTIME.match(name) for name in needed if name not in llvm)
  # auditwheel grafted nothing: no stablehlo_amp.libs beside the package.
  grafted = list(PACKAGE.parent.glob("stablehlo_amp*.libs"))
  assert not grafted, grafted


@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")
def test_the_plugin_knows_the_mlir_opt_it_loads_into():
  mlir_opt = amp.plugin_mlir_opt()
  assert os.access(mlir_opt, os.X_OK), mlir_opt
  # That mlir-opt loads the plugin and lists our passes.
  out = subprocess.run([mlir_opt, f"--load-pass-plugin={amp.plugin_path()}",
                        "--help"], capture_output=True, text=True, check=True)
  assert "--amp-insert-converts" in out.stdout


def test_plugin_tests_use_that_mlir_opt_whatever_path_holds(tmp_path):
  """Another LLVM 22's mlir-opt first on PATH (and in AMP_LLVM_BIN) must not
  be the one the plugin tests run."""
  impostor = tmp_path / "bin"
  impostor.mkdir()
  fake = impostor / "mlir-opt"
  fake.write_text("#!/bin/sh\necho 'Failed to load passes from the "
                  "impostor' >&2\nexit 1\n")
  fake.chmod(0o755)
  # FileCheck and not from the LLVM that make uses, else the plugin's.
  llvm_bin = os.environ.get("AMP_LLVM_BIN") or os.path.dirname(
      amp.plugin_mlir_opt())
  env = dict(os.environ, PATH=f"{impostor}{os.pathsep}{os.environ['PATH']}",
             AMP_LLVM_BIN=f"{impostor}{os.pathsep}{llvm_bin}")
  pytest.importorskip("lit")
  result = subprocess.run([sys.executable, "-c",
                           "import sys; from lit.main import main; main()",
                           "-q", str(REPO / "test" / "plugin")],
                          capture_output=True, text=True, env=env)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "impostor" not in result.stdout + result.stderr


def test_needed_libraries_agree_with_readelf():
  for path in (_amp.__file__, amp_plugin.plugin_path(check=False)):
    assert amp_plugin.needed_libraries(path) == _readelf_needed(path)


# -- the declared JAX range ---------------------------------------------------------


def _specifiers(requirement: str) -> tuple[str, set[str]]:
  match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*\(?([^;)]*)\)?", requirement)
  name, specs = match.group(1).lower(), match.group(2)
  return name, {s.replace(" ", "") for s in specs.split(",") if s.strip()}


def _jax_requirements(requirements) -> dict[str, set[str]]:
  found = dict(_specifiers(r) for r in requirements)
  return {name: found.get(name) for name in ("jax", "jaxlib")}


def test_declared_jax_range_is_the_one_jax_compat_enforces():
  supported = {s for s in jax_compat.SUPPORTED.split(",")}
  expected = {"jax": supported, "jaxlib": supported}
  installed = importlib.metadata.requires("stablehlo-amp")
  assert _jax_requirements(installed) == expected, installed
  pyproject = REPO / "pyproject.toml"
  if pyproject.exists():  # a source checkout
    text = pyproject.read_text()
    dependencies = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text,
                             re.M | re.S).group(1)
    declared = re.findall(r'"([^"]+)"', dependencies)
    assert _jax_requirements(declared) == expected, declared


def test_version_check_accepts_the_range_and_names_it_outside():
  floor = re.search(r">=([\d.]+)", jax_compat.SUPPORTED).group(1)
  limit = re.search(r"<([\d.]+)", jax_compat.SUPPORTED).group(1)
  major, minor, patch = (int(p) for p in (floor.split(".") + ["0"])[:3])
  lmajor, lminor = (int(p) for p in limit.split(".")[:2])
  jax_compat.check_version(floor)
  jax_compat.check_version(f"{lmajor}.{lminor - 1}.99")
  below = [f"{major}.{minor}.{patch - 1}" if patch else
           f"{major}.{minor - 1}.99", "0.4.30"]
  for version in below + [limit, f"{lmajor}.{lminor}.0.1",
                          f"{lmajor + 1}.0.0"]:
    with pytest.raises(jax_compat.UnsupportedJaxError) as error:
      jax_compat.check_version(version)
    assert jax_compat.SUPPORTED in str(error.value)
    assert version in str(error.value)


# -- a machine without LLVM 22 --------------------------------------------------------

# Runs in the mount namespace, with a sanitized environment: a small MLP
# through amp.transform (bf16 dots, close to f32), a few amp.train_step steps,
# amp-opt on a file, and plugin_path().
_WITHOUT_LLVM = textwrap.dedent(r"""
    import ctypes, pathlib, subprocess, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    import stablehlo_amp as amp
    from stablehlo_amp._src.plugin import PluginUnavailableError, needed_libraries

    plugin = amp.__path__[0] + "/AmpPassPlugin.so"
    llvm = [n for n in needed_libraries(plugin) if n.startswith(("libMLIR", "libLLVM"))]
    for name in llvm:  # the view really lacks them
      try:
        ctypes.CDLL(name)
        sys.exit(f"{name} still loads")
      except OSError:
        pass

    def mlp(params, x):
      for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
      w, b = params[-1]
      return x @ w + b

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    sizes = [32, 64, 64, 16]
    params = [(jax.random.normal(k, (m, n)) / np.sqrt(m), jnp.zeros(n))
              for k, m, n in zip(keys, sizes[:-1], sizes[1:])]
    x = jax.random.normal(keys[3], (16, 32))
    fast = amp.transform(mlp, "p=f32,c=bf16,o=f32")
    text = fast.lower(params, x).as_text()
    dots = [l for l in text.splitlines() if "stablehlo.dot_general" in l]
    assert len(dots) == 3 and all("bf16" in l for l in dots), dots
    np.testing.assert_allclose(fast(params, x), mlp(params, x), rtol=5e-2, atol=5e-2)

    def loss(params, batch):
      x, y = batch
      return jnp.mean((mlp(params, x) - y) ** 2)
    step = amp.train_step(loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32")
    state, batch, losses = step.init(params), (x, jnp.ones((16, 16))), []
    for _ in range(5):
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses

    source = pathlib.Path(sys.argv[1])
    source.write_text(jax.jit(mlp).lower(params, x).as_text())
    amp_opt = pathlib.Path(sys.executable).parent / "amp-opt"
    out = subprocess.run([str(amp_opt), str(source), "--policy", "p=f32,c=bf16,o=f32"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    dots = [l for l in out.stdout.splitlines() if "stablehlo.dot_general" in l]
    assert len(dots) == 3 and all("bf16" in l for l in dots), out.stdout

    try:
      amp.plugin_path()
      sys.exit("plugin_path() did not raise")
    except PluginUnavailableError as error:
      print("PLUGIN:", error)
""")

# Hides LLVM 22 inside a private mount namespace: an empty /usr/lib/llvm-22,
# and overlays that white out its libraries where the loader would find them.
_HIDE_LLVM = textwrap.dedent(r"""
    set -eu
    work=$(mktemp -d)
    [ -d /usr/lib/llvm-22 ] && mount -t tmpfs none /usr/lib/llvm-22
    for dir in $DIRS; do
      up=$work/$(echo "$dir" | tr / _)
      mkdir -p "$up/upper" "$up/work"
      for f in "$dir"/libLLVM* "$dir"/libMLIR*; do
        case "$(basename "$f")" in *22*|libMLIR.so|libLLVM.so) mknod "$up/upper/$(basename "$f")" c 0 0;; esac
      done
      mount -t overlay none -o "lowerdir=$dir,upperdir=$up/upper,workdir=$up/work" "$dir"
    done
    exec env -i PATH="$VENV_BIN:/usr/bin:/bin" HOME="$work" JAX_PLATFORMS=cpu "$@"
""")


def _llvm_22_library_dirs() -> list[str]:
  """Directories outside /usr/lib/llvm-22 where the loader finds LLVM 22."""
  out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                       check=False).stdout
  dirs = set()
  for line in out.splitlines():
    match = re.search(r"(lib(MLIR|LLVM)\S*22\S*) .*=> (\S+)", line)
    if match:
      dirs.add(os.path.dirname(os.path.realpath(match.group(3))))
  # The LLVM 22 the plugin was built against, where it is not the loader's
  # (the PyPI wheels in the build venv, seen from another venv).
  recorded = amp_plugin.mlir_opt_path()
  if recorded:
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(recorded)))
    dirs.update(d for d in glob.glob(os.path.join(os.path.dirname(prefix),
                                                  "*", "lib"))
                if any(glob.glob(os.path.join(d, name + ".so*"))
                       for name in ("libMLIR", "libLLVM")))
  return sorted(d for d in dirs if not d.startswith("/usr/lib/llvm-22"))


def _can_hide_llvm_22() -> None:
  """Skips where LLVM 22 comes from PyPI (there is no system LLVM to
  hide); where hiding it needs what the machine lacks (root, unshare),
  fails when test dependencies are required and skips elsewhere."""
  site = sysconfig.get_paths()["purelib"]
  if any(os.path.exists(os.path.join(site, d, "lib")) for d in ("mlir",
                                                                "llvm")):
    pytest.skip("this environment has LLVM 22 from PyPI (xtc-mlir/xtc-llvm)")
  if os.geteuid() != 0 or shutil.which("unshare") is None:
    import conftest
    conftest.missing_dependency(
        "hiding LLVM 22 needs root and unshare (a mount namespace)",
        "run the tests as root, with unshare (util-linux) on PATH")


def test_works_on_a_machine_without_llvm_22(tmp_path):
  pytest.importorskip("optax")
  _can_hide_llvm_22()
  script = tmp_path / "check.py"
  script.write_text(_WITHOUT_LLVM)
  env = {"DIRS": " ".join(_llvm_22_library_dirs()),
         "VENV_BIN": os.path.dirname(sys.executable), "PATH": os.defpath}
  result = subprocess.run(
      ["unshare", "--mount", "--propagation", "private", "sh", "-c",
       _HIDE_LLVM, "sh", sys.executable, str(script),
       str(tmp_path / "mlp.mlir")],
      capture_output=True, text=True, env=env, timeout=600)
  assert result.returncode == 0, result.stdout + result.stderr
  message = result.stdout.split("PLUGIN:", 1)[1]
  needed = amp_plugin.needed_libraries(amp_plugin.plugin_path(check=False))
  for name in needed:
    if name.startswith(("libMLIR", "libLLVM")):
      assert name in message, message
  assert "mlir-opt" in message and "does not need them" in message, message


# -- CI configuration -----------------------------------------------------------------


def test_missing_test_dependency_fails_when_required():
  import conftest
  expected = (pytest.fail.Exception if conftest.REQUIRE_TEST_DEPS
              else pytest.skip.Exception)
  with pytest.raises(expected, match="no_such_module_for_amp"):
    pytest.importorskip("no_such_module_for_amp")
  # What is no module (a tool, root) fails the same way.
  with pytest.raises(expected, match="no such tool"):
    conftest.missing_dependency("no such tool", "install it")


def test_without_root_the_llvm_check_fails_when_required(monkeypatch):
  """The check that hides LLVM 22 needs root: without it, where test
  dependencies are required, it fails rather than skip unseen."""
  import conftest
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": "/none"})
  monkeypatch.setattr(conftest, "REQUIRE_TEST_DEPS", True)
  with pytest.raises(pytest.fail.Exception, match="needs root and unshare"):
    _can_hide_llvm_22()
  monkeypatch.setattr(conftest, "REQUIRE_TEST_DEPS", False)
  with pytest.raises(pytest.skip.Exception, match="needs root and unshare"):
    _can_hide_llvm_22()
