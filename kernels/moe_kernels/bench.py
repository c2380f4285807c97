"""GPU benchmark of fused_moe_kernel from several vLLM trees, measured in one run.

For each model shape, GEMM (``up``: hidden -> 2 x intermediate; ``down``:
intermediate -> hidden with routed weights), quantisation and token count M,
every variant (a tree, its launch config chosen by that tree's own dispatch)
is timed in one CUDA graph holding ``LAUNCHES`` back-to-back launches that
rotate over ``COPIES`` separate weight copies (so weights come from HBM, not
the 60 MB L2), replayed ``REPLAYS`` times, the variants of a case taking turns
(one replay each per round, so a change of the GPU's state reaches them alike);
the median replay divided by ``LAUNCHES`` is the time per call.  The
output is poisoned with NaN and checked against a float64 reference on the
first and last weight copy before timing.

The floor is the fewest bytes a call must move (the distinct experts' weights
and scales, the activations, the output) over the streaming-read bandwidth
measured in the same run.

    python -m moe_kernels.bench --tree 0.21.0=/path/a --tree 0.21.0+moe=/path/b \
        --out results.json [--shape NAME|tuned|untuned|all] [--M 1,2,4|vllm-grid] \
        [--routings N] [--resume] [--gpus 0,1,2,3] [--stop-after SECONDS]

``--routings N`` measures each case on N routings (the report takes their geometric mean);
every case draws its weights, routing and activations from its own seed (``--seed`` and the
case), so ``--resume``, which keeps the cases ``--out`` already holds for the same trees,
gives the numbers an uninterrupted run would, and a long run can span several calls
(``--stop-after``: no case starts after SECONDS).  ``--gpus`` spreads the weight sets over
several GPUs of the host (``moe_kernels.spread``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from . import spread
from .align import prepare_expert_assignment, use_naive_block_assignment
from .dispatch import config_for
from .layer import fused_moe_layer
from .loader import load_fused_moe_kernel
from .measure import (
    BLOCK_SHAPE,
    COPIES,
    DEVICE,
    FP8_ERROR_BOUND,
    LAUNCHES,
    OUT_DTYPE,
    REPLAYS,
    SHAPE_GROUPS,
    SHAPES,
    VLLM_GRID,
    WARMUP_REPLAYS,
    Variant,
    captured,
    case_generator,
    checked_variant,
    floor_bytes,
    gemm_dims,
    interleaved_times_us,
    launches_for,
    make_case,
    make_weights,
    measure_bandwidth,
    one_call_us,
    record_header,
    routing,
    time_variants,
    write_report,
)
from .quant import quantize_activations
from .reference import ref_moe_layer_quantized
from .resultfile import read_report
from .stats import rel_frobenius_error
from .trees import fingerprint_changes, fingerprints_of

DEFAULT_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)


SAVE_EVERY_S = 20  # --out is rewritten at least this often, and after each weight set


def token_counts(spec: str) -> list[int]:
    return list(VLLM_GRID) if spec == "vllm-grid" else [int(m) for m in spec.split(",")]


def shape_names(requested: list[str] | None) -> list[str]:
    """Shape names in order, groups (tuned, untuned, all) expanded, each once."""
    names: list[str] = []
    for name in requested or ["tuned"]:
        for shape in SHAPE_GROUPS.get(name, [name]):
            if shape not in names:
                names.append(shape)
    return names


def run_case(
    variants, shape, gemm, quant, M, weights_q, gen, bandwidth, graph_us=None
) -> list[dict]:
    case = make_case(shape, gemm, quant, M, gen)
    ids, a_q, a_scale = case["ids"], case["a_q"], case["a_scale"]
    nbytes = floor_bytes(shape, gemm, quant, ids, *weights_q[0], a_q, a_scale, M * shape.topk)
    floor_us = nbytes / bandwidth["read_gbps"] / 1e3
    refs: dict[int, torch.Tensor] = {}
    checked = [
        checked_variant(variant, case, weights_q, refs, graph_us=graph_us) for variant in variants
    ]
    results = time_variants(checked)
    for row in results:
        row.update(floor_us=floor_us, fraction_of_floor=floor_us / row["us"], bytes=nbytes)
    return results


LAYER_CALLS = 16  # layers per graph: each is ~10 launches


def run_layer_case(variants, shape, quant, M, weights, gen, bandwidth, graph_us=None) -> list[dict]:
    """The whole MoE layer (both GEMMs plus the harness's torch glue: activation
    quantisation, SiLU-and-mul, top-k sum) per variant, in a CUDA graph of
    ``LAYER_CALLS`` layers rotating over the weight copies (with ``graph_us``, as few
    whole rotations as last about that long, as the GEMMs' graphs).  The glue is the
    same code for every variant; the floor is both GEMMs' floors added."""
    block = BLOCK_SHAPE if quant == "block" else None
    ids, topk_weights = routing(M, shape, gen)
    hidden = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=OUT_DTYPE)
    hit, remapped = torch.unique(ids.to(torch.int64), return_inverse=True)
    remapped = remapped.view(ids.shape).to(torch.int32)
    (w1_q, w1_s), (w2_q, w2_s) = weights["up"][0], weights["down"][0]
    nbytes = 0
    for gemm, (w_q, w_s) in (("up", (w1_q, w1_s)), ("down", (w2_q, w2_s))):
        rows = M if gemm == "up" else M * shape.topk
        K = gemm_dims(shape, gemm)[1]
        a_q, a_s = quantize_activations(
            torch.zeros(rows, K, device=DEVICE, dtype=torch.bfloat16), quant, block
        )
        nbytes += floor_bytes(shape, gemm, quant, ids, w_q, w_s, a_q, a_s, M * shape.topk)
    floor_us = nbytes / bandwidth["read_gbps"] / 1e3
    measured = {}
    for variant in variants:
        config, source = config_for(
            variant.tree, M, shape.experts, shape.intermediate, shape.hidden, shape.topk,
            "fp8_w8a8", list(block) if block else None,
        )  # fmt: skip
        swap = config.pop("SWAP_AB", None)
        naive = use_naive_block_assignment(M, shape.topk, shape.experts)
        assignment = prepare_expert_assignment(
            ids, config["BLOCK_SIZE_M"], shape.experts, naive=naive
        )

        def layer(
            copy,
            kernel=variant.kernel,
            config=config,
            swap=swap,
            assignment=assignment,
            naive=naive,
        ):
            (w1, s1), (w2, s2) = weights["up"][copy], weights["down"][copy]
            return fused_moe_layer(
                kernel, hidden, w1, s1, w2, s2, ids, topk_weights, config, quant,
                block_shape=block, swap_ab=swap, naive=naive, assignment=assignment,
            )  # fmt: skip

        run = layer(0)
        ref = ref_moe_layer_quantized(
            hidden, w1_q[hit], None if w1_s is None else w1_s[hit], w2_q[hit],
            None if w2_s is None else w2_s[hit], remapped, topk_weights, quant,
            block_shape=block, gemm1_out=run.cache1,
        )  # fmt: skip
        error = float(rel_frobenius_error(run.out.double(), ref.double()))
        if DEVICE != "cuda":
            calls = 1
        else:
            calls = launches_for(one_call_us(lambda: layer(COPIES - 1)), graph_us, LAYER_CALLS)

        def all_copies(layer=layer, calls=calls):
            for i in range(calls):
                layer(i % COPIES)

        measured[variant.label] = (all_copies, calls, config, source, swap, run, error)
    # In one process the first layer graph timed ran ~15% faster than the same graph
    # timed again later (H200, Qwen3-30B M=1: 55 vs 64-65 µs, whichever variant came
    # first), when each variant's replays ran one after another's: the variants' replays
    # now take turns, after untimed rounds, twice as many as a GEMM's.
    graphs = [captured(measured[v.label][0]) for v in variants]
    per_call = {
        variant.label: [t / measured[variant.label][1] for t in series]
        for variant, series in zip(variants, interleaved_times_us(graphs, 2 * REPLAYS), strict=True)
    }
    results = []
    for variant in variants:
        _, _, config, source, swap, run, error = measured[variant.label]
        us = statistics.median(per_call[variant.label])
        results.append(
            {
                "shape": shape.name, "gemm": "layer", "quant": quant, "M": M,
                "variant": variant.label, "config": config, "config_source": source,
                "swap_ab": swap, "naive": run.naive, "us": us, "us_all": per_call[variant.label],
                "experts_hit": int(hit.numel()), "rel_error": [error], "launches": calls,
                "correct": bool(error < FP8_ERROR_BOUND), "floor_us": floor_us,
                "fraction_of_floor": floor_us / us, "bytes": nbytes,
            }
        )  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument(
        "--shape",
        action="append",
        choices=sorted(SHAPES) + sorted(SHAPE_GROUPS),
        help="a shape or a group: tuned (default: the shapes the series ships tables for), "
        "untuned (published models without tables), all",
    )
    parser.add_argument(
        "--gemm",
        action="append",
        choices=["up", "down", "layer"],
        help="default: up and down; layer times the whole MoE layer",
    )
    parser.add_argument("--quant", action="append", choices=["tensor", "channel", "block"])
    parser.add_argument(
        "--M",
        default=",".join(map(str, DEFAULT_M)),
        help="token counts, comma-separated, or vllm-grid (1-16 and vLLM's capture sizes to 512)",
    )
    parser.add_argument("--routings", type=int, default=1, help="routings per case")
    parser.add_argument("--seed", type=int, default=None, help="default: the time, or --resume's")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--graph-us",
        type=float,
        default=None,
        metavar="US",
        help="graphs of about US µs: as few whole rotations over the weight copies as that "
        f"takes, at most {LAUNCHES} GEMM launches or {LAYER_CALLS} layers (default: that many "
        "always; large M then spends most of a run's device time)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the cases --out already holds (same trees and seed) and measure the rest",
    )
    spread.add_arguments(parser, unit="weight set (shape, GEMM, quant)", what="case")
    args = parser.parse_args(argv)
    began = time.monotonic()
    gpus = spread.gpu_ids(parser, args)
    if args.routings < 1:
        parser.error("--routings must be at least 1")
    try:
        token_counts(args.M)
    except ValueError:
        parser.error(f"--M takes comma-separated token counts or vllm-grid, not {args.M!r}")
    try:
        args.fingerprints = fingerprints_of(args.tree)
    except FileNotFoundError as error:
        parser.error(f"--tree: {error}")
    done_rows: list[dict] = []
    if args.resume and args.out.exists():
        try:
            earlier = read_report(args.out)
        except ValueError as error:
            parser.error(f"cannot resume from {args.out}: {error}")
        seed = earlier.get("method", {}).get("seed")
        trees = {label: str(Path(path)) for label, _, path in (t.partition("=") for t in args.tree)}
        if earlier.get("variants") != trees or args.seed not in (None, seed):
            parser.error(f"cannot resume {args.out}: other trees or seed; give another --out")
        if earlier.get("method", {}).get("graph_us") != args.graph_us:
            parser.error(f"cannot resume {args.out}: another --graph-us; give another --out")
        changed = fingerprint_changes(earlier.get("fingerprints"), args.fingerprints)
        if changed:
            parser.error(f"cannot resume {args.out}: {changed}; give another --out")
        args.seed, done_rows = seed, earlier.get("rows", [])
    args.seed = spread.run_seed(args, gpus)
    if gpus:
        return spread.run(spread_job(args), gpus, args.resume, args.stop_after, argv)

    variants = []
    for spec in args.tree:
        label, _, path = spec.partition("=")
        variants.append(Variant(label, Path(path), load_fused_moe_kernel(Path(path))))
    bandwidth = measure_bandwidth()
    print(
        f"bandwidth: read {bandwidth['read_gbps']:.0f} GB/s, copy {bandwidth['copy_gbps']:.0f} GB/s",
        flush=True,
    )
    rows = list(done_rows)
    done = {case_key(r) for r in rows}
    gpu_id = os.environ.get("CUDA_VISIBLE_DEVICES")
    written = time.monotonic()
    for shape_name in shape_names(args.shape):
        shape = SHAPES[shape_name]
        for gemm in args.gemm or ["up", "down"]:
            for quant in args.quant or ["tensor", "block"]:
                todo = [
                    (M, r)
                    for M in token_counts(args.M)
                    for r in range(args.routings)
                    if (shape_name, gemm, quant, M, r) not in done
                ]
                if not todo:
                    continue
                gen = case_generator(args.seed, shape_name, gemm, quant)
                if gemm == "layer":
                    weights_q = {g: make_weights(shape, g, quant, gen) for g in ("up", "down")}
                else:
                    weights_q = make_weights(shape, gemm, quant, gen)
                for M, route in todo:
                    if args.stop_after is not None and time.monotonic() - began > args.stop_after:
                        _write(args, argv, variants, bandwidth, rows)
                        print(f"stopped after {args.stop_after:.0f} s; the rest runs with --resume")
                        return 3
                    gen = case_generator(args.seed, shape_name, gemm, quant, M, route)
                    if gemm == "layer":
                        case = run_layer_case(
                            variants, shape, quant, M, weights_q, gen, bandwidth, args.graph_us
                        )
                    else:
                        case = run_case(
                            variants, shape, gemm, quant, M, weights_q, gen, bandwidth,
                            args.graph_us,
                        )  # fmt: skip
                    for row in case:
                        row["routing"] = route
                        if gpu_id is not None:  # which of the host's GPUs timed it
                            row["gpu"] = gpu_id
                    rows += case
                    print(
                        f"{shape_name:16s} {gemm:4s} {quant:6s} M={M:<4d} r{route} "
                        + "  ".join(
                            f"{r['variant']}={r['us']:.1f}us{'' if r['correct'] else '(WRONG)'}"
                            for r in case
                        )
                        + f"  floor={case[0]['floor_us']:.1f}",
                        flush=True,
                    )
                    if time.monotonic() - written > SAVE_EVERY_S:  # a cut-short run resumes
                        _write(args, argv, variants, bandwidth, rows)
                        written = time.monotonic()
                _write(args, argv, variants, bandwidth, rows)
                written = time.monotonic()
                del weights_q
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    _write(args, argv, variants, bandwidth, rows)
    wrong = [r for r in rows if not r["correct"]]
    print(f"{len(rows)} measurements, {len(wrong)} incorrect; written to {args.out}")
    return 1 if wrong else 0


