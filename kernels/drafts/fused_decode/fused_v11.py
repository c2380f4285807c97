# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FP8 MoE layer in three launches, for decode batches (v11: v9 with every weight tile
loaded by the tensor memory accelerator, through host-side tensor descriptors).

v9's kernels issue each weight tile as 16-byte asynchronous copies, several per thread;
here one TMA copy per tile fills the pipeline's buffer, out-of-range columns zero-filled,
which leaves the threads free and lets a program keep more of its tiles in flight.
The rest is v9's, as it describes below.

The candidate for the patch, from the H100 runs of v5-v8: v6's three launches, with
``BLOCK_I`` (the up kernel's rows per program, so the intermediate's quantisation groups and
the down kernel's K step) 128 where the up kernel's (expert, 128-row tile) programs fill the
GPU and 64 where they would not, and the FP8 scales and quotients divided exactly
(``div_rn``; Triton's float32 ``/`` is approximate, which breaks FP8 rounding ties one way
where a scale is exact).

1. ``_moe_decode_quant_kernel``: each token's activations to FP8 per ``QUANT_GROUP``
   columns, and the output zeroed (the third launch adds into it).
2. ``_moe_decode_up_kernel``: each program owns one distinct expert of the batch, one
   tile of ``BLOCK_I`` gate and up rows and one share of ``K``; the tile's last share
   applies SiLU-and-mul and quantises the tile of the intermediate to FP8, one scale per
   token and tile (so the intermediate's groups are ``BLOCK_I`` wide, where the unfused
   path's are 128).
3. ``_moe_decode_down_kernel``: each program owns one expert, one tile of ``w2`` rows and
   one share of the intermediate (split-K), and adds its routing-weighted result into the
   output with atomics.

Each chosen expert's weights are read once, with no routing alignment.  The quant launch
zeroes the scratch and the last share resets its tile's counter, so nothing carries over
between calls and CUDA graphs capture it as is.
"""

import torch
from triton.tools.tensor_descriptor import TensorDescriptor
from vllm.triton_utils import tl, triton

QUANT_GROUP = 128  # activation group, both kernels' K step and a weight scale block's side
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
    # Expert id -1 (a padding row under VLLM_MOE_SKIP_PADDING) routes nowhere.
    route_mask = route_mask & (ids >= 0)
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
def _moe_decode_quant_kernel(
    x_ptr,
    xq_ptr,
    xs_ptr,
    out_ptr,
    scratch_ptr,
    hidden,
    out_numel,
    scratch_numel,
    GROUP: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    token = tl.program_id(0)
    group = tl.program_id(1)
    offs = group * GROUP + tl.arange(0, GROUP)
    mask = offs < hidden
    x = tl.load(x_ptr + token * hidden + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), 1e-10), FP8_MAX)
    xq = tl.math.div_rn(x, scale).to(xq_ptr.dtype.element_ty)
    tl.store(xq_ptr + token * hidden + offs, xq, mask=mask)
    tl.store(xs_ptr + token * tl.num_programs(1) + group, scale)

    # -- The later launches add into the output and the up kernel's scratch: zero this
    # program's share of both.
    programs = tl.num_programs(0) * tl.num_programs(1)
    flat = token * tl.num_programs(1) + group
    offs_z = tl.arange(0, ZERO_BLOCK)
    share = tl.cdiv(tl.cdiv(out_numel, programs), ZERO_BLOCK) * ZERO_BLOCK
    for z in range(flat * share, (flat + 1) * share, ZERO_BLOCK):
        tl.store(out_ptr + z + offs_z, 0.0, mask=z + offs_z < out_numel)
    share = tl.cdiv(tl.cdiv(scratch_numel, programs), ZERO_BLOCK) * ZERO_BLOCK
    for z in range(flat * share, (flat + 1) * share, ZERO_BLOCK):
        tl.store(scratch_ptr + z + offs_z, 0.0, mask=z + offs_z < scratch_numel)


@triton.jit
def _moe_decode_up_kernel(
    xq_ptr,
    xs_ptr,
    w1_desc,
    w1_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    aq_ptr,
    as_ptr,
    partial_ptr,
    arrivals_ptr,
    num_tokens,
    hidden,
    inter,
    k_groups_per_split,
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
    FP8_MAX: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    i_tiles = tl.cdiv(inter, BLOCK_I)
    slot = pid // i_tiles
    i_tile = pid % i_tiles
    expert, routed, pair, _ = _route(
        slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
        TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
    )  # fmt: skip
    if expert < 0:
        return

    # -- Gate and up rows of this tile over this split's share of K, swapped: weight rows on
    # the MMA's M side, the tokens on its N side; FP8 x FP8 into float32, scaled per K step.
    offs_i = i_tile * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = offs_i < inter
    offs_g = tl.arange(0, GROUP)
    offs_t = tl.arange(0, BLOCK_TOKENS)
    k_groups = tl.cdiv(hidden, GROUP)
    k_first = split * k_groups_per_split
    k_last = tl.minimum(k_first + k_groups_per_split, k_groups)
    gate_row = expert * (2 * inter) + i_tile * BLOCK_I  # w1 as (experts * 2I, H)
    x_ptrs = xq_ptr + offs_t[:, None] * hidden + k_first * GROUP + offs_g[None, :]
    s_ptr = w1_scale_ptr + expert.to(tl.int64) * stride_s1_e
    gate = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
    up = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_mask = k * GROUP + offs_g < hidden
        x = tl.trans(tl.load(x_ptrs, mask=routed[:, None] & k_mask[None, :], other=0.0))
        x_scale = tl.load(xs_ptr + offs_t * k_groups + k, mask=routed, other=0.0)
        # Rows past ``inter`` in a last partial tile are the next rows' (masked below).
        step_gate = tl.dot(w1_desc.load([gate_row, k * GROUP]), x) * x_scale[None, :]
        step_up = tl.dot(w1_desc.load([gate_row + inter, k * GROUP]), x) * x_scale[None, :]
        if SCALE_KIND == 2:
            block_k = k * stride_s1_k
            step_gate *= tl.load(s_ptr + (offs_i // GROUP) * stride_s1_n + block_k, mask=i_mask)[
                :, None
            ]
            step_up *= tl.load(
                s_ptr + ((offs_i + inter) // GROUP) * stride_s1_n + block_k, mask=i_mask
            )[:, None]
        gate += step_gate
        up += step_up
        x_ptrs += GROUP
    if SCALE_KIND == 0:
        gate *= tl.load(s_ptr)
        up *= tl.load(s_ptr)
    elif SCALE_KIND == 1:
        gate *= tl.load(s_ptr + offs_i * stride_s1_n, mask=i_mask)[:, None]
        up *= tl.load(s_ptr + (offs_i + inter) * stride_s1_n, mask=i_mask)[:, None]

    # -- Split: add the partial sums into the scratch; the tile's last split reads the whole
    # sums back (from L2: the atomics' level) and goes on, resetting the tile's counter.
    if splits > 1:
        gate_rows = partial_ptr + pair[None, :] * (2 * inter) + offs_i[:, None]
        pair_mask = i_mask[:, None] & routed[None, :]
        tl.atomic_add(gate_rows, gate, mask=pair_mask, sem="relaxed")
        tl.atomic_add(gate_rows + inter, up, mask=pair_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partials are out before the count moves
        arrived = tl.atomic_add(arrivals_ptr + pid, 1, sem="acq_rel")
        if arrived < splits - 1:
            return
        gate = tl.load(gate_rows, mask=pair_mask, other=0.0, cache_modifier=".cg")
        up = tl.load(gate_rows + inter, mask=pair_mask, other=0.0, cache_modifier=".cg")
        tl.store(arrivals_ptr + pid, 0)

    # -- SiLU-and-mul, then this tile of the intermediate to FP8: one scale per token.
    act = tl.where(i_mask[:, None], gate * tl.sigmoid(gate) * up, 0.0)
    act_scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(act), axis=0), 1e-10), FP8_MAX)
    aq_ptrs = aq_ptr + pair[None, :] * inter + offs_i[:, None]
    tl.store(
        aq_ptrs,
        tl.math.div_rn(act, act_scale[None, :]).to(aq_ptr.dtype.element_ty),
        mask=i_mask[:, None] & routed[None, :],
    )
    tl.store(as_ptr + pair * i_tiles + i_tile, act_scale, mask=routed)


@triton.jit
def _moe_decode_down_kernel(
    aq_ptr,
    as_ptr,
    w2_desc,
    w2_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    k_steps_per_split,
    stride_s2_e,
    stride_s2_n,
    stride_s2_k,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_I: tl.constexpr,
    GROUP: tl.constexpr,
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

    # -- Swapped FP8 GEMM over this split's K steps (BLOCK_I wide: one intermediate scale
    # per token and step).
    offs_h = h_tile * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < hidden
    offs_k = tl.arange(0, BLOCK_I)
    i_tiles = tl.cdiv(inter, BLOCK_I)
    k_first = split * k_steps_per_split
    k_last = tl.minimum(k_first + k_steps_per_split, i_tiles)
    w_row = expert * hidden + h_tile * BLOCK_H  # w2 as (experts * H, I)
    a_ptrs = aq_ptr + pair[:, None] * inter + k_first * BLOCK_I + offs_k[None, :]
    s_ptr = w2_scale_ptr + expert.to(tl.int64) * stride_s2_e
    acc = tl.zeros((BLOCK_H, BLOCK_TOKENS), dtype=tl.float32)
    for k in range(k_first, k_last):
        k_mask = k * BLOCK_I + offs_k < inter
        a = tl.trans(tl.load(a_ptrs, mask=routed[:, None] & k_mask[None, :], other=0.0))
        a_scale = tl.load(as_ptr + pair * i_tiles + k, mask=routed, other=0.0)
        # Columns past ``inter`` come zero-filled; rows past ``hidden`` are masked below.
        step = tl.dot(w2_desc.load([w_row, k * BLOCK_I]), a) * a_scale[None, :]
        if SCALE_KIND == 2:
            block_k = (k * BLOCK_I // GROUP) * stride_s2_k
            step *= tl.load(s_ptr + (offs_h // GROUP) * stride_s2_n + block_k, mask=h_mask)[:, None]
        acc += step
        a_ptrs += BLOCK_I
    if SCALE_KIND == 0:
        acc *= tl.load(s_ptr)
    elif SCALE_KIND == 1:
        acc *= tl.load(s_ptr + offs_h * stride_s2_n, mask=h_mask)[:, None]

    # -- Weighted by the routing and added into the tokens' output rows.
    offs_t = tl.arange(0, BLOCK_TOKENS)
    tl.atomic_add(
        out_ptr + offs_t[None, :] * hidden + offs_h[:, None],
        (acc * route_w[None, :]).to(out_ptr.dtype.element_ty),
        mask=h_mask[:, None] & routed[None, :],
        sem="relaxed",
    )


_ARRIVALS: dict[torch.device, torch.Tensor] = {}


def _arrivals(tiles: int, device: torch.device) -> torch.Tensor:
    """The up kernel's counters: zeroed once, then reset by each tile's last split, so a
    call (or a CUDA graph's replay) finds them zero."""
    held = _ARRIVALS.get(device)
    if held is None or held.numel() < tiles:
        held = _ARRIVALS[device] = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
    return held


def _scale_strides(scale: torch.Tensor, kind: int) -> tuple[int, int, int]:
    strides = (*scale.stride(), 0, 0)
    return strides[0], strides[1] if kind > 0 else 0, strides[2] if kind == 2 else 0


def intermediate_group(num_tokens: int, top_k: int, experts: int, inter: int, sm_count: int):
    """``BLOCK_I``: whole 128-byte lines where the up kernel's (expert, 128-row tile)
    programs fill the GPU, half lines (twice the programs) where they would not."""
    slots = min(experts, num_tokens * top_k)
    return 128 if slots * triton.cdiv(inter, 128) >= sm_count else 64


def _splits(tiles: int, most: int, slots: int, balance_waves: bool) -> int:
    """How many shares of K a launch's ``tiles`` get, at most ``most``: as many as fill the
    GPU's ``slots`` (programs at once); or, with ``balance_waves``, the fewest whose waves
    (time ~ waves / shares) come within 5% of the best count's."""
    if not balance_waves:
        return max(1, min(most, triton.cdiv(slots, tiles)))
    counts = range(1, max(1, most) + 1)
    time = {s: triton.cdiv(tiles * s, slots) / s for s in counts}
    best = min(time.values())
    return next(s for s in counts if time[s] <= 1.05 * best)


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
    block_i: int | None = None,
    block_h: int = 128,
    programs_per_sm: int = 1,
    min_steps: int = 2,
    num_warps: int = 4,
    up_stages: int = 4,
    down_stages: int = 4,
    balance_waves: bool = False,
) -> torch.Tensor:
    """``output = sum_k w_k * w2_e(silu_and_mul(w1_e x))`` for FP8 ``w1`` ``(E, 2I, H)``
    and ``w2`` ``(E, H, I)``, from unquantised ``hidden_states`` ``(M, H)``."""
    num_tokens, hidden = hidden_states.shape
    experts, n, _ = w1.shape
    inter = n // 2
    top_k = topk_ids.size(1)
    kind = 2 if block_shape is not None else (1 if per_channel else 0)
    slots = min(experts, num_tokens * top_k)
    block_i = block_i or intermediate_group(num_tokens, top_k, experts, inter, sm_count)
    assert kind != 2 or QUANT_GROUP % block_i == 0, "a block-scaled step needs one w2 scale"
    k_groups = triton.cdiv(hidden, QUANT_GROUP)
    routing = dict(
        TOP_K=top_k,
        TOP_K_PAD=triton.next_power_of_2(top_k),
        EXPERT_BINS=triton.next_power_of_2(experts),
        SCALE_KIND=kind,
        BLOCK_TOKENS=max(16, triton.next_power_of_2(num_tokens)),
        GROUP=QUANT_GROUP,
        num_warps=num_warps,
    )
    fp8, device = w1.dtype, output.device
    i_tiles = triton.cdiv(inter, block_i)
    up_tiles = slots * i_tiles
    # Split the up kernel's K only as far as the GPU needs programs (or its waves balance),
    # keeping at least ``min_steps`` K steps per split.
    up_splits = _splits(up_tiles, k_groups // min_steps, programs_per_sm * sm_count, balance_waves)
    per_up_split = triton.cdiv(k_groups, up_splits)
    up_splits = triton.cdiv(k_groups, per_up_split)
    partial = torch.empty(
        (num_tokens * top_k, 2 * inter) if up_splits > 1 else (0,),
        dtype=torch.float32, device=device,
    )  # fmt: skip
    arrivals = _arrivals(up_tiles, device)

    xq = torch.empty((num_tokens, hidden), dtype=fp8, device=device)
    xs = torch.empty((num_tokens, k_groups), dtype=torch.float32, device=device)
    _moe_decode_quant_kernel[(num_tokens, k_groups)](
        hidden_states, xq, xs, output, partial, hidden, output.numel(), partial.numel(),
        GROUP=QUANT_GROUP, ZERO_BLOCK=1024, FP8_MAX=FP8_MAX,
    )  # fmt: skip

    aq = torch.empty((num_tokens * top_k, inter), dtype=fp8, device=device)
    a_scales = torch.empty((num_tokens * top_k, i_tiles), dtype=torch.float32, device=device)
    w1_desc = TensorDescriptor.from_tensor(w1.view(experts * n, hidden), [block_i, QUANT_GROUP])
    _moe_decode_up_kernel[(up_tiles, up_splits)](
        xq, xs, w1_desc, w1_scale, topk_ids, topk_weights, aq, a_scales, partial, arrivals,
        num_tokens, hidden, inter, per_up_split, *_scale_strides(w1_scale, kind),
        BLOCK_I=block_i, FP8_MAX=FP8_MAX, num_stages=up_stages, **routing,
    )  # fmt: skip

    down_tiles = slots * triton.cdiv(hidden, block_h)
    splits = _splits(down_tiles, i_tiles // min_steps, programs_per_sm * sm_count, balance_waves)
    per_split = triton.cdiv(i_tiles, splits)
    w2_desc = TensorDescriptor.from_tensor(w2.view(experts * hidden, inter), [block_h, block_i])
    _moe_decode_down_kernel[(down_tiles, triton.cdiv(i_tiles, per_split))](
        aq, a_scales, w2_desc, w2_scale, topk_ids, topk_weights, output,
        num_tokens, hidden, inter, per_split, *_scale_strides(w2_scale, kind),
        BLOCK_H=block_h, BLOCK_I=block_i, num_stages=down_stages, **routing,
    )  # fmt: skip
    return output
