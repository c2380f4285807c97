"""One fused-MoE GEMM through the tree's kernel against a float64 reference.

Runs on CPU through Triton's interpreter (TRITON_INTERPRET=1, set in conftest)
or on CUDA.  Shapes are small (E=8, K=256, N=192) to keep the interpreter fast;
N=192 is not a multiple of BLOCK_SIZE_N=128 in the configs that use it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
from moe_kernels import (
    fused_moe_gemm,
    invoke_fused_moe_kernel,
    quantize_weights,
    ref_fp8_moe_gemm,
    ref_moe_gemm,
    rel_frobenius_error,
)
from moe_testdata import (
    GEMM_FLOAT_TOL,
    GEMM_TOL,
    assert_gemm_matches,
    make_activations,
    make_routing,
    make_weights,
    zero_token_experts,
)

E, K, N = 8, 256, 192
CFG_N64 = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1)
CFG_N128 = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=4)
CFG_M32 = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=8)

# id: (M, topk, E, config, mul_routed_weight, naive)
CASES = {
    "M1-naive": (1, 2, E, CFG_N64, False, None),  # M * topk * 4 <= E: vLLM's naive path
    "M1-aligned": (1, 2, E, CFG_N128, True, False),
    "M3": (3, 2, E, CFG_N128, True, None),
    "M7": (7, 2, E, CFG_N64, False, None),
    "M33-E4": (33, 2, 4, CFG_N64, True, None),  # several blocks per expert
}
MODES = ("tensor", "channel", "block")


def reference(run, bq, bs, ids, tw, mode, mul, **kwargs):
    """The float64 reference of ``run`` from the exact FP8 inputs the kernel read."""
    return ref_fp8_moe_gemm(
        run.A_q, run.A_scale, bq, bs, ids, mode, topk_weights=tw, mul_routed_weight=mul, **kwargs
    )


def _skip_unless_swap(kernel, swap_ab):
    if swap_ab and not kernel.has_swap_ab:
        pytest.skip("this tree's kernel has no SWAP_AB")


@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", MODES)
def test_fp8_gemm(kernel, mode, case, swap_ab, gen, device):
    _skip_unless_swap(kernel, swap_ab)
    M, topk, n_exp, cfg, mul, naive = CASES[case]
    block_shape = (128, 128) if mode == "block" else None
    w = make_weights(n_exp, N, K, gen, device)
    a = make_activations(M, K, gen, device)
    ids, tw = make_routing(M, topk, n_exp, gen, device, n_dead=1)
    assert zero_token_experts(ids, n_exp), "routing must leave an expert without tokens"
    bq, bs = quantize_weights(w, mode, block_shape)

    run = fused_moe_gemm(
        kernel, a, bq, bs, ids, tw, cfg, mode,
        mul_routed_weight=mul, naive=naive, swap_ab=swap_ab,
    )  # fmt: skip

    if kernel.has_swap_ab:
        assert run.launch_args["SWAP_AB"] is swap_ab
    assert (run.sorted_token_ids is None) == (naive is None and M * topk * 4 <= n_exp)
    assert not run.C.isnan().any(), "kernel left rows unwritten"
    ref = reference(run, bq, bs, ids, tw, mode, mul, block_shape=block_shape)
    assert_gemm_matches(run.C, ref)
    # sanity of the quantiser itself: close to the unquantised product
    full = ref_moe_gemm(a, w, ids, topk, tw, mul)
    assert rel_frobenius_error(run.C, full) < GEMM_FLOAT_TOL


@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("ignore_invalid", [False, True], ids=["mark-1", "ignore"])
def test_expert_parallel_remote_experts(kernel, ignore_invalid, swap_ab, gen, device):
    """expert_map: routes to remote experts get expert_ids == -1 blocks, which the
    kernel fills with zeros; with ignore_invalid_experts they are never written."""
    _skip_unless_swap(kernel, swap_ab)
    E_global, M, topk = 8, 7, 2
    local = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32, device=device)
    w = make_weights(4, N, K, gen, device)  # only the local experts' weights
    a = make_activations(M, K, gen, device)
    ids, tw = make_routing(M, topk, E_global, gen, device, n_dead=1)
    bq, bs = quantize_weights(w, "tensor")
    run = fused_moe_gemm(
        kernel, a, bq, bs, ids, tw, CFG_N64, "tensor",
        mul_routed_weight=True, expert_map=local, num_experts=E_global,
        ignore_invalid_experts=ignore_invalid, swap_ab=swap_ab,
    )  # fmt: skip
    remote = (local[ids.long()] < 0).reshape(M, topk)
    assert remote.any() and (~remote).any()
    if ignore_invalid:
        assert run.C[remote].isnan().all(), "remote routes must stay untouched"
        assert not (run.expert_ids[: int(run.num_tokens_post_padded) // 16] < 0).any()
    else:
        assert (run.expert_ids == -1).any()
        assert (run.C[remote] == 0).all(), "blocks with expert_ids == -1 must be zeros"
    ref = reference(run, bq, bs, ids, tw, "tensor", True, expert_map=local)
    assert not run.C[~remote].isnan().any()
    assert rel_frobenius_error(run.C[~remote], ref[~remote]) < GEMM_TOL


# Split-K adds partial tiles with atomics.  The interpreter has no bf16 atomics,
# so on CPU the output is fp16; on the GPU it is vLLM's usual bf16.
SPLIT_K_CASES = {
    "M3-split2": (3, 2, E, CFG_N128, True, None, 2),
    "M7-split3": (7, 2, E, CFG_N64, False, None, 3),  # 4 K tiles over 3 splits: one is empty
    "M1-naive-split4": (1, 2, E, CFG_N64, False, None, 4),
}


@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("case", list(SPLIT_K_CASES))
@pytest.mark.parametrize("mode", MODES)
def test_fp8_gemm_split_k(kernel, mode, case, swap_ab, gen, device):
    if not kernel.has_split_k:
        pytest.skip("this tree's kernel ignores SPLIT_K")
    _skip_unless_swap(kernel, swap_ab)
    M, topk, n_exp, cfg, mul, naive, split_k = SPLIT_K_CASES[case]
    out_dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    block_shape = (128, 128) if mode == "block" else None
    w = make_weights(n_exp, N, K, gen, device)
    a = make_activations(M, K, gen, device)
    ids, tw = make_routing(M, topk, n_exp, gen, device, n_dead=1)
    bq, bs = quantize_weights(w, mode, block_shape)
    run = fused_moe_gemm(
        kernel, a, bq, bs, ids, tw, {**cfg, "SPLIT_K": split_k}, mode,
        mul_routed_weight=mul, naive=naive, swap_ab=swap_ab, out_dtype=out_dtype,
    )  # fmt: skip
    assert run.launch_args["grid"][1] == split_k
    ref = reference(run, bq, bs, ids, tw, mode, mul, block_shape=block_shape)
    # A kernel that ignored the split would add the whole product split_k times.
    assert_gemm_matches(run.C, ref)


# K that 128-deep K tiles (and 128 x 128 scale blocks) do not divide, as tensor-parallel
# shards of real models have: Qwen3-Coder-480B's second GEMM at TP 8 runs K = 2560 / 8 = 320,
# two and a half tiles.  Split 2: slices of two and of a half tile; split 4: one slice empty.
RAGGED_K = 320


@pytest.mark.parametrize("split_k", [1, 2, 4], ids=lambda s: f"split{s}")
@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("mode", ["tensor", "block"])
def test_fp8_gemm_ragged_k(kernel, mode, swap_ab, split_k, gen, device):
    _skip_unless_swap(kernel, swap_ab)
    if split_k > 1 and not kernel.has_split_k:
        pytest.skip("this tree's kernel ignores SPLIT_K")
    M, topk = 5, 2
    out_dtype = torch.bfloat16 if device.type == "cuda" or split_k == 1 else torch.float16
    block_shape = (128, 128) if mode == "block" else None
    w = make_weights(E, N, RAGGED_K, gen, device)
    a = make_activations(M, RAGGED_K, gen, device)
    ids, tw = make_routing(M, topk, E, gen, device, n_dead=1)
    bq, bs = quantize_weights(w, mode, block_shape)
    config = {**CFG_N64, "BLOCK_SIZE_K": 128, **({"SPLIT_K": split_k} if split_k > 1 else {})}
    run = fused_moe_gemm(
        kernel, a, bq, bs, ids, tw, config, mode,
        mul_routed_weight=True, swap_ab=swap_ab, out_dtype=out_dtype,
    )  # fmt: skip
    assert run.launch_args["grid"][1] == split_k
    assert not run.C.isnan().any(), "kernel left rows unwritten"
    ref = reference(run, bq, bs, ids, tw, mode, True, block_shape=block_shape)
    assert_gemm_matches(run.C, ref)


def test_split_k_refused_by_kernels_without_it(kernel, gen, device):
    if kernel.has_split_k:
        pytest.skip("this tree's kernel implements SPLIT_K")
    w = make_weights(E, N, K, gen, device)
    a = make_activations(3, K, gen, device)
    ids, tw = make_routing(3, 2, E, gen, device)
    bq, bs = quantize_weights(w, "tensor")
    with pytest.raises(ValueError, match="does not implement SPLIT_K"):
        fused_moe_gemm(kernel, a, bq, bs, ids, tw, {**CFG_N64, "SPLIT_K": 2}, "tensor")


def test_unquantized_fp16(kernel, gen, device):
    """The non-FP8 path (use_fp8_w8a8=False).  fp16, not bf16: Triton 3.6's
    interpreter multiplies bf16 dot operands as raw uint16 bits."""
    M, topk = 7, 2
    w = make_weights(E, N, K, gen, device).half()
    a = make_activations(M, K, gen, device, dtype=torch.float16)
    ids, tw = make_routing(M, topk, E, gen, device)
    run = fused_moe_gemm(kernel, a, w, None, ids, tw, CFG_N128, "none", out_dtype=torch.float16)
    ref = ref_moe_gemm(a, w, ids, topk)
    assert not run.C.isnan().any()
    assert rel_frobenius_error(run.C, ref) < GEMM_TOL


def test_launcher_checks_signature(kernel, device):
    """Unknown required parameters and SWAP_AB on kernels without it fail loudly."""
    a = torch.zeros((1, K), device=device)
    b = torch.zeros((E, N, K), device=device)
    c = torch.zeros((1, 1, N), device=device)
    ids = torch.zeros(1, dtype=torch.int32, device=device)
    args = (a, b, c, None, None, None, None, ids, ids, False, 1, CFG_N64)
    if not kernel.has_swap_ab:
        with pytest.raises(ValueError, match="no SWAP_AB"):
            invoke_fused_moe_kernel(kernel, *args, swap_ab=True)
    params = list(kernel.signature.parameters.values())
    extra = inspect.Parameter("NEW_FLAG", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    first_default = next((i for i, p in enumerate(params) if p.default is not p.empty), len(params))
    params.insert(first_default, extra)
    patched = replace(kernel, signature=kernel.signature.replace(parameters=params))
    with pytest.raises(TypeError, match="NEW_FLAG"):
        invoke_fused_moe_kernel(patched, *args)
    with pytest.raises(TypeError, match="not in the kernel's signature"):
        invoke_fused_moe_kernel(kernel, *args, extra_args={"NOPE": 1})


# Deliberately wrong launches: the data and bounds above must catch each of them.
BUGS = {
    "tensor-other-experts-scale": ("tensor", lambda bs: {"b_scale_ptr": bs.roll(1, 0)}),
    "channel-one-token-scale": ("channel", lambda bs: {"stride_asm": 0}),
    "channel-one-channel-scale": ("channel", lambda bs: {"stride_bsn": 0}),
    "block-one-act-group-scale": ("block", lambda bs: {"stride_ask": 0}),
    "block-one-weight-k-scale": ("block", lambda bs: {"stride_bsk": 0}),
    "no-routed-weight": ("tensor", lambda bs: {"MUL_ROUTED_WEIGHT": False}),
}


def spread_activation_scales(a: torch.Tensor, group: int = 128) -> torch.Tensor:
    """``a`` with every (token, 128-wide K group) block rescaled to the amax
    ``2 ** (token % 3) * 4 ** group_index``: tokens and K groups then need scales that
    differ by 2x or more whatever the draw, so a bug that shares one token's or one
    group's scale cannot stay under the bound by chance (random magnitudes alone once
    gave the shared group scale an error of only 3.5e-2)."""
    M, K = a.shape
    blocks = a.float().reshape(M, -1, group)  # K is a multiple of the group in these tests
    amax = blocks.abs().amax(dim=2, keepdim=True)
    token = torch.arange(M, device=a.device).remainder(3).view(M, 1, 1)
    group_index = torch.arange(blocks.shape[1], device=a.device).view(1, -1, 1)
    target = 2.0**token * 4.0**group_index
    return (blocks / amax * target).reshape(M, K).to(a.dtype)


@pytest.mark.parametrize("bug", list(BUGS))
def test_bounds_catch_planted_bugs(kernel, bug, gen, device):
    mode, wrong = BUGS[bug]
    M, topk = 7, 2
    block_shape = (128, 128) if mode == "block" else None
    w = make_weights(E, N, K, gen, device)
    a = spread_activation_scales(make_activations(M, K, gen, device))
    ids, tw = make_routing(M, topk, E, gen, device)
    bq, bs = quantize_weights(w, mode, block_shape)
    run = fused_moe_gemm(
        kernel, a, bq, bs, ids, tw, CFG_N128, mode,
        mul_routed_weight=True, extra_args=wrong(bs),
    )  # fmt: skip
    ref = reference(run, bq, bs, ids, tw, mode, True, block_shape=block_shape)
    assert rel_frobenius_error(run.C, ref) > 5 * GEMM_TOL
