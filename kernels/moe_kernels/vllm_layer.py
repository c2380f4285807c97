"""The whole MoE layer of an installed vLLM against its read floor, with the fused decode path.

    PYTHONPATH=<a staged vLLM site> python -m moe_kernels.vllm_layer --label series \\
        --out layer-series.json [--shape all] [--M decode] [--quant tensor,block] \\
        [--routing uniform,shared] [--stop-after SECONDS] [--resume]
    python -m moe_kernels.vllm_layer --compare layer-release.json layer-series.json

The harness's own layer (``moe_kernels.bench --gemm layer``) runs vLLM's kernel with torch
glue, which launches more kernels than vLLM does; this times vLLM's own ``fused_experts``
(its activation quantisation, routing alignment, both ``fused_moe_kernel`` launches,
SiLU-and-mul, the intermediate's quantisation and the top-k sum, with vLLM's C++ ops), so
it needs vLLM's build: the official wheel's site for the release's unfused layer, the
patched wheel's for the series' (``moe_e2e.stage`` installs both).  Where the vLLM has the
series' ``fused-decode`` patch, each case also times its ``fused_moe_decode`` and records
whether vLLM's rule (``use_fused_moe_decode``) takes it for that batch.

Per case (shape, FP8 kind, M, routing): each path in a CUDA graph of ``CALLS`` calls that
rotate over ``COPIES`` weight copies (so the weights come from HBM, not the L2), the paths'
replays taking turns, the median replay over ``CALLS`` the time per call; each path is first
checked against the layer in float64 from the dequantised weights.  The floor is the fewest
bytes the layer must move (every distinct expert's weights and scales once, the activations
in and the output out) over the streaming-read rate measured in the same process.

``--compare`` joins one process per vLLM into a table per case: each layer's time, the fused
path's, their ratio (geometric mean over routings), the fraction of the floor, and the
cases where the rule takes the fused path although it is slower than the unfused layer of
the same vLLM by more than ``NEVER_WORSE``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from .report import geomean

CALLS = 32  # per graph, a multiple of COPIES
# vLLM's FP8 layer and the fused path against float64: their activations' FP8 error (the
# layer's worst on the measured shapes: 0.050).
LAYER_BOUND = 6e-2
NEVER_WORSE = 0.98  # the fused path taken at under this fraction of the unfused layer's speed
DECODE_M = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
ROUTINGS = ("uniform", "shared")
# The four ways FP8 MoE checkpoints reach vLLM's Triton experts: per-tensor weights with
# dynamic per-tensor activation scales (``tensor``) or calibrated static ones (``static``),
# per-channel weights with dynamic per-token scales (``channel``, compressed-tensors
# FP8-dynamic), 128x128 blocks with per-token groups of 128 (``block``).
KINDS = ("tensor", "static", "channel", "block")
WEIGHT_QUANT = {"tensor": "tensor", "static": "tensor", "channel": "channel", "block": "block"}


def token_counts(spec: str) -> list[int]:
    return list(DECODE_M) if spec == "decode" else [int(m) for m in spec.split(",")]


def routed(M: int, shape, gen, kind: str):
    """``uniform``: each token's top-k of its own random logits; ``shared``: the tokens'
    logits mostly one shared vector, so they pick the same few experts."""
    import torch

    from .measure import DEVICE, routing

    if kind == "uniform":
        return routing(M, shape, gen)
    logits = torch.randn(1, shape.experts, generator=gen, device=DEVICE) * 3.0
    logits = logits + 0.5 * torch.randn(M, shape.experts, generator=gen, device=DEVICE)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), shape.topk, dim=-1)
    return ids.to(torch.int32), (weights / weights.sum(-1, keepdim=True)).float()


def layer_floor_bytes(shape, M: int, hit: int, w1_q, w1_s, w2_q, w2_s) -> int:
    """Every distinct expert's weights and scales once, the activations in and out (bf16)."""
    per_expert = w1_q[0].numel() * w1_q.element_size() + w2_q[0].numel() * w2_q.element_size()
    for scale in (w1_s, w2_s):
        per_expert += scale[0].numel() * scale.element_size() if scale.dim() > 1 else 4
    return hit * per_expert + 2 * M * shape.hidden * 2


