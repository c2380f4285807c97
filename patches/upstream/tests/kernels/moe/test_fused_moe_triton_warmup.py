# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Triton fused-MoE warm-up runs one forward pass per launch config.

At start-up, triton_moe_warmup() runs a forward pass for every config
try_get_optimal_moe_config picks between the largest CUDA-graph size and
max_num_batched_tokens, so no prefill compiles fused_moe_kernel on the
request path.

Run `pytest tests/kernels/moe/test_fused_moe_triton_warmup.py`.
"""

from types import SimpleNamespace

import pytest
import torch

import vllm.model_executor.layers.fused_moe.fused_moe as fused_moe
from vllm import platforms
from vllm.config import CUDAGraphMode
from vllm.model_executor.warmup import triton_moe_warmup as moe_warmup

# Qwen3-30B-A3B's experts (128 of hidden 2048, intermediate 768, top-8), for
# which H200 tables exist, and a made-up shape served by the default configs.
QWEN3 = ((128, 1536, 2048), (128, 2048, 768), 8)
NO_TABLE = ((72, 1280, 2048), (72, 2048, 640), 6)
W1_SHAPE, W2_SHAPE, TOP_K = QWEN3


def _config(num_tokens: int, block_shape: list[int] | None, shape=QWEN3) -> tuple:
    w1_shape, w2_shape, top_k = shape
    config = fused_moe.try_get_optimal_moe_config(
        w1_shape, w2_shape, top_k, "fp8_w8a8", num_tokens, block_shape=block_shape
    )
    return tuple(sorted(config.items()))


@pytest.fixture
def problems(monkeypatch):
    """A registry of seen MoE problems of this test's own, on an H200."""
    h200 = {
        "get_device_name": lambda device_id=0: "NVIDIA H200",
        "is_cuda": lambda: True,
        "is_rocm": lambda: False,
        "is_device_capability": lambda capability: capability == 90,
        "num_compute_units": lambda device_id=0: 132,
        "fp8_dtype": lambda: torch.float8_e4m3fn,
    }
    for name, answer in h200.items():
        monkeypatch.setattr(platforms.current_platform, name, answer)
    seen: set[tuple] = set()
    monkeypatch.setattr(fused_moe, "_moe_problems_seen", seen)
    return seen


def _worker(max_tokens: int, capture_size: int, enforce_eager: bool, mode):
    runs: list[int] = []
    runner = SimpleNamespace(
        _dummy_run=lambda num_tokens, **kwargs: runs.append(num_tokens)
    )
    worker = SimpleNamespace(
        model_runner=runner,
        model_config=SimpleNamespace(enforce_eager=enforce_eager),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        vllm_config=SimpleNamespace(
            compilation_config=SimpleNamespace(
                cudagraph_mode=mode, max_cudagraph_capture_size=capture_size
            )
        ),
    )
    return worker, runs


def test_a_config_lookup_registers_its_problem(problems):
    _config(7, [128, 128])
    assert problems == {(W1_SHAPE, W2_SHAPE, TOP_K, "fp8_w8a8", (128, 128))}


@pytest.mark.parametrize("shape", [QWEN3, NO_TABLE], ids=["table", "default"])
@pytest.mark.parametrize("block_shape", [None, [128, 128]])
def test_token_counts_reach_every_config_once(problems, block_shape, shape):
    _config(1, block_shape, shape)
    counts = fused_moe.triton_moe_warmup_token_counts(65, 4096)
    assert counts[0] == 65
    reached = [_config(n, block_shape, shape) for n in counts]
    assert len(set(reached)) == len(reached), "two counts reach one config"
    every = {_config(n, block_shape, shape) for n in range(65, 4097)}
    assert set(reached) == every
    for n in counts[1:]:  # each count is the first of its config
        assert _config(n - 1, block_shape, shape) != _config(n, block_shape, shape)


def test_token_counts_cover_every_problem_seen(problems):
    _config(1, None, QWEN3)
    _config(1, None, NO_TABLE)
    counts = fused_moe.triton_moe_warmup_token_counts(129, 8192)
    for shape in (QWEN3, NO_TABLE):
        assert {_config(n, None, shape) for n in counts} == {
            _config(n, None, shape) for n in range(129, 8193)
        }


def test_no_problem_seen_means_no_forward_pass(problems):
    worker, runs = _worker(8192, 512, False, CUDAGraphMode.FULL_AND_PIECEWISE)
    moe_warmup.triton_moe_warmup(worker)
    assert runs == []


@pytest.mark.parametrize(
    ("capture_size", "enforce_eager", "mode", "smallest"),
    [
        (128, False, CUDAGraphMode.FULL_AND_PIECEWISE, 129),
        (128, False, CUDAGraphMode.PIECEWISE, 129),
        # Mixed batches run without graphs: every size can occur.
        (128, False, CUDAGraphMode.FULL_DECODE_ONLY, 1),
        (128, True, CUDAGraphMode.FULL_AND_PIECEWISE, 1),
    ],
)
def test_warmup_runs_the_counts_graphs_do_not_cover(
    problems, capture_size, enforce_eager, mode, smallest
):
    _config(1, None)
    worker, runs = _worker(2048, capture_size, enforce_eager, mode)
    moe_warmup.triton_moe_warmup(worker)
    assert runs == fused_moe.triton_moe_warmup_token_counts(smallest, 2048)
    assert runs and runs[0] == smallest and runs[-1] <= 2048
