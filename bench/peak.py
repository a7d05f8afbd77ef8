"""What XLA keeps live at the memory peak of a training step, by dtype and
by the op that made each value.

    python -m bench.peak                       # LM: f32, ours bf16, storage=f32
    python -m bench.peak --model mlp --variants f32,ours-bf16,all-bf16
    python -m bench.peak --no-donate --top 40
    python -m bench.peak --smoke               # tiny LM: checks the script

Builds the variants as bench/peers.py does (state donated unless
--no-donate), compiles each with XLA's dumps on (--xla_dump_to, text), and
reads XLA's own buffer assignment: the live-range dump names the values live
at the peak of the heap simulation and their bytes (their sum is the
`memory_analysis()` total: arguments + outputs + temporaries − aliased).
Each value is traced back through converts, bitcasts, copies, reshapes,
transposes, broadcasts, slices and fusion parameters to the op that computed
it; that op's source line (XLA's stack frames) and pass (forward: `jvp`,
backward: `transpose(jvp)`, optimizer) name its group. A value whose chain
holds a bf16/f16 -> f32 convert is an "f32 copy of a low-precision value"
(XLA upcasting, FloatNormalization); one whose chain holds f32 -> bf16/f16 is
"rounded" (our storage converts, or the operand converts of a dot).

Prints, per variant, the groups (MiB, values, dtype) and one table of all
variants side by side; writes bench/results/peak-MODEL[-smoke].json.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import shutil
import sys
import tempfile

from bench import common
from bench import peers

_LOW = ("bf16", "f16")
# Ops that move or re-type a value without computing it.
_MOVES = {"convert", "bitcast", "copy", "reshape", "transpose", "broadcast",
          "slice", "dynamic-slice", "bitcast-convert", "pad"}


def _element(type_text: str) -> str:
  return type_text.lstrip("(").split("[")[0]


def parse_hlo(text: str) -> dict:
  """Instructions by computation, each with shape, type, opcode, operands,
  called computation, op_name and stack frame; plus the stack-frame
  tables."""
  module = common.hlo_reader().Module.parse(text)
  tables = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {},
            "StackFrames": {}}
  section = None
  for line in text.splitlines():
    if line in tables:
      section = line
    elif section and re.match(r"^\d+ ", line):
      key, _, value = line.partition(" ")
      tables[section][int(key)] = value
    else:
      section = None
  comps = {
      computation.name: {
          ins.name: {"shape": ins.shape, "type": ins.shape.text,
                     "opcode": ins.opcode, "operands": list(ins.operands),
                     "index": ins.parameter_number,
                     "calls": ins.calls[0] if ins.calls else None,
                     "op_name": ins.op_name, "frame": ins.stack_frame_id}
          for ins in computation.instructions}
      for computation in module.computations.values()}
  roots = {c.name: c.root.name for c in module.computations.values()
           if c.root is not None}
  callers = {}
  for comp, instrs in comps.items():
    for name, ins in instrs.items():
      if ins["calls"]:
        callers[ins["calls"]] = (comp, name)
  return {"comps": comps, "roots": roots, "entry": module.entry.name,
          "callers": callers, "tables": tables}


def frame_source(hlo: dict, frame: int | None) -> tuple[str, int, str]:
  """(file, line, function) of a stack frame's innermost location."""
  tables = hlo["tables"]
  if frame is None or frame not in tables["StackFrames"]:
    return ("", 0, "")
  loc_id = int(re.search(r"file_location_id=(\d+)",
                         tables["StackFrames"][frame]).group(1))
  loc = tables["FileLocations"].get(loc_id, "")
  get = lambda key: int(re.search(key + r"=(\d+)", loc).group(1))
  path = tables["FileNames"].get(get("file_name_id"), '""').strip('"')
  function = tables["FunctionNames"].get(get("function_name_id"),
                                         '""').strip('"')
  return (path, get("line"), function)


