"""Overhead and scaling: what the rewrite costs next to lowering and XLA.

Transformer training steps (the LM of bench/common.py, Adam, small widths so
that the op count rather than the tensor sizes drives the cost) from about
1k to 100k ops, by depth. For each: lower (jax.jit(...).lower, as
amp.transform does), rewrite (print generic, C++ passes, jaxlib parse +
verify, MLIR bytecode for the inlined call) and XLA compile of the rewritten
step; the report (built on demand by Lowered.report()) is timed apart.
Then the rewrite's share of compile time and the growth exponent of each
phase against the op count (least squares on log-log).

    python -m bench.overhead                  # rewrite up to ~100k ops,
                                              # XLA compile up to ~25k ops
    python -m bench.overhead --max-compile-ops 110000   # compile them all
    python -m bench.overhead --max-ops 30000  # smaller modules only
    python -m bench.overhead --quick          # up to ~5k ops
    python -m bench.overhead --smoke          # 1 and 2 layers (compiles 1),
                                              # best of 1: checks the script

The share is the rewrite (print, passes, parse and verify, bytecode) over
XLA's compile of the rewritten step, each the best of --repeats (JAX's
caches are cleared before each compile). XLA:CPU compile time grows faster
than linearly with the op count, so by default only modules up to
--max-compile-ops are compiled; the rewrite is measured at every size.

The phases are stablehlo_amp's internals (bench.common.amp_internals):
the public API times the rewrite as a whole (`Lowered.timings.rewrite`).

Writes bench/results/overhead[-quick|-smoke].json.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.extend.mlir import ir

import stablehlo_amp as amp
from bench import common

POLICY = "p=f32,c=bf16,o=f32"
FULL_LAYERS = (1, 2, 4, 8, 16, 32, 64, 128, 200)
QUICK_LAYERS = (1, 2, 4, 8)
SMOKE_LAYERS = (1, 2)


def config_for(layers: int) -> common.lm.Config:
  return common.LMConfig(vocab=128, d_model=64, heads=2, layers=layers,
                         seq=32, batch=2)


def train_step(params, opt_state, batch, config, tx):
  loss, grads = jax.value_and_grad(common.lm_loss)(params, batch, config)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def count_ops(module: ir.Module) -> int:
  """Operations in the module, nested ones included (the module op not)."""
  count = 0

  def visit(op):
    nonlocal count
    count += 1
    return ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  return count - 1


def breakdown(module: ir.Module, repeats: int) -> dict:
  """The rewrite's phases on the module `amp.transform` rewrites (the step
  as `jax.jit(...).lower` emits it), each the best of `repeats`."""
  internals = common.amp_internals()
  policy = amp.Policy.parse(POLICY)
  options = amp.RewriteOptions.make()  # the target JAX runs on here
  pipeline = internals.build_pipeline(policy, options)
  report_pipeline = internals.build_pipeline(policy, options, report=True)
  best = {"print": math.inf, "passes": math.inf, "parse_verify": math.inf,
          "to_bytecode": math.inf, "passes_with_report": math.inf,
          "report_python": math.inf, "rewrite_best": math.inf}
  context = internals.ir_context()
  with context:
    module = ir.Module.parse(module.operation.get_asm(
        print_generic_op_form=True, enable_debug_info=True), context)
    ops = count_ops(module)
    for _ in range(repeats):
      gc.collect()  # the previous repeat's modules: not this one's cost
      t0 = time.perf_counter()
      generic = internals.generic_text(module, "overhead")
      t1 = time.perf_counter()
      ok, output, _, diagnostics = internals.run_pipeline(
          generic, pipeline, "overhead", False)
      t2 = time.perf_counter()
      if not ok:
        raise RuntimeError("\n".join(diagnostics))
      rewritten = ir.Module.parse(output, context)  # parsing verifies
      t3 = time.perf_counter()
      # The MLIR bytecode the call primitive's lowering inlines.
      internals.bytecode_of(rewritten)
      t4 = time.perf_counter()
      # The report is built on demand (Lowered.report()): its own pass run
      # with decisions attached, then read in Python.
      _, _, report_json, _ = internals.run_pipeline(
          generic, report_pipeline, "overhead", True)
      t5 = time.perf_counter()
      report = amp.Report.from_json(report_json, policy=POLICY,
                                    level=options.level, target=options.target)
      t6 = time.perf_counter()
      # What amp.transform pays for a rewrite: print, passes, parse and
      # verify, bytecode (the report is on demand).
      best["rewrite_best"] = min(best["rewrite_best"], t4 - t0)
      for key, seconds in (("print", t1 - t0), ("passes", t2 - t1),
                           ("parse_verify", t3 - t2),
                           ("to_bytecode", t4 - t3),
                           ("passes_with_report", t5 - t4),
                           ("report_python", t6 - t5)):
        best[key] = min(best[key], seconds)
    decisions = len(report.decisions)
    ops_after = count_ops(rewritten)
  return {"ops": ops, "ops_after": ops_after, "text_bytes": len(generic),
          "report_decisions": decisions, "level": options.level, **best}


def measure(layers: int, repeats: int, compile_xla: bool) -> dict:
  config = config_for(layers)
  tx = optax.adam(config.learning_rate)
  params = common.lm_init(jax.random.key(0), config)
  opt_state = tx.init(params)
  batch = jnp.zeros((config.batch, config.seq + 1), jnp.int32)
  step = functools.partial(train_step, config=config, tx=tx)
  fast = amp.transform(step, POLICY)
  start = time.perf_counter()
  lowered = fast.lower(params, opt_state, batch)
  lower_total = time.perf_counter() - start
  compile_s = None
  if compile_xla:
    # Best of `repeats`, each from scratch: JAX caches lowerings and
    # executables, so its caches are cleared first (the rewritten program
    # stays cached in `fast`).
    compile_s = math.inf
    for _ in range(repeats):
      jax.clear_caches()
      fresh = fast.lower(params, opt_state, batch)
      start = time.perf_counter()
      fresh.compile()
      compile_s = min(compile_s, time.perf_counter() - start)
  # The phases on the same module, lowered again (the transform's copy was
  # marked and rewritten in place).
  module = jax.jit(step).lower(params, opt_state, batch).compiler_ir(
      "stablehlo")
  phases = breakdown(module, repeats)
  return {"layers": layers, **phases,
          "lower_s": lowered.timings.lower,
          "rewrite_s": lowered.timings.rewrite,  # as amp.transform paid it
          "transform_lower_total_s": lower_total,
          "xla_compile_s": compile_s,
          "rewrite_share_of_compile": (phases["rewrite_best"] / compile_s
                                       if compile_s else None)}


def fit_exponent(xs, ys) -> float | None:
  pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
  if len(pairs) < 2:
    return None
  lx, ly = map(np.array, zip(*pairs))
  slope, _ = np.polyfit(lx, ly, 1)
  return float(slope)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help=f"depths {','.join(map(str, QUICK_LAYERS))}")
  parser.add_argument("--smoke", action="store_true",
                      help=f"depths {','.join(map(str, SMOKE_LAYERS))}, best "
                      "of 1: checks the script works (not a measurement)")
  parser.add_argument("--max-ops", type=int,
                      help="skip depths whose module would exceed this many "
                      "ops (default 110000; --quick, --smoke 6000)")
  parser.add_argument("--max-compile-ops", type=int,
                      help="XLA-compile only modules up to this many ops "
                      "(default 25000; --smoke 1500: 1 layer)")
  parser.add_argument("--layers", help="comma-separated depths (default "
                      f"{','.join(map(str, FULL_LAYERS))})")
  parser.add_argument("--repeats", type=int,
                      help="best-of for the rewrite phases and XLA compile "
                      "(default 3; --smoke 1)")
  parser.add_argument("--json", help="default bench/results/overhead"
                      "[-quick|-smoke].json")
  args = parser.parse_args(argv)
  args.repeats = args.repeats or (1 if args.smoke else 3)
  if args.max_compile_ops is None:
    args.max_compile_ops = 1500 if args.smoke else 25000
  max_ops = args.max_ops or (6000 if args.quick or args.smoke else 110_000)
  layers = ([int(x) for x in args.layers.split(",")] if args.layers else
            SMOKE_LAYERS if args.smoke else
            QUICK_LAYERS if args.quick else FULL_LAYERS)
  env = common.environment()
  print(f"overhead: backend {env['backend']}, jax {env['jax']}, "
        f"{env['cpu_count']} CPUs, load {env['loadavg']}; policy {POLICY}; "
        f"max {max_ops:,} ops")
  json_path = (common.pathlib.Path(args.json) if args.json else
               common.RESULTS / ("overhead-smoke.json" if args.smoke else
                                 "overhead-quick.json" if args.quick else
                                 "overhead.json"))
  rows = []
  per_layer = None
  for depth in layers:
    if per_layer and rows[0]["ops"] + per_layer * (depth - rows[0]["layers"]) > max_ops:
      print(f"  {depth} layers: skipped (about "
            f"{rows[0]['ops'] + per_layer * (depth - rows[0]['layers']):,.0f}"
            f" ops > --max-ops {max_ops:,})")
      continue
    # Ops of this depth: a line through the first two depths measured, or
    # proportional to the first (0 for the first: it always compiles).
    estimate = (rows[0]["ops"] + per_layer * (depth - rows[0]["layers"])
                if per_layer else
                rows[0]["ops"] * depth / rows[0]["layers"] if rows else 0)
    row = measure(depth, args.repeats, estimate <= args.max_compile_ops)
    rows.append(row)
    if len(rows) >= 2:
      per_layer = ((rows[-1]["ops"] - rows[0]["ops"]) /
                   (rows[-1]["layers"] - rows[0]["layers"]))
    xla = (f"{row['xla_compile_s']:.2f} s" if row["xla_compile_s"] else
           "not compiled (--max-compile-ops)")
    print(f"  {depth} layers: {row['ops']:,} ops, rewrite "
          f"{row['rewrite_s']:.3f} s, XLA {xla}", flush=True)
    common.write_json(json_path, {"benchmark": "overhead", "partial": True,
                                  "environment": env, "rows": rows})
  keys = ("lower_s", "rewrite_s", "rewrite_best", "print", "passes", "parse_verify",
          "to_bytecode", "passes_with_report", "report_python",
          "xla_compile_s")

  def fits_over(selected):
    out = {}
    for key in keys:
      have = [r for r in selected if r[key]]
      out[key] = fit_exponent([r["ops"] for r in have], [r[key] for r in have])
    return out
  fits = fits_over(rows)
  big = [r for r in rows if r["ops"] >= 5000]
  fits_big = fits_over(big) if len(big) >= 2 else {}
  compiled = [r for r in rows if r["xla_compile_s"]]
  total_rewrite = sum(r["rewrite_best"] for r in compiled)
  total_compile = sum(r["xla_compile_s"] for r in compiled)
  lines = ["| layers | ops | lower s | rewrite s, as amp.transform paid it "
           f"(first) / best of {args.repeats} | "
           "print / passes / parse+verify / bytecode (best of "
           f"{args.repeats}) | on-demand report: passes / Python | "
           f"XLA compile s (best of {args.repeats}) | rewrite / compile "
           "(best of each) |", "|" + "---|" * 8]
  for r in rows:
    lines.append(
        f"| {r['layers']} | {r['ops']:,} | {r['lower_s']:.2f} | "
        f"{r['rewrite_s']:.3f} / {r['rewrite_best']:.3f} | "
        f"{r['print']:.3f} / {r['passes']:.3f} / "
        f"{r['parse_verify']:.3f} / {r['to_bytecode']:.3f} | "
        f"{r['passes_with_report']:.3f} / {r['report_python']:.3f} | "
        f"{common._fmt(r['xla_compile_s'], '.2f', 'not compiled')} | "
        f"{common._fmt(r['rewrite_share_of_compile'] and 100 * r['rewrite_share_of_compile'], '.1f', '–', '%')} |")
  table = "\n".join(lines)
  summary = (
      f"rewrite / XLA compile over the compiled sizes: "
      f"{100 * total_rewrite / total_compile:.1f}% (largest compiled: "
      f"{100 * compiled[-1]['rewrite_share_of_compile']:.1f}%)\n"
      "growth exponents (time ∝ ops^k, log-log least squares), all sizes: " +
      ", ".join(f"{k} {v:.2f}" for k, v in fits.items() if v is not None) +
      ("\n  sizes ≥ 5k ops: " + ", ".join(
          f"{k} {v:.2f}" for k, v in fits_big.items() if v is not None)
       if fits_big else ""))
  print()
  print(table)
  print()
  print(summary)
  path = common.write_json(
      json_path,
      {"benchmark": "overhead", "max_compile_ops": args.max_compile_ops, "environment": env, "policy": POLICY,
       "max_ops": max_ops, "rows": rows, "exponents": fits,
       "exponents_ge_5k_ops": fits_big,
       "rewrite_share_total": total_rewrite / total_compile,
       "table": table, "summary": summary,
       "environment_end": {"loadavg": common.environment()["loadavg"]}})
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
