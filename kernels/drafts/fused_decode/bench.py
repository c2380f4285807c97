"""Device study: the draft fused decode forms against the unfused Triton layer of a tree.

    python3 kernels/drafts/fused_decode/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \\
        --shapes qwen3-30b-a3b,deepseek-v3-tp8 --M 1,4,16 --quant tensor,block \\
        --configs 0,1,2 --out $OUT/fused-sweep.json

Per case (shape, quant, M, routing) and variant, the median µs per call of a CUDA graph
that rotates over the harness's weight copies: each fused form and config of ``SWEEP``;
``LABEL:gemms``, the tree's two ``fused_moe_kernel`` launches on inputs quantised
beforehand (what any unfused path spends at least); ``LABEL:layer``, the harness's layer
with its torch glue (more launches than vLLM's glue).  The fused forms are checked first:
v2 against its own quantisation points in float64, v3 and v4 against the unquantised layer.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import fp8fix  # noqa: E402
from emu import emulate, group_width  # noqa: E402
from load import load_module  # noqa: E402
from moe_kernels import interpreter_compat  # noqa: E402
from moe_kernels.align import (  # noqa: E402
    prepare_expert_assignment,
    use_naive_block_assignment,
)
from moe_kernels.dispatch import config_for  # noqa: E402
from moe_kernels.launch import invoke_fused_moe_kernel  # noqa: E402
from moe_kernels.layer import fused_moe_layer  # noqa: E402
from moe_kernels.loader import load_fused_moe_kernel  # noqa: E402
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
    routing,
)
from moe_kernels.quant import quantize_activations  # noqa: E402
from moe_kernels.reference import (  # noqa: E402
    dequantize_weights,
    ref_moe_layer_float,
    silu_and_mul,
)

interpreter_compat.apply()
fp8fix.apply()
FORMS = {
    "v2": load_module(HERE / "two_launch_v2.py", "two_launch_v2"),
    "v3": load_module(HERE / "fused_v3.py", "fused_v3"),
    "v4": load_module(HERE / "fused_v4.py", "fused_v4"),
    "v5": load_module(HERE / "fused_v5.py", "fused_v5"),
    "v6": load_module(HERE / "fused_v6.py", "fused_v6"),
    "v7": load_module(HERE / "fused_v7.py", "fused_v7"),
    "v8": load_module(HERE / "fused_v8.py", "fused_v8"),
    "v9": load_module(HERE / "fused_v9.py", "fused_v9"),
    "v10": load_module(HERE / "fused_v10.py", "fused_v10"),
    "v11": load_module(HERE / "fused_v11.py", "fused_v11"),
    "v12": load_module(HERE / "fused_v12.py", "fused_v12"),
}
SMS = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 4
SWEEP = [
    ("v2", {}),
    ("v3", {}),
    ("v3", {"block_h": 128}),
    ("v3", {"programs_per_sm": 2}),
    ("v3", {"up_stages": 4, "down_stages": 3}),
    ("v4", {}),
    ("v4", {"block_h": 128}),
    ("v4", {"programs_per_sm": 2}),
    ("v4", {"block_i": 32, "min_steps": 2}),
    ("v5", {}),
    ("v5", {"block_i": 32}),
    ("v5", {"block_i": 128}),
    ("v5", {"block_h": 128}),
    ("v5", {"block_i": 32, "programs_per_sm": 2}),
    # deeper pipelines: more bytes in flight per program
    ("v5", {"block_h": 128, "up_stages": 8, "down_stages": 8}),
    ("v5", {"block_h": 128, "up_stages": 6, "down_stages": 6}),
    ("v5", {"block_i": 32, "block_h": 128, "up_stages": 8, "down_stages": 8}),
    ("v5", {"block_h": 128, "up_stages": 8, "down_stages": 8, "num_warps": 8}),
    # v6: the up kernel's K split where its tiles leave SMs idle
    ("v6", {"block_h": 128}),
    ("v6", {"block_h": 128, "up_stages": 6, "down_stages": 6}),
    ("v6", {"block_h": 128, "programs_per_sm": 2, "up_stages": 6, "down_stages": 6}),
    # v7: v6 as programmatic dependent launches, prefetching their first K steps into the L2
    ("v7", {"block_h": 128}),
    ("v7", {"block_h": 128, "up_prefetch": 64, "down_prefetch": 64}),
    ("v7", {"block_h": 128, "up_prefetch": 0, "down_prefetch": 0}),
    ("v7", {"block_h": 128, "programs_per_sm": 2}),
    # the down kernel's K step a whole 128-byte line: the intermediate's groups 128 wide
    ("v6", {"block_h": 128, "block_i": 128}),
    ("v6", {"block_i": 128}),
    ("v7", {"block_h": 128, "block_i": 128, "up_prefetch": 0, "down_prefetch": 0}),
    ("v7", {"block_i": 128, "up_prefetch": 0, "down_prefetch": 0}),
    # v8: PDL with each program's first K step of weights loaded before the wait
    ("v8", {"block_h": 128}),
    ("v8", {"block_h": 128, "block_i": 128}),
    ("v8", {"block_h": 128, "pdl": False}),
    # v9: v6 with the width chosen per launch and exact division (the patch candidate)
    ("v9", {"block_h": 128}),
    # v9 with each launch's K split where it balances the waves, not only where programs
    # are short of the SMs (1 and 2 programs an SM at once)
    ("v9", {"block_h": 128, "balance_waves": True}),
    ("v9", {"block_h": 128, "balance_waves": True, "programs_per_sm": 2}),
    # v10: one launch of one program per SM, each phase's units dealt out evenly (35); the
    # same kernel as three launches (36); shallower pipelines; eight warps; an ordinary
    # launch instead of a cooperative one (39)
    ("v10", {}),
    ("v10", {"one_launch": False}),
    ("v10", {"num_stages": 3}),
    ("v10", {"num_warps": 8}),
    ("v10", {"cooperative": False}),
    # v9's kernels one at a time (kernel_split.py): eight warps; 64-row down tiles (twice
    # the down programs)
    ("v9", {"block_h": 128, "num_warps": 8}),
    ("v9", {"block_h": 64}),
    # v11: v9 with its weight tiles loaded by TMA (42); with deeper pipelines (43)
    ("v11", {"block_h": 128}),
    ("v11", {"block_h": 128, "up_stages": 6, "down_stages": 6}),
    # v9 and v11 split into the read probe's grain (16-32 KB a program at M = 1): K shares of
    # one step allowed, four and eight programs an SM (44-47)
    ("v9", {"block_h": 128, "programs_per_sm": 4, "min_steps": 1}),
    ("v9", {"block_h": 128, "programs_per_sm": 8, "min_steps": 1}),
    ("v11", {"block_h": 128, "programs_per_sm": 4, "min_steps": 1}),
    ("v11", {"block_h": 128, "programs_per_sm": 8, "min_steps": 1}),
    # v12: one launch of ticketed units of 32, 16 and 64 KB of weights (48-50)
    ("v12", {}),
    ("v12", {"unit_kb": 16}),
    ("v12", {"unit_kb": 64}),
]
CALLS = {"fused": 64, "gemms": 64, "layer": 16}  # per graph


def label(form: str, config: dict) -> str:
    return f"fused-{form}:" + (",".join(f"{k}={v}" for k, v in config.items()) or "default")


def group_of(form: str, config: dict, M: int, shape) -> int:
    """The width of the intermediate's quantisation groups the form uses for this launch."""
    return group_width(FORMS[form], config, M, shape.topk, shape.experts, shape.intermediate, SMS)


