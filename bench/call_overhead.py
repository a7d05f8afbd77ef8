"""What `amp.transform` costs per call: the first call of a signature (lower,
rewrite, XLA compile) and a cached call, against plain `jax.jit`, for the
transformer LM training step of examples/lm.py.

    python -m bench.call_overhead [--layers 2] [--calls 200]
    python -m bench.call_overhead --smoke   # 1 layer, 5 calls: checks the script

Writes bench/results/call_overhead[-smoke].json.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import stablehlo_amp as amp
from bench import common

lm = common.lm  # examples/lm.py


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, help="default 2; --smoke 1")
  parser.add_argument("--calls", type=int,
                      help="timed calls per round, 5 rounds (default 200; "
                      "--smoke: 5 calls, 1 round)")
  parser.add_argument("--smoke", action="store_true",
                      help="checks the script works (not a measurement)")
  parser.add_argument("--json", help="default bench/results/"
                      "call_overhead[-smoke].json")
  args = parser.parse_args(argv)
  args.layers = args.layers or (1 if args.smoke else 2)
  args.calls = args.calls or (5 if args.smoke else 200)
  rounds = 1 if args.smoke else 5
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
  for _ in range(rounds):
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
  path = common.write_json(
      pathlib.Path(args.json) if args.json else common.RESULTS /
      ("call_overhead-smoke.json" if args.smoke else "call_overhead.json"),
      result)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
