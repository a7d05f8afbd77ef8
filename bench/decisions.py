"""Discrete decisions under mixed precision: the MoE LM's routes and loss
with decisions="gate" (the default: the router's GEMM and what follows it
to top_k in f32) against decisions="exact" (everything upstream of top_k in
f32) and f32.

    python -m bench.decisions                # 300 steps x 3 seeds
    python -m bench.decisions --steps 100 --seeds 0
    python -m bench.decisions --smoke        # tiny model, 2 steps: checks the script

Each seed trains the bench MoE (bench/common.py, MoEConfig at a CPU size)
with Adam from the same initial parameters and batches in three variants:
f32 (jax.jit), and amp.train_step "p=f32,c=bf16,o=f32" with each
`decisions=`. Ours runs with the GPU's defaults for painting and GEMM
results (level="O2", dot_result="compute") on XLA:CPU, which has the same
roundings. Printed per variant: the held-out loss (mean and spread over
seeds), and the share of routes (token, layer, choice) that equal f32's,
computed by `amp.transform` of the routing forward on the f32 run's final
parameters over the held-out batches. Writes
bench/results/decisions[-smoke].json.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench import common

POLICY = "p=f32,c=bf16,o=f32"
GPU_LIKE = {"level": "O2", "dot_result": "compute", "target": "cpu"}
DECISIONS = ("exact", "gate")


def _config(smoke: bool) -> common.MoEConfig:
  if smoke:
    return common.MoEConfig(vocab=512, d_model=32, heads=2, layers=2, seq=16,
                            batch=2, experts=4, hidden=64)
  return common.MoEConfig(vocab=512, d_model=128, heads=4, layers=2, seq=64,
                          batch=8, experts=4, hidden=256)


def _train(model: common.Model, steps: int, decisions: str | None):
  """The final parameters and held-out loss of `steps` Adam steps."""
  import optax
  import stablehlo_amp as amp
  tx = model.optimizer
  if decisions is None:
    @jax.jit
    def step(params, opt_state, batch):
      loss, grads = jax.value_and_grad(model.loss)(params, batch)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss
    params, opt_state = model.params, tx.init(model.params)
    for _ in range(steps):
      params, opt_state, _ = step(params, opt_state, next(model.train))
  else:
    step = amp.train_step(model.loss, tx, POLICY, decisions=decisions,
                          **GPU_LIKE)
    state = step.init(model.params)
    for _ in range(steps):
      state, _ = step(state, next(model.train))
    params = state.params
  loss = jax.jit(model.loss)
  held = float(np.mean([loss(params, batch) for batch in model.held_out]))
  return params, held


def _route_agreement(config, params, batches, decisions: str) -> float:
  import stablehlo_amp as amp
  routes = lambda p, tokens: common.moe_all_routes(p, tokens[:, :-1], config)
  exact = jax.jit(routes)
  low = amp.transform(routes, POLICY, decisions=decisions, **GPU_LIKE)
  same = [float(jnp.mean(exact(params, b) == low(params, b))) for b in batches]
  return float(np.mean(same))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=None,
                      help="training steps per seed (default 300; --smoke 2)")
  parser.add_argument("--seeds", default=None,
                      help="comma-separated seeds (default 0,1,2; --smoke 0)")
  parser.add_argument("--smoke", action="store_true",
                      help="a tiny model for 2 steps: checks the script")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  steps = args.steps or (2 if args.smoke else 300)
  seeds = [int(s) for s in (args.seeds or ("0" if args.smoke else
                                           "0,1,2")).split(",")]
  config = _config(args.smoke)
  rows = {"f32": [], **{f"ours-bf16-decisions-{d}": [] for d in DECISIONS}}
  agreement = {d: [] for d in DECISIONS}
  for seed in seeds:
    params, held = _train(common.make_moe(config, seed=seed), steps, None)
    rows["f32"].append(held)
    held_out = common.make_moe(config, seed=seed).held_out
    for d in DECISIONS:
      rows[f"ours-bf16-decisions-{d}"].append(
          _train(common.make_moe(config, seed=seed), steps, d)[1])
      agreement[d].append(_route_agreement(config, params, held_out, d))
    print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}"
                                       for k, v in rows.items()) +
          "; routes equal to f32's: " + ", ".join(
              f"{d} {agreement[d][-1]:.2%}" for d in DECISIONS), flush=True)
  print(f"\n### MoE LM ({config.layers} layers, d_model {config.d_model}, "
        f"{config.experts} experts, top-{config.top_k}), {steps} steps, "
        f"seeds {','.join(map(str, seeds))}, XLA:CPU\n")
  print("| variant | held-out loss, mean | spread (min to max) | routes equal "
        "to f32's |")
  print("|---|---|---|---|")
  for name, values in rows.items():
    share = agreement.get(name.rsplit("-", 1)[-1]) if name != "f32" else None
    print(f"| {name} | {np.mean(values):.4f} | {min(values):.4f} to "
          f"{max(values):.4f} | "
          + (f"{np.mean(share):.2%}" if share else "–") + " |")
  result = {"steps": steps, "seeds": seeds, "config": vars(config),
            "held_out_loss": rows, "route_agreement": agreement}
  path = (pathlib.Path(args.json) if args.json else common.RESULTS /
          ("decisions-smoke.json" if args.smoke else "decisions.json"))
  common.write_json(path, result)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
