"""Runs `amp.train_step` with FSDP-sharded state on 8 CPU devices; prints
what it saw as JSON.

`test_sharded_training.py` runs this in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (JAX reads it once, when
it initialises its backend); the assertions live in the test.
"""

from __future__ import annotations

import json
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import stablehlo_amp as amp
from stablehlo_amp._src import hlo

import programs

# Leaf -> how FSDP shards it over the one axis "fsdp". The kernels hold
# whole f8 blocks on every device; "narrow" does not (2 blocks a row over 8
# devices), so its f8 moments cannot shard along that axis.
SPECS = {"w1": (None, "fsdp"), "b1": ("fsdp",), "w2": ("fsdp", None),
         "narrow": (None, "fsdp")}


def loss(params, batch):
  h = jax.nn.relu(batch @ params["w1"] + params["b1"])
  y = jnp.mean((h @ params["w2"]) ** 2)
  if "narrow" in params:
    y += jnp.mean((batch[:, :128] @ params["narrow"]) ** 2)
  return y


def make_params(narrow: bool) -> dict:
  keys = jax.random.split(jax.random.key(0), 4)
  params = {"w1": jax.random.normal(keys[0], (256, 2048)) / 16,
            "b1": jnp.zeros((2048,)),
            "w2": jax.random.normal(keys[1], (2048, 256)) / 45}
  if narrow:
    params["narrow"] = jax.random.normal(keys[2], (128, 512)) / 11
  return params


def _spec(x) -> list | None:
  spec = getattr(getattr(x, "sharding", None), "spec", None)
  if spec is None:
    return None
  spec = tuple(spec) + (None,) * (x.ndim - len(spec))
  return [list(p) if isinstance(p, tuple) else p for p in spec]


def _leaves(tree) -> dict:
  return {jax.tree_util.keystr(path): x for path, x in
          jax.tree_util.tree_flatten_with_path(tree)[0] if hasattr(x, "shape")}


def _collectives(text: str) -> dict[str, int]:
  found = hlo.Module.parse(text).collectives()
  return {kind: sum(c.kind == kind for c in found)
          for kind in hlo.COLLECTIVE_KINDS}


def run(mesh: Mesh, opt_state_dtype: str, narrow: bool = False,
        steps: int = 2) -> dict:
  """`steps` FSDP steps of the model (with the leaf whose f8 blocks cannot
  shard, if `narrow`): the state's shardings after init and after the
  steps, the compiled step's collectives, and how far its parameters are
  from the same steps on one device."""
  params = make_params(narrow)
  shard = {k: NamedSharding(mesh, P(*SPECS[k])) for k in params}
  batch = jax.random.normal(jax.random.key(1), (64, 256))
  options = {} if opt_state_dtype == "f32" else {
      "opt_state_dtype": opt_state_dtype}
  make_step = lambda: amp.train_step(loss, optax.adam(1e-3),
                                     "p=bf16,c=bf16,o=f32", **options)
  step = make_step()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    state = step.init(jax.device_put(params, shard))
  init_specs = {k: _spec(x) for k, x in _leaves(state).items()}
  sharded_batch = jax.device_put(batch, NamedSharding(mesh, P("fsdp", None)))
  lowered = step.lower(state, sharded_batch)
  executable = lowered.compile()
  compiled = executable.as_text()
  report = lowered.report()
  # The step's executable takes the state and batch as they are sharded,
  # and returns the new state sharded the same way.
  given = [x.sharding for x in jax.tree_util.tree_leaves((state,
                                                          sharded_batch))]
  taken = jax.tree_util.tree_leaves(executable.input_shardings[0])
  returned = jax.tree_util.tree_leaves(executable.output_shardings)
  state_count = len(jax.tree_util.tree_leaves(state))
  # (Leaves on one device, uncommitted, go where jax.jit puts them.)
  same_inputs = len(given) == len(taken) and all(
      a.is_equivalent_to(b, x.ndim) for a, b, x in zip(
          given, taken, jax.tree_util.tree_leaves((state, sharded_batch)))
      if isinstance(a, NamedSharding))
  same_outputs = all(
      a.is_equivalent_to(b, x.ndim) for a, b, x in zip(
          given[:state_count], returned[:state_count],
          jax.tree_util.tree_leaves(state)) if isinstance(a, NamedSharding))
  for _ in range(steps):
    state, _ = step(state, sharded_batch)
  one = make_step()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    single_state = one.init(jax.device_put(params, jax.devices()[0]))
  for _ in range(steps):
    single_state, _ = one(single_state, jax.device_put(batch,
                                                       jax.devices()[0]))
  return {
      "warnings": [str(w.message) for w in caught],
      "init": init_specs,
      "after": {k: _spec(x) for k, x in _leaves(state).items()},
      "shapes": {k: list(x.shape) for k, x in _leaves(state).items()},
      "collectives": _collectives(compiled),
      "collective_bytes": sum(hlo.Module.parse(compiled)
                              .collective_bytes().values()),
      "report_collectives": report.to_dict()["collectives"],
      "report_text": str(report),
      "executable_takes_given_shardings": same_inputs,
      "executable_returns_them": same_outputs,
      "max_param_difference": max(
          float(np.max(np.abs(np.asarray(a, np.float32) -
                              np.asarray(b, np.float32))))
          for a, b in zip(jax.tree_util.tree_leaves(state.params),
                          jax.tree_util.tree_leaves(single_state.params))),
  }


