# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fused FP8 MoE decode path (fused_moe_decode.py): the whole layer against a
float32 reference and against vLLM's unfused Triton layer on fresh random data, its
padding rows, its replay under a CUDA graph, and the rule that picks it per batch.

Run `pytest tests/kernels/moe/test_fused_moe_decode.py`.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
from vllm.model_executor.layers.fused_moe.fused_moe_decode import (
    MAX_EXPERT_BYTES,
    MAX_TOKENS_BLOCK,
    MAX_TOKENS_PER_TENSOR,
    fused_moe_decode,
    max_fused_tokens,
)
from vllm.platforms import current_platform

if not (current_platform.is_cuda() and current_platform.is_device_capability(90)):
    pytest.skip("the fused decode path is for Hopper (SM 9.0)", allow_module_level=True)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
BLOCK = 128
# Relative Frobenius error against the float32 layer: FP8 activations and weights
# cost a few percent; both paths are held to the same bound.
LAYER_TOL = 6e-2


def _quantized(e: int, n: int, k: int, kind: str):
    """FP8 weights ``(e, n, k)``, their scales (per tensor, channel or 128x128 block)
    and the float32 weights they stand for."""
    w = torch.randn((e, n, k), device="cuda") / k**0.5
    if kind == "block":
        tiles = w.view(e, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
        scale = tiles.abs().amax(dim=(2, 4)) / FP8_MAX
        full = scale.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)
    elif kind == "channel":
        scale = w.abs().amax(dim=2, keepdim=True) / FP8_MAX
        full = scale
    else:
        scale = w.abs().amax(dim=(1, 2)) / FP8_MAX
        full = scale.view(e, 1, 1)
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.float(), q.float() * full


def _routing(m: int, e: int, topk: int):
    logits = torch.randn((m, e), device="cuda")
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), topk)
    return (weights / weights.sum(-1, keepdim=True)).float(), ids.to(torch.int32)


def _reference(x, w1, w2, weights, ids):
    """The layer in float32 from the weights FP8 stands for, activations unquantized."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for weight, e in zip(weights[t], ids[t], strict=True):
            if e < 0:
                continue
            gate, up = (w1[e] @ x[t].float()).chunk(2)
            out[t] += weight * (w2[e] @ (F.silu(gate) * up))
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _layer(m, e, topk, hidden, inter, kind):
    torch.manual_seed(m * 1000 + e + hidden + inter)
    w1q, s1, w1 = _quantized(e, 2 * inter, hidden, kind)
    w2q, s2, w2 = _quantized(e, hidden, inter, kind)
    x = torch.randn((m, hidden), device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(m, e, topk)
    return x, (w1q, s1, w1), (w2q, s2, w2), weights, ids


def _fused(x, up, down, weights, ids, kind):
    out = torch.full_like(x, float("nan"))
    return fused_moe_decode(
        x,
        up[0],
        down[0],
        up[1],
        down[1],
        weights,
        ids,
        out,
        per_channel=kind == "channel",
        block_shape=[BLOCK, BLOCK] if kind == "block" else None,
    )


@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize(
    "e,topk,hidden,inter",
    [(64, 8, 1024, 256), (128, 8, 2048, 768), (8, 2, 1024, 1792), (16, 4, 768, 384)],
)
def test_fused_decode_layer_matches_float32_and_the_unfused_layer(
    m, e, topk, hidden, inter, kind
):
    x, up, down, weights, ids = _layer(m, e, topk, hidden, inter, kind)
    fused = _fused(x, up, down, weights, ids, kind)
    ref = _reference(x, up[2], down[2], weights, ids)
    config = fp8_w8a8_moe_quant_config(
        w1_scale=up[1],
        w2_scale=down[1],
        per_act_token_quant=kind == "channel",
        per_out_ch_quant=kind == "channel",
        block_shape=[BLOCK, BLOCK] if kind == "block" else None,
    )
    with set_current_vllm_config(VllmConfig()):
        unfused = fused_experts(x, up[0], down[0], weights, ids, quant_config=config)
    assert torch.isfinite(fused).all()
    assert _rel(fused, ref) < LAYER_TOL
    assert _rel(unfused, ref) < LAYER_TOL
    assert _rel(fused, unfused) < 2 * LAYER_TOL


def test_padding_rows_route_nowhere():
    """Rows with expert id -1 (VLLM_MOE_SKIP_PADDING) take no expert's weights, also
    where the number of experts is not a power of two."""
    x, up, down, weights, ids = _layer(6, 160, 8, 1024, 256, "block")
    ids[4:] = -1
    fused = _fused(x, up, down, weights, ids, "block")
    ref = _reference(x[:4], up[2], down[2], weights[:4], ids[:4])
    assert _rel(fused[:4], ref) < LAYER_TOL
    assert torch.isfinite(fused[4:]).all()


def test_replays_under_a_cuda_graph():
    """Nothing carries over between calls: a captured call replayed on new inputs gives
    what an eager call gives."""
    x, up, down, weights, ids = _layer(4, 64, 8, 1024, 256, "tensor")
    out = torch.empty_like(x)

    def call():
        fused_moe_decode(x, up[0], down[0], up[1], down[1], weights, ids, out)

    call()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        new_weights, new_ids = _routing(4, 64, 8)
        weights.copy_(new_weights)
        ids.copy_(new_ids)
        graph.replay()
        replayed = out.clone()
        call()
        assert _rel(replayed, out) < 1e-2  # the atomics' order only
        assert _rel(out, _reference(x, up[2], down[2], weights, ids)) < LAYER_TOL


def _quant(block=None, per_channel=False, per_token=False, a1_scale=None):
    return SimpleNamespace(
        block_shape=block,
        per_out_ch_quant=per_channel,
        per_act_token_quant=per_token,
        a1_scale=a1_scale,
    )


def test_the_rule_takes_only_measured_kinds_and_decode_batches():
    assert max_fused_tokens(_quant()) == MAX_TOKENS_PER_TENSOR
    assert max_fused_tokens(_quant(block=[BLOCK, BLOCK])) == MAX_TOKENS_BLOCK
    assert max_fused_tokens(_quant(per_channel=True, per_token=True)) == 0
    assert max_fused_tokens(_quant(a1_scale=torch.ones(1))) == 0
    assert 0 < MAX_TOKENS_BLOCK <= MAX_TOKENS_PER_TENSOR <= 16
    # Mixtral-8x7B's experts (3 x 4096 x 14336 FP8 bytes) stay on the unfused path,
    # Qwen3-235B-A22B's (3 x 4096 x 1536) take the fused one.
    assert 3 * 4096 * 14336 > MAX_EXPERT_BYTES >= 3 * 4096 * 1536
