"""What the GPU tools share: timing, model shapes, one GEMM case, the run's environment.

* Timing: a CUDA graph holding ``LAUNCHES`` back-to-back calls that rotate over
  ``COPIES`` weight copies (so weights come from HBM, not L2), ``WARMUP_REPLAYS``
  untimed replays, then ``REPLAYS`` timed ones (:func:`graph_time_us`; several graphs
  replayed in turn: :func:`interleaved_times_us`); the
  streaming-read and copy bandwidth the floors are computed from
  (:func:`measure_bandwidth`).
* Shapes: the model shapes (:data:`SHAPES`) and the ``up`` / ``down`` GEMMs' weight
  dimensions; routing, FP8 weights and activations of one measurement
  (:func:`make_case`), checked against float64 and timed per tree
  (:func:`time_variant`).
* Environment: the GPU, torch / triton / CUDA / Python versions, and the command a
  result file records, written so that it names no machine (:func:`command_line`).

:mod:`moe_kernels.bench`, :mod:`moe_kernels.tune`, :mod:`moe_kernels.jit_sweep`,
:mod:`moe_kernels.model_tune` and :mod:`moe_kernels.configs` use these.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from .align import prepare_expert_assignment
from .dispatch import config_for
from .launch import invoke_fused_moe_kernel
from .loader import LoadedKernel
from .quant import quantize_activations, quantize_weights
from .reference import dequantize_activations, dequantize_weights, ref_moe_gemm
from .resultfile import encode
from .stats import rel_frobenius_error
from .trees import described, fingerprints_of

COPIES = 8
LAUNCHES = 64


def launches_for(call_us: float, graph_us: float | None, most: int = LAUNCHES) -> int:
    """Calls in one timed graph: ``most``, or with ``graph_us`` the fewest whole rotations
    over the ``COPIES`` weight copies that make the graph last about that long (at most
    ``most``): at large M one call takes milliseconds, and 64 of them per replay only spend
    device time on a figure that 8 already pin down."""
    if graph_us is None:
        return most
    rotations = -(-graph_us // (call_us * COPIES))  # ceiling
    return int(min(max(rotations, 1), most // COPIES)) * COPIES


def one_call_us(call: Callable[[], object]) -> float:
    """One call's time on the GPU, from CUDA events (what ``launches_for`` sizes a graph by)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


REPLAYS = 30
# Untimed replays before the timed ones: the first timing after new data or a float64
# reference ran up to 10% slow in the tune searches (the same config timed again later
# in the same cell was not), most at the first cell of a shape.
WARMUP_REPLAYS = 5
BLOCK_SHAPE = (128, 128)
# The decode batch sizes vLLM captures CUDA graphs for (and pads a batch up to) up to 512:
# 1, 2, 4, then multiples of 8 to 256, of 16 beyond.
CAPTURE_SIZES = (1, 2, 4, *range(8, 257, 8), *range(272, 513, 16))
# Every token count up to 16, then the capture sizes.
VLLM_GRID = tuple(sorted({*range(1, 17), *CAPTURE_SIZES}))
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


# The four shapes the series ships H200 tables for.
TUNED_SHAPES = (
    Shape("qwen3-30b-a3b", 128, 8, 2048, 768),
    Shape("qwen3-235b-a22b", 128, 8, 4096, 1536),
    Shape("mixtral-8x7b", 8, 2, 4096, 14336),
    Shape("deepseek-v3-tp8", 256, 8, 7168, 256),
)
# Published FP8 MoE models no table was tuned for (config.json's experts, top-k, hidden size
# and MoE intermediate size, the intermediate divided by the tensor-parallel size): several
# expert counts, and grids at M = 1 below the GPU's SM count (Qwen3-Coder, MiniMax) or not.
UNTUNED_SHAPES = (
    Shape("glm-4.5-air", 128, 8, 4096, 1408),
    Shape("qwen3-coder-480b-a35b-tp8", 160, 8, 6144, 320),
    Shape("minimax-m2-tp4", 256, 8, 3072, 384),
    Shape("mixtral-8x22b-tp4", 8, 2, 6144, 4096),
    Shape("deepseek-v2-lite", 64, 6, 2048, 1408),
    Shape("llama-4-scout-tp2", 16, 1, 5120, 4096),
)
SMOKE_SHAPE = Shape("tiny-smoke-test", 8, 2, 256, 128)  # for the CPU smoke test only
SHAPES = {s.name: s for s in (*TUNED_SHAPES, *UNTUNED_SHAPES, SMOKE_SHAPE)}
SHAPE_GROUPS = {
    "tuned": [s.name for s in TUNED_SHAPES],
    "untuned": [s.name for s in UNTUNED_SHAPES],
    "all": [s.name for s in (*TUNED_SHAPES, *UNTUNED_SHAPES)],
}


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


