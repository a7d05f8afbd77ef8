"""Every kind of bad input `amp-opt` meets: a clear error and exit 1 or 2 with
no output file, or a correct module with the unsupported parts untouched.

Each case is a row of the bad-input table in docs/amp-opt.md.
"""

import pathlib
import re

import pytest

from stablehlo_amp._src import cli

INPUTS = pathlib.Path(__file__).parent / "bad_inputs"


def run(capsys, *argv):
  status = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return status, captured.out, captured.err


@pytest.fixture
def out(tmp_path):
  return tmp_path / "out.mlir"


def assert_failed_cleanly(status, err, out, code, message):
  assert status == code
  assert re.search(message, err), err
  assert "Traceback" not in err
  assert not out.exists()
  assert not [p for p in out.parent.iterdir() if p.name.startswith(".amp-opt")]


@pytest.mark.parametrize("name, contents, message", [
    ("empty.mlir", b"", r"empty\.mlir: error: empty input"),
    ("garbage.bin", bytes(range(256)) * 4, r"garbage\.bin(:\d+:\d+)?: error: "),
    ("truncated.mlir", (INPUTS / "truncated.mlir").read_bytes(),
     r"truncated\.mlir:3:\d+: error: "),
    ("not_mlir.txt", (INPUTS / "not_mlir.txt").read_bytes(),
     r"not_mlir\.txt:1:1: error: custom op 'hello' is unknown"),
    ("unknown_dialect.mlir", (INPUTS / "unknown_dialect.mlir").read_bytes(),
     r"unknown_dialect\.mlir:2:\d+: error: .*unregistered dialect"),
    ("quantized.mlir", (INPUTS / "quantized.mlir").read_bytes(),
     r"quantized\.mlir:1:\d+: error: .*unregistered dialect"),
    # Exported.serialize() of jnp.tanh(x @ x), written by jax 0.10.2 (its
    # flatbuffer needs the flatbuffers package to write).
    ("f.exported", (INPUTS / "exported.bin").read_bytes(),
     r"f\.exported: error: this is a serialized jax\.export\.Exported .*"
     r"jax\.export\.deserialize\(data\)\.mlir_module_serialized"),
])
def test_unreadable_input_is_exit_1_with_a_location(capsys, tmp_path, out,
                                                    name, contents, message):
  path = tmp_path / name
  path.write_bytes(contents)
  status, stdout, err = run(capsys, path, "--target", "gpu", "-o", out)
  assert_failed_cleanly(status, err, out, 1, message)
  assert stdout == ""


@pytest.mark.parametrize("policy, message", [
    ("p=f32,c=bf17", r"unknown dtype 'bf17' for key 'c' \(accepted: f32, "),
    # FP8 formats are not listed as accepted where they are refused.
    ("p=f32,c=f8", r"unknown dtype 'f8' for key 'c' \(accepted: f32, float32,"
     r" full, bf16, bfloat16, f16, float16, half, f64, float64\); FP8 is a "
     r"GEMM operand format, not a compute dtype: .*add gemm=f8"),
    ("q=f32", r"unknown policy key 'q' \(accepted: p\|param\|params"),
    ("p=f32,p=bf16", r"policy key 'p' given twice"),
    ("p=", r"malformed policy entry 'p='"),
    ("", r"empty policy"),
    ("bf16", r"malformed policy entry 'bf16'"),
    ("p=bf16 c=bf16", r"policy entries are separated by commas: "
     r"'p=bf16 c=bf16' holds more than one KEY=DTYPE \(write p=bf16,c=bf16\)"),
    ("p=bf16;c=bf16", r"policy entries are separated by commas: .*\(write "
     r"p=bf16,c=bf16\)"),
])
def test_invalid_policy_is_exit_2_naming_the_accepted_forms(capsys, out,
                                                             policy, message):
  status, _, err = run(capsys, INPUTS / "custom_call.mlir", "--policy", policy,
                       "-o", out)
  assert_failed_cleanly(status, err, out, 2, "amp-opt: error: " + message)


@pytest.mark.parametrize("flags, message", [
    (["--level", "O4"], r"unknown level 'O4' \(accepted: O0, O1, O2, O3\)"),
    (["--keep-f32", "tanh", "--force-compute", "tanh"],
     r"both keep_f32 and force_compute: stablehlo.tanh"),
    # An option that does not fit the module is usage too, not invalid IR.
    (["--policy", "p=f32,c=bf16,o=f32,gemm=f8", "--keep-gemms", "7"],
     r"invalid option 'keep-gemms': no low-precision dot 7"),
])
def test_invalid_options_are_exit_2(capsys, out, flags, message):
  status, _, err = run(capsys, INPUTS / "custom_call.mlir", *flags, "-o", out)
  assert_failed_cleanly(status, err, out, 2, message)


