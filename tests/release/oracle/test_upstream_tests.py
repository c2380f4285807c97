"""The tests the series' pull requests add to vLLM (``Upstream-Test``), run inside the
patched release tree with the release's own Python dependencies, as ``moe-patch pr`` runs
them (:mod:`moe_patch.pr_tests`: the tree first on ``PYTHONPATH``, ``CUDA_VISIBLE_DEVICES``
empty so that vLLM keeps the real Triton).  A test file that needs a GPU skips itself
without one and says so; every other one must pass here.
"""

from __future__ import annotations

import pytest
from moe_patch import pr_tests, series
from moe_patch.upstreaming import upstreaming

pytestmark = [pytest.mark.release, pytest.mark.network]  # the oracle fixture downloads trees


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
    cpu = []
    for path, result in run.files.items():
        assert result.failed == 0, f"{path}: {result.problem}"
        if result.passed:
            cpu.append(path)
        else:  # a GPU-only file: skipped, with a reason naming the GPU
            assert result.skipped and "GPU" in result.skip_reason, (path, result)
    assert len(cpu) >= len(tests) - 1, cpu  # all but the kernel test run on a CPU
