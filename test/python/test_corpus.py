"""A corpus of real models, written with the libraries users train with.

Flax (linen and nnx), Equinox and Optax model definitions, randomly
initialised (no downloads): an MLP (flax.linen), a ResNet-style CNN with
batch norm (flax.linen), a pre-norm transformer (flax.nnx), a GRU over
`lax.scan` (equinox). Each runs as a forward pass and as a full training
step (value_and_grad + an Optax Adam/AdamW update, batch statistics
included), and for every policy:

- the module rewrites and verifies, dots are lowered, and no value is
  converted twice to one type;
- `amp.transform` compiles and runs it on XLA:CPU without falling back;
- it matches the f32 program: forward outputs, losses, batch statistics and
  optimizer moments within the compute dtype's relative tolerance; the
  parameter updates of several Adam steps compared as one vector, with an
  allowance of 2 * lr per step per parameter (Adam moves a parameter by
  about lr whatever its gradient's size, so a small gradient whose sign
  flips in low precision moves it 2 * lr the other way) and a direction
  that agrees with f32 (cosine >= 0.99).

The batch-norm models also train through `amp.train_step` with their
batch statistics as model state: like f32 on finite steps, bit-identical
(with parameters and optimizer state) on an overflowed one.

`python test/python/test_corpus.py [POLICY...]` prints the corpus table
(model, ops in the f32 module, ops lowered, kept f32, converts inserted,
largest relative error against f32, and for training steps the largest
difference of a parameter's update from f32, in units of lr).

The libraries are installed at test time; without them these tests skip.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.interpreters import mlir as jax_mlir
from jax.extend.mlir import ir

import stablehlo_amp as amp
from mlir_checks import duplicate_converts, walk

POLICIES = ("p=f32,c=bf16,o=f32", "p=f32,c=f16,o=f32")
LR = 1e-3
TRAIN_STEPS = 3

# Unit roundoff of the compute dtype.
EPS = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def compute_eps(policy: str) -> float:
  return EPS[dict(kv.split("=") for kv in policy.split(","))["c"]]


# -- the models ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
  """One corpus entry.

  `make()` returns (fn, args): for a forward pass `fn(params, batch)`
  returns the model's outputs; for a training step `fn(params, state,
  batch)` returns {"params", "state", "loss"} and is applied `TRAIN_STEPS`
  times, each time to its own outputs.
  """
  name: str
  library: str          # what must be importable
  make: Callable[[], tuple[Callable, tuple]]
  train: bool

  @property
  def id(self) -> str:
    return f"{self.name}-{'train' if self.train else 'forward'}"


def _train_step(loss_fn: Callable, optimizer) -> Callable:
  """A full training step: loss_fn(params, extra, batch) -> (loss, extra)
  where `extra` is non-trained model state (batch statistics)."""
  import optax

  def step(params, state, batch):
    opt_state, extra = state
    (loss, extra), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, extra, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return {"params": optax.apply_updates(params, updates),
            "state": (opt_state, extra), "loss": loss}
  return step


def _classification_batch(key, x_shape, classes):
  kx, ky = jax.random.split(key)
  return (jax.random.normal(kx, x_shape, jnp.float32),
          jax.random.randint(ky, (x_shape[0],), 0, classes, jnp.int32))


def _cross_entropy(logits, labels):
  import optax
  return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                         labels).mean()


# 1. MLP, flax.linen ------------------------------------------------------------

def linen_mlp(train: bool):
  import optax
  from flax import linen as nn

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.gelu(nn.Dense(64)(x))
      x = nn.gelu(nn.Dense(64)(x))
      return nn.Dense(10)(x)

  model = MLP()
  x, labels = _classification_batch(jax.random.key(1), (32, 32), 10)
  params = model.init(jax.random.key(0), x)["params"]
  if not train:
    return (lambda p, b: model.apply({"params": p}, b[0])), (params, (x,))
  def loss_fn(p, extra, batch):
    return _cross_entropy(model.apply({"params": p}, batch[0]), batch[1]), extra
  optimizer = optax.adam(LR)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params), ()), (x, labels)))


# 2. ResNet-style CNN with batch norm, flax.linen -------------------------------

def _linen_resnet_module():
  """A ResNet-style CNN with batch norm; `model.apply(..., x, train=...)`."""
  from flax import linen as nn

  class ResBlock(nn.Module):
    features: int
    strides: int = 1

    @nn.compact
    def __call__(self, x, train: bool):
      norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                               momentum=0.9)
      y = nn.Conv(self.features, (3, 3), (self.strides, self.strides),
                  use_bias=False)(x)
      y = nn.relu(norm()(y))
      y = nn.Conv(self.features, (3, 3), use_bias=False)(y)
      y = norm(scale_init=nn.initializers.zeros_init())(y)
      if x.shape[-1] != self.features or self.strides != 1:
        x = nn.Conv(self.features, (1, 1), (self.strides, self.strides),
                    use_bias=False)(x)
        x = norm()(x)
      return nn.relu(x + y)

  class ResNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
      x = nn.Conv(16, (3, 3), use_bias=False)(x)
      x = nn.relu(nn.BatchNorm(use_running_average=not train,
                               momentum=0.9)(x))
      x = ResBlock(16)(x, train)
      x = ResBlock(32, strides=2)(x, train)
      x = jnp.mean(x, axis=(1, 2))
      return nn.Dense(10)(x)

  return ResNet()


@functools.lru_cache(maxsize=None)
def _linen_resnet_training():
  """(loss_fn(params, batch_stats, batch) -> (loss, new batch_stats),
  params, batch_stats, batch)."""
  model = _linen_resnet_module()
  x, labels = _classification_batch(jax.random.key(2), (8, 16, 16, 3), 10)
  # Under jit: one compilation instead of an eager dispatch per op.
  variables = jax.jit(functools.partial(model.init, train=False))(
      jax.random.key(0), x)

  def loss_fn(p, batch_stats, batch):
    logits, updated = model.apply({"params": p, "batch_stats": batch_stats},
                                  batch[0], train=True,
                                  mutable=["batch_stats"])
    return _cross_entropy(logits, batch[1]), updated["batch_stats"]
  return (loss_fn, variables["params"], variables["batch_stats"],
          (x, labels))


def linen_resnet(train: bool):
  import optax

  loss_fn, params, stats, (x, labels) = _linen_resnet_training()
  if not train:
    model = _linen_resnet_module()
    def forward(p, b):
      return model.apply({"params": p, "batch_stats": b[1]}, b[0], train=False)
    # Running statistics from one training-mode pass, so they are not trivial.
    _, updated = loss_fn(params, stats, (x, labels))
    return forward, (params, (x, updated))
  optimizer = optax.adam(LR)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params), stats), (x, labels)))


# 3. Transformer, flax.nnx ------------------------------------------------------

VOCAB, SEQ, WIDTH, HEADS = 64, 16, 32, 4


def nnx_transformer(train: bool):
  import optax
  from flax import nnx

  class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.ln1 = nnx.LayerNorm(WIDTH, rngs=rngs)
      self.attn = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False,
                                         keep_rngs=False, rngs=rngs)
      self.ln2 = nnx.LayerNorm(WIDTH, rngs=rngs)
      self.fc1 = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs)
      self.fc2 = nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x, mask):
      x = x + self.attn(self.ln1(x), mask=mask)
      return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))

  class Transformer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
      self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(),
                                                    (SEQ, WIDTH)))
      self.block0 = Block(rngs)
      self.block1 = Block(rngs)
      self.ln = nnx.LayerNorm(WIDTH, rngs=rngs)
      self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens):
      x = self.embed(tokens) + self.pos[...]
      mask = nnx.make_causal_mask(tokens)
      x = self.block1(self.block0(x, mask), mask)
      return self.head(self.ln(x))

  model = Transformer(nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tokens = jax.random.randint(jax.random.key(3), (4, SEQ + 1), 0, VOCAB,
                              jnp.int32)
  def apply(p, t):
    return nnx.merge(graphdef, p, rest)(t)
  if not train:
    return (lambda p, b: apply(p, b[0])), (params, (tokens[:, :-1],))
  def loss_fn(p, extra, batch):
    logits = apply(p, batch[0][:, :-1])
    return _cross_entropy(logits.reshape(-1, VOCAB),
                          batch[0][:, 1:].reshape(-1)), extra
  optimizer = optax.adamw(LR, weight_decay=1e-2)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params), ()), (tokens,)))


# 4. GRU over lax.scan, equinox -------------------------------------------------

def equinox_gru(train: bool):
  import equinox as eqx
  import optax

  class GRU(eqx.Module):
    cell: eqx.nn.GRUCell
    head: eqx.nn.Linear

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.cell = eqx.nn.GRUCell(16, 32, key=k1)
      self.head = eqx.nn.Linear(32, 4, key=k2)

    def __call__(self, xs):                # [T, F]
      def step(h, x):
        h = self.cell(x, h)
        return h, h
      h, _ = lax.scan(step, jnp.zeros((32,), xs.dtype), xs)
      return self.head(h)

  model = GRU(jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_inexact_array)
  k1, k2 = jax.random.split(jax.random.key(4))
  xs = jax.random.normal(k1, (8, 12, 16), jnp.float32)
  targets = jax.random.normal(k2, (8, 4), jnp.float32)
  def apply(p, x):
    return jax.vmap(eqx.combine(p, static))(x)
  if not train:
    return (lambda p, b: apply(p, b[0])), (params, (xs,))
  def loss_fn(p, extra, batch):
    return jnp.mean((apply(p, batch[0]) - batch[1]) ** 2), extra
  optimizer = optax.adam(LR)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params), ()), (xs, targets)))


CASES = tuple(
    Case(name, library, functools.partial(make, train), train)
    for name, library, make in (
        ("linen_mlp", "flax", linen_mlp),
        ("linen_resnet_bn", "flax", linen_resnet),
        ("nnx_transformer", "flax", nnx_transformer),
        ("equinox_gru_scan", "equinox", equinox_gru),
    )
    for train in (False, True))


# -- helpers --------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def built(case: Case) -> tuple[Callable, tuple]:
  pytest.importorskip("optax")
  pytest.importorskip(case.library)
  return case.make()


@functools.lru_cache(maxsize=None)
def f32_text(case: Case) -> str:
  fn, args = built(case)
  return jax.jit(fn).lower(*args).as_text()


def count_ops(text: str) -> int:
  """Operations in the module, excluding functions and their returns."""
  context = jax_mlir.make_ir_context()
  with context:
    module = ir.Module.parse(text, context)
    return sum(1 for op in walk(module.operation)
               if op.name not in ("func.func", "func.return",
                                  "stablehlo.return"))


def run(fn: Callable, args: tuple, steps: int) -> tuple[Any, list]:
  """Applies `fn` (`steps` times for a training step); returns the last
  outputs and the losses."""
  out, losses = None, []
  for _ in range(steps):
    out = jax.block_until_ready(fn(*args))
    if isinstance(out, dict) and "loss" in out:
      losses.append(out["loss"])
      args = (out["params"], out["state"], args[2])
  return out, losses


def relative_error(actual, expected) -> float:
  actual = np.asarray(actual, np.float64).ravel()
  expected = np.asarray(expected, np.float64).ravel()
  norm = np.linalg.norm(expected)
  diff = np.linalg.norm(actual - expected)
  return float(diff / norm) if norm else float(diff)


def flat(tree) -> np.ndarray:
  leaves = [np.asarray(leaf, np.float64).ravel()
            for leaf in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(leaf.dtype, jnp.floating)]
  return np.concatenate(leaves) if leaves else np.zeros(0)


@dataclasses.dataclass
class Result:
  """What comparing one case under one policy measured."""
  errors: dict[str, float]      # relative-norm errors by output
  problems: list[str]           # failed comparisons
  update_diff: float | None = None  # max |update - f32 update|, in lr

  @property
  def max_error(self) -> float:
    """The largest relative-norm error of the outputs, losses, batch
    statistics and optimizer moments (not of the parameter updates, which
    are compared in units of lr)."""
    return max(v for k, v in self.errors.items()
               if not k.startswith("updates"))


def compare(case: Case, policy: str, actual, expected, actual_losses,
            expected_losses, initial_params) -> Result:
  """Checks the AMP outputs against f32 (see the module docstring)."""
  eps = compute_eps(policy)
  tol = 8 * eps   # relative norm: a few roundings of each operand
  # (elementwise, forward outputs: 16 eps of the largest magnitude)
  errors: dict[str, float] = {}
  problems: list[str] = []
  def check(name, a, e, limit):
    a_leaves = jax.tree_util.tree_leaves(a)
    e_leaves = jax.tree_util.tree_leaves(e)
    for x, y in zip(a_leaves, e_leaves):
      if not jnp.issubdtype(y.dtype, jnp.floating):
        if not np.array_equal(np.asarray(x), np.asarray(y)):
          problems.append(f"{name}: integer leaf differs")
      elif np.dtype(x.dtype) != np.dtype(y.dtype):
        problems.append(f"{name}: dtype {x.dtype}, f32 program {y.dtype}")
    a_flat, e_flat = flat(a), flat(e)
    if not np.all(np.isfinite(a_flat)):
      problems.append(f"{name}: not finite")
      errors[name] = float("inf")
      return
    errors[name] = relative_error(a_flat, e_flat)
    if errors[name] > limit:
      problems.append(f"{name}: relative error {errors[name]:.3g} > "
                      f"{limit:.3g}")
  if not case.train:
    check("outputs", actual, expected, tol)
    # And elementwise, relative to the output's magnitude.
    for i, (a, e) in enumerate(zip(jax.tree_util.tree_leaves(actual),
                                   jax.tree_util.tree_leaves(expected))):
      a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
      worst = float(np.max(np.abs(a - e)))
      if worst > 2 * tol * float(np.max(np.abs(e))):
        problems.append(f"output {i}: max |error| {worst:.3g} > "
                        f"{2 * tol:.3g} x max |f32 output|")
    return Result(errors, problems)
  check("loss", np.array(actual_losses), np.array(expected_losses), tol)
  opt_state, extra = actual["state"]
  want_opt_state, want_extra = expected["state"]
  check("batch_stats", extra, want_extra, tol)
  # Adam's moments: the first is a running mean of the gradients, the
  # second of their squares (twice the gradients' relative error).
  check("optimizer_state", opt_state, want_opt_state, 2 * tol)
  # Parameter updates, as one vector.
  start = flat(initial_params)
  got = flat(actual["params"]) - start
  want = flat(expected["params"]) - start
  allowance = 2 * LR * TRAIN_STEPS
  worst = float(np.max(np.abs(got - want)))
  if worst > allowance:
    problems.append(f"parameter updates differ by {worst:.3g} > "
                    f"2 lr x {TRAIN_STEPS} steps = {allowance:.3g}")
  cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
  errors["updates"] = relative_error(got, want)
  errors["updates_cosine"] = cosine
  if cosine < 0.99:
    problems.append(f"parameter updates point elsewhere: cosine {cosine:.3f}")
  return Result(errors, problems, worst / LR)


@dataclasses.dataclass
class Row:
  model: str
  policy: str
  ops: int
  lowered: int
  kept_f32: int
  converts: int
  max_error: float | None = None
  update_diff: float | None = None


@functools.lru_cache(maxsize=None)
def reference(case: Case):
  fn, args = built(case)
  return run(jax.jit(fn), args, TRAIN_STEPS if case.train else 1)


def measure(case: Case, policy: str, **options) -> tuple[Row, Result]:
  """Rewrites (with `options`), runs and compares one case: its table row
  and what the comparison found."""
  fn, args = built(case)
  steps = TRAIN_STEPS if case.train else 1
  fast = amp.transform(fn, policy, **options)
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="stablehlo-amp")
    report = fast.lower(*args).report()
    actual, actual_losses = run(fast, args, steps)
  row = Row(case.id, policy, count_ops(f32_text(case)),
            sum(report.lowered.values()), sum(report.kept_f32.values()),
            report.converts_inserted)
  expected, expected_losses = reference(case)
  result = compare(case, policy, actual, expected, actual_losses,
                   expected_losses, args[0])
  row.max_error = result.max_error
  row.update_diff = result.update_diff
  return row, result


def corpus_table(policies=POLICIES, cases=CASES) -> str:
  """The corpus table, measured now (rows that fail say why)."""
  lines = ["| model | policy | ops | lowered | kept f32 | converts "
           "| max error vs f32 | max update diff |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
  for case in cases:
    for policy in policies:
      try:
        row, _ = measure(case, policy)
        error = f"{row.max_error:.2e}"
      except pytest.skip.Exception as skip:
        lines.append(f"| {case.id} | {policy} | skipped: {skip} ||||||")
        continue
      except Exception as error:  # the tests assert it; the table says it
        first = str(error).strip().splitlines()[0][:120] if str(error) else ""
        lines.append(f"| {case.id} | {policy} | fails: "
                     f"{type(error).__name__}: {first} ||||||")
        continue
      update = ("" if row.update_diff is None else
                f"{row.update_diff:.2f} lr")
      lines.append(f"| {row.model} | {policy} | {row.ops} | {row.lowered} | "
                   f"{row.kept_f32} | {row.converts} | {error} | {update} |")
  return "\n".join(lines)


def _cases():
  for case in CASES:
    for policy in POLICIES:
      yield pytest.param(case, policy, id=f"{case.id}-{policy}")


# -- tests ----------------------------------------------------------------------

@pytest.mark.parametrize("case, policy", list(_cases()))
def test_rewrites_and_verifies(case: Case, policy: str):
  text = f32_text(case)
  result = amp.rewrite_module(text, policy, target="cpu")   # verifies
  assert result.report.lowered["stablehlo.dot_general"] > 0, (
      "no dot was lowered")
  assert duplicate_converts(result.module) == []


@pytest.mark.parametrize("case, policy", list(_cases()))
def test_runs_and_matches_f32(case: Case, policy: str):
  _, result = measure(case, policy)
  assert not result.problems, result.problems


def test_corpus_covers_the_model_kinds():
  """The modules exercise what the corpus is for: convolutions and batch
  norm, attention softmax, a scan loop, and optimizer updates."""
  wanted = {
      "linen_resnet_bn": ("stablehlo.convolution", "stablehlo.rsqrt"),
      "nnx_transformer": ("stablehlo.exponential", "stablehlo.dot_general"),
      "equinox_gru_scan": ("stablehlo.while", "stablehlo.tanh"),
      "linen_mlp": ("stablehlo.dot_general",),
  }
  for case in CASES:
    text = f32_text(case)
    for op in wanted[case.name]:
      assert op in text, f"{case.id} has no {op}"
    if case.train:
      assert "stablehlo.sqrt" in text, f"{case.id}: no Adam update"


# -- amp.train_step with model state (batch norm) ------------------------------


def _nnx_cnn_training():
  """A flax.nnx CNN with batch norm, split into parameters and batch
  statistics: (loss_fn, params, batch_stats, batch) as for train_step."""
  from flax import nnx

  class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.conv = nnx.Conv(3, 16, (3, 3), use_bias=False, rngs=rngs)
      self.norm = nnx.BatchNorm(16, momentum=0.9, rngs=rngs)
      self.head = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x):
      x = nnx.relu(self.norm(self.conv(x)))
      return self.head(jnp.mean(x, axis=(1, 2)))

  graphdef, params, batch_stats = nnx.split(CNN(nnx.Rngs(0)), nnx.Param,
                                            nnx.BatchStat)

  def loss_fn(p, batch_stats, batch):
    # copy=True: the statistics come from outside the differentiated
    # function, and nnx does not mutate a Variable of another trace.
    model = nnx.merge(graphdef, p, batch_stats, copy=True)
    model.train()
    loss = _cross_entropy(model(batch[0]), batch[1])
    return loss, nnx.state(model, nnx.BatchStat)
  batch = _classification_batch(jax.random.key(5), (8, 16, 16, 3), 10)
  return loss_fn, params, batch_stats, batch


BATCHNORM_TRAINING = {"linen_resnet_bn": _linen_resnet_training,
                      "nnx_cnn_bn": _nnx_cnn_training}


def _f32_training(name: str):
  """Plain JAX in f32, Adam: (params, batch stats, losses) after
  `TRAIN_STEPS` steps on the one batch; the corpus case's own reference
  where the corpus has the model (the same steps)."""
  import optax
  corpus = {case.name: case for case in CASES if case.train}
  if name in corpus:
    out, losses = reference(corpus[name])
    return out["params"], out["state"][1], [float(x) for x in losses]
  loss_fn, params, stats, batch = BATCHNORM_TRAINING[name]()
  step = jax.jit(_train_step(loss_fn, optax.adam(LR)))
  state, losses = (optax.adam(LR).init(params), stats), []
  for _ in range(TRAIN_STEPS):
    out = step(params, state, batch)
    params, state = out["params"], out["state"]
    losses.append(float(out["loss"]))
  return params, state[1], losses


@pytest.mark.parametrize("name", BATCHNORM_TRAINING)
def test_batchnorm_model_trains_through_train_step(name):
  """Batch statistics are model state: updated like f32 on finite steps,
  bit-identical (with parameters and optimizer state) on an overflowed
  one."""
  optax = pytest.importorskip("optax")
  pytest.importorskip("flax")
  policy = "p=f32,c=f16,o=f32"
  loss_fn, params, stats, batch = BATCHNORM_TRAINING[name]()
  step = amp.train_step(loss_fn, optax.adam(LR), policy)
  state = step.init(params, model_state=stats)
  losses = []
  for _ in range(TRAIN_STEPS):
    state, metrics = step(state, batch)
    assert bool(metrics["grads_finite"])
    losses.append(float(metrics["loss"]))
  want_params, want_stats, want_losses = _f32_training(name)
  tol = 8 * compute_eps(policy)
  assert relative_error(losses, want_losses) <= tol, (losses, want_losses)
  assert (jax.tree_util.tree_structure(state.model_state) ==
          jax.tree_util.tree_structure(stats))
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(
      state.model_state)} == {np.dtype(jnp.float32)}
  assert relative_error(flat(state.model_state), flat(want_stats)) <= tol
  assert relative_error(flat(state.model_state), flat(stats)) > tol  # moved
  got = flat(state.params) - flat(params)
  want = flat(want_params) - flat(params)
  assert float(np.max(np.abs(got - want))) <= 2 * LR * TRAIN_STEPS
  assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) \
      >= 0.99

  x, labels = batch
  poisoned = (x.at[0, 0, 0, 0].set(jnp.inf), labels)
  before = jax.tree_util.tree_leaves((state.params, state.opt_state,
                                      state.model_state))
  scale = float(state.loss_scale.loss_scale)
  state, metrics = step(state, poisoned)
  assert not bool(metrics["grads_finite"])
  after = jax.tree_util.tree_leaves((state.params, state.opt_state,
                                     state.model_state))
  assert len(before) == len(after)
  for b, a in zip(before, after):
    assert b.dtype == a.dtype and np.array_equal(b, a), (
        "an overflowed step changed the state")
  assert int(metrics["skipped_steps"]) == 1
  assert float(metrics["loss_scale"]) == scale / 2
  state, metrics = step(state, batch)
  assert bool(metrics["grads_finite"])
  assert step.rewrite_count == 1


if __name__ == "__main__":
  print(corpus_table(tuple(sys.argv[1:]) or POLICIES))
