"""Time and peak memory of `amp.rewrite_module` against module size, for LM
training steps of 1 to 200 layers (about 1k to 100k ops).

Each size is lowered here, written to a file, and rewritten in a fresh
subprocess whose peak RSS before and after the rewrite gives the memory the
rewrite needed (jaxlib parse + print, C++ parse + passes + print, jaxlib
parse + verify). The subprocess parses the module first, in the context
with JAX's dialects (bench.common.amp_internals), so that the parse is not
part of the figures.

    python -m bench.rewrite_scale [--layers 1,4,16,64,200]
    python -m bench.rewrite_scale --smoke    # 1 and 2 layers: checks the script

Writes bench/results/rewrite_scale[-smoke].json.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import pathlib
import subprocess
import sys
import tempfile

from bench import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHILD = r"""
import os, sys, threading, time
from jax.extend.mlir import ir
import stablehlo_amp as amp
from bench import common
PAGE = os.sysconf("SC_PAGE_SIZE")
def rss():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * PAGE
text = open(sys.argv[1]).read()
context = common.amp_internals().ir_context()
with context:
  module = ir.Module.parse(text, context)
  base = peak = rss()
  done = False
  def sample():
    global peak
    while not done:
      peak = max(peak, rss())
      time.sleep(0.001)
  sampler = threading.Thread(target=sample)
  sampler.start()
  start = time.perf_counter()
  result = amp.rewrite_module(module, "p=f32,c=bf16,o=f32", target="cpu",
                              report=False, context=context)
  seconds = time.perf_counter() - start
  done = True
  sampler.join()
  peak = max(peak, rss())
print(seconds, (peak - base) / 2**20, base / 2**20)
"""


def count_ops(text: str) -> int:
  return sum(1 for line in text.splitlines()
             if " = " in line or line.strip().startswith(("stablehlo.", "func.return", "return ")))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", help="default 1,4,16,64,200; --smoke 1,2")
  parser.add_argument("--smoke", action="store_true",
                      help="checks the script works (not a measurement)")
  parser.add_argument("--json", help="default bench/results/"
                      "rewrite_scale[-smoke].json")
  args = parser.parse_args(argv)
  args.layers = args.layers or ("1,2" if args.smoke else "1,4,16,64,200")
  import jax
  import jax.numpy as jnp
  lm = common.lm  # examples/lm.py
  rows = []
  print("| layers | ops | rewrite s | peak memory of the rewrite (MiB) | "
        "process RSS before (MiB) |\n|---|---|---|---|---|")
  for layers in [int(x) for x in args.layers.split(",")]:
    config = lm.Config(d_model=64, heads=2, layers=layers, seq=16, batch=2)
    params = lm.init(jax.random.key(0), config)
    opt_state = lm.optimizer(config).init(params)
    batch = jnp.zeros((config.batch, config.seq + 1), jnp.int32)
    text = jax.jit(functools.partial(lm.train_step, config=config)).lower(
        params, opt_state, batch).as_text()
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
      f.write(text)
    # From the repository root, where `bench` imports.
    out = subprocess.run([sys.executable, "-c", CHILD, f.name],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
      raise SystemExit(f"the rewrite of {layers} layers failed:\n"
                       f"{out.stderr}")
    os.unlink(f.name)
    seconds, peak_mib, base_mib = map(float, out.stdout.split()[-3:])
    ops = count_ops(text)
    rows.append({"layers": layers, "ops": ops, "rewrite_s": seconds,
                 "peak_mib": peak_mib, "rss_before_mib": base_mib})
    print(f"| {layers} | {ops} | {seconds:.2f} | {peak_mib:.0f} | "
          f"{base_mib:.0f} |", flush=True)
  def exponent(key):
    xs = [math.log(r["ops"]) for r in rows if r[key] > 0]
    ys = [math.log(r[key]) for r in rows if r[key] > 0]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
            sum((x - mx) ** 2 for x in xs))
  growth = {"time": exponent("rewrite_s"), "memory": exponent("peak_mib")}
  print(f"\ngrowth exponents (log-log fit): time {growth['time']:.2f}, "
        f"memory {growth['memory']:.2f}")
  path = common.write_json(
      pathlib.Path(args.json) if args.json else common.RESULTS /
      ("rewrite_scale-smoke.json" if args.smoke else "rewrite_scale.json"),
      {"rows": rows, "growth": growth})
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
