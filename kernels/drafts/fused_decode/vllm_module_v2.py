# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FP8 MoE layer in two launches, for decode batches on Hopper.

At decode a few tokens reach each expert: the layer is bound by reading the chosen
experts' weights, while the unfused Triton path (input quantisation, alignment, two
GEMMs, SiLU-and-mul, intermediate quantisation, top-k sum) pays the fixed cost of
seven launches.  Here:

1. ``_moe_decode_up_kernel``: each program finds its expert among the distinct experts
   the batch routes to, quantises the hidden states per token and 128-wide group as it
   streams one slice of the expert's gate and up rows, and stores SiLU-and-mul of the
   slice for the expert's tokens; it also zeroes its share of the output.
2. ``_moe_decode_down_kernel``: each program quantises one expert's intermediate per
   token and 128-wide group as it streams one tile of ``w2`` rows (over one share of
   ``K`` where the batch hits too few experts to fill the GPU), and adds the
   routing-weighted result into the output.

Each chosen expert's weights are read once and no routing alignment is needed.
Nothing persists between calls, so CUDA graphs capture it as it is.
"""

import functools

import torch
from vllm.triton_utils import tl, triton

# Activations are quantised per token and per this many elements; it is also both
# kernels' K step and the side of a weight scale block.
QUANT_GROUP = 128
FP8_MAX = 448.0
# The largest batch the fused path takes: its programs carry every token of the
# batch on the MMA's N side.
MAX_TOKENS = 16


@triton.jit
def _route(
    slot,
    topk_ids_ptr,
    topk_weights_ptr,
    num_tokens,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    """The slot-th distinct expert of the batch in id order (-1 past the last one),
    which tokens it serves, their rows (token, top-k position) and routing weights."""
    offs_t = tl.arange(0, BLOCK_TOKENS)
    offs_k = tl.arange(0, TOP_K_PAD)
    route_mask = (offs_t[:, None] < num_tokens) & (offs_k[None, :] < TOP_K)
    route_offs = offs_t[:, None] * TOP_K + offs_k[None, :]
    ids = tl.load(topk_ids_ptr + route_offs, mask=route_mask, other=0).to(tl.int32)
    counts = tl.histogram(
        tl.reshape(ids, [BLOCK_TOKENS * TOP_K_PAD]),
        EXPERT_BINS,
        mask=tl.reshape(route_mask, [BLOCK_TOKENS * TOP_K_PAD]),
    )
    present = counts > 0
    rank = tl.cumsum(present.to(tl.int32), axis=0) - 1
    bins = tl.arange(0, EXPERT_BINS)
    expert = tl.max(tl.where(present & (rank == slot), bins, -1), axis=0)
    chosen = route_mask & (ids == expert)
    routed = tl.sum(chosen.to(tl.int32), axis=1) > 0
    position = tl.sum(tl.where(chosen, offs_k[None, :], 0), axis=1)
    weights = tl.load(topk_weights_ptr + route_offs, mask=chosen, other=0.0)
    return expert, routed, offs_t * TOP_K + position, tl.sum(weights.to(tl.float32), axis=1)


@triton.jit(do_not_specialize=["num_tokens", "out_numel"])
def _moe_decode_up_kernel(
    x_ptr,
    w1_ptr,
    w1_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    act_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    out_numel,
    stride_w1_e,
    stride_w1_n,
    stride_s1_e,
    stride_s1_n,
    stride_s1_k,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    SCALE_KIND: tl.constexpr,  # 0: per tensor, 1: per channel, 2: 128x128 blocks
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_I: tl.constexpr,
    GROUP: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    pid = tl.program_id(0)
    i_tiles = tl.cdiv(inter, BLOCK_I)
    slot = pid // i_tiles
    i_tile = pid % i_tiles

    # -- The second kernel adds into the output: zero this program's share of it.
    share = tl.cdiv(tl.cdiv(out_numel, tl.num_programs(0)), ZERO_BLOCK) * ZERO_BLOCK
    offs_z = tl.arange(0, ZERO_BLOCK)
    for z in range(pid * share, (pid + 1) * share, ZERO_BLOCK):
        tl.store(out_ptr + z + offs_z, 0.0, mask=z + offs_z < out_numel)

    expert, routed, row, _ = _route(
        slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
        TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
    )  # fmt: skip
    if expert < 0:
        return

    # -- Gate and up rows of this slice, swapped: weight rows on the MMA's M side, the
    # tokens on its N side; the hidden states quantised per token and group on the fly.
    offs_i = i_tile * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = offs_i < inter
    offs_g = tl.arange(0, GROUP)
    offs_t = tl.arange(0, BLOCK_TOKENS)
    gate_ptrs = (
        w1_ptr + expert.to(tl.int64) * stride_w1_e
        + offs_i[:, None] * stride_w1_n + offs_g[None, :]
    )  # fmt: skip
    up_ptrs = gate_ptrs + inter * stride_w1_n
    x_ptrs = x_ptr + offs_t[:, None] * hidden + offs_g[None, :]
    s_ptr = w1_scale_ptr + expert.to(tl.int64) * stride_s1_e
    gate = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
    up = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
    for k in range(0, tl.cdiv(hidden, GROUP)):
        k_mask = k * GROUP + offs_g < hidden
        x = tl.load(x_ptrs, mask=routed[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        x_scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / FP8_MAX
        x_q = tl.trans((x / x_scale[:, None]).to(w1_ptr.dtype.element_ty))
        w_mask = i_mask[:, None] & k_mask[None, :]
        gate_step = tl.dot(tl.load(gate_ptrs, mask=w_mask, other=0.0), x_q) * x_scale[None, :]
        up_step = tl.dot(tl.load(up_ptrs, mask=w_mask, other=0.0), x_q) * x_scale[None, :]
        if SCALE_KIND == 2:
            block_k = k * stride_s1_k
            gate_step *= tl.load(s_ptr + (offs_i // GROUP) * stride_s1_n + block_k, mask=i_mask)[
                :, None
            ]
            up_step *= tl.load(
                s_ptr + ((offs_i + inter) // GROUP) * stride_s1_n + block_k, mask=i_mask
            )[:, None]
        gate += gate_step
        up += up_step
        gate_ptrs += GROUP
        up_ptrs += GROUP
        x_ptrs += GROUP
    if SCALE_KIND == 0:
        gate *= tl.load(s_ptr)
        up *= tl.load(s_ptr)
    elif SCALE_KIND == 1:
        gate *= tl.load(s_ptr + offs_i * stride_s1_n, mask=i_mask)[:, None]
        up *= tl.load(s_ptr + (offs_i + inter) * stride_s1_n, mask=i_mask)[:, None]

    # -- SiLU-and-mul, one row per (token, top-k position), in the activation dtype.
    act = gate * tl.sigmoid(gate) * up
    act_ptrs = act_ptr + row[None, :] * inter + offs_i[:, None]
    tl.store(act_ptrs, act.to(act_ptr.dtype.element_ty), mask=i_mask[:, None] & routed[None, :])


@triton.jit(do_not_specialize=["num_tokens"])
def _moe_decode_down_kernel(
    act_ptr,
    w2_ptr,
    w2_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    k_steps_per_split,
    stride_w2_e,
    stride_w2_n,
    stride_s2_e,
    stride_s2_n,
    stride_s2_k,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    pid = tl.program_id(0)
    h_tiles = tl.cdiv(hidden, BLOCK_H)
    split = tl.program_id(1)
    slot = pid // h_tiles
    h_tile = pid % h_tiles
    expert, routed, row, route_w = _route(
        slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
        TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
    )  # fmt: skip
    if expert < 0:
        return

    # -- Swapped GEMM over this split's K steps, the intermediate quantised per token
    # and group on the fly.
    offs_h = h_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < hidden
    offs_g = tl.arange(0, GROUP)
    k_first = split * k_steps_per_split
    k_last = tl.minimum(k_first + k_steps_per_split, tl.cdiv(inter, GROUP))
    w_ptrs = (
        w2_ptr + expert.to(tl.int64) * stride_w2_e
        + offs_h[:, None] * stride_w2_n + k_first * GROUP + offs_g[None, :]
    )  # fmt: skip
    act_ptrs = act_ptr + row[:, None] * inter + k_first * GROUP + offs_g[None, :]
    s_ptr = w2_scale_ptr + expert.to(tl.int64) * stride_s2_e
    acc = tl.zeros((BLOCK_H, BLOCK_TOKENS), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_mask = k * GROUP + offs_g < inter
        act = tl.load(act_ptrs, mask=routed[:, None] & k_mask[None, :], other=0.0)
        act = act.to(tl.float32)
        act_scale = tl.maximum(tl.max(tl.abs(act), axis=1), 1e-10) / FP8_MAX
        act_q = (act / act_scale[:, None]).to(w2_ptr.dtype.element_ty)
        w = tl.load(w_ptrs, mask=h_mask[:, None] & k_mask[None, :], other=0.0)
        step = tl.dot(w, tl.trans(act_q)) * act_scale[None, :]
        if SCALE_KIND == 2:
            step *= tl.load(s_ptr + (offs_h // GROUP) * stride_s2_n + k * stride_s2_k, mask=h_mask)[
                :, None
            ]
        acc += step
        w_ptrs += GROUP
        act_ptrs += GROUP
    if SCALE_KIND == 0:
        acc *= tl.load(s_ptr)
    elif SCALE_KIND == 1:
        acc *= tl.load(s_ptr + offs_h * stride_s2_n, mask=h_mask)[:, None]

    # -- Weighted by the routing and added into the tokens' output rows.
    offs_t = tl.arange(0, BLOCK_TOKENS)
    out_ptrs = out_ptr + offs_t[None, :] * hidden + offs_h[:, None]
    tl.atomic_add(
        out_ptrs,
        (acc * route_w[None, :]).to(out_ptr.dtype.element_ty),
        mask=h_mask[:, None] & routed[None, :],
        sem="relaxed",
    )


def _scale_strides(scale: torch.Tensor, kind: int) -> tuple[int, int, int]:
    strides = (*scale.stride(), 0, 0)
    return strides[0], strides[1] if kind > 0 else 0, strides[2] if kind == 2 else 0


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def fused_moe_decode(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w1_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    output: torch.Tensor,
    block_shape: list[int] | None = None,
    sm_count: int | None = None,
) -> torch.Tensor:
    """``output = sum_k topk_weights[:, k] * w2_e(silu_and_mul(w1_e hidden_states))``,
    ``e = topk_ids[:, k]``, for FP8 ``w1`` ``(E, 2I, H)`` and ``w2`` ``(E, H, I)`` with
    per-tensor ``(E,)``, per-channel ``(E, N[, 1])`` or 128x128 block scales, from
    unquantised ``hidden_states`` ``(M, H)``."""
    num_tokens, hidden = hidden_states.shape
    experts, n, _ = w1.shape
    inter = n // 2
    top_k = topk_ids.size(1)
    if block_shape is not None:
        kind = 2
    else:
        kind = 0 if w1_scale.numel() == experts else 1
    sm_count = sm_count or _sm_count(hidden_states.device)
    # Programs serve the distinct experts the batch routes to, at most one per route.
    slots = min(experts, num_tokens * top_k)
    common = dict(
        TOP_K=top_k,
        TOP_K_PAD=triton.next_power_of_2(top_k),
        EXPERT_BINS=triton.next_power_of_2(experts),
        SCALE_KIND=kind,
        BLOCK_TOKENS=max(16, triton.next_power_of_2(num_tokens)),
        GROUP=QUANT_GROUP,
        FP8_MAX=FP8_MAX,
        num_warps=4,
    )

    # First launch: narrower slices of the intermediate until every SM has one.
    block_i = next((b for b in (64, 32) if slots * triton.cdiv(inter, b) >= sm_count), 16)
    act = torch.empty((num_tokens * top_k, inter), dtype=output.dtype, device=output.device)
    _moe_decode_up_kernel[(slots * triton.cdiv(inter, block_i),)](
        hidden_states, w1, w1_scale, topk_ids, topk_weights, act, output,
        num_tokens, hidden, inter, output.numel(),
        w1.stride(0), w1.stride(1), *_scale_strides(w1_scale, kind),
        BLOCK_I=block_i, ZERO_BLOCK=1024, num_stages=6 if block_i < 64 else 4, **common,
    )  # fmt: skip

    # Second launch: split K until every SM has a program, four K steps at least.
    block_h = 64
    h_tiles = slots * triton.cdiv(hidden, block_h)
    k_steps = triton.cdiv(inter, QUANT_GROUP)
    splits = max(1, min(k_steps // 4, triton.cdiv(sm_count, h_tiles)))
    per_split = triton.cdiv(k_steps, splits)
    _moe_decode_down_kernel[(h_tiles, triton.cdiv(k_steps, per_split))](
        act, w2, w2_scale, topk_ids, topk_weights, output,
        num_tokens, hidden, inter, per_split,
        w2.stride(0), w2.stride(1), *_scale_strides(w2_scale, kind),
        BLOCK_H=block_h, num_stages=4, **common,
    )  # fmt: skip
    return output


def supports_fused_moe_decode(prepare_finalize, fused_experts) -> bool:
    """Whether a modular kernel may run decode batches here: vLLM's own Triton experts
    for FP8 weights (per-tensor, per-channel or 128x128 blocks) without expert
    parallelism on Hopper, and ``VLLM_FUSED_MOE_DECODE`` not turned off."""
    import vllm.envs as envs
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.prepare_finalize.no_dp_ep import (
        MoEPrepareAndFinalizeNoDPEPModular,
    )
    from vllm.platforms import current_platform

    quant = fused_experts.quant_config
    return (
        envs.VLLM_FUSED_MOE_DECODE
        and current_platform.is_cuda()
        and current_platform.is_device_capability(90)
        and type(fused_experts) is TritonExperts
        and isinstance(prepare_finalize, MoEPrepareAndFinalizeNoDPEPModular)
        and quant.use_fp8_w8a8
        and quant.w1_scale is not None
        and quant.w2_scale is not None
        and quant.block_shape in (None, [QUANT_GROUP, QUANT_GROUP])
        and quant.w1_bias is None
        and quant.w2_bias is None
    )


def use_fused_moe_decode(
    fused_experts,
    hidden_states: torch.Tensor,
    activation,
    expert_map: torch.Tensor | None,
    apply_router_weight_on_input: bool,
) -> bool:
    """Whether this batch takes the fused path (``supports_fused_moe_decode`` held)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return (
        hidden_states.size(0) <= MAX_TOKENS
        and hidden_states.dtype in (torch.bfloat16, torch.float16)
        and activation == MoEActivation.SILU
        and expert_map is None
        and not apply_router_weight_on_input
        and getattr(fused_experts, "_lora_context", None) is None
    )
