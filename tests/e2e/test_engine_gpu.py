"""The patched wheel serves: a vLLM engine from it starts on a small FP8 MoE model and generates.

GPU tier: needs a CUDA GPU and a staged bundle (``python -m moe_e2e.stage``; its directory in
``MOE_E2E_STAGED``, default ~/moe-e2e).  Skipped elsewhere, so never run in CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

STAGED = Path(os.environ.get("MOE_E2E_STAGED", "~/moe-e2e")).expanduser()
TOKENS = 24


def _staged() -> dict:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not (STAGED / "staged.json").exists():
        pytest.skip(f"no staged bundle in {STAGED} (python -m moe_e2e.stage)")
    return json.loads((STAGED / "staged.json").read_text())


@pytest.mark.parametrize("kind", ["fp8-static", "fp8-block"])
def test_patched_engine_generates_on_triton(kind, tmp_path):
    """Per-tensor static FP8 is served with ``--routing distinct`` too (one engine fewer on
    the GPU): vLLM loads moe_e2e's strategy in its engine processes and routes with it."""
    from moe_e2e.run import DEFAULT_SPEC, ROUTINGS, run_variant

    staged = _staged()
    routing = "distinct" if kind == "fp8-static" else "model"
    env = dict(ROUTINGS[routing])
    if kind == "fp8-block":
        # DeepGEMM's warm-up JIT-builds ~600 GEMM shapes for the block kind's dense layers
        # (minutes, none of them MoE): this test is about serving, not start-up.
        env["VLLM_DEEP_GEMM_WARMUP"] = "skip"
    variant = {
        "name": f"tiny-{kind}-patched",
        "model": "tiny-qwen3-moe",
        "kind": kind,
        "wheel": "patched",
        "env": env,
    }
    spec = {
        **DEFAULT_SPEC,
        "max_model_len": 1024,
        "max_num_seqs": 8,
        "gpu_memory_utilization": 0.3,
        "smoke": TOKENS,
        "routing": routing,
    }
    record = run_variant(staged, variant, spec, tmp_path, timeout=600)

    assert record["returncode"] == 0, "\n".join(record.get("error_tail", []))
    result = record["result"]
    assert result["vllm_version"] == staged["patched_wheel"]["version"]
    assert Path(result["vllm_path"]).parent.resolve() == Path(staged["sites"]["patched"]).resolve()
    assert result["smoke_tokens"] == TOKENS
    # The backend the engine chose, in its own words: the selector's Hopper rule names Triton.
    assert record["moe_backend"] == "TRITON"
    assert "tries TRITON first" in (record["moe_backend_reason"] or "")
    # triton-moe-warmup compiled the MoE launch configs before serving, so none compiled after.
    assert record.get("triton_moe_warmup_s") is not None, "no triton-moe-warmup line in the log"
    assert "fused_moe_kernel" not in record.get("jit_during_inference", [])
    log = (tmp_path / record["log"]).read_text()
    simulated = "Simulating MoE routing using a moe_e2e_distinct strategy" in log
    assert simulated == (routing == "distinct")
