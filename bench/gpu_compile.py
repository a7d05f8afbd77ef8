"""Does XLA keep what the passes decide? Training steps compiled for an H100
without a GPU (JAX's deviceless ahead-of-time compilation), read back.

    make gpu-compile                           # the CUDA venv, then this
    python -m bench.gpu_compile                # H100 target: needs jax[cuda12]
    python -m bench.gpu_compile --target cpu --size smoke   # XLA:CPU, seconds
    python -m bench.gpu_compile --smoke        # the same, the arguments given
                                               # as on the H100 (see below)

Compiles the LM (4 layers, d_model 1024, 8 heads, seq 512, batch 16, Adam),
the MLP (784-4096-4096-10, batch 2048, Adam), a ViT (d_model 768, 6
blocks, 197 tokens, batch 64) and an MoE LM (top-2 of 8 experts) training
steps, state donated, for each variant, and estimates each step's time on
the GPU's roofline (docs/results.md, "Estimated step time"). Sharded over several devices (--devices N
--mesh fsdp | fsdp=4,tp=2 --topology 1x1x8 | 1x2x4; the shardings are
bench/common.py's, NamedShardings on the inputs), it also prints the bytes
each device moves, by collective and dtype:

    python -m bench.gpu_compile --models lm --devices 8 --batch 32
    python -m bench.gpu_compile --models lm --devices 8 --batch 32 --mesh fsdp=4,tp=2
    python -m bench.gpu_compile --models lm --devices 8 --batch 32 --topology 1x2x4
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m bench.gpu_compile --target cpu --size smoke --devices 8

The variants:

  f32                 jax.jit of the plain step
  ours-bf16           amp.train_step(..., "p=f32,c=bf16,o=f32")
  ours-f16            amp.train_step(..., "p=f32,c=f16,o=f32"), dynamic scale
  ours-bf16-gemm-f8   amp.train_step(..., "p=f32,c=bf16,o=f32,gemm=f8")
  ours-bf16-gemm-f8-rowwise  the same with fp8_scaling="rowwise"
  ours-bf16-gemm-f8-mxfp8    the same with fp8_scaling="mxfp8" (--gpu b200:
                      block-scaled GEMMs; on the H100, emulated)
  ours-bf16-gemm-f8-all      gemm=f8 with fp8_min_size=0 (no shape filter)
  ours-bf16-numerics-stats   ours-bf16 with numerics="stats" (per-GEMM range
                      statistics inside the step); ours-bf16-gemm-f8-...
                      the same with gemm=f8: what measuring costs
  ours-bf16-numerics-provenance  ours-bf16 with numerics="provenance" (which
                      region first handed on a NaN or an infinity); and
                      ours-f16-numerics-provenance
  ours-bf16-storage-f32   ours-bf16 with storage="f32"
  ours-bf16-no-remat  ours-bf16 with rematerialize=False
  ours-bf16-remat-memory  ours-bf16 with rematerialize_for="memory" (every
                      cheap recomputation, whatever it costs in kernels)
  ours-bf16-moments-bf16  ours-bf16 with opt_state_dtype="bf16"
  ours-bf16-params-bf16-stochastic  "p=bf16,c=bf16,o=f32" with
                      update_rounding="stochastic" (bf16 master weights)
  ours-bf16-params-bf16-stochastic-moments-bf16  the same with bf16 moments
  ours-bf16-params-bf16-kahan-moments-bf16  update_rounding="kahan" (a bf16
                      compensation buffer per parameter), bf16 moments
  ours-bf16-params-bf16-stochastic-moments-f8  stochastic, block-scaled FP8
                      moments (opt_state_dtype="f8")
  ours-bf16-reduce-bf16   ours-bf16 with reduce_dtype="bf16": the backward
                      GEMMs write bf16, so XLA reduces their partial sums
                      (the gradient reduce-scatter) in bf16
  ours-bf16-reduce-bf16-dot-bf16  the same with dot_result="compute": every
                      GEMM writes bf16, forward ones too
  ours-bf16-gemm-f8-reduce-bf16   gemm=f8 with reduce_dtype="bf16"
  ours-bf16-gemm-f8-reduce-bf16-dot-bf16  the same with dot_result="compute"
  ours-bf16-gemm-f8-reduce-bf16-dot-bf16-no-remat  the same with
                      rematerialize=False: the fewest interconnect bytes
  jmp-style           parameters cast to bf16 inside the loss by hand,
                      f32 master parameters and Adam state (jmp's recipe)
  all-bf16            parameters, Adam state and compute in bf16

and prints, per variant, XLA's `memory_analysis()` (total = arguments +
outputs + temporaries - aliased) against f32's, the kernels the program
launches (a proxy for step time where no device times it), and for ours what the
compiled program kept: stored values decided against low-precision buffers
present, FP8 dots decided against FP8 GEMMs present (survival.py reads the
optimized HLO). GEMM autotuning does not run without a device, so real-GPU
temporaries may differ by a few MiB per GEMM. Exit status 1 when a decision
was lost, so `make test` (which runs the XLA:CPU build at smoke size) fails.

The deviceless recipe: JAX_PLATFORMS=cpu before JAX is imported (the CUDA
plugin fails in cuInit otherwise), a topology for the H100 target config
below, a mesh on it, and ShapeDtypeStructs with a NamedSharding on that mesh
given to `.lower(...)`. The target config is the device description of an
H100 SXM (80 GB HBM3, CUDA 12.8, cuDNN 9.7).

--smoke (`make bench-smoke`, where there is no CUDA jaxlib) is `--target cpu
--size smoke` for one variant of each kind (SMOKE_VARIANTS), with the
arguments of every step given as on the H100: ShapeDtypeStructs with a
NamedSharding, on a one-device mesh of this machine's CPU. It runs the whole
script (models, amp.train_step, lowering from sharded ShapeDtypeStructs,
XLA compile, memory, kernels, what XLA kept of the decisions, the table,
the JSON; exit status 1 on a lost decision) except what needs CUDA: the
deviceless H100 topology, the rewrite for target gpu, XLA:GPU (cuBLASLt FP8
GEMMs: on CPU the FP8 dots are emulated) and the memory goals checked at
GPU size. Writes bench/results/gpu-compile-smoke.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

# The H100's device description, for XLA:GPU's cost models.
H100_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
runtime_version { major: 12 minor: 8 }
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
# A B200 (compute capability 10.0, 148 SMs, 8 TB/s HBM3e, cuDNN 9.10): the
# H100's description with what differs, for MXFP8's block-scaled GEMMs.
B200_TARGET_CONFIG = (
    H100_TARGET_CONFIG
    .replace("cuda_compute_capability { major: 9 }",
             "cuda_compute_capability { major: 10 }")
    .replace("core_count: 132", "core_count: 148")
    .replace("memory_bandwidth: 3352320000000",
             "memory_bandwidth: 8000000000000")
    .replace("device_memory_size: 84929347584",
             "device_memory_size: 193273528320")
    .replace("dnn_version_info { major: 9 minor: 7 }",
             "dnn_version_info { major: 9 minor: 10 }")
    .replace("NVIDIA H100 80GB HBM3", "NVIDIA B200"))
GPUS = {"h100": ("H100", H100_TARGET_CONFIG),
        "b200": ("B200", B200_TARGET_CONFIG)}

VARIANTS = ("f32", "ours-bf16", "ours-f16", "ours-bf16-gemm-f8",
            "ours-bf16-gemm-f8-rowwise", "ours-bf16-gemm-f8-mxfp8",
            "ours-bf16-gemm-f8-all", "ours-bf16-numerics-stats",
            "ours-bf16-gemm-f8-numerics-stats",
            "ours-bf16-numerics-provenance", "ours-f16-numerics-provenance",
            "ours-bf16-storage-f32", "ours-bf16-no-remat",
            "ours-bf16-remat-memory",
            "ours-bf16-moments-bf16", "ours-bf16-params-bf16-stochastic",
            "ours-bf16-params-bf16-stochastic-moments-bf16",
            "ours-bf16-params-bf16-kahan-moments-bf16",
            "ours-bf16-params-bf16-stochastic-moments-f8",
            "ours-bf16-reduce-bf16", "ours-bf16-reduce-bf16-dot-bf16",
            "ours-bf16-gemm-f8-reduce-bf16",
            "ours-bf16-gemm-f8-reduce-bf16-dot-bf16",
            "ours-bf16-gemm-f8-reduce-bf16-dot-bf16-no-remat", "jmp-style",
            "all-bf16")
# --smoke: f32 (the baseline), ours with both kinds of decisions XLA must
# keep (stored values, FP8 GEMMs), and a hand-cast step; `make
# test-survival` compiles every variant (unsharded).
SMOKE_VARIANTS = ("f32", "ours-bf16-gemm-f8", "jmp-style")
OURS = {
    "ours-bf16": ("p=f32,c=bf16,o=f32", {}),
    "ours-f16": ("p=f32,c=f16,o=f32", {}),
    "ours-bf16-gemm-f8": ("p=f32,c=bf16,o=f32,gemm=f8", {}),
    # Finer FP8 scaling: per row, and MXFP8 (blocks of 32, E8M0 scales).
    "ours-bf16-gemm-f8-rowwise": ("p=f32,c=bf16,o=f32,gemm=f8",
                                  {"fp8_scaling": "rowwise"}),
    "ours-bf16-gemm-f8-mxfp8": ("p=f32,c=bf16,o=f32,gemm=f8",
                                {"fp8_scaling": "mxfp8"}),
    # Every eligible GEMM in FP8: the shape filter off.
    "ours-bf16-gemm-f8-all": ("p=f32,c=bf16,o=f32,gemm=f8",
                              {"fp8_min_size": 0}),
    # Per-GEMM range statistics measured inside the step.
    "ours-bf16-numerics-stats": ("p=f32,c=bf16,o=f32", {"numerics": "stats"}),
    "ours-bf16-gemm-f8-numerics-stats": ("p=f32,c=bf16,o=f32,gemm=f8",
                                         {"numerics": "stats"}),
    # Where a non-finite value first appeared, watched inside the step.
    "ours-bf16-numerics-provenance": ("p=f32,c=bf16,o=f32",
                                      {"numerics": "provenance"}),
    "ours-f16-numerics-provenance": ("p=f32,c=f16,o=f32",
                                     {"numerics": "provenance"}),
    # The gradient check a step without a loss scale leaves out by default.
    "ours-bf16-check-grads": ("p=f32,c=bf16,o=f32", {"check_grads": True}),
    "ours-bf16-storage-f32": ("p=f32,c=bf16,o=f32", {"storage": "f32"}),
    "ours-bf16-no-remat": ("p=f32,c=bf16,o=f32", {"rematerialize": False}),
    "ours-bf16-remat-memory": ("p=f32,c=bf16,o=f32",
                               {"rematerialize_for": "memory"}),
    # Low-precision training state: bf16 Adam moments, bf16 parameters
    # rounded stochastically or with Kahan compensation.
    "ours-bf16-moments-bf16": ("p=f32,c=bf16,o=f32",
                               {"opt_state_dtype": "bf16"}),
    "ours-bf16-params-bf16-stochastic": (
        "p=bf16,c=bf16,o=f32", {"update_rounding": "stochastic"}),
    "ours-bf16-params-bf16-stochastic-moments-bf16": (
        "p=bf16,c=bf16,o=f32", {"update_rounding": "stochastic",
                                "opt_state_dtype": "bf16"}),
    "ours-bf16-params-bf16-kahan-moments-bf16": (
        "p=bf16,c=bf16,o=f32", {"update_rounding": "kahan",
                                "opt_state_dtype": "bf16"}),
    "ours-bf16-params-bf16-stochastic-moments-f8": (
        "p=bf16,c=bf16,o=f32", {"update_rounding": "stochastic",
                                "opt_state_dtype": "f8"}),
    # The precision of what XLA reduces across devices: the backward
    # pass's GEMMs written in bf16 (reduce_dtype), and every GEMM too
    # (dot_result).
    "ours-bf16-reduce-bf16": ("p=f32,c=bf16,o=f32", {"reduce_dtype": "bf16"}),
    "ours-bf16-reduce-bf16-dot-bf16": (
        "p=f32,c=bf16,o=f32", {"reduce_dtype": "bf16",
                               "dot_result": "compute"}),
    "ours-bf16-gemm-f8-reduce-bf16": ("p=f32,c=bf16,o=f32,gemm=f8",
                                      {"reduce_dtype": "bf16"}),
    # Every option that lowers interconnect bytes at once.
    "ours-bf16-gemm-f8-reduce-bf16-dot-bf16": (
        "p=f32,c=bf16,o=f32,gemm=f8", {"reduce_dtype": "bf16",
                                       "dot_result": "compute"}),
    "ours-bf16-gemm-f8-reduce-bf16-dot-bf16-no-remat": (
        "p=f32,c=bf16,o=f32,gemm=f8", {"reduce_dtype": "bf16",
                                       "dot_result": "compute",
                                       "rematerialize": False}),
}
_CPU_F16 = ("XLA:CPU expands optimization barriers before fusion and, having "
            "no f16 kernels, fuses the f16 rounding into the f32 readers: no "
            "f16 buffer (memory still drops: 0.88x f32 on the peers LM, "
            "against 1.03x with storage=f32)")
# Decisions a backend is known not to keep, with the reason; any other loss
# fails the run.
_CPU_DOT_BF16 = ("dot_result='compute' on XLA:CPU, which has no GEMM that "
                 "writes bf16: it runs the dots upcast and fuses the stored "
                 "values' rounding into their f32 readers")
KNOWN_LOSSES = {
    ("cpu", "ours-bf16-reduce-bf16-dot-bf16"): _CPU_DOT_BF16,
    ("cpu", "ours-bf16-gemm-f8-reduce-bf16-dot-bf16"): _CPU_DOT_BF16,
    ("cpu", "ours-bf16-gemm-f8-reduce-bf16-dot-bf16-no-remat"): _CPU_DOT_BF16,
    ("cpu", "ours-f16"): _CPU_F16,
    ("cpu", "ours-f16-numerics-provenance"): _CPU_F16,
}
# The issues' memory goals for the LM at GPU size (deviceless H100, default
# flags), on one device and sharded over 8.
TARGETS = {"ours-bf16": 0.55, "ours-bf16-gemm-f8": 0.55,
           "ours-bf16-params-bf16-stochastic-moments-bf16": 0.50}
SHARDED_TARGETS = {"ours-bf16": 0.45}


def ptx_mma(directory: pathlib.Path) -> dict[str, int]:
  """Tensor-core MMA instructions in the PTX XLA dumped, by kind: Hopper's
  wgmma by its operand types, Blackwell's tcgen05.mma by its kind
  (`kind::mxf8f6f4.block_scale` is a block-scaled MXFP8 MMA), and the
  FP8-to-f16 conversions a kernel that upcasts FP8 codes runs."""
  import re
  pattern = re.compile(r"\b(wgmma\.mma_async\S*|tcgen05\.mma\S*|mma\.sync\S*|"
                       r"cvt\.rn\.f16x2\.e[45]m[23]x2)")
  counts: dict[str, int] = {}
  for path in sorted(directory.glob("*.ptx")):
    for match in pattern.finditer(path.read_text(errors="replace")):
      kind = re.sub(r"\.m\d+n\d+k\d+", "", match.group(1))
      counts[kind] = counts.get(kind, 0) + 1
  return counts


def _parse(argv):
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--target", choices=("gpu", "cpu"),
                      help="gpu (default): deviceless H100 compile; cpu: "
                      "XLA:CPU here")
  parser.add_argument("--size", default=None, choices=("gpu", "small", "smoke"),
                      help="model sizes (default: gpu for --target gpu, "
                      "small for cpu)")
  parser.add_argument("--models", default="lm,mlp,vit,moe",
                      help="any of lm, mlp, vit, moe (default: all)")
  parser.add_argument("--variants", help="default: all of "
                      f"{','.join(VARIANTS)}; --smoke {','.join(SMOKE_VARIANTS)}")
  parser.add_argument("--smoke", action="store_true",
                      help="--target cpu --size smoke, arguments with a "
                      "NamedSharding as for the H100: checks the script "
                      "without CUDA")
  parser.add_argument("--devices", type=int, default=1,
                      help="devices the step is sharded over (default 1): "
                      "on --target gpu a deviceless topology of that many "
                      "H100s, on cpu this machine's CPU devices (set "
                      "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  parser.add_argument("--mesh", default=None,
                      help="mesh axes, e.g. 'fsdp' (every device on one "
                      "axis: FSDP) or 'fsdp=4,tp=2' (FSDP x tensor "
                      "parallel); default fsdp when --devices > 1")
  parser.add_argument("--gpu", default="h100", choices=sorted(GPUS),
                      help="the deviceless GPU (default h100; b200: "
                      "compute capability 10.0, MXFP8's block-scaled GEMMs)")
  parser.add_argument("--ptx", default=None, metavar="DIR",
                      help="dump XLA's PTX into DIR and count its tensor-core "
                      "MMA instructions by kind (one variant per run: block-"
                      "scaled MXFP8 on the B200, or upcast to bf16 on the "
                      "H100)")
  parser.add_argument("--topology", default=None,
                      help="the deviceless GPU topology, partitions x hosts "
                      "x devices per host (default 1x1xDEVICES; 1x2x4 is two "
                      "hosts of 4)")
  parser.add_argument("--batch", type=int, default=None,
                      help="the batch (default: the size's)")
  parser.add_argument("--save-hlo", default=None, metavar="DIR",
                      help="write each variant's optimized HLO text to "
                      "DIR/MODEL-VARIANT.hlo (what the estimate reads)")
  parser.add_argument("--json", default=None,
                      help="write the results here (default: "
                      "bench/results/gpu-compile[-TARGET-SIZE].json)")
  args = parser.parse_args(argv)
  if args.smoke and args.target == "gpu":
    parser.error("--smoke compiles for the CPU (no --target gpu)")
  args.target = args.target or ("cpu" if args.smoke else "gpu")
  args.size = args.size or ("smoke" if args.smoke else None)
  args.variants = args.variants or ",".join(SMOKE_VARIANTS if args.smoke else
                                            VARIANTS)
  if args.devices < 1:
    parser.error(f"--devices must be at least 1, got {args.devices}")
  args.mesh = args.mesh or ("fsdp" if args.devices > 1 else None)
  from bench import common
  if args.mesh:
    try:
      args.axes = common.mesh_axes(args.mesh, args.devices)
    except ValueError as error:
      parser.error(str(error))
  else:
    args.axes = {}
  if args.gpu != "h100" and args.target != "gpu":
    parser.error("--gpu is the deviceless GPU (--target gpu)")
  if args.topology and args.target != "gpu":
    parser.error("--topology is the deviceless GPU topology (--target gpu)")
  return args


def main(argv=None) -> int:
  # The CUDA plugin must not look for a device: before JAX is imported.
  os.environ["JAX_PLATFORMS"] = "cpu"
  args = _parse(argv)
  if args.ptx:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_dump_to={args.ptx}").strip()
  size = args.size or ("gpu" if args.target == "gpu" else "small")
  import jax
  import jax.numpy as jnp
  import optax

  import stablehlo_amp as amp
  from bench import common
  from bench import gpu

  configs = {**gpu.configs(size), **common.compiled_step_configs(size)}
  try:
    roofline = common.amp_internals().roofline(args.gpu)
  except ValueError as error:
    print(error, file=sys.stderr)
    return 2
  devices = args.devices
  mesh_shape = tuple(args.axes.values()) or (1,)
  mesh_names = tuple(args.axes) or ("devices",)
  if args.target == "gpu":
    from jax.experimental import topologies
    topology_text = args.topology or f"1x1x{devices}"
    try:
      common.check_topology(topology_text, devices)
    except ValueError as error:
      print(error, file=sys.stderr)
      return 2
    try:
      topology = topologies.get_topology_desc(
          platform="cuda", target_config=GPUS[args.gpu][1],
          topology=topology_text)
    except Exception as error:  # noqa: BLE001 - any failure: say how to fix
      print(f"no CUDA compiler here ({type(error).__name__}: {error}); "
            "install jax[cuda12] for this JAX (make gpu-compile does), or "
            "run with --target cpu", file=sys.stderr)
      return 2
    mesh = topologies.make_mesh(topology, mesh_shape, mesh_names)
  elif args.smoke or devices > 1:  # the same kind of argument, on this CPU
    if jax.device_count() < devices:
      print(f"--devices {devices} needs {devices} CPU devices, this process "
            f"has {jax.device_count()}: set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={devices}",
            file=sys.stderr)
      return 2
    import numpy as np
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:devices]).reshape(mesh_shape), mesh_names)
  else:
    mesh = None

  def abstract(tree, shardings=None):
    """ShapeDtypeStructs of `tree`, each with its sharding (replicated on
    the mesh where none is given)."""
    if mesh is None:
      return jax.tree_util.tree_map(
          lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
          tree)
    if shardings is None:
      replicated = jax.sharding.NamedSharding(mesh,
                                              jax.sharding.PartitionSpec())
      shardings = jax.tree_util.tree_map(lambda _: replicated, tree)
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x),
                                          sharding=s), tree, shardings)

  def placed(params, state, batch):
    """(state, batch) as abstract arguments with the mesh's shardings."""
    if mesh is None or not args.axes:
      return abstract(state), abstract(batch)
    params_sharded = common.param_shardings(params, mesh, args.axes)
    return (abstract(state, common.state_shardings(
        state, params, params_sharded, mesh)),
            abstract(batch, common.batch_sharding(batch, mesh, args.axes)))

  def compile_plain(loss, params, batch, tx, cast_params, cast_inside):
    step = common.plain_step(loss, tx, cast_inside)
    p0 = jax.eval_shape(lambda p: common.tree_cast(p, jnp.bfloat16),
                        params) if cast_params else params
    if cast_params:
      batch = jax.eval_shape(lambda b: common.tree_cast(b, jnp.bfloat16),
                             batch)
    state = (p0, jax.eval_shape(tx.init, p0))
    lowered = jax.jit(step, donate_argnums=0).lower(*placed(p0, state,
                                                            batch))
    return lowered.compile(**compile_options), None

  def compile_ours(variant, loss, params, batch, tx):
    policy, options = OURS[variant]
    loss_scale = amp.DynamicLossScale() if "c=f16" in policy else None
    step = amp.train_step(lambda p, b: loss(p, b), tx, policy,
                          loss_scale=loss_scale, donate=True,
                          target=args.target, **options)
    state = jax.eval_shape(step.init, params)
    lowered = step.lower(*placed(params, state, batch))
    compiled = lowered.compile(**compile_options)
    return compiled, lowered.report()

  results = {"target": args.target, "size": size,
             "jax": jax.__version__, "models": {}}
  lost_any = False
  for name in args.models.split(","):
    if name not in configs:
      print(f"unknown model {name!r} (known: {', '.join(configs)})",
            file=sys.stderr)
      return 2
    config = configs[name]
    if args.batch:
      config = dataclasses.replace(config, batch=args.batch)
    init, loss, batch = common.model_step_parts(name, config)
    # XLA:GPU's Triton GEMM tiling finds no tile for the ViT's 197-token
    # rows without autotuning ("Couldn't find output tile sizes"): its
    # GEMMs go to cuBLAS when compiled without a device.
    compile_options = ({"compiler_options": {
        "xla_gpu_enable_triton_gemm": False}}
                       if name == "vit" and args.target == "gpu" else {})
    params = jax.eval_shape(lambda: init(jax.random.key(0)))
    batch_size = config.batch
    tx = optax.adam(1e-3)
    rows = []
    where = (f"deviceless {devices}x {GPUS[args.gpu][0]}" +
             (f", topology {topology_text}"
                                               if devices > 1 else "")
             if args.target == "gpu" else
             f"{devices} CPU device{'s' if devices > 1 else ''}")
    mesh_text = (", mesh " + " x ".join(f"{k}={v}" for k, v in
                                         args.axes.items())
                 if args.axes else "")
    print(f"\n### {name}: {args.target} ({where}{mesh_text}), size {size}, "
          f"batch {batch_size}, jax {jax.__version__}")
    for variant in args.variants.split(","):
      start = time.perf_counter()
      if variant in OURS:
        compiled, report = compile_ours(variant, loss, params, batch, tx)
      elif variant in ("f32", "jmp-style", "all-bf16"):
        compiled, report = compile_plain(
            loss, params, batch, tx, cast_params=variant == "all-bf16",
            cast_inside=variant == "jmp-style")
      else:
        raise SystemExit(f"unknown variant {variant!r} (known: "
                         f"{', '.join(VARIANTS)})")
      seconds = time.perf_counter() - start
      text = compiled.as_text()
      if args.save_hlo:
        hlo_dir = pathlib.Path(args.save_hlo)
        hlo_dir.mkdir(parents=True, exist_ok=True)
        (hlo_dir / f"{name}-{variant}.hlo").write_text(text)
      module = common.hlo_reader().Module.parse(text)
      estimate = common.hlo_reader().estimate(module, roofline)
      row = {"variant": variant, "compile_s": seconds,
             "memory": common.memory(compiled),
             "kernels": estimate.kernels,
             "kernel_kinds": module.kernel_kinds(),
             "estimate": {"device": estimate.device,
                          "step_ms": estimate.seconds * 1e3,
                          "compute_ms": estimate.compute_seconds * 1e3,
                          "collective_ms": estimate.collective_seconds * 1e3,
                          "hbm_bytes": estimate.hbm_bytes,
                          "collective_bytes": estimate.collective_bytes,
                          "flops": dict(estimate.flops)}}
      if devices > 1:
        row["collectives"] = common.collectives(text)
      if report is not None and report.xla is not None:
        stored = report.xla.stored
        fp8 = report.xla.fp8
        row["stored_decided"] = len(stored)
        row["stored_kept"] = sum(v == "kept" for v in stored.values())
        row["fp8_decided"] = len(fp8)
        row["fp8_gemms"] = sum(v == "FP8 GEMM" for v in fp8.values())
        row["fp8_emulated"] = sum(v == "emulated" for v in fp8.values())
        row["lost"] = report.lost_in_xla()
        known = KNOWN_LOSSES.get((args.target, variant))
        if known and row["lost"]:
          row["known_loss"] = known
        else:
          lost_any |= bool(row["lost"])
      rows.append(row)
    base = next((r["memory"] for r in rows if r["variant"] == "f32"), None)
    hand = next((r["estimate"] for r in rows if r["variant"] == "jmp-style"),
                None)
    print(f"Estimated step: each kernel of the optimized HLO priced on the "
          f"{roofline.device} roofline"
          + (" (an XLA:CPU program: this checks the code, it is no GPU time)"
             if args.target != "gpu" else "") + "; see docs/results.md.\n")
    print("| variant | est. step ms | vs jmp-style | kernels | HBM GiB | "
          "memory total MiB | vs f32 | temp MiB | vs f32 | "
          "stored values kept / decided | FP8 GEMMs / decided | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
      m = row["memory"]
      ratio = (lambda k: f"{m[k] / base[k]:.3f}x" if base else "–")
      kept = (f"{row['stored_kept']} / {row['stored_decided']}"
              if "stored_decided" in row else "–")
      fp8 = (f"{row['fp8_gemms']} / {row['fp8_decided']}"
             + (f" ({row['fp8_emulated']} emulated)"
                if row["fp8_emulated"] else "")
             if row.get("fp8_decided") else "–")
      est = row["estimate"]
      versus = (f"{est['step_ms'] / hand['step_ms']:.2f}x" if hand else "–")
      print(f"| {row['variant']} | {est['step_ms']:.2f} | {versus} | "
            f"{row['kernels']} | {est['hbm_bytes'] / 2**30:.2f} | "
            f"{m['total'] / 2**20:.1f} | "
            f"{ratio('total')} | {m['temp'] / 2**20:.1f} | {ratio('temp')} | "
            f"{kept} | {fp8} | {row['compile_s']:.1f} |")
      kinds = row["kernel_kinds"]
      print(f"  kernels: {kinds['gemm']} GEMM, {kinds['fp8_quantize']} FP8 "
            f"quantization, {kinds['other']} other")
      if "known_loss" in row:
        print(f"  known: {len(row['lost'])} not kept: {row['known_loss']}")
      else:
        for line in row.get("lost", []):
          print(f"  lost by XLA: {line}")
      if base:
        row["total_vs_f32"] = m["total"] / base["total"]
        row["temp_vs_f32"] = m["temp"] / base["temp"]
    if devices > 1:
      print("\nCollectives per device (MiB; all-gather by its result, the "
            "others by their operands; the gradient reduction is the "
            "reductions of values the backward pass computes):\n")
      print("| variant | total | other than the gradient reduction | "
            "est. compute ms | est. collectives ms | by kind and dtype |")
      print("|---|---|---|---|---|---|")
      for row in rows:
        c, est = row["collectives"], row["estimate"]
        print(f"| {row['variant']} | {common.mib(c['total'])} | "
              f"{common.mib(c['other'])} | {est['compute_ms']:.2f} | "
              f"{est['collective_ms']:.2f} | "
              f"{common.describe(c['by_kind'])} |")
    if name == "lm" and size == "gpu" and base:
      by = {r["variant"]: r for r in rows}
      for variant, goal in (TARGETS if devices == 1 else
                            SHARDED_TARGETS).items():
        if variant in by:
          value = by[variant]["total_vs_f32"]
          print(f"target {variant} memory <= {goal:.2f}x f32: "
                f"{value:.3f}x, {'met' if value <= goal else 'MISSED'}")
      if "ours-bf16" in by:
        ours = by["ours-bf16"]["total_vs_f32"]
        for peer in ("jmp-style", "all-bf16"):
          if peer in by:
            print(f"target ours-bf16 below {peer}: {ours:.3f}x against "
                  f"{by[peer]['total_vs_f32']:.3f}x, "
                  f"{'met' if ours < by[peer]['total_vs_f32'] else 'MISSED'}")
    results["models"][name] = rows
  path = pathlib.Path(args.json) if args.json else (
      common.RESULTS / ("gpu-compile-smoke.json" if args.smoke else
                        f"gpu-compile-{args.target}-{size}.json"))
  if args.ptx:
    results["ptx_mma"] = ptx_mma(pathlib.Path(args.ptx))
    print(f"\ntensor-core MMA instructions in the PTX ({args.ptx}):")
    for kind, count in sorted(results["ptx_mma"].items()):
      print(f"  {count:6d}  {kind}")
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(results, indent=1))
  print(f"\nwrote {path}")
  if lost_any:
    print("XLA did not keep every decision (see 'lost by XLA' above)",
          file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
