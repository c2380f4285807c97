"""Where a fused form's time goes, kernel by kernel, on a GPU: each kernel's mean device
time per call (CUDA's activity records of eager calls rotating over the harness's weight
copies, so the weights come from HBM as in a model), the bytes it must read, and the
fraction of the streaming read rate that makes.

    python3 kernels/drafts/fused_decode/kernel_split.py --shapes qwen3-30b-a3b \\
        --M 1,16 --quant tensor --configs 32 --out $OUT/kernel-split.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys

import torch
from bench import SWEEP, fused_call, label
from moe_kernels.measure import (
    COPIES,
    DEVICE,
    OUT_DTYPE,
    SHAPES,
    environment,
    make_weights,
    measure_bandwidth,
    routing,
)
from torch.profiler import ProfilerActivity, profile

ROUNDS = 10  # rotations over the weight copies


def kernel_split(call) -> dict[str, float]:
    """Mean device µs per call of each kernel ``call(copy)`` launches."""
    for copy in range(COPIES):
        call(copy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _, copy in itertools.product(range(ROUNDS), range(COPIES)):
            call(copy)
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:60]] = totals.get(event.name[:60], 0.0) + event.device_time_total
    return {name: us / (ROUNDS * COPIES) for name, us in sorted(totals.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--M", default="1,16")
    parser.add_argument("--quant", default="tensor")
    parser.add_argument("--configs", default="32", help="indices into bench.SWEEP")
    parser.add_argument("--seed", type=int, default=4301)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    bandwidth = measure_bandwidth()
    rate = bandwidth["read_gbps"] * 1e3  # bytes per µs
    rows = []
    for shape_name, quant in itertools.product(args.shapes.split(","), args.quant.split(",")):
        shape = SHAPES[shape_name]
        gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
        weights = {g: make_weights(shape, g, quant, gen) for g in ("up", "down")}
        for M in map(int, args.M.split(",")):
            ids, tw = routing(M, shape, gen)
            hit = int(torch.unique(ids).numel())
            x = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=OUT_DTYPE)
            reads = {
                gemm: hit * (weights[gemm][0][0][0].numel() + weights[gemm][0][1][0].numel() * 4)
                for gemm in ("up", "down")
            }
            for index in map(int, args.configs.split(",")):
                form, config = SWEEP[index]
                out = torch.empty(M, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)
                times = kernel_split(
                    functools.partial(fused_call, form, config, weights, x, ids, tw, quant, out)
                )
                shown = []
                for name, us in times.items():
                    gemm = "up" if "_up_" in name else "down" if "_down_" in name else None
                    share = reads[gemm] / rate / us if gemm else None
                    rows.append({
                        "shape": shape_name, "quant": quant, "M": M, "experts_hit": hit,
                        "variant": label(form, config), "kernel": name, "us": us,
                        "bytes": reads.get(gemm), "fraction_of_read_rate": share,
                    })  # fmt: skip
                    shown.append(
                        f"{name.split('(')[0][-28:]} {us:.1f}"
                        + (f" ({share:.2f})" if share else "")
                    )
                print(
                    f"{shape_name} {quant} M={M} hit={hit} {label(form, config)}: "
                    + ", ".join(shown),
                    flush=True,
                )
        del weights
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
