"""GPU benchmark of fused_moe_kernel from several vLLM trees, measured in one run.

For each model shape, GEMM (``up``: hidden -> 2 x intermediate; ``down``:
intermediate -> hidden with routed weights), quantisation and token count M,
every variant (a tree, its launch config chosen by that tree's own dispatch)
is timed in one CUDA graph holding ``LAUNCHES`` back-to-back launches that
rotate over ``COPIES`` separate weight copies (so weights come from HBM, not
the 60 MB L2), replayed ``REPLAYS``
times; the median replay divided by ``LAUNCHES`` is the time per call.  The
output is poisoned with NaN and checked against a float64 reference on the
first and last weight copy before timing.

The floor is the fewest bytes a call must move (the distinct experts' weights
and scales, the activations, the output) over the streaming-read bandwidth
measured in the same run.

    python -m moe_kernels.bench --tree 0.21.0=/path/a --tree 0.21.0+moe=/path/b \
        --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from .align import prepare_expert_assignment, use_naive_block_assignment
from .dispatch import config_for
from .launch import invoke_fused_moe_kernel
from .layer import fused_moe_layer
from .loader import LoadedKernel, load_fused_moe_kernel
from .quant import quantize_activations, quantize_weights
from .reference import (
    dequantize_activations,
    dequantize_weights,
    ref_moe_gemm,
    ref_moe_layer_quantized,
)
from .stats import rel_frobenius_error

COPIES = 8
LAUNCHES = 64
REPLAYS = 30
# Untimed replays before the timed ones: the first timing after new data or a float64
# reference ran up to 10% slow in the tune searches (the same config timed again later
# in the same cell was not), most at the first cell of a shape.
WARMUP_REPLAYS = 5
BLOCK_SHAPE = (128, 128)
FP8_ERROR_BOUND = 3e-2
# Without CUDA (Triton's interpreter) the benchmark still runs end to end, for
# the smoke test; its times are then wall-clock and meaningless.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Shape:
    name: str
    experts: int
    topk: int
    hidden: int
    intermediate: int


SHAPES = {
    s.name: s
    for s in (
        Shape("qwen3-30b-a3b", 128, 8, 2048, 768),
        Shape("qwen3-235b-a22b", 128, 8, 4096, 1536),
        Shape("mixtral-8x7b", 8, 2, 4096, 14336),
        Shape("deepseek-v3-tp8", 256, 8, 7168, 256),
        Shape("tiny-smoke-test", 8, 2, 256, 128),  # for the CPU smoke test only
    )
}
DEFAULT_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class Variant:
    label: str
    tree: Path
    kernel: LoadedKernel


# --------------------------------------------------------------------------- #
# Bandwidth ceilings
# --------------------------------------------------------------------------- #


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    # Each program reads ITERS consecutive blocks and keeps one sum, so the
    # kernel's traffic is reads only.
    start = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def sm_count(cpu_fallback: int) -> int:
    """The GPU's SM count; ``cpu_fallback`` under Triton's interpreter."""
    if DEVICE == "cuda":
        return torch.cuda.get_device_properties(0).multi_processor_count
    return cpu_fallback


def graph_time_us(fn, replays: int = REPLAYS) -> list[float]:
    """Per-replay µs of a CUDA graph holding one call of ``fn``, after
    ``WARMUP_REPLAYS`` untimed replays."""
    if DEVICE == "cpu":
        started = time.perf_counter()
        fn()
        return [(time.perf_counter() - started) * 1e6]
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def measure_bandwidth(gib: float = 4.0) -> dict[str, float]:
    """Streaming-read and device-to-device copy bandwidth in GB/s (medians)."""
    n = int(gib * (1 << 30)) // 4 if DEVICE == "cuda" else 1 << 16
    x = torch.randint(-1000, 1000, (n,), dtype=torch.int32, device=DEVICE)
    block, iters = 4096, 16
    grid = (triton.cdiv(n, block * iters),)
    out = torch.empty(grid[0], dtype=torch.int32, device=DEVICE)
    read_us = statistics.median(
        graph_time_us(lambda: _stream_read_kernel[grid](x, out, n, BLOCK=block, ITERS=iters))
    )
    if int(out.to(torch.int64).sum()) != int(x.to(torch.int64).sum()):
        raise RuntimeError("stream-read kernel summed wrongly: bandwidth figure is void")
    y = torch.empty_like(x)
    copy_us = statistics.median(graph_time_us(lambda: y.copy_(x)))
    nbytes = x.numel() * 4
    return {"read_gbps": nbytes / read_us / 1e3, "copy_gbps": 2 * nbytes / copy_us / 1e3}


# --------------------------------------------------------------------------- #
# One GEMM case
# --------------------------------------------------------------------------- #


def gemm_dims(shape: Shape, gemm: str) -> tuple[int, int]:
    """(N, K) of the weight tensor (E, N, K) for the ``up`` or ``down`` GEMM."""
    if gemm == "up":
        return 2 * shape.intermediate, shape.hidden
    return shape.hidden, shape.intermediate


def routing(M: int, shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(M, shape.experts, generator=gen, device=DEVICE)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), shape.topk, dim=-1)
    return ids.to(torch.int32), (weights / weights.sum(-1, keepdim=True)).float()


def make_weights(shape: Shape, gemm: str, quant: str, gen: torch.Generator):
    N, K = gemm_dims(shape, gemm)
    copies = []
    for _ in range(COPIES):
        w = torch.randn(shape.experts, N, K, generator=gen, device=DEVICE, dtype=torch.bfloat16)
        w *= torch.exp(0.5 * torch.randn(shape.experts, N, 1, generator=gen, device=DEVICE)).to(
            w.dtype
        )
        copies.append(quantize_weights(w, quant, BLOCK_SHAPE if quant == "block" else None))
        del w
    return copies


def floor_bytes(shape, gemm, quant, ids, w_q, w_scale, a_q, a_scale, out_rows) -> int:
    N, K = gemm_dims(shape, gemm)
    hit = torch.unique(ids).numel()
    per_expert_scale = 0 if w_scale is None else w_scale[0].numel() * w_scale.element_size()
    act = a_q.numel() * a_q.element_size() + (0 if a_scale is None else a_scale.numel() * 4)
    return hit * (N * K * w_q.element_size() + per_expert_scale) + act + out_rows * N * 2


def reference(a_q, a_scale, w_q, w_scale, ids, weights, quant, top_k, mul_routed):
    """Float64 reference computed from the experts the routing hits only."""
    block = BLOCK_SHAPE if quant == "block" else None
    hit, remapped = torch.unique(ids.to(torch.int64), return_inverse=True)
    w = dequantize_weights(w_q[hit], w_scale[hit], quant, block)
    a = dequantize_activations(a_q, a_scale, quant, block)
    return ref_moe_gemm(a, w, remapped.view(ids.shape), top_k, weights, mul_routed)


def make_case(shape, gemm, quant, M, gen, route=None) -> dict:
    """Routing and quantised activations of one measurement, shared by all variants.

    ``route`` (ids, weights) reuses a routing, so a layer's two GEMMs see the same one."""
    N, K = gemm_dims(shape, gemm)
    ids, topk_weights = route if route is not None else routing(M, shape, gen)
    rows = M if gemm == "up" else M * shape.topk
    a = torch.randn(rows, K, generator=gen, device=DEVICE, dtype=torch.bfloat16)
    block = BLOCK_SHAPE if quant == "block" else None
    a_q, a_scale = quantize_activations(a, quant, block)
    return {
        "shape": shape,
        "gemm": gemm,
        "quant": quant,
        "M": M,
        "N": N,
        "block": block,
        "ids": ids,
        "topk_weights": topk_weights,
        "a_q": a_q,
        "a_scale": a_scale,
        "top_k": shape.topk if gemm == "up" else 1,
        "mul_routed": gemm == "down",
    }


