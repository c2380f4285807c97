"""Markdown and a plot for an end-to-end result file (``python -m moe_e2e.report RESULT.json``).

Writes ``RESULT.md`` and, when matplotlib is installed (the ``plot`` extra), ``RESULT.png``:
time per output token against batch size and output tokens/s, one panel per FP8 kind.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

FACT_KEYS = {
    "moe_backend",
    "moe_backend_candidates",
    "moe_backend_reason",
    "attention_backend",
    "jit_during_inference",
    "torch_compile_s",
    "engine_init_s",
    "graph_capture_s",
    "model_load_s",
    "triton_moe_warmup_s",
}


def _fmt(value, digits=1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _median(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _placement(report: dict) -> str:
    slots = report["spec"].get("gpu_slots") or [None]
    if len(slots) < 2:
        return ""
    return (
        f"; variants ran {len(slots)} at a time, one per GPU slot "
        f"({', '.join(slots)}), each kind's wheels side by side and swapping slots"
    )


def _spread(metric, pairs: list[tuple[dict, dict]]) -> str:
    """With several engine pairs: the range of the ratio over them."""
    ratios = [metric(p) / metric(o) for o, p in pairs if metric(o) and metric(p) is not None]
    return f" ({min(ratios):.3f}–{max(ratios):.3f})" if len(ratios) > 1 else ""


def _default_backend(variant: dict) -> bool:
    return not variant.get("requested_backend") and not variant.get("fp8_env")


def _unique(engines) -> list[dict]:
    """Each engine once, in order (a result file's names are unique)."""
    return list({engine["name"]: engine for engine in engines}.values())


def _ratio(new, old) -> str:
    if not new or not old:
        return "–"
    return f"{new / old:.3f}"


ROUTING_WORDS = {
    "model": "the dummy model's own router (it sends almost every token of a batch to the same "
    "experts)",
    "uniform": "each token's experts drawn uniformly at random, independently of each other "
    "(vLLM's routing simulator, `--routing uniform`)",
    "distinct": "each token's experts a uniformly random set of k different experts "
    "(`--routing distinct`: moe_e2e.routing in vLLM's routing simulator)",
}


def _flashinfer_line(facts: dict | None) -> str:
    if not facts:
        return "not installed, so vLLM skips its backends"
    modules = []
    for name, build in facts.get("prebuilt", {}).items():
        if build.get("kernels") == "fp8":
            modules.append(
                f"`{name}` prebuilt with its FP8 x FP8 kernels only ({build['units_built']} of "
                f"{build['units_in_module']} translation units; the other data types' "
                f"{build['stubbed_symbols']} symbols stop the process if called)"
            )
        else:
            modules.append(f"`{name}` prebuilt whole")
    return f"`{facts['wheel']}`" + (f"; {'; '.join(modules)}" if modules else "")


def head_to_head_table(report: dict, batches: list[str]) -> tuple[list[str], bool]:
    """Each head-to-head engine against the default-backend engines of its kind that ran on the
    same machine (or, where none did, all of them, marked); whether any row is marked."""
    contenders = [v for v in report["variants"] if "result" in v and not _default_backend(v)]
    if not contenders:
        return [], False
    marked = False
    lines = [
        "",
        "## Backends head to head (the engine against each default-backend engine of its kind "
        "on the same machine; < 1 is faster for times)",
        "",
    ]
    header = (
        ["engine", "backend", "against", "backend"]
        + [f"TPOT B={b}" for b in batches]
        + ["throughput (>1 faster)", "trace TTFT p50", "p99"]
    )
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in contenders:
        kin = [
            r
            for r in report["variants"]
            if "result" in r and _default_backend(r) and r["kind"] == v["kind"]
        ]
        references = [r for r in kin if r.get("machine") == v.get("machine")]
        mark = ""
        if not references:  # none on its machine: against the others, marked
            references, mark, marked = kin, " ‡", True
        for r in references:
            new, old = v["result"], r["result"]
            cells = [
                v["name"],
                v.get("moe_backend") or "–",
                r["name"] + mark,
                r.get("moe_backend") or "–",
            ]
            cells += [
                _ratio(new["decode"][b]["median_ms"], old["decode"][b]["median_ms"])
                for b in batches
            ]
            cells += [
                _ratio(
                    new["throughput"]["output_tokens_per_s"],
                    old["throughput"]["output_tokens_per_s"],
                ),
                _ratio(new["trace"]["ttft_p50_ms"], old["trace"]["ttft_p50_ms"]),
                _ratio(new["trace"]["ttft_p99_ms"], old["trace"]["ttft_p99_ms"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines, marked


def kind_pairs(report: dict) -> dict[str, tuple[dict, list[tuple[dict, dict]], bool]]:
    """Per FP8 kind with both wheels on their default backends: its engines per wheel, the
    (official, patched) engine pairs that ran on one machine, and whether there were none,
    in which case every pair is given, compared across machines."""
    by_kind: dict[str, dict[str, list[dict]]] = {}
    for v in report["variants"]:
        if "result" in v and _default_backend(v):
            by_kind.setdefault(v["kind"], {}).setdefault(v["wheel"], []).append(v)
    out = {}
    for kind, wheels in by_kind.items():
        if {"official", "patched"} - set(wheels):
            continue
        everything = [(o, p) for o in wheels["official"] for p in wheels["patched"]]
        pairs = [(o, p) for o, p in everything if o.get("machine") == p.get("machine")]
        out[kind] = (wheels, pairs or everything, not pairs)
    return out


def pair_results(pairs: list[tuple[dict, dict]]) -> tuple[list[dict], list[dict]]:
    """The results of the official and of the patched engines of ``pairs``, each once."""
    return (
        [o["result"] for o in _unique(o for o, _ in pairs)],
        [p["result"] for p in _unique(p for _, p in pairs)],
    )


# The public write-ups' claim for these changes on H200: decode throughput at batch <= 16 and
# time to first token under changing batch sizes.
TARGET_DECODE_GAIN, TARGET_DECODE_BATCH, TARGET_TTFT_CUT = 0.10, 16, 0.09


def _moe_gemm(result: dict, batch: str, field: str) -> float | None:
    """The MoE GEMMs' ``us_per_step`` or ``share`` in the engine's profile of a decode batch."""
    window = (result.get("profile") or {}).get(batch) or {}
    return window.get(field, {}).get("moe_gemm")


def _medians(official: list[dict], patched: list[dict], metric) -> tuple:
    return _median(map(metric, official)), _median(map(metric, patched))


def target_table(kinds: dict, batches: list[str]) -> list[str]:
    """Per FP8 kind, the patched wheel against the official one on the claim's two numbers
    (official ÷ patched time per token at each batch up to 16; trace TTFT p50 cut), each
    marked met or short, with what the MoE GEMMs took per decode step in both where profiled,
    which bounds what a faster MoE GEMM could change (``kinds``: :func:`kind_pairs`)."""
    small = [b for b in batches if int(b) <= TARGET_DECODE_BATCH]
    profiled = sorted(
        {
            b
            for wheels, _, _ in kinds.values()
            for engines in wheels.values()
            for v in engines
            for b in v["result"].get("profile") or {}
        },
        key=int,
    )
    header = (
        ["FP8 kind", "backend official → patched"]
        + [f"decode gain B={b}" for b in small]
        + ["trace TTFT p50 cut"]
        + [f"MoE GEMMs µs/step B={b}, official → patched (share of patched step)" for b in profiled]
    )
    lines = [
        "",
        f"## Against the target: ≥ {TARGET_DECODE_GAIN:.0%} decode throughput at batch ≤ "
        f"{TARGET_DECODE_BATCH}, ≥ {TARGET_TTFT_CUT:.0%} lower TTFT on the trace",
        "",
        "Gain = official ÷ patched time per token − 1 and cut = 1 − patched ÷ official trace "
        "TTFT p50 (medians over the pairs above); ✓ met, ✗ short. The series changes only the "
        "MoE GEMMs' kernel and backend, so their share of the step bounds what it can do.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]

    def met(value: float | None, target: float) -> str:
        return "–" if value is None else f"{value:+.1%} {'✓' if value >= target else '✗'}"

    for kind, (_, pairs, across) in kinds.items():
        official, patched = pair_results(pairs)

        backends = dict.fromkeys(
            f"{o.get('moe_backend')} → {p.get('moe_backend')}" for o, p in pairs
        )
        cells = [kind + (" ‡" if across else ""), " / ".join(backends)]
        for b in small:
            old, new = _medians(official, patched, lambda r, b=b: r["decode"][b]["median_ms"])
            cells.append(met(old / new - 1 if old and new else None, TARGET_DECODE_GAIN))
        old, new = _medians(official, patched, lambda r: r["trace"]["ttft_p50_ms"])
        if across:  # another host moves TTFT by as much as the wheels do: no verdict
            cells.append(f"{1 - new / old:+.1%} ‡" if old and new else "–")
        else:
            cells.append(met(1 - new / old if old and new else None, TARGET_TTFT_CUT))
        for b in profiled:
            old, new = _medians(official, patched, lambda r, b=b: _moe_gemm(r, b, "us_per_step"))
            share = _median(_moe_gemm(r, b, "share") for r in patched)
            cells.append(
                "–" if old is None or new is None else f"{old:.0f} → {new:.0f} ({share:.0%})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# End to end: vLLM {report['vllm']} against {report['patched_wheel']['version']}",
        "",
        f"- command: `{report['command']}`",
        f"- GPU: {env.get('gpu')}; torch {env.get('torch')}, triton {env.get('triton')}, "
        f"Python {env.get('python')}",
        f"- official wheel `{report['official_wheel']['file']}` sha256 "
        f"`{report['official_wheel']['sha256']}` (installed without "
        f"{', '.join(report['official_wheel']['dropped']) or 'nothing'})",
        f"- patched wheel `{report['patched_wheel']['file']}` sha256 "
        f"`{report['patched_wheel']['sha256']}`; series {report['series_version']}"
        + (f" at commit {report['series_commit']}" if report.get("series_commit") else ""),
        f"- model: {report['model']} (dummy weights), max_num_seqs "
        f"{report['spec']['max_num_seqs'] or 'vLLM default'}, max_model_len "
        f"{report['spec']['max_model_len']}, tensor parallel "
        f"{report['spec'].get('tensor_parallel_size', 1)}; each variant a fresh process with "
        "empty caches" + _placement(report),
    ]
    lines.append("- MoE routing: " + ROUTING_WORDS[report["spec"].get("routing", "model")])
    lines.append("- FlashInfer: " + _flashinfer_line(report.get("flashinfer")))
    if report["spec"].get("shared_deepgemm_cache"):
        per = "GPU slot" if len(report["spec"].get("gpu_slots") or [None]) > 1 else "machine"
        lines.append(
            f"- one DeepGEMM kernel cache per {per}, shared by its engines "
            "(`--share-deepgemm-cache`): start-up excludes building DeepGEMM's kernels except "
            "for the engines marked `cold`"
        )
    if len(report.get("sessions", [])) > 1:
        lines.append(
            f"- measured by {len(report['sessions'])} runs of the command (`--resume`) on "
            f"{len({v.get('machine') for v in report['variants']})} machine(s) (each run's "
            "environment is in the JSON); each variant's `started_at` and `machine` say when "
            "and where"
        )
    lines.append("")
    batches = [str(b) for b in report["spec"]["decode_batches"]]
    prompts = [str(n) for n in report["spec"].get("prefill_lens", [])]
    header = (
        ["variant", "MoE backend", "start-up s", "first TTFT ms"]
        + [f"prefill {n} ms" for n in prompts]
        + [f"TPOT B={b} ms" for b in batches]
        + ["output tok/s", "trace TTFT p50 ms", "p99 ms", "kernels compiled in trace"]
    )
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in report["variants"]:
        r = v.get("result")
        if r is None:
            lines.append(
                f"| {v['name']} | {v.get('moe_backend') or '–'} | failed "
                f"({v['returncode']}), see `{v['log']}` |" + " |" * (len(header) - 3)
            )
            continue
        tpot = []
        for b in batches:
            d = r["decode"][b]
            spread = (max(d["tpot_ms"]) - min(d["tpot_ms"])) / 2
            tpot.append(f"{d['median_ms']:.2f} ±{spread:.2f}")
        prefill = [
            _fmt(r["prefill"][n]["median_ms"], 1) if n in r.get("prefill", {}) else "–"
            for n in prompts
        ]
        lines.append(
            "| "
            + " | ".join(
                [
                    v["name"],
                    v.get("moe_backend") or "–",
                    _fmt(r["startup_s"]),
                    _fmt(r["first_ttft_s"] * 1e3, 0),
                    *prefill,
                    *tpot,
                    _fmt(r["throughput"]["output_tokens_per_s"], 0),
                    _fmt(r["trace"]["ttft_p50_ms"], 0),
                    _fmt(r["trace"]["ttft_p99_ms"], 0),
                    str(r["trace"]["triton_kernels_compiled"]),
                ]
            )
            + " |"
        )
    lines += [
        "",
        "## Patched against official, per FP8 kind (< 1 is faster for times; median over "
        "engines, range over engine pairs; only pairs that ran on one machine)",
        "",
    ]
    header = (
        ["FP8 kind", "engines", "start-up"]
        + [f"prefill {n}" for n in prompts]
        + [f"TPOT B={b}" for b in batches]
        + ["throughput (>1 faster)", "trace TTFT p50", "p99", "first TTFT"]
    )
    metrics = [lambda r: r["startup_s"]]
    metrics += [lambda r, n=n: r.get("prefill", {}).get(n, {}).get("median_ms") for n in prompts]
    metrics += [lambda r, b=b: r["decode"][b]["median_ms"] for b in batches]
    metrics += [
        lambda r: r["throughput"]["output_tokens_per_s"],
        lambda r: r["trace"]["ttft_p50_ms"],
        lambda r: r["trace"]["ttft_p99_ms"],
        lambda r: r["first_ttft_s"],
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    across_machines = False
    kinds = kind_pairs(report)
    for kind, (wheels, pairs, across) in kinds.items():
        mark = " ‡" if across else ""
        across_machines |= across
        o, p = pair_results(pairs)
        used = f"{len(o)} + {len(p)}"
        total = f"{len(wheels['official'])} + {len(wheels['patched'])}"
        cells = [kind, used + (f" (of {total})" if used != total else "") + mark]
        result_pairs = [(a["result"], b["result"]) for a, b in pairs]
        cells += [
            _ratio(_median(map(m, p)), _median(map(m, o))) + _spread(m, result_pairs)
            for m in metrics
        ]
        lines.append("| " + " | ".join(cells) + " |")
    table, marked = head_to_head_table(report, batches)
    lines += target_table(kinds, batches) + table
    if across_machines or marked:
        lines += [
            "",
            "‡ no engine to compare with ran on the same machine (a device call's end lost the "
            "machine): compared across machines, whose CPUs move start-up, prefill, throughput "
            "and TTFT by as much as the wheels do; decode (CUDA-graph steps) far less.",
        ]
    profiled = [v for v in report["variants"] if v.get("result", {}).get("profile")]
    if profiled:
        from .profile import KINDS

        lines += ["", "## Where a step's GPU time goes (µs per step, profiled batches)", ""]
        header = ["variant", "batch", "GPU kernels", *KINDS]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for v in profiled:
            for batch, p in v["result"]["profile"].items():
                if "error" in p:
                    lines.append(f"| {v['name']} | {batch} | {p['error']} |" + " |" * len(KINDS))
                    continue
                cells = [f"{p['us_per_step'][k]:.0f} ({p['share'][k]:.0%})" for k in KINDS]
                label = f"{batch} †" if p.get("resorted_from_top") else batch
                row = [v["name"], label, f"{p['kernel_us_per_step']:.0f}", *cells]
                lines.append("| " + " | ".join(row) + " |")
        if any(
            p.get("resorted_from_top") for v in profiled for p in v["result"]["profile"].values()
        ):
            lines += [
                "",
                "† sorted again by today's rules from the top kernels the window kept; smaller "
                "kernels stay where the rules of the run put them.",
            ]
    lines += ["", "## What each engine logged", ""]
    for v in report["variants"]:
        facts = ", ".join(
            f"{k} {v[k]:g}"
            for k in (
                "engine_init_s",
                "torch_compile_s",
                "graph_capture_s",
                "model_load_s",
                "triton_moe_warmup_s",
            )
            if k in v
        )
        asked = v.get("requested_backend") or (f"env={v['fp8_env']}" if v.get("fp8_env") else "")
        if v.get("deepgemm_cache"):
            facts += f", DeepGEMM cache {v['deepgemm_cache']}"
        if v.get("machine"):  # a boot id, or a label given to an engine measured before them
            machine = v["machine"]
            facts += f", machine {machine if len(machine) <= 24 else machine[:8]}"
        reason = f", because {v['moe_backend_reason']}" if v.get("moe_backend_reason") else ""
        jit = ", ".join(v.get("jit_during_inference", [])) or "none"
        lines.append(
            f"- {v['name']}{f' (asked: {asked})' if asked else ''}: `{v.get('moe_backend')}` of "
            f"{v.get('moe_backend_candidates')}{reason}; attention {v.get('attention_backend')}; "
            f"{facts}; JIT during inference (vLLM's monitor): {jit}"
        )
    return "\n".join(lines) + "\n"


def _engine_label(variant: dict) -> str:
    """``wheel: BACKEND``, with what the engine was asked for beyond the defaults."""
    asked = variant.get("requested_backend") or variant.get("fp8_env") or "auto"
    extras = ([f"asked {asked}"] if asked != "auto" else []) + variant.get("engine_flags", [])
    label = f"{variant['wheel']}: {variant.get('moe_backend') or '?'}"
    return label + (f" ({', '.join(extras)})" if extras else "")


def tpot_over_reference(engines: list[dict], batches: list[str]):
    """Each engine's time per token over the kind's reference engine (the patched wheel on its
    default backend, else the first engine) per batch, with the distance down to the fastest
    and up to the slowest repeat: ``reference, [(ratio, low, high), ...]``."""
    defaults = [v for v in engines if v["wheel"] == "patched" and _default_backend(v)]
    reference = (defaults or engines)[0]
    series = []
    for v in engines:
        ratio, low, high = [], [], []
        for b in batches:
            times, scale = v["result"]["decode"][b], reference["result"]["decode"][b]["median_ms"]
            ratio.append(times["median_ms"] / scale)
            low.append(ratio[-1] - min(times["tpot_ms"]) / scale)
            high.append(max(times["tpot_ms"]) / scale - ratio[-1])
        series.append((ratio, low, high))
    return reference, series


def decode_plot(report: dict, path: Path) -> None:
    """Per FP8 kind: each engine's time per token over the kind's patched default-backend
    engine at every decode batch (bars: fastest and slowest repeat), and output tokens/s."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [v for v in report["variants"] if v.get("result")]
    kinds = list(dict.fromkeys(v["kind"] for v in served))
    if not kinds:
        return
    batches = [str(b) for b in report["spec"]["decode_batches"]]
    fig, axes = plt.subplots(2, len(kinds), figsize=(5 * len(kinds), 8), squeeze=False)
    for col, kind in enumerate(kinds):
        engines = [v for v in served if v["kind"] == kind]
        reference, series = tpot_over_reference(engines, batches)
        top, bottom = axes[0][col], axes[1][col]
        labels = [f"{_engine_label(v)}, round {v.get('round', 1)}" for v in engines]
        for (ratio, low, high), label in zip(series, labels, strict=True):
            top.errorbar(
                [int(b) for b in batches],
                ratio,
                yerr=[low, high],
                marker="o",
                capsize=3,
                label=label,
            )
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
        top.yaxis.set_major_formatter(plain)
        top.yaxis.set_minor_formatter(plain)
        top.set_xlabel("decode batch")
        top.set_ylabel(f"time per token ÷ {_engine_label(reference)}'s")
        top.set_title(f"{report['model']}, {kind}")
        top.grid(alpha=0.3, which="both")
        top.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14))
        rates = [v["result"]["throughput"]["output_tokens_per_s"] for v in engines]
        bottom.barh(range(len(engines)), rates, color="tab:blue", alpha=0.5)
        for row, label in enumerate(labels):
            bottom.text(10, row, label, va="center", fontsize=7)
        bottom.set_yticks([])
        bottom.set_xlabel("offline throughput, output tokens/s")
        bottom.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def refresh_log_facts(report: dict, logs: Path) -> None:
    """Re-read each variant's facts from its kept log (the parser may have learnt more)."""
    from .run import parse_log

    for variant in report["variants"]:
        log = logs / variant["log"]
        if log.exists():
            for key in [k for k in variant if k in FACT_KEYS]:
                del variant[key]
            variant.update(parse_log(log.read_text(errors="replace")))


def resort_profiles(report: dict) -> None:
    """Sort each profiled window's kernels into kinds again by the current rules."""
    from .profile import resorted

    for variant in report["variants"]:
        profile = variant.get("result", {}).get("profile")
        if profile:
            variant["result"]["profile"] = {
                window: resorted(times) for window, times in profile.items()
            }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_e2e.report", description="Write RESULT.md beside RESULT.json."
    )
    parser.add_argument("result", type=Path, help="a moe_e2e.run result file")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="re-read the engines' facts from the kept logs and sort profiled kernels again",
    )
    args = parser.parse_args(argv)
    if not args.result.is_file():
        parser.error(f"{args.result} is not a file")
    report = json.loads(args.result.read_text())
    if args.refresh:
        refresh_log_facts(report, args.result.parent / f"{args.result.stem}-logs")
        resort_profiles(report)
        args.result.write_text(json.dumps(report, indent=2) + "\n")
    args.result.with_suffix(".md").write_text(markdown(report))
    try:
        decode_plot(report, args.result.with_suffix(".png"))
    except ImportError:
        print(f"{args.result}: matplotlib is not installed; wrote the Markdown only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