def error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def fused_call(form, config, weights, x, ids, tw, quant, out, copy):
    (w1, s1), (w2, s2) = weights["up"][copy], weights["down"][copy]
    FORMS[form].fused_moe_decode(
        x, w1, w2, s1, s2, tw, ids, out, per_channel=quant == "channel",
        block_shape=list(BLOCK_SHAPE) if quant == "block" else None, sm_count=SMS, **config,
    )  # fmt: skip


def layer_call(kernel, config, swap, naive, assignment, weights, x, ids, tw, quant, copy):
    (w1, s1), (w2, s2) = weights["up"][copy], weights["down"][copy]
    return fused_moe_layer(
        kernel, x, w1, s1, w2, s2, ids, tw, config, quant,
        block_shape=BLOCK_SHAPE if quant == "block" else None, swap_ab=swap, naive=naive,
        assignment=assignment,
    )  # fmt: skip


def gemms_call(kernel, config, common, assignment, weights, inputs, tw, top_k, copy):
    (w1, s1), (w2, s2) = weights["up"][copy], weights["down"][copy]
    (a1q, a1s, c1), (a2q, a2s, c3) = inputs
    sorted_ids, expert_ids, num_post = assignment
    invoke_fused_moe_kernel(
        kernel, a1q, w1, c1, a1s, s1, tw, sorted_ids, expert_ids, num_post, False, top_k,
        config, **common,
    )  # fmt: skip
    invoke_fused_moe_kernel(
        kernel, a2q, w2, c3, a2s, s2, tw, sorted_ids, expert_ids, num_post, True, 1,
        config, **common,
    )  # fmt: skip