def run_case(variants, shape, gemm, quant, M, weights_q, gen, bandwidth) -> list[dict]:
    case = make_case(shape, gemm, quant, M, gen)
    ids, a_q, a_scale = case["ids"], case["a_q"], case["a_scale"]
    nbytes = floor_bytes(shape, gemm, quant, ids, *weights_q[0], a_q, a_scale, M * shape.topk)
    floor_us = nbytes / bandwidth["read_gbps"] / 1e3
    refs: dict[int, torch.Tensor] = {}
    results = []
    for variant in variants:
        row = time_variant(variant, case, weights_q, refs)
        row.update(floor_us=floor_us, fraction_of_floor=floor_us / row["us"], bytes=nbytes)
        results.append(row)
    return results


def time_variant(
    variant: Variant,
    case: dict,
    weights_q,
    refs: dict,
    config: dict | None = None,
    replays: int = REPLAYS,
) -> dict:
    """Check one variant on the first and last weight copy, then time it.

    ``config`` overrides the tree's own dispatch (for tuning)."""
    shape, quant, M, block = case["shape"], case["quant"], case["M"], case["block"]
    if config is None:
        config, source = config_for(
            variant.tree,
            M,
            shape.experts,
            shape.intermediate,
            shape.hidden,
            shape.topk,
            "fp8_w8a8",
            list(block) if block else None,
        )
    else:
        config, source = dict(config), "candidate"
    swap = config.pop("SWAP_AB", None)  # a tuned config's own choice wins
    sorted_ids, expert_ids, num_post = prepare_expert_assignment(
        case["ids"], config["BLOCK_SIZE_M"], shape.experts
    )
    C = torch.empty(M, shape.topk, case["N"], dtype=torch.bfloat16, device=DEVICE)

    def launch(copy: int):
        w_q, w_scale = weights_q[copy]
        return invoke_fused_moe_kernel(
            variant.kernel,
            case["a_q"],
            w_q,
            C,
            case["a_scale"],
            w_scale,
            case["topk_weights"],
            sorted_ids,
            expert_ids,
            num_post,
            case["mul_routed"],
            case["top_k"],
            config,
            use_fp8_w8a8=True,
            per_channel_quant=quant == "channel",
            block_shape=list(block) if block else None,
            swap_ab=swap,
        )

    errors = []
    for copy in (0, COPIES - 1):
        C.fill_(float("nan"))
        args = launch(copy)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        if copy not in refs:
            refs[copy] = reference(
                case["a_q"],
                case["a_scale"],
                *weights_q[copy],
                case["ids"],
                case["topk_weights"],
                quant,
                case["top_k"],
                case["mul_routed"],
            )
        errors.append(float(rel_frobenius_error(C.double(), refs[copy])))
    correct = all(e < FP8_ERROR_BOUND for e in errors)  # NaN (an unwritten row) fails too

    launches = LAUNCHES if DEVICE == "cuda" else 1

    def all_copies():
        for i in range(launches):
            launch(i % COPIES)

    per_call = [t / launches for t in graph_time_us(all_copies, replays)]
    return {
        "shape": shape.name,
        "gemm": case["gemm"],
        "quant": quant,
        "M": M,
        "variant": variant.label,
        "config": config,
        "config_source": source,
        "swap_ab": args.get("SWAP_AB"),
        "split_k": args["grid"][1],
        "naive": sorted_ids is None,
        "us": statistics.median(per_call),
        "us_all": per_call,
        "experts_hit": int(torch.unique(case["ids"]).numel()),
        "rel_error": errors,
        "correct": bool(correct),
    }


