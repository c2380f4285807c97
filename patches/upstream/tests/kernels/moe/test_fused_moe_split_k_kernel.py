# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""fused_moe_kernel honours a config's SPLIT_K for FP8 W8A8: the K loop is split
over grid axis 1 and the partial tiles are added atomically, and the layer is as
accurate against a float32 reference as with the unsplit kernel (per-tensor and
128x128-block scales).

Run `pytest tests/kernels/moe/test_fused_moe_split_k_kernel.py`.
"""

import pytest
import torch
import torch.nn.functional as F

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


def _dequantize(w: torch.Tensor, scale: torch.Tensor, block: bool) -> torch.Tensor:
    if block:
        return w.float() * scale.repeat_interleave(128, 1).repeat_interleave(128, 2)
    return w.float() * scale.view(-1, 1, 1)


def _reference(a, w1, w2, score, topk):
    """The layer in float32 from dequantized weights and unquantized activations."""
    weights, ids = torch.topk(torch.softmax(score.float(), dim=-1), topk)
    out = torch.zeros(a.shape, dtype=torch.float32, device=a.device)
    for t in range(a.shape[0]):
        for weight, e in zip(weights[t], ids[t]):
            gate, up = (w1[e] @ a[t].float()).chunk(2)
            out[t] += weight * (w2[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("block", [False, True], ids=["per-tensor", "block"])
@pytest.mark.parametrize("m", [1, 4])
@torch.inference_mode()
def test_split_k_is_as_accurate_as_the_unsplit_kernel(
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
    reference = _reference(
        a,
        _dequantize(w1, w1_scale, block),
        _dequantize(w2, w2_scale, block),
        score,
        topk,
    )
    error = {
        split_k: ((out.float() - reference).norm() / reference.norm()).item()
        for split_k, out in outputs.items()
    }
    # Both runs quantize the intermediate to FP8: the split's other rounding of the
    # first GEMM moves some of its values by one FP8 step, so the two outputs differ
    # element by element by more than bf16 would; the split must be as accurate.
    assert error[1] < 0.1, error
    assert error[4] < 1.2 * error[1], error