# vLLM's output dtype; fp16 under Triton's interpreter, which has no bf16 atomic add (the
# split-K path adds partial tiles atomically).
OUT_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def sm_count(cpu_fallback: int) -> int:
    """The GPU's SM count; ``cpu_fallback`` under Triton's interpreter."""
    if DEVICE == "cuda":
        return torch.cuda.get_device_properties(0).multi_processor_count
    return cpu_fallback


def captured(fn) -> Callable[[], None]:
    """A replay of a CUDA graph holding one call of ``fn`` (on the CPU: ``fn`` itself)."""
    if DEVICE == "cpu":
        return fn
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def interleaved_times_us(replays_of: list[Callable[[], None]], replays: int = REPLAYS):
    """Per-replay µs of each of several graphs (:func:`captured`), replayed in turn: each
    round replays every graph once, after ``WARMUP_REPLAYS`` untimed rounds.  A change of
    the GPU's state during the measurement (clocks, power) then reaches every graph alike
    instead of one graph's whole series of replays.  On the CPU each runs once."""
    if DEVICE == "cpu":
        times = []
        for replay in replays_of:
            started = time.perf_counter()
            replay()
            times.append([(time.perf_counter() - started) * 1e6])
        return times
    for _ in range(WARMUP_REPLAYS):
        for replay in replays_of:
            replay()
    times = [[] for _ in replays_of]
    for _ in range(replays):
        for replay, series in zip(replays_of, times, strict=True):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            series.append(start.elapsed_time(end) * 1e3)
    return times


def graph_time_us(fn, replays: int = REPLAYS) -> list[float]:
    """Per-replay µs of a CUDA graph holding one call of ``fn``, after
    ``WARMUP_REPLAYS`` untimed replays."""
    return interleaved_times_us([captured(fn)], replays)[0]


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
    return time_variants([checked_variant(variant, case, weights_q, refs, config)], replays)[0]


def time_variants(
    checked: list[tuple[dict, Callable[[], None], int]], replays: int = REPLAYS
) -> list[dict]:
    """The rows of checked variants of one case (:func:`checked_variant`), timed together
    (:func:`interleaved_times_us`), so that every variant sees the same GPU states.  A
    row's ``wall_s``: its check plus its share of the timing."""
    started = time.monotonic()
    times = interleaved_times_us([captured(calls) for _, calls, _ in checked], replays)
    timing_s = (time.monotonic() - started) / len(checked)
    return [
        {
            **row,
            "us": statistics.median(per_call := [t / launches for t in series]),
            "us_all": per_call,
            "wall_s": round(row["check_s"] + timing_s, 3),
        }
        for (row, _, launches), series in zip(checked, times, strict=True)
    ]


def dispatch_config(variant: Variant, case: dict) -> tuple[dict, str]:
    """The config the variant's tree launches for the case (its tables or default), and
    where it came from."""
    shape, block = case["shape"], case["block"]
    return config_for(
        variant.tree,
        case["M"],
        shape.experts,
        shape.intermediate,
        shape.hidden,
        shape.topk,
        "fp8_w8a8",
        list(block) if block else None,
    )


