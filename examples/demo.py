"""The main job: train a small transformer LM four ways on the same data.

f32 (plain `jax.jit`), and the same loss and optimizer through
`amp.train_step`: bf16, f16 with dynamic loss scaling, and f16 without loss
scaling (to show what scaling is for). Same seed, same batches. Nothing in the
model changes: the compiler pass rewrites the training step.

    python examples/demo.py [--steps N] [--d-model D] [--layers L] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import stablehlo_amp as amp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm  # noqa: E402


def progress(label: str, step: int, total: int, loss: float) -> None:
  tty = sys.stdout.isatty()
  if not tty and step != total and step % max(total // 4, 1):
    return  # a log file gets a line per quarter, not a redraw per step
  width = 30
  filled = width * step // total
  bar = "#" * filled + "." * (width - filled)
  print(f"{chr(13) if tty else ''}  {label:<22} [{bar}] {step:>5}/{total} "
        f"loss {loss:.3f}", end="\n" if step == total or not tty else "",
        flush=True)


def memory_mib(compiled) -> tuple[float, float]:
  m = compiled.memory_analysis()
  total = (m.argument_size_in_bytes + m.output_size_in_bytes +
           m.temp_size_in_bytes - m.alias_size_in_bytes)
  return total / 2 ** 20, m.temp_size_in_bytes / 2 ** 20


def held_out_loss(params, config, held_out) -> float:
  eval_loss = jax.jit(functools.partial(lm.loss_fn, config=config))
  batches = lm.batches(held_out, config, seed=1)
  return float(np.mean([eval_loss(params, jnp.asarray(next(batches)))
                        for _ in range(16)]))


def run_f32(config, params, tokens, steps):
  step = jax.jit(functools.partial(lm.train_step, config=config))
  opt_state = lm.optimizer(config).init(params)
  example = jnp.asarray(next(lm.batches(tokens, config, 0)))
  start = time.perf_counter()
  compiled = step.lower(params, opt_state, example).compile()
  info = {"compile_s": time.perf_counter() - start, "rewrite_s": 0.0,
          "converts": 0, "memory": memory_mib(compiled)}
  data = lm.batches(tokens, config, seed=0)
  losses, times = [], []
  for i in range(1, steps + 1):
    batch = jnp.asarray(next(data))
    start = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, batch)
    losses.append(float(loss))
    times.append(time.perf_counter() - start)
    progress("f32", i, steps, losses[-1])
  return params, losses, times, 0, info


def run_amp(label, policy, loss_scale, config, params, tokens, steps):
  step = amp.train_step(functools.partial(lm.loss_fn, config=config),
                        lm.optimizer(config), policy, loss_scale=loss_scale)
  state = step.init(params)
  example = jnp.asarray(next(lm.batches(tokens, config, 0)))
  lowered = step.lower(state, example)
  start = time.perf_counter()
  compiled = lowered.compile()
  report = lowered.report()
  info = {"compile_s": time.perf_counter() - start,
          "rewrite_s": lowered.timings.rewrite,
          "converts": report.converts_inserted, "memory": memory_mib(compiled),
          "report": str(report)}
  data = lm.batches(tokens, config, seed=0)
  losses, times = [], []
  for i in range(1, steps + 1):
    batch = jnp.asarray(next(data))
    start = time.perf_counter()
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
    times.append(time.perf_counter() - start)
    progress(label, i, steps, losses[-1])
  return state.params, losses, times, int(metrics["skipped_steps"]), info


def plot(results, out_dir) -> tuple[str, str]:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  curves = os.path.join(out_dir, "loss_curves.png")
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for r in results:
    losses = np.asarray(r["losses"])
    window = max(len(losses) // 40, 1)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    ax.plot(np.arange(len(smooth)) + window, smooth, label=r["name"])
  ax.set_xlabel("step")
  ax.set_ylabel("train loss (moving average)")
  ax.set_title("Transformer LM on Python stdlib text")
  ax.legend()
  fig.tight_layout()
  fig.savefig(curves, dpi=120)
  bars = os.path.join(out_dir, "time_memory.png")
  fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
  names = [r["name"] for r in results]
  axes[0].bar(names, [r["step_ms"] for r in results], color="tab:blue")
  axes[0].set_ylabel("median step time (ms)")
  axes[1].bar(names, [r["memory_mib"] for r in results], color="tab:orange")
  axes[1].set_ylabel("XLA memory total (MiB)")
  for ax in axes:
    ax.tick_params(axis="x", rotation=30)
  fig.tight_layout()
  fig.savefig(bars, dpi=120)
  return curves, bars


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=500)
  parser.add_argument("--d-model", type=int, default=128)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--out", default="out/demo")
  args = parser.parse_args(argv)
  config = lm.Config(d_model=args.d_model, layers=args.layers, seq=args.seq,
                     batch=args.batch)
  os.makedirs(args.out, exist_ok=True)

  tokens, held_out = lm.split(lm.corpus())
  print(f"corpus: {len(tokens):,} training and {len(held_out):,} held-out "
        f"characters of the Python standard library")
  print(f"model: {config.layers} layers, d_model {config.d_model}, "
        f"{config.heads} heads, seq {config.seq}, batch {config.batch}; "
        f"{args.steps} Adam steps; backend {jax.default_backend()}")
  params = lm.init(jax.random.key(0), config)

  runs = [
      ("f32", None, None),
      ("bf16", "p=f32,c=bf16,o=f32", amp.NoOpLossScale()),
      ("f16 + loss scaling", "p=f32,c=f16,o=f32", amp.DynamicLossScale()),
      ("f16, no scaling", "p=f32,c=f16,o=f32", amp.NoOpLossScale()),
  ]
  results = []
  for name, policy, loss_scale in runs:
    if policy is None:
      final, losses, times, skipped, info = run_f32(config, params, tokens,
                                                    args.steps)
    else:
      final, losses, times, skipped, info = run_amp(
          name, policy, loss_scale, config, params, tokens, args.steps)
    results.append({
        "name": name, "policy": policy or "f32", "losses": losses,
        "final_train": float(np.mean(losses[-20:])),
        "held_out": held_out_loss(final, config, held_out),
        "step_ms": 1e3 * statistics.median(times[5:] or times),
        "memory_mib": info["memory"][0], "temp_mib": info["memory"][1],
        "converts": info["converts"], "rewrite_s": info["rewrite_s"],
        "compile_s": info["compile_s"], "skipped": skipped,
        "report": info.get("report"),
    })

  print()
  print(results[1]["report"])
  print()
  base = results[0]
  print("| run | final train loss | held-out loss | step ms (median) | vs f32 "
        "| memory total MiB | temp MiB | converts | rewrite s | compile s | "
        "skipped steps |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['name']} | {r['final_train']:.4f} | {r['held_out']:.4f} | "
          f"{r['step_ms']:.1f} | {r['step_ms'] / base['step_ms']:.2f}x | "
          f"{r['memory_mib']:.1f} | {r['temp_mib']:.1f} | {r['converts']} | "
          f"{r['rewrite_s']:.3f} | {r['compile_s']:.2f} | {r['skipped']} |")
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  try:
    curves, bars = plot(results, args.out)
    print(f"\nwrote {curves}, {bars} and {args.out}/results.json")
  except ImportError:
    print(f"\nmatplotlib is not installed: wrote {args.out}/results.json only")
  return 0


if __name__ == "__main__":
  sys.exit(main())
