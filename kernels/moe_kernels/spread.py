"""One benchmark over several GPUs of one host: ``python -m moe_kernels.bench --gpus 0,1,2,3``.

Each weight set (a shape, GEMM and quantisation: the unit bench builds weights for) runs in a
bench process of its own on one GPU, the next one starting on whichever GPU is free, so a run
over many shapes takes about the total time over the GPU count.  Every case is still timed on
one GPU with all its variants taking turns, so a difference between the GPUs moves no ratio
(each row says which GPU timed it).  Each process writes its part beside ``--out``
(``<out>.parts/``), resumable as any bench file; ``--out`` is the parts merged, rewritten
whenever a process ends, so a run cut short by a device call's limit keeps what finished and
continues with ``--resume``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .measure import command_line, series_version, write_report

KERNELS_DIR = Path(__file__).resolve().parents[1]


def weight_sets(shapes: list[str], gemms: list[str], quants: list[str]) -> list[tuple]:
    """The units that run in one process each, the whole-layer ones first (the longest, so
    the GPUs finish close together)."""
    units = [(s, g, q) for s in shapes for g in gemms for q in quants]
    return sorted(units, key=lambda unit: unit[1] != "layer")


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def part_path(out: Path, unit: tuple) -> Path:
    return parts_dir(out) / ("-".join(unit) + ".json")


def child_command(args, unit: tuple, seed: int, part: Path, stop_after: float | None) -> list:
    shape, gemm, quant = unit
    command = [sys.executable, "-m", "moe_kernels.bench"]
    command += [f"--tree={tree}" for tree in args.tree]
    command += ["--shape", shape, "--gemm", gemm, "--quant", quant, "--M", args.M]
    command += ["--routings", str(args.routings), "--seed", str(seed)]
    command += ["--out", str(part), "--resume"]
    if args.graph_us:
        command += ["--graph-us", str(args.graph_us)]
    if stop_after is not None:
        command += ["--stop-after", f"{max(stop_after, 0.0):.0f}"]
    return command


def earlier_seed(out: Path) -> int | None:
    """The seed a cut-short run used: from its merged file, else from any part."""
    for path in [out, *sorted(parts_dir(out).glob("*.json"))]:
        try:
            return json.loads(path.read_text())["method"]["seed"]
        except (OSError, ValueError, KeyError):
            continue
    return None


def seed_parts(out: Path, units: list[tuple]) -> None:
    """A unit with no part yet starts from the rows ``--out`` already holds for it (a file
    written without ``--gpus``, or parts lost), so resuming measures only what is missing."""
    try:
        earlier = json.loads(out.read_text())
    except (OSError, ValueError):
        return
    for unit in units:
        part = part_path(out, unit)
        rows = [r for r in earlier.get("rows", []) if (r["shape"], r["gemm"], r["quant"]) == unit]
        if rows and not part.exists():
            write_report(part, {**earlier, "rows": rows})


def merge(out: Path, units: list[tuple], argv: list[str] | None) -> dict | None:
    """``--out`` from the parts so far, in the units' order; None while none has rows."""
    parts = []
    for unit in units:
        try:
            parts.append(json.loads(part_path(out, unit).read_text()))
        except (OSError, ValueError):
            continue
    parts = [p for p in parts if p.get("rows")]
    if not parts:
        return None
    per_gpu = {}
    for part in parts:
        for row in part["rows"]:
            per_gpu.setdefault(row.get("gpu"), part["bandwidth"])
    bandwidth = {
        key: statistics.median(bw[key] for bw in per_gpu.values())
        for key in ("read_gbps", "copy_gbps")
    }
    report = {  # not measure.record_header: this process leaves the GPUs to the parts
        "command": command_line("moe_kernels.bench", argv),
        "series_version": series_version(),
        "environment": parts[0]["environment"],
        "method": {**parts[0]["method"], "gpus": sorted(str(g) for g in per_gpu)},
        # Each row's floor is over its own GPU's bandwidth; the header gives their median.
        "bandwidth": {**bandwidth, "per_gpu": {str(g): bw for g, bw in per_gpu.items()}},
        "variants": parts[0]["variants"],
        "rows": [row for part in parts for row in part["rows"]],
    }
    write_report(out, report)
    return report


def run(args, argv: list[str] | None, units: list[tuple], seed: int, gpus: list[str]) -> int:
    """Run ``units`` over ``gpus``; bench's exit code (1: a wrong result, 3: left for
    --resume by --stop-after)."""
    out = args.out
    if not args.resume:
        shutil.rmtree(parts_dir(out), ignore_errors=True)
    parts_dir(out).mkdir(parents=True, exist_ok=True)
    if args.resume:
        seed_parts(out, units)
    began = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KERNELS_DIR), env.get("PYTHONPATH")]))
    queue = list(units)
    running: dict[str, tuple[subprocess.Popen, tuple]] = {}
    codes = []
    while queue or running:
        left = None if args.stop_after is None else args.stop_after - (time.monotonic() - began)
        for gpu in gpus:
            if gpu in running or not queue or (left is not None and left <= 0):
                continue
            unit = queue.pop(0)
            command = child_command(args, unit, seed, part_path(out, unit), left)
            running[gpu] = (
                subprocess.Popen(command, env={**env, "CUDA_VISIBLE_DEVICES": gpu}),
                unit,
            )
        if not running:  # --stop-after passed with units not started
            codes.append(3)
            break
        time.sleep(0.5)
        for gpu, (proc, _unit) in list(running.items()):
            if proc.poll() is not None:
                codes.append(proc.returncode)
                del running[gpu]
                merge(out, units, argv)
    merge(out, units, argv)
    if any(code not in (0, 3) for code in codes):
        return 1
    return 3 if 3 in codes or queue else 0
