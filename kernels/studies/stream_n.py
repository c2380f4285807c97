"""Whether a short-K decode GEMM reaches more of the read floor when each program streams
several weight tiles in one pipelined loop.

The second GEMM of DeepSeek-V3 (TP 8, K = 256), Qwen3-Coder-480B (TP 8, K = 320) and
MiniMax-M2 (TP 4, K = 384) runs two or three K steps per program in vLLM's
``fused_moe_kernel``: every program pays its start (the row block's token ids, its expert
id, the activation rows) and a pipeline prologue for 20-40 KB of weights, and the K loop
ends before the pipeline reaches a steady state.  At M <= 64 these GEMMs read at 0.4-0.75
of the floor in every tree, 0.33.0 included (``results/untuned/h200-untuned-acceptance.md``),
while a pure read of the same bytes reaches 0.95 (``results/read-ceiling/``).

The kernels here compute the same Swap-AB product with programs that stream several weight
tiles in one pipelined loop, so the next tiles' weights are in flight while one is
multiplied.  ``stream_n_moe_kernel`` takes one row block of tokens and ``N_TILES``
consecutive tiles of its expert (the row block's start paid once per ``N_TILES`` tiles),
its loop in two forms: each iteration one tile with its whole K unrolled (``unrolled``), or
Triton's flattening of the loop over tiles and the runtime K loop into one (``flat``, the
form fused_moe_kernel could take).  ``persistent_moe_kernel`` starts as many programs as
the SMs hold and each walks the (row block, tile) pairs with the grid's stride.  The study
times them over a sweep of loop forms, tiles per program, tile widths and depths
(``SWEEP``) beside each tree's own kernel and config on the same cases (``--tree``), every
launch checked against the float64 reference first, and records each build's registers and
shared memory; ``sm90_build`` reads them without a GPU.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.stream_n --tree 0.33.0+moe=.gpu/trees/0.33.0+moe \\
        --shape deepseek-v3-tp8 --shape qwen3-coder-480b-a35b-tp8 --shape minimax-m2-tp4 \\
        --M 1,2,4,8,16,32,64 --out stream-n.json
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from moe_kernels import interpreter_compat, sm90
from moe_kernels.align import moe_align_block_size
from moe_kernels.launch import LAUNCH_OPTIONS
from moe_kernels.loader import load_fused_moe_kernel
from moe_kernels.measure import (
    COPIES,
    DEVICE,
    FP8_ERROR_BOUND,
    OUT_DTYPE,
    SHAPES,
    Variant,
    captured,
    case_generator,
    checked_variant,
    command_line,
    floor_bytes,
    interleaved_times_us,
    launches_for,
    make_case,
    make_weights,
    measure_bandwidth,
    one_call_us,
    record_header,
    reference,
    write_report,
)
from moe_kernels.resultfile import markdown_path, read_report
from moe_kernels.stats import rel_frobenius_error
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

# The sweep, as (loop, weight tiles per program, weight rows per tile, pipeline depth).
# "unrolled": the K loop is unrolled (K_STEPS is a constexpr), so the loop over tiles is the
# innermost loop, the one Triton pipelines, and every stage buffers a tile's whole K: at
# K = 384 three stages of 128-wide tiles take 168 KB, one program per SM (sm90_build), so
# unrolled tiles stay 64 wide.  "flat": the K loop stays a runtime loop, as in
# fused_moe_kernel, and Triton flattens the nest (``tl.range(..., flatten=True)``) into one
# loop over tiles x K steps whose stages buffer one K step each (10 KB at 16 x 64 tiles);
# this is the form a change to fused_moe_kernel itself would take.  One unrolled tile per
# program is the control: the same product one tile per program, its K unrolled.
# "persistent" (tiles per program 0: as many as the grid leaves): as many programs as the
# SMs hold at once, each walking the (row block, weight tile) pairs with the grid's stride
# in one flattened loop.  A fixed number of tiles per program shortens the grid but not its
# last round: 1,044 programs of 8 tiles on 924 resident slots (Qwen3-Coder-480B's second
# GEMM at 16 tokens) run two rounds of 8 tiles where 8,352 one-tile programs ran ten of one;
# the persistent grid runs one round whose programs differ by one tile at most.  Tokens per
# tile follow vLLM's decode tiles (16, 8 at M <= 8 where a routing puts at most a token or
# two on an expert).
SWEEP = (
    [("unrolled", 1, 64, 2)]
    + [("unrolled", tiles, 64, stages) for tiles in (2, 4) for stages in (2, 3)]
    + [
        ("flat", tiles, width, stages)
        for tiles in (2, 4, 8)
        for width in (64, 128)
        for stages in (3, 4)
    ]
    + [("persistent", 0, width, stages) for width in (64, 128) for stages in (3, 4)]
)
BLOCK_K = 128  # one 128 x 128 scale block per K step for block FP8; 128 B per row for both


@triton.jit
def _row_block(
    a_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    pid_m, num_valid_tokens, stride_am, stride_asm,
    TOP_K: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, BLOCK_SCALED: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
):  # fmt: skip
    """A row block's start: its tokens, expert, activation rows and the scales and routing
    weights its tiles' epilogues apply."""
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    token_ids = tl.load(sorted_token_ids_ptr + offs_m)
    token_mask = token_ids < num_valid_tokens
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    a_rows = a_ptr + (token_ids // TOP_K)[None, :] * stride_am
    a_scale_rows = a_scale_ptr + (token_ids // TOP_K) * stride_asm
    routed = tl.full((BLOCK_SIZE_M,), 1.0, tl.float32)
    if MUL_ROUTED_WEIGHT:
        routed = tl.load(topk_weights_ptr + token_ids, mask=token_mask, other=0.0)
    if not BLOCK_SCALED:  # per-tensor scales: applied once, in the epilogue
        routed = routed * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert))
    return token_ids, token_mask, expert, a_rows, a_scale_rows, routed


