# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""FP8 MoE backend priority on Hopper: without expert parallelism, per-tensor,
per-channel and 128x128-block FP8 try the Triton fused-MoE kernels first; with
expert parallelism, and on other GPUs, vLLM's order is unchanged.

Run `pytest tests/kernels/moe/test_fp8_moe_hopper_priority.py`.
"""

import dataclasses
from types import SimpleNamespace

import pytest

from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig
from vllm.model_executor.layers.fused_moe.oracle import fp8
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8Dynamic128Sym,
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8Static128BlockSym,
    kFp8StaticChannelSym,
    kFp8StaticTensorSym,
)

# (weight scales, activation scales) of the FP8 checkpoints the rule covers.
SCHEMES = {
    "per-tensor static": (kFp8StaticTensorSym, kFp8StaticTensorSym),
    "per-tensor dynamic": (kFp8StaticTensorSym, kFp8DynamicTensorSym),
    "per-channel": (kFp8StaticChannelSym, kFp8DynamicTokenSym),
    "block": (kFp8Static128BlockSym, kFp8Dynamic128Sym),
}


def _gpu(monkeypatch: pytest.MonkeyPatch, capability: int) -> None:
    platform = fp8.current_platform
    answers = {
        "is_cuda": lambda: True,
        "is_rocm": lambda: False,
        "is_xpu": lambda: False,
        "is_cpu": lambda: False,
        "is_device_capability": lambda c: c == capability,
        "is_device_capability_family": lambda c: c // 10 == capability // 10,
    }
    for name, answer in answers.items():
        monkeypatch.setattr(platform, name, answer, raising=False)


def _moe_config(ep_size: int):
    parallel = FusedMoEParallelConfig.make_no_parallel()
    if ep_size > 1:
        parallel = dataclasses.replace(parallel, ep_size=ep_size, use_ep=True)
    return SimpleNamespace(moe_parallel_config=parallel)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_hopper_without_ep_tries_triton_first(
    monkeypatch: pytest.MonkeyPatch, scheme: str
):
    _gpu(monkeypatch, 90)
    backends = fp8._get_priority_backends(_moe_config(1), *SCHEMES[scheme])
    assert backends[0] == fp8.Fp8MoeBackend.TRITON


@pytest.mark.parametrize("scheme", ["per-tensor static", "per-channel"])
def test_expert_parallel_and_blackwell_keep_the_order(
    monkeypatch: pytest.MonkeyPatch, scheme: str
):
    _gpu(monkeypatch, 90)
    with_ep = fp8._get_priority_backends(_moe_config(2), *SCHEMES[scheme])
    assert with_ep[0] != fp8.Fp8MoeBackend.TRITON
    _gpu(monkeypatch, 100)
    blackwell = fp8._get_priority_backends(_moe_config(1), *SCHEMES[scheme])
    assert blackwell[0] != fp8.Fp8MoeBackend.TRITON
