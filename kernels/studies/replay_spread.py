"""How steady a bench run's replays were, and whether its verdicts survive the spread.

``moe_kernels.bench`` times each variant as the median of its CUDA-graph replays, one variant
after another.  Where the GPU's state shifts during a case (clocks, power), one variant's
replays can straddle two levels while its peer's do not, and the median ratio of the two
moves by several percent with no difference in the kernels.  This report gives, per run, the
share of measurements whose replays spread (interquartile range over median) by more than
``WIDE``, and, per case where the patched variant is more than 2% slower than a reference
by medians, the same ratio by a low quantile of the replays (the level a measurement reaches
when undisturbed) and each side's spread.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.replay_spread BENCH.json [...] --series LABEL \\
        [--reference LABEL ...] [--out replay-spread.md]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from statistics import geometric_mean, median

from moe_kernels.resultfile import read_report

from studies import emit

WIDE = 0.02  # an interquartile range above 2% of the median: a measurement that moved
SLOWER = 0.98  # the bar: a case slower than this against a reference is a loss
LOW_QUANTILE = 0.1


def quantile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def spread(values: list[float]) -> float:
    """Interquartile range over the median."""
    return (quantile(values, 0.75) - quantile(values, 0.25)) / median(values)


def case_ratios(rows: list[dict], series: str, reference: str) -> dict[tuple, dict]:
    """Per case (shape, GEMM, quantisation, M), the reference's time over the series' by the
    median and by the low quantile of the replays, each a geometric mean over routings, and
    the widest spread of either side."""
    by_key: dict[tuple, dict] = defaultdict(dict)
    for row in rows:
        key = (row["shape"], row["gemm"], row["quant"], row["M"], row.get("routing", 0))
        by_key[key][row["variant"]] = row
    ratios: dict[tuple, dict] = defaultdict(lambda: {"median": [], "low": [], "spread": []})
    for key, variants in by_key.items():
        if series not in variants or reference not in variants:
            continue
        ours, theirs = variants[series]["us_all"], variants[reference]["us_all"]
        case = ratios[key[:4]]
        case["median"].append(median(theirs) / median(ours))
        case["low"].append(quantile(theirs, LOW_QUANTILE) / quantile(ours, LOW_QUANTILE))
        case["spread"].append(max(spread(ours), spread(theirs)))
    return {
        key: {
            "median": geometric_mean(v["median"]),
            "low": geometric_mean(v["low"]),
            "spread": max(v["spread"]),
        }
        for key, v in ratios.items()
    }


def report(runs: dict[str, dict], series: str, references: list[str]) -> str:
    lines = [
        "# Replay spread of bench runs",
        "",
        f"`PYTHONPATH=kernels python -m studies.replay_spread {' '.join(runs)} --series {series}"
        + "".join(f" --reference {r}" for r in references)
        + "`",
        "",
        f"Per run: measurements (one variant, one case, one routing) whose replays spread by "
        f"more than {WIDE:.0%} (interquartile range over median).",
        "",
        "| run | measurements | spread > 2% | share |",
        "|---|---|---|---|",
    ]
    for name, run in runs.items():
        rows = [r for r in run["rows"] if r.get("us_all")]
        wide = sum(spread(r["us_all"]) > WIDE for r in rows)
        lines.append(f"| `{Path(name).name}` | {len(rows)} | {wide} | {wide / len(rows):.3f} |")
    lines += [
        "",
        f"Cases where `{series}` is below {SLOWER}x of a reference by the median of the replays, "
        f"and the same ratio by their {LOW_QUANTILE:.0%} quantile (geometric means over "
        "routings; spread: the wider side's, widest routing):",
        "",
        "| run | reference | shape | GEMM | quant | M | by median | by low quantile | spread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios_of = {
        (name, reference): case_ratios(run["rows"], series, reference)
        for name, run in runs.items()
        for reference in references
    }
    for (name, reference), ratios in ratios_of.items():
        for (shape, gemm, quant, m), r in sorted(ratios.items()):
            if r["median"] < SLOWER:
                lines.append(
                    f"| `{Path(name).name}` | {reference} | {shape} | {gemm} | {quant} | {m} "
                    f"| {r['median']:.3f} | {r['low']:.3f} | {r['spread']:.3f} |"
                )
    lines += ["", "Geometric means over all cases:", ""]
    lines += ["| run | reference | cases | by median | by low quantile |", "|---|---|---|---|---|"]
    for (name, reference), ratios in ratios_of.items():
        if ratios:
            lines.append(
                f"| `{Path(name).name}` | {reference} | {len(ratios)} "
                f"| {geometric_mean(r['median'] for r in ratios.values()):.3f} "
                f"| {geometric_mean(r['low'] for r in ratios.values()):.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="moe_kernels.bench result files")
    parser.add_argument("--series", default="0.21.0+moe", help="the patched variant's label")
    parser.add_argument("--reference", action="append", default=None, help="(repeatable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    runs = {str(path): read_report(path) for path in args.runs}
    emit(report(runs, args.series, args.reference or ["0.21.0", "0.33.0"]), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
