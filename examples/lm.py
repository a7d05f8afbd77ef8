"""A small decoder-only transformer language model and a character corpus
built from the Python standard library's own source files (no download)."""

from __future__ import annotations

import dataclasses
import pathlib
import sysconfig
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax


@dataclasses.dataclass(frozen=True)
class Config:
  vocab: int = 128          # ASCII
  d_model: int = 128
  heads: int = 4
  layers: int = 2
  seq: int = 64
  batch: int = 16
  learning_rate: float = 3e-3


def corpus(max_bytes: int = 2_000_000) -> np.ndarray:
  """ASCII bytes of the standard library's .py files, in a fixed order."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  chunks, total = [], 0
  for path in sorted(root.glob("*.py")):
    data = path.read_bytes()
    data = bytes(b if b < 128 else ord("?") for b in data)
    chunks.append(data)
    total += len(data)
    if total >= max_bytes:
      break
  return np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.int32)


def split(tokens: np.ndarray, held_out: float = 0.1):
  cut = int(len(tokens) * (1 - held_out))
  return tokens[:cut], tokens[cut:]


def batches(tokens: np.ndarray, config: Config, seed: int) -> Iterator[np.ndarray]:
  """Random windows of seq+1 tokens, the same sequence for the same seed."""
  rng = np.random.default_rng(seed)
  while True:
    starts = rng.integers(0, len(tokens) - config.seq - 1, config.batch)
    yield np.stack([tokens[s:s + config.seq + 1] for s in starts])


def init(key: jax.Array, config: Config) -> dict[str, Any]:
  d = config.d_model
  keys = iter(jax.random.split(key, 4 + 4 * config.layers))
  normal = lambda shape, scale: scale * jax.random.normal(next(keys), shape)
  params = {
      "embed": normal((config.vocab, d), 0.02),
      "pos": normal((config.seq, d), 0.02),
      "ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
      "layers": [],
  }
  for _ in range(config.layers):
    params["layers"].append({
        "ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "qkv": normal((d, 3 * d), d ** -0.5),
        "proj": normal((d, d), d ** -0.5 / config.layers),
        "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "up": normal((d, 4 * d), d ** -0.5),
        "up_bias": jnp.zeros(4 * d),
        "down": normal((4 * d, d), (4 * d) ** -0.5 / config.layers),
    })
  return params


def layer_norm(x, p):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def _unchanged(fn, out_dtype=None):
  del out_dtype
  return fn


def forward(params, tokens, config: Config, full=_unchanged):
  """Pre-LN decoder: causal attention, GELU MLP, tied embedding.

  `full(fn, dtype)` wraps the layer norm and the softmax; libraries that mark
  full-precision islands by hand (MPX's `force_full_precision`) pass theirs.
  """
  b, s = tokens.shape
  d, h = config.d_model, config.heads
  x = params["embed"][tokens] + params["pos"][:s]
  norm = full(layer_norm, x.dtype)
  softmax = full(lambda z: jax.nn.softmax(z, axis=-1), x.dtype)
  mask = jnp.tril(jnp.ones((s, s), bool))
  for layer in params["layers"]:
    y = norm(x, layer["ln1"])
    q, k, v = jnp.split(y @ layer["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(b, s, h, d // h) for t in (q, k, v))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // h) ** 0.5
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    y = jnp.einsum("bhqk,bkhd->bqhd", softmax(logits), v).reshape(b, s, d)
    x = x + y @ layer["proj"]
    y = norm(x, layer["ln2"])
    y = jax.nn.gelu(y @ layer["up"] + layer["up_bias"])
    x = x + y @ layer["down"]
  x = norm(x, params["ln_f"])
  return x @ params["embed"].T


def loss_fn(params, batch, config: Config):
  inputs, targets = batch[:, :-1], batch[:, 1:]
  logits = forward(params, inputs, config)
  logp = jax.nn.log_softmax(logits)
  return -jnp.take_along_axis(logp, targets[..., None], -1).mean()


def optimizer(config: Config) -> optax.GradientTransformation:
  return optax.adam(config.learning_rate)


def train_step(params, opt_state, batch, config: Config):
  """One f32 Adam step: what the user has before mixed precision."""
  loss, grads = jax.value_and_grad(loss_fn)(params, batch, config)
  updates, opt_state = optimizer(config).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss
