# stablehlo-amp: `make demo` runs the main job, `make test` runs every test.
# Both install what is missing (Debian packages, a venv, the build) and are
# fast when nothing changed.

SHELL := /bin/bash
LLVM_PREFIX ?= /usr/lib/llvm-22
MLIR_DIR ?= $(LLVM_PREFIX)/lib/cmake/mlir
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libzstd-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SOURCES := $(shell git ls-files CMakeLists.txt pyproject.toml passes tools python 2>/dev/null)
export PATH := $(abspath $(VENV))/bin:$(LLVM_PREFIX)/bin:$(PATH)
export MLIR_DIR

.PHONY: all demo test lit pytest doctest sanitize deps build clean

all: build

# Debian's MLIR 22 (bookworm-security on Debian 12), a compiler, venv support.
$(MLIR_DIR)/MLIRConfig.cmake:
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) g++ python3-venv

deps: $(VENV)/.deps
$(VENV)/.deps: pyproject.toml | $(MLIR_DIR)/MLIRConfig.cmake
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" cmake ninja \
	  "jax==0.10.2" "jaxlib==0.10.2" numpy "pytest>=8" "lit>=18" "optax>=0.2" "hypothesis>=6" \
	  "flax==0.12.8" "equinox==0.13.8" matplotlib
	touch $@

build: $(VENV)/.built
$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	$(PY) -m pip install -q --no-deps --no-build-isolation .
	touch $@

test: build lit pytest doctest sanitize

lit: build
	lit -sv test/passes test/cli test/plugin

pytest: build
	$(PY) -m pytest -q test/python

doctest: build
	cd /tmp && $(abspath $(PY)) -m pytest -q --doctest-modules --pyargs stablehlo_amp

# The lit suite again, with the C++ (extension and plugin) built with
# AddressSanitizer and UndefinedBehaviorSanitizer; the runtimes are preloaded
# into the uninstrumented Python and mlir-opt that load them.
ASAN_BUILD := build/sanitize
sanitize: build
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DAMP_ENABLE_SANITIZERS=ON -DAMP_BUILD_PYTHON=ON \
	  -DPython_EXECUTABLE=$(abspath $(PY)) -DMLIR_DIR=$(MLIR_DIR) > /dev/null
	cmake --build $(ASAN_BUILD)
	rm -rf $(ASAN_BUILD)/pkg && mkdir -p $(ASAN_BUILD)/pkg
	cp -r python/stablehlo_amp $(ASAN_BUILD)/pkg/
	cp $(ASAN_BUILD)/python/_amp*.so $(ASAN_BUILD)/tools/plugin/AmpPassPlugin.so \
	  $(ASAN_BUILD)/pkg/stablehlo_amp/
	cp $(ASAN_BUILD)/passes/Passes.md $(ASAN_BUILD)/pkg/stablehlo_amp/passes.md
	env PYTHONPATH=$(abspath $(ASAN_BUILD)/pkg) \
	  LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  sh -c '$(PY) -c "import stablehlo_amp._amp as m, sys; sys.exit(\"sanitize\" not in m.__file__)" && \
	         lit -sv test/passes test/cli test/plugin'

demo: build
	$(PY) examples/demo.py

clean:
	rm -rf build $(VENV)
