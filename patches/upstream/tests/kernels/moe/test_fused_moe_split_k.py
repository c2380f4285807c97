# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""split_k_for: a tuned config's SPLIT_K splits fused_moe_kernel's K loop only for
FP8 W8A8, and only while the GEMM's grid is smaller than the GPU.
pipeline_depth_for: a Swap-AB launch pipelines its K loop over no more stages
than the loop has steps.

Run `pytest tests/kernels/moe/test_fused_moe_split_k.py`.
"""

import pytest
import torch

from vllm.model_executor.layers.fused_moe import fused_moe

SM_COUNT = 132
DEVICE = torch.device("cpu")


@pytest.fixture(autouse=True)
def _sm_count(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(
        fused_moe.current_platform,
        "num_compute_units",
        lambda device_id=0: SM_COUNT,
        raising=False,
    )


@pytest.mark.parametrize("split_k", [2, 4])
def test_split_k_while_the_grid_is_smaller_than_the_gpu(split_k: int):
    assert fused_moe.split_k_for(True, split_k, SM_COUNT - 1, DEVICE) == split_k
    assert fused_moe.split_k_for(True, split_k, SM_COUNT, DEVICE) == 1


@pytest.mark.parametrize("programs", [1, SM_COUNT - 1])
def test_no_split_k_without_fp8_or_without_asking(programs: int):
    assert fused_moe.split_k_for(False, 4, programs, DEVICE) == 1
    assert fused_moe.split_k_for(True, 1, programs, DEVICE) == 1


def test_pipeline_no_deeper_than_the_k_loop():
    # DeepSeek-V3's second GEMM at TP8: K = 256, two 128-deep steps
    assert fused_moe.pipeline_depth_for(4, 256, 128, 1) == 2
    # its first GEMM keeps the tuned depth, even split four ways
    assert fused_moe.pipeline_depth_for(4, 7168, 128, 4) == 4


def test_pipeline_depth_counts_scale_blocks_and_keeps_two_stages():
    assert fused_moe.pipeline_depth_for(4, 768, 256, 1) == 3
    assert fused_moe.pipeline_depth_for(4, 768, 256, 1, [128, 128]) == 4
    assert fused_moe.pipeline_depth_for(3, 128, 128, 1) == 2
