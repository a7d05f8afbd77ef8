"""Where a training step's first NaN or infinity came from, found inside
the compiled step.

Trains the small transformer LM of `lm.py` with ``numerics="provenance"``:
every value each region of the step (a named scope, or a source line, in
the forward pass, the backward pass or the optimizer) hands on is checked
for NaN and infinity, and the step returns one bit per region. On the
first step that is not finite, prints `amp.explain`: the first region in
program order to hand on a non-finite value while everything it read was
finite. By default: f16 with a static loss scale of 2^30, far too large for
f16, so that the backward pass overflows; ``--loss-scale dynamic`` is the
fix (no step is then non-finite after the first few).

    python examples/provenance.py [--policy P] [--loss-scale S|dynamic]
                                  [--steps N] [--d-model D] [--layers L]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import numpy as np

import stablehlo_amp as amp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm  # noqa: E402


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--policy", default="p=f32,c=f16,o=f32")
  parser.add_argument("--loss-scale", default=str(2 ** 30),
                      help="a static scale, or 'dynamic'")
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--d-model", type=int, default=lm.Config.d_model)
  parser.add_argument("--layers", type=int, default=lm.Config.layers)
  args = parser.parse_args(argv)

  config = lm.Config(d_model=args.d_model, layers=args.layers)
  loss_scale = (amp.DynamicLossScale() if args.loss_scale == "dynamic" else
                amp.StaticLossScale(float(args.loss_scale)))
  step = amp.train_step(functools.partial(lm.loss_fn, config=config),
                        lm.optimizer(config), args.policy,
                        loss_scale=loss_scale, numerics="provenance")
  state = step.init(lm.init(jax.random.key(0), config))
  train, _ = lm.split(lm.corpus())
  batches = lm.batches(train, config, seed=0)
  report = None
  for index in range(args.steps):
    batch = next(batches)
    report = report or step.lower(state, batch).report()
    state, metrics = step(state, batch)
    if metrics["nonfinite"].first(report) is not None:
      print(f"{args.policy}, loss scale {args.loss_scale}: step {index} "
            f"(loss {float(metrics['loss']):.3f}):")
      print(amp.explain(metrics, report))
      return
  print(f"{args.policy}, loss scale {args.loss_scale}: {args.steps} steps, "
        f"every value finite (loss {float(metrics['loss']):.3f}, "
        f"{int(np.asarray(metrics['skipped_steps']))} skipped)")


if __name__ == "__main__":
  main()
