"""Compiled (CUDA) runs: model-sized shapes and Triton's JIT specialisation.

All tests here are marked ``gpu`` and skipped without CUDA (conftest).
"""

from __future__ import annotations

import pytest
import torch
from moe_kernels import (
    fused_moe_gemm,
    fused_moe_layer,
    load_fused_moe_kernel,
    quantize_activations,
    quantize_weights,
    ref_fp8_moe_gemm,
    ref_moe_gemm,
    ref_moe_layer_float,
    ref_moe_layer_quantized,
    rel_frobenius_error,
)
from moe_kernels.loader import FUSED_MOE_REL
from moe_kernels.stats import row_rel_errors
from moe_testdata import (
    GEMM_FLOAT_TOL,
    GEMM_ROW_TOL,
    GEMM_TOL,
    LAYER_FLOAT_TOL,
    LAYER_TOL,
    make_activations,
    make_routing,
    make_weights,
)

pytestmark = pytest.mark.gpu

# (E, topk, hidden, intermediate) from public model configurations
SHAPES = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v3-tp8": (256, 8, 7168, 256),
}
CFG_SMALL_M = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                   num_warps=4, num_stages=3)  # fmt: skip
CFG_LARGE_M = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                   num_warps=4, num_stages=3)  # fmt: skip


def _skip_unless_swap(kernel, swap_ab):
    if swap_ab and not kernel.has_swap_ab:
        pytest.skip("this tree's kernel has no SWAP_AB")


@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("M", [1, 4, 16, 64])
@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_fp8_first_gemm(kernel, shape, mode, M, swap_ab, gen, device):
    _skip_unless_swap(kernel, swap_ab)
    E, topk, hidden, inter = SHAPES[shape]
    N, K = 2 * inter, hidden
    block_shape = (128, 128) if mode == "block" else None
    cfg = CFG_SMALL_M if M <= 16 else CFG_LARGE_M
    w = make_weights(E, N, K, gen, device)
    a = make_activations(M, K, gen, device)
    ids, tw = make_routing(M, topk, E, gen, device)
    bq, bs = quantize_weights(w, mode, block_shape)
    run = fused_moe_gemm(kernel, a, bq, bs, ids, tw, cfg, mode, swap_ab=swap_ab)
    assert not run.C.isnan().any()
    ref = ref_fp8_moe_gemm(run.A_q, run.A_scale, bq, bs, ids, mode, block_shape=block_shape)
    assert rel_frobenius_error(run.C, ref) < GEMM_TOL
    assert float(row_rel_errors(run.C, ref).max()) < GEMM_ROW_TOL
    assert rel_frobenius_error(run.C, ref_moe_gemm(a, w, ids, topk)) < GEMM_FLOAT_TOL


@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("M", [1, 8, 64])
@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
def test_gpu_fp8_layer(kernel, mode, M, swap_ab, gen, device):
    _skip_unless_swap(kernel, swap_ab)
    E, topk, hidden, inter = SHAPES["qwen3-30b-a3b"]
    block_shape = (128, 128) if mode == "block" else None
    cfg = CFG_SMALL_M if M <= 16 else CFG_LARGE_M
    w1 = make_weights(E, 2 * inter, hidden, gen, device)
    w2 = make_weights(E, hidden, inter, gen, device)
    x = make_activations(M, hidden, gen, device)
    ids, tw = make_routing(M, topk, E, gen, device)
    w1q, w1s = quantize_weights(w1, mode, block_shape)
    w2q, w2s = quantize_weights(w2, mode, block_shape)
    run = fused_moe_layer(
        kernel, x, w1q, w1s, w2q, w2s, ids, tw, cfg, mode, block_shape=block_shape, swap_ab=swap_ab
    )
    assert not run.cache1.isnan().any() and not run.cache3.isnan().any()
    a1q, a1s = quantize_activations(x, mode, block_shape)
    ref1 = ref_fp8_moe_gemm(a1q, a1s, w1q, w1s, ids, mode, block_shape=block_shape)
    assert rel_frobenius_error(run.cache1, ref1) < GEMM_TOL
    ref = ref_moe_layer_quantized(
        x, w1q, w1s, w2q, w2s, ids, tw, mode, block_shape=block_shape, gemm1_out=run.cache1
    )
    assert rel_frobenius_error(run.out, ref) < LAYER_TOL
    assert rel_frobenius_error(run.out, ref_moe_layer_float(x, w1, w2, ids, tw)) < LAYER_FLOAT_TOL


def test_gpu_unquantized_bf16(kernel, gen, device):
    """bf16 without FP8 (what the CPU interpreter cannot run)."""
    E, topk, K, N = 64, 4, 1024, 512
    w = make_weights(E, N, K, gen, device).bfloat16()
    a = make_activations(5, K, gen, device)
    ids, tw = make_routing(5, topk, E, gen, device)
    run = fused_moe_gemm(kernel, a, w, None, ids, tw, CFG_SMALL_M, "none")
    assert rel_frobenius_error(run.C, ref_moe_gemm(a, w, ids, topk)) < GEMM_TOL


def _fresh_copy(vllm_tree, tmp_path, jit_kwargs: str | None):
    """A one-file tree copy: its own JITFunction object, so its own compile cache."""
    text = (vllm_tree / FUSED_MOE_REL).read_text()
    if jit_kwargs is not None:
        old = "@triton.jit\ndef fused_moe_kernel("
        assert old in text
        text = text.replace(old, f"@triton.jit({jit_kwargs})\ndef fused_moe_kernel(")
    dst = tmp_path / "tree" / FUSED_MOE_REL
    dst.parent.mkdir(parents=True)
    dst.write_text(text)
    return load_fused_moe_kernel(tmp_path / "tree")


def _sweep_variants(k, gen, device, Ms) -> int:
    E, topk, K, N = 64, 2, 512, 256
    w = make_weights(E, N, K, gen, device)
    bq, bs = quantize_weights(w, "tensor")
    for M in Ms:
        a = make_activations(M, K, gen, device)
        ids, tw = make_routing(M, topk, E, gen, device)
        fused_moe_gemm(k, a, bq, bs, ids, tw, CFG_SMALL_M, "tensor", naive=False, swap_ab=False)
    torch.cuda.synchronize()
    return k.compiled_variant_count(device.index or 0)


@pytest.mark.parametrize("annotated", [False, True], ids=["as-released", "do_not_specialize"])
def test_gpu_jit_specialisation(vllm_tree, tmp_path, annotated, gen, device):
    """Token-count-dependent EM / num_valid_tokens: one compiled variant with
    do_not_specialize on both, several without."""
    if (
        annotated
        and "@triton.jit\ndef fused_moe_kernel(" not in (vllm_tree / FUSED_MOE_REL).read_text()
    ):
        pytest.skip("the tree annotates fused_moe_kernel already: its as-released case covers it")
    dns = 'do_not_specialize=["EM", "num_valid_tokens"]' if annotated else None
    k = _fresh_copy(vllm_tree, tmp_path, dns)
    already = set(k.decorator_kwargs.get("do_not_specialize", []))
    n = _sweep_variants(k, gen, device, range(1, 21))
    if annotated or {"EM", "num_valid_tokens"} <= already:
        assert n == 1, f"{n} variants compiled"
    else:
        assert n > 1, f"{n} variants compiled: has the tree stopped specialising EM?"
