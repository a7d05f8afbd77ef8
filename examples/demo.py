"""The main job: train a small transformer LM in f32 and through stablehlo-amp.

Same seed, same batches, same optimizer; the mixed-precision run is the f32
training step rewritten by the compiler pass, nothing in the model changed.

    python examples/demo.py [--steps N] [--policy p=f32,c=bf16,o=f32 ...]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import stablehlo_amp as amp

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import lm  # noqa: E402


def progress(label: str, step: int, total: int, loss: float) -> None:
  if not sys.stdout.isatty() and step != total and step % max(total // 4, 1):
    return  # a log file gets a line per quarter, not a redraw per step
  width = 30
  filled = width * step // total
  bar = "#" * filled + "." * (width - filled)
  tty = sys.stdout.isatty()
  end = "\n" if step == total or not tty else ""
  print(f"{chr(13) if tty else ''}  {label:<10} [{bar}] {step:>4}/{total} "
        f"loss {loss:.3f}", end=end, flush=True)


def run(label: str, step_fn, params, opt_state, config, tokens, held_out,
        steps: int, eval_loss) -> dict:
  data = lm.batches(tokens, config, seed=0)
  losses, times = [], []
  for i in range(1, steps + 1):
    batch = jnp.asarray(next(data))
    start = time.perf_counter()
    params, opt_state, loss = step_fn(params, opt_state, batch)
    loss = float(loss)  # waits for the step
    times.append(time.perf_counter() - start)
    losses.append(loss)
    if i % 10 == 0 or i == steps:
      progress(label, i, steps, loss)
  eval_batches = lm.batches(held_out, config, seed=1)
  held = float(np.mean([eval_loss(params, jnp.asarray(next(eval_batches)))
                        for _ in range(8)]))
  return {"losses": losses, "held_out": held,
          "step_ms": 1e3 * statistics.median(times[5:] or times)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--policy", action="append",
                      help="policies to compare with f32 (repeatable; "
                      "default p=f32,c=bf16,o=f32)")
  args = parser.parse_args(argv)
  policies = args.policy or ["p=f32,c=bf16,o=f32"]

  config = lm.Config()
  tokens, held_out = lm.split(lm.corpus())
  print(f"corpus: {len(tokens):,} training and {len(held_out):,} held-out "
        f"characters of the Python standard library; backend "
        f"{jax.default_backend()}")
  params = lm.init(jax.random.key(0), config)
  opt_state = lm.optimizer(config).init(params)
  step = functools.partial(lm.train_step, config=config)
  eval_loss = jax.jit(functools.partial(lm.loss_fn, config=config))
  example = (params, opt_state, jnp.asarray(next(lm.batches(tokens, config, 0))))

  rows = []
  f32_step = jax.jit(step)
  start = time.perf_counter()
  f32_compiled = f32_step.lower(*example).compile()
  f32_compile = time.perf_counter() - start
  result = run("f32", f32_step, params, opt_state, config, tokens, held_out,
               args.steps, eval_loss)
  rows.append(("f32", result, f32_compiled, None, 0.0, f32_compile))

  for policy in policies:
    fast = amp.transform(step, policy)
    lowered = fast.lower(*example)
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    report = lowered.report()
    result = run(policy.split(",")[1], fast, params, opt_state, config,
                 tokens, held_out, args.steps, eval_loss)
    rows.append((policy, result, compiled, report, lowered.timings.rewrite,
                 compile_s))
    print()
    print(report)

  print()
  print("| run | final train loss | held-out loss | step ms (median) | "
        "memory total MiB | temp MiB | converts inserted | rewrite s | "
        "compile s |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name, result, compiled, report, rewrite_s, compile_s in rows:
    memory = compiled.memory_analysis()
    total = (memory.argument_size_in_bytes + memory.output_size_in_bytes +
             memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    converts = report.converts_inserted if report else 0
    print(f"| {name} | {np.mean(result['losses'][-10:]):.4f} | "
          f"{result['held_out']:.4f} | {result['step_ms']:.1f} | "
          f"{total / 2**20:.2f} | {memory.temp_size_in_bytes / 2**20:.2f} | "
          f"{converts} | {rewrite_s:.3f} | {compile_s:.2f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
