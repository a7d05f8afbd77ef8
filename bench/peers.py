"""Peers: stablehlo-amp against f32, jmp, MPX and all-bf16 training.

Two models (a 4-layer transformer LM and a 784-1024-1024-10 MLP), every
variant built and compiled once, then trained from each seed's initial
parameters in one process, interleaved step by step on the same batches
(shared, noisy machines: read the ratios, not the absolute times). Every
step donates its state (parameters, optimizer and loss-scale state), as a
real training loop does; --no-donate keeps it. Prints one markdown table per
model and writes bench/results/peers[-quick|-smoke].json.

    python -m bench.peers            # 100 steps x 3 seeds
    python -m bench.peers --quick    # 10 steps, 1 seed
    python -m bench.peers --smoke    # tiny models, 2 steps: checks the script
    python -m bench.peers --variants f32,ours-bf16,jmp-bf16 --models lm
    python -m bench.peers --models mlp --steps 2000 --eval-every 250 \
        --lr 1e-4 --variants f32,ours-bf16-params-bf16-rounding-kahan
                                     # held-out curves at another rate

A seed picks the initial parameters and the order of the training batches;
the held-out batches are the same for every seed. The held-out loss of each
variant is compared with f32's on the same seed; the table gives the mean,
the sample standard deviation, min and max of that difference over seeds.
Step-time ratios are medians of the per-step ratios of all seeds.

Variants (all with f32 master parameters except all-bf16):
  f32          jax.jit of the plain step
  ours-bf16    amp.train_step(loss, adam, "p=f32,c=bf16,o=f32") (the
               target's default storage)
  ours-bf16-storage-f32  the same with storage="f32" (every f32 result of
               f32 arithmetic stored in f32)
  ours-bf16-storage-compute  the same with storage="compute" (on request)
  ours-bf16-transform  amp.transform(plain step, "p=f32,c=bf16,o=f32")
               (on request)
  ours-bf16-level-O1  (on request; any ours-{bf16,f16} name may add
               -storage-{f32,compute}, -level-{O1,O2,O3},
               -gemm-{f8,f8e4m3fn,f8e5m2} and
               -scaling-{current,delayed,rowwise,mxfp8})
  ours-f16     amp.train_step(..., "p=f32,c=f16,o=f32", DynamicLossScale())
               (ours-f16-storage-f32 on request)
  VARIANT+ynn-dots  any variant compiled with XLA:CPU's YNNPACK fusions
               limited to single dots (on request; XLA_SUFFIXES)
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
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import optax

from bench import common

DEFAULT_VARIANTS = ("f32", "ours-bf16", "ours-bf16-storage-f32", "ours-f16",
                    "jmp-bf16", "jmp-f16", "mpx-bf16", "mpx-f16", "all-bf16")
# --smoke: one variant per builder (jmp and MPX are skipped, with a line
# saying so, where bench/requirements.txt is not installed).
SMOKE_VARIANTS = ("f32", "ours-f16", "ours-bf16-transform", "jmp-f16",
                  "mpx-bf16", "all-bf16")
LABELS = {
    "f32": "f32",
    "ours-bf16": "ours bf16 (train_step)",
    "ours-bf16-storage-f32": "ours bf16, storage=f32",
    "ours-bf16-storage-compute": "ours bf16, storage=compute",
    "ours-bf16-transform": "ours bf16 (transform)",
    "ours-f16": "ours f16 + dynamic scale",
    "ours-f16-storage-f32": "ours f16 + dynamic scale, storage=f32",
    "jmp-bf16": "jmp bf16",
    "jmp-f16": "jmp f16 + dynamic scale",
    "mpx-bf16": "MPX bf16",
    "mpx-f16": "MPX f16",
    "all-bf16": "all-bf16",
}
# Issue 9's goals (CPU, donated state): checked under each table.
TARGETS = {
    "lm": {"step_vs_f32": 0.45, "memory_total_vs_f32": 0.65},
    "mlp": {"step_vs_f32": 0.65, "memory_total_vs_f32": 1.0},
}
HELD_OUT_TARGET = 0.005  # mean held-out loss difference to f32, bf16 and f16


class Unavailable(Exception):
  """A variant whose library is missing here; the run goes on without it."""


def _true():
  return jnp.ones((), bool)


def _jit_built(name: str, step, init, params, batch, donate: bool,
               params_of, batch_cast=lambda b: b, notes=None,
               final_notes=None) -> common.Built:
  """A variant that is `jax.jit(step)` over a state made by `init(params)`
  (fresh buffers each time), donating the state unless `donate` is off."""
  fresh = lambda p: init(common.tree_copy(p))
  state = fresh(params)

  def go():
    lowered = jax.jit(step, donate_argnums=(0,) if donate else ()).lower(
        state, batch_cast(batch))
    return lowered.as_text(), common.compile_lowered(lowered)
  (text, compiled), seconds = common.timed_build(go)
  built = common.Built(name, LABELS[name], state, compiled, params_of,
                       compiled, text, seconds, notes or {},
                       batch_cast=batch_cast, init=fresh, donated=donate)
  if final_notes:
    built.final_notes = final_notes
  return built


def build_f32(model: common.Model, batch, bf16: bool = False,
              donate: bool = True) -> common.Built:
  tx = model.optimizer
  cast = ((lambda t: common.tree_cast(t, jnp.bfloat16)) if bf16 else
          (lambda t: t))

  def step(state, batch):
    params, opt_state = state
    loss, grads = jax.value_and_grad(model.loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss, _true()

  def init(params):
    params = cast(params)
    return (params, tx.init(params))

  return _jit_built("all-bf16" if bf16 else "f32", step, init, model.params,
                    batch, donate, lambda s: s[0], batch_cast=cast)


def _amp():
  try:
    import stablehlo_amp as amp
  except ImportError as error:
    raise Unavailable(f"stablehlo_amp is not installed ({error})")
  return amp


def build_ours(model: common.Model, batch, name: str, policy: str,
               dynamic: bool, target: str | None = None,
               storage: str | None = None, level: str | None = None,
               donate: bool = True, scaling: str | None = None,
               rounding: str | None = None,
               moments: str | None = None,
               numerics: str | None = None, dot: str | None = None,
               decisions: str | None = None) -> common.Built:
  amp = _amp()
  options = {"target": target} if target else {}
  if dot:
    options["dot_result"] = dot
  if decisions:
    options["decisions"] = decisions
  if numerics:
    options["numerics"] = numerics
  if storage:
    options["storage"] = storage
  if level:
    options["level"] = level
  if scaling:
    options["fp8_scaling"] = scaling
  if rounding:
    options["update_rounding"] = rounding
  if moments:
    options["opt_state_dtype"] = moments
  options["loss_scale"] = amp.DynamicLossScale() if dynamic else None
  options["donate"] = donate

  step = amp.train_step(lambda p, b: model.loss(p, b), model.optimizer,
                        policy, **options)
  # A donating step's init copies what the step consumes (parameters and
  # loss-scale state), so each seed's state is its own.
  def init(params):
    return step.init(params if donate else common.tree_copy(params))
  if scaling == "delayed":
    # The first step makes the amax histories (and compiles once more); an
    # all-zero history scales like current scaling, so every seed starts
    # from zeros of their shapes and runs one compiled program.
    probe, _ = step(init(common.tree_copy(model.params)), batch)
    template = probe.amax_history
    plain_init = init

    def init(params):  # noqa: F811
      return plain_init(params)._replace(
          amax_history=jax.tree_util.tree_map(jnp.zeros_like, template))
  state = init(model.params)

  def go():
    lowered = step.lower(state, batch)
    return lowered, common.compile_lowered(lowered)
  (lowered, compiled), seconds = common.timed_build(go)
  report = lowered.report()
  timings = lowered.timings

  def run(state, batch):
    state, metrics = compiled(state, batch)
    # Without a loss scale the step checks nothing and skips nothing.
    return state, metrics["loss"], metrics.get("grads_finite", True)

  notes = {"policy": policy, "storage": storage or "default",
           "level": level or "default",
           "lower_s": timings.lower, "rewrite_s": timings.rewrite,
           "converts_inserted": report.converts_inserted if report else None,
           "lowered_ops": dict(report.lowered) if report else None,
           "stored_low": dict(report.stored_low) if report else None,
           "bytes_before": dict(report.bytes_before) if report else None,
           "bytes_after": dict(report.bytes_after) if report else None,
           "kept_f32_reasons": ({k: dict(v) for k, v in
                                 report.kept_f32_reasons.items()}
                                if report else None)}
  built = common.Built(name, LABELS[name], state, run, lambda s: s.params,
                       compiled, lowered.as_text(), seconds, notes,
                       init=init, donated=donate)
  built.final_notes = lambda s: {"loss_scale": float(s.loss_scale.loss_scale)}
  return built


def build_ours_transform(model: common.Model, batch, policy: str,
                         donate: bool = True) -> common.Built:
  amp = _amp()
  tx = model.optimizer

  def plain_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(model.loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  fast = amp.transform(plain_step, policy,
                       donate_argnums=(0, 1) if donate else None)
  init = lambda p: (lambda q: (q, tx.init(q)))(common.tree_copy(p))
  state = init(model.params)

  def go():
    lowered = fast.lower(*state, batch)
    return lowered, common.compile_lowered(lowered)
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
                      lowered.as_text(), seconds, notes, init=init,
                      donated=donate)


def build_jmp(model: common.Model, batch, half,
              donate: bool = True) -> common.Built:
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

  def init(params):
    scale_state = ((jnp.asarray(2.0 ** 15, jnp.float32),
                    jnp.zeros((), jnp.int32)) if scaled else ())
    return (params, tx.init(params), scale_state)

  return _jit_built(name, step, init, model.params, batch, donate,
                    lambda s: s[0],
                    final_notes=((lambda s: {"loss_scale": float(s[2][0])})
                                 if scaled else None))


def build_mpx(model: common.Model, batch, half,
              donate: bool = True) -> common.Built:
  try:
    import mpx
  except ImportError as error:
    raise Unavailable(f"mpx is not installed ({error}); pip install "
                      "--no-deps mixed-precision-for-jax==0.1.8 (needs "
                      "equinox, jaxtyping, wadler_lindig)")
  name = "mpx-f16" if half == jnp.float16 else "mpx-bf16"
  tx = model.optimizer
  # A dtype, not the string: mpx 0.1.8's string branch never stores it.
  # MPX keeps it in a module global, read while tracing: set it again right
  # before each trace (one process builds both MPX variants).
  full = lambda fn, out_dtype=None: mpx.force_full_precision(
      fn, out_dtype if out_dtype is not None else half)

  def loss_fn(params, batch):
    return model.loss(params, batch, full=full)

  def step(state, batch):
    mpx.set_half_precision_datatype(half)
    params, opt_state, scaling = state
    loss, scaling, finite, grads = mpx.filter_value_and_grad(
        loss_fn, scaling)(params, batch)
    params, opt_state = mpx.optimizer_update(params, tx, opt_state, grads,
                                             finite)
    return (params, opt_state, scaling), loss, finite

  def init(params):
    scaling = mpx.DynamicLossScaling(
        loss_scaling=mpx.FLOAT16_MAX,
        min_loss_scaling=jnp.ones((), jnp.float32), period=2000)
    return (params, tx.init(params), scaling)

  mpx.set_half_precision_datatype(half)
  return _jit_built(name, step, init, model.params, batch, donate,
                    lambda s: s[0],
                    final_notes=lambda s: {"loss_scale":
                                           float(s[2].loss_scaling)})


_OURS_KEYS = {"storage": ("f32", "compute"), "level": ("O1", "O2", "O3"),
              "gemm": ("f8", "f8e4m3fn", "f8e5m2"),
              "scaling": ("current", "delayed", "rowwise", "mxfp8"),
              "params": ("bf16",),
              "rounding": ("nearest", "stochastic", "kahan"),
              "moments": ("bf16", "f8"),
              "numerics": ("stats", "provenance"),
              "dot": ("f32", "compute"), "decisions": ("exact", "gate"),
              "target": ("cpu", "gpu")}


def _ours_options(variant: str) -> dict:
  """`ours-{bf16,f16}[-storage-X][-level-X][-gemm-X][-scaling-X]
  [-params-bf16][-rounding-X][-moments-bf16][-numerics-X][-dot-X]
  [-decisions-X][-target-X]`: the options of amp.train_step a variant name
  asks for (`gemm` and `params` go into the policy, `scaling` is `fp8_scaling`,
  `rounding` is `update_rounding`, `moments` is `opt_state_dtype`, `dot`
  is `dot_result`; `-target-gpu` trains the program rewritten for a GPU on
  this machine: the GPU's numerics, not its time)."""
  parts = variant.split("-")[2:]
  options = {}
  while parts:
    key = parts.pop(0)
    if key not in _OURS_KEYS or not parts or parts[0] not in _OURS_KEYS[key]:
      raise SystemExit(
          f"unknown variant {variant!r} (ours-bf16 or ours-f16, then any of " +
          ", ".join(f"-{k}-{'|'.join(v)}" for k, v in _OURS_KEYS.items()) +
          ")")
    options[key] = parts.pop(0)
  if variant not in LABELS:
    LABELS[variant] = ("ours " + variant.split("-")[1] +
                       ("" if variant.startswith("ours-bf16") else
                        " + dynamic scale") +
                       "".join(f", {k}={v}" for k, v in options.items()))
  return options


# `VARIANT+SUFFIX`: the variant compiled with these XLA options.
XLA_SUFFIXES = {
    # XLA:CPU hands only single dots to YNNPACK (no YNN elementwise or
    # reduce fusions): see bench/README.md, "Where the memory goes".
    "ynn-dots": {"xla_cpu_experimental_ynn_fusion_type":
                 "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
}


def build(variant: str, model: common.Model, batch,
          target: str | None = None, donate: bool = True) -> common.Built:
  if "+" in variant:
    base, suffix = variant.split("+", 1)
    if suffix not in XLA_SUFFIXES:
      raise SystemExit(f"unknown XLA suffix {suffix!r} in {variant!r} "
                       f"(known: {', '.join(XLA_SUFFIXES)})")
    saved = dict(common.COMPILER_OPTIONS)
    common.COMPILER_OPTIONS.update(XLA_SUFFIXES[suffix])
    try:
      built = build(base, model, batch, target, donate)
    finally:
      common.COMPILER_OPTIONS.clear()
      common.COMPILER_OPTIONS.update(saved)
    built.name = variant
    built.label = f"{built.label} [XLA: {suffix}]"
    built.notes["xla_options"] = XLA_SUFFIXES[suffix]
    LABELS[variant] = built.label
    return built
  if variant == "f32":
    return build_f32(model, batch, donate=donate)
  if variant == "all-bf16":
    return build_f32(model, batch, bf16=True, donate=donate)
  if variant.startswith(("ours-bf16", "ours-f16")) and \
      variant != "ours-bf16-transform":
    f16 = variant.startswith("ours-f16")
    options = _ours_options(variant)
    policy = "p=f32,c=f16,o=f32" if f16 else "p=f32,c=bf16,o=f32"
    if "gemm" in options:
      policy += ",gemm=" + options.pop("gemm")
    if "params" in options:
      policy = policy.replace("p=f32", "p=" + options.pop("params"), 1)
    target = options.pop("target", target)
    return build_ours(model, batch, variant, policy, f16, target,
                      donate=donate, **options)
  if variant == "ours-bf16-transform":
    return build_ours_transform(model, batch, "p=f32,c=bf16,o=f32",
                                donate=donate)
  if variant == "jmp-bf16":
    return build_jmp(model, batch, jnp.bfloat16, donate=donate)
  if variant == "jmp-f16":
    return build_jmp(model, batch, jnp.float16, donate=donate)
  if variant == "mpx-bf16":
    return build_mpx(model, batch, jnp.bfloat16, donate=donate)
  if variant == "mpx-f16":
    return build_mpx(model, batch, jnp.float16, donate=donate)
  raise SystemExit(f"unknown variant {variant!r} (known: "
                   f"{', '.join(LABELS)})")


def bench_model(make_model, variants, steps: int, warmup: int,
                seeds=(0,), builders=None, deadline: float | None = None,
                donate: bool = True, target: str | None = None,
                eval_every: int = 0) -> dict:
  """Builds every variant once (on seed `seeds[0]`'s model), trains them
  interleaved from each seed's parameters, returns rows + table. With
  `eval_every`, the held-out loss of every variant every that many steps
  too (the curve).

  `make_model(seed)` gives the model of a seed; `builders` maps a variant
  to `builder(model, host_batch, donate)` replacing `build`."""
  builders = builders or {}
  model = make_model(seeds[0])
  host = next(model.train)
  builts, skipped, failed = [], {}, {}
  for variant in variants:
    print(f"  building {variant} ...", end="", flush=True)
    try:
      if variant in builders:
        built = builders[variant](model, host, donate)
      else:
        built = build(variant, model, jax.device_put(host), target, donate)
    except Unavailable as why:
      print(f" skipped: {why}")
      skipped[variant] = str(why)
      continue
    try:  # one untimed step on a copy: compiles lazily, fails early
      jax.block_until_ready(built.run(
          common.tree_copy(built.state),
          jax.device_put(built.batch_cast(host))))
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
  eval_fn = jax.jit(lambda p, b: model.loss(p, b))
  runs = []
  start = time.perf_counter()
  for index, seed in enumerate(seeds):
    seed_model = model if index == 0 else make_model(seed)
    if index > 0:  # the first seed starts from the states built above
      for built in builts:
        if built.init is None:
          raise SystemExit(f"{built.name}: no init, cannot run seed {seed}")
        built.state = built.init(seed_model.params)

    def progress(done: int, seed=seed) -> None:
      if done == steps or (tty and done % 5 == 0) or \
          done % max(steps // 4, 1) == 0:
        print(f"{chr(13) if tty else ''}  seed {seed}: step {done}/{steps}",
              end="\n" if done == steps or not tty else "", flush=True)

    remaining = (None if deadline is None else
                 time.perf_counter() + (deadline - time.perf_counter()) /
                 (len(seeds) - index))
    curve: dict = {b.name: {} for b in builts}

    def evaluate(done: int, states: dict, seed_model=seed_model,
                 curve=curve) -> None:
      if eval_every and (done % eval_every == 0 or done == steps):
        for b in builts:
          curve[b.name][done] = common.held_out_loss(
              seed_model, b.params_of(states[b.name]), eval_fn)

    run = common.run_interleaved(builts, seed_model.train, steps, progress,
                                 remaining, evaluate)
    run["curve"] = curve
    if run["steps"] < steps:
      print(f"\n  seed {seed}: stopped after {run['steps']} steps (time "
            "budget)")
    run["seed"] = seed
    run["held_out"] = {b.name: common.held_out_loss(
        seed_model, b.params_of(b.state), eval_fn) for b in builts}
    run["final_notes"] = {b.name: b.final_notes(b.state) for b in builts
                          if getattr(b, "final_notes", None)}
    runs.append(run)
  train_s = time.perf_counter() - start
  baseline = "f32" if any(b.name == "f32" for b in builts) else builts[0].name
  used_warmup = min(warmup, min(r["steps"] for r in runs) - 1)
  rows = common.summarize(builts, runs, used_warmup, baseline)
  for row in rows:
    finals = {r["seed"]: r["final_notes"][row["variant"]] for r in runs
              if row["variant"] in r["final_notes"]}
    if finals:
      row["notes"]["final_by_seed"] = finals
  table = common.markdown_table(rows)
  curve = _curve(runs, [b.name for b in builts], baseline) if eval_every else {}
  if curve:
    table += "\n\n" + curve.pop("table")
  for variant, why in skipped.items():
    table += f"\n| {LABELS.get(variant, variant)} | not run: {why} |"
  for variant, failure in failed.items():
    d = failure["dots"]
    table += (f"\n| {LABELS.get(variant, variant)} | FAILED at run time: "
              f"{failure['error']} (optimized HLO: {d['low']}/{d['total']} "
              f"low-precision dots, {d['low_outside_fusion']} outside a "
              f"backend fusion) |")
  return {"model": model.name, "description": model.description,
          "seeds": list(seeds), "steps": [r["steps"] for r in runs],
          "warmup": used_warmup, "train_seconds": train_s,
          "donated": donate, "baseline": baseline, "rows": rows,
          "skipped_variants": skipped, "failed_variants": failed,
          "curve": curve, "table": table}


def _curve(runs: list, names: list, baseline: str) -> dict:
  """Held-out loss by step: per variant and step, the mean and sample sd
  over seeds of the loss, and of its difference from `baseline`'s on the
  same seed; and a markdown table of them."""
  steps = sorted(set.intersection(*(set(r["curve"][names[0]]) for r in runs)))
  out: dict = {"steps": steps, "loss": {}, "delta": {}}
  for name in names:
    out["loss"][name] = [common.spread([r["curve"][name][s] for r in runs])
                         for s in steps]
    out["delta"][name] = [common.spread([r["curve"][name][s] -
                                         r["curve"][baseline][s]
                                         for r in runs]) for s in steps]

  def cell(d: dict) -> str:
    return (f"{d['mean']:+.4f}" if d["sd"] is None else
            f"{d['mean']:+.4f} ± {d['sd']:.4f}")
  header = ([f"{LABELS.get(baseline, baseline)} held-out"] +
            [f"{LABELS.get(n, n)} Δ" for n in names if n != baseline])
  lines = ["| step | " + " | ".join(header) + " |",
           "|---" * (len(header) + 1) + "|"]
  for i, s in enumerate(steps):
    base = out["loss"][baseline][i]
    first = (f"{base['mean']:.4f}" if base["sd"] is None else
             f"{base['mean']:.4f} ± {base['sd']:.4f}")
    lines.append(f"| {s} | {first} | " + " | ".join(
        cell(out["delta"][n][i]) for n in names if n != baseline) + " |")
  out["table"] = ("Held-out loss by step (Δ: difference from "
                  f"{LABELS.get(baseline, baseline)} on the same seed, mean ± "
                  "sd over seeds):\n\n" + "\n".join(lines))
  return out


def check_targets(name: str, result: dict) -> dict:
  """Issue 9's goals against this run's rows (ours-* variants)."""
  goals = TARGETS.get(name, {})
  out = {}
  for row in result.get("rows", []):
    variant = row["variant"]
    if not variant.startswith("ours-") or variant.endswith("-transform"):
      continue
    checks = {}
    if variant.startswith("ours-bf16"):
      for key, limit in goals.items():
        value = row.get(key)
        checks[key] = {"value": value, "limit": limit,
                       "met": value is not None and value <= limit}
    delta = row.get("held_out_delta")
    if delta:
      checks["held_out_delta_mean"] = {
          "value": delta["mean"], "limit": HELD_OUT_TARGET,
          "met": delta["mean"] <= HELD_OUT_TARGET}
    out[variant] = checks
  return out


def format_targets(checks: dict) -> str:
  names = {"step_vs_f32": ("step", "×"),
           "memory_total_vs_f32": ("memory total", "×"),
           "held_out_delta_mean": ("mean Δ held-out", "")}
  lines = []
  for variant, items in checks.items():
    parts = []
    for key, c in items.items():
      label, unit = names[key]
      value = ("–" if c["value"] is None else
               f"{c['value']:+.4f}" if key == "held_out_delta_mean" else
               f"{c['value']:.2f}{unit}")
      parts.append(f"{label} {value} (goal <= {c['limit']}{unit}: "
                   f"{'met' if c['met'] else 'NOT met'})")
    lines.append(f"  {LABELS.get(variant, variant)}: " + "; ".join(parts))
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help="10 steps, 2 warm-up steps, 1 seed")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny models, 2 steps, 1 warm-up step, 1 seed: "
                      "checks the script works (not a measurement)")
  parser.add_argument("--steps", type=int, help="training steps per seed "
                      "(default 100)")
  parser.add_argument("--warmup", type=int,
                      help="steps per seed left out of the timing (default 5)")
  parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2; "
                      "--quick: 0)")
  parser.add_argument("--no-donate", action="store_true",
                      help="keep the state (every variant): the step "
                      "allocates new buffers for it")
  parser.add_argument("--models", default="lm,mlp")
  parser.add_argument("--variants", help="default "
                      f"{','.join(DEFAULT_VARIANTS)}; --smoke "
                      f"{','.join(SMOKE_VARIANTS)}")
  parser.add_argument("--eval-every", type=int, default=0,
                      help="held-out loss every N steps too: the curve "
                      "(mean ± sd over seeds)")
  parser.add_argument("--size", default="default", choices=("default",
                                                             "small"),
                      help="small: the LM at d_model 128, 2 layers, seq 64 "
                      "(numerics over many steps and seeds on a busy CPU)")
  parser.add_argument("--lr", type=float,
                      help="Adam's learning rate for every model (default: "
                      "each model's own)")
  parser.add_argument("--json", help="output path (default "
                      "bench/results/peers[-quick|-smoke].json)")
  args = parser.parse_args(argv)
  short = args.quick or args.smoke
  steps = args.steps or (2 if args.smoke else 10 if args.quick else 100)
  warmup = args.warmup if args.warmup is not None else (
      1 if args.smoke else 2 if args.quick else 5)
  seeds = [int(x) for x in (args.seeds or ("0" if short else "0,1,2"))
           .split(",") if x]
  donate = not args.no_donate
  variants = [v for v in (args.variants or ",".join(
      SMOKE_VARIANTS if args.smoke else DEFAULT_VARIANTS)).split(",") if v]
  env = common.environment()
  print(f"peers: backend {env['backend']} ({env['device_kind']}), jax "
        f"{env['jax']}, {env['cpu_count']} CPUs, load {env['loadavg']}; "
        f"{steps} steps x seeds {seeds}, interleaved, state "
        f"{'donated' if donate else 'kept'}")
  results = {"benchmark": "peers", "environment": env, "steps": steps,
             "seeds": seeds, "donated": donate, "variants": variants,
             "models": {}}
  configs = (common.smoke_configs() if args.smoke else
             {"lm": common.LMConfig(d_model=128, heads=4, layers=2, seq=64)
              if args.size == "small" else common.LMConfig(),
              "mlp": common.MLPConfig()})
  if args.lr is not None:
    configs = {name: dataclasses.replace(config,
                                                learning_rate=args.lr)
               for name, config in configs.items()}
  makers = {"lm": lambda seed: common.make_lm(configs["lm"], seed=seed),
            "mlp": lambda seed: common.make_mlp(configs["mlp"], seed=seed)}
  for name in args.models.split(","):
    print(f"\n## {makers[name](seeds[0]).description}")
    result = bench_model(makers[name], variants, steps, warmup, seeds,
                         donate=donate, eval_every=args.eval_every)
    result["targets"] = check_targets(name, result)
    results["models"][name] = result
    print()
    print(result["table"])
    if result["targets"]:
      print("\nissue 9 goals:\n" + format_targets(result["targets"]))
  results["environment_end"] = {"loadavg": common.environment()["loadavg"]}
  path = common.write_json(
      common.pathlib.Path(args.json) if args.json else
      common.RESULTS / ("peers-smoke.json" if args.smoke else
                        "peers-quick.json" if args.quick else "peers.json"),
      results)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
