# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FP8 MoE layer in one launch of many small units, for decode batches (v12).

What the read probe showed (H100, 2026-12-07): reading a decode layer's weights costs any
kernel 2.3-2.8 µs over the floor in one launch and 4.4-5.0 µs in two, and reading them in
16-32 KB a program instead of 128 KB saves as much again at M = 1.  v9 has three launches
and 128 KB up programs; v10 had one launch but one long program per SM.  Here one launch
has one program per unit of about ``unit_kb`` of weights, and each program takes its unit
from a ticket counter, so a unit's order is the order programs start in:

1. up units (the first tickets): one distinct expert's ``BLOCK_I`` gate and up rows by one
   share of ``K``.  Each quantises its share of the activations to FP8 itself (per token
   and ``GROUP`` columns, as the unfused path does), so no launch runs before.  A tile
   split over several units adds float32 partials into a scratch; the unit that completes
   the tile's count reads them back, zeroes them, applies SiLU-and-mul, quantises the tile
   of the intermediate to FP8 (one scale per token and tile) and marks one more tile of
   its expert ready.  The first ``zero_units`` up units also zero a share of the output.
2. down units (the later tickets): ``BLOCK_H`` rows of one expert's ``w2`` by one share of
   the intermediate.  Each waits until the output is zeroed and its expert's tiles are
   all ready, then adds its routing-weighted share into the output with atomics.

