# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""fused_moe_kernel honours a config's SPLIT_K for FP8 W8A8: the K loop is split
over grid axis 1 and the partial tiles are added atomically, giving the output of
the unsplit kernel (per-tensor and 128x128-block scales).

Run `pytest tests/kernels/moe/test_fused_moe_split_k_kernel.py`.
"""

import pytest
import torch

from tests.kernels.moe.utils import fused_moe
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe import fused_moe as fused_moe_module
from vllm.model_executor.layers.fused_moe import override_config
from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
from vllm.platforms import current_platform

if not (current_platform.is_cuda() and current_platform.has_device_capability(89)):
    pytest.skip("FP8 fused MoE needs an NVIDIA GPU with FP8", allow_module_level=True)

FP8 = torch.float8_e4m3fn
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


class _SplitKSpy:
    """fused_moe_kernel, recording the SPLIT_K of each launch."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.split_k: list[int] = []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.split_k.append(kwargs.get("SPLIT_K", 1))
            return launch(*args, **kwargs)

        return run


def _weights(e: int, n: int, k: int, block: bool):
    w = ((torch.rand((e, n, k), device="cuda") - 0.5) * 2 * 448).to(FP8)
    if block:
        scale = torch.rand((e, n // 128, k // 128), device="cuda") * 1e-2
    else:
        scale = torch.rand((e,), device="cuda") * 1e-2
    return w, scale


@pytest.mark.parametrize("block", [False, True], ids=["per-tensor", "block"])
@pytest.mark.parametrize("m", [1, 4])
@torch.inference_mode()
def test_split_k_matches_the_unsplit_kernel(
    monkeypatch: pytest.MonkeyPatch, block: bool, m: int
):
    torch.manual_seed(0)
    e, topk, hidden, intermediate = 8, 2, 2048, 256
    a = torch.randn((m, hidden), device="cuda", dtype=torch.bfloat16) / 10
    w1, w1_scale = _weights(e, 2 * intermediate, hidden, block)
    w2, w2_scale = _weights(e, hidden, intermediate, block)
    score = torch.randn((m, e), device="cuda", dtype=torch.bfloat16)
    quant_config = fp8_w8a8_moe_quant_config(
        w1_scale=w1_scale,
        w2_scale=w2_scale,
        block_shape=[128, 128] if block else None,
    )
    spy = _SplitKSpy(fused_moe_module.fused_moe_kernel)
    monkeypatch.setattr(fused_moe_module, "fused_moe_kernel", spy)
    outputs = {}
    with set_current_vllm_config(VllmConfig()):
        for split_k in (1, 4):
            with override_config({**CONFIG, "SPLIT_K": split_k}):
                outputs[split_k] = fused_moe(
                    a, w1, w2, score, topk, quant_config=quant_config
                )
    # The first GEMM's grid (a few experts x 512 / 64 programs) is smaller than
    # the GPU, so the second pass split it.
    assert 4 in spy.split_k[2:]
    torch.testing.assert_close(outputs[4], outputs[1], atol=2e-2, rtol=2e-2)
