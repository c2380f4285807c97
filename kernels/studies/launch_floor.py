"""How close a small decode GEMM can get to its HBM floor at all.

The floor (bytes over streaming-read bandwidth) ignores what every launch costs
before and after its bytes move.  For each shape's GEMMs at small M this times,
as :mod:`moe_kernels.bench` does (one CUDA graph of ``LAUNCHES`` launches over
``COPIES`` buffers, so the bytes come from HBM):

* ``empty``: a kernel with the GEMM's grid that loads nothing;
* ``read``: a kernel with the same grid whose programs only stream the GEMM's
  weight bytes (the same bytes per program as the GEMM's tiles) and keep a sum.

``read`` is the best any kernel with that grid and those bytes could do; its
fraction of the floor bounds what the GEMM could reach.

A one-off study, not part of the installed package; from the repository root
(torch and triton installed; ``moe_kernels`` installed or, as here, on ``PYTHONPATH``):

    PYTHONPATH=kernels python -m studies.launch_floor --out launch-floor.json

Result: ``kernels/results/launch-floor/h200-launch-floor.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from moe_kernels import interpreter_compat
from moe_kernels.measure import (
    COPIES,
    DEVICE,
    LAUNCHES,
    SHAPES,
    graph_time_us,
    measure_bandwidth,
    record_header,
)

# (shape, GEMM, M, experts hit, BLOCK_SIZE_N, SPLIT_K): the dispatch of the
# series for the worst decode cases in kernels/results/series/h200-series-bench.md.
CASES = (
    ("deepseek-v3-tp8", "up", 1, 8, 64, 4),
    ("deepseek-v3-tp8", "down", 1, 8, 64, 1),
    ("qwen3-30b-a3b", "up", 1, 8, 64, 1),
    ("qwen3-30b-a3b", "down", 1, 8, 64, 1),
    ("mixtral-8x7b", "down", 1, 2, 64, 4),
    ("qwen3-235b-a22b", "down", 1, 8, 64, 1),
)
VECTOR = 1024  # int32 elements per load: 4 KiB


@triton.jit
def _empty_kernel(out_ptr):
    # Touch one word so the launch is not optimised away.
    if tl.program_id(0) == 0:
        tl.store(out_ptr, 0)


@triton.jit
def _tile_read_kernel(x_ptr, out_ptr, words_per_program, VECTOR: tl.constexpr):
    # Each program streams its own contiguous slice, like one GEMM tile's weights.
    start = tl.program_id(0).to(tl.int64) * words_per_program
    acc = tl.zeros((VECTOR,), dtype=tl.int32)
    for offset in range(0, words_per_program, VECTOR):
        acc += tl.load(x_ptr + start + offset + tl.arange(0, VECTOR))
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def measure(case, bandwidth) -> dict:
    shape_name, gemm, M, hit, block_n, split_k = case
    shape = SHAPES[shape_name]
    N, K = (
        (2 * shape.intermediate, shape.hidden)
        if gemm == "up"
        else (shape.hidden, shape.intermediate)
    )
    programs = hit * triton.cdiv(N, block_n) * split_k
    nbytes = hit * N * K  # FP8 weights: the bulk of the floor at M = 1
    words = nbytes // 4 // programs // VECTOR * VECTOR
    buffers = [
        torch.randint(-9, 9, (programs * words,), dtype=torch.int32, device=DEVICE)
        for _ in range(COPIES)
    ]
    out = torch.empty(programs, dtype=torch.int32, device=DEVICE)
    launches = LAUNCHES if DEVICE == "cuda" else 1

    def empty():
        for _ in range(launches):
            _empty_kernel[(programs,)](out)

    def read():
        for i in range(launches):
            _tile_read_kernel[(programs,)](buffers[i % COPIES], out, words, VECTOR=VECTOR)

    read()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    want = buffers[(launches - 1) % COPIES].view(programs, words).to(torch.int64).sum(1)
    if not torch.equal(out.to(torch.int64), want):
        raise RuntimeError("tile-read kernel summed wrongly")
    empty_us = statistics.median(graph_time_us(empty)) / launches
    read_us = statistics.median(graph_time_us(read)) / launches
    floor_us = programs * words * 4 / bandwidth["read_gbps"] / 1e3
    return {
        "shape": shape_name, "gemm": gemm, "M": M, "experts_hit": hit, "BLOCK_SIZE_N": block_n,
        "SPLIT_K": split_k, "programs": programs, "bytes": programs * words * 4,
        "floor_us": floor_us, "empty_us": empty_us, "read_us": read_us,
        "read_fraction_of_floor": floor_us / read_us,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if DEVICE == "cpu":
        interpreter_compat.apply()
    bandwidth = measure_bandwidth()
    rows = []
    for case in CASES:
        rows.append(measure(case, bandwidth))
        r = rows[-1]
        print(
            f"{r['shape']:16s} {r['gemm']:4s} M={r['M']} programs={r['programs']:<5d} "
            f"floor={r['floor_us']:.1f}us empty={r['empty_us']:.1f}us read={r['read_us']:.1f}us "
            f"({r['read_fraction_of_floor']:.2f} of floor)",
            flush=True,
        )
    report = {
        **record_header("studies.launch_floor", argv),
        "bandwidth": bandwidth,
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
