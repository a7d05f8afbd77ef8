"""What the GEMMs of a training step lose to their formats, measured inside
the compiled step.

Trains the small transformer LM of `lm.py` with ``numerics="stats"``,
merges the per-GEMM statistics of every step and prints `amp.explain`: the
operands whose rounding sent the most values to zero (underflow) or past
the format's range (saturated). By default: f16 without loss scaling, where
the backward pass's gradients underflow f16; ``--loss-scale dynamic``
shows what loss scaling does to the same figures, ``--policy`` tries
another policy (``p=f32,c=bf16,o=f32,gemm=f8`` for FP8 GEMMs).

    python examples/numerics.py [--policy P] [--loss-scale none|dynamic]
                                [--steps N] [--d-model D] [--layers L]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax

import stablehlo_amp as amp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm  # noqa: E402


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--policy", default="p=f32,c=f16,o=f32")
  parser.add_argument("--loss-scale", choices=("none", "dynamic"),
                      default="none")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--d-model", type=int, default=lm.Config.d_model)
  parser.add_argument("--layers", type=int, default=lm.Config.layers)
  args = parser.parse_args(argv)

  config = lm.Config(d_model=args.d_model, layers=args.layers)
  loss_scale = (amp.NoOpLossScale() if args.loss_scale == "none" else
                amp.DynamicLossScale())
  options = {"fp8_min_size": 0} if "gemm=f8" in args.policy else {}
  step = amp.train_step(functools.partial(lm.loss_fn, config=config),
                        lm.optimizer(config), args.policy,
                        loss_scale=loss_scale, numerics="stats", **options)
  state = step.init(lm.init(jax.random.key(0), config))
  train, _ = lm.split(lm.corpus())
  batches = lm.batches(train, config, seed=0)
  total = None
  for _ in range(args.steps):
    batch = next(batches)
    state, metrics = step(state, batch)
    stats = metrics["gemm_stats"]
    total = stats if total is None else total.merge(stats)
  print(f"{args.policy}, loss scale {args.loss_scale}, {args.steps} steps: "
        f"loss {float(metrics['loss']):.3f}, "
        f"{int(metrics['skipped_steps'])} skipped")
  print(amp.explain(total, step.lower(state, batch).report(), top=5))


if __name__ == "__main__":
  main()
