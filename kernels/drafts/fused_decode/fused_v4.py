# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FP8 MoE layer in two launches, for decode batches (v4: v3 with split-K in the
first launch).

At decode a few tokens reach each expert: the layer is bound by reading the chosen
experts' weights, and the unfused Triton path spends much of its time in the fixed cost
of its launches.  Here, with bf16 activations and FP8 weights converted in registers:

1. ``_moe_decode_up_kernel``: each program finds its expert among the distinct experts
   the batch routes to and multiplies one tile of gate and up rows over one share of
   ``K`` (split-K, so that a batch that hits few experts still fills the GPU), storing
   float32 partial sums; it also zeroes its share of the output.
2. ``_moe_decode_down_kernel``: each program sums those partials for its expert and one
   share of the intermediate, applies SiLU-and-mul, multiplies into one tile of ``w2``
   rows and adds the routing-weighted result into the output.

Each chosen expert's weights are read once, no routing alignment is needed, and the
partials stay in L2.  Nothing persists between calls, so CUDA graphs capture it as is.
"""

import torch
from vllm.triton_utils import tl, triton

# Activations are quantised per token and per this many elements; it is also both
# kernels' K step and the side of a weight scale block.
QUANT_GROUP = 128
FP8_MAX = 448.0


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
    """The slot-th distinct expert of the batch (in id order; -1 past the last one),
    which tokens it serves, at which top-k position, and with what routing weight."""
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


@triton.jit
def _moe_decode_up_kernel(
    x_ptr,
    w1_ptr,
    w1_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    part_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    out_numel,
    k_steps_per_split,
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
    split = tl.program_id(1)
    i_tiles = tl.cdiv(inter, BLOCK_I)
    slot = pid // i_tiles
    i_tile = pid % i_tiles

    # -- The second kernel adds into the output: zero this program's share of it.
    programs = tl.num_programs(0) * tl.num_programs(1)
    flat = split * tl.num_programs(0) + pid
    share = tl.cdiv(tl.cdiv(out_numel, programs), ZERO_BLOCK) * ZERO_BLOCK
    offs_z = tl.arange(0, ZERO_BLOCK)
    for z in range(flat * share, (flat + 1) * share, ZERO_BLOCK):
        tl.store(out_ptr + z + offs_z, 0.0, mask=z + offs_z < out_numel)

    expert, routed, pair, _ = _route(
        slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
        TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
    )  # fmt: skip
    if expert < 0:
        return

    # -- Gate and up rows of this slice over this split's K steps, swapped: weight rows
    # on the MMA's M side, the tokens on its N side.
    offs_i = i_tile * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = offs_i < inter
    offs_g = tl.arange(0, GROUP)
    offs_t = tl.arange(0, BLOCK_TOKENS)
    k_first = split * k_steps_per_split
    k_last = tl.minimum(k_first + k_steps_per_split, tl.cdiv(hidden, GROUP))
    gate_ptrs = (
        w1_ptr + expert.to(tl.int64) * stride_w1_e
        + offs_i[:, None] * stride_w1_n + k_first * GROUP + offs_g[None, :]
    )  # fmt: skip
    up_ptrs = gate_ptrs + inter * stride_w1_n
    x_ptrs = x_ptr + offs_t[:, None] * hidden + k_first * GROUP + offs_g[None, :]
    s_ptr = w1_scale_ptr + expert.to(tl.int64) * stride_s1_e
    gate = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
    up = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_mask = k * GROUP + offs_g < hidden
        x = tl.trans(tl.load(x_ptrs, mask=routed[:, None] & k_mask[None, :], other=0.0))
        w_mask = i_mask[:, None] & k_mask[None, :]
        w_gate = tl.load(gate_ptrs, mask=w_mask, other=0.0).to(x_ptr.dtype.element_ty)
        w_up = tl.load(up_ptrs, mask=w_mask, other=0.0).to(x_ptr.dtype.element_ty)
        if SCALE_KIND == 2:
            block_k = k * stride_s1_k
            gate += (
                tl.dot(w_gate, x)
                * tl.load(s_ptr + (offs_i // GROUP) * stride_s1_n + block_k, mask=i_mask)[:, None]
            )
            up += (
                tl.dot(w_up, x)
                * tl.load(s_ptr + ((offs_i + inter) // GROUP) * stride_s1_n + block_k, mask=i_mask)[
                    :, None
                ]
            )
        else:
            gate = tl.dot(w_gate, x, gate)
            up = tl.dot(w_up, x, up)
        gate_ptrs += GROUP
        up_ptrs += GROUP
        x_ptrs += GROUP
    if SCALE_KIND == 0:
        gate *= tl.load(s_ptr)
        up *= tl.load(s_ptr)
    elif SCALE_KIND == 1:
        gate *= tl.load(s_ptr + offs_i * stride_s1_n, mask=i_mask)[:, None]
        up *= tl.load(s_ptr + (offs_i + inter) * stride_s1_n, mask=i_mask)[:, None]

    # -- This split's partial sums, one row per (token, top-k position): gate, then up.
    pairs = num_tokens * TOP_K
    part_ptrs = part_ptr + (split * pairs + pair[None, :]) * (2 * inter) + offs_i[:, None]
    part_mask = i_mask[:, None] & routed[None, :]
    tl.store(part_ptrs, gate, mask=part_mask)
    tl.store(part_ptrs + inter, up, mask=part_mask)


@triton.jit
def _moe_decode_down_kernel(
    part_ptr,
    w2_ptr,
    w2_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    up_splits,
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
    expert, routed, pair, route_w = _route(
        slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
        TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
    )  # fmt: skip
    if expert < 0:
        return

    # -- Swapped GEMM over this split's K steps; the intermediate made on the fly from
    # the first kernel's partials: summed, then SiLU-and-mul.
    offs_h = h_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < hidden
    offs_g = tl.arange(0, GROUP)
    k_first = split * k_steps_per_split
    k_last = tl.minimum(k_first + k_steps_per_split, tl.cdiv(inter, GROUP))
    w_ptrs = (
        w2_ptr + expert.to(tl.int64) * stride_w2_e
        + offs_h[:, None] * stride_w2_n + k_first * GROUP + offs_g[None, :]
    )  # fmt: skip
    pairs = num_tokens * TOP_K
    part_ptrs = part_ptr + pair[:, None] * (2 * inter) + k_first * GROUP + offs_g[None, :]
    s_ptr = w2_scale_ptr + expert.to(tl.int64) * stride_s2_e
    acc = tl.zeros((BLOCK_H, BLOCK_TOKENS), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_mask = k * GROUP + offs_g < inter
        a_mask = routed[:, None] & k_mask[None, :]
        gate = tl.zeros((BLOCK_TOKENS, GROUP), dtype=tl.float32)
        up = tl.zeros((BLOCK_TOKENS, GROUP), dtype=tl.float32)
        for s in range(0, up_splits):
            split_ptrs = part_ptrs + s * pairs * (2 * inter)
            gate += tl.load(split_ptrs, mask=a_mask, other=0.0)
            up += tl.load(split_ptrs + inter, mask=a_mask, other=0.0)
        act = tl.trans((gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty))
        w = tl.load(w_ptrs, mask=h_mask[:, None] & k_mask[None, :], other=0.0)
        w = w.to(out_ptr.dtype.element_ty)
        if SCALE_KIND == 2:
            acc += (
                tl.dot(w, act)
                * tl.load(s_ptr + (offs_h // GROUP) * stride_s2_n + k * stride_s2_k, mask=h_mask)[
                    :, None
                ]
            )
        else:
            acc = tl.dot(w, act, acc)
        w_ptrs += GROUP
        part_ptrs += GROUP
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


def _splits(tiles: int, k_steps: int, target_programs: int, min_steps: int) -> int:
    """Split K until the launch has about ``target_programs`` programs, keeping at
    least ``min_steps`` K steps per split."""
    most = max(1, k_steps // min_steps)
    return max(1, min(most, triton.cdiv(target_programs, tiles)))


def fused_moe_decode(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w1_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    output: torch.Tensor,
    per_channel: bool = False,
    block_shape: list[int] | None = None,
    sm_count: int = 132,
    block_i: int = 64,
    block_h: int = 64,
    programs_per_sm: int = 1,
    min_steps: int = 4,
    num_warps: int = 4,
    up_stages: int = 6,
    down_stages: int = 4,
) -> torch.Tensor:
    """``output = sum_k w_k * w2_e(silu_and_mul(w1_e x))`` for FP8 ``w1`` ``(E, 2I, H)``
    and ``w2`` ``(E, H, I)``, from unquantised ``hidden_states`` ``(M, H)``."""
    num_tokens, hidden = hidden_states.shape
    experts, n, _ = w1.shape
    inter = n // 2
    top_k = topk_ids.size(1)
    kind = 2 if block_shape is not None else (1 if per_channel else 0)
    slots = min(experts, num_tokens * top_k)
    target = programs_per_sm * sm_count
    common = dict(
        TOP_K=top_k,
        TOP_K_PAD=triton.next_power_of_2(top_k),
        EXPERT_BINS=triton.next_power_of_2(experts),
        SCALE_KIND=kind,
        BLOCK_TOKENS=max(16, triton.next_power_of_2(num_tokens)),
        GROUP=QUANT_GROUP,
        FP8_MAX=FP8_MAX,
        num_warps=num_warps,
    )
    up_tiles = slots * triton.cdiv(inter, block_i)
    up_steps = triton.cdiv(hidden, QUANT_GROUP)
    up_splits = _splits(up_tiles, up_steps, target, min_steps)
    up_per_split = triton.cdiv(up_steps, up_splits)
    up_splits = triton.cdiv(up_steps, up_per_split)
    partials = torch.empty(
        (up_splits, num_tokens * top_k, 2 * inter), dtype=torch.float32, device=output.device
    )
    _moe_decode_up_kernel[(up_tiles, up_splits)](
        hidden_states, w1, w1_scale, topk_ids, topk_weights, partials, output,
        num_tokens, hidden, inter, output.numel(), up_per_split,
        w1.stride(0), w1.stride(1), *_scale_strides(w1_scale, kind),
        BLOCK_I=block_i, ZERO_BLOCK=1024, num_stages=up_stages, **common,
    )  # fmt: skip

    down_tiles = slots * triton.cdiv(hidden, block_h)
    down_steps = triton.cdiv(inter, QUANT_GROUP)
    splits = _splits(down_tiles, down_steps, target, min_steps)
    per_split = triton.cdiv(down_steps, splits)
    _moe_decode_down_kernel[(down_tiles, triton.cdiv(down_steps, per_split))](
        partials, w2, w2_scale, topk_ids, topk_weights, output,
        num_tokens, hidden, inter, up_splits, per_split,
        w2.stride(0), w2.stride(1), *_scale_strides(w2_scale, kind),
        BLOCK_H=block_h, num_stages=down_stages, **common,
    )  # fmt: skip
    return output
