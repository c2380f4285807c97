# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""split_k_for: a config's SPLIT_K splits fused_moe_kernel's K loop only for FP8
W8A8, and only while the GEMM's grid is smaller than the GPU, or up to half as large
again with a K loop long enough for every slice.
default_config_split_k: without a tuned table, FP8 MoE on Hopper offers the same split.
split_k_to_fill: a tuned entry that names no SPLIT_K splits only a Swap-AB grid
smaller than the GPU.
pipeline_depth_for: a Swap-AB launch pipelines its K loop over no more stages
than the loop has steps.
resident_depth_for: a Swap-AB grid slightly larger than what the SMs hold at once
trades pipeline stages for one resident round.

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


# K steps of a long loop (DeepSeek-V3's first GEMM: K = 7168, 56 steps of 128) and
# of a short one (MiniMax-M2's second GEMM at TP4: K = 384, 3 steps).
LONG_K, SHORT_K = 56, 3


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("k_steps", [SHORT_K, LONG_K])
def test_split_k_while_the_grid_is_smaller_than_the_gpu(split_k: int, k_steps: int):
    assert (
        fused_moe.split_k_for(True, split_k, SM_COUNT - 1, k_steps, DEVICE) == split_k
    )
    assert fused_moe.split_k_for(True, split_k, 2 * SM_COUNT, k_steps, DEVICE) == 1


def test_an_unevenly_loaded_grid_splits_only_a_long_k_loop():
    uneven = SM_COUNT + SM_COUNT // 2 - 1  # a third of the SMs run two programs
    assert fused_moe.split_k_for(True, 4, uneven, LONG_K, DEVICE) == 4
    assert fused_moe.split_k_for(True, 4, uneven, SHORT_K, DEVICE) == 1
    steps = fused_moe.SPLIT_K_MIN_SLICE_STEPS * 4
    assert fused_moe.split_k_for(True, 4, SM_COUNT, steps, DEVICE) == 4
    assert fused_moe.split_k_for(True, 4, SM_COUNT, steps - 1, DEVICE) == 1
    assert fused_moe.split_k_for(True, 4, SM_COUNT * 3 // 2, LONG_K, DEVICE) == 1


@pytest.mark.parametrize("programs", [1, SM_COUNT - 1])
def test_no_split_k_without_fp8_or_without_asking(programs: int):
    assert fused_moe.split_k_for(False, 4, programs, LONG_K, DEVICE) == 1
    assert fused_moe.split_k_for(True, 1, programs, LONG_K, DEVICE) == 1


def test_pipeline_no_deeper_than_the_k_loop():
    # DeepSeek-V3's second GEMM at TP8: K = 256, two 128-deep steps
    assert fused_moe.pipeline_depth_for(4, 256, 128, 1) == 2
    # its first GEMM keeps the tuned depth, even split four ways
    assert fused_moe.pipeline_depth_for(4, 7168, 128, 4) == 4


def test_pipeline_depth_counts_scale_blocks_and_keeps_two_stages():
    assert fused_moe.pipeline_depth_for(4, 768, 256, 1) == 3
    assert fused_moe.pipeline_depth_for(4, 768, 256, 1, [128, 128]) == 4
    assert fused_moe.pipeline_depth_for(3, 128, 128, 1) == 2


# Four stages of a 16 x 128 activation tile and a 64 x 128 weight tile (FP8).
STAGE_BYTES = (16 + 64) * 128


def test_a_grid_one_round_too_large_drops_a_stage():
    # 40 KB programs: five per SM, 660 on 132 SMs; at three stages seven, 924
    assert fused_moe.resident_depth_for(4, 704, STAGE_BYTES, DEVICE) == 3
    assert fused_moe.resident_depth_for(4, 660, STAGE_BYTES, DEVICE) == 4
    assert fused_moe.resident_depth_for(5, 700, STAGE_BYTES, DEVICE) == 3


def test_a_grid_of_several_rounds_keeps_its_depth():
    assert fused_moe.resident_depth_for(4, 2000, STAGE_BYTES, DEVICE) == 4
    assert fused_moe.resident_depth_for(3, 2000, STAGE_BYTES, DEVICE) == 3
    assert fused_moe.resident_depth_for(2, 704, STAGE_BYTES, DEVICE) == 2


def _hopper(monkeypatch: pytest.MonkeyPatch, capability: int = 90):
    platform = fused_moe.current_platform
    monkeypatch.setattr(platform, "is_cuda", lambda: True, raising=False)
    monkeypatch.setattr(
        platform, "is_device_capability", lambda c: c == capability, raising=False
    )
    monkeypatch.setattr(fused_moe.envs, "VLLM_BATCH_INVARIANT", False, raising=False)


def test_a_model_without_a_table_may_split_k_on_hopper(monkeypatch: pytest.MonkeyPatch):
    _hopper(monkeypatch)
    assert fused_moe.default_config_split_k("fp8_w8a8") == 4
    assert fused_moe.default_config_split_k(None) == 1
    assert fused_moe.default_config_split_k("int8_w8a16") == 1
    monkeypatch.setattr(fused_moe.envs, "VLLM_BATCH_INVARIANT", True)
    assert fused_moe.default_config_split_k("fp8_w8a8") == 1


def test_no_default_split_k_off_hopper(monkeypatch: pytest.MonkeyPatch):
    _hopper(monkeypatch, capability=100)
    assert fused_moe.default_config_split_k("fp8_w8a8") == 1


def test_the_default_config_carries_the_split(monkeypatch: pytest.MonkeyPatch):
    # Qwen3-Coder-480B at TP8 (160 experts, K = 6144, N = 320): no table ships.
    _hopper(monkeypatch)
    monkeypatch.setattr(fused_moe, "get_moe_configs", lambda *args: None)
    config = fused_moe.try_get_optimal_moe_config(
        (160, 640, 6144), (160, 6144, 320), 8, "fp8_w8a8", 1
    )
    assert config["SPLIT_K"] == 4


def test_a_table_entry_naming_no_split_fills_an_idle_gpu_only(
    monkeypatch: pytest.MonkeyPatch,
):
    # vLLM's tables were tuned without split-K: a Swap-AB launch of their entry splits
    # only while its grid is smaller than the GPU.
    _hopper(monkeypatch)
    assert fused_moe.split_k_to_fill(True, True, SM_COUNT - 1, DEVICE) == 4
    assert fused_moe.split_k_to_fill(True, True, SM_COUNT, DEVICE) == 1
    assert fused_moe.split_k_to_fill(True, False, 1, DEVICE) == 1  # 64-row tile
    assert fused_moe.split_k_to_fill(False, True, 1, DEVICE) == 1