def checked_variant(
    variant: Variant,
    case: dict,
    weights_q,
    refs: dict,
    config: dict | None = None,
    graph_us: float | None = None,
) -> tuple[dict, Callable[[], None], int]:
    """One variant's row before timing (its config, launch and errors against the float64
    reference on the first and last weight copy), the call a graph times, and the kernel
    launches that call makes (:func:`launches_for`: with ``graph_us``, from one timed
    launch).  ``config`` overrides the tree's own dispatch (for tuning)."""
    shape, quant, M, block = case["shape"], case["quant"], case["M"], case["block"]
    if config is None:
        config, source = dispatch_config(variant, case)
    else:
        config, source = dict(config), "candidate"
    swap = config.pop("SWAP_AB", None)  # a tuned config's own choice wins
    sorted_ids, expert_ids, num_post = prepare_expert_assignment(
        case["ids"], config["BLOCK_SIZE_M"], shape.experts
    )
    C = torch.empty(M, shape.topk, case["N"], dtype=OUT_DTYPE, device=DEVICE)

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
    started = time.monotonic()
    first_launch_s = None
    for copy in (0, COPIES - 1):
        C.fill_(float("nan"))
        args = launch(copy)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        if first_launch_s is None:  # Triton compiles (or loads from its cache) here
            first_launch_s = time.monotonic() - started
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

    if DEVICE != "cuda":
        launches = 1
    elif graph_us is None:
        launches = LAUNCHES
    else:
        launches = launches_for(one_call_us(lambda: launch(COPIES - 1)), graph_us)

    def all_copies():
        for i in range(launches):
            launch(i % COPIES)

    row = {
        "shape": shape.name,
        "gemm": case["gemm"],
        "quant": quant,
        "M": M,
        "variant": variant.label,
        "config": config,
        "config_source": source,
        "swap_ab": args.get("SWAP_AB"),
        "split_k": args["grid"][1],
        # the tile and depth launched, where the tree's launcher rules changed the config's
        "launched": {"BLOCK_SIZE_N": args["BLOCK_SIZE_N"], "num_stages": args.get("num_stages")},
        "naive": sorted_ids is None,
        "experts_hit": int(torch.unique(case["ids"]).numel()),
        "rel_error": errors,
        "correct": bool(correct),
        # where a run's time goes: the first launch (compilation), and the whole row
        "first_launch_s": round(first_launch_s, 3),
        "check_s": round(time.monotonic() - started, 3),
        "launches": launches,
    }
    return row, all_copies, launches


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


def write_atomically(path: Path, text: str | bytes) -> None:
    """Replace ``path`` with ``text`` in one step: a reader sees the old file or the new.
    A missing folder is made (a run's first write comes after minutes of measuring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def case_generator(seed: int, *case) -> torch.Generator:
    """A generator of its own for one case (bench's weights: shape, GEMM, quant; a measurement:
    also M and the routing; tune's cells alike), so a case's numbers do not depend on what ran
    before it and a resumed run gives those an uninterrupted one would."""
    key = zlib.crc32(repr((seed, *case)).encode())
    return torch.Generator(device=DEVICE).manual_seed(key)


def write_report(path: Path, report: dict) -> None:
    """Write a result file whole or not at all: a run written after every case and
    stopped at a device call's time limit keeps its last complete file (gzip-compressed
    where the name ends in ``.gz``: :mod:`moe_kernels.resultfile`)."""
    write_atomically(path, encode(path, report))


def record_header(module: str, argv: list[str] | None, trees: list[str] = ()) -> dict:
    """What every result file starts with: the command that made it, the series of the trees
    it measured and the commit of the checkout that ran it, the machine, and, for the
    ``LABEL=PATH`` trees it measured, each one's fingerprint and what ``trees.json`` beside
    it records (the series version and commit it was made from;
    :func:`moe_kernels.trees.described`)."""
    found = described(trees) if trees else {}
    header = {
        "command": command_line(module, argv),
        "series_version": series_of(found),
        "series_commit": checkout_commit(),
        "environment": environment(),
    }
    if trees:
        header["fingerprints"] = fingerprints_of(trees)
        header["trees"] = found
    return header


def series_of(trees: dict[str, dict | None]) -> str | None:
    """The version of the series the trees were made from, as their ``trees.json`` records
    it (several, comma-separated, where a run compares series); None where none records
    one: the harness takes the series from its trees, never from moe-patch."""
    versions = {(facts or {}).get("series_version") for facts in trees.values()} - {None}
    return ", ".join(sorted(versions)) or None


def checkout_commit() -> str | None:
    """The commit of the git checkout this harness runs from (``+`` when it has uncommitted
    changes); None where there is none (an installed harness, or a device's copy of the
    working tree: there ``trees`` names the commit each tree was made from)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, env=env
            )
        except OSError:
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


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
