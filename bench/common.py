"""Shared by the benchmarks: data, the two models (and their --smoke
sizes), compiled-program measurements (memory, converts, dots in the
optimized HLO), the interleaved step loop, tables and JSON.

    from bench import common      # run from the repository root

Imports neither stablehlo_amp nor the peer libraries when imported, so it
also runs on a machine that has only JAX (the GPU script's fallback paths).
`amp_internals()` and `hlo_reader()` are the places the benchmarks reach
past the public API.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import sysconfig
import time
import types
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

# One definition of the transformer LM: the demo's (examples/lm.py, found
# from the repository root, where `python -m bench.SCRIPT` runs).
from examples import lm

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def amp_internals() -> types.SimpleNamespace:
  """The stablehlo_amp internals a benchmark needs, imported here only.

  The public API rewrites a module as one step (`amp.rewrite_module`,
  `Lowered.timings.rewrite`); bench/overhead.py times its phases apart
  (print generic text, the C++ passes, jaxlib parse + verify, MLIR
  bytecode) and bench/rewrite_scale.py parses a module before timing its
  rewrite, which needs the pieces `amp.rewrite_module` is made of: the
  pass runner of the extension (`_amp.run_pipeline`), the pipeline string
  (`pipeline.build_pipeline`), the context with JAX's dialects
  (`pipeline.ir_context`), generic printing (`pipeline.generic_text`) and
  bytecode (`jax_compat.bytecode_of`). They are private and may change with
  the package; this is the place to follow them.
  """
  from stablehlo_amp import _amp
  from stablehlo_amp._src import contract, jax_compat, pipeline, train_state
  return types.SimpleNamespace(
      run_pipeline=_amp.run_pipeline,
      build_pipeline=pipeline.build_pipeline,
      ir_context=pipeline.ir_context,
      generic_text=pipeline.generic_text,
      bytecode_of=jax_compat.bytecode_of,
      # The f8 optimizer state's layout and sharding (sharded steps).
      f8_state_shape=contract.f8_state_shape,
      f8_block_sharding=lambda sharding, shape:
          train_state.f8_block_sharding(sharding, shape)[0],
      # The targets' figures for the step estimate (passes/Contract.cpp).
      roofline=contract.roofline)

# --------------------------------------------------------------------------
# Data: the standard library's own source, as byte-pair tokens (vocab 512).


def corpus_bytes(max_bytes: int = 1_500_000) -> np.ndarray:
  """Bytes of the standard library's .py files in a fixed order."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  chunks, total = [], 0
  for path in sorted(root.glob("*.py")):
    data = path.read_bytes()
    chunks.append(data)
    total += len(data)
    if total >= max_bytes:
      break
  return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


def byte_pair_tokens(data: np.ndarray, vocab: int = 512) -> np.ndarray:
  """One round of byte-pair merging: the `vocab - 256` most frequent adjacent
  byte pairs become tokens 256.., merged greedily left to right."""
  data = data.astype(np.int64)
  pairs = data[:-1] * 256 + data[1:]
  merges = vocab - 256
  top = np.argsort(-np.bincount(pairs, minlength=65536), kind="stable")[:merges]
  rank = np.full(65536, -1, np.int64)
  rank[top] = np.arange(merges)
  candidate = rank[pairs] >= 0
  index = np.arange(len(candidate))
  # In a run of overlapping candidates, greedy merging takes every other one.
  last_break = np.maximum.accumulate(np.where(candidate, -1, index))
  merged = candidate & ((index - last_break - 1) % 2 == 0)
  tokens = data.copy()
  tokens[:-1][merged] = 256 + rank[pairs[merged]]
  consumed = np.zeros(len(data), bool)
  consumed[1:] = merged
  return tokens[~consumed].astype(np.int32)


# --------------------------------------------------------------------------
# Models. `full(fn, out_dtype)` wraps the precision-sensitive pieces (layer
# norm, softmax, the loss): the identity for every variant but MPX, whose
# recipe is `mpx.force_full_precision` there.


_identity_full = lm._unchanged


def LMConfig(**overrides) -> lm.Config:
  """The peers LM: examples/lm.py's model at its benchmark sizes (d_model 256, 4 layers, seq 128)."""
  defaults = dict(vocab=512, d_model=256, heads=4, layers=4, seq=128,
                  batch=16, learning_rate=3e-3)
  return lm.Config(**{**defaults, **overrides})


def smoke_configs() -> dict:
  """The models of every script's --smoke: seconds on a CPU, a check that
  the script works (`make bench-smoke`), not a measurement."""
  return {"lm": LMConfig(d_model=64, heads=2, layers=1, seq=32, batch=4),
          "mlp": MLPConfig(sizes=(784, 64, 64, 10), batch=32)}


lm_init = lm.init
lm_forward = lm.forward


def _cross_entropy(logits, targets):
  logp = jax.nn.log_softmax(logits)
  return -jnp.take_along_axis(logp, targets[..., None], -1).mean()


def lm_loss(params, batch, config: lm.Config, full=_identity_full,
            output_cast=lambda x: x):
  inputs, targets = batch[:, :-1], batch[:, 1:]
  logits = output_cast(lm_forward(params, inputs, config, full))
  return full(_cross_entropy, jnp.float32)(logits, targets)


@dataclasses.dataclass(frozen=True)
class MLPConfig:
  sizes: tuple = (784, 1024, 1024, 10)
  batch: int = 256
  learning_rate: float = 1e-3
  teacher_hidden: int = 256