A down unit only waits on up units, whose tickets were taken by programs already running,
so the waits end on any GPU however many programs are resident (and under Triton's
interpreter, which runs programs in order).  Weight tiles come by TMA (host-side tensor
descriptors, as v11).  The last program out resets the counters, each split tile's
finisher its partials: a call (or a CUDA graph's replay) finds them zero.
"""

import torch
from triton.tools.tensor_descriptor import TensorDescriptor
from vllm.triton_utils import tl, triton

QUANT_GROUP = 128  # activation group, the up units' K step and a weight scale block's side
FP8_MAX = 448.0
ZERO_BLOCK = 1024


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
def _wait_until(counter_ptr, target):
    """Spin until the counter reaches ``target``; acquire, so what its producers wrote
    before counting is seen."""
    while tl.atomic_add(counter_ptr, 0, sem="acquire") < target:
        pass


@triton.jit
def _moe_decode_kernel(
    x_ptr,
    w1_desc,
    w1_scale_ptr,
    w2_desc,
    w2_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    aq_ptr,
    as_ptr,
    partial_ptr,
    counters_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    slots,
    up_shares,
    up_steps,
    down_shares,
    down_steps,
    zero_units,
    stride_s1_e,
    stride_s1_n,
    stride_s1_k,
    stride_s2_e,
    stride_s2_n,
    stride_s2_k,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    SCALE_KIND: tl.constexpr,  # 0: per tensor, 1: per channel, 2: 128x128 blocks
    BLOCK_TOKENS: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_H: tl.constexpr,
    GROUP: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    # Counters: [0] tickets taken, [1] programs finished, [2] output shares zeroed,
    # [3, 3 + slots) tiles of each expert ready, then each up tile's arrived shares.
    ticket_ptr = counters_ptr
    finished_ptr = counters_ptr + 1
    zeroed_ptr = counters_ptr + 2
    ready_ptr = counters_ptr + 3
    arrivals_ptr = counters_ptr + 3 + slots
    ticket = tl.atomic_add(ticket_ptr, 1, sem="relaxed")

    offs_t = tl.arange(0, BLOCK_TOKENS)
    k_groups = tl.cdiv(hidden, GROUP)
    i_tiles = tl.cdiv(inter, BLOCK_I)
    up_units = slots * i_tiles * up_shares
    if ticket < up_units:
        # -- The first units zero a share of the output (the down units add into it).
        if ticket < zero_units:
            out_numel = num_tokens * hidden
            offs_z = tl.arange(0, ZERO_BLOCK)
            share = tl.cdiv(tl.cdiv(out_numel, zero_units), ZERO_BLOCK) * ZERO_BLOCK
            for z in range(ticket * share, (ticket + 1) * share, ZERO_BLOCK):
                tl.store(out_ptr + z + offs_z, 0.0, mask=z + offs_z < out_numel)
            tl.debug_barrier()  # every thread's stores are out before the count moves
            tl.atomic_add(zeroed_ptr, 1, sem="release")

        tile = ticket // up_shares
        slot = tile // i_tiles
        i_tile = tile % i_tiles
        expert, routed, pair, _ = _route(
            slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
            TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
        )  # fmt: skip
        if expert >= 0:
            # -- Gate and up rows over this unit's K steps, swapped (weight rows on the
            # MMA's M side, tokens on its N side); the activations quantised here, per
            # token and group, as the unfused path's quantisation does.
            offs_i = i_tile * BLOCK_I + tl.arange(0, BLOCK_I)
            i_mask = offs_i < inter
            offs_g = tl.arange(0, GROUP)
            gate_row = expert * (2 * inter) + i_tile * BLOCK_I  # w1 as (experts * 2I, H)
            k_first = (ticket % up_shares) * up_steps
            k_last = tl.minimum(k_first + up_steps, k_groups)
            s_ptr = w1_scale_ptr + expert.to(tl.int64) * stride_s1_e
            gate = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
            up = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
            for k in range(k_first, k_last):
                cols = k * GROUP + offs_g
                x_mask = routed[:, None] & (cols[None, :] < hidden)
                x_ptrs = x_ptr + offs_t[:, None] * hidden + cols[None, :]
                x = tl.load(x_ptrs, mask=x_mask, other=0.0).to(tl.float32)
                x_scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10), FP8_MAX)
                xq = tl.trans(tl.math.div_rn(x, x_scale[:, None]).to(aq_ptr.dtype.element_ty))
                # Rows past ``inter`` in a last partial tile are the next rows' (masked).
                step_gate = tl.dot(w1_desc.load([gate_row, k * GROUP]), xq) * x_scale[None, :]
                step_up = tl.dot(w1_desc.load([gate_row + inter, k * GROUP]), xq)
                step_up *= x_scale[None, :]
                if SCALE_KIND == 2:
                    block_k = k * stride_s1_k
                    gate_rows = s_ptr + (offs_i // GROUP) * stride_s1_n + block_k
                    up_rows = s_ptr + ((offs_i + inter) // GROUP) * stride_s1_n + block_k
                    step_gate *= tl.load(gate_rows, mask=i_mask)[:, None]
                    step_up *= tl.load(up_rows, mask=i_mask)[:, None]
                gate += step_gate
                up += step_up
            if SCALE_KIND == 0:
                gate *= tl.load(s_ptr)
                up *= tl.load(s_ptr)
            elif SCALE_KIND == 1:
                gate *= tl.load(s_ptr + offs_i * stride_s1_n, mask=i_mask)[:, None]
                up *= tl.load(s_ptr + (offs_i + inter) * stride_s1_n, mask=i_mask)[:, None]

            # -- A split tile: partials into the scratch; the unit that completes the
            # count reads the sums back (from L2, the atomics' level) and zeroes them.
            complete = up_shares == 1
            if not complete:
                sums = partial_ptr + pair[None, :] * (2 * inter) + offs_i[:, None]
                pair_mask = i_mask[:, None] & routed[None, :]
                tl.atomic_add(sums, gate, mask=pair_mask, sem="relaxed")
                tl.atomic_add(sums + inter, up, mask=pair_mask, sem="relaxed")
                tl.debug_barrier()  # every thread's partials are out before the count moves
                arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
                complete = arrived == up_shares - 1
                if complete:
                    gate = tl.load(sums, mask=pair_mask, other=0.0, cache_modifier=".cg")
                    up = tl.load(sums + inter, mask=pair_mask, other=0.0, cache_modifier=".cg")
                    tl.store(sums, 0.0, mask=pair_mask)
                    tl.store(sums + inter, 0.0, mask=pair_mask)
                    tl.store(arrivals_ptr + tile, 0)
            if complete:
                # -- SiLU-and-mul, the tile to FP8 (one scale per token), one more tile
                # of this expert ready.
                act = tl.where(i_mask[:, None], gate * tl.sigmoid(gate) * up, 0.0)
                act_max = tl.maximum(tl.max(tl.abs(act), axis=0), 1e-10)
                act_scale = tl.math.div_rn(act_max, FP8_MAX)
                aq = tl.math.div_rn(act, act_scale[None, :]).to(aq_ptr.dtype.element_ty)
                aq_ptrs = aq_ptr + pair[None, :] * inter + offs_i[:, None]
                tl.store(aq_ptrs, aq, mask=i_mask[:, None] & routed[None, :])
                tl.store(as_ptr + pair * i_tiles + i_tile, act_scale, mask=routed)
                tl.debug_barrier()
                tl.atomic_add(ready_ptr + slot, 1, sem="release")
    else:
        unit = ticket - up_units
        h_tiles = tl.cdiv(hidden, BLOCK_H)
        tile = unit // down_shares
        slot = tile // h_tiles
        h_tile = tile % h_tiles
        expert, routed, pair, route_w = _route(
            slot, topk_ids_ptr, topk_weights_ptr, num_tokens,
            TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS,
        )  # fmt: skip
        if expert >= 0:
            _wait_until(zeroed_ptr, zero_units)
            _wait_until(ready_ptr + slot, i_tiles)
            # -- w2 rows by this unit's share of the intermediate, swapped, FP8 x FP8
            # (BLOCK_I wide: one intermediate scale per token and step).
            offs_h = h_tile * BLOCK_H + tl.arange(0, BLOCK_H)
            h_mask = offs_h < hidden
            offs_k = tl.arange(0, BLOCK_I)
            w_row = expert * hidden + h_tile * BLOCK_H  # w2 as (experts * H, I)
            k_first = (unit % down_shares) * down_steps
            k_last = tl.minimum(k_first + down_steps, i_tiles)
            s_ptr = w2_scale_ptr + expert.to(tl.int64) * stride_s2_e
            acc = tl.zeros((BLOCK_H, BLOCK_TOKENS), dtype=tl.float32)
            for k in range(k_first, k_last):
                cols = k * BLOCK_I + offs_k
                a_mask = routed[:, None] & (cols[None, :] < inter)
                a_ptrs = aq_ptr + pair[:, None] * inter + cols[None, :]
                a = tl.trans(tl.load(a_ptrs, mask=a_mask, other=0.0, cache_modifier=".cg"))
                a_scale = tl.load(
                    as_ptr + pair * i_tiles + k, mask=routed, other=0.0, cache_modifier=".cg"
                )
                # Columns past ``inter`` come zero-filled; rows past ``hidden`` are masked.
                step = tl.dot(w2_desc.load([w_row, k * BLOCK_I]), a) * a_scale[None, :]
                if SCALE_KIND == 2:
                    block_k = (k * BLOCK_I // GROUP) * stride_s2_k
                    w_rows = s_ptr + (offs_h // GROUP) * stride_s2_n + block_k
                    step *= tl.load(w_rows, mask=h_mask)[:, None]
                acc += step
            if SCALE_KIND == 0:
                acc *= tl.load(s_ptr)
            elif SCALE_KIND == 1:
                acc *= tl.load(s_ptr + offs_h * stride_s2_n, mask=h_mask)[:, None]
            tl.atomic_add(
                out_ptr + offs_t[None, :] * hidden + offs_h[:, None],
                (acc * route_w[None, :]).to(out_ptr.dtype.element_ty),
                mask=h_mask[:, None] & routed[None, :],
                sem="relaxed",
            )

    # -- The last program out resets the counters for the next call.
    tl.debug_barrier()
    if tl.atomic_add(finished_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        tl.store(ticket_ptr, 0)
        tl.store(finished_ptr, 0)
        tl.store(zeroed_ptr, 0)
        offs_z = tl.arange(0, ZERO_BLOCK)
        for z in range(0, slots, ZERO_BLOCK):
            tl.store(ready_ptr + z + offs_z, 0, mask=z + offs_z < slots)


_KEPT: dict[tuple[str, torch.device, int], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # kept alive: a captured CUDA graph may still use one


def _kept(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer every launch leaves zero (the counters, the split partials' scratch), one
    per device and stream (two streams' launches at once must not share one): zeroed once
    here, so no launch spends time zeroing it."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    held = _KEPT.get((name, device, stream))
    if held is None or held.numel() < numel:
        if held is not None:
            _RETIRED.append(held)
        held = torch.zeros(max(numel, 4096), dtype=dtype, device=device)
        _KEPT[(name, device, stream)] = held
    return held


def _scale_strides(scale: torch.Tensor, kind: int) -> tuple[int, int, int]:
    strides = (*scale.stride(), 0, 0)
    return strides[0], strides[1] if kind > 0 else 0, strides[2] if kind == 2 else 0


def intermediate_group(num_tokens: int, top_k: int, experts: int, inter: int, sm_count: int):
    """``BLOCK_I`` as v9 chooses it: 128 where (expert, 128-row tile) pairs fill the GPU,
    64 where they would not."""
    slots = min(experts, num_tokens * top_k)
    return 128 if slots * triton.cdiv(inter, 128) >= sm_count else 64


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
    unit_kb: int = 32,
    zero_units: int = 8,
    num_warps: int = 4,
    num_stages: int = 3,
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
    device = output.device
    # Units of about ``unit_kb`` of weights: K steps per up unit and per down unit.
    k_groups = triton.cdiv(hidden, QUANT_GROUP)
    i_tiles = triton.cdiv(inter, block_i)
    up_steps = max(1, unit_kb * 1024 // (2 * block_i * QUANT_GROUP))
    up_shares = triton.cdiv(k_groups, up_steps)
    up_steps = triton.cdiv(k_groups, up_shares)
    down_steps = max(1, unit_kb * 1024 // (block_h * block_i))
    down_shares = triton.cdiv(i_tiles, down_steps)
    down_steps = triton.cdiv(i_tiles, down_shares)
    up_units = slots * i_tiles * up_shares
    down_units = slots * triton.cdiv(hidden, block_h) * down_shares
    zero_units = min(zero_units, up_units)

    partial = _kept("partial", num_tokens * top_k * 2 * inter, torch.float32, device)
    counters = _kept("counters", 3 + slots + slots * i_tiles, torch.int32, device)
    aq = torch.empty((num_tokens * top_k, inter), dtype=w1.dtype, device=device)
    a_scales = torch.empty((num_tokens * top_k, i_tiles), dtype=torch.float32, device=device)
    w1_desc = TensorDescriptor.from_tensor(w1.view(experts * n, hidden), [block_i, QUANT_GROUP])
    w2_desc = TensorDescriptor.from_tensor(w2.view(experts * hidden, inter), [block_h, block_i])
    _moe_decode_kernel[(up_units + down_units,)](
        hidden_states, w1_desc, w1_scale, w2_desc, w2_scale, topk_ids, topk_weights,
        aq, a_scales, partial, counters, output,
        num_tokens, hidden, inter, slots, up_shares, up_steps, down_shares, down_steps,
        zero_units, *_scale_strides(w1_scale, kind), *_scale_strides(w2_scale, kind),
        TOP_K=top_k, TOP_K_PAD=triton.next_power_of_2(top_k),
        EXPERT_BINS=triton.next_power_of_2(experts), SCALE_KIND=kind,
        BLOCK_TOKENS=max(16, triton.next_power_of_2(num_tokens)), BLOCK_I=block_i,
        BLOCK_H=block_h, GROUP=QUANT_GROUP, ZERO_BLOCK=ZERO_BLOCK, FP8_MAX=FP8_MAX,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return output
