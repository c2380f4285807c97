"""Markdown tables and PNG plots from the JSON that bench / jit_sweep write.

    python -m moe_kernels.report kernels/results/split-k/h200-split-k-0.33-bench.json.gz
    python -m moe_kernels.report kernels/results/provenance/h200-jit-sweep.json

writes ``<name>.md`` (and ``<name>.png`` when matplotlib is installed) beside
the JSON.  The tables are computed from the raw rows, nothing is typed in.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from .resultfile import markdown_path, read_report

SKIP_SHAPES = {"tiny-smoke-test"}


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _header(report: dict) -> list[str]:
    env = report["environment"]
    lines = [
        f"- command: `{report['command']}`",
        f"- GPU: {env.get('gpu')} ({env.get('sm_count')} SMs), torch {env.get('torch')}, "
        f"triton {env.get('triton')}, CUDA {env.get('cuda')}",
    ]
    if "variants" in report:
        lines.append("- variants: " + ", ".join(f"`{k}`" for k in report["variants"]))
    if "bandwidth" in report:
        bw = report["bandwidth"]
        lines.append(
            f"- measured in the same run: streaming read {bw['read_gbps']:.0f} GB/s "
            f"(the floor's bandwidth), device-to-device copy {bw['copy_gbps']:.0f} GB/s (read + write)"
        )
    if "method" in report:
        m = report["method"]
        lines.append(
            "- method: one CUDA graph of "
            + (
                f"as many launches as last about {m['graph_us']:.0f} µs (whole rotations, at "
                f"most {m['launches_per_graph']})"
                if m.get("graph_us")
                else f"{m['launches_per_graph']} launches"
            )
            + " rotating over "
            f"{m['copies']} weight copies, {m['replays']} replays"
            + (f" after {m['warmup_replays']} untimed ones" if m.get("warmup_replays") else "")
            + ", median µs per launch; output "
            "poisoned with NaN and checked against a float64 reference first"
        )
        if m.get("routings", 1) > 1:
            lines.append(
                f"- each case measured on {m['routings']} routings, each with its own seed; "
                "the tables give their geometric mean"
            )
        if "layer_calls_per_graph" in m:
            lines.append(
                "- `layer` rows: the whole MoE layer (both GEMMs, the harness's torch glue for "
                "activation quantisation, SiLU-and-mul and the top-k sum, the same for every "
                "variant), "
                + (
                    f"as many layers per graph as last about {m['graph_us']:.0f} µs (whole "
                    f"rotations, at most {m['layer_calls_per_graph']})"
                    if m.get("graph_us")
                    else f"{m['layer_calls_per_graph']} layers per graph"
                )
                + "; floor = both GEMMs' floors"
            )
    return lines


def _split_note(row: dict) -> str:
    """The " splitN" note: K slices the kernel ran (GEMM rows) or was asked for (layer rows)."""
    split = row.get("split_k") or row["config"].get("SPLIT_K", 1)
    return f" split{split}" if split > 1 else ""


def fixed_cost_section(cases: dict) -> list[str]:
    """Time above the floor of the fastest variant at M <= 2, per case: a cost every
    launch pays whatever its bytes, which caps the fraction of the floor reachable."""
    rows = []
    for key, by in cases.items():
        if key[3] <= 2 and key[1] != "layer":
            best = min(by.values(), key=lambda r: r["us"])
            rows.append((best["us"] - best["floor_us"], best["floor_us"], key))
    if not rows:
        return []
    excess = sorted(e for e, _, _ in rows)
    lowest = excess[0]
    out = [
        "",
        "## Time above the floor at M ≤ 2 (fastest variant per case)",
        "",
        f"Over {len(rows)} cases the fastest kernel spends {lowest:.1f}–{excess[-1]:.1f} µs "
        f"(median {statistics.median(excess):.1f}) above the floor, whether the floor is "
        f"{min(f for _, f, _ in rows):.1f} µs or {max(f for _, f, _ in rows):.1f} µs: the excess "
        "does not grow with the bytes, so it acts as a cost per launch. With the smallest of them, a GEMM with floor F reaches at most "
        f"F / (F + {lowest:.1f}) of it: 0.80 needs F ≥ {4 * lowest:.0f} µs, 0.95 needs "
        f"F ≥ {19 * lowest:.0f} µs.",
        "",
        "| shape | GEMM | quant | M | floor µs | fastest µs | above floor µs | bound F / (F + min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e, floor, key in sorted(rows, key=lambda r: r[1]):
        out.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {floor:.1f} | {floor + e:.1f} | "
            f"{e:.1f} | {floor / (floor + lowest):.2f} |"
        )
    return out


def combine_routings(rows: list[dict]) -> list[dict]:
    """One row per case and variant: a case measured on several routings (``--routings``)
    becomes their geometric mean (time and floor), correct only if every routing was."""
    by_case: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_case[(r["shape"], r["gemm"], r["quant"], r["M"], r["variant"])].append(r)
    combined = []
    for measured in by_case.values():
        if len(measured) == 1:
            combined.append(measured[0])
            continue
        us = geomean([r["us"] for r in measured])
        floor_us = geomean([r["floor_us"] for r in measured])
        combined.append(
            {
                **measured[0],
                "us": us,
                "floor_us": floor_us,
                "fraction_of_floor": floor_us / us,
                "correct": all(r["correct"] for r in measured),
                "routings": len(measured),
            }
        )
    return combined


def bench_markdown(report: dict) -> str:
    rows = combine_routings([r for r in report["rows"] if r["shape"] not in SKIP_SHAPES])
    variants = list(report["variants"])
    base = variants[0]
    cases = defaultdict(dict)
    for r in rows:
        cases[(r["shape"], r["gemm"], r["quant"], r["M"])][r["variant"]] = r
    out = [f"# fused_moe_kernel on {report['environment'].get('gpu')}", "", *_header(report), ""]
    out += [
        f"## Summary over M = 1…64 (fraction of the read-bandwidth floor; speed-up over `{base}`)",
        "",
    ]
    out.append(
        "| GEMM | quant | variant | median fraction | worst fraction | geomean speed-up | worst ratio vs best other |"
    )
    out.append("|---|---|---|---|---|---|---|")
    for gemm in ("up", "down", "layer"):
        for quant in sorted({k[2] for k in cases}):
            keys = [k for k in cases if k[1] == gemm and k[2] == quant]
            small = [k for k in keys if k[3] <= 64]
            if not small:
                continue
            for v in variants:
                fractions = [cases[k][v]["fraction_of_floor"] for k in small]
                speedups = [cases[k][base]["us"] / cases[k][v]["us"] for k in small]
                others = [
                    cases[k][v]["us"] / min(cases[k][o]["us"] for o in variants if o != v)
                    for k in keys
                ]
                out.append(
                    f"| {gemm} | {quant} | `{v}` | {statistics.median(fractions):.3f} | "
                    f"{min(fractions):.3f} | {geomean(speedups):.3f}× | {max(others):.3f} |"
                )
    out += fixed_cost_section(cases)
    out += ["", "## Every measurement (µs per call; fraction of floor in brackets)", ""]
    out.append(
        "| shape | GEMM | quant | M | "
        + " | ".join(f"`{v}`" for v in variants)
        + " | floor µs | configs |"
    )
    out.append("|---|---|---|---|" + "---|" * len(variants) + "---|---|")
    for key in sorted(cases, key=lambda k: (k[0], k[1], k[2], k[3])):
        by = cases[key]
        cells = [
            f"{by[v]['us']:.1f} ({by[v]['fraction_of_floor']:.2f})"
            + ("" if by[v]["correct"] else " WRONG")
            for v in variants
        ]
        configs = "; ".join(
            f"{v}: {by[v]['config'].get('BLOCK_SIZE_M')}x{by[v]['config'].get('BLOCK_SIZE_N')}x"
            f"{by[v]['config'].get('BLOCK_SIZE_K')}{' swap' if by[v].get('swap_ab') else ''}"
            f"{_split_note(by[v])}"
            for v in variants
        )
        out.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | "
            + " | ".join(cells)
            + f" | {by[variants[0]]['floor_us']:.1f} | {configs} |"
        )
    return "\n".join(out) + "\n"


def bench_plot(report: dict, path: Path) -> bool:
    """Plot speed-up and fraction of the floor per GEMM and quantisation; False when the
    report holds nothing to plot (only the smoke shape, which the plots leave out)."""
    rows = combine_routings([r for r in report["rows"] if r["shape"] not in SKIP_SHAPES])
    variants = list(report["variants"])
    panels = sorted({(r["gemm"], r["quant"]) for r in rows})
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 8), squeeze=False)
    for col, (gemm, quant) in enumerate(panels):
        for shape in shapes:
            for v in variants:
                pts = sorted(
                    (r["M"], r)
                    for r in rows
                    if (r["gemm"], r["quant"], r["shape"], r["variant"]) == (gemm, quant, shape, v)
                )
                if not pts:
                    continue
                base = {
                    r["M"]: r
                    for r in rows
                    if (r["gemm"], r["quant"], r["shape"], r["variant"])
                    == (gemm, quant, shape, variants[0])
                }
                ms = [m for m, _ in pts]
                axes[0][col].plot(
                    ms, [base[m]["us"] / r["us"] for m, r in pts], marker="o", label=f"{shape} {v}"
                )
                axes[1][col].plot(
                    ms, [r["fraction_of_floor"] for _, r in pts], marker="o", label=f"{shape} {v}"
                )
        axes[0][col].set_title(f"{gemm} GEMM, FP8 {quant}: speed-up over {variants[0]}")
        axes[1][col].set_title(f"{gemm} GEMM, FP8 {quant}: fraction of HBM floor")
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xlabel("tokens M")
            axes[row][col].grid(alpha=0.3)
    axes[1][0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def jit_markdown(report: dict) -> str:
    out = [
        f"# Triton compile stalls of fused_moe_kernel ({report['shape']}, FP8 {report['quant']})",
        "",
    ]
    out += _header(report)
    sweep = report["sweep_token_counts"]
    out += [
        f"- sweep: {len(sweep)} token counts (every M up to 300, then a spread to {max(sweep)});",
        f"- trace: {report['trace']['steps']} steps, {report['trace']['prefill_share']:.0%} prefill "
        f"chunks (lognormal prompt lengths, capped at 2048), the rest decode batches of 1–64 "
        f"(seed {report['trace']['seed']});",
        "- each run in a fresh process with an empty Triton cache; both GEMMs of the layer with "
        "the tree's own config selection; a stall is a call after which Triton held more compiled variants.",
        "",
        "| tree | run | calls | compiled variants | stalls | seconds stalled |",
        "|---|---|---|---|---|---|",
    ]
    for label, runs in report["results"].items():
        for kind in ("sweep", "trace"):
            r = runs[kind]
            out.append(
                f"| `{label}` | {kind} | {r['calls']} | {r['variants']} | {r['stalls']} | {r['stall_seconds']:.2f} |"
            )
    return "\n".join(out) + "\n"


def jit_plot(report: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kind in zip(axes, ("sweep", "trace"), strict=True):
        for label, runs in report["results"].items():
            log = runs[kind]["stall_log"]
            xs, ys, total = [0], [0.0], 0.0
            for i, stall in enumerate(log):
                total += stall["seconds"]
                xs.append(i + 1)
                ys.append(total)
            ax.step(xs, ys, where="post", label=f"{label} ({runs[kind]['variants']} variants)")
        ax.set_title(f"{kind}: cumulative compile stall seconds")
        ax.set_xlabel("stall #")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        path = Path(name)
        report = read_report(path)
        kind = "jit" if "results" in report and "sweep_token_counts" in report else "bench"
        markdown, plot = (jit_markdown, jit_plot) if kind == "jit" else (bench_markdown, bench_plot)
        markdown_file = markdown_path(path)
        markdown_file.write_text(markdown(report))
        try:
            if not plot(report, markdown_file.with_suffix(".png")):
                print(
                    f"{path}: only the smoke-test shape, nothing to plot; wrote the Markdown only"
                )
        except ImportError:
            print(f"{path}: matplotlib is not installed; wrote the Markdown only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
