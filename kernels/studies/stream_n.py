"""Whether a short-K decode GEMM reaches more of the read floor when each program streams
several weight tiles in one pipelined loop.

The second GEMM of DeepSeek-V3 (TP 8, K = 256), Qwen3-Coder-480B (TP 8, K = 320) and
MiniMax-M2 (TP 4, K = 384) runs two or three K steps per program in vLLM's
``fused_moe_kernel``: every program pays its start (the row block's token ids, its expert
id, the activation rows) and a pipeline prologue for 20-40 KB of weights, and the K loop
ends before the pipeline reaches a steady state.  At M <= 64 these GEMMs read at 0.4-0.75
of the floor in every tree, 0.33.0 included (``results/untuned/h200-untuned-acceptance.md``),
while a pure read of the same bytes reaches 0.95 (``results/read-ceiling/``).

The kernel here is the Swap-AB product of one row block of tokens and ``N_TILES``
consecutive weight tiles of its expert in one pipelined loop, so the next tiles' weights are
in flight while one is multiplied, and the row block's start is paid once per ``N_TILES``
tiles.  Two forms of that loop: each iteration one tile with its whole K unrolled
(``unrolled``), or Triton's flattening of the loop over tiles and the runtime K loop into one
(``flat``, the form fused_moe_kernel could take).  The study times it over a sweep of loop
forms, tiles per program, tile widths and depths (``SWEEP``) beside each tree's own kernel
and config on the same cases (``--tree``), every launch checked against the float64
reference first, and records each build's registers and shared memory; ``sm90_build``
reads them without a GPU.

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
# program is the control: the same product one tile per program, its K unrolled.  Tokens per
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
)
BLOCK_K = 128  # one 128 x 128 scale block per K step for block FP8; 128 B per row for both


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

    # The row block's start, paid once for all its tiles: tokens, expert, scale rows.
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
    token_ids = tl.load(sorted_token_ids_ptr + offs_m)
    token_mask = token_ids < num_valid_tokens
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    a_rows = a_ptr + (token_ids // TOP_K)[None, :] * stride_am
    a_scale_rows = a_scale_ptr + (token_ids // TOP_K) * stride_asm
    b_expert = b_ptr + expert * stride_be
    if MUL_ROUTED_WEIGHT:
        routed = tl.load(topk_weights_ptr + token_ids, mask=token_mask, other=0.0)
    if not BLOCK_SCALED:
        tensor_scale = tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert)

    # The pipelined loop over weight tiles: the next tiles' weights are in flight while one
    # is multiplied.  Unrolled, it is the innermost loop; flat, Triton fuses it with K's.
    first_n = pid_n * (N_TILES * BLOCK_SIZE_N)
    for tile in tl.range(N_TILES, flatten=not UNROLL_K):
        offs_n = first_n + tile * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        n_mask = offs_n < N
        b_tile = b_expert + offs_n[:, None] * stride_bn
        b_scale_rows = b_scale_ptr + expert * stride_bse + (offs_n // GROUP_N) * stride_bsn
        acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
        if UNROLL_K:
            for step in tl.static_range(K_STEPS):
                acc = _k_step(
                    acc, b_tile, a_rows, a_scale_rows, b_scale_rows, step, K, n_mask,
                    token_mask, BLOCK_SCALED, BLOCK_SIZE_K,
                )  # fmt: skip
        else:
            for step in range(tl.cdiv(K, BLOCK_SIZE_K)):
                acc = _k_step(
                    acc, b_tile, a_rows, a_scale_rows, b_scale_rows, step, K, n_mask,
                    token_mask, BLOCK_SCALED, BLOCK_SIZE_K,
                )  # fmt: skip

        # Epilogue of the tile: scales, routing weights, the transposed store.
        if not BLOCK_SCALED:
            acc = acc * tensor_scale
        if MUL_ROUTED_WEIGHT:
            acc = acc * routed[None, :]
        c = c_ptr + token_ids[None, :] * stride_cm + offs_n[:, None]
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=n_mask[:, None] & token_mask[None, :])


def stream_n_config_sweep(M: int) -> list[dict]:
    """The configs the study times at M tokens."""
    block_m = 8 if M <= 8 else 16
    return [
        {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": width, "N_TILES": tiles, "LOOP": loop,
         "num_stages": stages, "num_warps": 4}
        for loop, tiles, width, stages in SWEEP
    ]  # fmt: skip


def kernel_constants(config: dict, block: bool, K: int, top_k: int, mul_routed: bool) -> dict:
    """The kernel's constexpr arguments for ``config`` (both the launch and sm90_build)."""
    return dict(
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


def sm90_build(config: dict, block: bool, K: int) -> sm90.Build:
    """The kernel at ``config`` built for an H100/H200 without a GPU (a second GEMM:
    top-1, routing weights applied), its integer arguments 16-divisible as at the study's
    shapes."""
    pointers = ("a_ptr", "b_ptr", "c_ptr", "a_scale_ptr", "b_scale_ptr", "topk_weights_ptr")
    pointers += ("sorted_token_ids_ptr", "expert_ids_ptr", "num_tokens_post_padded_ptr")
    types = dict(a_ptr="*fp8e4nv", b_ptr="*fp8e4nv", c_ptr="*bf16", sorted_token_ids_ptr="*i32")
    types.update(expert_ids_ptr="*i32", num_tokens_post_padded_ptr="*i32")
    constants = kernel_constants(config, block, K, 1, True)
    signature = {
        name: types.get(name, "*fp32" if name in pointers else "i32")
        for name in stream_n_moe_kernel.arg_names
        if name not in constants
    }
    divisible = set(signature) - {"num_valid_tokens"}
    return sm90.build(
        stream_n_moe_kernel, signature, constants, divisible, config["num_warps"],
        config["num_stages"],
    )  # fmt: skip


def launch_stream_n(case: dict, w_q, w_scale, C, assignment, config: dict):
    """One launch of the kernel for ``case`` into ``C``: the grid it started and the
    compiled kernel (the interpreter returns none)."""
    sorted_ids, expert_ids, num_post = assignment
    a_q, a_scale = case["a_q"], case["a_scale"]
    num_experts, N, K = w_q.shape
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    pairs = case["ids"].numel()
    # a pair fills at most one row block at decode: no block past pairs * block_m finds work
    rows = min(sorted_ids.numel(), pairs * block_m)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(N, block_n * config["N_TILES"]))
    block = case["block"] is not None
    if DEVICE != "cuda":
        interpreter_compat.apply()  # the flat form's runtime K loop needs it on NumPy 2.4
    compiled = stream_n_moe_kernel[grid](
        a_q,
        w_q,
        C,
        a_scale,
        w_scale,
        case["topk_weights"],
        sorted_ids,
        expert_ids,
        num_post,
        N,
        K,
        pairs,
        a_q.stride(0),
        w_q.stride(0),
        w_q.stride(1),
        C.stride(-2),
        a_scale.stride(0) if block else 0,
        w_scale.stride(0) if block else 0,
        w_scale.stride(1) if block else 0,
        **kernel_constants(config, block, K, case["top_k"], case["mul_routed"]),
        num_stages=config["num_stages"],
        num_warps=config["num_warps"],
    )
    return grid, compiled


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
                f"| {loop} | {tiles} | {width} | {stages} | {K} | {built.registers} | "
                f"{built.shared} | {per_sm} | {per_sm * SM_COUNT} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    args = parser.parse_args(argv)
    if args.builds:
        args.builds.write_text(builds_markdown(command_line("studies.stream_n", argv)))
        return 0
    if not (args.shape and args.out):
        parser.error("--shape and --out are required to time the sweep")

    trees = []
    for spec in args.tree:
        label, _, path = spec.partition("=")
        trees.append(Variant(label, Path(path), load_fused_moe_kernel(Path(path))))
    report = {
        **record_header("studies.stream_n", argv),
        "bandwidth": measure_bandwidth() if DEVICE == "cuda" else {},
        "rows": [],
    }
    read_gbps = report["bandwidth"].get("read_gbps")
    for shape_name, quant in itertools.product(args.shape, args.quant or ["block", "tensor"]):
        shape = SHAPES[shape_name]
        gen = case_generator(args.seed, shape_name, quant, args.gemm)
        weights_q = make_weights(shape, args.gemm, quant, gen)
        for M, routing_no in itertools.product(
            [int(m) for m in args.M.split(",")], range(args.routings)
        ):
            gen = case_generator(args.seed, shape_name, quant, args.gemm, M, routing_no)
            case = make_case(shape, args.gemm, quant, M, gen)
            refs: dict = {}
            checked = [
                checked_variant(v, case, weights_q, refs, graph_us=args.graph_us) for v in trees
            ]
            for config in stream_n_config_sweep(M):
                try:
                    checked.append(checked_stream_n(case, weights_q, refs, config, args.graph_us))
                except (OutOfResources, CompilationError):  # too big for the SM's memory
                    continue
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
    print(f"{len(report['rows'])} rows, {len(wrong)} incorrect; written to {args.out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
