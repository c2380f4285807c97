"""64- against 128-wide weight tiles of one Swap-AB launch, from the config searches.

The committed H200 config searches behind the shipped tables timed several tiles of each
cell on the same routing.  Every pair of swapped configs that differ only in BLOCK_SIZE_N
(64 against 128; same token and K tile, depth, warps, no split) is a paired measurement of
the tile width, per GEMM.  Grouped by quantisation, by whether the 64-wide grid is resident
at once (every program on an SM together, at the pair's depth) and by M, they are the
evidence behind the swap-ab patch's ``default_config_decode_tile`` (64-wide tiles for
block-scaled FP8 where no table exists, where the narrow grid is resident).

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.tile_width --out tile-width.md
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

from moe_kernels.resultfile import read_report
from moe_kernels.tune import launch_programs

from studies.resident_depth import (
    SEARCHES,
    SHAPES,
    SM_COUNT,
    _geomean,
    resident,
    search_study_parser,
    write_report,
)


def width_pairs(searches) -> list[dict]:
    """Time at 128 over time at 64 of one swapped tile, per GEMM of a search cell."""
    pairs = []
    for path in searches:
        for cell in read_report(Path(path))["results"]:
            shape, M = SHAPES[cell["shape"]], cell["M"]
            by_rest: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
            for timed in cell["all"]:
                config = timed["config"]
                if not timed.get("swap_ab") or config.get("SPLIT_K", 1) != 1:
                    continue
                rest = tuple(
                    config.get(k, 1)
                    for k in (
                        "BLOCK_SIZE_M",
                        "BLOCK_SIZE_K",
                        "num_stages",
                        "num_warps",
                        "GROUP_SIZE_M",
                    )
                )
                by_rest[rest][config["BLOCK_SIZE_N"]] = timed
            for rest, widths in by_rest.items():
                if 64 not in widths or 128 not in widths:
                    continue
                block_m, block_k, stages = rest[:3]
                if cell["quant"] == "block":  # the launcher clamps the K tile to the scale block
                    block_k = min(block_k, 128)
                for gemm in ("up", "down"):
                    pairs.append(
                        {
                            "cell": (cell["shape"], cell["quant"], M, gemm),
                            "programs_128": launch_programs(shape, gemm, M, rest[0], 128),
                            "narrow_resident": resident(
                                launch_programs(shape, gemm, M, block_m, 64),
                                stages,
                                (block_m + 64) * block_k,
                            ),
                            "ratio": widths[128][f"{gemm}_us"] / widths[64][f"{gemm}_us"],
                        }
                    )
    return pairs


def _row(name: str, ratios: list[float]) -> str:
    return (
        f"| {name} | {len(ratios)} | {_geomean(ratios):.3f} | {sum(r > 1 for r in ratios)} | "
        f"{min(ratios):.3f}, {max(ratios):.3f} |"
    )


def markdown(pairs: list[dict], searches) -> str:
    lines = [
        "# 64- against 128-wide weight tiles of one Swap-AB tile",
        "",
        "From " + ", ".join(f"`{Path(s).name}`" for s in searches) + ": time with a 128-wide "
        "N tile over time with a 64-wide one, all else equal, same GEMM and routing "
        "(> 1: the 64-wide tile faster).",
        "",
        "| pairs | launches | geomean 128 / 64 | 64 faster in | slowest, fastest |",
        "|---|---|---|---|---|",
    ]
    for quant in ("block", "tensor"):
        of = [p for p in pairs if p["cell"][1] == quant]
        groups = [
            (f"{quant}, all", of),
            (
                f"{quant}, 128-wide grid below {SM_COUNT} programs",
                [p for p in of if p["programs_128"] < SM_COUNT],
            ),
            (f"{quant}, 64-wide grid resident", [p for p in of if p["narrow_resident"]]),
            (f"{quant}, 64-wide grid not resident", [p for p in of if not p["narrow_resident"]]),
        ]
        groups += [
            (f"{quant}, M {lo}-{hi}", [p for p in of if lo <= p["cell"][2] <= hi])
            for lo, hi in ((1, 2), (3, 8), (9, 16), (17, 64))
        ]
        lines += [_row(name, [p["ratio"] for p in group]) for name, group in groups if group]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = search_study_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    searches = args.search or list(SEARCHES)
    return write_report(args.out, markdown(width_pairs(searches), searches))


if __name__ == "__main__":
    sys.exit(main())
