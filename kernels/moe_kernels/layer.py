"""The whole two-GEMM MoE layer through a loaded ``fused_moe_kernel``.

Mirrors vLLM's ``fused_experts_impl`` for the Triton path: quantise the
hidden states, align the routing once, GEMM 1 (``w1``, ``top_k = topk``) into
``(M, topk, 2I)``, SiLU-and-mul, quantise, GEMM 2 (``w2``, ``top_k = 1``, routed
weights multiplied in) into ``(M, topk, H)``, then sum over ``topk``.  Both
intermediate outputs are filled with NaN first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .align import prepare_expert_assignment, use_naive_block_assignment
from .launch import invoke_fused_moe_kernel
from .loader import LoadedKernel
from .quant import QuantMode, quantize_activations
from .reference import silu_and_mul


@dataclass
class LayerRun:
    out: torch.Tensor  # (M, H)
    cache1: torch.Tensor  # (M, topk, 2I) first GEMM output
    cache3: torch.Tensor  # (M, topk, H) second GEMM output (weighted)
    naive: bool


def fused_moe_layer(
    loaded: LoadedKernel,
    hidden: torch.Tensor,
    w1_q: torch.Tensor,
    w1_scale: torch.Tensor | None,
    w2_q: torch.Tensor,
    w2_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    config: dict[str, Any],
    mode: QuantMode,
    *,
    block_shape: tuple[int, int] | list[int] | None = None,
    naive: bool | None = None,
    swap_ab: bool | None = None,
    extra_args: dict[str, Any] | None = None,
    assignment: tuple | None = None,
) -> LayerRun:
    """Run the MoE layer; ``hidden`` is ``(M, H)`` in the output dtype (bf16/fp16).

    ``assignment`` (sorted ids, expert ids, padded count) reuses an alignment made
    earlier: the harness aligns on the host side, which a CUDA graph cannot capture."""
    if mode == "block" and block_shape is None:
        block_shape = (128, 128)
    if mode != "block":
        block_shape = None
    bs = list(block_shape) if block_shape is not None else None
    M, topk = topk_ids.shape
    E, N, _ = w1_q.shape
    H = w2_q.size(1)
    dtype = hidden.dtype
    if naive is None:
        naive = use_naive_block_assignment(M, topk, E)
    if assignment is None:
        assignment = prepare_expert_assignment(topk_ids, config["BLOCK_SIZE_M"], E, naive=naive)
    sorted_ids, expert_ids, num_post = assignment
    common = dict(
        use_fp8_w8a8=mode != "none",
        per_channel_quant=mode == "channel",
        block_shape=bs,
        swap_ab=swap_ab,
        extra_args=extra_args,
    )

    a1_q, a1_s = quantize_activations(hidden, mode, block_shape)
    cache1 = torch.full((M, topk, N), float("nan"), dtype=dtype, device=hidden.device)
    invoke_fused_moe_kernel(
        loaded, a1_q, w1_q, cache1, a1_s, w1_scale, topk_weights,
        sorted_ids, expert_ids, num_post, False, topk, config, **common,
    )  # fmt: skip

    act = silu_and_mul(cache1.view(M * topk, N).float()).to(dtype)
    a2_q, a2_s = quantize_activations(act, mode, block_shape)
    cache3 = torch.full((M, topk, H), float("nan"), dtype=dtype, device=hidden.device)
    invoke_fused_moe_kernel(
        loaded, a2_q, w2_q, cache3, a2_s, w2_scale, topk_weights,
        sorted_ids, expert_ids, num_post, True, 1, config, **common,
    )  # fmt: skip
    out = cache3.float().sum(dim=1).to(dtype)
    return LayerRun(out, cache1, cache3, naive)