def spread_job(args) -> spread.Job:
    """``--gpus``: one process per weight set, the whole-layer ones first (the longest, so the
    GPUs finish close together)."""
    units = [
        (shape, gemm, quant)
        for shape in shape_names(args.shape)
        for gemm in args.gemm or ["up", "down"]
        for quant in args.quant or ["tensor", "block"]
    ]

    def arguments(unit: tuple) -> list[str]:
        shape, gemm, quant = unit
        own = [f"--tree={tree}" for tree in args.tree]
        own += ["--shape", shape, "--gemm", gemm, "--quant", quant, "--M", args.M]
        own += ["--routings", str(args.routings), "--seed", str(args.seed)]
        return own + (["--graph-us", str(args.graph_us)] if args.graph_us else [])

    return spread.Job(
        module="moe_kernels.bench",
        out=args.out,
        units=sorted(units, key=lambda unit: unit[1] != "layer"),
        rows_key="rows",
        fields=("shape", "gemm", "quant"),
        arguments=arguments,
    )


def case_key(row: dict) -> tuple:
    return (row["shape"], row["gemm"], row["quant"], row["M"], row.get("routing", 0))


def _write(args, argv, variants, bandwidth, rows) -> None:
    report = {
        **record_header("moe_kernels.bench", argv, args.tree),
        "method": {
            "copies": COPIES,
            "launches_per_graph": LAUNCHES,
            **({"graph_us": args.graph_us} if args.graph_us else {}),
            "replays": REPLAYS,
            "warmup_replays": WARMUP_REPLAYS,
            "layer_calls_per_graph": LAYER_CALLS,
            "seed": args.seed,
            "routings": args.routings,
        },
        "bandwidth": bandwidth,
        "variants": {v.label: str(v.tree) for v in variants},
        "fingerprints": args.fingerprints,
        "rows": rows,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
