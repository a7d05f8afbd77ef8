"""hlo.py reads XLA's optimized HLO text, and survival.py what XLA kept of
the pass's decisions from it.

The programs are hand-written in the syntax `Compiled.as_text()` prints
(XLA:CPU's and XLA:GPU's, single-device and SPMD-partitioned on 8 devices,
with their per-device shapes); each has the status survival.py must give
every decision, and the collective traffic of the SPMD one is checked to
the byte. A reader that calls every decision one status fails them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from stablehlo_amp._src import contract, hlo, survival
from stablehlo_amp._src.survival import (DROPPED, EMULATED, FP8_GEMM,
                                         FUSED_AWAY, KEPT, UPCAST)


def _program(text: str) -> str:
  """`text` with the marker attributes named as the contract names them."""
  return (text.replace("amp_stored=", contract.attribute("stored_marker") +
                       "=")
          .replace("amp_fp8=", contract.attribute("fp8_marker") + "="))


# -- shapes ----------------------------------------------------------------------


@pytest.mark.parametrize("text, dtype, dims, nbytes", [
    ("f32[8,128]{1,0}", "f32", (8, 128), 4096),
    ("bf16[4,512]{0,1}", "bf16", (4, 512), 4096),
    ("f16[3]", "f16", (3,), 6),
    ("f8e4m3fn[16,64]{1,0}", "f8e4m3fn", (16, 64), 1024),
    ("f8e5m2[64,32]{1,0}", "f8e5m2", (64, 32), 2048),
    ("pred[7]{0}", "pred", (7,), 7),
    ("s32[]", "s32", (), 4),
    ("u8[10]{0}", "u8", (10,), 10),
    ("u32[2,2]{1,0}", "u32", (2, 2), 16),
    ("f64[2]{0}", "f64", (2,), 16),
    ("s8[33554432]{0}", "s8", (33554432,), 33554432),
    ("u16[5]{0}", "u16", (5,), 10),
    ("f32[<=8,4]{1,0}", "f32", (8, 4), 128),
    ("f32[8,128]{1,0:T(8,128)}", "f32", (8, 128), 4096),
])
def test_array_shapes(text, dtype, dims, nbytes):
  shape = hlo.Shape.parse(text)
  assert (shape.dtype, shape.dims, shape.nbytes, shape.text) == (
      dtype, dims, nbytes, text)
  assert not shape.is_tuple and shape.arrays() == (shape,)


def test_tuple_shapes_nest_and_skip_index_comments():
  text = ("((bf16[2]{0}, f32[3]), s8[4]{0}, u32[], u32[], /*index=5*/"
          "f8e4m3fn[8]{0}, ())")
  shape = hlo.Shape.parse(text)
  assert shape.is_tuple and shape.text == text
  assert [e.text for e in shape.elements] == [
      "(bf16[2]{0}, f32[3])", "s8[4]{0}", "u32[]", "u32[]", "f8e4m3fn[8]{0}",
      "()"]
  assert shape.element_types == ("bf16", "f32", "s8", "u32", "u32",
                                 "f8e4m3fn")
  assert shape.element_type == "bf16"
  assert shape.nbytes == 4 + 12 + 4 + 4 + 4 + 8
  assert hlo.Shape.parse("()").element_type is None


@pytest.mark.parametrize("text", ["f32[8", "[8]", "f32[8] junk", "(f32[2]",
                                  "f32[?]"])
def test_malformed_shapes_are_errors(text):
  with pytest.raises(ValueError):
    hlo.Shape.parse(text)


def test_a_shape_of_unknown_size_says_which_type():
  with pytest.raises(ValueError, match="s4"):
    _ = hlo.Shape.parse("s4[8]{0}").nbytes


# -- instructions ----------------------------------------------------------------


def test_instruction_fields():
  ins = hlo.Instruction.parse(
      '  ROOT %cublas-gemm.1 = (bf16[16,32]{1,0}, s8[1024]{0}) custom-call('
      'f8e4m3fn[16,64]{1,0} %a.1, %b.1, /*index=2*/%s), custom_call_target='
      '"__cublas$lt$matmul$f8", frontend_attributes={_xla_stream="1",'
      'amp_fp8="3"}, metadata={op_name="jit(f)/dot_general \\"x\\"" '
      'stack_frame_id=26}, backend_config={"gemm_backend_config":{"epilogue":'
      '"DEFAULT","name":"a,b}"}}')
  assert (ins.name, ins.opcode, ins.root) == ("cublas-gemm.1", "custom-call",
                                              True)
  assert ins.shape.element_types == ("bf16", "s8")
  assert ins.operands == ("a.1", "b.1", "s")
  assert [s.text if s else None for s in ins.operand_shapes] == [
      "f8e4m3fn[16,64]{1,0}", None, None]
  assert ins.custom_call_target == "__cublas$lt$matmul$f8"
  assert ins.frontend_attributes == {"_xla_stream": "1", "amp_fp8": "3"}
  assert ins.op_name == 'jit(f)/dot_general \\"x\\"'
  assert ins.stack_frame_id == 26
  assert ins.attributes["backend_config"].endswith('"a,b}"}}')
  assert ins.parameter_number is None and ins.fusion_kind is None


def test_parameters_constants_fusions_and_calls():
  parameter = hlo.Instruction.parse(
      '  %p = f32[4]{0} parameter(2), sharding={devices=[8,1]<=[8]}')
  assert parameter.parameter_number == 2 and parameter.operands == ()
  constant = hlo.Instruction.parse(
      "  %c = s32[2,2]{1,0} constant({ {1, 2}, {3, 4} })")
  assert constant.operands == () and constant.opcode == "constant"
  fusion = hlo.Instruction.parse(
      '  %gemm = bf16[8]{0} fusion(%x, %y), kind=kCustom, calls=%gemm_body, '
      'backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}')
  assert (fusion.fusion_kind, fusion.backend_kind, fusion.calls) == (
      "kCustom", "__triton_gemm", ("gemm_body",))
  loop = hlo.Instruction.parse(
      "  %w = (s32[], f32[4]{0}) while(%t), condition=%cond, body=%body")
  assert loop.called_computations == ("body", "cond")
  branch = hlo.Instruction.parse(
      "  %k = f32[] conditional(%i, %a, %b), "
      "branch_computations={%left, %right}")
  assert branch.called_computations == ("left", "right")
  gather = hlo.Instruction.parse(
      "  %all-gather = f32[1,128,64]{1,0,2} all-gather(%f), channel_id=1, "
      "replica_groups=mesh['axis_0'=1,'axis_2'=8] {'axis_2'}, "
      "dimensions={2}, use_global_device_ids=true")
  assert gather.attributes["replica_groups"] == (
      "mesh['axis_0'=1,'axis_2'=8] {'axis_2'}")
  assert gather.attributes["dimensions"] == "{2}"


def test_an_async_start_is_read_by_its_result():
  gather = hlo.Instruction.parse(
      "  %ag = (bf16[4,8]{1,0}, bf16[32,8]{1,0}) all-gather-start(%x), "
      "dimensions={0}")
  generic = hlo.Instruction.parse(
      "  %rs = ((f32[64]{0}), f32[8]{0}, u32[]) async-start(%x), calls=%c")
  reduce = hlo.Instruction.parse(
      "  %ar = f32[64]{0} all-reduce-start(%x), to_apply=%add")
  assert gather.result.text == "bf16[32,8]{1,0}"
  assert generic.result.text == "f32[8]{0}"
  assert reduce.result.text == "f32[64]{0}"
  assert [i.collective_kind for i in (gather, generic, reduce)] == [
      "all-gather", None, "all-reduce"]


# As XLA:GPU prints a partitioned step: async collectives carry no op_name,
# the GEMMs whose values they move do (through a bitcast). A forward GEMM's
# split contraction is reduced too; only the backward pass's reductions are
# gradients.
NAMED_COLLECTIVES = r"""
HloModule step, entry_computation_layout={(f32[32,64]{1,0}, bf16[64,128]{1,0})->(f32[4,128]{1,0}, f32[8,128]{1,0})}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (x: f32[32,64], w: bf16[64,128]) -> (f32[4,128], f32[8,128]) {
  %x = f32[32,64]{1,0} parameter(0)
  %w = bf16[64,128]{1,0} parameter(1)
  %forward = f32[32,128]{1,0} fusion(%x, %w), kind=kCustom, calls=%add, metadata={op_name="jit(step)/jvp()/dot_general"}
  %bitcast.1 = f32[32,128]{1,0} bitcast(%forward)
  %rs-start = ((f32[32,128]{1,0}), f32[4,128]{1,0}) reduce-scatter-start(%bitcast.1), dimensions={0}, to_apply=%add
  %rs-done = f32[4,128]{1,0} reduce-scatter-done(%rs-start)
  %backward = f32[64,128]{1,0} fusion(%x, %w), kind=kCustom, calls=%add, metadata={op_name="jit(step)/transpose(jvp())/dot_general"}
  %copy.1 = f32[64,128]{1,0} copy(%backward)
  %rs2-start = ((f32[64,128]{1,0}), f32[8,128]{1,0}) reduce-scatter-start(%copy.1), dimensions={0}, to_apply=%add
  %rs2-done = f32[8,128]{1,0} reduce-scatter-done(%rs2-start)
  %lonely = f32[64,128]{1,0} parameter(2)
  %ar = f32[64,128]{1,0} all-reduce(%lonely), to_apply=%add
  ROOT %t = (f32[4,128]{1,0}, f32[8,128]{1,0}) tuple(%rs-done, %rs2-done)
}
"""


def test_a_collective_is_named_by_the_op_whose_value_it_moves():
  found = {c.instruction.name: c for c in
           hlo.Module.parse(NAMED_COLLECTIVES).collectives()}
  assert set(found) == {"rs-start", "rs2-start", "ar"}
  assert found["rs-start"].op_name == "jit(step)/jvp()/dot_general"
  assert not found["rs-start"].in_backward_pass
  assert found["rs2-start"].op_name == (
      "jit(step)/transpose(jvp())/dot_general")
  assert found["rs2-start"].in_backward_pass
  # No op of its own nor through a relabelling: unnamed, not backward.
  assert found["ar"].op_name == "" and not found["ar"].in_backward_pass


def test_a_line_that_is_no_instruction_is_an_error():
  with pytest.raises(ValueError, match="HLO line 3"):
    hlo.Module.parse("ENTRY %main () -> f32[] {\n"
                     "  ROOT %c = f32[] constant(1)\n"
                     "  this is not HLO\n}\n")
  with pytest.raises(ValueError, match="not closed"):
    hlo.Module.parse("ENTRY %main () -> f32[] {\n"
                     "  ROOT %c = f32[] constant(1)\n")
  with pytest.raises(ValueError, match="one ENTRY"):
    _ = hlo.Module.parse("%f () -> f32[] {\n"
                         "  ROOT %c = f32[] constant(1)\n}\n").entry


# -- programs and what survival.py reads from them ---------------------------------

_HEADER = ("HloModule jit_step, is_scheduled=true, entry_computation_layout="
           "{(f32[32,64]{1,0}, f32[64,128]{1,0})->bf16[32,128]{1,0}}\n\n")

# XLA:CPU: the rounding convert is the root of the fusion that computes it.
STORED_KEPT = _HEADER + """\
%fused_computation (param_0: f32[32,128]) -> bf16[32,128] {
  %param_0 = f32[32,128]{1,0} parameter(0)
  %tanh.1 = f32[32,128]{1,0} tanh(%param_0), metadata={op_name="jit(step)/tanh" stack_frame_id=3}
  ROOT %convert.1 = bf16[32,128]{1,0} convert(%tanh.1), frontend_attributes={amp_stored="0"}, metadata={op_name="jit(step)/tanh" stack_frame_id=3}
}

