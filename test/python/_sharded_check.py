"""Runs `amp.transform` on a mesh of 8 CPU devices; prints facts as JSON.

`test_sharding.py` runs this in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8, which has to be set
before JAX initialises its backend; the assertions live in the test.
"""

from __future__ import annotations

import json
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import stablehlo_amp as amp
from stablehlo_amp._src import hlo


def model(w, x):
  h = jnp.tanh(x @ w["w1"] + w["b1"])
  return jax.nn.softmax(h @ w["w2"], axis=-1), h.sum(-1)


def _main_line(text: str) -> str:
  return next(line for line in text.splitlines()
              if "func.func public @main" in line)


def _shardings(line: str) -> list[str]:
  """The sdy / mhlo sharding annotations on main's arguments and results."""
  return re.findall(r'(#sdy\.sharding<[^>]*>|mhlo\.sharding = "[^"]*")', line)


def _collectives(hlo_text: str) -> dict[str, int]:
  """How many of each collective the partitioned executable runs."""
  found = hlo.Module.parse(hlo_text).collectives()
  return {kind: sum(c.kind == kind for c in found)
          for kind in hlo.COLLECTIVE_KINDS}


def _spec(array) -> list:
  return [list(p) if isinstance(p, tuple) else p for p in array.sharding.spec]


def run_case(name, policy, params, x, in_shardings=None, out_shardings=None):
  jit_options = {}
  if in_shardings is not None:
    jit_options["in_shardings"] = in_shardings
  if out_shardings is not None:
    jit_options["out_shardings"] = out_shardings
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fast = amp.transform(model, policy, **jit_options)
    outputs = fast(params, x)
    low = fast.lower(params, x)
    text = low.as_text()
    compiled_text = low.compile().as_text()
  reference_jit = jax.jit(model, **jit_options)
  reference = reference_jit(params, x)
  reference_lowered = reference_jit.lower(params, x)
  reference_text = reference_lowered.as_text()
  reference_compiled_text = reference_lowered.compile().as_text()
  report = low.report()
  return {
      "name": name,
      "policy": str(fast.policy),
      "warnings": [str(w.message) for w in caught],
      "num_partitions_in_module": re.findall(r"mhlo\.num_partitions = (\d+)",
                                             text),
      "num_partitions_in_hlo": re.findall(r"num_partitions=(\d+)",
                                          compiled_text),
      "collectives": _collectives(compiled_text),
      "reference_collectives": _collectives(reference_compiled_text),
      "main": _main_line(text),
      "shardings": _shardings(_main_line(text)),
      "reference_shardings": _shardings(_main_line(reference_text)),
      "converts": text.count("stablehlo.convert"),
      "report": None if report is None else report.to_dict(),
      "outputs": [{
          "dtype": str(out.dtype),
          "shape": list(out.shape),
          "spec": _spec(out),
          "reference_spec": _spec(ref),
          "same_sharding": out.sharding == ref.sharding,
          "equivalent_sharding": out.sharding.is_equivalent_to(
              ref.sharding, out.ndim),
          "num_devices": len(out.sharding.device_set),
          "value": np.asarray(out, np.float32).tolist(),
          "reference": np.asarray(ref, np.float32).tolist(),
      } for out, ref in zip(jax.tree_util.tree_leaves(outputs),
                            jax.tree_util.tree_leaves(reference))],
  }


def main() -> None:
  # Auto axes: shardings are propagated by the partitioner (what
  # in_shardings/out_shardings users rely on), not typed per array.
  mesh = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(AxisType.Auto, AxisType.Auto))
  shard = lambda *spec: NamedSharding(mesh, P(*spec))
  keys = jax.random.split(jax.random.key(0), 4)
  params = {"w1": jax.random.normal(keys[0], (16, 32)) / 4,
            "b1": jax.random.normal(keys[1], (32,)) / 10,
            "w2": jax.random.normal(keys[2], (32, 8)) / 5.6}
  x = jax.random.normal(keys[3], (8, 16))
  param_shardings = {"w1": shard(None, "model"), "b1": shard("model"),
                     "w2": shard("model", None)}
  in_shardings = (param_shardings, shard("data", None))
  out_shardings = (shard("data", None), shard("data"))
  cases = [
      run_case("explicit", "p=f32,c=bf16,o=f32", params, x, in_shardings,
               out_shardings),
      run_case("explicit_bf16_params", "p=bf16,c=bf16,o=f32", params, x,
               in_shardings, out_shardings),
      run_case("in_shardings_only", "p=f32,c=bf16,o=bf16", params, x,
               in_shardings),
      # No shardings given: they come from the committed input arrays.
      run_case("from_inputs", "p=f32,c=bf16,o=f32",
               jax.device_put(params, param_shardings),
               jax.device_put(x, shard("data", None))),
  ]
  json.dump({"device_count": jax.device_count(),
             "backend": jax.default_backend(),
             "cases": {case["name"]: case for case in cases}}, sys.stdout)


if __name__ == "__main__":
  main()
