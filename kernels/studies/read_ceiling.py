"""The fastest a single launch can read a GEMM's bytes: a ceiling on its fraction of the floor.

The floor of a decode GEMM is the bytes it must move over the streaming-read
bandwidth of a long read.  A short read does not reach that bandwidth: every
launch pays for its start, its ramp to full memory parallelism and its drain.
For each row of a benchmark file (``moe_kernels.bench`` output) this measures
the fastest way found to do nothing but read that row's byte count in one
launch, over a sweep of read geometries (programs per SM, words per load,
contiguous slices or a grid-stride loop), timed as the benchmark times GEMMs:
one CUDA graph of ``LAUNCHES`` launches rotating over ``COPIES`` buffers, so the
bytes come from HBM.

``ceiling = floor / best read`` is then an upper bound on the fraction of the
floor any one-launch kernel that reads those bytes reaches, however it tiles
its GEMM.  Rows give the benchmarked kernel's own time next to it.

A one-off study, not part of the installed package; from the repository root
(torch and triton installed; ``moe_kernels`` installed or, as here, on ``PYTHONPATH``):

    PYTHONPATH=kernels python -m studies.read_ceiling --bench bench.json \
        --variant 0.21.0+moe --max-m 64 --out read-ceiling.json

Results: ``kernels/results/read-ceiling/``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl
from moe_kernels import interpreter_compat
from moe_kernels.measure import (
    COPIES,
    DEVICE,
    LAUNCHES,
    REPLAYS,
    graph_time_us,
    measure_bandwidth,
    record_header,
    sm_count,
)
from moe_kernels.resultfile import read_report

# The sweep: programs per SM, int32 words each program loads per step, and
# whether a program reads one contiguous slice or strides over the whole buffer.
PROGRAMS_PER_SM = (1, 2, 4, 8, 16, 32)
WORDS_PER_LOAD = (512, 2048)
STRIDED = (False, True)
# Every geometry is screened with a short graph (cheap: the slow geometries take
# many times the floor); the best few are re-timed as the benchmark times GEMMs,
# and the fastest of those is the ceiling's read.
SCREEN_LAUNCHES = 16
SCREEN_REPLAYS = 3
RETIMED = 3


@dataclass(frozen=True)
class Geometry:
    programs: int
    words_per_load: int
    strided: bool


@triton.jit
def _read_kernel(
    x_ptr,
    out_ptr,
    words,
    words_per_program,
    WORDS_PER_LOAD: tl.constexpr,
    STRIDED: tl.constexpr,
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, WORDS_PER_LOAD)
    acc = tl.zeros((WORDS_PER_LOAD,), dtype=tl.int32)
    if STRIDED:
        # Grid-stride: neighbouring programs read neighbouring loads.
        step = tl.num_programs(0) * WORDS_PER_LOAD
        for start in range(pid * WORDS_PER_LOAD, words, step):
            offsets = start + lanes
            acc += tl.load(x_ptr + offsets, mask=offsets < words, other=0)
    else:
        # One contiguous slice per program, like one GEMM tile's weight rows.
        begin = pid * words_per_program
        for offset in range(0, words_per_program, WORDS_PER_LOAD):
            offsets = begin + offset + lanes
            acc += tl.load(x_ptr + offsets, mask=offsets < words, other=0)
    tl.store(out_ptr + pid, tl.sum(acc))


def geometries(sms: int) -> list[Geometry]:
    return [
        Geometry(sms * per_sm, words, strided)
        for per_sm, words, strided in itertools.product(PROGRAMS_PER_SM, WORDS_PER_LOAD, STRIDED)
    ]


def time_read(
    buffers, words: int, geometry: Geometry, replays: int, launches: int = LAUNCHES
) -> list[float]:
    """Per-launch µs of the read with ``geometry``, after checking that it sums right."""
    programs = geometry.programs
    per_program = triton.cdiv(triton.cdiv(words, programs), geometry.words_per_load)
    per_program *= geometry.words_per_load
    out = torch.empty(programs, dtype=torch.int32, device=DEVICE)
    launches = launches if DEVICE == "cuda" else 1

    def read(copy: int):
        _read_kernel[(programs,)](
            buffers[copy % COPIES], out, words, per_program,
            WORDS_PER_LOAD=geometry.words_per_load, STRIDED=geometry.strided,
        )  # fmt: skip

    read(0)
    if int(out.to(torch.int64).sum()) != int(buffers[0].to(torch.int64).sum()):
        raise RuntimeError(f"read kernel summed wrongly with {geometry}: its times are void")

    def all_copies():
        for i in range(launches):
            read(i)

    return [t / launches for t in graph_time_us(all_copies, replays)]


def best_read(nbytes: int, sms: int) -> dict:
    """The fastest geometry found for reading ``nbytes`` in one launch, and its µs."""
    words = nbytes // 4  # whole int32 words: never more bytes than the row moves
    buffers = [
        torch.randint(-9, 9, (words,), dtype=torch.int32, device=DEVICE) for _ in range(COPIES)
    ]
    screened = sorted(
        (statistics.median(time_read(buffers, words, g, SCREEN_REPLAYS, SCREEN_LAUNCHES)), i, g)
        for i, g in enumerate(geometries(sms))
    )
    retimed = sorted(
        (statistics.median(time_read(buffers, words, g, REPLAYS)), i, g)
        for _, i, g in screened[:RETIMED]
    )
    read_us, _, geometry = retimed[0]
    del buffers
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return {"read_us": read_us, "geometry": asdict(geometry), "bytes_read": words * 4}


def ceiling_rows(bench: dict, variants: list[str], max_m: int, bandwidth: dict) -> list[dict]:
    """One row per GEMM case of ``variants[0]`` with M <= ``max_m``; every variant's time beside."""
    key = ("shape", "gemm", "quant", "M")
    times = {(r["variant"], *(r[k] for k in key)): r["us"] for r in bench["rows"]}
    cases = [
        r
        for r in bench["rows"]
        if r["variant"] == variants[0] and r["M"] <= max_m and r["gemm"] != "layer"
    ]
    if not cases:
        raise SystemExit(
            f"no GEMM rows of variant {variants[0]!r} with M <= {max_m} in the bench file: "
            f"name one of its variants with --variant"
        )
    times_per_case = []  # checked before any timing, so a bad --variant fails at once
    for case in cases:
        here = {v: times.get((v, *(case[k] for k in key))) for v in variants}
        missing = [v for v, us in here.items() if us is None]
        if missing:
            raise SystemExit(
                f"the bench file has no {missing[0]!r} row for {case['shape']} {case['gemm']} "
                f"{case['quant']} M={case['M']}: name variants measured in the same run"
            )
        times_per_case.append(here)
    rows = []
    sms = sm_count(cpu_fallback=1)  # one "SM" keeps the interpreter's geometries small
    for case, kernel_us in zip(cases, times_per_case, strict=True):
        read = best_read(case["bytes"], sms)
        floor_us = read["bytes_read"] / bandwidth["read_gbps"] / 1e3
        rows.append(
            {
                **{k: case[k] for k in key}, "bytes": case["bytes"], **read,
                "floor_us": floor_us, "ceiling": floor_us / read["read_us"],
                "kernel_us": kernel_us,
                "kernel_over_read": {v: us / read["read_us"] for v, us in kernel_us.items()},
            }
        )  # fmt: skip
        print(
            f"{case['shape']:16s} {case['gemm']:4s} {case['quant']:6s} M={case['M']:<3d} "
            f"floor={floor_us:.1f}us read={read['read_us']:.1f}us "
            f"ceiling={floor_us / read['read_us']:.2f} "
            + " ".join(f"{v}={us:.1f}us" for v, us in kernel_us.items()),
            flush=True,
        )
    return rows


