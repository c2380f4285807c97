"""How fast the chosen experts' weights can be read at all, at the sizes a decode layer
reads: the simplest Triton kernel that reads exactly those bytes (each program folds one
chunk of one chosen expert's ``w1`` or ``w2``), in one launch and in two, beside v9 on the
same case in the same graphs.  The read floor (a 4 GiB streaming read's rate) has no fixed
cost; this probe says how much of the gap between a fused form and the floor any kernel
pays at these sizes, and what is left to its streaming.

    python3 kernels/drafts/fused_decode/read_probe.py --shapes qwen3-30b-a3b --M 1,16 \\
        --out $OUT/read-probe.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys

import numpy
import torch
import triton
import triton.language as tl
from bench import SWEEP, fused_call, label, rotation
from moe_kernels.measure import (
    COPIES,
    DEVICE,
    OUT_DTYPE,
    SHAPES,
    captured,
    environment,
    interleaved_times_us,
    make_weights,
    measure_bandwidth,
    routing,
)

CALLS = 64 if DEVICE == "cuda" else 1  # per graph, rotating over the weight copies
BLOCK_WORDS = 1024  # int32 words per load of a program (4 KB)
UNROLL = 4  # loads issued together per loop step


@triton.jit
def _read_experts_kernel(
    a_ptr,
    b_ptr,
    hit_ptr,
    sums_ptr,
    a_words,
    b_words,
    a_chunks,
    chunk_words,
    BLOCK: tl.constexpr,
    UNROLL: tl.constexpr,
):
    # Program (slot, chunk) folds (xor) one chunk of the slot-th chosen expert: of ``a`` for the
    # first ``a_chunks`` chunks, of ``b`` after them (one launch for both GEMMs' weights).
    slot = tl.program_id(0)
    chunk = tl.program_id(1)
    expert = tl.load(hit_ptr + slot).to(tl.int64)
    if chunk < a_chunks:
        base = a_ptr + expert * a_words
        words = a_words
        start = chunk * chunk_words
    else:
        base = b_ptr + expert * b_words
        words = b_words
        start = (chunk - a_chunks) * chunk_words
    end = tl.minimum(start + chunk_words, words)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for step in range(start, end, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            offs = step + u * BLOCK + tl.arange(0, BLOCK)
            acc ^= tl.load(base + offs, mask=offs < end, other=0)
    tl.store(sums_ptr + slot * tl.num_programs(1) + chunk, tl.xor_sum(acc, axis=0))


def read_experts(a, b, hit, sums, chunk_words):
    """One launch reading the ``hit`` experts of ``a`` and ``b`` (int32 views, experts
    first); ``b`` None reads ``a`` alone."""
    a_words = a[0].numel()
    a_chunks = triton.cdiv(a_words, chunk_words)
    b_words = b[0].numel() if b is not None else 0
    chunks = a_chunks + triton.cdiv(b_words, chunk_words)
    _read_experts_kernel[(hit.numel(), chunks)](
        a, a if b is None else b, hit, sums, a_words, b_words, a_chunks, chunk_words,
        BLOCK=BLOCK_WORDS, UNROLL=UNROLL,
    )  # fmt: skip


def probe_call(words, hit, sums, chunk_words, one_launch, copy):
    w1, w2 = words[copy]
    if one_launch:
        read_experts(w1, w2, hit, sums, chunk_words)
    else:
        read_experts(w1, None, hit, sums, chunk_words)
        read_experts(w2, None, hit, sums[sums.numel() // 2 :], chunk_words)


def fold(words: torch.Tensor) -> int:
    """The xor of all ``words`` (the probe's check that it read every byte)."""
    return int(numpy.bitwise_xor.reduce(words.cpu().numpy()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--M", default="1,4,16")
    parser.add_argument("--chunk-kb", default="16,32,64,128")
    parser.add_argument("--configs", default="32", help="fused forms beside it (bench.SWEEP)")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--seed", type=int, default=4301)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    bandwidth = measure_bandwidth() if DEVICE == "cuda" else {"read_gbps": 1.0}
    rate = bandwidth["read_gbps"] * 1e3  # bytes per µs
    print(f"bandwidth {bandwidth}", flush=True)
    rows = []
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
        weights = {g: make_weights(shape, g, "tensor", gen) for g in ("up", "down")}
        words = [
            tuple(weights[g][c][0].view(torch.int32) for g in ("up", "down")) for c in range(COPIES)
        ]
        for M in map(int, args.M.split(",")):
            ids, tw = routing(M, shape, gen)
            hit = torch.unique(ids).to(torch.int32)
            x = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=OUT_DTYPE)
            nbytes = hit.numel() * 4 * (words[0][0][0].numel() + words[0][1][0].numel())
            want = fold(torch.cat([w[hit.long()].flatten() for w in words[COPIES - 1]]))
            calls, meta = {}, {}
            for kb, one_launch in itertools.product(
                map(int, args.chunk_kb.split(",")), (True, False)
            ):
                chunk_words = kb * 256
                programs = hit.numel() * sum(
                    triton.cdiv(w[0].numel(), chunk_words) for w in words[0]
                )
                sums = torch.zeros(2 * programs, dtype=torch.int32, device=DEVICE)
                call = functools.partial(probe_call, words, hit, sums, chunk_words, one_launch)
                sums.zero_()
                call(COPIES - 1)
                if fold(sums) != want:
                    raise RuntimeError(f"read probe folded wrongly ({kb} KB chunks)")
                name = f"read-{'one' if one_launch else 'two'}-launch:chunk={kb}KB"
                calls[name] = rotation(call, CALLS)
                meta[name] = {"programs": programs, "chunk_kb": kb, "launches": 2 - one_launch}
            for index in map(int, args.configs.split(",")):
                form, config = SWEEP[index]
                out = torch.empty(M, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)
                call = functools.partial(
                    fused_call, form, config, weights, x, ids, tw, "tensor", out
                )
                calls[label(form, config)] = rotation(call, CALLS)
                meta[label(form, config)] = {"form": form, "config": config}
            names = list(calls)
            times = interleaved_times_us([captured(calls[n]) for n in names], args.replays)
            floor_us = nbytes / rate
            shown = []
            for name, series in zip(names, times, strict=True):
                us = statistics.median(t / CALLS for t in series)
                rows.append({
                    "shape": shape_name, "M": M, "experts_hit": int(hit.numel()),
                    "variant": name, "us": us, "us_all": [t / CALLS for t in series],
                    "weight_bytes": nbytes, "floor_us": floor_us,
                    "fraction_of_floor": floor_us / us, **meta[name],
                })  # fmt: skip
                shown.append(f"{name}={us:.1f}")
            print(f"{shape_name} M={M} hit={hit.numel()} floor={floor_us:.1f} | "
                  + " ".join(shown), flush=True)  # fmt: skip
        del weights, words
    report = {
        "environment": environment(),
        "command": " ".join(sys.argv),
        "bandwidth": bandwidth,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