@triton.jit
def _k_step(
    acc, b_tile, a_rows, a_scale_rows, b_scale_rows, step, K, n_mask, token_mask,
    BLOCK_SCALED: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):  # fmt: skip
    """acc plus K step ``step`` of the Swap-AB product (weights on the MMA's M side, tokens
    on its N side); a step is one 128-deep scale block (BLOCK_SIZE_K = 128)."""
    ks = step * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
    k_mask = ks < K
    b = tl.load(b_tile + ks[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    a_t = tl.load(a_rows + ks[:, None], mask=k_mask[:, None] & token_mask[None, :], other=0.0)
    if BLOCK_SCALED:
        a_s = tl.load(a_scale_rows + step, mask=token_mask, other=0.0)
        b_s = tl.load(b_scale_rows + step, mask=n_mask, other=0.0)
        return acc + tl.dot(b, a_t) * b_s[:, None] * a_s[None, :]
    return tl.dot(b, a_t, acc)


@triton.jit
def _weight_tile(
    b_ptr, c_ptr, b_scale_ptr, token_ids, token_mask, expert, a_rows, a_scale_rows, routed,
    pid_n, N, K, stride_be, stride_bn, stride_cm, stride_bse, stride_bsn,
    BLOCK_SCALED: tl.constexpr, GROUP_N: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, K_STEPS: tl.constexpr,
    UNROLL_K: tl.constexpr,
):  # fmt: skip
    """One weight tile of a row block: its K loop (unrolled or not), scales, routing
    weights and the transposed store."""
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_mask = offs_n < N
    b_tile = b_ptr + expert * stride_be + offs_n[:, None] * stride_bn
    b_scale_rows = b_scale_ptr + expert * stride_bse + (offs_n // GROUP_N) * stride_bsn
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    if UNROLL_K:
        for step in tl.static_range(K_STEPS):
            acc = _k_step(
                acc, b_tile, a_rows, a_scale_rows, b_scale_rows, step, K, n_mask, token_mask,
                BLOCK_SCALED, BLOCK_SIZE_K,
            )  # fmt: skip
    else:
        for step in range(tl.cdiv(K, BLOCK_SIZE_K)):
            acc = _k_step(
                acc, b_tile, a_rows, a_scale_rows, b_scale_rows, step, K, n_mask, token_mask,
                BLOCK_SCALED, BLOCK_SIZE_K,
            )  # fmt: skip
    acc = acc * routed[None, :]
    c = c_ptr + token_ids[None, :] * stride_cm + offs_n[:, None]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=n_mask[:, None] & token_mask[None, :])


@triton.jit
def stream_n_moe_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    N,
    K,
    num_valid_tokens,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    stride_asm,
    stride_bse,
    stride_bsn,
    TOP_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_SCALED: tl.constexpr,
    GROUP_N: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    K_STEPS: tl.constexpr,
    N_TILES: tl.constexpr,
    UNROLL_K: tl.constexpr,
):
    # One row block of tokens (one expert) and N_TILES consecutive weight tiles.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return

    # The row block's start, paid once for all its tiles.
    token_ids, token_mask, expert, a_rows, a_scale_rows, routed = _row_block(
        a_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
        expert_ids_ptr, pid_m, num_valid_tokens, stride_am, stride_asm, TOP_K,
        MUL_ROUTED_WEIGHT, BLOCK_SCALED, BLOCK_SIZE_M,
    )  # fmt: skip

    # The pipelined loop over weight tiles: the next tiles' weights are in flight while one
    # is multiplied.  Unrolled, it is the innermost loop; flat, Triton fuses it with K's.
    for tile in tl.range(N_TILES, flatten=not UNROLL_K):
        _weight_tile(
            b_ptr, c_ptr, b_scale_ptr, token_ids, token_mask, expert, a_rows, a_scale_rows,
            routed, pid_n * N_TILES + tile, N, K, stride_be, stride_bn, stride_cm, stride_bse,
            stride_bsn, BLOCK_SCALED, GROUP_N, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
            K_STEPS, UNROLL_K,
        )  # fmt: skip


@triton.jit
def persistent_moe_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,
    sorted_token_ids_ptr,
    expert_ids_ptr,
    num_tokens_post_padded_ptr,
    N,
    K,
    num_valid_tokens,
    max_row_blocks,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    stride_asm,
    stride_bse,
    stride_bsn,
    TOP_K: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_SCALED: tl.constexpr,
    GROUP_N: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    # Every (row block, weight tile) pair that has tokens, a row block's tiles consecutive.
    tiles_n = tl.cdiv(N, BLOCK_SIZE_N)
    row_blocks = tl.cdiv(tl.load(num_tokens_post_padded_ptr), BLOCK_SIZE_M)
    row_blocks = tl.minimum(row_blocks, max_row_blocks)

    # One flattened loop over this program's pairs, the grid's stride apart: the next
    # pair's token ids, expert and weights load while this one is multiplied.
    for pair in tl.range(tl.program_id(0), row_blocks * tiles_n, tl.num_programs(0), flatten=True):
        token_ids, token_mask, expert, a_rows, a_scale_rows, routed = _row_block(
            a_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr, sorted_token_ids_ptr,
            expert_ids_ptr, pair // tiles_n, num_valid_tokens, stride_am, stride_asm, TOP_K,
            MUL_ROUTED_WEIGHT, BLOCK_SCALED, BLOCK_SIZE_M,
        )  # fmt: skip
        _weight_tile(
            b_ptr, c_ptr, b_scale_ptr, token_ids, token_mask, expert, a_rows, a_scale_rows,
            routed, pair % tiles_n, N, K, stride_be, stride_bn, stride_cm, stride_bse,
            stride_bsn, BLOCK_SCALED, GROUP_N, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, 1, False,
        )  # fmt: skip


# An unrolled stage holds a tile's whole K: past four 128-deep steps (four stages of a 16 x 64
# tile hold 160 KB) a program alone fills an SM, so a longer K is not unrolled.
UNROLL_MAX_STEPS = 4


def stream_n_config_sweep(M: int, K: int) -> list[dict]:
    """The configs the study times at M tokens and depth K."""
    block_m = 8 if M <= 8 else 16
    return [
        {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": width, "N_TILES": tiles, "LOOP": loop,
         "num_stages": stages, "num_warps": 4}
        for loop, tiles, width, stages in SWEEP
        if loop != "unrolled" or triton.cdiv(K, BLOCK_K) <= UNROLL_MAX_STEPS
    ]  # fmt: skip


def kernel_for(config: dict):
    """The study kernel that runs ``config``'s loop form."""
    return persistent_moe_kernel if config["LOOP"] == "persistent" else stream_n_moe_kernel


def kernel_constants(config: dict, block: bool, K: int, top_k: int, mul_routed: bool) -> dict:
    """The constexpr arguments of ``config``'s kernel (both the launch and sm90_build)."""
    constants = dict(
        TOP_K=top_k,
        MUL_ROUTED_WEIGHT=mul_routed,
        BLOCK_SCALED=block,
        GROUP_N=BLOCK_K if block else 1,  # the harness's block scales are 128 x 128
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        BLOCK_SIZE_K=BLOCK_K,
        K_STEPS=triton.cdiv(K, BLOCK_K),
        N_TILES=config["N_TILES"],
        UNROLL_K=config["LOOP"] == "unrolled",
    )
    names = kernel_for(config).arg_names
    return {name: value for name, value in constants.items() if name in names}


def sm90_build(config: dict, block: bool, K: int) -> sm90.Build:
    """The kernel at ``config`` built for an H100/H200 without a GPU (a second GEMM:
    top-1, routing weights applied), its integer arguments 16-divisible as at the study's
    shapes."""
    kernel = kernel_for(config)
    pointers = ("a_ptr", "b_ptr", "c_ptr", "a_scale_ptr", "b_scale_ptr", "topk_weights_ptr")
    pointers += ("sorted_token_ids_ptr", "expert_ids_ptr", "num_tokens_post_padded_ptr")
    types = dict(a_ptr="*fp8e4nv", b_ptr="*fp8e4nv", c_ptr="*bf16", sorted_token_ids_ptr="*i32")
    types.update(expert_ids_ptr="*i32", num_tokens_post_padded_ptr="*i32")
    constants = kernel_constants(config, block, K, 1, True)
    signature = {
        name: types.get(name, "*fp32" if name in pointers else "i32")
        for name in kernel.arg_names
        if name not in constants
    }
    divisible = set(signature) - {"num_valid_tokens", "max_row_blocks"}
    return sm90.build(
        kernel, signature, constants, divisible, config["num_warps"], config["num_stages"]
    )


# Without a GPU the persistent grid is this small, so that every program walks several
# (row block, weight tile) pairs and crosses row blocks.
INTERPRETER_PROGRAMS = 3


def launch_stream_n(case: dict, w_q, w_scale, C, assignment, config: dict):
    """One launch of ``config``'s kernel for ``case`` into ``C``: the grid it started and
    the compiled kernel (the interpreter returns none)."""
    sorted_ids, expert_ids, num_post = assignment
    a_q, a_scale = case["a_q"], case["a_scale"]
    _, N, K = w_q.shape
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    pairs = case["ids"].numel()
    # a pair fills at most one row block at decode: no block past pairs * block_m finds work
    row_blocks = triton.cdiv(min(sorted_ids.numel(), pairs * block_m), block_m)
    block = case["block"] is not None
    kernel = kernel_for(config)
    args = dict(
        a_ptr=a_q, b_ptr=w_q, c_ptr=C, a_scale_ptr=a_scale, b_scale_ptr=w_scale,
        topk_weights_ptr=case["topk_weights"], sorted_token_ids_ptr=sorted_ids,
        expert_ids_ptr=expert_ids, num_tokens_post_padded_ptr=num_post, N=N, K=K,
        num_valid_tokens=pairs, max_row_blocks=row_blocks, stride_am=a_q.stride(0),
        stride_be=w_q.stride(0), stride_bn=w_q.stride(1), stride_cm=C.stride(-2),
        stride_asm=a_scale.stride(0) if block else 0,
        stride_bse=w_scale.stride(0) if block else 0,
        stride_bsn=w_scale.stride(1) if block else 0,
        **kernel_constants(config, block, K, case["top_k"], case["mul_routed"]),
        num_stages=config["num_stages"], num_warps=config["num_warps"],
    )  # fmt: skip
    args = {k: v for k, v in args.items() if k in kernel.arg_names or k in LAUNCH_OPTIONS}
    if DEVICE != "cuda":
        interpreter_compat.apply()  # the runtime K loops need it on NumPy 2.4
    if config["LOOP"] != "persistent":
        grid = (row_blocks, triton.cdiv(N, block_n * config["N_TILES"]))
    elif DEVICE != "cuda":
        grid = (min(row_blocks * triton.cdiv(N, block_n), INTERPRETER_PROGRAMS),)
    else:
        grid = (min(row_blocks * triton.cdiv(N, block_n), resident_programs(kernel, args)),)
    return grid, kernel[grid](**args)


_RESIDENT: dict[tuple, int] = {}


def resident_programs(kernel, args: dict) -> int:
    """How many programs of ``kernel`` built for ``args`` the GPU holds at once (once per
    build: the timed launches, captured in a graph, only look it up)."""
    key = (kernel.fn.__name__, *sorted((k, v) for k, v in args.items() if isinstance(v, int)))
    if key not in _RESIDENT:
        built = kernel.warmup(grid=(1,), **args)
        built._init_handles()  # loads the binary: its registers are known from then on
        per_sm = sm90.programs_per_sm(built.metadata.shared, built.n_regs, args["num_warps"])
        device = torch.cuda.current_device()
        _RESIDENT[key] = per_sm * torch.cuda.get_device_properties(device).multi_processor_count
    return _RESIDENT[key]


def checked_stream_n(case: dict, weights_q, refs: dict, config: dict, graph_us: float | None):
    """The study's counterpart of :func:`moe_kernels.measure.checked_variant`: the row before
    timing (errors against the float64 reference on the first and last weight copy), the
    call a graph times, and the launches it makes."""
    shape = case["shape"]
    assignment = moe_align_block_size(case["ids"], config["BLOCK_SIZE_M"], shape.experts)
    C = torch.empty(case["M"], shape.topk, case["N"], dtype=OUT_DTYPE, device=DEVICE)
    C = C.view(-1, case["N"]) if case["gemm"] == "down" else C
    started, errors, grid = time.monotonic(), [], None
    for copy in (0, COPIES - 1):
        C.fill_(float("nan"))
        grid, compiled = launch_stream_n(case, *weights_q[copy], C, assignment, config)
        if copy not in refs:
            refs[copy] = reference(
                case["a_q"], case["a_scale"], *weights_q[copy], case["ids"],
                case["topk_weights"], case["quant"], case["top_k"], case["mul_routed"],
            )  # fmt: skip
        errors.append(float(rel_frobenius_error(C.view_as(refs[copy]).double(), refs[copy])))

    def call(copy: int):
        launch_stream_n(case, *weights_q[copy], C, assignment, config)

    if DEVICE != "cuda":
        launches = 1
    else:
        launches = launches_for(one_call_us(lambda: call(COPIES - 1)), graph_us or 2000.0)

    def all_copies():
        for i in range(launches):
            call(i % COPIES)

    row = {
        "shape": shape.name, "gemm": case["gemm"], "quant": case["quant"], "M": case["M"],
        "variant": "stream-n", "config": config, "grid": list(grid),
        **({"registers": compiled.n_regs, "shared": compiled.metadata.shared} if compiled else {}),
        "experts_hit": int(torch.unique(case["ids"]).numel()), "rel_error": errors,
        "correct": all(e < FP8_ERROR_BOUND for e in errors),
        "check_s": round(time.monotonic() - started, 3), "launches": launches,
    }  # fmt: skip
    return row, all_copies, launches


SM_COUNT = 132  # an H200's


def builds_markdown(command: str) -> str:
    """Registers, shared memory and programs per SM of every SWEEP config, built for SM90
    without a GPU: 16-token tiles, block scales, K of two and three 128-deep steps."""
    lines = [
        "# Programs per SM90 SM of the stream-n study kernel",
        "",
        f"Made by `{command}` with Triton {triton.__version__}: 16-token tile, 128 x 128",
        "block scales, 4 warps, compiled for sm_90a by Triton's own ptxas (no GPU needed).",
        "",
        "| loop | tiles per program | BLOCK_SIZE_N | stages | K | registers | shared bytes "
        "| per SM | on 132 SMs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for loop, tiles, width, stages in SWEEP:
        for K in (256, 384):
            config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": width, "N_TILES": tiles, "LOOP": loop,
                      "num_stages": stages, "num_warps": 4}  # fmt: skip
            built = sm90_build(config, True, K)
            per_sm = sm90.programs_per_sm(built.shared, built.registers)
            lines.append(
                f"| {loop} | {tiles or 'grid stride'} | {width} | {stages} | {K} | {built.registers} | "
                f"{built.shared} | {per_sm} | {per_sm * SM_COUNT} |"
            )
    return "\n".join(lines) + "\n"


def _stream_key(config: dict) -> tuple:
    """A sweep entry of a row's config: (loop, tiles per program, width, stages)."""
    return (config["LOOP"], config["N_TILES"], config["BLOCK_SIZE_N"], config["num_stages"])


def _name(key: tuple) -> str:
    loop, tiles, width, stages = key
    return f"{loop} {tiles or 'stride'}x{width} s{stages}"


def summary_markdown(report: dict, source: str) -> str:
    """What a timed sweep found: per case (geometric mean over its routings) each tree's
    time and each loop form's fastest config against the fastest tree, then per sweep entry
    its geometric mean over every case, the rule a launcher could take."""
    times: dict[tuple, dict] = {}
    floors: dict[tuple, dict] = {}
    for row in report["rows"]:
        if not row["correct"]:
            continue
        case = (row["shape"], row["gemm"], row["quant"], row["M"])
        variant = _stream_key(row["config"]) if row["variant"] == "stream-n" else row["variant"]
        times.setdefault(case, {}).setdefault(variant, []).append(row["us"])
        if "fraction_of_floor" in row:
            floors.setdefault(case, {}).setdefault(variant, []).append(
                row["us"] * row["fraction_of_floor"]
            )
    env = report.get("environment", {})
    lines = [
        f"# Weight tiles streamed per program, from `{source}`",
        "",
        f"Made by `{report.get('command', '?')}` on {env.get('gpu', '?')} (torch "
        f"{env.get('torch', '?')}, Triton {env.get('triton', '?')}), series "
        f"{report.get('series_version', '?')}. Rows: {len(report['rows'])}, "
        f"{sum(not r['correct'] for r in report['rows'])} incorrect (left out), "
        f"{len(report.get('failed', []))} configs failed. Per case the geometric mean over its "
        "routings; a form's column is its fastest config; speed-up = fastest tree / fastest stream.",
        "",
    ]
    trees = sorted({v for case in times.values() for v in case if isinstance(v, str)})
    forms = [f for f in ("unrolled", "flat", "persistent")
             if any(k[0] == f for case in times.values() for k in case if isinstance(k, tuple))]  # fmt: skip
    lines += [
        "| shape | GEMM | quant | M | "
        + " | ".join(f"{t} µs" for t in trees)
        + " | "
        + " | ".join(f"{f} µs" for f in forms)
        + " | speed-up | floor fraction "
        "(tree → stream) | fastest stream |",
        "|" + "---|" * (7 + len(trees) + len(forms)),
    ]
    by_entry: dict[tuple, list[float]] = {}
    best_tree_of: dict[tuple, float] = {}
    for case in sorted(times):
        means = {v: statistics.geometric_mean(ts) for v, ts in times[case].items()}
        tree_times = [means[t] for t in trees if t in means]
        streams = {v: m for v, m in means.items() if isinstance(v, tuple)}
        if not tree_times or not streams:
            continue
        best_tree = min(tree_times)
        best_tree_of[case] = best_tree
        for entry, m in streams.items():
            by_entry.setdefault(entry, []).append(best_tree / m)
        fastest = min(streams, key=streams.get)
        cells = [f"{means[t]:.1f}" if t in means else "" for t in trees]
        for form in forms:
            own = [m for k, m in streams.items() if k[0] == form]
            cells.append(f"{min(own):.1f}" if own else "")
        floor = floors.get(case, {})
        fraction = ""
        if floor:
            floor_us = statistics.geometric_mean(next(iter(floor.values())))
            fraction = f"{floor_us / best_tree:.2f} → {floor_us / streams[fastest]:.2f}"
        shape, gemm, quant, M = case
        lines.append(
            f"| {shape} | {gemm} | {quant} | {M} | "
            + " | ".join(cells)
            + f" | {best_tree / streams[fastest]:.3f} | {fraction} | {_name(fastest)} |"
        )
    lines += [
        "",
        "## Each sweep entry over every case",
        "",
        "Speed-up of one config everywhere over the fastest tree per case (what a launcher "
        "would get from taking it as its rule), best first.",
        "",
        "| sweep entry | cases | geometric mean | slowest | fastest |",
        "|---|---|---|---|---|",
    ]
    ranked = sorted(by_entry.items(), key=lambda kv: -statistics.geometric_mean(kv[1]))
    for entry, ratios in ranked:
        lines.append(
            f"| {_name(entry)} | {len(ratios)} | {statistics.geometric_mean(ratios):.3f} | "
            f"{min(ratios):.3f} | {max(ratios):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--summarise", type=Path, metavar="RESULT.json",
        help="write RESULT.md, what a timed sweep found, and stop",
    )  # fmt: skip
    parser.add_argument(
        "--builds", type=Path, metavar="OUT.md",
        help="write the sweep's SM90 builds (no GPU; run without TRITON_INTERPRET) and stop",
    )  # fmt: skip
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--gemm", default="down", choices=["up", "down"])
    parser.add_argument("--quant", action="append", choices=["tensor", "block"])
    parser.add_argument("--M", default="1,2,4,8,16,32,64")
    parser.add_argument("--routings", type=int, default=2)
    parser.add_argument("--seed", type=int, default=3101)
    parser.add_argument("--graph-us", type=float, default=2000.0)
    parser.add_argument("--replays", type=int, default=12)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--resume", action="store_true", help="continue --out: time only the cases it lacks"
    )
    args = parser.parse_args(argv)
    if args.summarise:
        text = summary_markdown(read_report(args.summarise), args.summarise.name)
        markdown_path(args.summarise).write_text(text)
        return 0
    if args.builds:
        args.builds.write_text(builds_markdown(command_line("studies.stream_n", argv)))
        return 0
    if not (args.shape and args.out):
        parser.error("--shape and --out are required to time the sweep")

    trees = []
    for spec in args.tree:
        label, _, path = spec.partition("=")
        trees.append(Variant(label, Path(path), load_fused_moe_kernel(Path(path))))
    if args.resume and args.out.exists():  # the run so far: its header, rows and failures
        report = read_report(args.out)
    else:
        report = {
            **record_header("studies.stream_n", argv),
            "bandwidth": measure_bandwidth() if DEVICE == "cuda" else {},
            "rows": [],
            "failed": [],
        }
    done = {(r["shape"], r["quant"], r["M"], r["routing"]) for r in report["rows"]}
    read_gbps = report["bandwidth"].get("read_gbps")
    for shape_name, quant in itertools.product(args.shape, args.quant or ["block", "tensor"]):
        todo = [
            (M, routing_no)
            for M in [int(m) for m in args.M.split(",")]
            for routing_no in range(args.routings)
            if (shape_name, quant, M, routing_no) not in done
        ]
        if not todo:
            continue
        shape = SHAPES[shape_name]
        gen = case_generator(args.seed, shape_name, quant, args.gemm)
        weights_q = make_weights(shape, args.gemm, quant, gen)
        for M, routing_no in todo:
            gen = case_generator(args.seed, shape_name, quant, args.gemm, M, routing_no)
            case = make_case(shape, args.gemm, quant, M, gen)
            refs: dict = {}
            checked = [
                checked_variant(v, case, weights_q, refs, graph_us=args.graph_us) for v in trees
            ]
            for config in stream_n_config_sweep(M, case["a_q"].size(1)):
                try:
                    checked.append(checked_stream_n(case, weights_q, refs, config, args.graph_us))
                except (OutOfResources, CompilationError):  # too big for the SM's memory
                    continue
                except Exception as error:  # noqa: BLE001 - one config's failure is recorded
                    report["failed"].append({"shape": shape_name, "quant": quant, "M": M,
                                             "config": config, "error": repr(error)})  # fmt: skip
                    print(f"{shape_name} {quant} M={M} {config}: {error!r}", flush=True)
            times = interleaved_times_us([captured(c) for _, c, _ in checked], args.replays)
            w_q, w_scale = weights_q[0]
            floor = floor_bytes(
                shape, args.gemm, quant, case["ids"], w_q, w_scale, case["a_q"],
                case["a_scale"], M * shape.topk if args.gemm == "down" else M,
            )  # fmt: skip
            for (row, _, launches), series in zip(checked, times, strict=True):
                us = statistics.median(t / launches for t in series)
                report["rows"].append(
                    {
                        **{k: v for k, v in row.items() if k != "us_all"},
                        "routing": routing_no,
                        "us": us,
                        "floor_bytes": floor,
                        **(
                            {"fraction_of_floor": floor / read_gbps / 1e3 / us} if read_gbps else {}
                        ),
                    }
                )
            best = min(
                (r for r in report["rows"][-len(checked) :] if r["variant"] == "stream-n"),
                key=lambda r: r["us"] if r["correct"] else float("inf"),
                default={"us": float("nan"), "config": "none ran"},
            )
            own = " ".join(
                f"{r['variant']}={r['us']:.1f}us"
                for r in report["rows"][-len(checked) :][: len(trees)]
            )
            print(
                f"{shape_name:26s} {args.gemm} {quant:6s} M={M:<3d} r{routing_no} {own} "
                f"stream-n best={best['us']:.1f}us {best['config']}",
                flush=True,
            )
            write_report(args.out, report)
    write_report(args.out, report)
    wrong = [r for r in report["rows"] if not r["correct"]]
    failed = report["failed"]
    print(f"{len(report['rows'])} rows, {len(wrong)} incorrect, {len(failed)} configs failed;"
          f" written to {args.out}")  # fmt: skip
    return 1 if wrong or failed else 0


if __name__ == "__main__":
    sys.exit(main())