def reductions(dump: str) -> dict:
  """Data parallel (parameters replicated, the batch split): the gradient
  all-reduce of one step per reduce_dtype, by dtype, in the program XLA's
  SPMD partitioner made (read from XLA's dump in `dump`: XLA:CPU itself
  then runs bf16 collectives in f32)."""
  import glob
  import os
  mesh = Mesh(np.array(jax.devices()), ("data",))
  params = jax.device_put(make_params(False), NamedSharding(mesh, P()))
  batch = jax.device_put(jax.random.normal(jax.random.key(1), (64, 256)),
                         NamedSharding(mesh, P("data", None)))
  found = {}
  for reduce_dtype in ("f32", "bf16", "compute"):
    before = set(glob.glob(os.path.join(dump, "*")))
    step = amp.train_step(loss, optax.adam(1e-3), "p=f32,c=bf16,o=f32",
                          reduce_dtype=reduce_dtype)
    step.lower(step.init(params), batch).compile()
    partitioned, = [f for f in set(glob.glob(os.path.join(
        dump, "*after_spmd-partitioning*"))) - before if "_traced" in f]
    with open(partitioned) as f:
      table = hlo.Module.parse(f.read()).collective_bytes()
    found[reduce_dtype] = {f"{kind} {dtype}": n for (kind, dtype), n in
                           table.items() if kind in ("all-reduce",
                                                     "reduce-scatter")}
  return found


def mxfp8(mesh: Mesh) -> dict:
  """MXFP8 for target gpu (the `xla.scaled_dot` composite where this JAX has
  it), lowered sharded over `mesh` and on one device by the same step: what
  each lowering inlined, what the report says, and how far two sharded
  steps are from two on one device."""
  params = make_params(False)
  shard = {k: NamedSharding(mesh, P(*SPECS[k])) for k in params}
  batch = jax.random.normal(jax.random.key(1), (64, 256))
  step = amp.train_step(loss, optax.adam(1e-3), "p=f32,c=bf16,o=f32,gemm=f8",
                        fp8_scaling="mxfp8", target="gpu", fp8_min_size=0)
  state = step.init(jax.device_put(params, shard))
  sharded_batch = jax.device_put(batch, NamedSharding(mesh, P("fsdp", None)))
  sharded = step.lower(state, sharded_batch)
  facts = {"sharded_text": sharded.as_text(),
           "sharded_report": str(sharded.report())}
  sharded.compile()
  for _ in range(2):
    state, _ = step(state, sharded_batch)
  device = jax.devices()[0]
  single_state = step.init(jax.device_put(params, device))
  single = step.lower(single_state, jax.device_put(batch, device))
  facts.update(single_text=single.as_text(),
               single_report=str(single.report()))
  for _ in range(2):
    single_state, _ = step(single_state, jax.device_put(batch, device))
  facts["max_param_difference"] = max(
      float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
      for a, b in zip(jax.tree_util.tree_leaves(state.params),
                      jax.tree_util.tree_leaves(single_state.params)))
  return facts


