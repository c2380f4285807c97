"""The patched engine with the fused decode MoE path: its layer output matches the unfused path's.

GPU tier: needs a CUDA GPU and a staged bundle whose patched wheel has ``fused-decode``
(``python -m moe_e2e.stage``; its directory in ``MOE_E2E_STAGED``, default ~/moe-e2e).
Skipped elsewhere, so never run in CI.  ``moe_e2e.fused_check`` does the work in a fresh
process per engine; this reads its record, and with ``MOE_E2E_RECORDS`` set writes it there
with the machine, the bundle's series and the command, for the results to commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

STAGED = Path(os.environ.get("MOE_E2E_STAGED", "~/moe-e2e")).expanduser()
ROOT = Path(__file__).resolve().parents[2]
# The batches fused_check decodes, and the largest the patch's rule fuses per kind.
BATCHES = {1, 3, 8, 16}
MOST_FUSED = {"fp8-dynamic": 8, "fp8-block": 1}


def _staged() -> dict:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the fused decode path is for Hopper (SM 9.0)")
    if not (STAGED / "staged.json").exists():
        pytest.skip(f"no staged bundle in {STAGED} (python -m moe_e2e.stage)")
    return json.loads((STAGED / "staged.json").read_text())


def _fused_check(staged: dict, kind: str, mode: str, tmp_path: Path) -> dict:
    from moe_e2e.run import variant_env

    env = variant_env(staged, "patched", tmp_path / "caches", None)
    # DeepGEMM would JIT-build the block kind's dense GEMMs with nvcc (minutes, none of them
    # MoE; on the H100 of 2026-12-07 its build failed inside torch.compile's graph).
    env["VLLM_USE_DEEP_GEMM"] = "0"
    out = tmp_path / f"{kind}-{mode}.json"
    done = subprocess.run(
        [sys.executable, "-m", "moe_e2e.fused_check", "--kind", kind, "--mode", mode]
        + ["--out", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.exists() or done.returncode == 0, done.stderr[-4000:]
    return {"returncode": done.returncode, "tail": done.stdout[-2000:] + done.stderr[-4000:]}


def _keep(record: dict, staged: dict, kind: str, mode: str) -> None:
    folder = os.environ.get("MOE_E2E_RECORDS")
    if not folder:
        return
    from moe_e2e.run import environment

    site = str(Path(staged["sites"]["patched"]).resolve())
    kept = {
        "command": f"MOE_E2E_RECORDS=$OUT pytest {Path(__file__).relative_to(ROOT)} -k "
        f"'{mode} and {kind}'",
        "series_version": staged["series_version"],
        "series_commit": staged.get("series_commit"),
        "environment": environment(),
        **record,
        "vllm_path": record["vllm_path"].replace(site, "<site-packages>"),
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{kind}-{mode}.json").write_text(json.dumps(kept, indent=1) + "\n")


@pytest.mark.parametrize("kind", ["fp8-dynamic", "fp8-block"])
@pytest.mark.parametrize("mode", ["eager", "graphs"])
def test_fused_decode_layer_matches_the_unfused_path(kind, mode, tmp_path):
    staged = _staged()
    from moe_e2e.fused_check import LAYER_BOUND, PATH_BOUND

    run = _fused_check(staged, kind, mode, tmp_path)
    record_path = tmp_path / f"{kind}-{mode}.json"
    assert record_path.exists(), run["tail"]
    record = json.loads(record_path.read_text())
    _keep(record, staged, kind, mode)
    assert record["failures"] == [] and run["returncode"] == 0, record["failures"] or run["tail"]
    assert Path(record["vllm_path"]).parent.parent.resolve() == (
        Path(staged["sites"]["patched"]).resolve()
    )
    summary = record["summary"]
    fused_sizes = {int(tokens) for tokens in record["fused_tokens"]}
    assert summary["fused_calls"] > 0 and max(fused_sizes) <= MOST_FUSED[kind]
    if mode == "eager":
        # every decode batch the rule admits was taken, and checked
        assert {b for b in BATCHES if b <= MOST_FUSED[kind]} <= fused_sizes
        assert summary["checked"] == summary["fused_calls"]
        assert summary["max_fused_vs_float64"] < LAYER_BOUND
        assert summary["max_unfused_vs_float64"] < LAYER_BOUND
        assert summary["max_fused_vs_unfused"] < PATH_BOUND
    else:
        assert record["calls_after_startup"] > 0  # captured into the CUDA graphs
        # capture compiled every variant the served batches need (eager engines still
        # compile them on their first decode steps: recorded, not held)
        assert record["fused_kernels_compiled_while_serving"] == []