LAYER_CALLS = 16  # layers per graph: each is ~10 launches


def run_layer_case(variants, shape, quant, M, weights, gen, bandwidth) -> list[dict]:
    """The whole MoE layer (both GEMMs plus the harness's torch glue: activation
    quantisation, SiLU-and-mul, top-k sum) per variant, in a CUDA graph of
    ``LAYER_CALLS`` layers rotating over the weight copies.  The glue is the same
    code for every variant; the floor is both GEMMs' floors added."""
    block = BLOCK_SHAPE if quant == "block" else None
    ids, topk_weights = routing(M, shape, gen)
    hidden = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=torch.bfloat16)
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
        calls = LAYER_CALLS if DEVICE == "cuda" else 1

        def all_copies(layer=layer, calls=calls):
            for i in range(calls):
                layer(i % COPIES)

        measured[variant.label] = (all_copies, calls, config, source, swap, run, error)
    # In one process the first layer graph timed ran ~15% faster than the same graph
    # timed again later (H200, Qwen3-30B M=1: 55 vs 64-65 µs, whichever variant came
    # first): one warm-up timing is discarded, then two rounds in opposite orders.
    graph_time_us(measured[variants[0].label][0])
    per_call: dict[str, list[float]] = {v.label: [] for v in variants}
    for order in (variants, variants[::-1]):
        for variant in order:
            all_copies, calls = measured[variant.label][:2]
            per_call[variant.label] += [t / calls for t in graph_time_us(all_copies)]
    results = []
    for variant in variants:
        _, _, config, source, swap, run, error = measured[variant.label]
        us = statistics.median(per_call[variant.label])
        results.append(
            {
                "shape": shape.name, "gemm": "layer", "quant": quant, "M": M,
                "variant": variant.label, "config": config, "config_source": source,
                "swap_ab": swap, "naive": run.naive, "us": us, "us_all": per_call[variant.label],
                "experts_hit": int(hit.numel()), "rel_error": [error],
                "correct": bool(error < FP8_ERROR_BOUND), "floor_us": floor_us,
                "fraction_of_floor": floor_us / us, "bytes": nbytes,
            }
        )  # fmt: skip
    return results


