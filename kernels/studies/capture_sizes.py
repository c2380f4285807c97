"""The 0.20 series' H200 tables at vLLM's CUDA-graph sizes between the searched powers of two.

vLLM pads a decode batch to its next CUDA-graph size (1, 2, 4, 8, 16, 24, 32, 40, 48, 56,
64, ...) and launches the table entry nearest that size.  The series' tables were searched
at 1, 2, 4, ..., 64, so at 24, 40, 48 and 56 a batch ran an entry tuned for another token
count.  ``moe_kernels.tune`` searched those sizes on an H200 (seeded from the neighbouring
searched cells, timed against vLLM 0.21.0, 0.33.0 and the series before this search on the
same routings), and :func:`moe_kernels.configs.build_files` turned the searches into the
shipped entries.  This report says, per searched cell, what the shipped entry does there
against the series before it and against both releases: the time of the config the tables
now launch, both GEMMs of the layer summed over the search's routings.  In-sample: the
entries were chosen on these timings.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.capture_sizes TUNE.json [...] --out capture-sizes.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import geometric_mean

from moe_kernels.configs import as_launch, chosen
from moe_kernels.measure import CAPTURE_SIZES
from moe_kernels.resultfile import read_report

from studies import emit

SERIES_BEFORE = "0.21.0+moe"  # the peer that ran the series' tables as they were
RELEASES = ("0.21.0", "0.33.0")


def where(token_counts: list[int]) -> str:
    """The searched token counts, as the report's title names them."""
    listed = ", ".join(map(str, token_counts))
    if set(token_counts) <= set(CAPTURE_SIZES):
        return f"vLLM's CUDA-graph sizes {listed}"
    return f"M = {listed}, between vLLM's CUDA-graph sizes"


def shipped_time(row: dict) -> tuple[dict, str]:
    """The timing of the config the tables launch at this cell after the search, and
    whether the entry is the search's winner ("tuned") or the tree's own ("kept")."""
    entry, _ = chosen(row)
    if entry is None:
        return row["dispatch"], "kept"
    timed = next(t for t in row["all"] if as_launch(t["config"]) == as_launch(entry))
    return timed, "tuned"


def cells(
    runs: list[dict], before: str = SERIES_BEFORE, releases: tuple[str, ...] = RELEASES
) -> list[dict]:
    out = []
    for run in runs:
        for row in run["results"]:
            timed, how = shipped_time(row)
            peers = row["peers"]
            out.append(
                {
                    "shape": row["shape"], "quant": row["quant"], "M": row["M"], "entry": how,
                    "us": timed["us"],
                    **{label: peers[label]["us"] for label in (before, *releases)},
                    # per peer, the entry's slower GEMM against that peer's same GEMM
                    "gemm": {
                        label: min(
                            peers[label][f"{gemm}_us"] / timed[f"{gemm}_us"]
                            for gemm in ("up", "down")
                        )
                        for label in (before, *releases)
                    },
                }
            )  # fmt: skip
    return sorted(out, key=lambda c: (c["shape"], c["quant"], c["M"]))


def markdown(
    names: list[str],
    found: list[dict],
    before: str = SERIES_BEFORE,
    releases: tuple[str, ...] = RELEASES,
    series: str = "0.20",
) -> str:
    lines = [
        f"# The {series} series' H200 tables at {where(sorted({c['M'] for c in found}))}",
        "",
        "Written by `kernels/studies/capture_sizes.py` from "
        + ", ".join(f"`{n}`" for n in names)
        + ": per cell, both GEMMs of the layer summed over two routings (µs) with the "
        f"entry the tables now launch, the series before the search (`{before}`, "
        "its nearest entry), and vLLM "
        + " and ".join(releases)
        + " with their own kernel and config. "
        "`kept`: the search found nothing 3% faster that keeps pace, and the file holds the "
        "config timed as the tree's own (the release's default or shipped entry). "
        "In-sample: the entries were chosen on these timings.",
        "",
        "| peer | cells | geomean speed-up of the shipped entry | slowest | below 0.98x "
        "| slowest single GEMM |",
        "|---|---|---|---|---|---|",
    ]
    for peer in (before, *releases):
        ratios = [c[peer] / c["us"] for c in found]
        below = sum(r < 0.98 for r in ratios)
        lines.append(
            f"| `{peer}` | {len(ratios)} | {geometric_mean(ratios):.3f}x | {min(ratios):.3f}x "
            f"| {below} | {min(c['gemm'][peer] for c in found):.3f}x |"
        )
    lines += [
        "",
        "| shape | quant | M | entry | µs | "
        + " | ".join(f"`{p}` µs" for p in (before, *releases))
        + f" | vs `{before}` | "
        + " | ".join(f"vs {r}" for r in releases)
        + " | slowest GEMM vs a peer |",
        "|---|---|---|---|---|" + "---|" * (2 * (1 + len(releases)) + 1),
    ]
    for c in found:
        lines.append(
            f"| {c['shape']} | {c['quant']} | {c['M']} | {c['entry']} | {c['us']:.1f} | "
            + " | ".join(f"{c[p]:.1f}" for p in (before, *releases))
            + " | "
            + " | ".join(f"{c[p] / c['us']:.3f}x" for p in (before, *releases))
            + f" | {min(c['gemm'].values()):.3f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="TUNE.json")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--before", default=SERIES_BEFORE, help="the peer that ran the series")
    parser.add_argument(
        "--release", action="append", help="a release peer (repeatable; default: 0.21.0, 0.33.0)"
    )
    parser.add_argument("--series", default="0.20", help="the series the tables belong to")
    args = parser.parse_args(argv)
    releases = tuple(args.release or RELEASES)
    runs = [read_report(p) for p in args.runs]
    found = cells(runs, args.before, releases)
    text = markdown([p.name for p in args.runs], found, args.before, releases, args.series)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
