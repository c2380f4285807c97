"""Which series have run on a GPU: facts kept beside each series, read, never assumed.

A series base that has served a model, run the kernel tests or run its pull-request
branches' GPU-only tests (``tests/release/gpu_branch_tests.py``) on a GPU lists those runs in
``v<base>/gpu-runs.json``, each naming the committed result file that shows it::

    {"runs": [{"kind": "served", "vllm": "0.21.0", "gpu": "NVIDIA H200", "date": "2026-12-03",
               "series_version": "0.1.0", "result": "provenance/h200-e2e-full-qwen3-30b-a3b.json",
               "what": "served Qwen3-30B-A3B ..."}]}

``result`` is a path under ``kernels/results/``; a test checks every entry against its file
(the GPU, the release, the series version, the outcome).  A base without the file, such as a
new one that ``rebase`` writes, has never run on a GPU, and ``apply`` / ``wheel`` say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import ui
from .errors import UsageError

RUNS_FILE = "gpu-runs.json"
KINDS = {
    "served": "served a model",
    "kernel-tests": "ran the kernel tests",
    "branch-tests": "ran its pull-request branches' GPU tests on their base and on them",
}
# The kinds that ran the whole series; a branch's tests exercise one patch on its own.
WHOLE_SERIES = ("served", "kernel-tests")


@dataclass(frozen=True)
class GpuRun:
    kind: str  # a key of KINDS
    vllm: str  # the release the series was applied to
    gpu: str
    date: str
    series_version: str
    result: str  # under kernels/results/
    what: str = ""

    def describe(self) -> str:
        return (
            f"{KINDS[self.kind]} on an {self.gpu.removeprefix('NVIDIA ')} "
            f"(vLLM {self.vllm}, series {self.series_version}, {self.date})"
        )


def runs(directory: Path) -> list[GpuRun]:
    """The GPU runs recorded for the series in ``directory`` (``patches/v<base>``)."""
    path = Path(directory) / RUNS_FILE
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())["runs"]
        found = [GpuRun(**entry) for entry in entries]
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{path} is not a list of GPU runs; restore it from git") from None
    unknown = sorted({r.kind for r in found} - KINDS.keys())
    if unknown:
        raise UsageError(f"{path}: unknown kind {', '.join(unknown)} (one of {', '.join(KINDS)})")
    return found


def whole_series_runs(directory: Path) -> list[GpuRun]:
    """The runs that exercised the whole series (not one branch's tests)."""
    return [r for r in runs(directory) if r.kind in WHOLE_SERIES]


def summary(directory: Path) -> str:
    """One line: the strongest GPU evidence of a series, or that there is none."""
    found = whole_series_runs(directory)
    if not found:
        return "not run on a GPU yet"
    best = max(found, key=lambda r: (r.kind == "served", r.date))
    return best.describe()


def warn_if_unverified(directory: Path, version: str) -> None:
    """The one line ``apply`` and ``wheel`` print for a series that never ran on a GPU."""
    if not whole_series_runs(directory):
        ui.warn(
            f"the series for vLLM {version} ({Path(directory).name}/) has not run on a GPU yet: "
            "it passes verify and the kernel tests on a CPU only"
        )
