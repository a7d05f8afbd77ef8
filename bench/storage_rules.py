"""Prototypes of storage-rule changes, measured without touching passes/.

    python bench/storage_rules.py                     # memory grid, LM
    python bench/storage_rules.py --train --seeds 0,1,2 --variants \\
        f32,ours-bf16-level-O1,proto-O1-C,proto-O1-C+ynn-dots

Builds our training step as amp.train_step does, takes the rewritten module
it produced (before XLA), edits it with jaxlib's MLIR bindings, and
compiles the edited module in place of the original (the step's program
cache is seeded with it, so everything else is unchanged: loss scaling,
donation, the outer jit). The edits act on the values the storage decision
rounded: an f32 value `v` whose only reader is `r = convert(v) -> bf16`;
f32 readers read `convert(r) -> f32`. "Unrounding" `v` makes its f32
readers read `v` itself (and drops `r` if no low-precision op reads it).

Rules:
  none  the module as the pass wrote it
  R1    unround every stored value that no low-precision op reads
  C     keep stored only what XLA cannot rebuild cheaply: unround a stored
        value made by cheap data movement or elementwise arithmetic (add,
        subtract, multiply, divide, negate, select, max/min, broadcast,
        reshape, transpose, slice, concatenate, convert) whose float operands
        are all function arguments, constants, reduction results, stored
        values or values of this kind themselves (layer-norm x - mean,
        (x - mean) * rsqrt, softmax e / sum, GELU's polynomial). Dots,
        transcendental results (exp, tanh) and values made from unstored dot
        results stay stored.

Variant names: `proto-LEVEL-RULE[+XLA suffix]` (e.g. proto-O1-C,
proto-O2-none+ynn-dots); other names are bench/peers.py's.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys

import jax

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import common  # noqa: E402
import peers  # noqa: E402

_CHEAP = {"stablehlo." + n for n in (
    "add", "subtract", "multiply", "divide", "negate", "broadcast_in_dim",
    "reshape", "transpose", "select", "maximum", "minimum", "abs", "convert",
    "slice", "concatenate")}
_SOURCES = re.compile(r'([\w]+\.py)":(\d+)')


def _ir():
  from jax.extend.mlir import ir
  return ir


def _element(type_) -> str | None:
  ir = _ir()
  try:
    return str(ir.RankedTensorType(type_).element_type)
  except Exception:  # noqa: BLE001 - not a ranked tensor
    return None


def _main_block(module):
  ir = _ir()
  for op in module.body.operations:
    if (op.operation.name == "func.func" and
        ir.StringAttr(op.attributes["sym_name"]).value == "main"):
      return op.regions[0].blocks[0]
  raise ValueError("no main function")


def _where(op) -> str:
  found = _SOURCES.findall(str(op.location))
  return f"{found[0][0]}:{found[0][1]}" if found else "?"


def stored_values(block) -> list[tuple]:
  """(v, r, f32 converts of r, low readers of r, producer name) for each
  value the storage decision rounded."""
  ir = _ir()
  out = []
  for op in block.operations:
    if op.operation.name != "stablehlo.convert":
      continue
    src, res = op.operands[0], op.results[0]
    if _element(src.type) != "f32" or _element(res.type) not in ("bf16",
                                                                   "f16"):
      continue
    producer = src.owner
    if isinstance(producer, ir.Block) or \
        producer.name == "stablehlo.convert":
      continue
    if len(list(src.uses)) != 1:  # v has f32 readers: a painting convert
      continue
    backs, lows = [], []
    for use in res.uses:
      user = use.owner
      if (user.name == "stablehlo.convert" and
          _element(user.results[0].type) == "f32"):
        backs.append(user)
      else:
        lows.append(user)
    out.append((src, op, backs, lows, producer.name))
  return out


def _unround(v, r, backs, lows) -> None:
  for back in backs:
    back.results[0].replace_all_uses_with(v)
    back.operation.erase()
  if not lows:
    r.operation.erase()


def rule_r1(module) -> list[str]:
  changed = []
  for v, r, backs, lows, name in stored_values(_main_block(module)):
    if backs and not lows:
      changed.append(f"{name.split('.')[1]}@{_where(v.owner)}")
      _unround(v, r, backs, lows)
  return changed


def rule_c(module) -> list[str]:
  block = _main_block(module)
  stored = {entry[0]: entry for entry in stored_values(block)}
  rebuildable = set(block.arguments)
  todo, changed = [], []
  for op in block.operations:
    name, results = op.operation.name, list(op.results)
    if not results:
      continue
    if name in ("stablehlo.constant", "stablehlo.iota", "stablehlo.reduce"):
      rebuildable.update(results)
      continue
    floats = [o for o in op.operands
              if _element(o.type) in ("f32", "bf16", "f16")]
    if name in _CHEAP and all(o in rebuildable for o in floats):
      if results[0] in stored:
        todo.append(stored[results[0]])
        changed.append(f"{name.split('.')[1]}@{_where(op)}")
      rebuildable.update(results)
      continue
    rebuildable.update(r for r in results if r in stored)
  for v, r, backs, lows, _ in todo:
    _unround(v, r, backs, lows)
  return changed


RULES = {"none": lambda module: [], "R1": rule_r1, "C": rule_c}


def edited_step_factory(rule: str, log: dict, batch):
  """make_step for peers.build_ours: amp.train_step whose program is the
  pass's module edited by `rule`."""
  import stablehlo_amp as amp
  from stablehlo_amp._src import jax_compat
  from stablehlo_amp._src import pipeline as pl

  def make(model, policy, options):
    new = lambda: amp.train_step(lambda p, b: model.loss(p, b),
                                 model.optimizer, policy, **options)
    original = new()
    original.lower(original.init(model.params), batch)
    (key, program), = original._programs.items()
    with pl.ir_context():
      # The rewritten module: inlined as MLIR bytecode (stablehlo_amp >=
      # f48781b) or inside an Exported (older, and explicit shardings).
      source = (program.exported.mlir_module()
                if getattr(program, "exported", None) is not None else
                program.bytecode)
      module = _ir().Module.parse(source)
      changed = RULES[rule](module)
      module.operation.verify()
      if getattr(program, "exported", None) is not None:
        edited = dataclasses.replace(program, exported=dataclasses.replace(
            program.exported,
            mlir_module_serialized=jax_compat.module_bytes(module)))
      else:
        edited = dataclasses.replace(program, module=module,
                                     bytecode=jax_compat.bytecode_of(module))
    log["changed"] = dict(collections.Counter(changed))
    log["count"] = len(changed)
    step = new()
    step._programs[key] = edited
    return step
  return make


