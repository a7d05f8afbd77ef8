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

.PHONY: all demo test lit pytest doctest deps build clean

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
	  "jax==0.10.2" "jaxlib==0.10.2" numpy "pytest>=8" "lit>=18" "optax>=0.2" "hypothesis>=6"
	touch $@

build: $(VENV)/.built
$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	$(PY) -m pip install -q --no-deps --no-build-isolation .
	touch $@

test: build lit pytest doctest

lit: build
	lit -sv test/passes test/cli test/plugin

pytest: build
	$(PY) -m pytest -q test/python

doctest: build
	cd /tmp && $(abspath $(PY)) -m pytest -q --doctest-modules --pyargs stablehlo_amp

demo: build
	$(PY) examples/demo.py

clean:
	rm -rf build $(VENV)
