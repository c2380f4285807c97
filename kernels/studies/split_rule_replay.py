"""The split-K launch rule replayed on measured times.

A bench run (:mod:`moe_kernels.bench`) that timed two patched trees which differ only in
``split_k_for`` (``--tree 0.21.0+moe=...`` splitting grids below the SM count,
``--tree 0.21.0+g2=...`` splitting grids below twice the SM count) holds, for every case,
the time of both decisions.  Any rule that, per launch, chooses between "split as the
first does" and "split as the second does" can then be scored without another GPU run:
this takes the rule the patch ships (:func:`moe_kernels.launch.patched_split_k`, the
mirror of ``split_k_for``), recomputes each launch's grid and K steps from the case, and
picks the measured time of the tree whose decision it matches.

The score is in-sample: the rule's thresholds were chosen on the run it is replayed on.
Per case (shape, GEMM, quantisation, M) the geometric mean over routings is compared with
each tree of the run, as the bench report does.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.split_rule_replay RUN.json [RUN.json ...] --out replay.md
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

from moe_kernels.launch import patched_split_k
from moe_kernels.measure import SHAPES, gemm_dims
from moe_kernels.resultfile import read_report
from moe_kernels.tune import launch_programs

GRID_BELOW_SMS = "0.21.0+moe"  # the tree whose split_k_for splits grids below the SM count
GRID_BELOW_TWICE = "0.21.0+g2"  # ... below twice the SM count
SM_COUNT = 132
PEERS = ("0.21.0", "0.21.0+moe", "0.33.0", "0.33.0+moe")


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def replay(rows: list[dict], sm_count: int = SM_COUNT) -> tuple[dict, list[dict]]:
    """(per case: geometric-mean µs of every peer and of ``"rule"``; the launches whose
    decision the rule changes, with both times)."""
    launches: dict[tuple, dict[str, dict]] = collections.defaultdict(dict)
    for row in rows:
        key = (row["shape"], row["gemm"], row["quant"], row["M"], row.get("routing", 0))
        launches[key][row["variant"]] = row
    times: dict[tuple, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    changed = []
    for key, by_tree in sorted(launches.items()):
        below, twice = by_tree[GRID_BELOW_SMS], by_tree[GRID_BELOW_TWICE]
        shape, gemm = SHAPES[key[0]], key[1]
        config = below["config"]
        programs = launch_programs(
            shape, gemm, key[3], config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
        )
        k_steps = -(-gemm_dims(shape, gemm)[1] // config["BLOCK_SIZE_K"])
        split = patched_split_k(True, config.get("SPLIT_K", 1), programs, k_steps, sm_count)
        if split == below["split_k"]:
            us = below["us"]
        elif split == twice["split_k"]:
            us = twice["us"]
            changed.append(
                {
                    "case": key,
                    "programs": programs,
                    "k_steps": k_steps,
                    "unsplit_us": below["us"],
                    "split_us": twice["us"],
                }
            )
        else:  # neither tree launched what the rule would: the run cannot score it
            raise ValueError(f"{key}: the rule splits {split}, the run measured neither")
        for peer in PEERS:
            if peer in by_tree:
                times[key[:4]][peer].append(by_tree[peer]["us"])
        times[key[:4]]["rule"].append(us)
    cases = {case: {name: _geomean(ts) for name, ts in by.items()} for case, by in times.items()}
    return cases, changed


def summary(cases: dict, baseline: str, threshold: float = 0.98) -> dict:
    ratios = {case: by[baseline] / by["rule"] for case, by in cases.items() if baseline in by}
    return {
        "baseline": baseline,
        "cases": len(ratios),
        "geomean": _geomean(ratios.values()),
        "worst": min(ratios.values()),
        "below": sorted((r, case) for case, r in ratios.items() if r < threshold),
    }


def markdown(files: list[str], cases: dict, changed: list[dict]) -> str:
    lines = [
        "# The split-K rule replayed on measured times",
        "",
        f"Runs: {', '.join(f'`{f}`' for f in files)}. `rule`: the launch rule the patch ships, "
        f"each launch timed as the tree whose decision it matches ({GRID_BELOW_SMS}: split "
        f"grids below the SM count; {GRID_BELOW_TWICE}: below twice). In-sample: its "
        "thresholds were chosen on these runs.",
        "",
        "| rule against | cases | geomean speed-up | worst case | cases below 0.98 |",
        "|---|---|---|---|---|",
    ]
    for peer in PEERS:
        s = summary(cases, peer)
        lines.append(
            f"| `{peer}` | {s['cases']} | {s['geomean']:.3f}× | {s['worst']:.3f}× | {len(s['below'])} |"
        )
    lines += [
        "",
        "Launches where the rule splits and the grid-below-SMs rule does not:",
        "",
        "| shape | GEMM | quant | M | routing | programs | K steps | unsplit µs | split µs | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in changed:
        shape, gemm, quant, m, route = c["case"]
        lines.append(
            f"| {shape} | {gemm} | {quant} | {m} | {route} | {c['programs']} | {c['k_steps']} | "
            f"{c['unsplit_us']:.1f} | {c['split_us']:.1f} | "
            f"{c['unsplit_us'] / c['split_us']:.3f}× |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = [row for run in args.runs for row in read_report(run)["rows"]]
    cases, changed = replay(rows)
    args.out.write_text(markdown([str(r) for r in args.runs], cases, changed))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
