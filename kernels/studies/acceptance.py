"""Issue 18's done-when, judged from one bench run: every criterion PASS or FAIL, with the cases
behind it.

The run it reads (``moe_kernels.bench``) times the releases as released and with the series,
on the tuned and the untuned shapes, both GEMMs and the layer, per-tensor and block, on
vLLM's whole M grid and at least two routings per case; a case's time is the geometric mean
over its routings.  Each ``--pair PATCHED:BASE`` is one comparison (default: every pair of
``0.21.0+moe:0.21.0``, ``0.21.0+moe:0.33.0`` and ``0.33.0+moe:0.33.0`` the run has):

1. coverage: at least eight shapes (four of them untuned), vLLM's grid, two routings, up, down
   and layer, tensor and block;
2. no case below ``FLOOR_RATIO`` of its base, for every pair;
3. on the untuned shapes, the GEMMs' geometric-mean speed-up at M <= 64 over the release the
   series patches (pairs whose base is the patched tree's own release) at least
   ``UNTUNED_GAIN``;
4. at M = 1 the first GEMM at least ``SPLIT_GAIN`` times as fast as that release's wherever
   the release's launch starts fewer programs than the GPU has SMs (a case whose release
   already reads at more than 1 / ``SPLIT_GAIN`` of the floor cannot pass: it is marked);
5. every patched tree's median fraction of the read floor at M <= 64, per GEMM and
   quantisation, at least ``FLOOR_FRACTION``.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.acceptance BENCH.json [--pair A:B ...] [--out X.md]

Exit code 0 when every criterion passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import defaultdict
from pathlib import Path
from statistics import geometric_mean, median

from moe_kernels.bench import VLLM_GRID
from moe_kernels.loader import CPU_SM_COUNT
from moe_kernels.measure import SHAPE_GROUPS, SHAPES, gemm_dims
from moe_kernels.resultfile import read_report
from moe_kernels.tune import launch_programs

from studies import emit

FLOOR_RATIO = 0.98
UNTUNED_GAIN = 1.05
SPLIT_GAIN = 1.5
FLOOR_FRACTION = 0.90
MIN_SHAPES, MIN_UNTUNED, MIN_ROUTINGS = 8, 4, 2
DEFAULT_PAIRS = (("0.21.0+moe", "0.21.0"), ("0.21.0+moe", "0.33.0"), ("0.33.0+moe", "0.33.0"))


def cases(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(shape, gemm, quant, M) -> variant -> {"us", "fraction", "routings", "row"}: the
    geometric mean over the case's routings."""
    timed: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        timed[(row["shape"], row["gemm"], row["quant"], row["M"])][row["variant"]].append(row)
    return {
        key: {
            variant: {
                "us": geometric_mean([r["us"] for r in runs]),
                "fraction": geometric_mean([r["floor_us"] for r in runs])
                / geometric_mean([r["us"] for r in runs]),
                "routings": len(runs),
                "row": runs[0],
            }
            for variant, runs in variants.items()
        }
        for key, variants in timed.items()
    }


def release_of(variant: str) -> str:
    """The release a tree label is built on: ``0.21.0+moe`` -> ``0.21.0``."""
    return variant.split("+", 1)[0]


def _line(key: tuple, ratio: float) -> str:
    shape, gemm, quant, M = key
    return f"{shape} {gemm} {quant} M={M}: {ratio:.3f}×"


def unfinished(table: dict, shapes: set[str], variants: set[str]) -> list[tuple]:
    """The cases of the measured shapes (every GEMM, quantisation and M the run measured for
    any shape) that some variant of the run has no time for: a file that several device
    sessions fill holds whole shapes only when the run is done.  What the run measured for no
    shape at all (an M of vLLM's grid, the layer) coverage names apart."""
    gemms, quants, ms = ({key[i] for key in table} for i in (1, 2, 3))
    return [
        key
        for key in itertools.product(sorted(shapes), sorted(gemms), sorted(quants), sorted(ms))
        if not variants <= set(table.get(key, {}))
    ]


def _lowest_shapes(table: dict, new: str, gemm: str, quant: str, count: int = 3) -> str:
    """Where a GEMM's fraction of the floor is lost: the ``count`` shapes with the lowest
    median at M <= 64, with the GEMM's K (a short K loop is one suspect), those below
    ``FLOOR_FRACTION`` only."""
    per_shape = defaultdict(list)
    for key, by in table.items():
        if key[1:3] == (gemm, quant) and key[3] <= 64 and new in by:
            per_shape[key[0]].append(by[new]["fraction"])
    low = sorted((median(v), s) for s, v in per_shape.items() if median(v) < FLOOR_FRACTION)
    return "".join(
        f"\n    - {s} (K = {gemm_dims(SHAPES[s], gemm)[1]}): {f:.3f}" for f, s in low[:count]
    )


