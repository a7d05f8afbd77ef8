"""Step time on a real GPU, measured beside the estimate.

    make gpu-bench                          # the CUDA venv, then this
    python -m bench.gpu_step                # on a machine with a CUDA GPU
    python -m bench.gpu_step --models lm --variants jmp-style,ours-bf16
    python -m bench.gpu_step --smoke        # anywhere: the tiny LM on this
                                            # machine's device (jmp-style,
                                            # ours-bf16), 2 timed steps

The training steps of bench/gpu_compile.py (the LM, the ViT and the MoE LM,
Adam, state donated), each variant compiled on the GPU this process sees,
run `--warmup` times, then timed `--steps` times (each step waited for);
the table gives the median beside the estimate that bench/gpu_compile.py
makes from the same optimized program on the GPU's roofline (`--gpu`,
default h100: on another GPU the estimate is for the H100, and says so).
With no GPU it says so and exits 0 (--smoke runs on the CPU, at tiny size,
so that `make test` keeps the script working).

Writes bench/results/gpu-step.json (--json; a copy in $OUT when set).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

VARIANTS = ("f32", "jmp-style", "ours-bf16", "ours-bf16-gemm-f8")


def _parse(argv):
  parser = argparse.ArgumentParser(
      prog="python -m bench.gpu_step",
      description="Measured step time beside the roofline estimate.")
  parser.add_argument("--models", default=None,
                      help="default lm,vit,moe (--smoke: lm)")
  parser.add_argument("--variants", default=None,
                      help=f"default {','.join(VARIANTS)} (--smoke: "
                           "jmp-style,ours-bf16)")
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--gpu", default="h100",
                      help="the roofline the estimate uses (h100, b200)")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny models on this machine's device (the CPU "
                           "without a GPU), 1 warm-up and 2 timed steps")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  if args.smoke:
    args.warmup, args.steps = 1, 2
  args.models = args.models or ("lm" if args.smoke else "lm,vit,moe")
  args.variants = args.variants or ("jmp-style,ours-bf16" if args.smoke
                                    else ",".join(VARIANTS))
  if args.warmup < 0 or args.steps < 1:
    parser.error("--warmup must be at least 0 and --steps at least 1")
  return args


def _time_step(step, state, batch, warmup: int, steps: int
               ) -> tuple[float, object]:
  """The median seconds of `steps` calls after `warmup` calls, each waited
  for; the state is donated and handed on, as in a training loop."""
  import jax
  for _ in range(warmup):
    state, _ = step(state, batch)
  jax.block_until_ready(state)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, out = step(state, batch)
    jax.block_until_ready((state, out))
    times.append(time.perf_counter() - start)
  return statistics.median(times), state


def main(argv=None) -> int:
  args = _parse(argv)
  import jax
  import jax.numpy as jnp
  import optax

  import stablehlo_amp as amp
  from bench import common, gpu, gpu_compile

  on_gpu = any(d.platform == "gpu" for d in jax.devices())
  if not on_gpu and not args.smoke:
    print("no GPU here (jax.devices(): "
          f"{', '.join(sorted({d.platform for d in jax.devices()}))}): "
          "nothing timed. `python -m bench.gpu_compile` estimates the step "
          "without one; --smoke checks this script on the CPU.")
    return 0
  target = "gpu" if on_gpu else "cpu"
  size = "smoke" if args.smoke else "gpu"
  configs = {**gpu.configs(size), **common.compiled_step_configs(size)}
  try:
    roofline = common.amp_internals().roofline(args.gpu)
  except ValueError as error:
    print(error, file=sys.stderr)
    return 2
  device = jax.devices()[0].device_kind
  results = {"device": device, "jax": jax.__version__, "roofline":
             roofline.device, "warmup": args.warmup, "steps": args.steps,
             "models": {}}
  for name in args.models.split(","):
    if name not in configs:
      print(f"unknown model {name!r} (known: {', '.join(configs)})",
            file=sys.stderr)
      return 2
    init, loss, batch_spec = common.model_step_parts(name, configs[name])
    params = init(jax.random.key(0))
    batch = jax.tree_util.tree_map(
        lambda s: (jax.random.randint(jax.random.key(1), s.shape, 0, 10,
                                      s.dtype)
                   if jnp.issubdtype(s.dtype, jnp.integer) else
                   jax.random.normal(jax.random.key(1), s.shape, s.dtype)),
        batch_spec)
    # As in bench/gpu_compile.py: the ViT's GEMMs to cuBLAS.
    options = ({"xla_gpu_enable_triton_gemm": False}
               if name == "vit" and on_gpu else {})
    tx = optax.adam(1e-3)
    rows = []
    print(f"\n### {name} on {device} ({target}), jax {jax.__version__}: "
          f"median of {args.steps} steps after {args.warmup}, state donated"
          + ("" if on_gpu else " (an XLA:CPU program priced on a GPU's "
             "roofline: this checks the script, it is no GPU time)"))
    for variant in args.variants.split(","):
      if variant in gpu_compile.OURS:
        policy, extra = gpu_compile.OURS[variant]
        step = amp.train_step(lambda p, b: loss(p, b), tx, policy,
                              donate=True, target=target, **extra)
        state = step.init(params)
        compiled = step.lower(state, batch).compile(compiler_options=options)
      elif variant in ("f32", "jmp-style"):
        plain = jax.jit(common.plain_step(loss, tx,
                                          cast_inside=variant == "jmp-style"),
                        donate_argnums=0)
        state = (params, tx.init(params))
        compiled = plain.lower(state, batch).compile(
            compiler_options=options)
        step = compiled
      else:
        print(f"unknown variant {variant!r} (known: {', '.join(VARIANTS)})",
              file=sys.stderr)
        return 2
      state = jax.tree_util.tree_map(jnp.copy, state)  # donated: our own
      seconds, _ = _time_step(step, state, batch, args.warmup, args.steps)
      estimate = common.hlo_reader().estimate(
          common.hlo_reader().Module.parse(compiled.as_text()), roofline)
      rows.append({"variant": variant, "measured_ms": seconds * 1e3,
                   "estimate_ms": estimate.seconds * 1e3,
                   "kernels": estimate.kernels})
    hand = next((r for r in rows if r["variant"] == "jmp-style"), None)
    print(f"\n| variant | measured ms | vs jmp-style | est. ms "
          f"({roofline.device}) | vs jmp-style | kernels |")
    print("|---|---|---|---|---|---|")
    for row in rows:
      ratio = (lambda key: f"{row[key] / hand[key]:.2f}x" if hand else "–")
      print(f"| {row['variant']} | {row['measured_ms']:.2f} | "
            f"{ratio('measured_ms')} | {row['estimate_ms']:.2f} | "
            f"{ratio('estimate_ms')} | {row['kernels']} |")
    results["models"][name] = rows
  path = pathlib.Path(args.json) if args.json else (
      common.RESULTS / ("gpu-step-smoke.json" if args.smoke else
                        "gpu-step.json"))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(results, indent=1))
  if os.environ.get("OUT"):
    (pathlib.Path(os.environ["OUT"]) / path.name).write_text(path.read_text())
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
