"""The peers benchmark on a CUDA GPU, at GPU sizes, in one command.

    python3 -m bench.gpu                    # on the GPU machine, < 8 minutes
    python3 -m bench.gpu --budget-s 300     # tighter time budget
    python -m bench.gpu --smoke             # anywhere (CPU too): tiny MLP,
                                            # 3 steps, checks the script works

(from the repository root, as every benchmark: `bench` is a package).

Same variants, columns, donation and interleaving as bench/peers.py, with a
wider LM (d_model 1024, 8 heads, 4 layers, seq 512, batch 16) and MLP
(784-4096-4096-10, batch 2048). Our variants use the stablehlo_amp installed
on the machine that runs this, so the rewrite happens there, for its JAX and
target (gpu). With no GPU the script says so and stops (--allow-cpu runs it
anyway; --smoke implies it).

Libraries missing on the machine: wheels in --wheels (default
bench/artifacts/wheels: jmp, MPX and its dependencies, and a stablehlo_amp
wheel built for that machine's Python if there is one) are installed with
`pip install --no-index --no-deps --target` into a temporary directory and
put on sys.path first (the one sys.path change of the benchmarks: it adds
installed libraries, not code of this repository). A variant whose library
is still missing is left out with a message.

Fallback when no stablehlo_amp wheel works there (another Python, another
JAX): on a machine with the library,

    python -m bench.gpu --prepare          # writes bench/artifacts/gpu/

exports each of our whole training steps (amp.train_step with target gpu,
its rewritten module inlined) for CUDA with jax.export on flat leaves, and
serializes it; the GPU machine then only needs JAX to call it (`--ours artifacts`, or automatically
when stablehlo_amp does not import). That path also runs "f32-exported", the
plain f32 step exported the same way: a control for the JAX version
difference between the two machines.

Writes bench/results/gpu.json (or --json; a copy in $OUT when it is set).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ARTIFACTS = HERE / "artifacts" / "gpu"
WHEELS = HERE / "artifacts" / "wheels"
OURS = {"ours-bf16": ("p=f32,c=bf16,o=f32", False, None),
        "ours-bf16-storage-f32": ("p=f32,c=bf16,o=f32", False, "f32"),
        "ours-f16": ("p=f32,c=f16,o=f32", True, None),
        "ours-bf16-gemm-f8": ("p=f32,c=bf16,o=f32,gemm=f8", False, None)}
# FP8: current scaling, and delayed scaling (only when stablehlo_amp runs
# here: its amax histories are state the artifacts do not carry). The
# table's dot column counts FP8 GEMMs (cuBLASLt FP8 custom calls).
VARIANTS = ("f32", "ours-bf16", "ours-bf16-storage-f32", "ours-f16",
            "ours-bf16-gemm-f8", "ours-bf16-gemm-f8-scaling-delayed",
            "jmp-bf16", "jmp-f16", "mpx-bf16", "mpx-f16", "all-bf16")
# --smoke (bench/peers.py --smoke runs the other builders): these on the
# MLP, then the fallback on it: --prepare for the CPU into a temporary
# directory and a run from those artifacts.
SMOKE_VARIANTS = ("f32", "ours-bf16-gemm-f8-scaling-delayed", "jmp-bf16",
                  "mpx-bf16")
SMOKE_FALLBACK = ("mlp", ("f32", "ours-bf16", "ours-f16"))


def install_wheels(directory: pathlib.Path) -> list[str]:
  """Installs the wheels in `directory` whose package does not import,
  each on its own (one incompatible wheel does not stop the others), into a
  temporary directory put first on sys.path. Returns messages."""
  wheels = sorted(directory.glob("*.whl")) if directory.is_dir() else []
  if not wheels:
    return []
  missing = []
  for wheel in wheels:
    module = {"mixed_precision_for_jax": "mpx",
              "typing_extensions": "typing_extensions"}.get(
                  wheel.name.split("-")[0].lower(),
                  wheel.name.split("-")[0].lower())
    try:
      __import__(module)
    except Exception:  # noqa: BLE001 - anything but a clean import: install
      missing.append(wheel)
  if not missing:
    return []
  target = pathlib.Path(tempfile.mkdtemp(prefix="gpu-bench-site-"))
  messages = []
  for wheel in missing:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index",
         "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True, text=True)
    messages.append(f"  installed {wheel.name}" if done.returncode == 0 else
                    f"  could not install {wheel.name}: "
                    f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
  # Libraries from the wheels above (jmp, MPX, ...), ahead of anything
  # broken that is installed: not a way to find this repository's code.
  sys.path.insert(0, str(target))
  return messages


def _early_args(argv) -> argparse.Namespace:
  """--wheels and --smoke, read before JAX is imported."""
  early = argparse.ArgumentParser(add_help=False)
  early.add_argument("--wheels", default=str(WHEELS))
  early.add_argument("--no-install", action="store_true")
  return early.parse_known_args(argv)[0]


def configs(size: str) -> dict:
  from bench import common
  if size == "gpu":
    return {"lm": common.LMConfig(d_model=1024, heads=8, layers=4, seq=512,
                                  batch=16),
            "mlp": common.MLPConfig(sizes=(784, 4096, 4096, 10), batch=2048)}
  if size == "small":  # for trying the script on a CPU
    return {"lm": common.LMConfig(d_model=128, heads=4, layers=2, seq=64,
                                  batch=8),
            "mlp": common.MLPConfig(sizes=(784, 256, 256, 10), batch=128)}
  if size == "smoke":  # seconds on a CPU
    return common.smoke_configs()
  raise SystemExit(f"unknown --size {size!r} (gpu, small, smoke)")


def make_model(name: str, config, seed: int = 0):
  from bench import common
  return (common.make_lm(config, seed=seed) if name == "lm" else
          common.make_mlp(config, seed=seed))


def _key(name: str, config) -> str:
  """Artifacts are tied to the exact configuration they were exported for."""
  return f"{name}-" + "-".join(
      f"{k}{'x'.join(map(str, v)) if isinstance(v, tuple) else v}"
      for k, v in sorted(vars(config).items()))


# --------------------------------------------------------------------------
# Fallback, --prepare: trace + rewrite + export here, for the GPU machine.


def prepare(size: str, platform: str, out: pathlib.Path,
            models: tuple[str, ...] = ("lm", "mlp"),
            variants: tuple[str, ...] = tuple(OURS)) -> None:
  """Our steps rewritten for target gpu and exported for `platform` (cuda;
  cpu tries the artifact path here)."""
  import jax
  import optax
  import stablehlo_amp as amp

  out.mkdir(parents=True, exist_ok=True)
  for name, config in configs(size).items():
    if name not in models:
      continue
    model = make_model(name, config)
    batch = next(model.train)
    key = _key(name, config)
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
        {"variant": "f32-exported", "platform": platform,
         "jax": jax.__version__, "description": model.description}, indent=1))
    print(f"  {key}: f32-exported")

    for variant, (policy, dynamic, storage) in OURS.items():
      if variant not in variants:
        continue
      loss_scale = amp.DynamicLossScale() if dynamic else amp.NoOpLossScale()
      options = {"storage": storage} if storage else {}
      step = amp.train_step(lambda p, b: model.loss(p, b), tx, policy,
                            loss_scale=loss_scale, target="gpu", **options)
      st = step.init(model.params)
      # The whole step (outer jit, the rewritten module inlined in it),
      # exported through JAX's public API on flat leaves: nothing of
      # stablehlo_amp's internals or pytree types travels.
      state_tree = jax.tree_util.tree_structure(st)
      state_leaves = jax.tree_util.tree_leaves(st)
      batch_tree = jax.tree_util.tree_structure(batch)

      def flat_step(*leaves, state_tree=state_tree, step=step,
                    count=len(state_leaves), batch_tree=batch_tree):
        state = jax.tree_util.tree_unflatten(state_tree, leaves[:count])
        batch = jax.tree_util.tree_unflatten(batch_tree, leaves[count:])
        new_state, metrics = step(state, batch)
        return (*jax.tree_util.tree_leaves(new_state), metrics["loss"],
                metrics.get("grads_finite", jax.numpy.ones((), bool)))

      start = time.perf_counter()
      exported = jax.export.export(jax.jit(flat_step),
                                   platforms=(platform,))(
          *state_leaves, *jax.tree_util.tree_leaves(batch))
      seconds = time.perf_counter() - start
      n_params = len(jax.tree_util.tree_leaves(st.params))
      n_opt = len(jax.tree_util.tree_leaves(st.opt_state))
      # State leaves after the parameters and optimizer state (loss scale,
      # skipped-step counter, ...): their initial values travel.
      rest = [{"value": float(x), "dtype": str(x.dtype)}
              for x in state_leaves[n_params + n_opt:]]
      meta = {
          "variant": variant, "policy": policy, "storage": storage or
          "default", "platform": platform, "target": "gpu",
          "jax": jax.__version__, "description": model.description,
          "num_params": n_params, "num_opt": n_opt, "rest": rest,
          "loss_scale_leaf": 0 if dynamic else None,
          "lower_s": seconds, "rewrite_s": None, "converts_inserted": None,
      }
      (out / f"{key}.{variant}.bin").write_bytes(exported.serialize())
      (out / f"{key}.{variant}.json").write_text(json.dumps(meta, indent=1))
      print(f"  {key}: {variant} (traced, rewritten and exported in "
            f"{seconds:.1f} s)")
  print(f"wrote {out}")


# --------------------------------------------------------------------------
# Fallback: running the artifacts on the GPU machine.


def _load(artifacts: pathlib.Path, key: str, variant: str):
  import jax
  from bench import peers
  blob = artifacts / f"{key}.{variant}.bin"
  if not blob.exists():
    raise peers.Unavailable(
        f"stablehlo_amp does not import here and {blob.name} is missing "
        f"from {artifacts}: run `python -m bench.gpu --prepare` on a machine "
        "with the library and carry bench/artifacts")
  meta = json.loads((artifacts / f"{key}.{variant}.json").read_text())
  exported = jax.export.deserialize(bytearray(blob.read_bytes()))
  platform = jax.default_backend()
  platform = "cuda" if platform == "gpu" else platform
  if platform not in exported.platforms:
    raise peers.Unavailable(f"{blob.name} was exported for "
                            f"{exported.platforms}, this is {platform}")
  return exported, meta


def build_f32_exported(artifacts, key, model, host, donate: bool):
  import jax
  import jax.numpy as jnp
  from bench import common
  exported, meta = _load(artifacts, key, "f32-exported")
  tx = model.optimizer
  init = lambda p: (lambda q: (q, tx.init(q)))(common.tree_copy(p))
  state = init(model.params)
  state_tree = jax.tree_util.tree_structure(state)
  batch = jax.device_put(host)

  def step(state, batch):
    outputs = exported.call(*jax.tree_util.tree_leaves((state, batch)))
    new_state = jax.tree_util.tree_unflatten(state_tree, outputs[:-1])
    return new_state, outputs[-1], jnp.ones((), bool)

  def go():
    lowered = jax.jit(step, donate_argnums=(0,) if donate else ()).lower(
        state, batch)
    return lowered.as_text(), lowered.compile()
  (text, compiled), seconds = common.timed_build(go)
  return common.Built("f32-exported", "f32 (exported with the preparing "
                      "machine's JAX)", state, compiled, lambda s: s[0],
                      compiled, text, seconds,
                      {"exported_with_jax": meta["jax"]}, init=init,
                      donated=donate)


def build_ours_artifact(artifacts, key, variant, model, host, donate: bool):
  import jax
  import jax.numpy as jnp
  from bench import common
  from bench import peers
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
  tree = jax.tree_util.tree_structure((params, opt_state))

  def init(p):
    p = common.tree_copy(p)
    rest = tuple(jnp.asarray(r["value"], r["dtype"]) for r in meta["rest"])
    return (p, tx.init(p), rest)

  def step(state, batch):
    params, opt_state, rest = state
    outputs = exported.call(*jax.tree_util.tree_leaves((params, opt_state)),
                            *rest, *jax.tree_util.tree_leaves(batch))
    count = n_params + n_opt
    params, opt_state = jax.tree_util.tree_unflatten(tree, outputs[:count])
    rest = tuple(outputs[count:count + len(meta["rest"])])
    loss, finite = outputs[-2], outputs[-1]
    return (params, opt_state, rest), loss, finite

  state = init(params)
  batch = jax.device_put(host)

  def go():
    lowered = jax.jit(step, donate_argnums=(0,) if donate else ()).lower(
        state, batch)
    return lowered.as_text(), lowered.compile()
  (text, compiled), seconds = common.timed_build(go)
  notes = {k: meta[k] for k in ("policy", "storage", "lower_s", "jax")}
  notes["compile_s_excludes"] = "trace, rewrite and export (when preparing)"
  peers._ours_options(variant)  # its label, for the variants peers names
  built = common.Built(variant, peers.LABELS[variant] + " [artifact]", state,
                       compiled, lambda s: s[0], compiled, text, seconds, notes,
                       init=init, donated=donate)
  if meta["loss_scale_leaf"] is not None:
    built.final_notes = lambda s: {
        "loss_scale": float(s[2][meta["loss_scale_leaf"]])}
  return built


def _ours_live() -> str | None:
  """None if stablehlo_amp works here, else why not (importing it loads
  its compiled extension)."""
  try:
    import stablehlo_amp  # noqa: F401
  except Exception as error:  # noqa: BLE001 - any import failure means "no"
    return f"{type(error).__name__}: {error}"
  return None


def smoke_fallback(prepare_and_run) -> None:
  """--smoke runs the fallback too, on the MLP: our steps exported for the
  CPU into a temporary directory (--prepare --platform cpu) and run from
  there (--ours artifacts). jax.export's serialization needs flatbuffers."""
  name, ours = SMOKE_FALLBACK
  try:
    import flatbuffers  # noqa: F401
  except ImportError as error:
    print(f"\n# fallback (--prepare, --ours artifacts) not run: {error}; "
          "pip install --no-deps flatbuffers (bench/requirements.txt)")
    return
  with tempfile.TemporaryDirectory(prefix="gpu-smoke-artifacts-") as tmp:
    print(f"\n# fallback: --prepare --platform cpu into {tmp}, then "
          "--ours artifacts")
    prepare_and_run(pathlib.Path(tmp), name, ours)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  early = _early_args(argv)
  installed = ([] if early.no_install else
               install_wheels(pathlib.Path(early.wheels)))
  import jax
  from bench import common
  from bench import peers

  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--smoke", action="store_true",
                      help="the tiny MLP, 3 steps, 1 warm-up step, CPU "
                      "allowed, then the artifact fallback on it: checks "
                      "the script works (not a measurement)")
  parser.add_argument("--size", help="gpu (default), small or smoke")
  parser.add_argument("--allow-cpu", action="store_true",
                      help="run without a GPU (testing the script)")
  parser.add_argument("--steps", type=int, help="steps per seed (default "
                      "100; --smoke 3)")
  parser.add_argument("--warmup", type=int, help="default 5; --smoke 1")
  parser.add_argument("--seeds", default="0",
                      help="comma-separated seeds (default 0: one seed fits "
                      "the budget at GPU sizes)")
  parser.add_argument("--no-donate", action="store_true",
                      help="keep the state instead of donating it")
  parser.add_argument("--budget-s", type=float, default=420,
                      help="stop training steps when this much wall time "
                      "has passed (default 420: the run stays under 8 "
                      "minutes)")
  parser.add_argument("--models", help="default lm,mlp; --smoke mlp")
  parser.add_argument("--variants", help=f"default {','.join(VARIANTS)}; "
                      f"--smoke {','.join(SMOKE_VARIANTS)}")
  parser.add_argument("--json", help="default bench/results/gpu.json "
                      "(--smoke: gpu-smoke.json)")
  parser.add_argument("--wheels", default=str(WHEELS),
                      help="wheels to install when a library is missing")
  parser.add_argument("--no-install", action="store_true",
                      help="install nothing from --wheels")
  parser.add_argument("--ours", default="auto",
                      help="auto (stablehlo_amp if it imports, else "
                      "artifacts), live, artifacts")
  parser.add_argument("--prepare", action="store_true",
                      help="fallback: export + rewrite our variants for the "
                      "GPU machine, into --artifacts")
  parser.add_argument("--platform", default="cuda",
                      help="--prepare: platform to export for (cuda; cpu to "
                      "try the artifact path here)")
  parser.add_argument("--artifacts", default=str(ARTIFACTS))
  args = parser.parse_args(argv)
  size = args.size or ("smoke" if args.smoke else "gpu")
  artifacts = pathlib.Path(args.artifacts)

  if args.prepare:
    prepare(size, args.platform, artifacts)
    return 0

  start = time.perf_counter()
  backend = jax.default_backend()
  if backend not in ("gpu", "cuda") and not (args.allow_cpu or args.smoke):
    print(f"bench/gpu.py: no CUDA device here (JAX backend {backend!r}, "
          f"devices {jax.devices()}). Run it on a machine with a GPU and "
          "jax[cuda]; --smoke or --allow-cpu runs it anyway (for testing).")
    return 2
  steps = args.steps or (3 if args.smoke else 100)
  warmup = args.warmup if args.warmup is not None else (1 if args.smoke
                                                        else 5)
  seeds = [int(s) for s in args.seeds.split(",") if s]
  donate = not args.no_donate
  env = common.environment()
  print(f"gpu peers: {env['device_kind']} ({env['backend']}), jax "
        f"{env['jax']}, {env['cpu_count']} CPUs; sizes {size}, {steps} steps "
        f"x seeds {seeds}, state {'donated' if donate else 'kept'}; budget "
        f"{args.budget_s:.0f} s")
  for message in installed:
    print(message)
  why_not_live = _ours_live()
  use_live = args.ours == "live" or (args.ours == "auto" and not why_not_live)
  if args.ours == "live" and why_not_live:
    print(f"  stablehlo_amp does not import here: {why_not_live}")
  if use_live:
    import stablehlo_amp as amp
    version = getattr(amp, "__version__", "?")
    where = pathlib.Path(amp.__file__).parent
    print(f"  our variants: stablehlo_amp {version} from {where}, rewritten "
          f"here for target {amp.RewriteOptions.make().target}")
  else:
    print(f"  our variants: artifacts from {artifacts}" +
          (f" (stablehlo_amp: {why_not_live})" if why_not_live else ""))
  for lib, hint in (("jmp", "jmp==0.0.4"),
                    ("mpx", "mixed-precision-for-jax==0.1.8 (+ equinox, "
                     "jaxtyping, wadler_lindig)")):
    try:
      __import__(lib)
    except ImportError as error:
      print(f"  {lib} is missing ({error}): its variants are left out; put "
            f"its wheel in {args.wheels} (pip download --no-deps {hint})")

  json_path = (pathlib.Path(args.json) if args.json else common.RESULTS /
               ("gpu-smoke.json" if args.smoke else "gpu.json"))

  def run(names: list[str], variants: list[str], use_live: bool,
          artifacts: pathlib.Path, results: dict) -> dict:
    if not use_live:
      variants = [v for v in variants if not v.endswith("-scaling-delayed")]
    if not use_live and "f32-exported" not in variants:
      variants.insert(1, "f32-exported")
    results.update({"benchmark": "peers-gpu", "environment": env,
                    "size": size,
                    "ours_source": "live" if use_live else "artifacts",
                    "donated": donate, "seeds": seeds, "variants": variants,
                    "models": {}})
    for index, name in enumerate(names):
      config = configs(size)[name]
      key = _key(name, config)
      builders = {"f32-exported": functools.partial(build_f32_exported,
                                                    artifacts, key)}
      if not use_live:
        for variant in OURS:
          builders[variant] = functools.partial(build_ours_artifact,
                                                artifacts, key, variant)
      # Each model gets its share of the remaining budget for its steps.
      remaining = args.budget_s - (time.perf_counter() - start)
      deadline = time.perf_counter() + remaining / (len(names) - index)
      make = functools.partial(make_model, name, config)
      print(f"\n## {make(seeds[0]).description}")
      result = peers.bench_model(lambda seed: make(seed=seed), variants,
                                 steps, warmup, seeds, builders=builders,
                                 deadline=deadline, donate=donate)
      results["models"][name] = result
      print()
      print(result["table"], flush=True)
      top["elapsed_s"] = time.perf_counter() - start
      common.write_json(json_path, top)  # after each model: partial results
    return results

  top: dict = {}
  variants = [v for v in (args.variants or ",".join(
      SMOKE_VARIANTS if args.smoke else VARIANTS)).split(",") if v]
  models = args.models or ("mlp" if args.smoke else "lm,mlp")
  run([n for n in models.split(",") if n], variants, use_live, artifacts, top)
  if args.smoke and use_live and args.ours == "auto":
    def prepare_and_run(directory: pathlib.Path, name: str, ours: tuple):
      prepare(size, "cpu", directory, models=(name,), variants=ours)
      top["fallback"] = run([name], list(ours), False, directory, {})
    smoke_fallback(prepare_and_run)
  out = os.environ.get("OUT")
  if out and pathlib.Path(out).is_dir() and pathlib.Path(out) != json_path.parent:
    common.write_json(pathlib.Path(out) / json_path.name, top)
  print(f"\nwrote {json_path} ({time.perf_counter() - start:.0f} s in all)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