def judge(bench: dict, pairs: list[tuple[str, str]]) -> list[tuple[str, bool, list[str]]]:
    """(criterion, passed, details) for each criterion."""
    wrong = [r for r in bench["rows"] if not r["correct"]]
    table = cases(bench["rows"])
    # A run through the interpreter (a CPU rehearsal of the device command) names no GPU:
    # its launches were an H200's, as the harness's launcher assumes there.
    sm_count = bench["environment"].get("sm_count", CPU_SM_COUNT)
    verdicts = []

    shapes = {k[0] for k in table}
    untuned = shapes & set(SHAPE_GROUPS["untuned"])
    missing_m = sorted(set(VLLM_GRID) - {k[3] for k in table})
    routings = min((v["routings"] for by in table.values() for v in by.values()), default=0)
    absent = sorted({"up", "down", "layer", "tensor", "block"} - {x for k in table for x in k[1:3]})
    details = [
        f"{len(shapes)} shapes ({len(untuned)} untuned), {len({k[3] for k in table})} token "
        f"counts, at least {routings} routings per case, {len(bench['rows'])} measurements, "
        f"{len(wrong)} incorrect"
    ]
    if missing_m:
        details.append(f"M of vLLM's grid not measured: {missing_m}")
    if absent:
        details.append(f"not measured: {', '.join(absent)}")
    holes = unfinished(table, shapes, set(bench["variants"]))
    if holes:
        details.append(
            f"{len(holes)} cases of the measured shapes lack a variant or were not reached "
            "(a run cut short: continue it with --resume), e.g. "
            + ", ".join(f"{s} {g} {q} M={m}" for s, g, q, m in holes[:3])
        )
    covered = (
        len(shapes) >= MIN_SHAPES
        and len(untuned) >= MIN_UNTUNED
        and routings >= MIN_ROUTINGS
        and not missing_m
        and not absent
        and not holes
        and not wrong
    )
    verdicts.append(("coverage (and every measurement correct)", covered, details))

    below, details = [], []
    for new, base in pairs:
        ratios = {
            key: by[base]["us"] / by[new]["us"]
            for key, by in table.items()
            if {new, base} <= set(by)
        }
        worst = sorted((r, k) for k, r in ratios.items() if r < FLOOR_RATIO)
        below += worst
        details.append(
            f"`{new}` against `{base}`: {len(ratios)} cases, geomean "
            f"{geometric_mean(ratios.values()):.3f}×, {len(worst)} below {FLOOR_RATIO}"
            + "".join(f"\n    - {_line(k, r)}" for r, k in worst[:10])
            + (f"\n    - … {len(worst) - 10} more" if len(worst) > 10 else "")
        )
    verdicts.append((f"no case below {FLOOR_RATIO}× of its base", not below, details))

    own = [(new, base) for new, base in pairs if release_of(new) == base]
    gains, details = [], []
    for new, base in own:
        ratios = [
            by[base]["us"] / by[new]["us"]
            for key, by in table.items()
            if key[0] in untuned and key[1] != "layer" and key[3] <= 64 and {new, base} <= set(by)
        ]
        if ratios:
            gains.append(geometric_mean(ratios))
            details.append(f"`{new}` over `{base}`: {gains[-1]:.3f}× ({len(ratios)} GEMM cases)")
    passed = bool(gains) and min(gains) >= UNTUNED_GAIN
    verdicts.append((f"untuned shapes ≥ {UNTUNED_GAIN}× at M ≤ 64", passed, details))

    split, details = [], []
    for new, base in own:
        for key, by in sorted(table.items()):
            shape, gemm, _, M = key
            if gemm != "up" or M != 1 or not {new, base} <= set(by):
                continue
            config = by[base]["row"]["config"]
            programs = launch_programs(
                SHAPES[shape], gemm, M, config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
            )
            if programs < sm_count:
                ratio = by[base]["us"] / by[new]["us"]
                split.append(ratio)
                # No kernel beats the read floor: the base at fraction f of it allows 1/f.
                bound = 1 / by[base]["fraction"]
                details.append(
                    f"`{new}` over `{base}`, {_line(key, ratio)} ({programs} programs)"
                    + ("" if ratio >= SPLIT_GAIN else " — short")
                    + (
                        f"; the read floor allows at most {bound:.2f}×"
                        if bound < SPLIT_GAIN
                        else ""
                    )
                )
    passed = bool(split) and min(split) >= SPLIT_GAIN
    verdicts.append(
        (
            f"first GEMM at M = 1 ≥ {SPLIT_GAIN}× where the grid is smaller than the GPU",
            passed,
            details,
        )
    )

    fractions, details = [], []
    for new in sorted({new for new, _ in pairs}):
        for gemm in ("up", "down"):
            for quant in ("tensor", "block"):
                values = [
                    by[new]["fraction"]
                    for key, by in table.items()
                    if key[1:3] == (gemm, quant) and key[3] <= 64 and new in by
                ]
                if values:
                    fractions.append(median(values))
                    details.append(
                        f"`{new}` {gemm} {quant}: {fractions[-1]:.3f} of the floor"
                        + _lowest_shapes(table, new, gemm, quant)
                    )
    passed = bool(fractions) and min(fractions) >= FLOOR_FRACTION
    verdicts.append(
        (f"median fraction of the read floor at M ≤ 64 ≥ {FLOOR_FRACTION}", passed, details)
    )
    return verdicts


def markdown(bench: dict, verdicts: list) -> str:
    lines = [
        "# Issue 18's criteria on one bench run",
        "",
        f"- run: `{bench['command']}`",
        f"- GPU: {bench['environment'].get('gpu')}; series {bench.get('series_version')}",
        "",
    ]
    for criterion, passed, details in verdicts:
        lines.append(f"## {'PASS' if passed else 'FAIL'}: {criterion}")
        lines.append("")
        lines += [f"- {d}" for d in details]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bench", type=Path)
    parser.add_argument("--pair", action="append", default=[], metavar="PATCHED:BASE")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    bench = read_report(args.bench)
    variants = set(bench["variants"])
    if args.pair:
        pairs = [tuple(p.split(":", 1)) for p in args.pair]
        unknown = sorted({v for pair in pairs for v in pair} - variants)
        if unknown or any(len(p) != 2 for p in pairs):
            parser.error(f"--pair takes PATCHED:BASE of the run's variants {sorted(variants)}")
    else:
        pairs = [p for p in DEFAULT_PAIRS if set(p) <= variants]
    if not pairs:
        parser.error(f"no pair to judge among the run's variants {sorted(variants)}")
    verdicts = judge(bench, pairs)
    emit(markdown(bench, verdicts), args.out)
    return 0 if all(passed for _, passed, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
