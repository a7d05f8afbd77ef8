"""An FP8 GEMM that loses its gradient to e5m2, moved to bf16 by
``fp8_fallback`` from the statistics the step measures.

A two-layer MLP learns ``tanh(x @ a)``. Its loss has one more term, 0 in
value and 1e12 in its gradient at one element of the first layer's output,
so that in the first layer's weight-gradient GEMM every other value of that
gradient underflows e5m2 (current scaling maps the spike to e5m2's largest
value). In FP8 that layer then hardly trains; with
``fp8_fallback=amp.Fp8Fallback()`` the step measures its GEMMs
(``numerics="stats"``), moves that one GEMM to bf16 after the first step
and compiles once more. Prints the held-out loss of bf16, FP8 and FP8 with
the fallback per seed, their mean and spread, and what the fallback moved.

    python examples/fp8_fallback.py [--steps N] [--seeds S]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import stablehlo_amp as amp

BF16 = "p=f32,c=bf16,o=f32"
FP8 = "p=f32,c=bf16,o=f32,gemm=f8"


def data(seed: int):
  """A training batch, a held-out batch and a key for the parameters."""
  keys = jax.random.split(jax.random.key(seed), 4)
  a = jax.random.normal(keys[0], (64, 16)) / 8
  x = jax.random.normal(keys[1], (256, 64))
  held_out = jax.random.normal(keys[2], (256, 64))
  return (x, jnp.tanh(x @ a)), (held_out, jnp.tanh(held_out @ a)), keys[3]


def init(key: jax.Array) -> dict:
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (64, 32)) / 8,
          "w2": jax.random.normal(k2, (32, 16)) / 6}


def predict(params: dict, x: jax.Array) -> jax.Array:
  return jax.nn.relu(x @ params["w1"]) @ params["w2"]


def spiked_loss(params: dict, batch) -> jax.Array:
  """Mean squared error, plus a term that is 0 in the loss and 1e12 in
  d(loss)/dz[0, 0]: at that scale every other value of dz underflows e5m2
  in the first layer's weight-gradient GEMM, and in no other GEMM."""
  x, y = batch
  z = x @ params["w1"]
  spike = 1e12 * (z[0, 0] - jax.lax.stop_gradient(z[0, 0]))
  out = jax.nn.relu(z) @ params["w2"]
  return jnp.mean((out - y) ** 2) + spike


def train(policy: str, seed: int, steps: int, **options):
  """Trains `steps` steps; the held-out loss, the step, its last state,
  batch and metrics."""
  batch, held_out, key = data(seed)
  step = amp.train_step(spiked_loss, optax.adam(1e-2), policy, **options)
  state = step.init(init(key))
  for _ in range(steps):
    state, metrics = step(state, batch)
  loss = float(jnp.mean((predict(state.params, held_out[0]) -
                         held_out[1]) ** 2))
  return loss, step, state, batch, metrics


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--seeds", type=int, default=3)
  args = parser.parse_args(argv)

  runs = {"bf16": (BF16, {}), "fp8": (FP8, {}),
          "fp8, fp8_fallback": (FP8, {"fp8_fallback": amp.Fp8Fallback()})}
  losses: dict[str, list[float]] = {name: [] for name in runs}
  for seed in range(args.seeds):
    for name, (policy, options) in runs.items():
      loss, step, state, batch, _ = train(policy, seed, args.steps,
                                          **options)
      losses[name].append(loss)
    print(f"seed {seed}: " + ", ".join(
        f"{name} {values[-1]:.4f}" for name, values in losses.items()))
  print(f"held-out loss after {args.steps} steps, mean (spread) over "
        f"{args.seeds} seeds:")
  for name, values in losses.items():
    print(f"  {name}: {np.mean(values):.4f} "
          f"({np.min(values):.4f} to {np.max(values):.4f})")
  print(f"compiled {step.rewrite_count} times; moved:")
  for event in step.fp8_fallbacks:
    print(f"  {event}")
  report = str(step.lower(state, batch).report())
  print("\n".join(line for line in report.splitlines()
                  if "FP8" in line or "fp8_fallback" in line or
                  "GEMM" in line))


if __name__ == "__main__":
  main()
