"""What ``split_k_to_fill`` does to vLLM's own tables, replayed from one H200 bench run.

vLLM's tuned tables say nothing about SPLIT_K (they were tuned for a kernel that could not
split).  The bench this study reads timed, on the same routings, 0.21.0 and 0.33.0 as
released, 0.21.0 with the series before the rule (``--before``) and both releases with a
trial of the series that offered every such entry the split a default config gets
(``--offer``: the patch's ``split_k_for`` then split grids smaller than the GPU and, with
a long K loop, up to one and a half times as large).  The shipped rule splits such an
entry only where its launch swaps and starts fewer programs than the GPU has SMs; every
launch it makes is one of the two measured: the trial's where the trial split for that
reason, the series' before the rule everywhere else.  This report says which launches
change and what each costs or gains, and what the trial's other splits cost.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.fill_split_replay BENCH.json --out fill-split.md
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from statistics import geometric_mean

from moe_kernels.measure import SHAPES
from moe_kernels.resultfile import read_report
from moe_kernels.tune import launch_programs

from studies import emit

# (trial, series before the rule, release): the run also timed 0.33.0 with the 0.25+
# series' trial, but not that series before the rule, so its launches are not replayed here.
PAIRS = (("0.21.0+offer", "0.21.0+s29", "0.21.0"),)


def cases(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(shape, quant, gemm, M) -> variant -> {"us": geometric mean over routings, row}."""
    timed: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if not row["correct"]:
            raise ValueError(f"an incorrect measurement: {row['shape']} {row['variant']}")
        key = (row["shape"], row["quant"], row["gemm"], row["M"])
        timed[key][row["variant"]].append(row)
    return {
        key: {
            variant: {"us": geometric_mean([r["us"] for r in runs]), "row": runs[0]}
            for variant, runs in variants.items()
        }
        for key, variants in timed.items()
    }


def launched_grid(key: tuple, row: dict) -> int:
    """Programs of the launch ``row`` timed (its tile as launched, before any K split)."""
    shape, _, gemm, M = key
    config = row["config"]
    block_n = row.get("launched", {}).get("BLOCK_SIZE_N", config["BLOCK_SIZE_N"])
    return launch_programs(SHAPES[shape], gemm, M, config["BLOCK_SIZE_M"], block_n)


def fill_splits(key: tuple, offered: dict, before: dict, sm_count: int) -> bool:
    """Whether the shipped rule splits this launch: the trial split an entry that named no
    SPLIT_K (as launched before the rule), the launch swaps, and its grid is smaller than
    the GPU."""
    row = offered["row"]
    if row["split_k"] <= 1 or "SPLIT_K" in before["row"]["config"] or not row["swap_ab"]:
        return False
    return launched_grid(key, row) < sm_count


def report(bench: dict) -> str:
    sm_count = bench["environment"]["sm_count"]
    table = cases(bench["rows"])
    lines = [
        "# split_k_to_fill, replayed from one H200 bench run",
        "",
        f"- bench: `{bench['command']}`",
        f"- {bench['environment']['gpu']} ({sm_count} SMs), torch "
        f"{bench['environment']['torch']}, Triton {bench['environment']['triton']}; "
        f"{bench['method']['routings']} routings per case, times their geometric mean",
        "",
        "Launches of tuned entries vLLM ships (no `SPLIT_K`) whose K split differs between the"
        " trial (`0.21.0+offer`) and the series before the rule (`0.21.0+s29`):",
        "",
        "| shape | quant | GEMM | M | grid | swaps | trial / before | shipped rule splits"
        " | shipped / before | shipped / release |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    shipped_gain, trial_only = [], []
    for key in sorted(table):
        variants = table[key]
        for offer, before, release in PAIRS:
            if offer not in variants:
                continue
            offered, base = variants[offer], variants[before]
            tuned = base["row"]["config_source"].startswith("tuned")
            if not tuned or offered["row"]["split_k"] == base["row"]["split_k"]:
                continue
            grid = launched_grid(key, offered["row"])
            splits = fill_splits(key, offered, base, sm_count)
            shipped = offered if splits else base
            trial = base["us"] / offered["us"]
            (shipped_gain if splits else trial_only).append(trial)
            lines.append(
                f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {grid} "
                f"| {'yes' if offered['row']['swap_ab'] else 'no'} | {trial:.3f}x "
                f"| {'yes' if splits else 'no'} | {base['us'] / shipped['us']:.3f}x "
                f"| {variants[release]['us'] / shipped['us']:.3f}x |"
            )
    lines += [
        "",
        "(× > 1: faster; `before`: 0.21.0 with the series before the rule; `release`: 0.21.0.)",
        "",
        f"- splits the shipped rule makes: {len(shipped_gain)}, "
        + (
            f"{min(shipped_gain):.3f}x to {max(shipped_gain):.3f}x over the launch before it"
            if shipped_gain
            else "none"
        ),
        f"- splits only the trial made: {len(trial_only)}, "
        + (f"{min(trial_only):.3f}x to {max(trial_only):.3f}x" if trial_only else "none"),
        "- every other launch of the run is the series' launch before the rule, unchanged.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", type=Path, help="moe_kernels.bench JSON with +offer trees")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    emit(report(read_report(args.bench)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
