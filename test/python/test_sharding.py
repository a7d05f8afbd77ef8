"""`amp.transform` with shardings on a mesh of 8 CPU devices.

The checks run on 8 CPU devices in a subprocess (`_sharded_check.py`,
through `eight_devices.run_json`) that prints what it saw as JSON; the
assertions are here.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from eight_devices import run_json

CHECK = pathlib.Path(__file__).with_name("_sharded_check.py")
CASES = ["explicit", "explicit_bf16_params", "in_shardings_only",
         "from_inputs"]
# With explicit in_shardings the rewritten module itself carries them.
ANNOTATED = ["explicit", "explicit_bf16_params", "in_shardings_only"]
BF16_TOLERANCE = dict(rtol=5e-2, atol=5e-2)


@pytest.fixture(scope="module")
def facts() -> dict:
  return run_json(CHECK, timeout=300)


def test_runs_on_eight_cpu_devices(facts):
  assert facts["device_count"] == 8
  assert facts["backend"] == "cpu"


@pytest.mark.parametrize("name", CASES)
def test_rewrite_applies_without_fallback(facts, name):
  case = facts["cases"][name]
  assert case["warnings"] == []
  report = case["report"]
  assert report is not None, "the rewrite fell back to the original program"
  assert report["target"] == "cpu"
  assert report["policy"] == case["policy"]
  assert report["lowered"]["stablehlo.dot_general"] == 2
  assert case["converts"] > 0


@pytest.mark.parametrize("name", ANNOTATED)
def test_rewritten_module_keeps_its_shardings(facts, name):
  case = facts["cases"][name]
  assert case["num_partitions_in_module"] == ["8"]
  assert case["shardings"], case["main"]
  # Every annotation jax.jit puts on main, in the same order.
  assert case["shardings"] == case["reference_shardings"]


@pytest.mark.parametrize("name", CASES)
def test_executable_is_partitioned_like_jax_jit(facts, name):
  case = facts["cases"][name]
  assert case["num_partitions_in_hlo"] == ["8"]
  # The rewrite does not add collectives (an all-gather would mean a
  # sharding was lost and an operand is rebuilt whole on every device).
  assert case["collectives"] == case["reference_collectives"]


def test_bf16_params_keep_their_shardings(facts):
  case = facts["cases"]["explicit_bf16_params"]
  arguments = case["main"].split(") -> (")[0]
  assert arguments.count("xbf16>") == 4
  assert "xf32>" not in arguments
  assert arguments.count("{sdy.sharding = #sdy.sharding<@mesh") == 4


@pytest.mark.parametrize("name", CASES)
def test_outputs_keep_shardings_and_match_f32(facts, name):
  case = facts["cases"][name]
  output_dtype = case["policy"].split("o=")[1]
  expected_dtype = {"f32": "float32", "bf16": "bfloat16"}[output_dtype]
  assert len(case["outputs"]) == 2
  for out in case["outputs"]:
    assert out["dtype"] == expected_dtype
    assert out["spec"] == out["reference_spec"]
    assert out["same_sharding"]
    assert out["equivalent_sharding"]
    assert out["num_devices"] == 8
    np.testing.assert_allclose(np.array(out["value"]),
                               np.array(out["reference"]), **BF16_TOLERANCE)


def test_explicit_out_shardings_are_the_ones_asked_for(facts):
  outputs = facts["cases"]["explicit"]["outputs"]
  assert [out["spec"] for out in outputs] == [["data", None], ["data"]]
