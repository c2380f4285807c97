# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The FP8 MoE layer in one launch, for decode batches (v10: a persistent grid, each
phase's work divided evenly over its programs).

What v9 left (H200 and H100 runs): at M = 1 each of its three launches pays its own start
and drain, and the up and down kernels' programs come in uneven waves (e.g. 192 programs
on 132 SMs).  Here one program per SM (``grid``) walks three phases:

1. quantise: the first programs quantise the activations to FP8 (per token and
   ``GROUP`` columns), zero the output, and count
   themselves done;
2. up: once that count is full, the units (one ``GROUP``-deep K step of one distinct
   expert's ``BLOCK_I`` gate and up rows) are dealt out in equal contiguous runs
   (stream-K); a tile whose K steps fall to several programs adds float32 partials into
   the scratch, and the one that brings the tile's count of steps to the whole applies
   SiLU-and-mul, quantises the tile of the intermediate to FP8 (one scale per token and
   tile, 128 wide as the unfused path's groups) and marks one more tile of that expert
   ready;
3. down: units of ``BLOCK_H`` rows of ``w2`` by one ``BLOCK_I`` step, dealt out the same
   way; a program waits until its expert's tiles are all ready, then adds its
   routing-weighted share into the output with atomics.

The waits need every program resident at once (one per SM, no other grid-wide waits in
flight); the last program to finish resets the counters and each split tile's finisher
zeroes its partials, so a call (or a CUDA graph's replay) finds counters and scratch
zero.  ``one_launch=False`` runs the phases as three launches of the
same kernel with no waits (Triton's interpreter runs programs one after another, so a
wait on a later program would never end there).
"""

import torch
from vllm.triton_utils import tl, triton

GROUP = 128  # activation group, the up phase's K step and a weight scale block's side
BLOCK_I = 128  # intermediate rows per up tile: the down phase's K step, a whole line
FP8_MAX = 448.0
QUANTISE, UP, DOWN = 1, 2, 4  # phase bits


@triton.jit
def _routing(
    topk_ids_ptr,
    topk_weights_ptr,
    num_tokens,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    """The batch's routing, read once per program and kept in registers: ids, weights,
    which entries count, and each expert id's rank among the distinct ones (or -1)."""
    offs_t = tl.arange(0, BLOCK_TOKENS)
    offs_k = tl.arange(0, TOP_K_PAD)
    route_mask = (offs_t[:, None] < num_tokens) & (offs_k[None, :] < TOP_K)
    route_offs = offs_t[:, None] * TOP_K + offs_k[None, :]
    ids = tl.load(topk_ids_ptr + route_offs, mask=route_mask, other=0).to(tl.int32)
    # Expert id -1 (a padding row under VLLM_MOE_SKIP_PADDING) routes nowhere.
    route_mask = route_mask & (ids >= 0)
    weights = tl.load(topk_weights_ptr + route_offs, mask=route_mask, other=0.0)
    counts = tl.histogram(
        tl.reshape(ids, [BLOCK_TOKENS * TOP_K_PAD]),
        EXPERT_BINS,
        mask=tl.reshape(route_mask, [BLOCK_TOKENS * TOP_K_PAD]),
    )
    present = counts > 0
    rank = tl.where(present, tl.cumsum(present.to(tl.int32), axis=0) - 1, -1)
    return ids, weights.to(tl.float32), route_mask, rank


@triton.jit
def _route(
    slot,
    ids,
    weights,
    route_mask,
    rank,
    TOP_K: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    EXPERT_BINS: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    """The slot-th distinct expert of the batch (in id order; -1 past the last one),
    which tokens it serves, at which top-k position, with what routing weight."""
    offs_t = tl.arange(0, BLOCK_TOKENS)
    offs_k = tl.arange(0, TOP_K_PAD)
    expert = tl.max(tl.where(rank == slot, tl.arange(0, EXPERT_BINS), -1), axis=0)
    chosen = route_mask & (ids == expert)
    routed = tl.sum(chosen.to(tl.int32), axis=1) > 0
    position = tl.sum(tl.where(chosen, offs_k[None, :], 0), axis=1)
    route_w = tl.sum(tl.where(chosen, weights, 0.0), axis=1)
    return expert, routed, offs_t * TOP_K + position, route_w


@triton.jit
def _wait_until(counter_ptr, target):
    """Spin until the counter reaches ``target``; acquire, so what its producers wrote
    before counting is seen."""
    while tl.atomic_add(counter_ptr, 0, sem="acquire") < target:
        pass


@triton.jit
def _quantise_share(
    x_ptr,
    xq_ptr,
    xs_ptr,
    out_ptr,
    num_tokens,
    hidden,
    out_numel,
    program,
    programs,
    BLOCK_TOKENS: tl.constexpr,
    GROUP: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """This program's groups of columns of every token to FP8, and its share of the
    output zeroed (the down phase adds into it)."""
    offs_t = tl.arange(0, BLOCK_TOKENS)
    offs_g = tl.arange(0, GROUP)
    k_groups = tl.cdiv(hidden, GROUP)
    for group in range(program, k_groups, programs):
        offs = group * GROUP + offs_g
        mask = (offs_t[:, None] < num_tokens) & (offs[None, :] < hidden)
        x_offs = offs_t[:, None] * hidden + offs[None, :]
        x = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10), FP8_MAX)
        xq = tl.math.div_rn(x, scale[:, None]).to(xq_ptr.dtype.element_ty)
        tl.store(xq_ptr + x_offs, xq, mask=mask)
        tl.store(xs_ptr + offs_t * k_groups + group, scale, mask=offs_t < num_tokens)
    offs_z = tl.arange(0, ZERO_BLOCK)
    share = tl.cdiv(tl.cdiv(out_numel, programs), ZERO_BLOCK) * ZERO_BLOCK
    for z in range(program * share, (program + 1) * share, ZERO_BLOCK):
        tl.store(out_ptr + z + offs_z, 0.0, mask=z + offs_z < out_numel)


@triton.jit
def _moe_decode_kernel(
    x_ptr,
    xq_ptr,
    xs_ptr,
    w1_ptr,
    w1_scale_ptr,
    w2_ptr,
    w2_scale_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    aq_ptr,
    as_ptr,
    scratch_ptr,
    counters_ptr,
    out_ptr,
    num_tokens,
    hidden,
    inter,
    max_slots,
    quant_programs,
    out_numel,
    stride_w1_e,
    stride_w1_n,
    stride_s1_e,
    stride_s1_n,
    stride_s1_k,
    stride_w2_e,
    stride_w2_n,
    stride_s2_e,
    stride_s2_n,
    stride_s2_k,
    PHASES: tl.constexpr,  # which of QUANTISE | UP | DOWN this launch runs
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
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    ONE_LAUNCH: tl.constexpr = PHASES == 7
    # Counters: [0] quantising programs done, [1] programs finished, [2, 2 + max_slots)
    # tiles of each expert ready, then each up tile's K steps summed so far.
    quant_done_ptr = counters_ptr
    finished_ptr = counters_ptr + 1
    ready_ptr = counters_ptr + 2
    steps_ptr = counters_ptr + 2 + max_slots

    offs_t = tl.arange(0, BLOCK_TOKENS)
    offs_g = tl.arange(0, GROUP)
    k_groups = tl.cdiv(hidden, GROUP)
    i_tiles = tl.cdiv(inter, BLOCK_I)
    h_tiles = tl.cdiv(hidden, BLOCK_H)
    ids, weights, route_mask, rank = _routing(
        topk_ids_ptr, topk_weights_ptr, num_tokens, TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS
    )
    distinct = tl.max(rank, axis=0) + 1

    # -- Phase 1: activations to FP8, output zeroed.
    if PHASES & 1:
        if program < quant_programs:
            _quantise_share(
                x_ptr, xq_ptr, xs_ptr, out_ptr, num_tokens, hidden, out_numel,
                program, quant_programs,
                BLOCK_TOKENS, GROUP, ZERO_BLOCK, FP8_MAX,
            )  # fmt: skip
            if ONE_LAUNCH:
                tl.debug_barrier()  # every thread's stores are out before the count moves
                tl.atomic_add(quant_done_ptr, 1, sem="release")

    # -- Phase 2: gate and up rows, swapped (weight rows on the MMA's M side, tokens on its
    # N side), FP8 x FP8 into float32; this program's equal run of (tile, K step) units.
    if PHASES & 2:
        units = distinct * i_tiles * k_groups
        first = program * units // programs
        last = (program + 1) * units // programs
        if ONE_LAUNCH and first < last:
            _wait_until(quant_done_ptr, quant_programs)
        offs_i0 = tl.arange(0, BLOCK_I)
        for tile in range(first // k_groups, tl.cdiv(last, k_groups)):
            k_first = tl.maximum(first, tile * k_groups) - tile * k_groups
            k_last = tl.minimum(last, (tile + 1) * k_groups) - tile * k_groups
            slot = tile // i_tiles
            expert, routed, pair, route_w = _route(
                slot, ids, weights, route_mask, rank, TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS
            )
            offs_i = (tile % i_tiles) * BLOCK_I + offs_i0
            i_mask = offs_i < inter
            gate_ptrs = (
                w1_ptr + expert.to(tl.int64) * stride_w1_e
                + offs_i[:, None] * stride_w1_n + k_first * GROUP + offs_g[None, :]
            )  # fmt: skip
            up_ptrs = gate_ptrs + inter * stride_w1_n
            x_ptrs = xq_ptr + offs_t[:, None] * hidden + k_first * GROUP + offs_g[None, :]
            s_ptr = w1_scale_ptr + expert.to(tl.int64) * stride_s1_e
            gate = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
            up = tl.zeros((BLOCK_I, BLOCK_TOKENS), dtype=tl.float32)
            for k in range(k_first, k_last):
                k_mask = k * GROUP + offs_g < hidden
                x = tl.trans(tl.load(x_ptrs, mask=routed[:, None] & k_mask[None, :], other=0.0))
                x_scale = tl.load(xs_ptr + offs_t * k_groups + k, mask=routed, other=0.0)
                w_mask = i_mask[:, None] & k_mask[None, :]
                step_gate = tl.dot(tl.load(gate_ptrs, mask=w_mask, other=0.0), x)
                step_up = tl.dot(tl.load(up_ptrs, mask=w_mask, other=0.0), x)
                step_gate *= x_scale[None, :]
                step_up *= x_scale[None, :]
                if SCALE_KIND == 2:
                    block_k = k * stride_s1_k
                    gate_rows = s_ptr + (offs_i // GROUP) * stride_s1_n + block_k
                    up_rows = s_ptr + ((offs_i + inter) // GROUP) * stride_s1_n + block_k
                    step_gate *= tl.load(gate_rows, mask=i_mask)[:, None]
                    step_up *= tl.load(up_rows, mask=i_mask)[:, None]
                gate += step_gate
                up += step_up
                gate_ptrs += GROUP
                up_ptrs += GROUP
                x_ptrs += GROUP
            if SCALE_KIND == 0:
                gate *= tl.load(s_ptr)
                up *= tl.load(s_ptr)
            elif SCALE_KIND == 1:
                gate *= tl.load(s_ptr + offs_i * stride_s1_n, mask=i_mask)[:, None]
                up *= tl.load(s_ptr + (offs_i + inter) * stride_s1_n, mask=i_mask)[:, None]

            # A tile shared with other programs: partials into the scratch; the program
            # whose steps complete the tile's count reads the sums back (from L2, the
            # atomics' level), zeroes them and the count, and goes on.
            complete = (k_first == 0) & (k_last == k_groups)
            if not complete:
                sums = scratch_ptr + pair[None, :] * (2 * inter) + offs_i[:, None]
                pair_mask = i_mask[:, None] & routed[None, :]
                tl.atomic_add(sums, gate, mask=pair_mask, sem="relaxed")
                tl.atomic_add(sums + inter, up, mask=pair_mask, sem="relaxed")
                tl.debug_barrier()  # every thread's partials are out before the count moves
                before = tl.atomic_add(steps_ptr + tile, k_last - k_first, sem="acq_rel")
                complete = before + k_last - k_first == k_groups
                if complete:
                    gate = tl.load(sums, mask=pair_mask, other=0.0, cache_modifier=".cg")
                    up = tl.load(sums + inter, mask=pair_mask, other=0.0, cache_modifier=".cg")
                    tl.store(sums, 0.0, mask=pair_mask)
                    tl.store(sums + inter, 0.0, mask=pair_mask)
                    tl.store(steps_ptr + tile, 0)
            if complete:
                # SiLU-and-mul, then the tile to FP8: one scale per token.
                act = tl.where(i_mask[:, None], gate * tl.sigmoid(gate) * up, 0.0)
                act_max = tl.maximum(tl.max(tl.abs(act), axis=0), 1e-10)
                act_scale = tl.math.div_rn(act_max, FP8_MAX)
                aq = tl.math.div_rn(act, act_scale[None, :]).to(aq_ptr.dtype.element_ty)
                aq_ptrs = aq_ptr + pair[None, :] * inter + offs_i[:, None]
                tl.store(aq_ptrs, aq, mask=i_mask[:, None] & routed[None, :])
                tl.store(as_ptr + pair * i_tiles + tile % i_tiles, act_scale, mask=routed)
                if ONE_LAUNCH:
                    tl.debug_barrier()
                    tl.atomic_add(ready_ptr + slot, 1, sem="release")

    # -- Phase 3: w2 rows by the intermediate, swapped, FP8 x FP8; each tile's share is
    # weighted by the routing and added into the tokens' output rows.
    if PHASES & 4:
        units = distinct * h_tiles * i_tiles
        first = program * units // programs
        last = (program + 1) * units // programs
        offs_h0 = tl.arange(0, BLOCK_H)
        offs_k = tl.arange(0, BLOCK_I)
        for tile in range(first // i_tiles, tl.cdiv(last, i_tiles)):
            k_first = tl.maximum(first, tile * i_tiles) - tile * i_tiles
            k_last = tl.minimum(last, (tile + 1) * i_tiles) - tile * i_tiles
            slot = tile // h_tiles
            expert, routed, pair, route_w = _route(
                slot, ids, weights, route_mask, rank, TOP_K, TOP_K_PAD, EXPERT_BINS, BLOCK_TOKENS
            )
            if ONE_LAUNCH:
                _wait_until(ready_ptr + slot, i_tiles)
            offs_h = (tile % h_tiles) * BLOCK_H + offs_h0
            h_mask = offs_h < hidden
            w_ptrs = (
                w2_ptr + expert.to(tl.int64) * stride_w2_e
                + offs_h[:, None] * stride_w2_n + k_first * BLOCK_I + offs_k[None, :]
            )  # fmt: skip
            a_ptrs = aq_ptr + pair[:, None] * inter + k_first * BLOCK_I + offs_k[None, :]
            s_ptr = w2_scale_ptr + expert.to(tl.int64) * stride_s2_e
            acc = tl.zeros((BLOCK_H, BLOCK_TOKENS), dtype=tl.float32)
            # The intermediate came from other programs of this launch: read it from the L2
            # (an L1 line shared with a row not yet ready could be stale).
            for k in range(k_first, k_last):
                k_mask = k * BLOCK_I + offs_k < inter
                a_mask = routed[:, None] & k_mask[None, :]
                a = tl.trans(tl.load(a_ptrs, mask=a_mask, other=0.0, cache_modifier=".cg"))
                a_scale = tl.load(
                    as_ptr + pair * i_tiles + k, mask=routed, other=0.0, cache_modifier=".cg"
                )
                w = tl.load(w_ptrs, mask=h_mask[:, None] & k_mask[None, :], other=0.0)
                step = tl.dot(w, a) * a_scale[None, :]
                if SCALE_KIND == 2:
                    block_k = (k * BLOCK_I // GROUP) * stride_s2_k
                    w_rows = s_ptr + (offs_h // GROUP) * stride_s2_n + block_k
                    step *= tl.load(w_rows, mask=h_mask)[:, None]
                acc += step
                w_ptrs += BLOCK_I
                a_ptrs += BLOCK_I
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
    if ONE_LAUNCH:
        tl.debug_barrier()
        if tl.atomic_add(finished_ptr, 1, sem="acq_rel") == programs - 1:
            tl.store(quant_done_ptr, 0)
            tl.store(finished_ptr, 0)
            offs_z = tl.arange(0, ZERO_BLOCK)
            for z in range(0, max_slots, ZERO_BLOCK):
                tl.store(ready_ptr + z + offs_z, 0, mask=z + offs_z < max_slots)


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
    """The intermediate's quantisation group: always ``BLOCK_I``."""
    return BLOCK_I


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
    block_h: int = 128,
    one_launch: bool = True,
    cooperative: bool = True,
    quant_programs: int = 64,
    num_warps: int = 4,
    num_stages: int = 4,
) -> torch.Tensor:
    """``output = sum_k w_k * w2_e(silu_and_mul(w1_e x))`` for FP8 ``w1`` ``(E, 2I, H)``
    and ``w2`` ``(E, H, I)``, from unquantised ``hidden_states`` ``(M, H)``; ``sm_count``
    programs (one launch) or three launches of them (``one_launch=False``)."""
    num_tokens, hidden = hidden_states.shape
    experts, n, _ = w1.shape
    inter = n // 2
    top_k = topk_ids.size(1)
    kind = 2 if block_shape is not None else (1 if per_channel else 0)
    max_slots = min(experts, num_tokens * top_k)
    k_groups = triton.cdiv(hidden, GROUP)
    i_tiles = triton.cdiv(inter, BLOCK_I)
    fp8, device = w1.dtype, output.device
    # One launch waits on its own programs, so they must all be resident: one per SM, and
    # a cooperative launch, which the driver refuses (an error, not a hang) where they
    # would not all fit.
    cooperative = one_launch and cooperative and device.type == "cuda"
    programs = sm_count
    if one_launch and device.type == "cuda":
        programs = min(programs, torch.cuda.get_device_properties(device).multi_processor_count)
    scratch = _kept("scratch", num_tokens * top_k * 2 * inter, torch.float32, device)
    counters = _kept("counters", 2 + max_slots + max_slots * i_tiles, torch.int32, device)
    xq = torch.empty((num_tokens, hidden), dtype=fp8, device=device)
    xs = torch.empty((num_tokens, k_groups), dtype=torch.float32, device=device)
    aq = torch.empty((num_tokens * top_k, inter), dtype=fp8, device=device)
    a_scales = torch.empty((num_tokens * top_k, i_tiles), dtype=torch.float32, device=device)
    args = (
        hidden_states, xq, xs, w1, w1_scale, w2, w2_scale, topk_ids, topk_weights, aq,
        a_scales, scratch, counters, output, num_tokens, hidden, inter, max_slots,
        min(quant_programs, programs, k_groups), output.numel(),
        w1.stride(0), w1.stride(1), *_scale_strides(w1_scale, kind),
        w2.stride(0), w2.stride(1), *_scale_strides(w2_scale, kind),
    )  # fmt: skip
    meta = dict(
        TOP_K=top_k,
        TOP_K_PAD=triton.next_power_of_2(top_k),
        EXPERT_BINS=triton.next_power_of_2(experts),
        SCALE_KIND=kind,
        BLOCK_TOKENS=max(16, triton.next_power_of_2(num_tokens)),
        BLOCK_I=BLOCK_I,
        BLOCK_H=block_h,
        GROUP=GROUP,
        ZERO_BLOCK=1024,
        FP8_MAX=FP8_MAX,
        num_warps=num_warps,
        num_stages=num_stages,
        **({"launch_cooperative_grid": True} if cooperative else {}),
    )
    for phases in (QUANTISE | UP | DOWN,) if one_launch else (QUANTISE, UP, DOWN):
        _moe_decode_kernel[(programs,)](*args, PHASES=phases, **meta)
    return output