def origin(hlo: dict, comp: str, name: str) -> dict:
  """Follows `name` back through data movement and fusion boundaries to the
  op that computed it; records the float dtypes met on the way."""
  comps, chain, moves = hlo["comps"], [], []
  frame = None  # the nearest op on the way that has a source location
  for _ in range(200):
    ins = comps[comp][name]
    chain.append(_element(ins["type"]))
    if frame is None and ins["frame"] is not None:
      frame = (ins["frame"], ins["op_name"])
    if ins["opcode"] in ("copy", "transpose"):
      moves.append(ins["opcode"])
    op = ins["opcode"]
    if op == "fusion" and ins["calls"] in comps:
      comp, name = ins["calls"], hlo["roots"][ins["calls"]]
      chain.pop()
      continue
    if op == "parameter":
      if comp in hlo["callers"]:
        outer, call = hlo["callers"][comp]
        operands = comps[outer][call]["operands"]
        if ins["index"] is not None and ins["index"] < len(operands):
          comp, name = outer, operands[ins["index"]]
          chain.pop()
          continue
      return {"comp": comp, "name": name, "ins": ins, "chain": chain,
              "frame": frame, "moves": moves}
    if op in _MOVES and ins["operands"]:
      name = ins["operands"][0]
      continue
    if op in ("select", "concatenate") and ins["operands"]:
      # The widest float operand stands for the value.
      floats = [o for o in ins["operands"]
                if _element(comps[comp][o]["type"]) not in ("pred", "s32")]
      if floats and op == "select":
        name = floats[-2] if len(floats) >= 2 else floats[0]
        continue
    return {"comp": comp, "name": name, "ins": ins, "chain": chain,
            "frame": frame, "moves": moves}
  return {"comp": comp, "name": name, "ins": comps[comp][name], "chain": chain,
          "frame": frame, "moves": moves}


def _role(path: str, line: int, function: str) -> str:
  """A short name for the source line that made a value."""
  text = ""
  try:
    text = pathlib.Path(path).read_text().splitlines()[line - 1].strip()
  except (OSError, IndexError):
    pass
  base = pathlib.Path(path).name
  if "optax" in path:
    return "optimizer (optax adam)"
  if function == "layer_norm":
    return "layer norm"
  if "softmax" in text and "log_softmax" not in text:
    return "attention softmax"
  if "log_softmax" in text:
    return "loss: log_softmax"
  if "take_along_axis" in text:
    return "loss: gather"
  if "gelu" in text:
    return "MLP up + GELU"
  if '@ layer["down"]' in text:
    return "MLP down + residual"
  if '@ layer["qkv"]' in text:
    return "qkv projection"
  if '@ layer["proj"]' in text:
    return "attention out proj + residual"
  if "bqhd,bkhd->bhqk" in text:
    return "attention logits (QK^T)"
  if "jnp.where(mask" in text:
    return "attention mask"
  if "bhqk,bkhd->bqhd" in text:
    return "attention PV"
  if '["embed"][tokens]' in text:
    return "embedding"
  if 'params["embed"].T' in text:
    return "output logits (tied embedding)"
  if "relu" in text:
    return "MLP relu"
  if '@ layer["w"]' in text:
    return "MLP dense"
  if "stablehlo_amp" in path:
    return f"train step ({function})"
  return f"{base}:{line} {text[:40]}" if text else (base or "?")


def _argument_kind(ins: dict) -> str:
  """What an entry parameter holds, from its name (jit of `step(state,
  batch)` names them `state[0]...`: parameters, `state[1]`: optimizer
  state; amp.train_step: `state.params`, `state.opt_state`)."""
  text = ins["op_name"] or ""
  if "opt_state" in text or text.startswith("state[1]"):
    return "optimizer state"
  if "params" in text or text.startswith("state[0]"):
    return "parameters"
  if "loss_scale" in text or "skipped" in text or text.startswith("state["):
    return "loss scale / counters"
  return "batch"