def mlp_init(key: jax.Array, config: MLPConfig) -> list:
  params = []
  for fan_in, fan_out, k in zip(config.sizes[:-1], config.sizes[1:],
                                jax.random.split(key, len(config.sizes) - 1)):
    params.append({"w": jax.random.normal(k, (fan_in, fan_out)) *
                        (2.0 / fan_in) ** 0.5,
                   "b": jnp.zeros(fan_out)})
  return params


def mlp_forward(params, x, full=_identity_full):
  del full
  for i, layer in enumerate(params):
    x = x @ layer["w"] + layer["b"]
    if i < len(params) - 1:
      x = jax.nn.relu(x)
  return x


def mlp_loss(params, batch, config: MLPConfig, full=_identity_full,
             output_cast=lambda x: x):
  del config
  x, y = batch
  logits = output_cast(mlp_forward(params, x, full))
  return full(_cross_entropy, jnp.float32)(logits, y)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
  """A vision transformer for the compiled-step benchmarks: patches of an
  image embedded by a GEMM, a class token, pre-LN encoder blocks."""
  image: int = 224
  patch: int = 16
  channels: int = 3
  d_model: int = 768
  heads: int = 12
  layers: int = 6
  classes: int = 1000
  batch: int = 64

  @property
  def tokens(self) -> int:
    return (self.image // self.patch) ** 2 + 1


def _block_init(keys, d: int, layers: int) -> dict:
  normal = lambda shape, scale: scale * jax.random.normal(next(keys), shape)
  return {"ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
          "qkv": normal((d, 3 * d), d ** -0.5),
          "proj": normal((d, d), d ** -0.5 / layers),
          "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)}}


def vit_init(key: jax.Array, config: ViTConfig) -> dict:
  d, patch_size = config.d_model, config.patch ** 2 * config.channels
  keys = iter(jax.random.split(key, 8 + 8 * config.layers))
  normal = lambda shape, scale: scale * jax.random.normal(next(keys), shape)
  layers = []
  for _ in range(config.layers):
    layer = _block_init(keys, d, config.layers)
    layer.update(up=normal((d, 4 * d), d ** -0.5), up_bias=jnp.zeros(4 * d),
                 down=normal((4 * d, d), (4 * d) ** -0.5 / config.layers))
    layers.append(layer)
  return {"patch": normal((patch_size, d), patch_size ** -0.5),
          "cls": normal((1, 1, d), 0.02),
          "pos": normal((config.tokens, d), 0.02),
          "ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
          "head": normal((d, config.classes), d ** -0.5),
          "layers": layers}


def _attention(x, layer, heads: int, mask=None):
  b, s, d = x.shape
  y = lm.layer_norm(x, layer["ln1"])
  q, k, v = jnp.split(y @ layer["qkv"], 3, axis=-1)
  q, k, v = (t.reshape(b, s, heads, d // heads) for t in (q, k, v))
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // heads) ** 0.5
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
  return x + y.reshape(b, s, d) @ layer["proj"]


def vit_loss(params, batch, config: ViTConfig, full=_identity_full,
             output_cast=lambda x: x):
  del full
  images, labels = batch
  b, p, c = images.shape[0], config.patch, config.channels
  n = config.image // p
  patches = images.reshape(b, n, p, n, p, c).transpose(0, 1, 3, 2, 4, 5)
  x = patches.reshape(b, n * n, p * p * c) @ params["patch"]
  cls = jnp.broadcast_to(params["cls"], (b, 1, x.shape[-1])).astype(x.dtype)
  x = jnp.concatenate([cls, x], axis=1) + params["pos"]
  for layer in params["layers"]:
    x = _attention(x, layer, config.heads)
    y = lm.layer_norm(x, layer["ln2"])
    x = x + jax.nn.gelu(y @ layer["up"] + layer["up_bias"]) @ layer["down"]
  x = lm.layer_norm(x[:, 0], params["ln_f"])
  return _cross_entropy(output_cast(x @ params["head"]), labels)


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """A decoder LM whose MLPs are mixtures of experts: a router GEMM, top-k
  over its logits (a discrete decision), GShard-style dispatch to expert
  buffers of fixed capacity, and experts as batched GEMMs."""
  vocab: int = 512
  d_model: int = 512
  heads: int = 8
  layers: int = 4
  seq: int = 256
  batch: int = 16
  experts: int = 8
  top_k: int = 2
  hidden: int = 1024
  capacity_factor: float = 1.25  # an expert's buffer: tokens * k / experts * this


def moe_init(key: jax.Array, config: MoEConfig) -> dict:
  d, e, f = config.d_model, config.experts, config.hidden
  keys = iter(jax.random.split(key, 8 + 8 * config.layers))
  normal = lambda shape, scale: scale * jax.random.normal(next(keys), shape)
  layers = []
  for _ in range(config.layers):
    layer = _block_init(keys, d, config.layers)
    layer.update(router=normal((d, e), d ** -0.5),
                 up=normal((e, d, f), d ** -0.5), up_bias=jnp.zeros((e, f)),
                 down=normal((e, f, d), f ** -0.5 / config.layers))
    layers.append(layer)
  return {"embed": normal((config.vocab, d), 0.02),
          "pos": normal((config.seq, d), 0.02),
          "ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
          "layers": layers}


def moe_routes(y, layer, config: MoEConfig):
  """The router's choices for tokens `y` [T, d]: experts [T, k] and their
  gates [T, k]."""
  top, experts = jax.lax.top_k(y @ layer["router"], config.top_k)
  return experts, jax.nn.softmax(top, axis=-1)


def _mixture(y, layer, config: MoEConfig):
  t, d = y.shape
  e, k = config.experts, config.top_k
  c = max(1, int(config.capacity_factor * t * k / e))
  experts, gates = moe_routes(y, layer, config)
  # Each (choice, token)'s slot in its expert's buffer, first choices
  # first, counted in integers; a choice past the capacity is dropped.
  chosen = jax.nn.one_hot(experts.T.reshape(k * t), e, dtype=jnp.int32)
  slot = ((jnp.cumsum(chosen, axis=0) - chosen) * chosen).sum(-1)
  kept = chosen * (slot < c)[:, None]
  dispatch = (kept.astype(y.dtype)[:, :, None] *
              jax.nn.one_hot(slot, c, dtype=y.dtype)[:, None, :])
  combine = dispatch * gates.T.reshape(k * t)[:, None, None]
  dispatch = dispatch.reshape(k, t, e, c).sum(0)
  combine = combine.reshape(k, t, e, c).sum(0)
  inputs = jnp.einsum("tec,td->ecd", dispatch, y)
  hidden = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", inputs, layer["up"]) +
                       layer["up_bias"][:, None, :])
  outputs = jnp.einsum("ecf,efd->ecd", hidden, layer["down"])
  return jnp.einsum("tec,ecd->td", combine, outputs)


def moe_forward(params, tokens, config: MoEConfig, routes: list | None = None):
  """The logits; each layer's chosen experts [T, k] appended to `routes`
  where one is given."""
  b, s = tokens.shape
  x = params["embed"][tokens] + params["pos"][:s]
  mask = jnp.tril(jnp.ones((s, s), bool))
  for layer in params["layers"]:
    x = _attention(x, layer, config.heads, mask)
    y = lm.layer_norm(x, layer["ln2"]).reshape(b * s, -1)
    if routes is not None:
      routes.append(moe_routes(y, layer, config)[0])
    x = x + _mixture(y, layer, config).reshape(b, s, -1)
  x = lm.layer_norm(x, params["ln_f"])
  return x @ params["embed"].T


def moe_all_routes(params, tokens, config: MoEConfig):
  """Every layer's chosen experts for `tokens`: int32[layers, T, k]."""
  routes: list = []
  moe_forward(params, tokens, config, routes)
  return jnp.stack(routes)


def make_moe(config: MoEConfig, eval_batches: int = 8, seed: int = 0,
             learning_rate: float = 3e-3) -> Model:
  """The MoE LM on the LM's data: `seed` picks the initial parameters and
  the order of the training windows."""
  _, train, held_out = _lm_data(config, eval_batches, seed)
  return Model(
      name="moe",
      description=(f"MoE LM: {config.layers} layers, d_model "
                   f"{config.d_model}, {config.experts} experts, top-"
                   f"{config.top_k}, seq {config.seq}, batch {config.batch}, "
                   f"adam {learning_rate}"),
      params=moe_init(jax.random.key(seed), config),
      loss=lambda p, b, **kw: moe_loss(p, b, config, **kw),
      optimizer=optax.adam(learning_rate), train=train, held_out=held_out,
      seed=seed)


def moe_loss(params, batch, config: MoEConfig, full=_identity_full,
             output_cast=lambda x: x):
  del full
  inputs, targets = batch[:, :-1], batch[:, 1:]
  return _cross_entropy(output_cast(moe_forward(params, inputs, config)),
                        targets)


def compiled_step_configs(size: str) -> dict:
  """The ViT and the MoE LM of the compiled-step benchmarks
  (bench/gpu_compile.py), by size: gpu, small (a CPU), smoke (seconds)."""
  if size == "gpu":
    return {"vit": ViTConfig(), "moe": MoEConfig()}
  if size == "small":
    return {"vit": ViTConfig(image=64, d_model=128, heads=4, layers=2,
                             classes=10, batch=8),
            "moe": MoEConfig(d_model=128, heads=4, layers=2, seq=64, batch=4,
                             experts=4, hidden=256)}
  if size == "smoke":
    return {"vit": ViTConfig(image=32, d_model=32, heads=2, layers=1,
                             classes=10, batch=2),
            "moe": MoEConfig(vocab=64, d_model=32, heads=2, layers=2, seq=16,
                             batch=2, experts=4, hidden=64)}
  raise ValueError(f"unknown size {size!r} (gpu, small, smoke)")


def model_step_parts(name: str, config) -> tuple[Callable, Callable, Any]:
  """(init(key), loss(params, batch, **kw), abstract batch) of a bench
  model: lm, mlp, vit or moe."""
  if name == "lm":
    return (lambda key: lm_init(key, config),
            lambda p, b, **kw: lm_loss(p, b, config, **kw),
            jax.ShapeDtypeStruct((config.batch, config.seq + 1), jnp.int32))
  if name == "mlp":
    return (lambda key: mlp_init(key, config),
            lambda p, b, **kw: mlp_loss(p, b, config, **kw),
            (jax.ShapeDtypeStruct((config.batch, config.sizes[0]),
                                  jnp.float32),
             jax.ShapeDtypeStruct((config.batch,), jnp.int32)))
  if name == "vit":
    return (lambda key: vit_init(key, config),
            lambda p, b, **kw: vit_loss(p, b, config, **kw),
            (jax.ShapeDtypeStruct((config.batch, config.image, config.image,
                                   config.channels), jnp.float32),
             jax.ShapeDtypeStruct((config.batch,), jnp.int32)))
  if name == "moe":
    return (lambda key: moe_init(key, config),
            lambda p, b, **kw: moe_loss(p, b, config, **kw),
            jax.ShapeDtypeStruct((config.batch, config.seq + 1), jnp.int32))
  raise ValueError(f"unknown model {name!r} (lm, mlp, vit, moe)")


def teacher_batches(config: MLPConfig, seed: int) -> Iterator[tuple]:
  """Gaussian inputs labelled by a fixed random tanh network (the teacher is
  the same for every seed; `seed` picks the inputs)."""
  teacher = np.random.default_rng(1234)
  w1 = teacher.standard_normal((config.sizes[0], config.teacher_hidden))
  w1 /= np.sqrt(config.sizes[0])
  w2 = teacher.standard_normal((config.teacher_hidden, config.sizes[-1]))
  w2 *= 3 / np.sqrt(config.teacher_hidden)
  rng = np.random.default_rng(seed)
  while True:
    x = rng.standard_normal((config.batch, config.sizes[0])).astype(np.float32)
    y = np.argmax(np.tanh(x @ w1) @ w2, -1).astype(np.int32)
    yield x, y


def window_batches(tokens: np.ndarray, batch: int, seq: int,
                   seed: int) -> Iterator[np.ndarray]:
  """Random windows of seq+1 tokens, the same sequence for the same seed."""
  rng = np.random.default_rng(seed)
  while True:
    starts = rng.integers(0, len(tokens) - seq - 1, batch)
    yield np.stack([tokens[s:s + seq + 1] for s in starts])


@dataclasses.dataclass
class Model:
  """One benchmarked model: f32 parameters, a loss, an optimizer, data."""
  name: str
  description: str
  params: Any
  loss: Callable  # loss(params, batch, full=..., output_cast=...)
  optimizer: optax.GradientTransformation
  train: Iterator
  held_out: list  # host batches, the same for every variant and seed
  seed: int = 0  # initial parameters and training order


def _train_seed(seed: int) -> int:
  """The training stream of seed `seed` (held-out data always uses 1)."""
  return 100 + seed


@functools.lru_cache(maxsize=None)
def _lm_tokens(vocab: int) -> np.ndarray:
  return byte_pair_tokens(corpus_bytes(), vocab)


def _lm_data(config, eval_batches: int, seed: int) -> tuple:
  """The LM corpus's tokens, seed `seed`'s training windows (90% of it) and
  `eval_batches` held-out windows (the rest, the same for every seed)."""
  tokens = _lm_tokens(config.vocab)
  cut = int(len(tokens) * 0.9)
  held_iter = window_batches(tokens[cut:], config.batch, config.seq, seed=1)
  return (tokens, window_batches(tokens[:cut], config.batch, config.seq,
                                 seed=_train_seed(seed)),
          [next(held_iter) for _ in range(eval_batches)])


def make_lm(config: lm.Config, eval_batches: int = 8, seed: int = 0) -> Model:
  """`seed` picks the initial parameters and the order of the training
  windows; the held-out windows are the same for every seed."""
  tokens, train, held_out = _lm_data(config, eval_batches, seed)
  return Model(
      name="lm",
      description=(f"transformer LM: {config.layers} layers, d_model "
                   f"{config.d_model}, {config.heads} heads, seq {config.seq}, "
                   f"batch {config.batch}, vocab {config.vocab} (byte pairs of "
                   f"stdlib source, {len(tokens):,} tokens), pre-LN, GELU, "
                   f"adam {config.learning_rate}"),
      params=lm_init(jax.random.key(seed), config),
      loss=lambda p, b, **kw: lm_loss(p, b, config, **kw),
      optimizer=optax.adam(config.learning_rate), train=train,
      held_out=held_out, seed=seed)


def make_mlp(config: MLPConfig, eval_batches: int = 8, seed: int = 0) -> Model:
  """`seed` picks the initial parameters and the training inputs; the
  teacher and the held-out inputs are the same for every seed."""
  held_iter = teacher_batches(config, seed=1)
  sizes = "-".join(map(str, config.sizes))
  return Model(
      name="mlp",
      description=(f"MLP {sizes}, ReLU, batch {config.batch}, teacher-labelled "
                   f"Gaussian inputs, adam {config.learning_rate}"),
      params=mlp_init(jax.random.key(seed), config),
      loss=lambda p, b, **kw: mlp_loss(p, b, config, **kw),
      optimizer=optax.adam(config.learning_rate),
      train=teacher_batches(config, seed=_train_seed(seed)),
      held_out=[next(held_iter) for _ in range(eval_batches)],
      seed=seed)


# --------------------------------------------------------------------------
# Compiled-program measurements.


def plain_step(loss: Callable, tx, cast_inside: bool) -> Callable:
  """The training step of the f32 variant, or with `cast_inside` the
  jmp-style hand cast (parameters and batch cast to bf16 inside the loss,
  f32 master parameters and optimizer state): (state, batch) -> (state,
  loss), state = (params, opt_state)."""
  def step(state, batch):
    p, o = state
    use = loss
    if cast_inside:
      half = lambda t: tree_cast(t, jnp.bfloat16)
      use = lambda q, b: loss(half(q), half(b),
                              output_cast=lambda x: x.astype(jnp.float32))
    value, grads = jax.value_and_grad(use)(p, batch)
    updates, o = tx.update(grads, o, p)
    return (optax.apply_updates(p, updates), o), value
  return step


def tree_cast(tree: Any, dtype) -> Any:
  """Float leaves to `dtype`; everything else unchanged."""
  def cast(x):
    if jnp.issubdtype(jnp.result_type(x), jnp.floating):
      return jnp.asarray(x).astype(dtype)
    return x
  return jax.tree_util.tree_map(cast, tree)


def memory(compiled) -> dict:
  """Bytes: argument, output, temp, alias, and total = arg + out + temp - alias."""
  m = compiled.memory_analysis()
  if m is None:
    return {}
  out = {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
         "temp": m.temp_size_in_bytes, "alias": m.alias_size_in_bytes}
  out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
  return out


_CONVERT = re.compile(r"\bstablehlo\.convert\b")


def count_converts(stablehlo_text: str) -> int:
  return len(_CONVERT.findall(stablehlo_text))


@functools.cache
def hlo_reader() -> types.ModuleType:
  """stablehlo_amp's reader of XLA's optimized HLO text
  (python/stablehlo_amp/_src/hlo.py), loaded from this checkout by path.

  It needs the standard library only, so it also works where stablehlo_amp
  does not import (bench/gpu.py's fallback on a machine that has only
  JAX). With `amp_internals()`, the one other place the benchmarks reach
  past the public API.
  """
  path = (pathlib.Path(__file__).resolve().parents[1] / "python" /
          "stablehlo_amp" / "_src" / "hlo.py")
  spec = importlib.util.spec_from_file_location("_stablehlo_amp_hlo", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look their module up
  spec.loader.exec_module(module)
  return module


_GEMM_TARGET = re.compile(r"gemm|matmul", re.I)


def hlo_dots(hlo_text: str) -> dict:
  """Every dot in an optimized HLO module (fusion bodies included; cuBLAS
  gemm custom calls count as dots), by operand element types.

  Returns counts (`total`, `low`: both operands bf16/f16, `fp8`: both
  FP8 (cuBLASLt FP8 GEMMs on GPU), `mixed`, `f32`,
  `low_in_custom_fusion`: low dots inside a backend fusion such as
  `__ynn_fusion` or `__triton_gemm`, `low_outside_fusion`: the others; on
  XLA:CPU a bf16 x bf16 -> f32 dot outside a YNN fusion fails at run time)
  and `dots`: one record per dot.
  """
  module = hlo_reader().Module.parse(hlo_text)
  counts = {"total": 0, "low": 0, "fp8": 0, "mixed": 0, "f32": 0,
            "other": 0,
            "low_in_custom_fusion": 0, "low_outside_fusion": 0}
  records = []
  for computation in module.computations.values():
    fusion = module.fusion_kind(computation.name) or ""
    for ins in computation.instructions:
      target = ins.custom_call_target or ""
      if not (ins.opcode == "dot" or (ins.opcode == "custom-call" and
                                      _GEMM_TARGET.search(target))):
        continue
      shapes = computation.operand_shapes(ins)[:2]
      elements = [s.element_type if s else "?" for s in shapes]
      low = [e in ("bf16", "f16") for e in elements]
      fp8 = [e.startswith("f8") for e in elements]
      kind = ("fp8" if fp8 and all(fp8) else
              "low" if low and all(low) else "mixed" if any(low) else
              "f32" if elements and all(e == "f32" for e in elements) else
              "other")
      counts["total"] += 1
      counts[kind] += 1
      if kind == "low" and fusion.startswith("__"):
        counts["low_in_custom_fusion"] += 1
      elif kind == "low":
        counts["low_outside_fusion"] += 1
      records.append({"kind": kind,
                      "operands": [s.text if s else "?" for s in shapes],
                      "result": ins.shape.text, "fusion": fusion,
                      "op_name": ins.op_name,
                      "opcode": "dot" if ins.opcode == "dot" else target})
  return {**counts, "dots": records}


def kernels(hlo_text: str) -> int:
  """Instructions of the entry computation that run work on the device
  (hlo.py's `Module.kernels`)."""
  return hlo_reader().Module.parse(hlo_text).kernels()


def kernel_kinds(hlo_text: str) -> dict[str, int]:
  """Those kernels by kind: gemm, fp8_quantize, other
  (`Module.kernel_kinds`)."""
  return hlo_reader().Module.parse(hlo_text).kernel_kinds()


# --------------------------------------------------------------------------
# Variants and the interleaved step loop.


def tree_copy(tree: Any) -> Any:
  """Fresh buffers for every array leaf: a donated state consumes its
  arrays, so no two variants (or runs) may share them."""
  return jax.tree_util.tree_map(
      lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x,
      tree)


@dataclasses.dataclass
class Built:
  """A variant ready to run: its compiled step and what was measured on it."""
  name: str
  label: str  # how the table shows it
  state: Any
  run: Callable  # run(state, batch) -> (state, loss, grads_finite)
  params_of: Callable  # state -> parameters (any float dtype)
  compiled: Any  # jax.stages.Compiled
  stablehlo: str  # the StableHLO module XLA was given
  compile_s: float  # trace + lower (+ rewrite) + XLA compile
  notes: dict = dataclasses.field(default_factory=dict)
  batch_cast: Callable = lambda b: b  # host batch -> what the step takes
  # f32 parameters -> a fresh first state (its own buffers: the step may
  # donate them); None: only the state it was built with.
  init: Callable | None = None
  donated: bool = False


# Extra XLA options for every compile the benchmarks do (bench/peak.py sets
# xla_dump_to here to read XLA's buffer assignment); empty: none.
COMPILER_OPTIONS: dict = {}


def compile_lowered(lowered) -> Any:
  """`lowered.compile()` (JAX's or stablehlo_amp's Lowered), with
  COMPILER_OPTIONS when there are any."""
  if not COMPILER_OPTIONS:
    return lowered.compile()
  return lowered.compile(compiler_options=dict(COMPILER_OPTIONS))


def timed_build(fn: Callable) -> tuple[Any, float]:
  start = time.perf_counter()
  value = fn()
  return value, time.perf_counter() - start


def run_interleaved(builts: Sequence[Built], batches: Iterator, steps: int,
                    progress: Callable[[int], None] | None = None,
                    deadline: float | None = None,
                    evaluate: Callable[[int, dict], None] | None = None
                    ) -> dict:
  """Runs every variant one step at a time on the same batch, rotating the
  order each step so no variant always follows the same neighbour.
  `evaluate(done, states)` runs after each step, outside the timing
  (states by variant name).

  Returns per-variant lists: seconds per step, train loss, grads finite.
  """
  states = {b.name: b.state for b in builts}
  log = {b.name: {"seconds": [], "loss": [], "finite": []} for b in builts}
  done = 0
  for i in range(steps):
    host = next(batches)
    for k in range(len(builts)):
      b = builts[(i + k) % len(builts)]
      batch = jax.block_until_ready(jax.device_put(b.batch_cast(host)))
      start = time.perf_counter()
      out = b.run(states[b.name], batch)
      out = jax.block_until_ready(out)
      seconds = time.perf_counter() - start
      states[b.name], loss, finite = out
      log[b.name]["seconds"].append(seconds)
      log[b.name]["loss"].append(float(loss))
      log[b.name]["finite"].append(bool(finite))
    done = i + 1
    if evaluate:
      evaluate(done, states)
    if progress:
      progress(done)
    if deadline is not None and time.perf_counter() > deadline:
      break
  for b in builts:
    b.state = states[b.name]
  return {"steps": done, "log": log}


def held_out_loss(model: Model, params: Any, eval_fn) -> float:
  params = tree_cast(params, jnp.float32)
  return float(np.mean([float(eval_fn(params, jnp.asarray(b) if not
                                      isinstance(b, tuple) else
                                      tuple(map(jnp.asarray, b))))
                        for b in model.held_out]))


def spread(values: Sequence[float]) -> dict:
  """Mean, sample standard deviation, min and max (sd None for one value)."""
  values = [float(v) for v in values]
  return {"mean": statistics.fmean(values),
          "sd": statistics.stdev(values) if len(values) > 1 else None,
          "min": min(values), "max": max(values), "n": len(values),
          "values": values}


def summarize(builts: Sequence[Built], runs: Sequence[dict], warmup: int,
              baseline: str = "f32") -> list[dict]:
  """One row per variant over every seed's run: step-time ratios against
  `baseline` (median of the per-step ratios of all seeds' timed steps),
  memory, dots, held-out loss per seed and its difference from the
  baseline's on the same seed (mean, sd, min, max).

  `runs`: one dict per seed with `seed`, `steps`, `log` (from
  run_interleaved) and `held_out` ({variant: loss})."""
  rows = []
  base_memory = next((memory(b.compiled) for b in builts
                      if b.name == baseline), None)
  for b in builts:
    seconds, ratios, held, deltas = [], [], [], []
    train_last10, skipped, after_settle, first_finite = [], 0, 0, []
    for run in runs:
      log = run["log"]
      timed = log[b.name]["seconds"][warmup:] or log[b.name]["seconds"]
      seconds += timed
      if baseline in log:
        base = log[baseline]["seconds"][warmup:] or log[baseline]["seconds"]
        ratios += [t / f for t, f in zip(timed, base)]
      held.append(run["held_out"][b.name])
      if baseline in run["held_out"]:
        deltas.append(run["held_out"][b.name] - run["held_out"][baseline])
      train_last10.append(float(np.mean(log[b.name]["loss"][-10:])))
      finite = log[b.name]["finite"]
      first = next((i for i, f in enumerate(finite) if f), len(finite))
      first_finite.append(first)
      skipped += int(sum(not f for f in finite))
      after_settle += int(sum(not f for f in finite[first:]))
    mem = memory(b.compiled)
    dots = hlo_dots(b.compiled.as_text())
    row = {
        "variant": b.name, "label": b.label, "donated": b.donated,
        "seeds": [run["seed"] for run in runs],
        "step_ms_median": 1e3 * statistics.median(seconds),
        "step_vs_f32": statistics.median(ratios) if ratios else None,
        "step_vs_f32_quartiles": (
            [float(q) for q in np.percentile(ratios, [25, 75])]
            if ratios else None),
        "memory": mem,
        "compile_s": b.compile_s,
        "converts": count_converts(b.stablehlo),
        "dots": {k: v for k, v in dots.items() if k != "dots"},
        "dot_records": dots["dots"],
        "held_out_loss": spread(held),
        "held_out_by_seed": {run["seed"]: run["held_out"][b.name]
                             for run in runs},
        "held_out_delta": spread(deltas) if deltas else None,
        "train_loss_last10": spread(train_last10),
        "train_loss": {run["seed"]: run["log"][b.name]["loss"]
                       for run in runs},
        "step_ms_all": {run["seed"]: [1e3 * t for t in
                                      run["log"][b.name]["seconds"]]
                        for run in runs},
        "skipped_steps": skipped,
        "skipped_after_settle": after_settle,
        "first_finite_step": first_finite,
        "notes": b.notes,
    }
    if base_memory and mem:
      row["memory_total_vs_f32"] = mem["total"] / base_memory["total"]
      # XLA:CPU often needs next to no temp in f32 (the MLP undonated: 68
      # bytes), where a ratio says nothing: the table shows MiB alone then.
      row["memory_temp_vs_f32"] = (mem["temp"] / base_memory["temp"]
                                   if base_memory["temp"] >= 2 ** 20 else None)
    rows.append(row)
  return rows


def _fmt(value, spec: str, missing: str = "–", suffix: str = "") -> str:
  return missing if value is None else format(value, spec) + suffix


def _delta(d: dict | None) -> str:
  if not d:
    return "–"
  if d["n"] == 1:
    return f"{d['mean']:+.4f}"
  return (f"{d['mean']:+.4f} ± {d['sd']:.4f} "
          f"[{d['min']:+.4f}, {d['max']:+.4f}]")


def markdown_table(rows: Sequence[dict]) -> str:
  seeds = max((len(r["seeds"]) for r in rows), default=1)
  delta_head = ("Δ held-out vs f32" if seeds == 1 else
                f"Δ held-out vs f32, mean ± sd [min, max] ({seeds} seeds)")
  head = ("| variant | step vs f32 | step ms | memory total vs f32 (MiB) | "
          "temp vs f32 (MiB) | compile s | converts | low-prec dots in "
          f"optimized HLO | held-out loss | {delta_head} | skipped (after "
          "settle) |")
  lines = [head, "|" + "---|" * 11]
  for r in rows:
    mem = r["memory"] or {}
    d = r["dots"]
    dots = f"{d['low']}/{d['total']}"
    if d.get("fp8"):
      dots += f", {d['fp8']} FP8"
    if d["mixed"]:
      dots += f", {d['mixed']} mixed"
    if d["low_outside_fusion"]:
      dots += f" ({d['low_outside_fusion']} unfused)"
    lines.append(
        f"| {r['label']} | {_fmt(r.get('step_vs_f32'), '.2f', suffix='×')} | "
        f"{r['step_ms_median']:.1f} | "
        f"{_fmt(r.get('memory_total_vs_f32'), '.2f', suffix='×')} "
        f"({mem.get('total', 0) / 2**20:.1f}) | "
        f"{_fmt(r.get('memory_temp_vs_f32'), '.2f', suffix='×')} "
        f"({mem.get('temp', 0) / 2**20:.1f}) | {r['compile_s']:.1f} | "
        f"{r['converts']} | {dots} | {r['held_out_loss']['mean']:.4f} | "
        f"{_delta(r.get('held_out_delta'))} | {r['skipped_steps']} "
        f"({r['skipped_after_settle']}) |")
  return "\n".join(lines)


def environment() -> dict:
  return {
      "jax": jax.__version__,
      "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "device_kind": jax.devices()[0].device_kind,
      "cpu_count": os.cpu_count(),
      "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
      "python": platform.python_version(),
      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  }


def write_json(path: pathlib.Path, data: dict) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(data, indent=1, default=str) + "\n")
  return path


# --------------------------------------------------------------------------
# Sharding a training step (bench/gpu_compile.py --devices): meshes, FSDP
# and tensor parallel shardings of a model's parameters, its training state
# and its batch, as `NamedSharding`s on the inputs (a training script's
# way; XLA's SPMD partitioner does the rest), and what the partitioned
# program moves between devices.
#
# - FSDP: every leaf split over the axis "fsdp" along its largest dimension
#   that the axis divides (the first such one on a tie); the batch along
#   its first.
# - FSDP x tensor parallel ("tp"): the LM's column-parallel kernels (qkv,
#   up, and up's bias) split their output dimension over "tp", its
#   row-parallel ones (proj, down) their input dimension (Megatron-LM's
#   layout); the rest of each leaf as in FSDP over "fsdp". The batch is
#   split over "fsdp" and replicated over "tp".
# - Training state: a leaf of the optimizer state or of the compensation
#   buffers at the path of a parameter, with the parameter's shape, takes
#   the parameter's sharding; an f8 optimizer-state leaf, its blocks split
#   as amp.train_step's init splits them; the rest (counters, the loss
#   scale) is replicated.

# The LM's tensor-parallel kernels: the dimension split over "tp".
TP_COLUMN = {"qkv": 1, "up": 1, "up_bias": 0}
TP_ROW = {"proj": 0, "down": 0}


def mesh_axes(text: str, devices: int) -> dict[str, int]:
  """`fsdp` or `fsdp=4,tp=2` as {axis: size}; the sizes multiply to
  `devices` (an axis without a size takes what is left)."""
  axes: dict[str, int] = {}
  open_axis = None
  for item in text.split(","):
    name, _, size = item.strip().partition("=")
    if name not in ("fsdp", "tp"):
      raise ValueError(f"--mesh: unknown axis {name!r} (accepted: fsdp, tp)")
    if name in axes or name == open_axis:
      raise ValueError(f"--mesh: axis {name!r} given twice")
    if size:
      if not size.isdigit() or int(size) < 1:
        raise ValueError(f"--mesh: {item!r}: the size must be a positive "
                         "integer")
      axes[name] = int(size)
    elif open_axis is not None:
      raise ValueError("--mesh: only one axis may leave its size out")
    else:
      open_axis = name
  known = 1
  for size in axes.values():
    known *= size
  if open_axis is not None:
    if devices % known:
      raise ValueError(f"--mesh {text}: {known} does not divide --devices "
                       f"{devices}")
    axes[open_axis] = devices // known
  elif known != devices:
    raise ValueError(f"--mesh {text}: the axes hold {known} devices, "
                     f"--devices is {devices}")
  return {name: axes[name] for name in ("fsdp", "tp") if name in axes}


def _largest_divisible(shape, size: int, skip: int | None = None
                       ) -> int | None:
  best = None
  for dim, extent in enumerate(shape):
    if dim != skip and extent % size == 0 and extent >= size and (
        best is None or extent > shape[best]):
      best = dim
  return best


def leaf_spec(name: str, shape: tuple[int, ...], axes: dict[str, int]) -> P:
  """The PartitionSpec of a parameter named `name` (its last key)."""
  spec: list[Any] = [None] * len(shape)
  tp = axes.get("tp", 1)
  tp_dim = None
  if tp > 1:
    tp_dim = TP_COLUMN.get(name, TP_ROW.get(name))
    if tp_dim is not None and tp_dim < len(shape) and shape[tp_dim] % tp == 0:
      spec[tp_dim] = "tp"
    else:
      tp_dim = None
  fsdp = axes.get("fsdp", 1)
  if fsdp > 1:
    dim = _largest_divisible(shape, fsdp, skip=tp_dim)
    if dim is not None:
      spec[dim] = "fsdp"
  return P(*spec)


def _last_key(path) -> str:
  for key in reversed(path):
    name = getattr(key, "key", getattr(key, "name", None))
    if isinstance(name, str):
      return name
  return ""


def param_shardings(params: Any, mesh, axes: dict[str, int]) -> Any:
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, leaf_spec(
          _last_key(path), tuple(x.shape), axes)), params)


def batch_sharding(batch: Any, mesh, axes: dict[str, int]) -> Any:
  fsdp = axes.get("fsdp", 1)
  return jax.tree_util.tree_map(
      lambda x: NamedSharding(mesh, P("fsdp", *[None] * (len(x.shape) - 1))
                              if fsdp > 1 and x.shape and
                              x.shape[0] % fsdp == 0 else P()), batch)


def state_shardings(state: Any, params: Any, shardings: Any, mesh) -> Any:
  """Shardings for a training state (a TrainState, or a plain step's
  (params, opt_state) tuple) whose parameters are sharded by `shardings`:
  see the module docstring."""
  internals = amp_internals()
  by_path = {}
  for (path, x), sharding in zip(
      jax.tree_util.tree_flatten_with_path(params)[0],
      jax.tree_util.tree_leaves(shardings)):
    by_path[jax.tree_util.keystr(path)] = (tuple(x.shape), sharding)

  def of(path, x):
    text = jax.tree_util.keystr(path)
    shape = tuple(jnp.shape(x))
    for param_path, (param_shape, sharding) in by_path.items():
      if not text.endswith(param_path):
        continue
      if shape == param_shape:
        return sharding
      if (jnp.dtype(x.dtype) == jnp.uint8 and
          shape == internals.f8_state_shape(param_shape)):
        return internals.f8_block_sharding(sharding, param_shape)
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map_with_path(of, state)


def collectives(hlo_text: str) -> dict[str, Any]:
  """Bytes each device moves, per (kind, dtype) and in all, from the
  optimized program (`hlo.py`: an all-gather by its result, the others by
  their operands). The gradient reduction is the reductions (reduce-scatter,
  all-reduce) of values the backward pass computes (`in_backward_pass`):
  a forward GEMM whose contraction the partitioner splits is reduced too,
  and is no gradient."""
  module = hlo_reader().Module.parse(hlo_text)
  table = module.collective_bytes()
  total = sum(table.values())
  reduction = sum(c.nbytes for c in module.collectives()
                  if c.kind in ("reduce-scatter", "all-reduce") and
                  c.in_backward_pass)
  return {"by_kind": {f"{kind} {dtype}": n for (kind, dtype), n in
                      sorted(table.items(), key=lambda kv: -kv[1])},
          "total": total, "gradient_reduction": reduction,
          "other": total - reduction}


def mib(count: int) -> str:
  """Bytes in MiB: whole MiB from 10 up, else 2 decimals."""
  return f"{count / 2**20:.0f}" if count >= 10 * 2**20 else \
      f"{count / 2**20:.2f}"


def describe(table: dict[str, int]) -> str:
  """`collectives()["by_kind"]` as "all-gather bf16 881, ..." (MiB)."""
  return ", ".join(f"{name} {mib(n)}" for name, n in table.items() if n) \
      or "none"


_TOPOLOGY = re.compile(r"^\d+x\d+x\d+$")


def check_topology(text: str, devices: int) -> None:
  if not _TOPOLOGY.match(text):
    raise ValueError(f"--topology {text!r}: expected partitions x hosts x "
                     "devices per host, e.g. 1x1x8 or 1x2x4")
  a, b, c = (int(n) for n in text.split("x"))
  if a * b * c != devices:
    raise ValueError(f"--topology {text} holds {a * b * c} devices, "
                     f"--devices is {devices}")
