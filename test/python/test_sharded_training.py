"""`amp.train_step` with FSDP-sharded state on 8 CPU devices.

The steps run on 8 CPU devices in a subprocess
(`_sharded_training_check.py`, through `eight_devices.run_json`) that prints
what it saw as JSON; the assertions are here.
"""

from __future__ import annotations

import pathlib

import pytest

from eight_devices import run_json
from stablehlo_amp._src import contract, jax_compat

CHECK = pathlib.Path(__file__).with_name("_sharded_training_check.py")
# Each leaf's sharding, as its parameter's (SPECS in the check).
PARAM_SPECS = {"w1": [None, "fsdp"], "b1": ["fsdp"], "w2": ["fsdp", None],
               "narrow": [None, "fsdp"]}


@pytest.fixture(scope="module")
def facts() -> dict:
  facts = run_json(CHECK)
  assert facts["device_count"] == 8
  return facts


@pytest.fixture(scope="module")
def cases(facts) -> dict:
  return facts["cases"]


def test_mxfp8_is_dequantized_where_the_program_is_partitioned(facts):
  """XLA cannot partition the `xla.scaled_dot` composite (a deviceless 8x
  H100 compile: "failed to legalize operation 'mhlo.unknown'"): the same
  step lowered over 8 devices inlines a program rewritten with the
  dequantized form, and says why; on one device, the composite where this
  JAX has it."""
  mx = facts["mxfp8"]
  composite = contract.attribute("scaled_dot_composite")
  assert composite not in mx["sharded_text"]
  assert "optimization_barrier" in mx["sharded_text"]
  assert f"dequantized: XLA does not partition {composite}" in \
      mx["sharded_report"]
  assert f"E8M0 scales, {composite})" not in mx["sharded_report"]
  if jax_compat.mx_composite("gpu"):
    assert f'stablehlo.composite "{composite}"' in mx["single_text"]
    assert "does not partition" not in mx["single_report"]
  # The same numerics: the composite's decomposition is the dequantized dot.
  assert mx["max_param_difference"] < 1e-6


def test_norm_terms_are_bf16_only_where_the_program_is_partitioned(facts):
  """Layer norm's backward terms (x - mean) * dvar cross devices under
  FSDP: the step lowered over 8 devices makes them in bf16 (a program
  rewritten for the partition count); on one device they fuse into their
  f32 sum and stay f32. Two SGD steps on each make the same update to
  bf16 rounding (0.2% measured)."""
  terms = facts["norm_terms"]
  assert terms["single"] == []
  assert terms["sharded"] and set(terms["sharded"]) == {"stablehlo.multiply"}
  assert terms["update_difference"] < 1e-2


def _moments(case: dict) -> dict:
  return {leaf: spec for leaf, spec in case["init"].items()
          if ".mu[" in leaf or ".nu[" in leaf}


def test_every_state_leaf_keeps_its_sharding_through_the_steps(cases):
  for name, case in cases.items():
    # (Leaves made on one device, the step counter, are placed by JAX.)
    sharded = {leaf for leaf, spec in case["init"].items() if spec is not None}
    assert {leaf: case["after"][leaf] for leaf in sharded} == \
        {leaf: case["init"][leaf] for leaf in sharded}, name
    for leaf, spec in case["init"].items():
      if leaf.startswith(".params"):
        assert spec == PARAM_SPECS[leaf.split("'")[1]], (name, leaf)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_moments_shard_like_their_parameters(cases, dtype):
  for leaf, spec in _moments(cases[f"auto-{dtype}"]).items():
    assert spec == PARAM_SPECS[leaf.split("'")[1]], leaf


@pytest.mark.parametrize("name", ["auto-f8", "explicit-f8", "auto-f8-narrow"])
def test_f8_moments_shard_their_blocks_with_the_parameter(cases, name):
  """It came back replicated from init and after every step (60 of 76
  leaves of a flax LM under FSDP), with no warning."""
  if name not in cases:
    pytest.skip("this JAX has no explicit mesh axes")
  case = cases[name]
  expected = {"w1": [None, "fsdp", None],  # [256, 8, 260]: 1 block a device
              "b1": ["fsdp", None],        # [8, 260]
              "w2": ["fsdp", None, None],  # [2048, 1, 260]
              "narrow": [None, None, None]}  # 2 blocks a row, 8 devices
  moments = _moments(case)
  assert moments
  for leaf, spec in moments.items():
    assert spec == expected[leaf.split("'")[1]], (leaf, spec)
    assert case["shapes"][leaf][-1] == 260


def test_f8_moments_that_cannot_shard_are_named_at_init(cases):
  assert [w for w in cases["auto-f8"]["warnings"] if "f8" in w] == []
  warned, = [w for w in cases["auto-f8-narrow"]["warnings"] if "f8" in w]
  assert "mu['narrow']" in warned and "nu['narrow']" in warned
  assert "w1" not in warned and "keep_f32_state" in warned


def test_f8_state_adds_no_collective_where_blocks_shard(cases):
  """Blocks on the devices of their part of the parameter: decoding and
  encoding them moves nothing (the flat layout of a column-sharded kernel
  was all-gathered in f32 every step)."""
  assert cases["auto-f8"]["collectives"] == cases["auto-bf16"]["collectives"]
  assert cases["auto-f8"]["collectives"] == cases["auto-f32"]["collectives"]
  if "explicit-f8" in cases:
    assert (cases["explicit-f8"]["collectives"] ==
            cases["auto-f32"]["collectives"])


def test_sharded_steps_compute_what_one_device_does(cases):
  for name, case in cases.items():
    # One bf16 ulp at the parameters' scale, from reduction order.
    assert case["max_param_difference"] <= 2 ** -10, name


def test_the_executable_takes_and_returns_the_shardings_given(cases):
  """The rewrite changes no input or output sharding of a step."""
  for name, case in cases.items():
    assert case["executable_takes_given_shardings"], name
    assert case["executable_returns_them"], name


@pytest.fixture(scope="module")
def reductions(tmp_path_factory) -> dict:
  dump = tmp_path_factory.mktemp("xla-dump")
  return run_json(CHECK, "reductions", str(dump),
                  xla_flags=f"--xla_dump_to={dump} "
                  "--xla_dump_hlo_pass_re=spmd-partitioning")


def test_reduce_dtype_sets_the_dtype_of_the_gradient_reduction(reductions):
  """Data parallel over 8 devices: with reduce_dtype="f32" the gradient
  all-reduce is f32; with "bf16" or "compute" the kernels' gradients are
  reduced in bf16 (the biases' stay f32: a sum, not a GEMM)."""
  f32 = reductions["f32"]
  assert set(f32) == {"all-reduce f32"} and f32["all-reduce f32"] > 2 ** 21
  for name in ("bf16", "compute"):
    low = reductions[name]
    kernels = 4 * (256 * 2048 + 2048 * 256) // 2  # every kernel, in bf16
    assert low["all-reduce bf16"] == kernels, low
    assert low["all-reduce f32"] < 2 ** 14, low  # the bias and the loss


def test_the_report_says_what_moves_between_devices_and_why(cases):
  """The compiled report's collectives: every byte of the program's,
  grouped by kind, dtype and the op XLA moved the value for, with that
  op's decision (a matrix multiply's operands move in its dtype)."""
  case = cases["auto-f32"]
  groups = case["report_collectives"]
  assert groups and sum(g["bytes"] for g in groups) == case["collective_bytes"]
  assert {g["kind"] for g in groups} <= {"all-gather", "all-reduce",
                                         "reduce-scatter", "all-to-all",
                                         "collective-permute"}
  for_gemms = [g for g in groups if g["op"].endswith("dot_general")]
  assert for_gemms and all(g["precision"] == "low" for g in for_gemms)
  assert "collectives per device:" in case["report_text"]
  assert "for jvp()/dot_general: low: matrix multiply" in case["report_text"]
