"""The shipped series applies to every supported vLLM release."""

import json
import time

import pytest
from click.testing import CliRunner
from moe_patch import probes, series
from moe_patch.cli import main
from releases import SUPPORTED

pytestmark = [pytest.mark.release, pytest.mark.network]

FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"


@pytest.mark.parametrize("version", SUPPORTED)
def test_series_applies(version, tmp_path):
    into = tmp_path / "tree"
    result = CliRunner().invoke(main, ["apply", "--vllm", version, "--into", str(into), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vllm"] == version and report["ok"]
    statuses = {p["id"]: p["status"] for p in report["patches"]}
    assert statuses["jit-annotations"] in ("applied", "applied (3-way)"), statuses
    found = probes.triton_no_specialize(
        into, FUSED_MOE, "fused_moe_kernel", "EM", "num_valid_tokens"
    )
    assert found.found, found.detail
    compile((into / FUSED_MOE).read_text(), FUSED_MOE, "exec")  # still valid Python


def test_idempotent_on_a_real_tree(tmp_path):
    into = tmp_path / "tree"
    runner = CliRunner()
    first = json.loads(
        runner.invoke(main, ["apply", "--vllm", "0.21.0", "--into", str(into), "--json"]).stdout
    )
    started = time.perf_counter()
    second = json.loads(
        runner.invoke(main, ["apply", "--vllm", "0.21.0", "--into", str(into), "--json"]).stdout
    )
    elapsed = time.perf_counter() - started
    assert second["unchanged"] and second["head"] == first["head"]
    print(f"second apply on a real 0.21.0 tree: {elapsed:.2f} s")


def test_jit_patch_is_recognised_as_upstream_once_applied(release_tree):
    """Re-applying onto an already patched tree reports 'already upstream', not a failure."""
    from moe_patch import applier

    tree = release_tree("0.21.0")
    chosen = series.for_version("0.21.0")
    base = applier.gitutil.run(tree, "rev-parse", "HEAD")
    applier.apply_series(tree, base, "0.21.0", chosen)
    patched = applier.gitutil.run(tree, "rev-parse", "HEAD")
    report = applier.apply_series(tree, patched, "0.21.0", chosen)
    assert [o.status for o in report.outcomes] == ["already upstream"]