def test_unwritable_output_is_exit_2_and_leaves_nothing(capsys, tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  out = blocker / "out.mlir"  # a path through a regular file
  status, _, err = run(capsys, INPUTS / "custom_call.mlir", "--target", "gpu",
                       "-o", out)
  assert status == 2
  assert re.search(r"amp-opt: error: cannot write .*out\.mlir", err)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_missing_input_is_exit_2(capsys, tmp_path, out):
  status, _, err = run(capsys, tmp_path / "nope.mlir", "-o", out)
  assert_failed_cleanly(status, err, out, 2, r"cannot read .*nope\.mlir")


def rewritten(capsys, out, name, *flags):
  status, _, err = run(capsys, INPUTS / name, "--report", "-o", out, *flags)
  assert status == 0, err
  return out.read_text(), err


def test_mlir_that_is_not_stablehlo_passes_through(capsys, out):
  text, err = rewritten(capsys, out, "not_stablehlo.mlir", "--target", "gpu")
  assert "arith.addf %arg0, %arg0 : f32" in text
  assert "stablehlo.convert" not in text
  assert "keeps its exact types (not a StableHLO op): 1 (addf 1)" in err


def test_dynamic_shapes_lowered_on_gpu_kept_on_cpu(capsys, out):
  # On gpu a bf16 GEMM writes bf16 (the dot_result default).
  text, _ = rewritten(capsys, out, "dynamic_shapes.mlir", "--target", "gpu")
  assert "(tensor<?x8xbf16>, tensor<8x8xbf16>) -> tensor<?x8xbf16>" in text
  text, err = rewritten(capsys, out, "dynamic_shapes.mlir", "--target", "cpu")
  assert "bf16" not in text
  assert "dynamic shape: XLA:CPU needs a static NT-canonical dot" in err


def test_tokens_and_side_effects_keep_their_types(capsys, out):
  text, _ = rewritten(capsys, out, "token.mlir", "--target", "gpu")
  assert re.search(r"stablehlo.custom_call @log_it\(%arg0, %\w+\) "
                   r"\{has_side_effect = true\} : \(!stablehlo.token, "
                   r"tensor<4x8xf32>\) -> !stablehlo.token", text)
  assert "%arg0: !stablehlo.token" in text
  assert "(tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>" in text


def test_f64_only_program_is_left_as_it_is(capsys, out):
  text, err = rewritten(capsys, out, "f64_only.mlir", "--target", "gpu")
  assert "bf16" not in text and "stablehlo.convert" not in text
  assert "left as they are (no f32 values, or already low precision): 2 ops" in err


def test_already_mixed_program_keeps_its_low_precision_ops(capsys, out):
  text, err = rewritten(capsys, out, "already_mixed.mlir", "--target", "gpu")
  assert "(tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>" in text
  assert re.search(r"stablehlo.tanh %\w+ : tensor<4x8xbf16>", text)
  # The input's own converts, and no other.
  source = (INPUTS / "already_mixed.mlir").read_text()
  converts = re.compile(r"stablehlo\.convert %\w+ : \((tensor<[^)]*>)\) -> "
                        r"(tensor<[^>]*>)")
  assert sorted(converts.findall(text)) == sorted(converts.findall(source))
  assert len(converts.findall(source)) == source.count("stablehlo.convert")
  assert "left as they are (no f32 values, or already low precision): 2 ops" in err


def test_custom_call_keeps_its_exact_types(capsys, out):
  text, _ = rewritten(capsys, out, "custom_call.mlir", "--target", "gpu")
  assert re.search(r"stablehlo.custom_call @my_kernel\(%\w+\) : "
                   r"\(tensor<4x8xf32>\) -> tensor<4x8xf32>", text)
  assert text.count("stablehlo.dot_general") == 2
  assert text.count("-> tensor<4x8xbf16>") >= 1


@pytest.mark.parametrize("scope, code, message", [
    ("hed=f32", 2, r"^\S*head\.mlir: error: invalid option 'scopes': pattern 'hed' matches "
     r"no scope \(nearest: head\)"),
    ("he(ad=f32", 2, r"^amp-opt: error: invalid option 'scopes': pattern "
     r"'he\(ad' is not a regular expression"),
    ("head=bf16", 2, r"^amp-opt: error: invalid option 'scopes': unknown "
     r"choice 'bf16' for 'head' \(accepted: f32, compute, f8\)"),
    ("head=f8", 2, r"^amp-opt: error: invalid option 'scopes': f8 puts a "
     r"scope's GEMMs in FP8, and policy p=f32,c=bf16,o=f32 has none"),
    ("head", 2, r"^amp-opt: error: argument --scope: expected PATTERN=CHOICE"),
])
def test_a_bad_scope_names_what_is_wrong(capsys, tmp_path, out, scope, code,
                                         message):
  path = tmp_path / "head.mlir"
  path.write_text(
      'func.func public @main(%w: tensor<8x8xf32>, %x: tensor<4x8xf32>) '
      '-> tensor<4x8xf32> {\n'
      '  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : '
      '(tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32> '
      'loc("jit(f)/head/dot_general")\n'
      '  return %0 : tensor<4x8xf32>\n}\n')
  try:
    status, _, err = run(capsys, path, "--target", "gpu", "--scope", scope,
                         "-o", out)
  except SystemExit as usage:  # argparse's own usage errors
    status, err = usage.code, capsys.readouterr().err
  assert_failed_cleanly(status, err, out, code, message)
