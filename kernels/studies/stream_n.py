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
consecutive weight tiles of its expert: the pipelined loop runs over the weight tiles, each
iteration reading its whole K (``K_STEPS``, unrolled) into one accumulator and storing it,
so the next tiles' weights are in flight while one is multiplied, and the row block's start
is paid once per ``N_TILES`` tiles.  ``N_TILES = 1`` is the same product one tile per
program.  The study times it, over a sweep of tiles per program, tile widths and depths,
beside each tree's own kernel and config on the same cases (``--tree``), every launch
checked against the float64 reference first.

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
from moe_kernels import interpreter_compat
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

# The sweep: weight tiles per program, weight rows per tile (the MMA's M side), pipeline
# depth over the tiles.  Tokens per tile follow vLLM's decode tiles (16, 8 at M <= 8 where
# a routing puts at most a token or two on an expert).
N_TILES = (1, 2, 4, 8)
TILE_N = (64, 128)
STAGES = (2, 3)
BLOCK_K = 128  # one 128 x 128 scale block per K step for block FP8; 128 B per row for both


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
    b_expert = b_ptr + expert * stride_be
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    if MUL_ROUTED_WEIGHT:
        routed = tl.load(topk_weights_ptr + token_ids, mask=token_mask, other=0.0)
    if not BLOCK_SCALED:
        tensor_scale = tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert)

    # The pipelined loop: one weight tile per iteration, its whole (short) K unrolled.
    first_n = pid_n * (N_TILES * BLOCK_SIZE_N)
    for tile in range(N_TILES):
        offs_n = first_n + tile * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        n_mask = offs_n < N
        acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
        for step in tl.static_range(K_STEPS):
            ks = step * BLOCK_SIZE_K + offs_k
            k_mask = ks < K
            b = tl.load(
                b_expert + offs_n[:, None] * stride_bn + ks[None, :],
                mask=n_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            a_t = tl.load(
                a_rows + ks[:, None], mask=k_mask[:, None] & token_mask[None, :], other=0.0
            )
            if BLOCK_SCALED:
                # Swap-AB: weights on the MMA's M side, tokens on its N side.
                a_s = tl.load(
                    a_scale_ptr + (token_ids // TOP_K) * stride_asm + step,
                    mask=token_mask,
                    other=0.0,
                )
                b_s = tl.load(
                    b_scale_ptr + expert * stride_bse + (offs_n // GROUP_N) * stride_bsn + step,
                    mask=n_mask,
                    other=0.0,
                )
                acc += tl.dot(b, a_t) * b_s[:, None] * a_s[None, :]
            else:
                acc = tl.dot(b, a_t, acc)

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
        {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": n, "N_TILES": t, "num_stages": s, "num_warps": 4}
        for t, n, s in itertools.product(N_TILES, TILE_N, STAGES)
    ]


def launch_stream_n(case: dict, w_q, w_scale, C, assignment, config: dict) -> tuple[int, int]:
    """One launch of the kernel for ``case`` into ``C``; the grid it started."""
    sorted_ids, expert_ids, num_post = assignment
    a_q, a_scale = case["a_q"], case["a_scale"]
    num_experts, N, K = w_q.shape
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    pairs = case["ids"].numel()
    # a pair fills at most one row block at decode: no block past pairs * block_m finds work
    rows = min(sorted_ids.numel(), pairs * block_m)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(N, block_n * config["N_TILES"]))
    block = case["block"] is not None
    stream_n_moe_kernel[grid](
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
        TOP_K=case["top_k"],
        MUL_ROUTED_WEIGHT=case["mul_routed"],
        BLOCK_SCALED=block,
        GROUP_N=case["block"][0] if block else 1,
        BLOCK_SIZE_M=block_m,
        BLOCK_SIZE_N=block_n,
        BLOCK_SIZE_K=BLOCK_K,
        K_STEPS=triton.cdiv(K, BLOCK_K),
        N_TILES=config["N_TILES"],
        num_stages=config["num_stages"],
        num_warps=config["num_warps"],
    )
    return grid


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
        grid = launch_stream_n(case, *weights_q[copy], C, assignment, config)
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
        "experts_hit": int(torch.unique(case["ids"]).numel()), "rel_error": errors,
        "correct": all(e < FP8_ERROR_BOUND for e in errors),
        "check_s": round(time.monotonic() - started, 3), "launches": launches,
    }  # fmt: skip
    return row, all_copies, launches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--shape", action="append", required=True, choices=sorted(SHAPES))
    parser.add_argument("--gemm", default="down", choices=["up", "down"])
    parser.add_argument("--quant", action="append", choices=["tensor", "block"])
    parser.add_argument("--M", default="1,2,4,8,16,32,64")
    parser.add_argument("--routings", type=int, default=2)
    parser.add_argument("--seed", type=int, default=3101)
    parser.add_argument("--graph-us", type=float, default=2000.0)
    parser.add_argument("--replays", type=int, default=12)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if DEVICE != "cuda":
        interpreter_compat.apply()

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
    for shape_name, quant in itertools.product(args.shape, args.quant or ["tensor", "block"]):
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
