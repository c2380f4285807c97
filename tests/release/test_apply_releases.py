"""The shipped series applies to every supported vLLM release."""

import ast
import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from moe_patch import probes, series
from moe_patch.cli import main
from packaging.version import Version
from releases import SUPPORTED

pytestmark = [pytest.mark.release, pytest.mark.network]

FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
FP8_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/fp8.py"
ENVS = "vllm/envs.py"


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
    # Swap-AB: ours (with split-K) on 0.20 … 0.24; from 0.25 on upstream has its own,
    # and the v0.25.0 series adds split-K and the H200 tables on top of it instead.
    if Version(version) >= Version("0.25.0"):
        assert "swap-ab" not in statuses, statuses
        for patch_id in ("swap-ab-split-k", "split-k-launch-rules", "h200-fp8-moe-configs"):
            assert statuses[patch_id] in ("applied", "applied (3-way)"), statuses
    else:
        assert statuses["swap-ab"] == "applied", statuses
        assert "swap-ab-split-k" not in statuses, statuses
    assert probes.kernel_param(into, FUSED_MOE, "fused_moe_kernel", "SWAP_AB").found
    assert "def split_k_for(" in (into / FUSED_MOE).read_text()
    assert statuses["backend-selector"] in ("applied", "applied (3-way)"), statuses
    assert statuses["fp8-moe-backend-env"] in ("applied", "applied (3-way)"), statuses
    check_backend_selector(into)


def check_backend_selector(tree):
    """The variable is declared the way vllm/envs.py declares its variables, the
    oracle has the Hopper policy, and the tree's own ruff configuration finds
    nothing in the touched files that it does not find in the release's."""
    envs = ast.parse((tree / ENVS).read_text())
    annotated = {
        node.target.id
        for block in envs.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    assert "VLLM_FP8_MOE_BACKEND" in annotated
    [table] = [
        node.value
        for node in envs.body
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "environment_variables"
    ]
    keys = {k.value for k in table.keys if isinstance(k, ast.Constant)}
    assert "VLLM_FP8_MOE_BACKEND" in keys
    oracle = ast.parse((tree / FP8_ORACLE).read_text())
    functions = {n.name for n in oracle.body if isinstance(n, ast.FunctionDef)}
    assert {"_hopper_fp8_prefers_triton", "_requested_fp8_moe_backend"} <= functions

    release = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[0]
    for path in (ENVS, FP8_ORACLE):
        before = subprocess.run(
            ["git", "show", f"{release}:{path}"], cwd=tree, check=True, capture_output=True
        ).stdout
        after = (tree / path).read_bytes()
        assert _ruff_findings(tree, path, after) <= _ruff_findings(tree, path, before), path
        if _ruff_formatted(tree, path, before):
            assert _ruff_formatted(tree, path, after), f"{path} is not ruff-formatted"


def _ruff(tree, args, source: bytes):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=tree, input=source, capture_output=True
    )


def _ruff_findings(tree, path, source: bytes) -> set[tuple[str, str]]:
    done = _ruff(tree, ["check", "--output-format", "json", "--stdin-filename", path], source)
    return {(f["code"], f["message"]) for f in json.loads(done.stdout)}


def _ruff_formatted(tree, path, source: bytes) -> bool:
    return _ruff(tree, ["format", "--check", "--stdin-filename", path], source).returncode == 0


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


@pytest.mark.parametrize("version", ["0.21.0", "0.33.0", "0.34.0"])  # one release per series
def test_jit_patch_is_recognised_as_upstream_once_applied(release_tree, version):
    """Re-applying onto an already patched tree reports 'already upstream', not a failure
    (each patch's context must survive the patches after it; on 0.33.0 triton-moe-warmup
    is merged 3-way and is recognised by the commit the first run made)."""
    from moe_patch import applier

    tree = release_tree(version)
    chosen = series.for_version(version)
    base = applier.gitutil.run(tree, "rev-parse", "HEAD")
    applier.apply_series(tree, base, version, chosen)
    patched = applier.gitutil.run(tree, "rev-parse", "HEAD")
    report = applier.apply_series(tree, patched, version, chosen)
    assert [o.status for o in report.outcomes] == ["already upstream"] * len(chosen.patches)