def classify(hlo: dict, value: str) -> dict:
  """Group, pass, dtype and conversion history of one live value."""
  name, _, index = value.partition("{")
  index = index.rstrip("}")
  entry = hlo["comps"][hlo["entry"]]
  ins = entry.get(name)
  if ins is None:
    return {"group": "?", "pass": "?", "dtype": "?", "how": ""}
  type_text = ins["type"]
  if ins["shape"].is_tuple and index:
    elements = ins["shape"].elements
    position = int(index.split(",")[0])
    if position < len(elements):
      type_text = elements[position].text
  dtype = _element(type_text)
  if ins["opcode"] == "parameter":
    return {"group": f"argument: {_argument_kind(ins)}", "pass": "argument",
            "dtype": dtype, "how": "", "op": "parameter", "shape": type_text}
  if ins["opcode"] == "tuple" or (ins["opcode"] == "fusion" and
                                  type_text != ins["type"]):
    # A tuple-shaped fusion: its element `index` is the root's operand.
    root = hlo["roots"].get(ins["calls"] or "", "")
    comp = ins["calls"] if ins["calls"] else hlo["entry"]
    if root and index:
      ops = hlo["comps"][comp][root]["operands"]
      position = int(index.split(",")[0])
      found = origin(hlo, comp, ops[position]) if position < len(ops) else \
          origin(hlo, hlo["entry"], name)
    else:
      found = origin(hlo, hlo["entry"], name)
  else:
    found = origin(hlo, hlo["entry"], name)
  src = found["ins"]
  chain = [d for d in found["chain"] if d in ("f32",) + _LOW]
  how = ""
  if dtype == "f32" and any(d in _LOW for d in chain[1:]):
    how = "f32 copy of a low-precision value"
  elif dtype in _LOW and "f32" in chain[1:]:
    how = "rounded from f32"
  if found["moves"] and not how:
    how = "layout copy"
  elif found["moves"]:
    how += " (layout copy)"
  if src["opcode"] == "parameter":
    return {"group": f"argument copy: {_argument_kind(src)}",
            "pass": "argument", "dtype": dtype, "how": how, "op": "parameter",
            "shape": type_text}
  frame, op_name = (src["frame"], src["op_name"])
  if frame is None and found["frame"]:
    frame, op_name = found["frame"]
  path, line, function = frame_source(hlo, frame)
  pass_ = ("optimizer" if "optax" in path or "apply_updates" in function
           else "backward" if "transpose(" in op_name else
           "forward" if "jvp(" in op_name else "other")
  role = _role(path, line, function) if path else (
      "loss scale / select" if "call_exported" in op_name else op_name or "?")
  opcode = src["opcode"]
  if opcode == "custom-call" or opcode == "fusion":
    opcode = "dot" if "ynn" in (src.get("calls") or "") or "dot" in op_name \
        else opcode
  return {"group": role, "pass": pass_, "dtype": dtype, "how": how,
          "op": opcode, "shape": type_text,
          "source": f"{pathlib.Path(path).name}:{line}" if path else ""}


def parse_peak(live_text: str) -> tuple[int, list[tuple[str, int]]]:
  lines = live_text.splitlines()
  start = next(i for i, l in enumerate(lines)
               if l.strip().startswith("Live ranges at"))
  at = int(re.search(r"at (\d+)", lines[start]).group(1))
  values = []
  for line in lines[start + 1:]:
    match = re.match(r"\s+(\S+): (\d+) bytes", line)
    if not match:
      break
    values.append((match.group(1), int(match.group(2))))
  return at, values


def analyse(dump: pathlib.Path) -> dict:
  """Reads the largest module's dumps in `dump` (the training step)."""
  live = max(dump.glob("*-live-range.txt"), key=lambda p: p.stat().st_size)
  prefix = live.name[:-len("-live-range.txt")]
  hlo = parse_hlo((dump / f"{prefix}.txt").read_text())
  at, values = parse_peak(live.read_text())
  rows = []
  for value, size in values:
    info = classify(hlo, value)
    rows.append({"value": value, "bytes": size, **info})
  return {"module": prefix, "peak_at": at, "peak_bytes": sum(v for _, v in
                                                             values),
          "values": rows}


def group_rows(values: list[dict],
               by=("pass", "group", "op", "dtype", "how")):
  groups = collections.OrderedDict()
  for v in sorted(values, key=lambda v: -v["bytes"]):
    key = tuple(v.get(k, "") for k in by)
    g = groups.setdefault(key, {"bytes": 0, "count": 0, "shapes":
                                collections.Counter()})
    g["bytes"] += v["bytes"]
    g["count"] += 1
    g["shapes"][v.get("shape", "")] += 1
  return sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])


