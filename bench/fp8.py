"""FP8 GEMMs on CPU: the error of each scaling on a GEMM with outliers, and
held-out loss of bf16 and FP8 (per-tensor current and delayed, rowwise,
MXFP8 scaling) against f32, over 3 seeds.

The outlier GEMM: x (256 x 1024, N(0, 1)) with 2 rows 3000x the rest and 8
channels 30x, times w (1024 x 256, N(0, 1/1024)), through `amp.transform`
(the output) and `amp.value_and_grad` of sum((x @ w) * g) (the weight
gradient x^T g, whose GEMM contracts over the rows), for bf16, per-tensor,
rowwise and MXFP8 FP8 (`fp8_scaling`). It prints the median, over the
ordinary rows, of each row's relative output error against float64, and the
weight gradient's relative error (Frobenius), per seed.

The demo's LM (examples/lm.py: d_model 128, 2 layers, 4 heads, seq 128,
batch 16, Adam 3e-3; the peers' byte-pair data) and the peers' MLP
(784-1024-1024-10), each trained as f32 and through `amp.train_step` with
`p=f32,c=bf16,o=f32`, `...,gemm=f8` (e4m3fn forward, e5m2 gradients,
current scaling) and `...,gemm=f8` with `fp8_scaling="delayed"` (amax
history of 16). Interleaved step by step on the same batches (bench/peers.py
does the training). XLA:CPU emulates the FP8 converts: the step times say
nothing about a GPU; the held-out losses are what this measures.

    python -m bench.fp8 [--steps 300] [--seeds 0,1,2] [--models lm,mlp]
                        [--variants f32,ours-bf16,...]
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
            "ours-bf16-gemm-f8-scaling-delayed",
            "ours-bf16-gemm-f8-scaling-rowwise",
            "ours-bf16-gemm-f8-scaling-mxfp8")
SCALINGS = ("current", "rowwise", "mxfp8")
MODELS = {
    "lm": lambda seed: common.make_lm(
        common.LMConfig(d_model=128, layers=2, heads=4, seq=128, batch=16),
        seed=seed),
    "mlp": lambda seed: common.make_mlp(common.MLPConfig(), seed=seed),
}


def outlier_data(seed: int, m: int = 256, k: int = 1024, n: int = 256):
  """x with 2 outlier rows (3000x) and 8 outlier channels (30x), w
  N(0, 1/k), a cotangent g, and which rows are ordinary."""
  import numpy as np
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((m, k)).astype(np.float32)
  rows = rng.choice(m, 2, replace=False)
  x[rows] *= 3000
  x[:, rng.choice(k, 8, replace=False)] *= 30
  w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
  g = rng.standard_normal((m, n)).astype(np.float32)
  ordinary = np.ones(m, bool)
  ordinary[rows] = False
  return x, w, g, ordinary


def outlier_gemm(seeds, size=(256, 1024, 256)) -> dict:
  """Per policy (bf16, then each FP8 scaling): the median over ordinary
  rows of the output's relative row error, and the weight gradient's
  relative error, each against float64, per seed."""
  import numpy as np
  import stablehlo_amp as amp
  bf16, f8 = "p=f32,c=bf16,o=f32", "p=f32,c=bf16,o=f32,gemm=f8"
  policies = {"bf16": (bf16, {})}
  policies.update({f"fp8 {s}": (f8, {"fp8_scaling": s}) for s in SCALINGS})
  out = {}
  for label, (policy, options) in policies.items():
    rows = []
    for seed in seeds:
      x, w, g, ordinary = outlier_data(seed, *size)
      y = np.asarray(amp.transform(lambda a, b: a @ b, policy,
                                   **options)(x, w))
      (_, dw), *_ = amp.value_and_grad(
          lambda b, a, c: (a @ b * c).sum(), policy, **options)(w, x, g)
      want = x.astype(np.float64) @ w.astype(np.float64)
      want_dw = x.astype(np.float64).T @ g.astype(np.float64)
      row_error = (np.linalg.norm(y - want, axis=1) /
                   np.linalg.norm(want, axis=1))
      rows.append({
          "output": float(np.median(row_error[ordinary])),
          "weight_gradient": float(np.linalg.norm(np.asarray(dw) - want_dw) /
                                   np.linalg.norm(want_dw))})
    out[label] = rows
  return out


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
  parser.add_argument("--variants", help=f"default {','.join(VARIANTS)}")
  parser.add_argument("--json", help="default bench/results/fp8[-smoke].json")
  args = parser.parse_args(argv)
  variants = tuple(args.variants.split(",")) if args.variants else VARIANTS
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
  size = (64, 256, 64) if args.smoke else (256, 1024, 256)
  print(f"\n## GEMM {size[0]}x{size[1]}x{size[2]} with outlier rows (3000x) "
        "and channels (30x): relative error against float64, mean over "
        f"seeds {seeds} [min, max]")
  print("| policy | output (median over ordinary rows) | weight gradient |")
  print("|---|---|---|")
  results["outlier_gemm"] = outlier_gemm(seeds, size)
  for label, rows in results["outlier_gemm"].items():
    cells = []
    for key in ("output", "weight_gradient"):
      values = [r[key] for r in rows]
      cells.append(f"{statistics.fmean(values):.4f} [{min(values):.4f}, "
                   f"{max(values):.4f}]")
    print(f"| {label} | {cells[0]} | {cells[1]} |")
  for name in args.models.split(","):
    make = models[name]
    print(f"\n## {make(seeds[0]).description}")
    result = peers.bench_model(make, variants, args.steps, warmup, seeds)
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