def ln_loss(params, batch):
  return jnp.mean(programs.layer_norm(params, batch @ params["w1"]) ** 2)


def norm_terms(mesh: Mesh) -> dict:
  """A layer norm (programs.py's) between two GEMMs, target gpu, bf16: the
  same step lowered over `mesh` (FSDP) and on one device. Per lowering,
  the ops the report gives reason `partitioned_norm_term`; and how far the
  update of two sharded SGD steps is from that of two on one device,
  relative to the update (the largest over the parameters)."""
  keys = jax.random.split(jax.random.key(0), 3)
  params = {"w1": jax.random.normal(keys[0], (256, 512)) / 16,
            "w": jax.random.normal(keys[1], (512, 256)) / 23,
            "gamma": jnp.ones((512,)), "beta": jnp.zeros((512,))}
  specs = {"w1": P(None, "fsdp"), "w": P("fsdp", None), "gamma": P("fsdp"),
           "beta": P("fsdp")}
  batch = jax.random.normal(keys[2], (64, 256))
  step = amp.train_step(ln_loss, optax.sgd(0.1), "p=f32,c=bf16,o=f32",
                        target="gpu")

  def terms(lowered) -> list[str]:
    return [d.op for d in lowered.report().decisions
            if d.reason_id == "partitioned_norm_term"]

  state = step.init(jax.device_put(
      params, {k: NamedSharding(mesh, specs[k]) for k in params}))
  sharded_batch = jax.device_put(batch, NamedSharding(mesh, P("fsdp", None)))
  facts = {"sharded": terms(step.lower(state, sharded_batch))}
  device = jax.devices()[0]
  single_state = step.init(jax.device_put(params, device))
  facts["single"] = terms(step.lower(single_state,
                                     jax.device_put(batch, device)))
  for _ in range(2):
    state, _ = step(state, sharded_batch)
    single_state, _ = step(single_state, jax.device_put(batch, device))
  facts["update_difference"] = max(
      float(np.linalg.norm(np.asarray(a) - np.asarray(b)) /
            np.linalg.norm(np.asarray(b) - np.asarray(p)))
      for a, b, p in zip(jax.tree_util.tree_leaves(state.params),
                         jax.tree_util.tree_leaves(single_state.params),
                         jax.tree_util.tree_leaves(params)))
  return facts


def main() -> None:
  if sys.argv[1:2] == ["reductions"]:
    json.dump(reductions(sys.argv[2]), sys.stdout)
    return
  meshes = {"auto": Mesh(np.array(jax.devices()), ("fsdp",))}
  axis_type = getattr(jax.sharding, "AxisType", None)
  if axis_type is not None and hasattr(axis_type, "Explicit"):
    meshes["explicit"] = jax.make_mesh((8,), ("fsdp",),
                                       axis_types=(axis_type.Explicit,))
  results = {f"auto-{dtype}": run(meshes["auto"], dtype)
             for dtype in ("f32", "bf16", "f8")}
  results["auto-f8-narrow"] = run(meshes["auto"], "f8", narrow=True)
  if "explicit" in meshes:
    results["explicit-f8"] = run(meshes["explicit"], "f8")
  json.dump({"device_count": jax.device_count(), "cases": results,
             "mxfp8": mxfp8(meshes["auto"]),
             "norm_terms": norm_terms(meshes["auto"])}, sys.stdout)


if __name__ == "__main__":
  main()
