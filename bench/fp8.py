"""FP8 GEMMs on CPU: held-out loss of bf16, FP8 with current scaling and FP8
with delayed scaling, against f32, over 3 seeds.

The demo's LM (examples/lm.py: d_model 128, 2 layers, 4 heads, seq 128,
batch 16, Adam 3e-3; the peers' byte-pair data) and the peers' MLP
(784-1024-1024-10), each trained as f32 and through `amp.train_step` with
`p=f32,c=bf16,o=f32`, `...,gemm=f8` (e4m3fn forward, e5m2 gradients,
current scaling) and `...,gemm=f8` with `fp8_scaling="delayed"` (amax
history of 16). Interleaved step by step on the same batches (bench/peers.py
does the training). XLA:CPU emulates the FP8 converts: the step times say
nothing about a GPU; the held-out losses are what this measures.

    python -m bench.fp8 [--steps 300] [--seeds 0,1,2] [--models lm,mlp]
    python -m bench.fp8 --smoke     # tiny MLP, 2 steps: checks the script

Prints, per model, the peers table and the held-out loss of each FP8
variant minus bf16's on the same seed (mean ± sample sd [min, max]); writes
bench/results/fp8[-smoke].json.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench import common
from bench import peers

VARIANTS = ("f32", "ours-bf16", "ours-bf16-gemm-f8",
            "ours-bf16-gemm-f8-scaling-delayed")
MODELS = {
    "lm": lambda seed: common.make_lm(
        common.LMConfig(d_model=128, layers=2, heads=4, seq=128, batch=16),
        seed=seed),
    "mlp": lambda seed: common.make_mlp(common.MLPConfig(), seed=seed),
}


def against_bf16(result: dict) -> dict:
  """Held-out loss of each FP8 variant minus bf16's, per seed."""
  rows = {row["variant"]: row for row in result["rows"]}
  bf16 = rows["ours-bf16"]["held_out_by_seed"]
  out = {}
  for variant in VARIANTS[2:]:
    if variant not in rows:
      continue
    mine = rows[variant]["held_out_by_seed"]
    diffs = [mine[seed] - bf16[seed] for seed in bf16 if seed in mine]
    out[variant] = {
        "by_seed": diffs, "mean": statistics.fmean(diffs),
        "sd": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
        "min": min(diffs), "max": max(diffs),
        "bf16_mean": statistics.fmean(bf16.values()),
        "mean_loss": statistics.fmean(mine.values())}
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int,
                      help="default 300; --smoke 2")
  parser.add_argument("--seeds", help="default 0,1,2; --smoke 0")
  parser.add_argument("--models", help="default lm,mlp; --smoke mlp")
  parser.add_argument("--smoke", action="store_true",
                      help="the tiny MLP, 2 steps, 1 seed: checks the "
                      "script works (not a measurement)")
  parser.add_argument("--json", help="default bench/results/fp8[-smoke].json")
  args = parser.parse_args(argv)
  args.steps = args.steps or (2 if args.smoke else 300)
  seeds = [int(s) for s in (args.seeds or ("0" if args.smoke else "0,1,2"))
           .split(",")]
  warmup = 1 if args.smoke else 5
  args.models = args.models or ("mlp" if args.smoke else "lm,mlp")
  models = MODELS
  if args.smoke:
    configs = common.smoke_configs()
    models = {"lm": lambda seed: common.make_lm(configs["lm"], seed=seed),
              "mlp": lambda seed: common.make_mlp(configs["mlp"], seed=seed)}
  env = common.environment()
  print(f"fp8: backend {env['backend']}, jax {env['jax']}, {args.steps} steps "
        f"x seeds {seeds}")
  results = {"benchmark": "fp8", "environment": env, "steps": args.steps,
             "seeds": seeds, "models": {}}
  for name in args.models.split(","):
    make = models[name]
    print(f"\n## {make(seeds[0]).description}")
    result = peers.bench_model(make, VARIANTS, args.steps, warmup, seeds)
    result["fp8_vs_bf16"] = against_bf16(result)
    results["models"][name] = result
    print()
    print(result["table"])
    print("\nheld-out loss minus bf16's (same seed), mean ± sd [min, max]:")
    for variant, d in result["fp8_vs_bf16"].items():
      print(f"  {peers.LABELS.get(variant, variant)}: {d['mean']:+.4f} ± "
            f"{d['sd']:.4f} [{d['min']:+.4f}, {d['max']:+.4f}] "
            f"(bf16 {d['bf16_mean']:.4f}, this {d['mean_loss']:.4f})")
  path = common.write_json(
      common.pathlib.Path(args.json) if args.json else
      common.RESULTS / ("fp8-smoke.json" if args.smoke else "fp8.json"),
      results)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