def command_line(module: str, argv: list[str] | None) -> str:
    """The command a result file records: this interpreter, ``-m module`` and its arguments,
    with paths under the working directory (or $OUT, the GPU machine's output folder) written
    relative to it, so that the record names no machine."""
    args = [_portable(arg) for arg in (argv or sys.argv[1:])]
    return " ".join([Path(sys.executable).name, "-m", module, *args])


def _portable(arg: str) -> str:
    prefix, sep, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
    if not value.startswith("/"):
        return arg
    path = Path(value)
    for base, shown in ((os.environ.get("OUT"), "$OUT"), (os.getcwd(), None)):
        if base and path.is_relative_to(base):
            rel = path.relative_to(base).as_posix()
            value = f"{shown}/{rel}" if shown else rel
            break
    return f"{prefix}{sep}{value}"


def environment() -> dict:
    if DEVICE == "cpu":
        return {
            "gpu": None,
            "device": "cpu (Triton interpreter)",
            "torch": torch.__version__,
            "triton": triton.__version__,
        }
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "capability": list(torch.cuda.get_device_capability(0)),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument(
        "--gemm",
        action="append",
        choices=["up", "down", "layer"],
        help="default: up and down; layer times the whole MoE layer",
    )
    parser.add_argument("--quant", action="append", choices=["tensor", "channel", "block"])
    parser.add_argument("--M", default=",".join(map(str, DEFAULT_M)))
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    variants = []
    for spec in args.tree:
        label, _, path = spec.partition("=")
        variants.append(Variant(label, Path(path), load_fused_moe_kernel(Path(path))))
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    bandwidth = measure_bandwidth()
    print(
        f"bandwidth: read {bandwidth['read_gbps']:.0f} GB/s, copy {bandwidth['copy_gbps']:.0f} GB/s",
        flush=True,
    )
    rows = []
    for shape_name in args.shape or [name for name in SHAPES if name != "tiny-smoke-test"]:
        shape = SHAPES[shape_name]
        for gemm in args.gemm or ["up", "down"]:
            for quant in args.quant or ["tensor", "block"]:
                if gemm == "layer":
                    weights_q = {g: make_weights(shape, g, quant, gen) for g in ("up", "down")}
                else:
                    weights_q = make_weights(shape, gemm, quant, gen)
                for M in (int(m) for m in args.M.split(",")):
                    if gemm == "layer":
                        case = run_layer_case(variants, shape, quant, M, weights_q, gen, bandwidth)
                    else:
                        case = run_case(variants, shape, gemm, quant, M, weights_q, gen, bandwidth)
                    rows += case
                    print(
                        f"{shape_name:16s} {gemm:4s} {quant:6s} M={M:<4d} "
                        + "  ".join(
                            f"{r['variant']}={r['us']:.1f}us{'' if r['correct'] else '(WRONG)'}"
                            for r in case
                        )
                        + f"  floor={case[0]['floor_us']:.1f}",
                        flush=True,
                    )
                del weights_q
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                _write(args, argv, variants, bandwidth, rows)  # partial results survive a timeout
    _write(args, argv, variants, bandwidth, rows)
    wrong = [r for r in rows if not r["correct"]]
    print(f"{len(rows)} measurements, {len(wrong)} incorrect; written to {args.out}")
    return 1 if wrong else 0


def _write(args, argv, variants, bandwidth, rows) -> None:
    report = {
        "command": command_line("moe_kernels.bench", argv),
        "environment": environment(),
        "method": {
            "copies": COPIES,
            "launches_per_graph": LAUNCHES,
            "replays": REPLAYS,
            "warmup_replays": WARMUP_REPLAYS,
            "layer_calls_per_graph": LAYER_CALLS,
            "seed": args.seed,
        },
        "bandwidth": bandwidth,
        "variants": {v.label: str(v.tree) for v in variants},
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
