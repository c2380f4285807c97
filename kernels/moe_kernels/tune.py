"""Search launch configs for one tree's fused_moe_kernel on the GPU at decode sizes.

For each shape, GEMM, quantisation and M, every candidate config is checked
against the float64 reference and timed as in :mod:`moe_kernels.bench` (fewer
replays); the fastest correct one per M is reported, beside the time of the
tree's own dispatch in the same run.  The result is the raw material for a
tuned config table in vLLM's JSON format.

    python -m moe_kernels.tune --tree 0.21.0+moe=/path --out tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from .bench import (
    DEVICE,
    SHAPES,
    Variant,
    environment,
    make_case,
    make_weights,
    measure_bandwidth,
    time_variant,
)
from .loader import load_fused_moe_kernel

DECODE_M = (1, 2, 4, 8, 16, 32, 64)
TUNE_REPLAYS = 10


# The search space: wide weight tiles on the MMA's M side, deep K tiles to keep
# HBM busy, shallow-to-medium pipelines.
TILE_N = (64, 128, 256)
TILE_K = (128, 256)
WARPS = (4,)
STAGES = (3, 4)


def candidates(quant: str, M: int) -> list[dict]:
    """Swap-AB tiles for decode: 16 or 32 tokens on the MMA's N side."""
    block_ks = tuple(k for k in TILE_K if k <= 128) if quant == "block" else TILE_K
    block_m = 16 if M <= 16 else 32
    return [
        {
            "BLOCK_SIZE_M": block_m,
            "BLOCK_SIZE_N": block_n,
            "BLOCK_SIZE_K": block_k,
            "GROUP_SIZE_M": 1,
            "num_warps": warps,
            "num_stages": stages,
            "SWAP_AB": True,
        }
        for block_n, block_k, warps, stages in itertools.product(TILE_N, block_ks, WARPS, STAGES)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, metavar="LABEL=PATH")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--gemm", action="append", choices=["up", "down"])
    parser.add_argument("--quant", action="append", choices=["tensor", "block"])
    parser.add_argument("--M", default=",".join(map(str, DECODE_M)))
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    label, _, path = args.tree.partition("=")
    variant = Variant(label, Path(path), load_fused_moe_kernel(Path(path)))
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    bandwidth = measure_bandwidth()
    best = []
    for shape_name in args.shape or [n for n in SHAPES if n != "tiny-smoke-test"]:
        shape = SHAPES[shape_name]
        for gemm in args.gemm or ["up", "down"]:
            for quant in args.quant or ["tensor"]:
                weights_q = make_weights(shape, gemm, quant, gen)
                for M in (int(m) for m in args.M.split(",")):
                    case = make_case(shape, gemm, quant, M, gen)
                    refs: dict = {}
                    own = time_variant(variant, case, weights_q, refs, replays=TUNE_REPLAYS)
                    tried = [own]
                    for candidate in candidates(quant, M):
                        try:
                            tried.append(
                                time_variant(
                                    variant,
                                    case,
                                    weights_q,
                                    refs,
                                    config=candidate,
                                    replays=TUNE_REPLAYS,
                                )
                            )
                        except OutOfResources:  # the tile does not fit in shared memory
                            continue
                    good = [r for r in tried if r["correct"]]
                    winner = min(good, key=lambda r: r["us"])
                    best.append(
                        {
                            "shape": shape_name,
                            "gemm": gemm,
                            "quant": quant,
                            "M": M,
                            "dispatch_us": own["us"],
                            "dispatch_config": own["config"],
                            "best_us": winner["us"],
                            "best_config": winner["config"],
                            "best_swap_ab": winner["swap_ab"],
                            "tried": len(tried),
                            "incorrect": len(tried) - len(good),
                        }
                    )
                    print(
                        f"{shape_name:16s} {gemm:4s} {quant:6s} M={M:<3d} dispatch={own['us']:.1f}us "
                        f"best={winner['us']:.1f}us {winner['config']}",
                        flush=True,
                    )
                    Path(args.out).write_text(
                        json.dumps(
                            {
                                "command": " ".join(
                                    ["python", "-m", "moe_kernels.tune", *(argv or sys.argv[1:])]
                                ),
                                "environment": environment(),
                                "bandwidth": bandwidth,
                                "results": best,
                            },
                            indent=1,
                        )
                    )
                del weights_q
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