def _vllm():
    """What this module takes from the vLLM on the path; the fused path is None without it."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    try:
        from vllm.model_executor.layers.fused_moe import fused_moe_decode
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    except ImportError:
        fused_moe_decode = MoEActivation = None
    import torch

    return SimpleNamespace(
        on_hopper=torch.cuda.get_device_capability() == (9, 0),
        VllmConfig=VllmConfig,
        set_current_vllm_config=set_current_vllm_config,
        quant_config=fp8_w8a8_moe_quant_config,
        fused_experts=fused_experts,
        decode=fused_moe_decode,
        silu=MoEActivation.SILU if MoEActivation else None,
    )


def calibrated(x, w1d, ids):
    """Static activation scales as a calibration of this batch would set them: the hidden
    states' and the SiLU-and-mul intermediate's largest magnitude over 448."""
    import torch

    inter = w1d.size(1) // 2
    acts = []
    for t in range(x.size(0)):
        for e in ids[t].tolist():
            g = w1d[e] @ x[t].double()
            acts.append((torch.nn.functional.silu(g[:inter]) * g[inter:]).abs().max())
    a1 = (x.abs().max().float() / 448.0).reshape(1)
    a2 = (torch.stack(acts).max().float() / 448.0).reshape(1)
    return a1, a2


def run_case(v, shape, quant, M, route, weights, gen, bandwidth, replays) -> list[dict]:
    import torch

    from .measure import BLOCK_SHAPE, COPIES, DEVICE, OUT_DTYPE, captured, interleaved_times_us
    from .reference import dequantize_weights, ref_moe_layer_float
    from .stats import rel_frobenius_error

    ids, tw = routed(M, shape, gen, route)
    x = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=OUT_DTYPE)
    hit, remapped = torch.unique(ids.to(torch.int64), return_inverse=True)
    remapped = remapped.view(ids.shape)
    block = list(BLOCK_SHAPE) if quant == "block" else None
    (w1q, s1), (w2q, s2) = weights["up"][0], weights["down"][0]
    w1d = dequantize_weights(w1q[hit], s1[hit], WEIGHT_QUANT[quant], block)
    w2d = dequantize_weights(w2q[hit], s2[hit], WEIGHT_QUANT[quant], block)
    ref = ref_moe_layer_float(x.double(), w1d, w2d, remapped, tw.double())
    a1, a2 = calibrated(x, w1d, remapped) if quant == "static" else (None, None)

    def config(copy):
        (_, w1s), (_, w2s) = weights["up"][copy], weights["down"][copy]
        return v.quant_config(
            w1_scale=w1s, w2_scale=w2s, a1_scale=a1, a2_scale=a2,
            per_act_token_quant=quant == "channel", per_out_ch_quant=quant == "channel",
            block_shape=block,
        )  # fmt: skip

    configs = [config(copy) for copy in range(COPIES)]

    def layer(copy):
        (w1, _), (w2, _) = weights["up"][copy], weights["down"][copy]
        return v.fused_experts(x, w1, w2, tw, ids, quant_config=configs[copy])

    paths = {"layer": layer}
    facts = {"layer": {}}
    if v.decode is not None:
        out = torch.empty(M, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)

        def fused(copy):
            (w1, w1s), (w2, w2s) = weights["up"][copy], weights["down"][copy]
            return v.decode.fused_moe_decode(
                x, w1, w2, w1s, w2s, tw, ids, out,
                per_channel=quant == "channel", block_shape=block,
            )  # fmt: skip

        paths["fused"] = fused
        # the batch-side rule as the modular kernel asks it (its layer-side half holds for
        # vLLM's Triton experts without expert parallelism on Hopper)
        verdict = v.on_hopper and v.decode.use_fused_moe_decode(
            SimpleNamespace(quant_config=configs[0]), x, w1q, v.silu, None, False
        )
        facts["fused"] = {"rule_picks": bool(verdict)}
    for name, call in paths.items():
        error = float(rel_frobenius_error(call(0).double(), ref))
        facts[name].update(rel_error_float=error, correct=error < LAYER_BOUND)

    def rotation(call):
        def run():
            for i in range(CALLS):
                call(i % COPIES)

        return run

    names = list(paths)
    times = interleaved_times_us([captured(rotation(paths[n])) for n in names], replays)
    nbytes = layer_floor_bytes(shape, M, hit.numel(), w1q, s1, w2q, s2)
    floor_us = nbytes / bandwidth["read_gbps"] / 1e3
    rows = []
    for name, series in zip(names, times, strict=True):
        per_call = [t / CALLS for t in series]
        us = statistics.median(per_call)
        rows.append({
            "shape": shape.name, "quant": quant, "M": M, "routing": route, "variant": name,
            "us": us, "us_all": per_call, "floor_us": floor_us, "fraction_of_floor": floor_us / us,
            "experts_hit": int(hit.numel()), "bytes": int(nbytes), **facts[name],
        })  # fmt: skip
    return rows


def measure(args, argv) -> int:
    import torch

    from .bench import shape_names
    from .measure import (
        DEVICE,
        SHAPES,
        case_generator,
        make_weights,
        measure_bandwidth,
        record_header,
        write_report,
    )
    from .resultfile import read_report

    began = time.monotonic()
    v = _vllm()
    import vllm

    rows, seed = [], args.seed
    if args.resume and args.out.exists():
        earlier = read_report(args.out)
        if earlier.get("label") != args.label or args.seed not in (None, earlier.get("seed")):
            print(f"cannot resume {args.out}: another label or seed; give another --out")
            return 2
        rows, seed = earlier["rows"], earlier["seed"]
    seed = seed if seed is not None else int(time.time())
    done = {(r["shape"], r["quant"], r["M"], r["routing"]) for r in rows}
    bandwidth = measure_bandwidth()
    header = {
        **record_header("moe_kernels.vllm_layer", argv),
        "label": args.label,
        "vllm": {"version": vllm.__version__, "fused_decode": v.decode is not None},
        "method": {"calls_per_graph": CALLS, "replays": args.replays, "bound": LAYER_BOUND},
        "seed": seed,
        "bandwidth": bandwidth,
    }

    def write():
        write_report(args.out, {**header, "rows": rows})

    with v.set_current_vllm_config(v.VllmConfig()):
        for shape_name, quant in itertools.product(shape_names(args.shape or ["all"]), args.quant):
            shape = SHAPES[shape_name]
            todo = [
                (M, route)
                for M in token_counts(args.M)
                for route in args.routing
                if (shape_name, quant, M, route) not in done
            ]
            if not todo:
                continue
            if quant == "block" and (shape.hidden % 128 or shape.intermediate % 128):
                print(f"{shape_name} block: skipped (vLLM's block path needs 128 | H and I)")
                continue
            gen = case_generator(seed, shape_name, quant)
            weights = {g: make_weights(shape, g, WEIGHT_QUANT[quant], gen) for g in ("up", "down")}
            for M, route in todo:
                if args.stop_after is not None and time.monotonic() - began > args.stop_after:
                    write()
                    print(f"stopped after {args.stop_after:.0f} s; the rest runs with --resume")
                    return 3
                gen = case_generator(seed, shape_name, quant, M, route)
                case = run_case(v, shape, quant, M, route, weights, gen, bandwidth, args.replays)
                rows += case
                print(
                    f"{shape_name:26s} {quant:7s} M={M:<3d} {route:7s} "
                    f"floor={case[0]['floor_us']:.1f} "
                    + " ".join(
                        f"{r['variant']}={r['us']:.1f}{'' if r['correct'] else '(WRONG)'}"
                        + ("*" if r.get("rule_picks") else "")
                        for r in case
                    ),
                    flush=True,
                )
            write()
            del weights
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    write()
    wrong = [r for r in rows if not r["correct"]]
    print(f"{len(rows)} measurements, {len(wrong)} incorrect; written to {args.out}")
    return 1 if wrong else 0


def compare(reports: list[dict]) -> list[dict]:
    """One entry per (shape, kind, M): each report's layer and fused times (geometric mean
    over routings), the fused path's speed-up over each layer and fraction of the floor, and
    whether the rule took it for every routing."""
    cases: dict[tuple, dict] = {}
    for report in reports:
        label = report["label"]
        for row in report["rows"]:
            key = (row["shape"], row["quant"], row["M"])
            entry = cases.setdefault(key, {"routings": {}})
            per = entry["routings"].setdefault(row["routing"], {})
            per[f"{label}:{row['variant']}"] = row["us"]
            per["floor_us"] = row["floor_us"]
            if row["variant"] == "fused":
                per.setdefault("rule_picks", []).append(row["rule_picks"])
    table = []
    for (shape, quant, M), entry in cases.items():
        routings = entry["routings"].values()
        names = set.intersection(*(set(r) for r in routings)) - {"floor_us", "rule_picks"}
        times = {n: geomean([r[n] for r in routings]) for n in sorted(names)}
        floor = geomean([r["floor_us"] for r in routings])
        picks = [p for r in routings for p in r.get("rule_picks", [])]
        fused = [n for n in times if n.endswith(":fused")]
        row = {"shape": shape, "quant": quant, "M": M, "us": times, "floor_us": floor}
        if fused:
            f = times[fused[0]]
            row["fused_fraction_of_floor"] = floor / f
            row["speedup"] = {n.split(":")[0]: times[n] / f for n in times if n.endswith(":layer")}
            row["rule_picks"] = bool(picks) and all(picks)
        table.append(row)
    return table


def never_worse_violations(table: list[dict], label: str) -> list[dict]:
    """Cases where the rule takes the fused path and it is slower than ``label``'s layer by
    more than ``NEVER_WORSE`` (the fused path and that layer from the same vLLM)."""
    return [
        row
        for row in table
        if row.get("rule_picks") and row["speedup"].get(label, math.inf) < NEVER_WORSE
    ]


def markdown(table: list[dict]) -> str:
    labels = sorted({n.split(":")[0] for row in table for n in row["us"]})
    head = ["shape", "kind", "M", "floor µs"]
    head += [f"{label} layer µs" for label in labels] + ["fused µs", "fused / floor"]
    head += [f"x {label}" for label in labels] + ["rule takes it"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        fused = next((t for n, t in row["us"].items() if n.endswith(":fused")), None)
        cells = [row["shape"], row["quant"], str(row["M"]), f"{row['floor_us']:.1f}"]
        cells += [
            f"{row['us'][f'{label}:layer']:.1f}" if f"{label}:layer" in row["us"] else "-"
            for label in labels
        ]
        cells += [f"{fused:.1f}" if fused else "-"]
        cells += [f"{row['fused_fraction_of_floor']:.2f}" if fused else "-"]
        cells += [
            f"{row['speedup'][label]:.2f}" if fused and label in row["speedup"] else "-"
            for label in labels
        ]
        cells += [("yes" if row["rule_picks"] else "no") if fused else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from .measure import SHAPE_GROUPS, SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", nargs="+", type=Path, metavar="REPORT")
    parser.add_argument("--label", help="names the vLLM measured: release or series")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES) + sorted(SHAPE_GROUPS))
    parser.add_argument("--M", default="decode", help="token counts, or decode (1 to 32)")
    parser.add_argument("--quant", default="tensor,block", help=f"some of {','.join(KINDS)}")
    parser.add_argument("--routing", default=",".join(ROUTINGS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--stop-after", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if args.compare:
        from .resultfile import read_report

        table = compare([read_report(path) for path in args.compare])
        sys.stdout.write(markdown(table))
        worse = never_worse_violations(table, "series")
        for row in worse:
            print(f"rule takes a slower path: {row['shape']} {row['quant']} M={row['M']}")
        return 1 if worse else 0
    if not (args.label and args.out):
        parser.error("give --label and --out (or --compare REPORT...)")
    args.quant = args.quant.split(",")
    args.routing = args.routing.split(",")
    if set(args.quant) - set(KINDS) or set(args.routing) - set(ROUTINGS):
        parser.error(f"--quant takes {', '.join(KINDS)}; --routing {', '.join(ROUTINGS)}")
    try:
        token_counts(args.M)
    except ValueError:
        parser.error(f"--M takes comma-separated token counts or decode, not {args.M!r}")
    return measure(args, argv)


if __name__ == "__main__":
    sys.exit(main())