def rotation(call, calls):
    def run():
        for i in range(calls):
            call(i % COPIES)

    return run


def case(shape, quant, M, weights, trees, configs, gen, bandwidth, replays):
    block = BLOCK_SHAPE if quant == "block" else None
    ids, tw = routing(M, shape, gen)
    x = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=OUT_DTYPE)
    hit, remapped = torch.unique(ids.to(torch.int64), return_inverse=True)
    remapped = remapped.view(ids.shape)
    (w1q, s1), (w2q, s2) = weights["up"][0], weights["down"][0]
    w1d = dequantize_weights(w1q[hit], s1[hit], quant, block)
    w2d = dequantize_weights(w2q[hit], s2[hit], quant, block)
    ref = ref_moe_layer_float(x.double(), w1d, w2d, remapped, tw.double())
    own = emulate(x, w1d, w2d, remapped, tw.double())
    scales = (s1[0].numel() + s2[0].numel()) * 4
    nbytes = hit.numel() * (w1q[0].numel() + w2q[0].numel() + scales) + 2 * M * shape.hidden * 2
    calls, checks = {}, {}
    for form, config in configs:
        out = torch.empty(M, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)
        call = functools.partial(fused_call, form, config, weights, x, ids, tw, quant, out)
        out.fill_(float("nan"))
        call(0)
        target = {"v2": own, "v3": ref, "v4": ref}.get(form)
        if form not in ("v2", "v3", "v4"):  # their own quantisation points
            group = group_of(form, config, M, shape)
            target = emulate(x, w1d, w2d, remapped, tw.double(), group, False)
        err = error(out, target)
        name = label(form, config)
        calls[name] = (rotation(call, CALLS["fused"]), CALLS["fused"])
        checks[name] = {
            "rel_error": [err], "rel_error_float": error(out, ref), "correct": err < 1e-2,
            "config": config, "form": form,
        }  # fmt: skip
    for tree_label, tree, kernel in trees:
        config, source = config_for(
            tree, M, shape.experts, shape.intermediate, shape.hidden, shape.topk, "fp8_w8a8",
            list(block) if block else None,
        )  # fmt: skip
        swap = config.pop("SWAP_AB", None)
        naive = use_naive_block_assignment(M, shape.topk, shape.experts)
        assignment = prepare_expert_assignment(
            ids, config["BLOCK_SIZE_M"], shape.experts, naive=naive
        )
        layer = functools.partial(
            layer_call, kernel, config, swap, naive, assignment, weights, x, ids, tw, quant
        )
        run = layer(0)
        calls[f"{tree_label}:layer"] = (rotation(layer, CALLS["layer"]), CALLS["layer"])
        checks[f"{tree_label}:layer"] = {
            "rel_error_float": error(run.out, ref), "config": config, "config_source": source,
        }  # fmt: skip
        a1q, a1s = quantize_activations(x, quant, block)
        act = silu_and_mul(run.cache1.view(M * shape.topk, -1).float()).to(OUT_DTYPE)
        a2q, a2s = quantize_activations(act, quant, block)
        c1 = torch.empty(M, shape.topk, 2 * shape.intermediate, dtype=OUT_DTYPE, device=DEVICE)
        c3 = torch.empty(M, shape.topk, shape.hidden, dtype=OUT_DTYPE, device=DEVICE)
        common = {
            "use_fp8_w8a8": True, "per_channel_quant": quant == "channel",
            "block_shape": list(block) if block else None, "swap_ab": swap,
        }  # fmt: skip
        gemms = functools.partial(
            gemms_call, kernel, config, common, assignment, weights,
            ((a1q, a1s, c1), (a2q, a2s, c3)), tw, shape.topk,
        )  # fmt: skip
        calls[f"{tree_label}:gemms"] = (rotation(gemms, CALLS["gemms"]), CALLS["gemms"])
        checks[f"{tree_label}:gemms"] = {"config": config}
    names = list(calls)
    times = interleaved_times_us([captured(calls[n][0]) for n in names], replays)
    floor_us = nbytes / bandwidth["read_gbps"] / 1e3
    rows = []
    for name, series in zip(names, times, strict=True):
        per_call = [t / calls[name][1] for t in series]
        us = statistics.median(per_call)
        rows.append({
            "shape": shape.name, "quant": quant, "M": M, "variant": name, "us": us,
            "us_all": per_call, "floor_us": floor_us, "fraction_of_floor": floor_us / us,
            "experts_hit": int(hit.numel()), "bytes": int(nbytes), **checks[name],
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--M", default="1,4,16")
    parser.add_argument("--quant", default="tensor,block")
    parser.add_argument("--routings", type=int, default=1)
    parser.add_argument("--configs", default="all", help="indices into SWEEP, or all")
    parser.add_argument("--seed", type=int, default=4301)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    configs = SWEEP if args.configs == "all" else [SWEEP[int(i)] for i in args.configs.split(",")]
    trees = []
    for spec in args.tree:
        tree_label, _, path = spec.partition("=")
        trees.append((tree_label, Path(path), load_fused_moe_kernel(Path(path))))
    bandwidth = measure_bandwidth() if DEVICE == "cuda" else {"read_gbps": 1.0, "copy_gbps": 1.0}
    print(f"bandwidth {bandwidth}", flush=True)
    rows, started = [], time.monotonic()
    for shape_name, quant in itertools.product(args.shapes.split(","), args.quant.split(",")):
        shape = SHAPES[shape_name]
        gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
        weights = {g: make_weights(shape, g, quant, gen) for g in ("up", "down")}
        for M, _ in itertools.product(map(int, args.M.split(",")), range(args.routings)):
            done = case(shape, quant, M, weights, trees, configs, gen, bandwidth, args.replays)
            rows += done
            summary = " ".join(f"{r['variant']}={r['us']:.1f}" for r in done)
            bad = [r["variant"] for r in done if r.get("correct") is False]
            print(f"{shape_name} {quant} M={M} floor={done[0]['floor_us']:.1f} | {summary}"
                  f"{' BAD ' + str(bad) if bad else ''} [{time.monotonic() - started:.0f}s]",
                  flush=True)  # fmt: skip
        del weights
        report = {
            "environment": environment(),
            "command": " ".join(sys.argv),
            "bandwidth": bandwidth,
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
