"""A tree's block-FP8 default config replayed on measured times.

The launch-rules runs (``kernels/results/launch-rules/``) timed, for six models without a
table, block-scaled FP8 GEMMs at M = 1 ... 56 with several default configs: the releases'
own (0.21.0: 128-wide; 0.33.0: 64-wide up to eight tokens, four stages up to four) and the
series' of the day (64-wide wherever the launch swaps; 64-wide only where the narrow grid is
resident).  Any rule that picks among those launches can be scored without another GPU
run: this asks a tree which config it picks (:func:`moe_kernels.dispatch.config_for`, the
tree's own ``get_default_config`` and ``default_config_decode_tile``), works out the
launch that config makes for each GEMM (grid, K split, pipeline depth: the launcher rules
of the series, :mod:`moe_kernels.launch`), and takes the measured time of a launch of the
run that was the same.  A release's launch keeps its config's depth and never splits.
Where no variant of the run made that launch, the case is "not measured".

The score is in-sample for a rule chosen after seeing these runs.  Per case (shape, GEMM,
M) the geometric mean over routings is compared with the releases and with the series
variant the run measured, as the bench report does.

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.decode_tile_replay --tree PATH RUN.json [...] --out replay.md
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from statistics import geometric_mean

import torch
from moe_kernels.dispatch import config_for
from moe_kernels.launch import patched_pipeline_depth, patched_resident_depth, patched_split_k
from moe_kernels.loader import CPU_SM_COUNT, load_fused_moe_kernel
from moe_kernels.measure import SHAPES, gemm_dims
from moe_kernels.resultfile import read_report
from moe_kernels.tune import launched_rows

from studies import emit

BLOCK_SHAPE = [128, 128]
RELEASES = ("0.21.0", "0.33.0")
SERIES = "0.21.0+moe"  # the series variant each run measured
# A patched variant without the series' launch depth rules, whose launches this study
# cannot reproduce: d1f75ea, before resident_depth_for.
WITHOUT_DEPTH_RULES = ("0.21.0+s20",)
FLOOR = 0.98


def launch(config: dict, shape, gemm: str, M: int, split_k: int | None = None, tree=None) -> tuple:
    """What a config launches for one GEMM: tile, warps, K split and pipeline depth.
    ``split_k`` given: a release's launch (that split, the config's own depth); None: the
    series' launcher rules decide both, and ``tree`` (a :class:`LoadedKernel`) whether a
    launch takes the narrow tile its config offers."""
    config = dict(config)
    n, k = gemm_dims(shape, gemm)
    narrow_stages = config.pop("NARROW_TILE_STAGES", None)
    if narrow_stages is not None and tree is not None and tree.narrow_tile_rule is not None:
        rows = launched_rows(shape, gemm, M, config["BLOCK_SIZE_M"])
        weights = torch.empty((shape.experts, n, k), dtype=torch.float8_e4m3fn, device="meta")
        device = torch.device("cpu")  # the lifted rule then sees an H200's SM count
        if tree.narrow_tile_rule(config, narrow_stages, rows, M * shape.topk, weights, device):
            config["BLOCK_SIZE_N"], config["num_stages"] = tree.narrow_block_n, narrow_stages
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    programs = -(-launched_rows(shape, gemm, M, block_m) // block_m) * -(-n // block_n)
    stages = config["num_stages"]
    if split_k is None:
        split_k = patched_split_k(
            True, config.get("SPLIT_K", 1), programs, -(-k // 128), CPU_SM_COUNT
        )
        stages = patched_pipeline_depth(stages, k, 128, split_k)
        stage_bytes = (block_m + block_n) * 128
        stages = patched_resident_depth(stages, programs * split_k, stage_bytes, CPU_SM_COUNT)
    return (block_m, block_n, config["GROUP_SIZE_M"], config["num_warps"], stages, split_k)


def _row_launch(row: dict) -> tuple:
    shape = SHAPES[row["shape"]]
    release = "+" not in row["variant"]
    return launch(row["config"], shape, row["gemm"], row["M"], row["split_k"] if release else None)


def replay(tree: Path, runs: list[dict]) -> list[dict]:
    """One entry per case (run, shape, GEMM, M) of block FP8 on a default config: the
    tree's launch, its geometric-mean µs over routings (None: not measured) and the
    releases' and the series variant's."""
    loaded = load_fused_moe_kernel(tree)
    cases = []
    for run in runs:
        seed = run["method"]["seed"]
        by_case: dict[tuple, dict[int, dict[str, dict]]] = collections.defaultdict(dict)
        for row in run["rows"]:
            if row["quant"] != "block" or row["gemm"] == "layer":
                continue
            if row["config_source"] != "default" or row["variant"] in WITHOUT_DEPTH_RULES:
                continue
            key = (row["shape"], row["gemm"], row["M"])
            by_case[key].setdefault(row.get("routing", 0), {})[row["variant"]] = row
        for (shape_name, gemm, M), routings in sorted(by_case.items()):
            if not all(set(RELEASES) | {SERIES} <= set(v) for v in routings.values()):
                continue
            shape = SHAPES[shape_name]
            config, _ = config_for(
                tree, M, shape.experts, shape.intermediate, shape.hidden, shape.topk,
                block_shape=BLOCK_SHAPE, gpu_name="NVIDIA H200",
            )  # fmt: skip
            wanted = launch(config, shape, gemm, M, tree=loaded)
            times = []
            for variants in routings.values():
                same = [r for r in variants.values() if _row_launch(r) == wanted]
                same.sort(key=lambda r: "+" not in r["variant"])  # the series' kernel first
                times.append(same[0]["us"] if same else None)
            measured = None if None in times else geometric_mean(times)
            cases.append(
                {
                    "seed": seed, "shape": shape_name, "gemm": gemm, "M": M,
                    "launch": wanted, "us": measured,
                    "series_launch": _row_launch(next(iter(routings.values()))[SERIES]),
                    **{
                        label: geometric_mean(v[label]["us"] for v in routings.values())
                        for label in (*RELEASES, SERIES)
                    },
                }
            )  # fmt: skip
    return cases


def summary(cases: list[dict], seed: int) -> dict:
    """Per peer: cases measured, geometric-mean speed-up, slowest, cases below FLOOR."""
    of = [c for c in cases if c["seed"] == seed]
    measured = [c for c in of if c["us"] is not None]
    out = {"cases": len(of), "measured": len(measured)}
    for peer in (*RELEASES, SERIES):
        ratios = [(c[peer] / c["us"], c) for c in measured]
        out[peer] = {
            "geomean": geometric_mean(r for r, _ in ratios),
            "slowest": min(r for r, _ in ratios),
            "below": [(c["shape"], c["gemm"], c["M"], round(r, 3)) for r, c in ratios if r < FLOOR],
        }
    return out


def _tile(launch_key: tuple) -> str:
    block_m, block_n, _, _, stages, split_k = launch_key
    return f"{block_m}x{block_n}, {stages} st" + (f", split {split_k}" if split_k > 1 else "")


def markdown(tree_label: str, names: list[str], cases: list[dict]) -> str:
    seeds = sorted({c["seed"] for c in cases})
    lines = [
        f"# Block-FP8 default configs of `{tree_label}`, replayed on measured H200 times",
        "",
        "Written by `kernels/studies/decode_tile_replay.py` from "
        + ", ".join(f"`{n}`" for n in names)
        + f": for each case (six models without a table, block FP8, default config) the "
        f"launch the tree's config makes, timed where a variant of the run made the same "
        f"launch (the series' kernel where it did, else the release's: the same launch ran "
        f"within 1% on both kernels); the speed-up over each release and over the series "
        f"variant `{SERIES}` of that run, geometric mean over routings.  In-sample: the rule "
        f"was chosen after these runs.",
        "",
        "| run seed | cases | measured | peer | geomean | slowest | below 0.98x |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        s = summary(cases, seed)
        for peer in (*RELEASES, SERIES):
            below = "; ".join(f"{sh} {g} M={m} {r}x" for sh, g, m, r in s[peer]["below"]) or "none"
            lines.append(
                f"| {seed} | {s['cases']} | {s['measured']} | {peer} "
                f"| {s[peer]['geomean']:.3f}x | {s[peer]['slowest']:.3f}x | {below} |"
            )
    lines += [
        "",
        f"Cases whose launch differs from `{SERIES}`'s in that run (µs):",
        "",
        f"| seed | shape | GEMM | M | `{SERIES}` launch | µs | replayed launch | µs | "
        "0.21.0 µs | 0.33.0 µs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        if c["launch"] == c["series_launch"]:
            continue
        us = "not measured" if c["us"] is None else f"{c['us']:.1f}"
        lines.append(
            f"| {c['seed']} | {c['shape']} | {c['gemm']} | {c['M']} | {_tile(c['series_launch'])} "
            f"| {c[SERIES]:.1f} | {_tile(c['launch'])} | {us} | {c['0.21.0']:.1f} "
            f"| {c['0.33.0']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, metavar="[LABEL=]PATH")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    label, _, path = args.tree.rpartition("=")
    runs = [read_report(p) for p in args.runs]
    text = markdown(label or path, [p.name for p in args.runs], replay(Path(path), runs))
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
