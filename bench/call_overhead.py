"""What `amp.transform` costs per call: the first call of a signature (lower,
rewrite, XLA compile) and a cached call, against plain `jax.jit`, for the
transformer LM training step of examples/lm.py.

    python bench/call_overhead.py [--layers 2] [--calls 200]
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import stablehlo_amp as amp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "examples"))
import lm  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--calls", type=int, default=200)
  parser.add_argument("--json", default="bench/results/call_overhead.json")
  args = parser.parse_args(argv)
  # Tiny shapes: the step itself is cheap, so dispatch overhead shows.
  config = lm.Config(d_model=64, heads=2, layers=args.layers, seq=16, batch=2)
  params = lm.init(jax.random.key(0), config)
  opt_state = lm.optimizer(config).init(params)
  batch = jnp.asarray(next(lm.batches(lm.split(lm.corpus(200_000))[0],
                                      config, 0)))
  step = functools.partial(lm.train_step, config=config)

  fast = amp.transform(step, "p=f32,c=bf16,o=f32")
  start = time.perf_counter()
  lowered = fast.lower(params, opt_state, batch)
  lower_and_rewrite = time.perf_counter() - start
  start = time.perf_counter()
  lowered.compile()
  compile_s = time.perf_counter() - start
  timings = lowered.timings

  plain = jax.jit(step)
  def per_call(fn) -> float:
    out = fn(params, opt_state, batch)
    jax.block_until_ready(out)
    samples = []
    for _ in range(args.calls):
      start = time.perf_counter()
      jax.block_until_ready(fn(params, opt_state, batch))
      samples.append(time.perf_counter() - start)
    return statistics.median(samples)
  # Interleave to share the machine's noise.
  amp_calls, jit_calls = [], []
  for _ in range(5):
    amp_calls.append(per_call(fast))
    jit_calls.append(per_call(plain))
  result = {
      "ops": lowered.as_text().count("\n"),
      "first_call": {"lower_s": timings.lower, "rewrite_s": timings.rewrite,
                     "lower_and_rewrite_wall_s": lower_and_rewrite,
                     "xla_compile_s": compile_s},
      "cached_call_us": {"amp.transform": 1e6 * statistics.median(amp_calls),
                         "jax.jit": 1e6 * statistics.median(jit_calls)},
      "rewrites": fast.rewrite_count,
  }
  print(f"| first call | seconds |\n|---|---|\n"
        f"| lower (jax.export) | {timings.lower:.3f} |\n"
        f"| rewrite (print, passes, parse + verify) | {timings.rewrite:.3f} |\n"
        f"| XLA compile | {compile_s:.3f} |\n")
  print(f"| cached call (tiny step, median) | microseconds |\n|---|---|\n"
        f"| jax.jit | {result['cached_call_us']['jax.jit']:.0f} |\n"
        f"| amp.transform | {result['cached_call_us']['amp.transform']:.0f} |")
  print(f"\nsignatures rewritten: {fast.rewrite_count} "
        f"(module of about {result['ops']} lines)")
  os.makedirs(os.path.dirname(args.json), exist_ok=True)
  pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
  with open(args.json, "w") as f:
    json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
