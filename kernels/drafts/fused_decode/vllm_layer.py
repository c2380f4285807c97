"""vLLM's own FP8 MoE layer timed beside the fused forms, on the device: the comparison that
decides whether a fused form ships (the harness's ``layer*`` glue overstates vLLM's).

``fused_experts`` of the vLLM tree on ``PYTHONPATH`` (activation quantisation, routing
alignment, both ``fused_moe_kernel`` launches, SiLU-and-mul, the intermediate's
quantisation and the top-k sum, with vLLM's own C++ ops) needs the release's build: the tree
comes from ``tests/release/gpu_branch_tests.py``'s pack, with the series' files laid over it
for the series' layer (``run7.sh``).  Each case: the layer and the fused forms' configs in
CUDA graphs of ``CALLS`` calls rotating over the harness's weight copies, replayed in turn;
both checked against float64 first.  One process per tree: the fused forms appear in both,
so the two runs can be related.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from bench import FORMS, SWEEP, error, fused_call, group_of, label, rotation  # noqa: E402
from emu import emulate  # noqa: E402
from moe_kernels.measure import (  # noqa: E402
    BLOCK_SHAPE,
    COPIES,
    DEVICE,
    OUT_DTYPE,
    SHAPES,
    captured,
    environment,
    interleaved_times_us,
    make_weights,
    measure_bandwidth,
)
from moe_kernels.reference import dequantize_weights, ref_moe_layer_float  # noqa: E402
from moe_kernels.vllm_layer import calibrated, routed  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config  # noqa: E402
from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts  # noqa: E402

CALLS = 32  # per graph, a multiple of COPIES
LAYER_BOUND = 6e-2  # vLLM's FP8 layer against float64: its activations' FP8 error and more


# The four ways FP8 MoE checkpoints reach vLLM's Triton experts: per-tensor weights with
# dynamic per-tensor activation scales (``tensor``: online quantisation) or static ones
# (``static``), per-channel weights with dynamic per-token scales (``channel``:
# compressed-tensors FP8-dynamic), 128x128 blocks with per-token groups of 128 (``block``).
WEIGHT_QUANT = {"tensor": "tensor", "static": "tensor", "channel": "channel", "block": "block"}


def vllm_call(weights, x, ids, tw, quant, static_scales, copy):
    (w1, s1), (w2, s2) = weights["up"][copy], weights["down"][copy]
    a1, a2 = static_scales if quant == "static" else (None, None)
    config = fp8_w8a8_moe_quant_config(
        w1_scale=s1, w2_scale=s2, a1_scale=a1, a2_scale=a2,
        per_act_token_quant=quant == "channel", per_out_ch_quant=quant == "channel",
        block_shape=list(BLOCK_SHAPE) if quant == "block" else None,
    )  # fmt: skip
    return fused_experts(x, w1, w2, tw, ids, quant_config=config)


def case(shape, quant, M, weights, configs, gen, bandwidth, replays, tree_label, profile, kind):
    ids, tw = routed(M, shape, gen, kind)
    x = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=OUT_DTYPE)
    hit, remapped = torch.unique(ids.to(torch.int64), return_inverse=True)
    remapped = remapped.view(ids.shape)
    block = BLOCK_SHAPE if quant == "block" else None
    (w1q, s1), (w2q, s2) = weights["up"][0], weights["down"][0]
    w1d = dequantize_weights(w1q[hit], s1[hit], WEIGHT_QUANT[quant], block)
    w2d = dequantize_weights(w2q[hit], s2[hit], WEIGHT_QUANT[quant], block)
    ref = ref_moe_layer_float(x.double(), w1d, w2d, remapped, tw.double())
    calls, checks = {}, {}

    static_scales = calibrated(x, w1d, remapped) if quant == "static" else None
    layer = functools.partial(vllm_call, weights, x, ids, tw, quant, static_scales)
    err = error(layer(0), ref)
    name = f"{tree_label}:vllm-layer"
    calls[name] = rotation(layer, CALLS)
    checks[name] = {"rel_error_float": err, "correct": err < LAYER_BOUND}

    for form, config in configs:
        out = torch.empty(M, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)
        call = functools.partial(
            fused_call, form, config, weights, x, ids, tw, WEIGHT_QUANT[quant], out
        )
        out.fill_(float("nan"))
        call(0)
        own = emulate(x, w1d, w2d, remapped, tw.double(), group_of(form, config, M, shape), False)
        err = error(out, own)
        name = label(form, config)
        calls[name] = rotation(call, CALLS)
        checks[name] = {
            "rel_error": err, "rel_error_float": error(out, ref), "correct": err < 1e-2,
            "config": config, "form": form,
        }  # fmt: skip

    scales = (s1[0].numel() + s2[0].numel()) * 4
    nbytes = hit.numel() * (w1q[0].numel() + w2q[0].numel() + scales) + 2 * M * shape.hidden * 2
    floor_us = nbytes / bandwidth["read_gbps"] / 1e3
    names = list(calls)
    kernels = kernel_times(calls) if profile else {}
    times = interleaved_times_us([captured(calls[n]) for n in names], replays)
    rows = []
    for name, series in zip(names, times, strict=True):
        per_call = [t / CALLS for t in series]
        us = statistics.median(per_call)
        rows.append({
            "shape": shape.name, "quant": quant, "M": M, "routing": kind, "variant": name, "us": us,
            "us_all": per_call, "floor_us": floor_us, "fraction_of_floor": floor_us / us,
            "experts_hit": int(hit.numel()), "bytes": int(nbytes), **checks[name],
            **({"kernels_us": kernels[name]} if name in kernels else {}),
        })  # fmt: skip
    return rows


def kernel_times(calls, repeats=20):
    """Each variant's kernels and their mean device time per call (µs), from CUDA's
    activity records of eager calls: where the graph's time goes, launch gaps aside."""
    from torch.profiler import ProfilerActivity, profile

    found = {}
    for name, call in calls.items():
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                call()
            torch.cuda.synchronize()
        per_kernel = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                key = event.name[:80]
                per_kernel[key] = per_kernel.get(key, 0.0) + event.device_time_total
        found[name] = {k: v / (repeats * CALLS) for k, v in sorted(per_kernel.items())}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="release or series: names the tree")
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--M", default="1,4,16")
    parser.add_argument("--quant", default="tensor,block")
    parser.add_argument("--configs", default="12,18", help="indices into bench.SWEEP")
    parser.add_argument("--seed", type=int, default=4301)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--profile-M", default="1", help="token counts whose kernels are listed")
    parser.add_argument("--routing", default="uniform", help="uniform, shared or both")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    assert CALLS % COPIES == 0
    assert all(SWEEP[int(i)][0] in FORMS for i in args.configs.split(","))
    configs = [SWEEP[int(i)] for i in args.configs.split(",")]
    bandwidth = measure_bandwidth()
    print(f"bandwidth {bandwidth}", flush=True)
    rows = []
    with set_current_vllm_config(VllmConfig()):
        for shape_name, quant in itertools.product(args.shapes.split(","), args.quant.split(",")):
            shape = SHAPES[shape_name]
            if quant == "block" and (shape.hidden % 128 or shape.intermediate % 128):
                print(f"{shape_name} block: skipped (vLLM's block path needs 128 | H, I)")
                continue
            gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
            weights = {g: make_weights(shape, g, WEIGHT_QUANT[quant], gen) for g in ("up", "down")}
            for M, kind in itertools.product(map(int, args.M.split(",")), args.routing.split(",")):
                profile = str(M) in args.profile_M.split(",")
                done = case(
                    shape,
                    quant,
                    M,
                    weights,
                    configs,
                    gen,
                    bandwidth,
                    args.replays,
                    args.label,
                    profile,
                    kind,
                )
                rows += done
                summary = " ".join(f"{r['variant']}={r['us']:.1f}" for r in done)
                bad = [r["variant"] for r in done if r["correct"] is False]
                print(f"{shape_name} {quant} M={M} {kind} floor={done[0]['floor_us']:.1f} | {summary}"
                      f"{' BAD ' + str(bad) if bad else ''}", flush=True)  # fmt: skip
                for r in done:
                    if "kernels_us" in r:
                        listed = ", ".join(f"{k[:40]} {v:.1f}" for k, v in r["kernels_us"].items())
                        print(f"  {r['variant']}: {sum(r['kernels_us'].values()):.1f} = {listed}")
            del weights
            report = {
                "environment": environment(),
                "command": " ".join(sys.argv),
                "tree": args.label,
                "bandwidth": bandwidth,
                "rows": rows,
            }
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
