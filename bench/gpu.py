"""The peers benchmark on a CUDA GPU, at GPU sizes, in one command.

    python bench/gpu.py                      # on a CUDA machine, < 8 minutes
    python bench/gpu.py --budget-s 300       # tighter time budget

Same variants, columns and interleaving as bench/peers.py, with a wider LM
(d_model 1024, 8 heads, 4 layers, seq 512, batch 16) and MLP
(784-4096-4096-10, batch 2048). A variant whose library is missing is left
out with a message saying how to install it; with no GPU the script says so
and stops (--allow-cpu runs it anyway, for testing).

Our variants come from the installed stablehlo_amp when it imports there.
Otherwise, from artifacts made on a machine that has the library:

    python bench/gpu.py --prepare            # here: writes bench/artifacts/gpu/
    # carry bench/artifacts to the GPU machine, then run bench/gpu.py there

--prepare exports each of our training steps for CUDA (jax.export with
platforms=("cuda",)), rewrites it with the C++ passes for target gpu exactly
as amp.train_step does, and serializes the result; the GPU machine only needs
JAX to deserialize and call it (Exported.call). It also writes the plain f32
step exported the same way ("f32-exported"), a control for the JAX version
difference between the two machines.

Writes bench/results/gpu.json (or --json).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import common  # noqa: E402
import peers  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts" / "gpu"
OURS = {"ours-bf16": ("p=f32,c=bf16,o=f32", False),
        "ours-f16": ("p=f32,c=f16,o=f32", True)}
VARIANTS = ("f32", "f32-exported", "ours-bf16", "ours-f16", "jmp-bf16",
            "jmp-f16", "mpx-bf16", "mpx-f16", "all-bf16")
LABELS = {**peers.LABELS, "f32-exported": "f32 (exported with the CPU "
          "machine's JAX)"}


def configs(size: str) -> dict:
  if size == "gpu":
    return {"lm": common.LMConfig(d_model=1024, heads=8, layers=4, seq=512,
                                  batch=16),
            "mlp": common.MLPConfig(sizes=(784, 4096, 4096, 10), batch=2048)}
  if size == "small":  # for trying the script on a CPU
    return {"lm": common.LMConfig(d_model=128, heads=4, layers=2, seq=64,
                                  batch=8),
            "mlp": common.MLPConfig(sizes=(784, 256, 256, 10), batch=128)}
  raise SystemExit(f"unknown --size {size!r} (gpu, small)")


def make_model(name: str, config) -> common.Model:
  return common.make_lm(config) if name == "lm" else common.make_mlp(config)


def _key(name: str, config) -> str:
  """Artifacts are tied to the exact configuration they were exported for."""
  return f"{name}-" + "-".join(
      f"{k}{'x'.join(map(str, v)) if isinstance(v, tuple) else v}"
      for k, v in sorted(vars(config).items()))


# --------------------------------------------------------------------------
# --prepare: export + rewrite here, for the GPU machine.


class _PlatformExport:
  """`jax.export` with `platforms` fixed: stands in for the module attribute
  stablehlo_amp's program builder exports through, while preparing."""

  def __init__(self, module, platform: str):
    self._module = module
    self.export = functools.partial(module.export, platforms=(platform,))

  def __getattr__(self, name):
    return getattr(self._module, name)