ENTRY %main.4 (x.1: f32[32,64], w.1: f32[64,128]) -> bf16[32,128] {
  %x.1 = f32[32,64]{1,0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[64,128]{1,0} parameter(1), metadata={op_name="w"}
  %dot.1 = f32[32,128]{1,0} dot(%x.1, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %tanh_convert_fusion = bf16[32,128]{1,0} fusion(%dot.1), kind=kLoop, calls=%fused_computation, frontend_attributes={amp_stored="0"}, metadata={op_name="jit(step)/tanh" stack_frame_id=3}
}
"""

# The fusion outputs the rounded value transposed: a view, still a buffer.
STORED_KEPT_THROUGH_VIEWS = _HEADER + """\
%fused_computation.4 (param_0.11: f32[32,128]) -> bf16[128,32] {
  %param_0.11 = f32[32,128]{1,0} parameter(0)
  %convert.60 = bf16[32,128]{1,0} convert(%param_0.11), frontend_attributes={amp_stored="0"}
  %transpose.14 = bf16[128,32]{0,1} transpose(%convert.60), dimensions={1,0}
  %copy.4 = bf16[128,32]{1,0} copy(%transpose.14)
  ROOT %bitcast.16 = bf16[128,32]{1,0} bitcast(%copy.4)
}

ENTRY %main.4 (x.1: f32[32,64], w.1: f32[64,128]) -> bf16[128,32] {
  %x.1 = f32[32,64]{1,0} parameter(0)
  %w.1 = f32[64,128]{1,0} parameter(1)
  %dot.1 = f32[32,128]{1,0} dot(%x.1, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %bitcast_bitcast_fusion = bf16[128,32]{1,0} fusion(%dot.1), kind=kLoop, calls=%fused_computation.4
}
"""

# XLA fused the rounding into its reader: bf16 inside the fusion only.
STORED_FUSED_AWAY = _HEADER + """\
%fused_computation.1 (param_0.1: f32[32,128], param_1.1: f32[32,128]) -> f32[32,128] {
  %param_0.1 = f32[32,128]{1,0} parameter(0)
  %exp.1 = f32[32,128]{1,0} exponential(%param_0.1)
  %convert.2 = bf16[32,128]{1,0} convert(%exp.1), frontend_attributes={amp_stored="0"}
  %convert.3 = f32[32,128]{1,0} convert(%convert.2)
  %param_1.1 = f32[32,128]{1,0} parameter(1)
  ROOT %multiply.1 = f32[32,128]{1,0} multiply(%convert.3, %param_1.1)
}

ENTRY %main.4 (x.1: f32[32,64], w.1: f32[64,128]) -> f32[32,128] {
  %x.1 = f32[32,64]{1,0} parameter(0)
  %w.1 = f32[64,128]{1,0} parameter(1)
  %dot.1 = f32[32,128]{1,0} dot(%x.1, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %exp_multiply_fusion = f32[32,128]{1,0} fusion(%dot.1, %dot.1), kind=kLoop, calls=%fused_computation.1
}
"""

# Stored value 0's convert is gone with its marker; 1's marker sits on an
# f32 value (XLA folded the convert pair).
STORED_DROPPED = _HEADER + """\
ENTRY %main.4 (x.1: f32[32,64], w.1: f32[64,128]) -> f32[32,128] {
  %x.1 = f32[32,64]{1,0} parameter(0)
  %w.1 = f32[64,128]{1,0} parameter(1)
  %dot.1 = f32[32,128]{1,0} dot(%x.1, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %add.2 = f32[32,128]{1,0} add(%dot.1, %dot.1), frontend_attributes={amp_stored="1"}
}
"""

_FP8_HEADER = ("HloModule jit_step, is_scheduled=true, entry_computation_"
               "layout={(f32[16,64]{1,0}, f32[64,32]{1,0})->f32[16,32]{1,0}}"
               "\n\n")

# The FP8 dot's operands are f32 values that were never FP8.
FP8_UPCAST = _FP8_HEADER + """\
ENTRY %main.3 (a.1: f32[16,64], b.1: f32[64,32]) -> f32[16,32] {
  %a.1 = f32[16,64]{1,0} parameter(0)
  %b.1 = f32[64,32]{1,0} parameter(1)
  ROOT %dot.2 = f32[16,32]{1,0} dot(%a.1, %b.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, frontend_attributes={amp_fp8="0"}
}
"""

# XLA:CPU: no FP8 GEMM; it rounds the operands to FP8 and widens them back.
FP8_EMULATED = _FP8_HEADER + """\
%fused_computation.2 (param_0.2: f32[16,64]) -> f32[16,64] {
  %param_0.2 = f32[16,64]{1,0} parameter(0)
  %convert.5 = f8e4m3fn[16,64]{1,0} convert(%param_0.2)
  ROOT %convert.6 = f32[16,64]{1,0} convert(%convert.5), frontend_attributes={amp_fp8="0"}
}

%fused_computation.3 (param_0.3: f32[64,32]) -> f32[64,32] {
  %param_0.3 = f32[64,32]{1,0} parameter(0)
  %convert.7 = f8e4m3fn[64,32]{1,0} convert(%param_0.3)
  ROOT %convert.8 = f32[64,32]{1,0} convert(%convert.7), frontend_attributes={amp_fp8="0"}
}

ENTRY %main.3 (a.1: f32[16,64], b.1: f32[64,32]) -> f32[16,32] {
  %a.1 = f32[16,64]{1,0} parameter(0)
  %b.1 = f32[64,32]{1,0} parameter(1)
  %convert_convert_fusion = f32[16,64]{1,0} fusion(%a.1), kind=kLoop, calls=%fused_computation.2, frontend_attributes={amp_fp8="0"}
  %convert_convert_fusion.1 = f32[64,32]{1,0} fusion(%b.1), kind=kLoop, calls=%fused_computation.3, frontend_attributes={amp_fp8="0"}
  ROOT %dot.4 = f32[16,32]{1,0} dot(%convert_convert_fusion, %convert_convert_fusion.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, frontend_attributes={amp_fp8="0"}
}
"""

# XLA:GPU: the dot became a cuBLASLt FP8 GEMM (result and workspace).
FP8_CUBLASLT = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f8e4m3fn[16,64]{1,0}, f8e4m3fn[32,64]{1,0}, f32[], f32[])->bf16[16,32]{1,0}}

ENTRY %main.6 (a.1: f8e4m3fn[16,64], b.1: f8e4m3fn[32,64], a_scale.1: f32[], b_scale.1: f32[]) -> bf16[16,32] {
  %a.1 = f8e4m3fn[16,64]{1,0} parameter(0)
  %b.1 = f8e4m3fn[32,64]{1,0} parameter(1)
  %a_scale.1 = f32[] parameter(2)
  %b_scale.1 = f32[] parameter(3)
  %constant.1 = f32[] constant(1)
  %cublas-gemm.1 = (bf16[16,32]{1,0}, s8[33554432]{0}) custom-call(%a.1, %b.1, %a_scale.1, %b_scale.1, %constant.1, /*index=5*/%constant.1), custom_call_target="__cublas$lt$matmul$f8", frontend_attributes={amp_fp8="0"}, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"alpha_imag":0,"precision_config":{"operand_precision":["DEFAULT","DEFAULT"],"algorithm":"ALG_UNSET"},"epilogue":"DEFAULT","damax_output":false,"lhs_stride":"1024","rhs_stride":"2048","grad_x":false,"grad_y":false},"force_earliest_schedule":false}
  ROOT %get-tuple-element.1 = bf16[16,32]{1,0} get-tuple-element(%cublas-gemm.1), index=0
}
"""

# XLA:GPU: the xla.scaled_dot composite became a block-scaled GEMM (a
# scaled-dot in a Triton GEMM fusion) that keeps no marker; the lhs's E8M0
# scale, made by another fusion, carries it into the GEMM.
FP8_BLOCK_SCALED = """\
HloModule jit_step, entry_computation_layout={(f8e4m3fn[16,64]{1,0}, f8e4m3fn[32,64]{1,0}, f32[16,2]{1,0}, f8e8m0fnu[32,2]{1,0})->f32[16,32]{1,0}}

%scale_computation (param_0: f32[16,2]) -> f8e8m0fnu[16,2] {
  %param_0 = f32[16,2]{1,0} parameter(0)
  ROOT %convert.1 = f8e8m0fnu[16,2]{1,0} convert(%param_0), frontend_attributes={amp_fp8="0"}
}

%gemm_computation (parameter_0: f8e4m3fn[16,64], parameter_1: f8e4m3fn[32,64], parameter_2: f8e8m0fnu[16,2], parameter_3: f8e8m0fnu[32,2]) -> f32[16,32] {
  %parameter_0 = f8e4m3fn[16,64]{1,0} parameter(0)
  %parameter_1 = f8e4m3fn[32,64]{1,0} parameter(1)
  %parameter_2 = f8e8m0fnu[16,2]{1,0} parameter(2)
  %parameter_3 = f8e8m0fnu[32,2]{1,0} parameter(3)
  ROOT %scaled-dot.1 = f32[16,32]{1,0} scaled-dot(%parameter_0, %parameter_1, %parameter_2, %parameter_3), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %main.7 (a.1: f8e4m3fn[16,64], b.1: f8e4m3fn[32,64], s.1: f32[16,2], t.1: f8e8m0fnu[32,2]) -> f32[16,32] {
  %a.1 = f8e4m3fn[16,64]{1,0} parameter(0)
  %b.1 = f8e4m3fn[32,64]{1,0} parameter(1)
  %s.1 = f32[16,2]{1,0} parameter(2)
  %t.1 = f8e8m0fnu[32,2]{1,0} parameter(3)
  %scale_fusion = f8e8m0fnu[16,2]{1,0} fusion(%s.1), kind=kLoop, calls=%scale_computation
  ROOT %gemm_fusion = f32[16,32]{1,0} fusion(%a.1, %b.1, %scale_fusion, %t.1), kind=kCustom, calls=%gemm_computation
}
"""

# The same scale read by no block-scaled GEMM: the decision did not survive
# as one.
FP8_BLOCK_SCALE_UNREAD = FP8_BLOCK_SCALED.replace(
    "scaled-dot(%parameter_0, %parameter_1, %parameter_2, %parameter_3), "
    "lhs_contracting_dims={1}, rhs_contracting_dims={1}",
    "add(%parameter_0, %parameter_0)").replace(
        "ROOT %scaled-dot.1 = f32[16,32]{1,0}",
        "ROOT %scaled-dot.1 = f8e4m3fn[16,64]{1,0}")

# MXFP8 dequantized (XLA:CPU): the marked lhs is FP8 codes widened, times
# their scales, into a dot.
FP8_DEQUANTIZED = _FP8_HEADER + """\
%fused_computation.9 (param_0.9: f8e4m3fn[16,64], param_1.9: f32[16,64]) -> f32[16,64] {
  %param_0.9 = f8e4m3fn[16,64]{1,0} parameter(0)
  %param_1.9 = f32[16,64]{1,0} parameter(1)
  %convert.9 = f32[16,64]{1,0} convert(%param_0.9)
  ROOT %multiply.9 = f32[16,64]{1,0} multiply(%convert.9, %param_1.9), frontend_attributes={amp_fp8="0"}
}

ENTRY %main.9 (a.1: f8e4m3fn[16,64], s.1: f32[16,64], b.1: f32[64,32]) -> f32[16,32] {
  %a.1 = f8e4m3fn[16,64]{1,0} parameter(0)
  %s.1 = f32[16,64]{1,0} parameter(1)
  %b.1 = f32[64,32]{1,0} parameter(2)
  %dequantize_fusion = f32[16,64]{1,0} fusion(%a.1, %s.1), kind=kLoop, calls=%fused_computation.9
  ROOT %dot.9 = f32[16,32]{1,0} dot(%dequantize_fusion, %b.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

_TRITON_CONFIG = ('backend_config={"operation_queue_id":"0","wait_on_operation'
                  '_queues":[],"fusion_backend_config":{"kind":"__triton_gemm",'
                  '"triton_gemm_config":{"block_m":"16","block_n":"32","block_k"'
                  ':"64","split_k":"SPLIT","num_stages":"1","num_warps":"4",'
                  '"num_ctas":"1"}},"force_earliest_schedule":false}')

# XLA:GPU: a Triton GEMM fusion whose dot reads FP8 parameters.
FP8_TRITON = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f8e4m3fn[16,64]{1,0}, f8e5m2[64,32]{1,0})->bf16[16,32]{1,0}}

%gemm_fusion_dot.1_computation (parameter_0: f8e4m3fn[16,64], parameter_1: f8e5m2[64,32]) -> bf16[16,32] {
  %parameter_0 = f8e4m3fn[16,64]{1,0} parameter(0)
  %parameter_1 = f8e5m2[64,32]{1,0} parameter(1)
  %dot.5 = f32[16,32]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, frontend_attributes={amp_fp8="0"}
  ROOT %convert.9 = bf16[16,32]{1,0} convert(%dot.5)
}

ENTRY %main.7 (a.1: f8e4m3fn[16,64], b.1: f8e5m2[64,32]) -> bf16[16,32] {
  %a.1 = f8e4m3fn[16,64]{1,0} parameter(0)
  %b.1 = f8e5m2[64,32]{1,0} parameter(1)
  ROOT %gemm_fusion_dot.1 = bf16[16,32]{1,0} fusion(%a.1, %b.1), kind=kCustom, calls=%gemm_fusion_dot.1_computation, frontend_attributes={amp_fp8="0"}, CONFIG
}
""".replace("CONFIG", _TRITON_CONFIG.replace("SPLIT", "1"))

# XLA:GPU split-K: the Triton GEMM writes partial products, a reduce adds
# them up and carries the dot's marker.
FP8_TRITON_SPLIT_K = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f8e4m3fn[4,16,16]{2,1,0}, f8e4m3fn[4,16,32]{2,1,0})->f32[16,32]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%gemm_fusion_dot.2_computation (parameter_0.1: f8e4m3fn[4,16,16], parameter_1.1: f8e4m3fn[4,16,32]) -> f32[4,16,32] {
  %parameter_0.1 = f8e4m3fn[4,16,16]{2,1,0} parameter(0)
  %parameter_1.1 = f8e4m3fn[4,16,32]{2,1,0} parameter(1)
  ROOT %dot.6 = f32[4,16,32]{2,1,0} dot(%parameter_0.1, %parameter_1.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

ENTRY %main.8 (a.1: f8e4m3fn[4,16,16], b.1: f8e4m3fn[4,16,32]) -> f32[16,32] {
  %a.1 = f8e4m3fn[4,16,16]{2,1,0} parameter(0)
  %b.1 = f8e4m3fn[4,16,32]{2,1,0} parameter(1)
  %gemm_fusion_dot.2 = f32[4,16,32]{2,1,0} fusion(%a.1, %b.1), kind=kCustom, calls=%gemm_fusion_dot.2_computation, CONFIG
  %constant.2 = f32[] constant(0)
  ROOT %reduce.1 = f32[16,32]{1,0} reduce(%gemm_fusion_dot.2, %constant.2), dimensions={0}, to_apply=%add, frontend_attributes={amp_fp8="0"}
}
""".replace("CONFIG", _TRITON_CONFIG.replace("SPLIT", "4"))

_SPMD_HEADER = ("HloModule jit_step, is_scheduled=true, entry_computation_"
                "layout={(f32[4,128]{1,0}, f32[128,512]{1,0})->bf16[32,512]"
                "{1,0}}, num_partitions=8\n\n")

_SPMD_ROUNDING = """\
%fused_computation (param_0: f32[4,512]) -> bf16[4,512] {
  %param_0 = f32[4,512]{1,0} parameter(0)
  %tanh.1 = f32[4,512]{1,0} tanh(%param_0)
  ROOT %convert.1 = bf16[4,512]{1,0} convert(%tanh.1), frontend_attributes={amp_stored="0"}
}

"""

# XLA:GPU on 8 devices: each device rounds its [4,512] part and the bf16
# parts are all-gathered. XLA put stored value 1's marker on the async
# all-gather (a tuple of operand and result) and 2's on a layout copy.
SPMD_ALL_GATHERED = _SPMD_HEADER + _SPMD_ROUNDING + """\
ENTRY %main.5_spmd (param: f32[4,128], param.1: f32[128,512]) -> bf16[32,512] {
  %param = f32[4,128]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}, metadata={op_name="x"}
  %param.1 = f32[128,512]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w"}
  %dot.1 = f32[4,512]{1,0} dot(%param, %param.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %tanh_convert_fusion = bf16[4,512]{1,0} fusion(%dot.1), kind=kLoop, calls=%fused_computation, frontend_attributes={amp_stored="0"}
  %all-gather-start = (bf16[4,512]{1,0}, bf16[32,512]{1,0}) all-gather-start(%tanh_convert_fusion), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, frontend_attributes={amp_stored="1"}, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"collective_backend_config":{"is_sync":false,"no_parallel_custom_call":false,"is_pipelined":false},"force_earliest_schedule":false}
  %all-gather-done = bf16[32,512]{1,0} all-gather-done(%all-gather-start)
  ROOT %copy.1 = bf16[32,512]{0,1} copy(%all-gather-done), frontend_attributes={amp_stored="2"}
}
"""

_SPMD_WIDENING = """\
%fused_computation (param_0: f32[4,512]) -> f32[1,4,512] {
  %param_0 = f32[4,512]{1,0} parameter(0)
  %tanh.1 = f32[4,512]{1,0} tanh(%param_0)
  %convert.1 = bf16[4,512]{1,0} convert(%tanh.1), frontend_attributes={amp_stored="0"}
  %bitcast.1 = bf16[1,4,512]{2,1,0} bitcast(%convert.1)
  ROOT %convert.2 = f32[1,4,512]{2,1,0} convert(%bitcast.1)
}

%fused_computation.1 (param_0.1: f32[8,4,512]) -> bf16[32,512] {
  %param_0.1 = f32[8,4,512]{2,1,0} parameter(0)
  %copy.2 = f32[8,4,512]{2,1,0} copy(%param_0.1)
  %convert.3 = bf16[8,4,512]{2,1,0} convert(%copy.2)
  ROOT %bitcast.2 = bf16[32,512]{1,0} bitcast(%convert.3)
}

%fused_computation.2 (param_0.2: f32[8,4,512]) -> f32[32,512] {
  %param_0.2 = f32[8,4,512]{2,1,0} parameter(0)
  %bitcast.3 = f32[32,512]{1,0} bitcast(%param_0.2)
  ROOT %multiply.1 = f32[32,512]{1,0} multiply(%bitcast.3, %bitcast.3)
}

"""

_SPMD_WIDENED_ENTRY = """\
ENTRY %main.5_spmd (param: f32[4,128], param.1: f32[128,512]) -> bf16[32,512] {
  %param = f32[4,128]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %param.1 = f32[128,512]{1,0} parameter(1), sharding={replicated}
  %dot.1 = f32[4,512]{1,0} dot(%param, %param.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %tanh_convert_fusion = f32[1,4,512]{2,1,0} fusion(%dot.1), kind=kLoop, calls=%fused_computation
  %all-gather = f32[8,4,512]{2,1,0} all-gather(%tanh_convert_fusion), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  ROOT %READER
}
"""

# XLA:CPU moves bf16 between devices in f32: it widens the rounded part,
# all-gathers it and narrows the result back to the bf16 value the program
# reads.
SPMD_WIDENED_FOR_ALL_GATHER = (
    _SPMD_HEADER + _SPMD_WIDENING + _SPMD_WIDENED_ENTRY.replace(
        "%READER", "convert_bitcast_fusion = bf16[32,512]{1,0} "
        "fusion(%all-gather), kind=kLoop, calls=%fused_computation.1"))

# The same, but the gathered value is read in f32: no bf16 buffer is left.
SPMD_WIDENED_AND_KEPT_WIDE = (
    _SPMD_HEADER + _SPMD_WIDENING + _SPMD_WIDENED_ENTRY.replace(
        "%READER", "multiply_fusion = f32[32,512]{1,0} "
        "fusion(%all-gather), kind=kLoop, calls=%fused_computation.2"))

# XLA:GPU on 8 devices: every collective kind, synchronous, asynchronous
# (native -start/-done, the generic async-start and its printed sugar), in
# a loop body and fused. Stored value 0 is rounded and all-gathered.
SPMD_COLLECTIVES = """\
HloModule jit_train_step, is_scheduled=true, entry_computation_layout={(f32[16,64]{1,0}, f32[256,64]{1,0}, f32[8,128]{1,0}, bf16[64,64]{1,0}, f32[8,8,64]{2,1,0})->(bf16[128,64]{1,0}, f32[64,128]{1,0}, f32[32,64]{1,0}, (s32[], bf16[16,64]{1,0}))}, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%add.bf16 (x.1: bf16[], y.1: bf16[]) -> bf16[] {
  %x.1 = bf16[] parameter(0)
  %y.1 = bf16[] parameter(1)
  ROOT %add.2 = bf16[] add(%x.1, %y.1)
}

%async_computation (param_0: f32[256,64]) -> f32[32,64] {
  %param_0 = f32[256,64]{1,0} parameter(0)
  ROOT %reduce-scatter.1 = f32[32,64]{1,0} reduce-scatter(%param_0), channel_id=4, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
}

%body (loop_state: (s32[], bf16[16,64])) -> (s32[], bf16[16,64]) {
  %loop_state = (s32[], bf16[16,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%loop_state), index=0
  %x.2 = bf16[16,64]{1,0} get-tuple-element(%loop_state), index=1
  %collective-permute-start = (bf16[16,64]{1,0}, bf16[16,64]{1,0}, u32[], u32[]) collective-permute-start(%x.2), channel_id=6, source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}
  %collective-permute-done = bf16[16,64]{1,0} collective-permute-done(%collective-permute-start)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %tuple.2 = (s32[], bf16[16,64]{1,0}) tuple(%next, %collective-permute-done)
}

%condition (loop_state.1: (s32[], bf16[16,64])) -> pred[] {
  %loop_state.1 = (s32[], bf16[16,64]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%loop_state.1), index=0
  %limit = s32[] constant(4)
  ROOT %compare = pred[] compare(%i.1, %limit), direction=LT
}

%fused_computation (param_0.2: f32[16,64]) -> bf16[16,64] {
  %param_0.2 = f32[16,64]{1,0} parameter(0)
  ROOT %convert.1 = bf16[16,64]{1,0} convert(%param_0.2), frontend_attributes={amp_stored="0"}
}

%dynamic-slice-fusion (p0.3: f32[8,8,64], p1.3: u32[]) -> f32[1,64] {
  %p0.3 = f32[8,8,64]{2,1,0} parameter(0)
  %p1.3 = u32[] parameter(1)
  %zero = u32[] constant(0)
  %slice.9 = f32[1,8,64]{2,1,0} dynamic-slice(%p0.3, %p1.3, %zero, %zero), dynamic_slice_sizes={1,8,64}
  %bitcast.9 = f32[8,64]{1,0} bitcast(%slice.9)
  ROOT %reduce-scatter.3 = f32[1,64]{1,0} reduce-scatter(%bitcast.9), channel_id=8, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
}

ENTRY %main.9_spmd (param: f32[16,64], param.1: f32[256,64], param.2: f32[8,128], param.3: bf16[64,64], param.4: f32[8,8,64]) -> (bf16[128,64], f32[64,128], f32[32,64], (s32[], bf16[16,64])) {
  %param = f32[16,64]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %param.1 = f32[256,64]{1,0} parameter(1), sharding={replicated}
  %param.2 = f32[8,128]{1,0} parameter(2), sharding={devices=[8,1]<=[8]}
  %param.3 = bf16[64,64]{1,0} parameter(3), sharding={replicated}
  %param.4 = f32[8,8,64]{2,1,0} parameter(4), sharding={replicated}
  %partition-id = u32[] partition-id()
  %convert_fusion = bf16[16,64]{1,0} fusion(%param), kind=kLoop, calls=%fused_computation, frontend_attributes={amp_stored="0"}
  %all-gather = bf16[128,64]{1,0} all-gather(%convert_fusion), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %all-gather-start = (f32[8,128]{1,0}, f32[64,128]{1,0}) all-gather-start(%param.2), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"collective_backend_config":{"is_sync":false,"no_parallel_custom_call":false,"is_pipelined":false},"force_earliest_schedule":false}
  %all-gather-done = f32[64,128]{1,0} all-gather-done(%all-gather-start)
  %all-reduce-start = f32[256,64]{1,0} all-reduce-start(%param.1), channel_id=3, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"collective_backend_config":{"is_sync":true,"no_parallel_custom_call":false,"is_pipelined":false},"force_earliest_schedule":false}
  %all-reduce-done = f32[256,64]{1,0} all-reduce-done(%all-reduce-start)
  %reduce-scatter-start = ((f32[256,64]{1,0}), f32[32,64]{1,0}) async-start(%all-reduce-done), calls=%async_computation
  %reduce-scatter-done = f32[32,64]{1,0} async-done(%reduce-scatter-start)
  %reduce-scatter.2 = f32[2,64]{1,0} reduce-scatter(%param), channel_id=5, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
  %reduce-scatter-start.1 = ((bf16[64,64]{1,0}), bf16[8,64]{1,0}) reduce-scatter-start(%param.3), channel_id=9, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add.bf16
  %reduce-scatter-done.1 = bf16[8,64]{1,0} reduce-scatter-done(%reduce-scatter-start.1)
  %address-computation = f32[1,64]{1,0} fusion(%param.4, %partition-id), kind=kCustom, calls=%dynamic-slice-fusion, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"dynamic_address_computation"}},"force_earliest_schedule":false}
  %all-to-all.1 = bf16[16,64]{1,0} all-to-all(%convert_fusion), channel_id=7, replica_groups=[1,8]<=[8], dimensions={0}
  %slice.0 = f32[1,128]{1,0} slice(%param.2), slice={[0:1], [0:128]}
  %slice.1 = f32[1,128]{1,0} slice(%param.2), slice={[1:2], [0:128]}
  %slice.2 = f32[1,128]{1,0} slice(%param.2), slice={[2:3], [0:128]}
  %slice.3 = f32[1,128]{1,0} slice(%param.2), slice={[3:4], [0:128]}
  %slice.4 = f32[1,128]{1,0} slice(%param.2), slice={[4:5], [0:128]}
  %slice.5 = f32[1,128]{1,0} slice(%param.2), slice={[5:6], [0:128]}
  %slice.6 = f32[1,128]{1,0} slice(%param.2), slice={[6:7], [0:128]}
  %slice.7 = f32[1,128]{1,0} slice(%param.2), slice={[7:8], [0:128]}
  %all-to-all.2 = (f32[1,128]{1,0}, f32[1,128]{1,0}, f32[1,128]{1,0}, f32[1,128]{1,0}, f32[1,128]{1,0}, /*index=5*/f32[1,128]{1,0}, f32[1,128]{1,0}, f32[1,128]{1,0}) all-to-all(%slice.0, %slice.1, %slice.2, %slice.3, %slice.4, /*index=5*/%slice.5, %slice.6, %slice.7), channel_id=10, replica_groups={{0,1,2,3,4,5,6,7}}
  %zero.1 = s32[] constant(0)
  %tuple.1 = (s32[], bf16[16,64]{1,0}) tuple(%zero.1, %convert_fusion)
  %while = (s32[], bf16[16,64]{1,0}) while(%tuple.1), condition=%condition, body=%body
  ROOT %tuple.3 = (bf16[128,64]{1,0}, f32[64,128]{1,0}, f32[32,64]{1,0}, (s32[], bf16[16,64]{1,0})) tuple(%all-gather, %all-gather-done, %reduce-scatter-done, %while)
}
"""

# Bytes per device of each collective of SPMD_COLLECTIVES: an all-gather
# its result, the others their operands.
SPMD_COLLECTIVE_BYTES = {
    ("all-gather", "bf16"): 128 * 64 * 2,
    ("all-gather", "f32"): 64 * 128 * 4,
    ("all-reduce", "f32"): 256 * 64 * 4,
    ("reduce-scatter", "f32"): 256 * 64 * 4 + 16 * 64 * 4 + 8 * 64 * 4,
    ("reduce-scatter", "bf16"): 64 * 64 * 2,
    ("all-to-all", "bf16"): 16 * 64 * 2,
    ("all-to-all", "f32"): 8 * 128 * 4,
    ("collective-permute", "bf16"): 16 * 64 * 2,
}


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  text: str
  stored: dict[int, str]
  fp8: dict[int, str]


CASES = [
    Case("stored-kept", STORED_KEPT, {0: KEPT}, {}),
    Case("stored-kept-through-views", STORED_KEPT_THROUGH_VIEWS, {0: KEPT},
         {}),
    Case("stored-fused-away", STORED_FUSED_AWAY, {0: FUSED_AWAY}, {}),
    Case("stored-dropped", STORED_DROPPED, {0: DROPPED, 1: DROPPED}, {}),
    Case("fp8-upcast", FP8_UPCAST, {}, {0: UPCAST}),
    Case("fp8-emulated", FP8_EMULATED, {}, {0: EMULATED}),
    Case("fp8-cublaslt", FP8_CUBLASLT, {}, {0: FP8_GEMM}),
    Case("fp8-triton", FP8_TRITON, {}, {0: FP8_GEMM}),
    Case("fp8-triton-split-k", FP8_TRITON_SPLIT_K, {}, {0: FP8_GEMM}),
    Case("fp8-block-scaled", FP8_BLOCK_SCALED, {}, {0: FP8_GEMM}),
    Case("fp8-block-scale-unread", FP8_BLOCK_SCALE_UNREAD, {}, {0: UPCAST}),
    Case("fp8-dequantized", FP8_DEQUANTIZED, {}, {0: EMULATED}),
    Case("spmd-all-gathered", SPMD_ALL_GATHERED,
         {0: KEPT, 1: KEPT, 2: KEPT}, {}),
    Case("spmd-widened-for-all-gather", SPMD_WIDENED_FOR_ALL_GATHER,
         {0: KEPT}, {}),
    Case("spmd-widened-and-kept-wide", SPMD_WIDENED_AND_KEPT_WIDE,
         {0: FUSED_AWAY}, {}),
    Case("spmd-collectives", SPMD_COLLECTIVES, {0: KEPT}, {}),
]


def _mismatches() -> list[str]:
  """The cases `survival.read` (looked up now) gets wrong."""
  wrong = []
  for case in CASES:
    found = survival.read(_program(case.text), stored=case.stored,
                          fp8=case.fp8)
    if (dict(found.stored), dict(found.fp8)) != (case.stored, case.fp8):
      wrong.append(case.name)
  return wrong


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_decision_gets_its_status(case):
  found = survival.read(_program(case.text), stored=case.stored, fp8=case.fp8)
  assert dict(found.stored) == case.stored
  assert dict(found.fp8) == case.fp8


def test_the_cases_expect_every_status():
  expected = {status for case in CASES
              for status in [*case.stored.values(), *case.fp8.values()]}
  assert expected == {KEPT, FUSED_AWAY, DROPPED, FP8_GEMM, EMULATED, UPCAST}


@pytest.mark.parametrize("status", [KEPT, FUSED_AWAY, DROPPED, FP8_GEMM,
                                    EMULATED, UPCAST])
def test_a_reader_that_says_one_status_fails_the_cases(monkeypatch, status):
  assert _mismatches() == []

  def constant(hlo_text, stored=(), fp8=()):
    del hlo_text
    return survival.Survival({i: status for i in stored},
                             {i: status for i in fp8})

  monkeypatch.setattr(survival, "read", constant)
  assert _mismatches(), f"a reader that always says {status!r} passes"


def test_the_spmd_cases_need_the_spmd_reading(monkeypatch):
  """Read as before SPMD programs were (a value is its shape's first array;
  a value fused away is gone even if a collective moves it widened), two
  stored values that survive would be lost."""
  monkeypatch.setattr(survival, "_is_low",
                      lambda ins: ins.shape.dtype in hlo.LOW_FLOATS)
  monkeypatch.setattr(survival._Program, "moved_widened",
                      lambda *args: False)
  assert _mismatches() == ["spmd-all-gathered",
                           "spmd-widened-for-all-gather"]


# -- collectives, kernels, calls ---------------------------------------------------


def test_collective_bytes_by_kind_and_dtype():
  module = hlo.Module.parse(SPMD_COLLECTIVES)
  assert module.collective_bytes() == SPMD_COLLECTIVE_BYTES


def test_each_collective_once_where_it_runs():
  collectives = hlo.Module.parse(SPMD_COLLECTIVES).collectives()
  found = sorted((c.instruction.name, c.computation.name, c.kind,
                  c.asynchronous, c.dtypes, c.nbytes) for c in collectives)
  assert found == sorted([
      ("all-gather", "main.9_spmd", "all-gather", False, ("bf16",), 16384),
      ("all-gather-start", "main.9_spmd", "all-gather", True, ("f32",),
       32768),
      ("all-reduce-start", "main.9_spmd", "all-reduce", True, ("f32",),
       65536),
      ("reduce-scatter.1", "async_computation", "reduce-scatter", False,
       ("f32",), 65536),
      ("reduce-scatter.2", "main.9_spmd", "reduce-scatter", False, ("f32",),
       4096),
      ("reduce-scatter-start.1", "main.9_spmd", "reduce-scatter", True,
       ("bf16",), 8192),
      ("reduce-scatter.3", "dynamic-slice-fusion", "reduce-scatter", False,
       ("f32",), 2048),
      ("all-to-all.1", "main.9_spmd", "all-to-all", False, ("bf16",), 2048),
      ("all-to-all.2", "main.9_spmd", "all-to-all", False, ("f32",), 4096),
      ("collective-permute-start", "body", "collective-permute", True,
       ("bf16",), 2048),
  ])


def test_reachable_computations_follow_every_call():
  module = hlo.Module.parse(SPMD_COLLECTIVES)
  assert {c.name for c in module.reachable()} == set(module.computations)
  assert {c.name for c in module.reachable(["body"])} == {"body"}
  assert {c.name for c in module.reachable(["async_computation"])} == {
      "async_computation", "add"}


def test_fusion_bodies_and_their_kinds():
  module = hlo.Module.parse(_program(FP8_TRITON))
  assert module.fusion_kind("gemm_fusion_dot.1_computation") == (
      "__triton_gemm")
  assert module.fusion_kind("main.7") is None
  [(caller, fusion)] = module.fusion_callers["gemm_fusion_dot.1_computation"]
  assert (caller.name, fusion.name) == ("main.7", "gemm_fusion_dot.1")
  assert hlo.Module.parse(STORED_KEPT).fusion_kind("fused_computation") == ""


def test_computations_entry_root_and_lookup():
  module = hlo.Module.parse(STORED_KEPT)
  assert module.name == "jit_step"
  assert list(module.computations) == ["fused_computation", "main.4"]
  entry = module.entry
  assert entry.entry and entry.name == "main.4"
  assert entry.root.name == "tanh_convert_fusion"
  assert entry.get("dot.1").operands == ("x.1", "w.1")
  assert entry.get("nothing") is None
  assert [s.text for s in entry.operand_shapes(entry.get("dot.1"))] == [
      "f32[32,64]{1,0}", "f32[64,128]{1,0}"]
  assert [u.name for u in entry.users["dot.1"]] == ["tanh_convert_fusion"]


KERNELS = """\
HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %negate.1 = f32[8]{0} negate(%param_0)
}

ENTRY %main.2 (p.1: f32[8]) -> f32[8] {
  %p.1 = f32[8]{0} parameter(0)
  %c.1 = f32[] constant(2)
  %bitcast.1 = f32[2,4]{1,0} bitcast(%p.1)
  %copy.1 = f32[2,4]{0,1} copy(%bitcast.1)
  %fusion.1 = f32[8]{0} fusion(%p.1), kind=kLoop, calls=%fused_computation
  %custom-call.1 = f32[8]{0} custom-call(%fusion.1), custom_call_target="Sharding"
  %gemm.1 = (f32[8]{0}, s8[64]{0}) custom-call(%fusion.1), custom_call_target="__cublas$gemm"
  %get-tuple-element.1 = f32[8]{0} get-tuple-element(%gemm.1), index=0
  %tuple.1 = (f32[8]{0}, f32[]) tuple(%get-tuple-element.1, %c.1)
  %opt-barrier.1 = (f32[8]{0}, f32[]) opt-barrier(%tuple.1)
  ROOT %add.1 = f32[8]{0} add(%get-tuple-element.1, %fusion.1)
}
"""


def test_kernels_count_every_entry_instruction_that_launches_work():
  # copy, fusion, the array custom call, the GEMM call (a tuple of its
  # result and workspace) and add; not the parameter, constant, bitcast,
  # get-tuple-element, tuple nor opt-barrier.
  assert hlo.Module.parse(KERNELS).kernels() == 5


KERNEL_KINDS = """\
HloModule jit_step, entry_computation_layout={(f32[8,8]{1,0})->f32[8,8]{1,0}}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %maximum.1 = f32[] maximum(%a, %b)
}

%amax_computation (param_0: f32[8,8]) -> f32[8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  %abs.1 = f32[8,8]{1,0} abs(%param_0)
  %zero = f32[] constant(0)
  ROOT %reduce.1 = f32[8]{0} reduce(%abs.1, %zero), dimensions={1}, to_apply=%max
}

%quantize_computation (param_0: f32[8,8]) -> f8e4m3fn[8,8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  ROOT %convert.1 = f8e4m3fn[8,8]{1,0} convert(%param_0)
}

%gemm_computation (param_0: f8e4m3fn[8,8], param_1: f8e4m3fn[8,8]) -> f32[8,8] {
  %param_0 = f8e4m3fn[8,8]{1,0} parameter(0)
  %param_1 = f8e4m3fn[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,8]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%scale_computation (param_0: f32[8,8], param_1: f32[8]) -> f32[8,8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  %param_1 = f32[8]{0} parameter(1)
  %broadcast.1 = f32[8,8]{1,0} broadcast(%param_1), dimensions={0}
  ROOT %multiply.1 = f32[8,8]{1,0} multiply(%param_0, %broadcast.1)
}

ENTRY %main.2 (p.1: f32[8,8]) -> f32[8,8] {
  %p.1 = f32[8,8]{1,0} parameter(0)
  %amax.1 = f32[8]{0} fusion(%p.1), kind=kInput, calls=%amax_computation
  %quantize.1 = f8e4m3fn[8,8]{1,0} fusion(%p.1), kind=kLoop, calls=%quantize_computation
  %gemm.1 = f32[8,8]{1,0} fusion(%quantize.1, %quantize.1), kind=kCustom, calls=%gemm_computation
  ROOT %scale.1 = f32[8,8]{1,0} fusion(%gemm.1, %amax.1), kind=kLoop, calls=%scale_computation
}
"""


def test_kernel_kinds_tell_gemms_fp8_quantization_and_the_rest_apart():
  assert hlo.Module.parse(KERNEL_KINDS).kernel_kinds() == {
      "gemm": 1, "fp8_quantize": 2, "other": 1}
  # The GEMM call of KERNELS returns a tuple: a kernel all the same.
  assert hlo.Module.parse(KERNELS).kernel_kinds() == {
      "gemm": 1, "fp8_quantize": 0, "other": 4}


def test_reads_what_xla_cpu_prints():
  compiled = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(0)).lower(
      jnp.ones((8, 16)), jnp.ones((16, 32))).compile()
  module = hlo.Module.parse(compiled.as_text())
  assert module.entry.root is not None
  assert module.entry.root.shape.dims == (32,)
  dots = [ins for c in module.reachable() for ins in c.instructions
          if ins.opcode == "dot"]
  assert len(dots) == 1
  assert module.collectives() == ()
  assert module.kernels() >= 1


# The step estimate: each kernel priced at max(flops / peak, bytes /
# bandwidth) + launch on a roofline with round figures.
ROOFLINE = hlo.Roofline(
    device="test", matrix_flops={"f8": 4e12, "bf16": 2e12, "f32": 1e12,
                                 "f64": 0.5e12},
    hbm_bytes_per_second=1e9, interconnect_bytes_per_second=1e8,
    launch_seconds=1e-6)

ESTIMATE = """\
HloModule jit_step

%gemm_body (p0: bf16[64,32], p1: bf16[32,128]) -> bf16[64,128] {
  %p0 = bf16[64,32]{1,0} parameter(0)
  %p1 = bf16[32,128]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%two_outputs (q0: f32[1024]) -> (f32[1024], bf16[1024]) {
  %q0 = f32[1024]{0} parameter(0)
  %neg = f32[1024]{0} negate(%q0)
  %cvt = bf16[1024]{0} convert(%q0)
  ROOT %t = (f32[1024]{0}, bf16[1024]{0}) tuple(%neg, %cvt)
}

%sliced (r0: f32[1000,10], r1: f32[10]) -> f32[10,10] {
  %r0 = f32[1000,10]{1,0} parameter(0)
  %r1 = f32[10]{0} parameter(1)
  %s = f32[10,10]{1,0} slice(%r0), slice={[0:10], [0:10]}
  %b = f32[10,10]{1,0} broadcast(%r1), dimensions={1}
  ROOT %a = f32[10,10]{1,0} add(%s, %b)
}

ENTRY %main (a: bf16[64,32], w: bf16[32,128], x: f32[1024], big: f32[1000,10], v: f32[10], l: f32[256,512], r: f32[512,64]) -> f32[10,10] {
  %a = bf16[64,32]{1,0} parameter(0)
  %w = bf16[32,128]{1,0} parameter(1)
  %x = f32[1024]{0} parameter(2)
  %big = f32[1000,10]{1,0} parameter(3)
  %v = f32[10]{0} parameter(4)
  %l = f32[256,512]{1,0} parameter(5)
  %r = f32[512,64]{1,0} parameter(6)
  %gemm = bf16[64,128]{1,0} fusion(%a, %w), kind=kCustom, calls=%gemm_body, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %multi = (f32[1024]{0}, bf16[1024]{0}) fusion(%x), kind=kLoop, calls=%two_outputs
  %cublas = (f32[256,64]{1,0}, s8[4194304]{0}) custom-call(f32[256,512]{1,0} %l, f32[512,64]{1,0} %r), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %slice_add = f32[10,10]{1,0} fusion(%big, %v), kind=kLoop, calls=%sliced
}
"""


def _kernel(module, name):
  return next(k for k in module.device_kernels()
              if k.instruction.name == name)


def test_a_dots_flops_are_2mnk_at_its_operands_peak():
  module = hlo.Module.parse(ESTIMATE)
  gemm = _kernel(module, "gemm")
  assert gemm.kind == "gemm"
  assert gemm.flops == {"bf16": 2 * 64 * 128 * 32}
  assert gemm.bytes_read == 2 * (64 * 32 + 32 * 128)
  assert gemm.bytes_written == 2 * 64 * 128
  # Memory-bound on these figures: bytes / bandwidth, plus the launch.
  assert ROOFLINE.kernel_seconds(gemm) == pytest.approx(
      (gemm.bytes_read + gemm.bytes_written) / 1e9 + 1e-6)


def test_a_multi_output_fusion_is_one_kernel_that_writes_every_output():
  module = hlo.Module.parse(ESTIMATE)
  multi = _kernel(module, "multi")
  assert multi.kind == "other" and multi.launches == 1
  assert multi.bytes_read == 4 * 1024
  assert multi.bytes_written == 4 * 1024 + 2 * 1024


def test_a_cublas_call_is_a_gemm_priced_without_its_workspace():
  module = hlo.Module.parse(ESTIMATE)
  cublas = _kernel(module, "cublas")
  assert cublas.kind == "gemm"
  assert cublas.flops == {"f32": 2 * 256 * 64 * 512}
  assert cublas.bytes_read == 4 * (256 * 512 + 512 * 64)
  assert cublas.bytes_written == 4 * 256 * 64        # no s8 workspace
  compute = 2 * 256 * 64 * 512 / 1e12
  assert ROOFLINE.kernel_seconds(cublas) == pytest.approx(
      max(compute, cublas.hbm_bytes / 1e9) + 1e-6)


def test_an_operand_read_only_through_slices_counts_what_is_read():
  module = hlo.Module.parse(ESTIMATE)
  sliced = _kernel(module, "slice_add")
  assert sliced.bytes_read == 4 * 10 * 10 + 4 * 10   # not 4 * 1000 * 10
  assert sliced.bytes_written == 4 * 10 * 10


def test_the_estimate_sums_the_kernels_and_prices_collectives_apart():
  module = hlo.Module.parse(ESTIMATE)
  estimate = hlo.estimate(module, ROOFLINE)
  kernels = module.device_kernels()
  assert estimate.kernels == 4 == module.kernels()
  assert estimate.compute_seconds == pytest.approx(
      sum(ROOFLINE.kernel_seconds(k) for k in kernels))
  assert estimate.hbm_bytes == sum(k.hbm_bytes for k in kernels)
  assert estimate.flops == {"bf16": 2 * 64 * 128 * 32,
                            "f32": 2 * 256 * 64 * 512}
  assert estimate.collective_seconds == 0
  assert estimate.seconds == estimate.compute_seconds
  collective = ESTIMATE.replace(
      "  ROOT %slice_add",
      "  %ag = f32[8000]{0} all-gather(%x), dimensions={0}, "
      "replica_groups={{0,1,2,3,4,5,6,7}}\n  ROOT %slice_add")
  sharded = hlo.estimate(hlo.Module.parse(collective), ROOFLINE)
  assert sharded.kernels == 4
  assert sharded.collective_bytes == 4 * 8000
  assert sharded.collective_seconds == pytest.approx(4 * 8000 / 1e8 + 1e-6)


def test_a_loops_kernels_run_once_per_known_trip():
  loop = """\
HloModule loop

%body (s: (s32[], f32[8])) -> (s32[], f32[8]) {
  %s = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = f32[8]{0} get-tuple-element(%s), index=1
  %n = f32[8]{0} negate(%x)
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %n)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %c = (s32[], f32[8]{0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

ENTRY %main (x: f32[8]) -> (s32[], f32[8]) {
  %x = f32[8]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%zero, %x)
  ROOT %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
}
"""
  module = hlo.Module.parse(loop)
  assert module.kernels() == 5
  (negate,) = module.device_kernels()
  assert negate.launches == 5 and negate.bytes_read == 32


def test_the_targets_figures_come_from_the_contract():
  from stablehlo_amp._src import contract
  h100 = contract.roofline("h100")
  assert h100.device == "H100 SXM"
  assert h100.matrix_flops["bf16"] == pytest.approx(989.4e12)
  assert h100.matrix_flops["f8"] == pytest.approx(2 * 989.4e12, rel=1e-3)
  assert h100.hbm_bytes_per_second == pytest.approx(3.352e12 * 0.85)
  assert h100.interconnect_bytes_per_second == pytest.approx(360e9)
  assert contract.roofline_names() == ("h100", "b200")
  with pytest.raises(ValueError, match=r"no roofline for target 'a100' "
                     r"\(known: h100, b200\)"):
    contract.roofline("a100")
