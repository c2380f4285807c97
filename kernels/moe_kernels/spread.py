"""One run over several GPUs of one host: ``bench --gpus 0,1,2,3`` and ``tune --gpus ...``.

A run splits into units that share their weights (bench: a shape, GEMM and quantisation;
tune: a shape and quantisation); each unit runs in a process of its own (the same module with
the unit's arguments and ``--resume``) on one GPU, the next unit starting on whichever GPU is
free, so a long run takes about its total time over the GPU count.  Every case is still timed
on one GPU, its variants or candidates taking turns there, so a difference between the GPUs
moves no ratio (each row names its GPU).  Each process writes its part beside ``--out``
(``<out>.parts/``), resumable as any result file of the module; ``--out`` is the parts merged,
rewritten whenever a process ends, so a run cut short by a device call's limit keeps what
finished and continues with ``--resume``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .measure import command_line, write_report
from .resultfile import read_report

KERNELS_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Job:
    """What spreading one module's run needs to know of the module."""

    module: str  # e.g. "moe_kernels.bench"
    out: Path
    units: list[tuple]
    rows_key: str  # the result file's list of measurements: "rows" (bench), "results" (tune)
    fields: tuple[str, ...]  # a row's fields that name its unit, in the unit's order
    arguments: Callable[[tuple], list[str]]  # a unit's own arguments, without --out


def add_arguments(parser, unit: str, what: str) -> None:
    """``--stop-after`` and ``--gpus`` as bench and tune take them (``unit``: what one process
    runs; ``what``: what --stop-after stops starting)."""
    parser.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"start no {what} after SECONDS (a device call's limit); the rest runs with "
        "--resume (exit code 3)",
    )
    parser.add_argument(
        "--gpus",
        default=None,
        help=f"GPU ids of this host (e.g. 0,1,2,3): each {unit} in a process of its own on "
        "the next free GPU (moe_kernels.spread)",
    )


def gpu_ids(parser, args) -> list[str]:
    """``--gpus`` as a list (empty: not spread); a parser error for a malformed one."""
    gpus = [g.strip() for g in (args.gpus or "").split(",") if g.strip()]
    if args.gpus is not None and (not gpus or len(set(gpus)) != len(gpus)):
        parser.error(f"--gpus takes distinct GPU ids, comma-separated, not {args.gpus!r}")
    return gpus


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def part_path(out: Path, unit: tuple) -> Path:
    return parts_dir(out) / ("-".join(map(str, unit)) + ".json")


def earlier_seed(out: Path) -> int | None:
    """The seed a cut-short run used: from its merged file, else from any part."""
    for path in [out, *sorted(parts_dir(out).glob("*.json"))]:
        try:
            return read_report(path)["method"]["seed"]
        except (OSError, ValueError, KeyError):
            continue
    return None


def run_seed(args, gpus: list[str]) -> int:
    """The seed a run uses: ``--seed`` or the resumed file's, else (spread, cut short before
    any part was merged) a part's, else the time."""
    seed = args.seed
    if seed is None and gpus and args.resume:
        seed = earlier_seed(args.out)
    return seed if seed is not None else int(time.time())


def unit_of(job: Job, row: dict) -> tuple:
    return tuple(row[field] for field in job.fields)


def seed_parts(job: Job) -> None:
    """A unit with no part yet starts from the rows ``--out`` already holds for it (a file
    written without ``--gpus``, or parts lost), so resuming measures only what is missing."""
    try:
        earlier = read_report(job.out)
    except (OSError, ValueError):
        return
    for unit in job.units:
        part = part_path(job.out, unit)
        rows = [r for r in earlier.get(job.rows_key, []) if unit_of(job, r) == unit]
        if rows and not part.exists():
            write_report(part, {**earlier, job.rows_key: rows})


def merge(job: Job, argv: list[str] | None) -> dict | None:
    """``--out`` from the parts so far, in the units' order; None while none has rows."""
    parts = []
    for unit in job.units:
        try:
            parts.append(read_report(part_path(job.out, unit)))
        except (OSError, ValueError):
            continue
    parts = [p for p in parts if p.get(job.rows_key)]
    if not parts:
        return None
    per_gpu = {}
    for part in parts:
        for row in part[job.rows_key]:
            per_gpu.setdefault(str(row.get("gpu")), part["bandwidth"])
    report = {  # not measure.record_header: this process leaves the GPUs to the parts
        **parts[0],
        "command": command_line(job.module, argv),
        "method": {**parts[0]["method"], "gpus": sorted(per_gpu)},
        # Each row's floor is over its own GPU's bandwidth; the header gives their median.
        "bandwidth": {
            **{
                key: statistics.median(bw[key] for bw in per_gpu.values())
                for key in ("read_gbps", "copy_gbps")
            },
            "per_gpu": per_gpu,
        },
        job.rows_key: [row for part in parts for row in part[job.rows_key]],
    }
    write_report(job.out, report)
    return report


def run(
    job: Job, gpus: list[str], resume: bool, stop_after: float | None, argv: list[str] | None
) -> int:
    """Run ``job``'s units over ``gpus``; the module's exit code (1: a process failed or
    found a wrong result, 3: left for --resume by ``stop_after``)."""
    if not resume:
        shutil.rmtree(parts_dir(job.out), ignore_errors=True)
    parts_dir(job.out).mkdir(parents=True, exist_ok=True)
    if resume:
        seed_parts(job)
    began = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KERNELS_DIR), env.get("PYTHONPATH")]))
    queue = list(job.units)
    running: dict[str, subprocess.Popen] = {}
    codes = []
    while queue or running:
        left = None if stop_after is None else stop_after - (time.monotonic() - began)
        for gpu in gpus:
            if gpu in running or not queue or (left is not None and left <= 0):
                continue
            unit = queue.pop(0)
            command = [sys.executable, "-m", job.module, *job.arguments(unit)]
            command += ["--out", str(part_path(job.out, unit)), "--resume"]
            if left is not None:
                command += ["--stop-after", f"{left:.0f}"]
            running[gpu] = subprocess.Popen(command, env={**env, "CUDA_VISIBLE_DEVICES": gpu})
        if not running:  # stop_after passed with units not started
            codes.append(3)
            break
        time.sleep(0.5)
        for gpu, proc in list(running.items()):
            if proc.poll() is not None:
                codes.append(proc.returncode)
                del running[gpu]
                merge(job, argv)
    merge(job, argv)
    if any(code not in (0, 3) for code in codes):
        return 1
    return 3 if 3 in codes or queue else 0
