"""The decode profile's HLO reader (tests/benchmarks/profile_engine.py) attributes thunks right."""

from __future__ import annotations

import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).parents[1] / "benchmarks" / "profile_engine.py"

# A decode program's attention value product as XLA prints it: the fusion's operands, and the
# dot's inside the fused computation, are named only; their shapes are on the parameters.
_HLO = """
%fused_computation.5 (param_0.5: f32[16,3,3,256], param_1.5: f32[16,3,256,64]) -> f32[16,3,3,64] {
  %param_0.5 = f32[16,3,3,256]{3,2,1,0} parameter(0)
  %param_1.5 = f32[16,3,256,64]{3,2,1,0} parameter(1)
  ROOT %dot_general.571 = f32[16,3,3,64]{3,2,1,0} dot(%param_0.5, %param_1.5), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
}

%fused_computation.6 (param_0.6: f32[16,576], param_1.6: f32[576,1536]) -> f32[16,1536] {
  %param_0.6 = f32[16,576]{1,0} parameter(0)
  %param_1.6 = f32[576,1536]{1,0} parameter(1)
  ROOT %dot.1269 = f32[16,1536]{1,0} dot(%param_0.6, %param_1.6), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (p0: f32[16,3,3,256], p1: f32[16,3,256,64], p2: f32[16,576], p3: f32[576,1536]) -> f32[16,3,3,64] {
  %carry = (f32[16,1]{1,0}, f32[16,49152]{1,0}) parameter(4)
  %gte = f32[16,1]{1,0} get-tuple-element(%carry), index=0
  %p0 = f32[16,3,3,256]{3,2,1,0} parameter(0)
  %p1 = f32[16,3,256,64]{3,2,1,0} parameter(1)
  %p2 = f32[16,576]{1,0} parameter(2)
  %p3 = f32[576,1536]{1,0} parameter(3)
  %ynn_fusion.6 = f32[16,1536]{1,0} fusion(%p2, %p3), kind=kCustom, calls=%fused_computation.6
  ROOT %ynn_fusion.5 = f32[16,3,3,64]{3,2,1,0} fusion(%p0, %p1), kind=kCustom, calls=%fused_computation.5
}
"""


def _tool():
    spec = importlib.util.spec_from_file_location("profile_engine_tool", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_attention_value_product_counts_as_attention_not_as_a_layer_product():
    tool = _tool()
    hlo = tool.parse_hlo(_HLO)
    assert hlo["dot_general.571"]["operands"] == [(16, 3, 3, 256), (16, 3, 256, 64)]
    cache_shape, vocab = (16, 3, 256, 64), 49152
    assert tool.classify(hlo, "ynn_fusion.5", cache_shape, vocab, 16) == "attention"
    assert tool.classify(hlo, "ynn_fusion.6", cache_shape, vocab, 16) == "layer_matmuls"
    # A tuple's elements are not the operands of the get-tuple-element that reads one of them
    # (else a loop's get-tuple-elements would look like the [rows, V] sampler).
    assert hlo["gte"]["operands"] == []
    assert tool.classify(hlo, "gte", cache_shape, vocab, 16) == "other"


# The decode cache's keys in blocks (decoder.blocked_keys, [R, Nkv, C/128, D, 128]): the score
# product's operands hold no axis of the cache's length.
_HLO_BLOCKS = """
%fused_computation.7 (param_0.7: f32[16,3,2,3,64], param_1.7: f32[16,3,2,64,128]) -> f32[16,3,2,3,128] {
  %param_0.7 = f32[16,3,2,3,64]{4,3,2,1,0} parameter(0)
  %param_1.7 = f32[16,3,2,64,128]{4,3,2,1,0} parameter(1)
  ROOT %dot_general.9 = f32[16,3,2,3,128]{4,3,2,1,0} dot(%param_0.7, %param_1.7), lhs_batch_dims={0,1,2}, lhs_contracting_dims={4}, rhs_batch_dims={0,1,2}, rhs_contracting_dims={3}
}

ENTRY %main (p0: f32[16,3,2,3,64], p1: f32[16,3,2,64,128]) -> f32[16,3,2,3,128] {
  %p0 = f32[16,3,2,3,64]{4,3,2,1,0} parameter(0)
  %p1 = f32[16,3,2,64,128]{4,3,2,1,0} parameter(1)
  ROOT %ynn_fusion.7 = f32[16,3,2,3,128]{4,3,2,1,0} fusion(%p0, %p1), kind=kCustom, calls=%fused_computation.7
}
"""


def test_a_score_product_over_key_blocks_counts_as_attention():
    tool = _tool()
    hlo = tool.parse_hlo(_HLO_BLOCKS)
    assert tool.classify(hlo, "ynn_fusion.7", (16, 3, 256, 64), 49152, 16) == "attention"
    # ... and the cache-shaped op counter sees blocked arrays as cache arrays.
    text = "  %s = f32[16,3,2,64,128]{4,3,2,1,0} scatter(%a, %b, %c)\n"
    assert tool.cache_op_counts(text, (16, 3, 256, 64))["scatter"] == 1
