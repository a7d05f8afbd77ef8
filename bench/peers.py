"""Peers: stablehlo-amp against f32, jmp, MPX and all-bf16 training.

Two models (a 4-layer transformer LM and a 784-1024-1024-10 MLP), every
variant built, compiled and then trained in one process, interleaved step by
step on the same batches (shared, noisy machines: read the ratios, not the
absolute times). Prints one markdown table per model and writes
bench/results/peers[-quick|-gpu].json.

    python bench/peers.py            # 100 steps
    python bench/peers.py --quick    # 10 steps, smoke test
    python bench/peers.py --variants f32,ours-bf16,jmp-bf16 --models lm

Variants (all with f32 master parameters except all-bf16):
  f32          jax.jit of the plain step
  ours-bf16    amp.train_step(loss, adam, "p=f32,c=bf16,o=f32")
  ours-bf16-transform  amp.transform(plain step, "p=f32,c=bf16,o=f32")
  ours-f16     amp.train_step(..., "p=f32,c=f16,o=f32", DynamicLossScale())
  jmp-bf16     jmp 0.0.4: policy casts inside the loss, NoOpLossScale
  jmp-f16      jmp 0.0.4 with jmp.DynamicLossScale(2**15), select_tree skip
  mpx-bf16     MPX: mpx.filter_value_and_grad + mpx.optimizer_update, its
               DynamicLossScaling(FLOAT16_MAX), force_full_precision around
               layer norm, softmax and the loss
  mpx-f16      the same with half precision = float16
  all-bf16     parameters, optimizer state and compute in bf16 (memory floor)
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import common  # noqa: E402

DEFAULT_VARIANTS = ("f32", "ours-bf16", "ours-f16", "jmp-bf16", "jmp-f16",
                    "mpx-bf16", "mpx-f16", "all-bf16")
LABELS = {
    "f32": "f32",
    "ours-bf16": "ours bf16 (train_step)",
    "ours-bf16-transform": "ours bf16 (transform)",
    "ours-f16": "ours f16 + dynamic scale",
    "jmp-bf16": "jmp bf16",
    "jmp-f16": "jmp f16 + dynamic scale",
    "mpx-bf16": "MPX bf16",
    "mpx-f16": "MPX f16",
    "all-bf16": "all-bf16",
}


class Unavailable(Exception):
  """A variant whose library is missing here; the run goes on without it."""


def _true():
  return jnp.ones((), bool)


def _compile_jit(fn, state, batch) -> tuple[Any, str, float]:
  def go():
    lowered = jax.jit(fn).lower(state, batch)
    return lowered.as_text(), lowered.compile()
  (text, compiled), seconds = common.timed_build(go)
  return compiled, text, seconds


def build_f32(model: common.Model, batch, bf16: bool = False) -> common.Built:
  tx = model.optimizer
  cast = ((lambda t: common.tree_cast(t, jnp.bfloat16)) if bf16 else
          (lambda t: t))

  def step(state, batch):
    params, opt_state = state
    loss, grads = jax.value_and_grad(model.loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss, _true()

  params = cast(model.params)
  state = (params, tx.init(params))
  batch = cast(batch)
  compiled, text, seconds = _compile_jit(step, state, batch)
  name = "all-bf16" if bf16 else "f32"
  return common.Built(name, LABELS[name], state, compiled,
                      lambda s: s[0], compiled, text, seconds,
                      batch_cast=cast)


def _lowered_stablehlo(lowered) -> str:
  # What XLA compiles: the outer jit module with the rewritten module called
  # from it (same converts as `lowered.as_text()` when p=f32).
  inner = getattr(lowered, "_jax_lowered", None)
  return inner.as_text() if inner is not None else lowered.as_text()


def build_ours(model: common.Model, batch, policy: str,
               dynamic: bool, target: str | None = None) -> common.Built:
  try:
    import stablehlo_amp as amp
  except ImportError as error:
    raise Unavailable(f"stablehlo_amp is not installed ({error})")
  loss_scale = amp.DynamicLossScale() if dynamic else None
  options = {"target": target} if target else {}
  step = amp.train_step(lambda p, b: model.loss(p, b), model.optimizer,
                        policy, loss_scale=loss_scale, **options)
  state = step.init(model.params)

  def go():
    lowered = step.lower(state, batch)
    return lowered, lowered.compile()
  (lowered, compiled), seconds = common.timed_build(go)
  report = lowered.report()
  timings = lowered.timings

  def run(state, batch):
    state, metrics = compiled(state, batch)
    return state, metrics["loss"], metrics["grads_finite"]

  name = "ours-f16" if dynamic else "ours-bf16"
  notes = {"policy": policy, "lower_s": timings.lower,
           "rewrite_s": timings.rewrite,
           "converts_inserted": report.converts_inserted if report else None,
           "lowered_ops": dict(report.lowered) if report else None,
           "kept_f32_reasons": ({k: dict(v) for k, v in
                                 report.kept_f32_reasons.items()}
                                if report else None)}
  built = common.Built(name, LABELS[name], state, run, lambda s: s.params,
                       compiled, _lowered_stablehlo(lowered), seconds, notes)
  built.final_notes = lambda s: {"loss_scale": float(s.loss_scale.loss_scale)}
  return built


def build_ours_transform(model: common.Model, batch,
                         policy: str) -> common.Built:
  try:
    import stablehlo_amp as amp
  except ImportError as error:
    raise Unavailable(f"stablehlo_amp is not installed ({error})")
  tx = model.optimizer

  def plain_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(model.loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  fast = amp.transform(plain_step, policy)
  state = (model.params, tx.init(model.params))

  def go():
    lowered = fast.lower(*state, batch)
    return lowered, lowered.compile()
  (lowered, compiled), seconds = common.timed_build(go)

  def run(state, batch):
    params, opt_state, loss = compiled(*state, batch)
    return (params, opt_state), loss, _true()

  report = lowered.report()
  notes = {"policy": policy, "lower_s": lowered.timings.lower,
           "rewrite_s": lowered.timings.rewrite,
           "converts_inserted": report.converts_inserted if report else None}
  return common.Built("ours-bf16-transform", LABELS["ours-bf16-transform"],
                      state, run, lambda s: s[0], compiled,
                      _lowered_stablehlo(lowered), seconds, notes)


def build_jmp(model: common.Model, batch, half) -> common.Built:
  try:
    import jmp
  except ImportError as error:
    raise Unavailable(f"jmp is not installed ({error}); pip install "
                      "--no-deps jmp==0.0.4")
  name = "jmp-f16" if half == jnp.float16 else "jmp-bf16"
  policy = jmp.get_policy(
      f"params=float32,compute={jnp.dtype(half).name},output=float32")
  tx = model.optimizer
  scaled = half == jnp.float16

  def loss_fn(params, batch, loss_scale):
    params = policy.cast_to_compute(params)
    batch = policy.cast_to_compute(batch)
    loss = model.loss(params, batch, output_cast=policy.cast_to_output)
    return loss_scale.scale(loss), loss

  def step(state, batch):
    # jmp 0.0.4's DynamicLossScale cannot be a jit argument under JAX 0.10
    # (its unflatten validates the leaves, which `lower` fills with ArgInfo),
    # so its two tensors travel and the object is rebuilt inside.
    params, opt_state, scale_state = state
    loss_scale = (jmp.DynamicLossScale(*scale_state) if scaled else
                  jmp.NoOpLossScale())
    grads, loss = jax.grad(loss_fn, has_aux=True)(params, batch, loss_scale)
    grads = policy.cast_to_param(grads)
    grads = loss_scale.unscale(grads)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if not scaled:  # bf16: jmp's recipe needs no scaling and no skipping
      return (new_params, new_opt_state, scale_state), loss, _true()
    finite = jmp.all_finite(grads)
    loss_scale = loss_scale.adjust(finite)
    new_params = jmp.select_tree(finite, new_params, params)
    new_opt_state = jmp.select_tree(finite, new_opt_state, opt_state)
    return ((new_params, new_opt_state,
             (loss_scale.loss_scale, loss_scale.counter)), loss, finite)

  scale_state = ((jnp.asarray(2.0 ** 15, jnp.float32), jnp.zeros((), jnp.int32))
                 if scaled else ())
  state = (model.params, tx.init(model.params), scale_state)
  compiled, text, seconds = _compile_jit(step, state, batch)
  built = common.Built(name, LABELS[name], state, compiled, lambda s: s[0],
                       compiled, text, seconds)
  if scaled:
    built.final_notes = lambda s: {"loss_scale": float(s[2][0])}
  return built


def build_mpx(model: common.Model, batch, half) -> common.Built:
  try:
    import mpx
  except ImportError as error:
    raise Unavailable(f"mpx is not installed ({error}); pip install "
                      "--no-deps mixed-precision-for-jax==0.1.8 (needs "
                      "equinox, jaxtyping, wadler_lindig)")
  name = "mpx-f16" if half == jnp.float16 else "mpx-bf16"
  tx = model.optimizer
  # A dtype, not the string: mpx 0.1.8's string branch never stores it.
  mpx.set_half_precision_datatype(half)
  full = lambda fn, out_dtype=None: mpx.force_full_precision(
      fn, out_dtype if out_dtype is not None else half)

  def loss_fn(params, batch):
    return model.loss(params, batch, full=full)

  def step(state, batch):
    params, opt_state, scaling = state
    loss, scaling, finite, grads = mpx.filter_value_and_grad(
        loss_fn, scaling)(params, batch)
    params, opt_state = mpx.optimizer_update(params, tx, opt_state, grads,
                                             finite)
    return (params, opt_state, scaling), loss, finite

  scaling = mpx.DynamicLossScaling(
      loss_scaling=mpx.FLOAT16_MAX,
      min_loss_scaling=jnp.ones((), jnp.float32), period=2000)
  state = (model.params, tx.init(model.params), scaling)
  compiled, text, seconds = _compile_jit(step, state, batch)
  built = common.Built(name, LABELS[name], state, compiled, lambda s: s[0],
                       compiled, text, seconds)
  built.final_notes = lambda s: {"loss_scale": float(s[2].loss_scaling)}
  return built


def build(variant: str, model: common.Model, batch,
          target: str | None = None) -> common.Built:
  if variant == "f32":
    return build_f32(model, batch)
  if variant == "all-bf16":
    return build_f32(model, batch, bf16=True)
  if variant == "ours-bf16":
    return build_ours(model, batch, "p=f32,c=bf16,o=f32", False, target)
  if variant == "ours-f16":
    return build_ours(model, batch, "p=f32,c=f16,o=f32", True, target)
  if variant == "ours-bf16-transform":
    return build_ours_transform(model, batch, "p=f32,c=bf16,o=f32")
  if variant == "jmp-bf16":
    return build_jmp(model, batch, jnp.bfloat16)
  if variant == "jmp-f16":
    return build_jmp(model, batch, jnp.float16)
  if variant == "mpx-bf16":
    return build_mpx(model, batch, jnp.bfloat16)
  if variant == "mpx-f16":
    return build_mpx(model, batch, jnp.float16)
  raise SystemExit(f"unknown variant {variant!r} (known: "
                   f"{', '.join(LABELS)})")


def bench_model(model: common.Model, variants, steps: int, warmup: int,
                builders=None, deadline: float | None = None) -> dict:
  """Builds every variant, trains them interleaved, returns rows + table."""
  builders = builders or {}
  host = next(model.train)
  builts, skipped, failed = [], {}, {}
  for variant in variants:
    print(f"  building {variant} ...", end="", flush=True)
    try:
      if variant in builders:
        built = builders[variant](model, host)
      else:
        built = build(variant, model, jax.device_put(host))
    except Unavailable as why:
      print(f" skipped: {why}")
      skipped[variant] = str(why)
      continue
    try:  # one untimed step (state discarded): compiles lazily, fails early
      jax.block_until_ready(built.run(
          built.state, jax.device_put(built.batch_cast(host))))
    except Exception as error:  # noqa: BLE001 - reported, not hidden
      message = f"{type(error).__name__}: {str(error).splitlines()[0]}"
      print(f" compiled in {built.compile_s:.1f} s but FAILED at run time: "
            f"{message}")
      dots = common.hlo_dots(built.compiled.as_text())
      failed[variant] = {"error": message, "compile_s": built.compile_s,
                         "dots": {k: v for k, v in dots.items() if k != "dots"},
                         "dot_records": dots["dots"]}
      continue
    print(f" {built.compile_s:.1f} s")
    builts.append(built)
  if not builts:
    return {"rows": [], "skipped_variants": skipped, "failed_variants": failed,
            "table": ""}
  tty = sys.stdout.isatty()

  def progress(done: int) -> None:
    if done == steps or (tty and done % 5 == 0) or done % max(steps // 4, 1) == 0:
      print(f"{chr(13) if tty else ''}  step {done}/{steps}",
            end="\n" if done == steps or not tty else "", flush=True)

  start = time.perf_counter()
  run = common.run_interleaved(builts, model.train, steps, progress, deadline)
  if run["steps"] < steps:
    print(f"\n  stopped after {run['steps']} steps (time budget)")
  train_s = time.perf_counter() - start
  baseline = "f32" if any(b.name == "f32" for b in builts) else builts[0].name
  rows = common.summarize(model, builts, run, min(warmup, run["steps"] - 1),
                          baseline)
  for row, built in zip(rows, builts):
    final = getattr(built, "final_notes", None)
    if final:
      row["notes"].update(final(built.state))
  table = common.markdown_table(rows)
  for variant, why in skipped.items():
    table += f"\n| {LABELS.get(variant, variant)} | not run: {why} |"
  for variant, failure in failed.items():
    d = failure["dots"]
    table += (f"\n| {LABELS.get(variant, variant)} | FAILED at run time: "
              f"{failure['error']} (optimized HLO: {d['low']}/{d['total']} "
              f"low-precision dots, {d['low_outside_fusion']} outside a "
              f"backend fusion) |")
  return {"model": model.name, "description": model.description,
          "steps": run["steps"], "warmup": warmup, "train_seconds": train_s,
          "baseline": baseline, "rows": rows, "skipped_variants": skipped,
          "failed_variants": failed, "table": table}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help="10 steps, 2 warm-up steps: a smoke test")
  parser.add_argument("--steps", type=int, help="training steps (default 100)")
  parser.add_argument("--warmup", type=int,
                      help="steps left out of the timing (default 5)")
  parser.add_argument("--models", default="lm,mlp")
  parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
  parser.add_argument("--json", help="output path (default "
                      "bench/results/peers[-quick].json)")
  args = parser.parse_args(argv)
  steps = args.steps or (10 if args.quick else 100)
  warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
  variants = [v for v in args.variants.split(",") if v]
  env = common.environment()
  print(f"peers: backend {env['backend']} ({env['device_kind']}), jax "
        f"{env['jax']}, {env['cpu_count']} CPUs, load {env['loadavg']}; "
        f"{steps} steps, interleaved")
  results = {"benchmark": "peers", "environment": env, "steps": steps,
             "variants": variants, "models": {}}
  makers = {"lm": lambda: common.make_lm(common.LMConfig()),
            "mlp": lambda: common.make_mlp(common.MLPConfig())}
  for name in args.models.split(","):
    model = makers[name]()
    print(f"\n## {model.description}")
    result = bench_model(model, variants, steps, warmup)
    results["models"][name] = result
    print()
    print(result["table"])
  results["environment_end"] = {"loadavg": common.environment()["loadavg"]}
  path = common.write_json(
      common.pathlib.Path(args.json) if args.json else
      common.RESULTS / ("peers-quick.json" if args.quick else "peers.json"),
      results)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
