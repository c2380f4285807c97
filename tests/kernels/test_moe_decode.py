"""The fused decode MoE path (``fused_moe_decode.py`` of a patched tree) against float64.

Two references: the path's own quantisation points in float64
(:func:`ref_moe_layer_decode`: hidden states and intermediate in FP8 per token and 128
columns), which only float32 accumulation and the rounding of the output separate it
from; and the plain unquantised layer, which bounds what FP8 costs.  Trees without the
module (releases as released, series without the patch) are skipped.
"""

from __future__ import annotations

import pytest
import torch
from moe_kernels import quantize_weights, rel_frobenius_error
from moe_kernels.decode import has_fused_decode, load_fused_moe_decode
from moe_kernels.reference import (
    dequantize_weights,
    ref_moe_layer_decode,
    ref_moe_layer_float,
)
from moe_testdata import LAYER_FLOAT_TOL, LAYER_TOL, make_activations, make_routing, make_weights

# The output is the sum of top_k partial rows added atomically in the output dtype,
# one rounding per add: a little above the unfused layer's two roundings.
DECODE_TOL = LAYER_TOL


@pytest.fixture
def decode(vllm_tree):
    if not has_fused_decode(vllm_tree):
        # every base of the series carries the path: a patched tree without it is a fault
        assert not vllm_tree.name.endswith("+moe"), f"{vllm_tree} lacks fused_moe_decode.py"
        pytest.skip("this tree has no fused decode path")
    return load_fused_moe_decode(vllm_tree)


def _layer(decode, device, gen, *, E, topk, H, inter, M, mode, sm_count, n_dead=1):
    # fp16 under the interpreter: it has no bf16 atomic add
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    block = (128, 128) if mode == "block" else None
    w1q, w1s = quantize_weights(make_weights(E, 2 * inter, H, gen, device), mode, block)
    w2q, w2s = quantize_weights(make_weights(E, H, inter, gen, device), mode, block)
    hidden = make_activations(M, H, gen, device, dtype=dtype)
    ids, weights = make_routing(M, topk, E, gen, device, n_dead=n_dead)
    out = torch.full((M, H), float("nan"), dtype=dtype, device=device)
    decode.fused_moe_decode(
        hidden, w1q, w2q, w1s, w2s, weights, ids, out, per_channel=mode == "channel",
        block_shape=list(block) if block else None, sm_count=sm_count,
    )  # fmt: skip
    w1 = dequantize_weights(w1q, w1s, mode, block)
    w2 = dequantize_weights(w2q, w2s, mode, block)
    return out, hidden, w1, w2, ids, weights, (w1q, w2q, w1s, w2s)


# (E, top_k, hidden, intermediate, scales, tokens, SMs): a fine-grained shape with an
# intermediate that is not a multiple of 128; top_k 6 of an expert count that is not a
# power of two; top-1.  "SMs" 256 makes the second kernel split K, 2 leaves one split.
CASES = [
    (16, 4, 256, 192, "tensor", 16, 2),
    (16, 4, 256, 192, "channel", 5, 256),
    (16, 4, 256, 192, "block", 1, 256),
    (16, 4, 256, 192, "block", 16, 2),
    (12, 6, 256, 128, "block", 3, 2),
    (12, 6, 256, 128, "tensor", 7, 256),
    (8, 1, 384, 256, "channel", 1, 2),
    (8, 1, 384, 256, "block", 4, 256),
]


@pytest.mark.parametrize(
    "E,topk,H,inter,mode,M,sm_count", CASES, ids=lambda v: str(v).replace(" ", "")
)
def test_fused_decode_layer(decode, device, gen, E, topk, H, inter, mode, M, sm_count):
    out, hidden, w1, w2, ids, weights, _ = _layer(
        decode, device, gen, E=E, topk=topk, H=H, inter=inter, M=M, mode=mode,
        sm_count=sm_count,
    )  # fmt: skip
    assert not out.isnan().any(), "a row or column of the output was never written"
    group = decode.intermediate_group(M, topk, E, inter, sm_count)
    ref = ref_moe_layer_decode(hidden, w1, w2, ids, weights, group)
    err = rel_frobenius_error(out, ref)
    assert err < DECODE_TOL, f"against its own quantisation points: {err:.3e}"
    rows = [rel_frobenius_error(out[t], ref[t]) for t in range(M)]
    assert max(rows) < 2 * DECODE_TOL, f"worst token: {max(rows):.3e}"
    err_float = rel_frobenius_error(out, ref_moe_layer_float(hidden, w1, w2, ids, weights))
    assert err_float < LAYER_FLOAT_TOL, f"against unquantised float64: {err_float:.3e}"


def test_fused_decode_writes_only_its_rows_and_is_repeatable(decode, device, gen):
    """Two calls into one buffer give one result (the first kernel zeroes the output, the
        second adds into it), and doubling one token's routing weights doubles that token's row
    and moves no other (the weights are applied per token and slot)."""
    E, topk, H, inter, M = 16, 4, 256, 128, 4
    out, hidden, _, _, ids, weights, quantised = _layer(
        decode, device, gen, E=E, topk=topk, H=H, inter=inter, M=M, mode="block",
        sm_count=2,
    )  # fmt: skip
    again = out.clone()
    decode.fused_moe_decode(
        hidden, *quantised, weights, ids, again, block_shape=[128, 128], sm_count=2
    )
    assert rel_frobenius_error(again, out) < DECODE_TOL
    weights2 = weights.clone()
    weights2[2] *= 2
    moved = torch.full_like(out, float("nan"))
    decode.fused_moe_decode(
        hidden, *quantised, weights2, ids, moved, block_shape=[128, 128], sm_count=2
    )
    unchanged = [t for t in range(M) if t != 2]
    assert rel_frobenius_error(moved[unchanged], out[unchanged]) < DECODE_TOL
    assert rel_frobenius_error(moved[2], 2 * out[2]) < DECODE_TOL