def summary(rows: list[dict]) -> dict:
    """Median and worst ceiling per GEMM: what the floor targets would need."""
    out = {}
    for gemm in sorted({r["gemm"] for r in rows}):
        ceilings = [r["ceiling"] for r in rows if r["gemm"] == gemm]
        out[gemm] = {
            "cases": len(ceilings),
            "median_ceiling": statistics.median(ceilings),
            "worst_ceiling": min(ceilings),
            "cases_below_0.80": sum(c < 0.80 for c in ceilings),
            "cases_below_0.95": sum(c < 0.95 for c in ceilings),
        }
    return out


def markdown(report: dict) -> str:
    lines = [
        "# Read ceiling: the fastest one-launch read of each GEMM's bytes",
        "",
        f"`{report['command']}`",
        "",
        f"GPU: {report['environment'].get('gpu')}; torch {report['environment']['torch']}, "
        f"triton {report['environment']['triton']}; streaming read "
        f"{report['bandwidth']['read_gbps']:.0f} GB/s. Kernel times: "
        + ", ".join(f"`{v}`" for v in report["variants"])
        + f" from `{report['bench']}`.",
        "",
        "| GEMM | cases | median ceiling | worst ceiling | cases < 0.80 | cases < 0.95 |",
        "|---|---|---|---|---|---|",
    ]
    for gemm, s in report["summary"].items():
        lines.append(
            f"| {gemm} | {s['cases']} | {s['median_ceiling']:.3f} | {s['worst_ceiling']:.3f} "
            f"| {s['cases_below_0.80']} | {s['cases_below_0.95']} |"
        )
    variants = report["variants"]
    lines += [
        "",
        "| shape | GEMM | quant | M | MB | floor µs | best read µs | ceiling | "
        + " | ".join(f"{v} µs (/ read)" for v in variants)
        + " | read geometry (programs, words/load, strided) |",
        "|" + "---|" * (9 + len(variants)),
    ]
    for r in report["rows"]:
        g = r["geometry"]
        lines.append(
            f"| {r['shape']} | {r['gemm']} | {r['quant']} | {r['M']} | {r['bytes'] / 1e6:.1f} "
            f"| {r['floor_us']:.1f} | {r['read_us']:.1f} | {r['ceiling']:.2f} | "
            + " | ".join(
                f"{r['kernel_us'][v]:.1f} ({r['kernel_over_read'][v]:.2f})" for v in variants
            )
            + f" | {g['programs']}, {g['words_per_load']}, {'yes' if g['strided'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, required=True, help="moe_kernels.bench output")
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        help="a variant of the bench file whose kernel times to set beside (repeatable; "
        "the first one's rows are the cases)",
    )
    parser.add_argument("--max-m", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True, help="JSON; Markdown beside it")
    args = parser.parse_args(argv)
    if DEVICE == "cpu":
        interpreter_compat.apply()
    bench = read_report(args.bench)
    bandwidth = measure_bandwidth()
    rows = ceiling_rows(bench, args.variant, args.max_m, bandwidth)
    report = {
        **record_header("studies.read_ceiling", argv),
        "method": {
            "copies": COPIES,
            "launches_per_graph": LAUNCHES,
            "replays": REPLAYS,
            "screen_launches": SCREEN_LAUNCHES,
            "screen_replays": SCREEN_REPLAYS,
            "retimed": RETIMED,
            "programs_per_sm": PROGRAMS_PER_SM,
            "words_per_load": WORDS_PER_LOAD,
            "strided": STRIDED,
        },  # fmt: skip
        "bandwidth": bandwidth,
        "bench": str(args.bench),
        "bench_bandwidth": bench["bandwidth"],
        "variants": args.variant,
        "summary": summary(rows),
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(markdown(report))
    for gemm, s in report["summary"].items():
        print(
            f"{gemm}: median ceiling {s['median_ceiling']:.3f}, worst {s['worst_ceiling']:.3f} "
            f"over {s['cases']} cases"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
