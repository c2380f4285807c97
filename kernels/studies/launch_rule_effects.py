"""What each launch rule of the series did, on a bench run that timed it with and without.

A bench run (:mod:`moe_kernels.bench`) that timed the series (``--tree 0.21.0+moe=...``)
beside an older state of it (``--tree 0.21.0+s20=...``: a tree patched by an earlier commit
of the series) holds both trees' time of every launch, on the same routing.  Where the two
launches differ, one rule made the difference:

- the split: the same config, launched with another SPLIT_K (``split_k_for``);
- the launch depth: the same config and split, but the newer tree's ``resident_depth_for``
  (mirrored by :func:`moe_kernels.launch.patched_resident_depth`) drops pipeline stages;
- the default config: another weight tile or depth where no table exists
  (``default_config_decode_tile``, or ``default_config_block_n`` before it).

Per group: the launches, the geometric mean and the range of old time / new time (> 1: the
newer series faster), each launch listed.  Then every patched tree of the run against every
release in it (labels without "+"): geometric mean per case, the slowest case and the cases
below 0.98.  Per case (shape, GEMM, quantisation, M) the geometric mean over routings is
compared, as the bench report does.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.launch_rule_effects RUN.json --new 0.21.0+moe \\
        --old 0.21.0+s20 [--old-has-depth-rule] --out effects.md
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

from moe_kernels.launch import patched_pipeline_depth, patched_resident_depth
from moe_kernels.measure import SHAPES, gemm_dims
from moe_kernels.resultfile import read_report
from moe_kernels.tune import launch_programs

SM_COUNT = 132  # an H200's, the GPU the runs were made on
BELOW = 0.98
GROUPS = ("split", "launch depth", "default config")


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def per_case(rows: list[dict]) -> dict[tuple, dict[str, list[dict]]]:
    cases: dict[tuple, dict[str, list[dict]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for row in rows:
        cases[(row["shape"], row["gemm"], row["quant"], row["M"])][row["variant"]].append(row)
    return cases


def _case_us(rows: list[dict]) -> float:
    return _geomean(row["us"] for row in rows)


def launch_depths(case: tuple, row: dict) -> tuple[int, int] | None:
    """A swapped launch's depth before and after the series' resident_depth_for (None:
    not a swapped GEMM launch)."""
    if row["gemm"] == "layer" or not row.get("swap_ab"):
        return None
    config, split_k = row["config"], row["split_k"]
    shape, gemm = SHAPES[case[0]], case[1]
    k = gemm_dims(shape, gemm)[1]
    block_k = config["BLOCK_SIZE_K"]
    if case[2] == "block":  # the launcher clamps the K tile to the scale block
        block_k = min(block_k, 128)
    stages = patched_pipeline_depth(config["num_stages"], k, block_k, split_k)
    programs = launch_programs(shape, gemm, case[3], config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"])
    stage_bytes = (config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]) * block_k
    return stages, patched_resident_depth(stages, programs * split_k, stage_bytes, SM_COUNT)


def rule_effects(
    rows: list[dict], new: str, old: str, old_has_depth_rule: bool = False
) -> dict[str, list[dict]]:
    """The launches where ``new`` and ``old`` differ, grouped by the rule that differs
    (the launch depth only where ``old`` predates resident_depth_for)."""
    groups: dict[str, list[dict]] = {name: [] for name in GROUPS}
    for case, by_tree in sorted(per_case(rows).items()):
        if new not in by_tree or old not in by_tree:
            continue
        new_row, old_row = by_tree[new][0], by_tree[old][0]
        depths = launch_depths(case, new_row)
        if new_row.get("config") != old_row.get("config"):
            group = "default config"
        elif new_row.get("split_k") != old_row.get("split_k"):
            group = "split"
        elif not old_has_depth_rule and depths and depths[0] != depths[1]:
            group = "launch depth"
        else:
            continue
        groups[group].append(
            {
                "case": case,
                "ratio": _case_us(by_tree[old]) / _case_us(by_tree[new]),
                "new": {k: new_row.get(k) for k in ("config", "split_k")},
                "old": {k: old_row.get(k) for k in ("config", "split_k")},
                "depths": depths if group == "launch depth" else None,
            }
        )
    return groups


def against_releases(rows: list[dict]) -> list[dict]:
    """Every patched tree of the run against every release in it."""
    cases = per_case(rows)
    variants = sorted({row["variant"] for row in rows})
    releases = [v for v in variants if "+" not in v]
    out = []
    for patched in (v for v in variants if "+" in v):
        for release in releases:
            ratios = {
                case: _case_us(by[release]) / _case_us(by[patched])
                for case, by in cases.items()
                if patched in by and release in by
            }
            slowest = min(ratios, key=ratios.get)
            out.append(
                {
                    "patched": patched,
                    "release": release,
                    "cases": len(ratios),
                    "geomean": _geomean(ratios.values()),
                    "slowest": (slowest, ratios[slowest]),
                    "below": sorted((r, c) for c, r in ratios.items() if r < BELOW),
                }
            )
    return out


def _config_difference(entry: dict) -> str:
    new, old = entry["new"]["config"] or {}, entry["old"]["config"] or {}
    keys = sorted(k for k in set(new) | set(old) if new.get(k) != old.get(k))
    if entry["depths"]:
        return "num_stages at launch {} -> {}".format(*entry["depths"])
    if not keys:
        return f"SPLIT_K at launch {entry['old']['split_k']} -> {entry['new']['split_k']}"
    return ", ".join(f"{k} {old.get(k)} -> {new.get(k)}" for k in keys)


def markdown(
    files: list[str], new: str, old: str, runs: list[dict], old_has_depth_rule: bool = False
) -> str:
    lines = [f"# Launch rules of `{new}` against `{old}`", ""]
    for name, run in zip(files, runs, strict=True):
        lines += [f"## `{Path(name).name}`", "", f"command: `{run['command']}`", ""]
        groups = rule_effects(run["rows"], new, old, old_has_depth_rule)
        lines += [
            f"Launches where the two differ, by the rule that differs: time of `{old}` over "
            f"time of `{new}` (> 1: `{new}` faster), geometric mean over routings per case.",
            "",
            "| rule | cases | geomean | slowest, fastest |",
            "|---|---|---|---|",
        ]
        for group, entries in groups.items():
            if entries:
                ratios = [e["ratio"] for e in entries]
                lines.append(
                    f"| {group} | {len(entries)} | {_geomean(ratios):.3f} | "
                    f"{min(ratios):.3f}, {max(ratios):.3f} |"
                )
            else:
                lines.append(f"| {group} | 0 | | |")
        for group, entries in groups.items():
            if entries:
                lines += ["", f"{group}:", ""]
                lines += [
                    f"- {e['ratio']:.3f} {' '.join(map(str, e['case']))}: {_config_difference(e)}"
                    for e in sorted(entries, key=lambda e: e["ratio"])
                ]
        lines += [
            "",
            "Against the releases of the run (release time / patched time per case):",
            "",
            f"| patched | release | cases | geomean | slowest | below {BELOW} |",
            "|---|---|---|---|---|---|",
        ]
        for c in against_releases(run["rows"]):
            (case, ratio) = c["slowest"]
            lines.append(
                f"| `{c['patched']}` | `{c['release']}` | {c['cases']} | {c['geomean']:.3f} | "
                f"{ratio:.3f} ({' '.join(map(str, case))}) | {len(c['below'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="bench JSON files")
    parser.add_argument("--new", required=True, help="the current series' tree label")
    parser.add_argument("--old", required=True, help="the older series' tree label")
    parser.add_argument(
        "--old-has-depth-rule",
        action="store_true",
        help="the older tree already has resident_depth_for (no launch-depth group)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    runs = [read_report(Path(f)) for f in args.runs]
    for name, run in zip(args.runs, runs, strict=True):
        labels = {row["variant"] for row in run["rows"]}
        missing = [label for label in (args.new, args.old) if label not in labels]
        if missing:
            parser.error(
                f"{name} has no tree {', '.join(missing)} (it has {', '.join(sorted(labels))})"
            )
    args.out.write_text(markdown(args.runs, args.new, args.old, runs, args.old_has_depth_rule))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
