"""What the MoE layer's top-k sum costs, and what a kernel of its own would.

After the second GEMM each token holds one output row per chosen expert; vLLM's
``moe_sum`` adds them.  It has CUDA kernels of its own for top-2, 3 and 4 only and hands
top-k > 4 to PyTorch's ``sum(dim=1)`` (``at::sum_out``), which the end-to-end profile of
Qwen3-30B-A3B (top-8) on an H200 showed at 0.22 ms of a 3.76 ms decode step.  For the
top-8 shapes this times, as :mod:`moe_kernels.bench` does (one CUDA graph of ``LAUNCHES``
calls over ``COPIES`` inputs, so the rows come from HBM):

* ``torch``: ``torch.sum(x, dim=1, out=out)`` on ``x`` of shape (M, top_k, hidden), bf16;
* ``triton``: :func:`_topk_sum_kernel`, one program per token and hidden block, adding the
  top_k rows in float32.

Both are checked against a float64 sum of the same input first.  The floor is the bytes
read and written over the streaming-read bandwidth measured in the same run.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.topk_sum --out topk-sum.json
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
    OUT_DTYPE,
    SHAPES,
    graph_time_us,
    measure_bandwidth,
    record_header,
)

TOP8_SHAPES = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3-tp8", "glm-4.5-air")
TOKENS = (1, 4, 16, 64, 256, 1024)
BLOCK_HIDDEN = 1024  # hidden elements per program: one vectorised row slice


@triton.jit
def _topk_sum_kernel(x_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    # One token's slice of the hidden dimension: add its TOP_K expert rows in float32.
    token = tl.program_id(0).to(tl.int64)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < hidden
    rows = x_ptr + token * TOP_K * hidden + offsets
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(rows + k * hidden, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * hidden + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


def topk_sum(x: torch.Tensor, out: torch.Tensor) -> None:
    tokens, top_k, hidden = x.shape
    grid = (tokens, triton.cdiv(hidden, BLOCK_HIDDEN))
    _topk_sum_kernel[grid](x, out, hidden, TOP_K=top_k, BLOCK=BLOCK_HIDDEN)


def measure(shape_name: str, tokens: int, gen: torch.Generator, bandwidth: dict) -> dict:
    shape = SHAPES[shape_name]
    inputs = [
        torch.randn(tokens, shape.topk, shape.hidden, generator=gen, device=DEVICE).to(OUT_DTYPE)
        for _ in range(COPIES)
    ]
    out = torch.empty(tokens, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)
    launches = LAUNCHES if DEVICE == "cuda" else 1
    ways = {
        "torch": lambda x: torch.sum(x, dim=1, out=out),
        "triton": lambda x: topk_sum(x, out),
    }
    row = {"shape": shape_name, "M": tokens, "top_k": shape.topk, "hidden": shape.hidden}
    for name, way in ways.items():
        out.fill_(float("nan"))
        way(inputs[0])
        want = inputs[0].double().sum(dim=1)
        error = float((out.double() - want).norm() / want.norm())
        if not error < 1e-2:
            raise RuntimeError(f"{name} top-k sum is wrong: relative error {error:.3g}")

        def calls(way=way):
            for i in range(launches):
                way(inputs[i % COPIES])

        row[f"{name}_us"] = statistics.median(graph_time_us(calls)) / launches
        row[f"{name}_rel_error"] = error
    nbytes = (shape.topk + 1) * tokens * shape.hidden * inputs[0].element_size()
    row["floor_us"] = nbytes / bandwidth["read_gbps"] / 1e3
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if DEVICE == "cpu":
        interpreter_compat.apply()
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    bandwidth = measure_bandwidth()
    rows = []
    for shape_name in TOP8_SHAPES:
        for tokens in TOKENS:
            rows.append(measure(shape_name, tokens, gen, bandwidth))
            r = rows[-1]
            print(
                f"{shape_name:16s} M={tokens:<5d} torch={r['torch_us']:.1f}us "
                f"triton={r['triton_us']:.1f}us floor={r['floor_us']:.1f}us",
                flush=True,
            )
    report = {**record_header("studies.topk_sum", argv), "bandwidth": bandwidth, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