def prepare(size: str, platform: str, out: pathlib.Path) -> None:
  import stablehlo_amp as amp
  from stablehlo_amp._src import program as prog
  from stablehlo_amp._src import training as tr

  out.mkdir(parents=True, exist_ok=True)
  for name, config in configs(size).items():
    model = make_model(name, config)
    batch = next(model.train)
    key = _key(name, config)
    # The plain f32 step, exported the same way (the control).
    tx = model.optimizer

    def f32_step(state, batch):
      params, opt_state = state
      loss, grads = jax.value_and_grad(model.loss)(params, batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    state = (model.params, tx.init(model.params))
    # Flat leaves in and out: optax's state types have no serialization.
    treedef = jax.tree_util.tree_structure((state, batch))

    def flat_step(*leaves):
      new_state, loss = f32_step(*jax.tree_util.tree_unflatten(treedef, leaves))
      return (*jax.tree_util.tree_leaves(new_state), loss)

    exported = jax.export.export(jax.jit(flat_step), platforms=(platform,))(
        *jax.tree_util.tree_leaves((state, batch)))
    (out / f"{key}.f32-exported.bin").write_bytes(exported.serialize())
    (out / f"{key}.f32-exported.json").write_text(json.dumps(
        {"variant": "f32-exported", "platform": platform, "jax": jax.__version__,
         "description": model.description}, indent=1))
    print(f"  {key}: f32-exported")

    for variant, (policy, dynamic) in OURS.items():
      loss_scale = amp.DynamicLossScale() if dynamic else amp.NoOpLossScale()
      step = amp.train_step(lambda p, b: model.loss(p, b), tx, policy,
                            loss_scale=loss_scale, target="gpu")
      st = step.init(model.params)
      params, opt_state = st.params, st.opt_state
      seed = jnp.ones((), jnp.float32)
      # What TrainStep._traced does, with the export aimed at `platform`.
      export_args = (tr._spec(params, True), tr._spec(opt_state, False),
                     tr._spec(batch, False), tr._spec(seed, False))
      flags = (tr._float_flags(params, True) +
               tr._float_flags(opt_state, False) +
               tr._float_flags(batch, False) + [False])
      leaves = jax.tree_util.tree_leaves((params, opt_state, batch)) + [seed]
      num_state = (len(jax.tree_util.tree_leaves(params)) +
                   len(jax.tree_util.tree_leaves(opt_state)))
      state_leaves = [(1 + i, i) for i in range(num_state)]
      original = prog.jax_export
      prog.jax_export = _PlatformExport(original, platform)
      try:
        program = step._build(step._inner, export_args, flags,
                              len(leaves) - 1, loss_scale, state_leaves)
      finally:
        prog.jax_export = original
      if program.result is None:
        raise SystemExit(f"{variant}: the rewrite fell back; nothing to carry")
      options = loss_scale.pass_options()
      meta = {
          "variant": variant, "policy": policy, "platform": platform,
          "target": "gpu", "jax": jax.__version__,
          "description": model.description,
          "loss_scale": {"mode": options.mode,
                         "initial": float(loss_scale.loss_scale),
                         "growth_interval": options.growth_interval},
          "extra_inputs": options.extra_inputs,
          "extra_outputs": options.extra_outputs,
          "num_params": len(jax.tree_util.tree_leaves(params)),
          "num_opt": len(jax.tree_util.tree_leaves(opt_state)),
          "lower_s": program.timings.lower,
          "rewrite_s": program.timings.rewrite,
          "converts_inserted": program.result.report.converts_inserted,
          "converts_total": program.result.report.converts_total,
          "lowered_ops": dict(program.result.report.lowered),
      }
      (out / f"{key}.{variant}.bin").write_bytes(program.exported.serialize())
      (out / f"{key}.{variant}.json").write_text(json.dumps(meta, indent=1))
      print(f"  {key}: {variant} (rewrite {program.timings.rewrite:.2f} s, "
            f"{meta['converts_inserted']} converts inserted)")
  print(f"wrote {out}")


# --------------------------------------------------------------------------
# Running artifacts on the GPU machine.


def _load(artifacts: pathlib.Path, key: str, variant: str):
  blob = artifacts / f"{key}.{variant}.bin"
  if not blob.exists():
    raise peers.Unavailable(
        f"stablehlo_amp is not importable here and {blob.name} is missing "
        f"from {artifacts}: run `python bench/gpu.py --prepare` on a machine "
        "with the library and carry bench/artifacts")
  meta = json.loads((artifacts / f"{key}.{variant}.json").read_text())
  exported = jax.export.deserialize(bytearray(blob.read_bytes()))
  platform = jax.default_backend()
  platform = "cuda" if platform == "gpu" else platform
  if platform not in exported.platforms:
    raise peers.Unavailable(f"{blob.name} was exported for "
                            f"{exported.platforms}, this is {platform}")
  return exported, meta


def build_f32_exported(artifacts, key, model: common.Model, batch):
  exported, meta = _load(artifacts, key, "f32-exported")
  tx = model.optimizer
  state = (model.params, tx.init(model.params))

  state_tree = jax.tree_util.tree_structure(state)

  def step(state, batch):
    outputs = exported.call(*jax.tree_util.tree_leaves((state, batch)))
    new_state = jax.tree_util.tree_unflatten(state_tree, outputs[:-1])
    return new_state, outputs[-1], jnp.ones((), bool)

  def go():
    lowered = jax.jit(step).lower(state, batch)
    return lowered.as_text(), lowered.compile()
  (text, compiled), seconds = common.timed_build(go)
  return common.Built("f32-exported", LABELS["f32-exported"], state, compiled,
                      lambda s: s[0], compiled, text, seconds,
                      {"exported_with_jax": meta["jax"]})


def build_ours_artifact(artifacts, key, variant, model: common.Model, batch):
  exported, meta = _load(artifacts, key, variant)
  tx = model.optimizer
  params, opt_state = model.params, tx.init(model.params)
  n_params = len(jax.tree_util.tree_leaves(params))
  n_opt = len(jax.tree_util.tree_leaves(opt_state))
  if (n_params, n_opt) != (meta["num_params"], meta["num_opt"]):
    raise peers.Unavailable(
        f"{variant}: the artifact has {meta['num_params']} parameter and "
        f"{meta['num_opt']} optimizer-state leaves, this optax gives "
        f"{n_params} and {n_opt}")
  extra_in, extra_out = meta["extra_inputs"], meta["extra_outputs"]
  out_tree = jax.tree_util.tree_structure((jnp.zeros(()), params, opt_state))
  scale_state = ((jnp.asarray(meta["loss_scale"]["initial"], jnp.float32),
                  jnp.zeros((), jnp.int32))[:extra_in])

  def step(state, batch):
    params, opt_state, scale_state = state
    leaves = jax.tree_util.tree_leaves((params, opt_state, batch))
    outputs = exported.call(*leaves, jnp.ones((), jnp.float32), *scale_state)
    count = len(outputs) - extra_out
    loss, params, opt_state = jax.tree_util.tree_unflatten(
        out_tree, outputs[:count])
    finite, new_scale = outputs[count], tuple(outputs[count + 1:])
    return (params, opt_state, new_scale), loss, finite

  state = (params, opt_state, scale_state)

  def go():
    lowered = jax.jit(step).lower(state, batch)
    return lowered.as_text(), lowered.compile()
  (text, compiled), seconds = common.timed_build(go)
  notes = {k: meta[k] for k in ("policy", "lower_s", "rewrite_s",
                                "converts_inserted", "jax")}
  notes["compile_s_excludes"] = "lower and rewrite (done on the CPU machine)"
  built = common.Built(variant, LABELS[variant] + " [artifact]", state,
                       compiled, lambda s: s[0], compiled, text, seconds, notes)
  if extra_in:
    built.final_notes = lambda s: {"loss_scale": float(s[2][0])}
  return built


def _ours_live() -> str | None:
  """None if stablehlo_amp works here, else why not."""
  try:
    import stablehlo_amp  # noqa: F401
    from stablehlo_amp import _amp  # noqa: F401
  except Exception as error:  # noqa: BLE001 - any import failure means "no"
    return f"{type(error).__name__}: {error}"
  return None


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prepare", action="store_true",
                      help="export + rewrite our variants for the GPU machine")
  parser.add_argument("--platform", default="cuda",
                      help="--prepare: platform to export for (cuda; cpu to "
                      "try the artifact path here)")
  parser.add_argument("--artifacts", default=str(ARTIFACTS))
  parser.add_argument("--size", default="gpu", help="gpu (default) or small")
  parser.add_argument("--ours", default="auto",
                      help="auto (library if it imports, else artifacts), "
                      "live, artifacts")
  parser.add_argument("--allow-cpu", action="store_true",
                      help="run without a GPU (testing the script)")
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--budget-s", type=float, default=420,
                      help="stop training steps when this much wall time "
                      "has passed (default 420: the whole run stays under 8 "
                      "minutes)")
  parser.add_argument("--models", default="lm,mlp")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--json", help="default bench/results/gpu.json")
  args = parser.parse_args(argv)
  artifacts = pathlib.Path(args.artifacts)

  if args.prepare:
    prepare(args.size, args.platform, artifacts)
    return 0

  start = time.perf_counter()
  backend = jax.default_backend()
  if backend not in ("gpu", "cuda") and not args.allow_cpu:
    print(f"bench/gpu.py: no CUDA device here (JAX backend {backend!r}, "
          f"devices {jax.devices()}). Run it on a machine with a GPU and "
          "jax[cuda]; --allow-cpu runs it anyway (slowly, for testing).")
    return 2
  env = common.environment()
  print(f"gpu peers: {env['device_kind']} ({env['backend']}), jax "
        f"{env['jax']}, {env['cpu_count']} CPUs; budget {args.budget_s:.0f} s")
  why_not_live = _ours_live()
  use_live = args.ours == "live" or (args.ours == "auto" and not why_not_live)
  if args.ours == "live" and why_not_live:
    print(f"  stablehlo_amp does not import here: {why_not_live}")
  print("  our variants: " + ("stablehlo_amp, live" if use_live else
                              f"artifacts from {artifacts}" +
                              (f" (stablehlo_amp: {why_not_live})"
                               if why_not_live else "")))
  for lib, hint in (("jmp", "jmp==0.0.4"),
                    ("mpx", "mixed-precision-for-jax==0.1.8 (+ equinox, "
                     "jaxtyping, wadler_lindig)")):
    try:
      __import__(lib)
    except ImportError as error:
      print(f"  {lib} is missing ({error}): its variants are left out; "
            f"pip install --no-deps {hint}")

  variants = [v for v in args.variants.split(",") if v]
  names = [n for n in args.models.split(",") if n]
  results = {"benchmark": "peers-gpu", "environment": env,
             "ours_source": "live" if use_live else "artifacts",
             "variants": variants, "models": {}}
  json_path = (pathlib.Path(args.json) if args.json else
               common.RESULTS / "gpu.json")
  for index, name in enumerate(names):
    config = configs(args.size)[name]
    model = make_model(name, config)
    key = _key(name, config)
    builders = {"f32-exported": functools.partial(build_f32_exported,
                                                  artifacts, key)}
    if not use_live:
      for variant in OURS:
        builders[variant] = functools.partial(build_ours_artifact, artifacts,
                                              key, variant)
    # Each model gets its share of the remaining budget for its steps.
    remaining = args.budget_s - (time.perf_counter() - start)
    deadline = time.perf_counter() + remaining / (len(names) - index)
    print(f"\n## {model.description}")
    result = peers.bench_model(model, variants, args.steps, args.warmup,
                               builders=_wrap(builders), deadline=deadline)
    results["models"][name] = result
    print()
    print(result["table"], flush=True)
    results["elapsed_s"] = time.perf_counter() - start
    common.write_json(json_path, results)  # after each model: partial results
  out = os.environ.get("OUT")
  if out and pathlib.Path(out).is_dir() and pathlib.Path(out) != json_path.parent:
    common.write_json(pathlib.Path(out) / json_path.name, results)
  print(f"\nwrote {json_path} ({time.perf_counter() - start:.0f} s in all)")
  return 0


def _wrap(builders: dict) -> dict:
  """Builders take (model, host batch); the artifact ones want a device batch."""
  return {k: (lambda f: lambda model, host: f(model, jax.device_put(host)))(f)
          for k, f in builders.items()}


if __name__ == "__main__":
  sys.exit(main())
