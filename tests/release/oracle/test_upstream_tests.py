"""The tests the series' pull requests add to vLLM (``Upstream-Test``), run inside the
patched release tree with the release's own Python dependencies, as ``moe-patch pr`` runs
them (:mod:`moe_patch.pr_tests`: the tree first on ``PYTHONPATH``, ``CUDA_VISIBLE_DEVICES``
empty so that vLLM keeps the real Triton).  A kernel test that needs a GPU skips itself
without one and says so; every other one must pass here.
"""

from __future__ import annotations

import re

import pytest
from moe_patch import pr_tests, series
from moe_patch.upstreaming import upstreaming

pytestmark = [pytest.mark.release, pytest.mark.network]  # the oracle fixture downloads trees

# The kernel tests that run the new kernels themselves; every other file runs on a CPU.
GPU_ONLY = {
    "tests/kernels/moe/test_fused_moe_split_k_kernel.py",
    "tests/kernels/moe/test_fused_moe_decode.py",
}
GPU_REASON = re.compile(r"\bGPU\b|\bHopper\b|\bSM \d")


def test_the_series_upstream_tests_pass_in_the_patched_tree(oracle):
    tests = {
        path: text
        for patch in series.for_version(oracle.version).patches
        for path, text in upstreaming(patch).tests.items()
    }
    assert tests, f"no Upstream-Test in the series for {oracle.version}"
    tree = oracle.trees["patched"]
    for path, text in tests.items():  # where the pull requests put them
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    python = pr_tests.Python(str(oracle.env.python), "the oracle environment", gpu=False)
    run = pr_tests.run_tests(tree, python, sorted(tests))
    assert run.files, run.problem
    for path, result in run.files.items():
        assert result.failed == 0, f"{path}: {result.problem}"
        if not result.passed:  # a GPU-only kernel test: skipped, with a reason naming the GPU
            assert path in GPU_ONLY, (path, result)
            assert result.skipped and GPU_REASON.search(result.skip_reason), (path, result)
