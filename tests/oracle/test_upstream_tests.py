"""The tests the series' pull requests add to vLLM (``Upstream-Test``), run inside the
patched release tree with the release's own Python dependencies, as vLLM's CI would run
them there.  Those that need Triton are left to a GPU machine: vLLM without a CUDA
platform replaces ``triton.jit`` with a placeholder, which has no JIT attributes.
"""

from __future__ import annotations

import os
import subprocess

from moe_patch import series
from moe_patch.upstreaming import upstreaming

NEEDS_TRITON = {"tests/kernels/moe/test_fused_moe_jit_specialization.py"}


def test_the_series_upstream_tests_pass_in_the_patched_tree(oracle, tmp_path):
    tests = {
        path: text
        for patch in series.for_version(oracle.version).patches
        for path, text in upstreaming(patch).tests.items()
        if path not in NEEDS_TRITON
    }
    assert tests, f"no CPU-runnable Upstream-Test in the series for {oracle.version}"
    tree = oracle.trees["patched"]
    for path, text in tests.items():  # where the pull request puts them
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON", "CUDA_"))
    }
    environ.update(PYTHONPATH=str(tree), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [str(oracle.env.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"{summary}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert " passed" in summary and "skipped" not in summary, summary