def proto_builder(variant: str):
  """A peers builder for `proto-LEVEL-RULE[+suffix]`."""
  base, _, suffix = variant.partition("+")
  _, level, rule = base.split("-", 2)
  if rule not in RULES or level not in ("O1", "O2", "O3"):
    raise SystemExit(f"unknown prototype {variant!r}")
  peers.LABELS[variant] = (f"ours bf16, level={level}, rule {rule} "
                           "(prototype)" + (f" [XLA: {suffix}]" if suffix
                                            else ""))

  def build(model, host, donate):
    log = {}
    saved = dict(common.COMPILER_OPTIONS)
    if suffix:
      common.COMPILER_OPTIONS.update(peers.XLA_SUFFIXES[suffix])
    try:
      built = peers.build_ours(model, jax.device_put(host), variant,
                               "p=f32,c=bf16,o=f32", False, level=level,
                               donate=donate,
                               make_step=edited_step_factory(
                                   rule, log, jax.device_put(host)))
    finally:
      common.COMPILER_OPTIONS.clear()
      common.COMPILER_OPTIONS.update(saved)
    built.notes["rule"] = rule
    built.notes["unrounded"] = log
    if suffix:
      built.notes["xla_options"] = peers.XLA_SUFFIXES[suffix]
    return built
  return build


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="lm", choices=("lm", "mlp"))
  parser.add_argument("--variants", help="default: the memory grid "
                      "(f32, proto-{O1,O2}-{none,R1,C}, each also "
                      "+ynn-dots)")
  parser.add_argument("--train", action="store_true",
                      help="train the variants (interleaved, like peers.py) "
                      "instead of only compiling them")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--json", help="default bench/results/"
                      "storage-rules[-train]-MODEL.json")
  args = parser.parse_args(argv)
  grid = [f"proto-{level}-{rule}{suffix}" for suffix in ("", "+ynn-dots")
          for level in ("O1", "O2") for rule in ("none", "R1", "C")]
  variants = ([v for v in args.variants.split(",") if v] if args.variants
              else ["f32", "f32+ynn-dots"] + grid)
  builders = {v: proto_builder(v) for v in variants if v.startswith("proto-")}
  make = ((lambda seed: common.make_lm(common.LMConfig(), seed=seed))
          if args.model == "lm" else
          (lambda seed: common.make_mlp(common.MLPConfig(), seed=seed)))
  env = common.environment()
  results = {"benchmark": "storage-rules", "environment": env,
             "model": args.model, "variants": variants}
  if args.train:
    seeds = [int(s) for s in args.seeds.split(",") if s]
    result = peers.bench_model(make, variants, args.steps, args.warmup,
                               seeds, builders=builders)
    results["result"] = result
    print()
    print(result["table"])
  else:
    model = make(0)
    host = next(model.train)
    rows = []
    print("| variant | memory total MiB | vs f32 | temp MiB | unrounded |")
    print("|---|---|---|---|---|")
    base = None
    for variant in variants:
      built = (builders[variant](model, host, True) if variant in builders
               else peers.build(variant, model, jax.device_put(host)))
      mem = common.memory(built.compiled)
      base = base or mem["total"]
      unrounded = built.notes.get("unrounded", {})
      rows.append({"variant": variant, "memory": mem,
                   "vs_first": mem["total"] / base, "notes": built.notes})
      print(f"| {peers.LABELS.get(variant, variant)} | "
            f"{mem['total'] / 2**20:.1f} | {mem['total'] / base:.3f}× | "
            f"{mem['temp'] / 2**20:.1f} | {unrounded.get('count', '–')} |",
            flush=True)
    results["rows"] = rows
  path = common.write_json(
      common.pathlib.Path(args.json) if args.json else common.RESULTS /
      f"storage-rules{'-train' if args.train else ''}-{args.model}.json",
      results)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
