"""The benchmarks of stablehlo-amp, a package run from the repository root:

    python -m bench.peers --quick
    python -m bench.gpu --smoke

Each script imports the public API (`import stablehlo_amp as amp`) and its
helpers from `bench.common`; bench/README.md describes them. `make test`
runs every one of them once at a tiny size (`make bench-smoke`, `--smoke`).
"""
