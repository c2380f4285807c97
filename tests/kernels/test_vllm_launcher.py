"""The patched release's own launcher, ``invoke_fused_moe_triton_kernel``, run as shipped.

The harness launches kernels through its mirror (``moe_kernels.launch``); this test
runs the vLLM function itself, cut out of the patched tree with :mod:`ast` together
with ``split_k_for``, ``pipeline_depth_for`` and the swap rule (the swap-ab patch's ``use_swap_ab`` on 0.21.0,
upstream's ``enable_swap_ab`` under swap-ab-split-k on 0.33.0), against stand-ins for
``current_platform`` (its SM count and SM90 flag are the test's parameters).  It checks what only the
real launcher does for split-K: zero the output, give the grid its second axis,
honour SPLIT_K only while the grid is smaller than the GPU, and get the product
right either way.  On CPU it runs in Triton's interpreter with fp16 output (the
interpreter has no bf16 atomics); on CUDA with bf16.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from moe_kernels import interpreter_compat, load_fused_moe_kernel, quantize_weights
from moe_kernels.align import prepare_expert_assignment
from moe_kernels.launch import compute_type_for
from moe_kernels.loader import FUSED_MOE_REL, tree_constants
from moe_kernels.quant import quantize_activations
from moe_kernels.reference import ref_fp8_moe_gemm
from moe_testdata import assert_gemm_matches, make_activations, make_routing, make_weights

LAUNCHER_FUNCTIONS = (
    "split_k_for",
    "split_k_to_fill",
    "default_config_split_k",
    "pipeline_depth_for",
    "resident_depth_for",
    "invoke_fused_moe_triton_kernel",
)
UTILS_REL = FUSED_MOE_REL.parent / "utils.py"
PATCHED_TREES = ("0.21.0+moe", "0.33.0+moe")
E, K, N, M, TOPK = 8, 256, 192, 3, 2
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "SPLIT_K": 3,  # 4 K tiles over 3 slices: the last one is empty
    "num_warps": 4,
    "num_stages": 2,
}


class _RecordingKernel:
    """``fused_moe_kernel`` that remembers the grid and pipeline depth of each launch."""

    def __init__(self, kernel):
        self.kernel, self.grids, self.stages, self.kwargs = kernel, [], [], []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.grids.append(grid(kwargs) if callable(grid) else grid)
            self.stages.append(kwargs.get("num_stages"))
            self.kwargs.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


def _functions(path, names) -> dict[str, str]:
    source = path.read_text()
    return {
        n.name: ast.get_source_segment(source, n, padded=True)
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name in names
    }


def _launcher(tree, sm_count: int, sm90: bool):
    found = _functions(tree / FUSED_MOE_REL, (*LAUNCHER_FUNCTIONS, "use_swap_ab"))
    assert set(LAUNCHER_FUNCTIONS) <= set(found), (
        f"{tree} lacks {set(LAUNCHER_FUNCTIONS) - set(found)}"
    )
    if "use_swap_ab" not in found:  # 0.25+: upstream's own rule, in utils.py
        found.update(_functions(tree / UTILS_REL, ("enable_swap_ab",)))
        assert "enable_swap_ab" in found, f"{tree} has neither use_swap_ab nor enable_swap_ab"
    kernel = _RecordingKernel(load_fused_moe_kernel(tree).kernel)
    platform = SimpleNamespace(
        is_cuda=lambda: sm90,
        is_device_capability=lambda capability: sm90 and capability == 90,
        num_compute_units=lambda device_id=0: sm_count,
    )
    namespace: dict[str, Any] = {
        "Any": Any, "torch": torch, "triton": triton, "tl": tl,
        "current_platform": platform, "fused_moe_kernel": kernel,
        "envs": SimpleNamespace(VLLM_BATCH_INVARIANT=False),
        # 0.33's tensor-descriptor path, which quantized launches never take
        "resolve_moe_use_td": lambda: False,
        "warn_if_moe_use_td_ineffective": lambda *args, **kwargs: None,
        "set_triton_allocator": lambda device: None,
        "logger": SimpleNamespace(warning_once=lambda *args, **kwargs: None),
    }  # fmt: skip
    namespace.update(tree_constants((tree / FUSED_MOE_REL).read_text()))
    code = "\n\n".join(found.values())
    exec(compile(code, str(tree / FUSED_MOE_REL), "exec"), namespace)
    return namespace["invoke_fused_moe_triton_kernel"], kernel


@pytest.mark.parametrize("sm90", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("sm_count", [132, 4], ids=["grid-below-SMs", "grid-fills-SMs"])
@pytest.mark.parametrize("mode", ["tensor", "block"])
@pytest.mark.parametrize("label", PATCHED_TREES)
def test_patched_launcher_splits_k(release_trees, label, mode, sm_count, sm90, gen, device):
    invoke, kernel = _launcher(release_trees(label), sm_count, sm90)
    if device.type == "cpu":
        interpreter_compat.apply()
    out_dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    block_shape = [128, 128] if mode == "block" else None
    w = make_weights(E, N, K, gen, device)
    a = make_activations(M, K, gen, device)
    ids, tw = make_routing(M, TOPK, E, gen, device)
    bq, bs = quantize_weights(w, mode, block_shape)
    a_q, a_s = quantize_activations(a, mode, block_shape)
    sorted_ids, expert_ids, num_post = prepare_expert_assignment(
        ids, CONFIG["BLOCK_SIZE_M"], E, naive=False
    )
    C = torch.full((M, TOPK, N), float("nan"), dtype=out_dtype, device=device)
    invoke(
        a_q, bq, C, a_s, bs, tw, sorted_ids, expert_ids, num_post, True, TOPK, dict(CONFIG),
        compute_type_for(out_dtype), use_fp8_w8a8=True, use_int8_w8a8=False,
        use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
        block_shape=block_shape,
    )  # fmt: skip

    (grid,) = kernel.grids
    programs = grid[0]
    assert programs < 132, "the case must be one the rule lets split on a 132-SM GPU"
    assert grid[1] == (CONFIG["SPLIT_K"] if sm_count > programs else 1)
    assert not C.isnan().any(), "every row must be written (zeroed first when split)"
    ref = ref_fp8_moe_gemm(
        a_q, a_s, bq, bs, ids, mode, topk_weights=tw, mul_routed_weight=True,
        block_shape=block_shape,
    )  # fmt: skip
    assert_gemm_matches(C, ref)


def _launch_per_tensor(invoke, config: dict, gen, device) -> None:
    """One per-tensor FP8 launch of the real launcher with ``config`` on fresh data, its
    product checked against the float64 reference."""
    if device.type == "cpu":
        interpreter_compat.apply()
    out_dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    w = make_weights(E, N, K, gen, device)
    a = make_activations(M, K, gen, device)
    ids, tw = make_routing(M, TOPK, E, gen, device)
    bq, bs = quantize_weights(w, "tensor", None)
    a_q, a_s = quantize_activations(a, "tensor", None)
    sorted_ids, expert_ids, num_post = prepare_expert_assignment(
        ids, config["BLOCK_SIZE_M"], E, naive=False
    )
    C = torch.full((M, TOPK, N), float("nan"), dtype=out_dtype, device=device)
    invoke(
        a_q, bq, C, a_s, bs, tw, sorted_ids, expert_ids, num_post, True, TOPK, config,
        compute_type_for(out_dtype), use_fp8_w8a8=True, use_int8_w8a8=False,
        use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False, block_shape=None,
    )  # fmt: skip
    assert not C.isnan().any(), "every row must be written (zeroed first when split)"
    ref = ref_fp8_moe_gemm(a_q, a_s, bq, bs, ids, "tensor", topk_weights=tw, mul_routed_weight=True)
    assert_gemm_matches(C, ref)


@pytest.mark.parametrize("sm90", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("sm_count", [132, 4], ids=["grid-below-SMs", "grid-fills-SMs"])
@pytest.mark.parametrize("label", PATCHED_TREES)
def test_patched_launcher_splits_an_entry_naming_no_split_only_to_fill_the_gpu(
    release_trees, label, sm_count, sm90, gen, device
):
    """vLLM's own tables name no SPLIT_K: the launcher splits such an entry 4 ways only
    where it swaps and its grid is smaller than the GPU, and the product stays right."""
    invoke, kernel = _launcher(release_trees(label), sm_count, sm90)
    entry = {k: v for k, v in CONFIG.items() if k != "SPLIT_K"}  # as vLLM's tables are
    _launch_per_tensor(invoke, dict(entry), gen, device)
    (grid,) = kernel.grids
    assert grid[1] == (4 if sm90 and grid[0] < sm_count else 1)


@pytest.mark.parametrize("sm90", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("label", PATCHED_TREES)
def test_patched_launcher_caps_pipeline_depth_when_swapping(
    release_trees, label, sm90, gen, device
):
    invoke, kernel = _launcher(release_trees(label), 132, sm90)
    # K = 256 in 128-deep tiles: two K steps, so a 4-stage pipeline is two too deep.
    config = {**CONFIG, "BLOCK_SIZE_K": 128, "SPLIT_K": 1, "num_stages": 4}
    _launch_per_tensor(invoke, config, gen, device)
    assert kernel.stages == [2 if sm90 else 4]  # only the Swap-AB kernel is capped
    assert config["num_stages"] == 4, "the caller's config is left as it was"


# 132 SMs: the narrow grid splits K four ways, one step a slice, so two stages;
# 5 SMs: the wide grid does not split, three K steps, three stages.
@pytest.mark.parametrize(
    ("sm_count", "block_n", "stages"),
    [(132, 64, 2), (5, 128, 3)],
    ids=["narrow-fits", "only-wide-fits"],
)
def test_patched_launcher_takes_an_offered_narrow_tile_per_launch(
    release_trees, sm_count, block_n, stages, gen, device
):
    """A block-FP8 default config of the 0.20 series offers a 64-wide tile; the real
    launcher takes it (and the offer never reaches the kernel) unless only the 128-wide
    grid fits the GPU at once: here N = 512, K = 384 (three K steps, so three stages), six
    routed pairs on 8 experts (5 expected hit).  On 5 SMs the 20 working 128-wide programs
    fit (4 an SM at three stages) and the 40 narrow ones do not (7 an SM)."""
    tree = release_trees("0.21.0+moe")
    rules = ("narrow_tile_pays", "expected_experts_hit", "resident_programs")
    found = _functions(tree / FUSED_MOE_REL, rules)
    assert set(found) == set(rules)
    invoke, kernel = _launcher(tree, sm_count, True)
    if device.type == "cpu":
        interpreter_compat.apply()
    for source in found.values():  # the launcher calls them only for an offer
        exec(compile(source, str(tree / FUSED_MOE_REL), "exec"), invoke.__globals__)
    n, k = 512, 384
    out_dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    w = make_weights(E, n, k, gen, device)
    a = make_activations(M, k, gen, device)
    ids, tw = make_routing(M, TOPK, E, gen, device)
    bq, bs = quantize_weights(w, "block", [128, 128])
    a_q, a_s = quantize_activations(a, "block", [128, 128])
    config = {
        "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "SPLIT_K": 4, "num_warps": 4, "num_stages": 3, "NARROW_TILE_STAGES": 4,
    }  # fmt: skip
    sorted_ids, expert_ids, num_post = prepare_expert_assignment(ids, 16, E, naive=False)
    C = torch.full((M, TOPK, n), float("nan"), dtype=out_dtype, device=device)
    invoke(
        a_q, bq, C, a_s, bs, tw, sorted_ids, expert_ids, num_post, True, TOPK, dict(config),
        compute_type_for(out_dtype), use_fp8_w8a8=True, use_int8_w8a8=False,
        use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
        block_shape=[128, 128],
    )  # fmt: skip
    (launched,) = kernel.kwargs
    assert (launched["BLOCK_SIZE_N"], launched["num_stages"]) == (block_n, stages)
    assert "NARROW_TILE_STAGES" not in launched
    ref = ref_fp8_moe_gemm(
        a_q, a_s, bq, bs, ids, "block", topk_weights=tw, mul_routed_weight=True,
        block_shape=[128, 128],
    )  # fmt: skip
    assert_gemm_matches(C, ref)