def print_variant(name: str, result: dict, top: int) -> None:
  mib = lambda b: b / 2 ** 20
  mem = result["memory"]
  print(f"\n### {name}: peak {mib(result['peak_bytes']):.1f} MiB at "
        f"instruction {result['peak_at']} (memory_analysis total "
        f"{mib(mem['total']):.1f} MiB, temp {mib(mem['temp']):.1f})")
  print("| pass | made by | op | dtype | how | values | MiB | shapes |")
  print("|---|---|---|---|---|---|---|---|")
  for (pass_, group, op, dtype, how), g in group_rows(
      result["values"])[:top]:
    shapes = ", ".join(f"{n}×{s.split('{')[0]}"
                       for s, n in g["shapes"].most_common(3))
    print(f"| {pass_} | {group} | {op} | {dtype} | {how} | {g['count']} | "
          f"{mib(g['bytes']):.1f} | {shapes} |")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="lm", choices=("lm", "mlp"))
  parser.add_argument("--variants", help="default f32,ours-bf16,"
                      "ours-bf16-storage-f32; --smoke f32,ours-bf16")
  parser.add_argument("--no-donate", action="store_true")
  parser.add_argument("--top", type=int, default=25,
                      help="groups printed per variant")
  parser.add_argument("--dump", help="keep XLA's dumps here (default: a "
                      "temporary directory)")
  parser.add_argument("--smoke", action="store_true",
                      help="the tiny --smoke model, its dumps deleted "
                      "afterwards: checks the script works")
  parser.add_argument("--json", help="default bench/results/peak-MODEL"
                      "[-smoke].json")
  args = parser.parse_args(argv)
  args.variants = args.variants or ("f32,ours-bf16" if args.smoke else
                                    "f32,ours-bf16,ours-bf16-storage-f32")
  donate = not args.no_donate
  configs = (common.smoke_configs() if args.smoke else
             {"lm": common.LMConfig(), "mlp": common.MLPConfig()})
  model = (common.make_lm(configs["lm"]) if args.model == "lm" else
           common.make_mlp(configs["mlp"]))
  import jax
  host = next(model.train)
  batch = jax.device_put(host)
  root = pathlib.Path(args.dump or tempfile.mkdtemp(prefix="peak-"))
  results = {"benchmark": "peak", "model": model.description,
             "donated": donate, "environment": common.environment(),
             "variants": {}}
  for variant in [v for v in args.variants.split(",") if v]:
    dump = root / variant
    common.COMPILER_OPTIONS.clear()
    common.COMPILER_OPTIONS.update({
        "xla_dump_to": str(dump), "xla_dump_hlo_as_text": True,
        # The step only (jax.export and the eval function compile nothing
        # here; small helpers would otherwise be dumped too).
        "xla_dump_hlo_module_re": ".*(step|traced|plain).*"})
    built = peers.build(variant, model, batch, donate=donate)
    result = analyse(dump)
    result["memory"] = common.memory(built.compiled)
    results["variants"][variant] = result
    print_variant(variant, result, args.top)
  common.COMPILER_OPTIONS.clear()
  # Side by side: MiB per (pass, group, dtype) for every variant.
  keys = collections.OrderedDict()
  for variant, result in results["variants"].items():
    for (pass_, group, dtype, how), g in group_rows(
        result["values"], by=("pass", "group", "dtype", "how")):
      keys.setdefault((pass_, group), {}).setdefault(variant, []).append(
          (dtype + (" (copy)" if how.startswith("f32 copy") else ""),
           g["bytes"]))
  names = list(results["variants"])
  print("\n### side by side (MiB live at the peak, by dtype)")
  print("| pass | made by | " + " | ".join(names) + " |")
  print("|---|---|" + "---|" * len(names))
  totals = {n: results["variants"][n]["peak_bytes"] for n in names}
  order = sorted(keys.items(), key=lambda kv: -max(
      sum(b for _, b in parts) for parts in kv[1].values()))
  for (pass_, group), per in order:
    cells = []
    for n in names:
      parts = per.get(n, [])
      cells.append(" + ".join(f"{b / 2**20:.1f} {d}" for d, b in parts)
                   or "–")
    print(f"| {pass_} | {group} | " + " | ".join(cells) + " |")
  print("| | **total** | " + " | ".join(f"**{totals[n] / 2**20:.1f}**"
                                        for n in names) + " |")
  path = common.write_json(
      pathlib.Path(args.json) if args.json else
      common.RESULTS / f"peak-{args.model}{'-smoke' if args.smoke else ''}.json",
      results)
  if args.smoke and not args.dump:
    shutil.rmtree(root)
    print(f"\nwrote {path}")
  else:
    print(f"\nwrote {path} (dumps in {root})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
