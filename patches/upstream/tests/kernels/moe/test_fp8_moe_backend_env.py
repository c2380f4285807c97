# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VLLM_FP8_MOE_BACKEND names the FP8 MoE backend as --moe-backend does.

Run `pytest tests/kernels/moe/test_fp8_moe_backend_env.py`.
"""

import pytest

import vllm.envs as envs


def test_fp8_moe_backend_env_defaults_to_auto(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VLLM_FP8_MOE_BACKEND", raising=False)
    assert envs.VLLM_FP8_MOE_BACKEND == "auto"


@pytest.mark.parametrize("value", ["triton", "TRITON", "flashinfer_cutlass"])
def test_fp8_moe_backend_env_accepts_moe_backend_names(
    monkeypatch: pytest.MonkeyPatch, value: str
):
    monkeypatch.setenv("VLLM_FP8_MOE_BACKEND", value)
    assert envs.VLLM_FP8_MOE_BACKEND.lower() == value.lower()


def test_fp8_moe_backend_env_rejects_unknown_names(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VLLM_FP8_MOE_BACKEND", "not-a-backend")
    with pytest.raises(ValueError):
        _ = envs.VLLM_FP8_MOE_BACKEND
