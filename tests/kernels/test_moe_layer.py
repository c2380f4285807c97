"""The whole FP8 MoE layer (two GEMMs, SiLU-and-mul, routed weights) through the kernel."""

from __future__ import annotations

import pytest
from moe_kernels import (
    fused_moe_layer,
    quantize_activations,
    quantize_weights,
    ref_fp8_moe_gemm,
    ref_moe_layer_float,
    ref_moe_layer_quantized,
    rel_frobenius_error,
)
from moe_testdata import (
    GEMM_TOL,
    LAYER_FLOAT_TOL,
    LAYER_TOL,
    make_activations,
    make_routing,
    make_weights,
    zero_token_experts,
)

E, TOPK, H, INTER = 8, 2, 256, 96  # w1: (E, 2*INTER=192, H), w2: (E, H, INTER)
CFG = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1)


@pytest.mark.parametrize("swap_ab", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("M", [1, 7])
@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
def test_fp8_moe_layer(kernel, mode, M, swap_ab, gen, device):
    if swap_ab and not kernel.has_swap_ab:
        pytest.skip("this tree's kernel has no SWAP_AB")
    block_shape = (128, 128) if mode == "block" else None
    w1 = make_weights(E, 2 * INTER, H, gen, device)
    w2 = make_weights(E, H, INTER, gen, device)
    hidden = make_activations(M, H, gen, device)
    ids, tw = make_routing(M, TOPK, E, gen, device, n_dead=2)
    assert zero_token_experts(ids, E)
    w1q, w1s = quantize_weights(w1, mode, block_shape)
    w2q, w2s = quantize_weights(w2, mode, block_shape)

    run = fused_moe_layer(
        kernel, hidden, w1q, w1s, w2q, w2s, ids, tw, CFG, mode,
        block_shape=block_shape, swap_ab=swap_ab,
    )  # fmt: skip

    assert run.naive == (M * TOPK * 4 <= E)
    assert not run.cache1.isnan().any() and not run.cache3.isnan().any()
    # GEMM 1 against the exact-input reference
    a1q, a1s = quantize_activations(hidden, mode, block_shape)
    ref1 = ref_fp8_moe_gemm(a1q, a1s, w1q, w1s, ids, mode, block_shape=block_shape)
    err1 = rel_frobenius_error(run.cache1, ref1)
    assert err1 < GEMM_TOL, f"first GEMM: {err1:.3e}"
    # SiLU-and-mul, re-quantisation, GEMM 2 with routed weights and the top-k sum,
    # chained on the kernel's GEMM 1 output (see ref_moe_layer_quantized)
    ref_q = ref_moe_layer_quantized(
        hidden, w1q, w1s, w2q, w2s, ids, tw, mode,
        block_shape=block_shape, gemm1_out=run.cache1,
    )  # fmt: skip
    err = rel_frobenius_error(run.out, ref_q)
    assert err < LAYER_TOL, f"layer output: {err:.3e}"
    err_f = rel_frobenius_error(run.out, ref_moe_layer_float(hidden, w1, w2, ids, tw))
    assert err_f < LAYER_FLOAT_TOL, f"vs unquantised reference: {err_f:.3e}"
