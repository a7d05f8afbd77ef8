"""A corpus of models whose results hang on discrete decisions or linear
algebra, written with the libraries users train with.

Randomly initialised (no downloads), each as a forward pass and as a full
training step (value_and_grad + an Optax Adam update), in the form
`test_corpus.py` uses (`test_corpus.Case`):

- `linen_moe`: a flax.linen transformer-style block whose feed-forward is a
  mixture of experts with top-k routing (router dot -> top_k -> gather of
  the chosen experts' weights -> gated combine); the expert indices are an
  output (the training step returns them as its non-trained state);
- `nnx_argmax_classifier`: a flax.nnx MLP classifier whose predictions
  (argmax of the logits) are an output;
- `gp_regression`: a Gaussian process on features from a flax.linen Dense
  layer (a "deep kernel"): the kernel matrix from pairwise distances (dots,
  then a subtraction), plus jitter, jnp.linalg.cholesky and
  jax.scipy.linalg.cho_solve; the forward pass gives the posterior mean and
  the negative log marginal likelihood, the training step minimises the
  latter with optax.adam.

`python test/python/corpus_decisions.py [POLICY...]` prints the table of
figures (`test_corpus.corpus_table`).
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from test_corpus import LR, POLICIES, Case, _train_step, corpus_table

# 1. Mixture of experts with top-k routing, flax.linen ---------------------

WIDTH, EXPERTS, TOP_K, TOKENS = 32, 8, 2, 256


def linen_moe(train: bool):
  import optax
  from flax import linen as nn

  class MoE(nn.Module):
    """Top-k routed experts: each token runs through its k best experts,
    weighted by the softmax of their router logits."""
    experts: int = EXPERTS
    k: int = TOP_K
    hidden: int = 2 * WIDTH

    @nn.compact
    def __call__(self, x):                               # [T, W]
      logits = nn.Dense(self.experts, use_bias=False, name="router")(x)
      top, chosen = lax.top_k(logits, self.k)            # [T, k]
      gates = nn.softmax(top, axis=-1)
      init = nn.initializers.variance_scaling(1.0, "fan_in", "normal",
                                              in_axis=-2, out_axis=-1)
      w_in = self.param("w_in", init, (self.experts, x.shape[-1],
                                       self.hidden))
      w_out = self.param("w_out", init, (self.experts, self.hidden,
                                         x.shape[-1]))
      h = nn.gelu(jnp.einsum("td,tkdh->tkh", x, w_in[chosen]))
      out = jnp.einsum("tkh,tkhd->tkd", h, w_out[chosen])
      return jnp.einsum("tk,tkd->td", gates, out), chosen

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.Dense(WIDTH, name="embed")(x)
      y, chosen = MoE(name="moe")(nn.LayerNorm()(h))
      return nn.Dense(10, name="head")(h + y), chosen

  model = Model()
  kx, ky = jax.random.split(jax.random.key(21))
  x = jax.random.normal(kx, (TOKENS, 16), jnp.float32)
  labels = jax.random.randint(ky, (TOKENS,), 0, 10, jnp.int32)
  params = model.init(jax.random.key(0), x)["params"]
  if not train:
    return (lambda p, b: model.apply({"params": p}, b[0])), (params, (x,))
  def loss_fn(p, extra, batch):
    del extra   # the previous step's routing
    logits, chosen = model.apply({"params": p}, batch[0])
    return _cross_entropy(logits, batch[1]), chosen
  optimizer = optax.adam(LR)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params),
                    jnp.zeros((TOKENS, TOP_K), jnp.int32)), (x, labels)))


def _cross_entropy(logits, labels):
  import optax
  return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                         labels).mean()


# 2. Classifier with argmax predictions, flax.nnx --------------------------

def nnx_argmax_classifier(train: bool):
  import optax
  from flax import nnx

  class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.fc1 = nnx.Linear(32, 64, rngs=rngs)
      self.fc2 = nnx.Linear(64, 64, rngs=rngs)
      self.head = nnx.Linear(64, 16, rngs=rngs)

    def __call__(self, x):
      h = nnx.relu(self.fc1(x))
      h = nnx.relu(self.fc2(h))
      logits = self.head(h)
      return logits, jnp.argmax(logits, axis=-1)

  model = Classifier(nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  kx, ky = jax.random.split(jax.random.key(22))
  x = jax.random.normal(kx, (32, 32), jnp.float32)
  labels = jax.random.randint(ky, (32,), 0, 16, jnp.int32)
  def apply(p, inputs):
    return nnx.merge(graphdef, p, rest)(inputs)
  if not train:
    return (lambda p, b: apply(p, b[0])), (params, (x,))
  def loss_fn(p, extra, batch):
    del extra   # the previous step's predictions
    logits, preds = apply(p, batch[0])
    return _cross_entropy(logits, batch[1]), preds
  optimizer = optax.adam(LR)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params), jnp.zeros((32,), jnp.int32)),
           (x, labels)))


# 3. Gaussian process regression with a Cholesky solve, flax.linen + optax -

GP_JITTER = 1e-4


def _sq_dists(a, b):
  aa = jnp.sum(a * a, axis=-1)
  bb = jnp.sum(b * b, axis=-1)
  return aa[:, None] + bb[None, :] - 2.0 * a @ b.T


def gp_regression(train: bool):
  import optax
  from flax import linen as nn

  # No bias: the kernel depends on differences of features only, so a bias
  # would have a zero gradient, and Adam turns the rounding noise of a zero
  # gradient into steps of lr.
  features = nn.Dense(8, use_bias=False, name="features")

  def kernel(hyper, a, b):
    return jnp.exp(2.0 * hyper["log_amp"]) * jnp.exp(
        -0.5 * _sq_dists(a, b) * jnp.exp(-2.0 * hyper["log_ls"]))

  def posterior(p, x, y, x_test):
    z = features.apply({"params": p["features"]}, x)
    z_test = features.apply({"params": p["features"]}, x_test)
    noise = jnp.exp(2.0 * p["hyper"]["log_noise"]) + GP_JITTER
    k = kernel(p["hyper"], z, z) + noise * jnp.eye(x.shape[0], dtype=x.dtype)
    chol = jnp.linalg.cholesky(k)
    alpha = jax.scipy.linalg.cho_solve((chol, True), y)
    mean = kernel(p["hyper"], z_test, z) @ alpha
    nll = (0.5 * jnp.sum(y * alpha) +
           y.shape[1] * jnp.sum(jnp.log(jnp.diagonal(chol))) +
           0.5 * y.size * np.float32(np.log(2 * np.pi))) / y.size
    return mean, nll

  k = jax.random.split(jax.random.key(23), 4)
  x = jax.random.normal(k[0], (48, 8), jnp.float32)
  x_test = jax.random.normal(k[1], (16, 8), jnp.float32)
  y = jnp.sin(x @ jnp.full((8, 8), 0.3, jnp.float32)) + 0.1 * jax.random.normal(
      k[2], (48, 8), jnp.float32)
  params = {"features": features.init(k[3], x)["params"],
            "hyper": {"log_ls": jnp.float32(0.3), "log_amp": jnp.float32(0.0),
                      "log_noise": jnp.float32(-2.0)}}
  if not train:
    return (lambda p, b: posterior(p, *b)), (params, (x, y, x_test))
  def loss_fn(p, extra, batch):
    _, nll = posterior(p, *batch)
    return nll, extra
  optimizer = optax.adam(LR)
  return (_train_step(loss_fn, optimizer),
          (params, (optimizer.init(params), ()), (x, y, x_test)))


# The decisions each model's report must name, as in `programs.py`: (reason
# id, pattern of the detail), and how many dots stay f32 for them.
DECISIONS = {
    "linen_moe": (("discrete_decision", r"top_k"),),
    "nnx_argmax_classifier": (("discrete_decision", r"^argmax/argmin$"),),
    "gp_regression": (("linear_algebra", r"potrf|cholesky"),
                      ("linear_algebra", r"trsm|triangular_solve")),
}
# How many of each model's dots stay f32 because they feed the decision or
# the linear algebra. Forward and training alike: the MoE's router dot and
# the embedding dot under its layer norm; all three of the classifier's
# forward dots; the GP's feature dot and its kernel matrix's dot, and in
# training the three triangular-solve operands of the backward pass.
KEPT_DOTS = {
    "linen_moe-forward": 2, "linen_moe-train": 2,
    "nnx_argmax_classifier-forward": 3, "nnx_argmax_classifier-train": 3,
    "gp_regression-forward": 2, "gp_regression-train": 5,
}

CASES = tuple(
    Case(name, library, functools.partial(make, train), train)
    for name, library, make in (
        ("linen_moe", "flax", linen_moe),
        ("nnx_argmax_classifier", "flax", nnx_argmax_classifier),
        ("gp_regression", "flax", gp_regression),
    )
    for train in (False, True))


if __name__ == "__main__":
  print(corpus_table(tuple(sys.argv[1:]) or POLICIES, CASES))
