"""Float64 torch references for the FP8 fused-MoE GEMM and the whole MoE layer.

The GEMM reference dequantises exactly the FP8 values and scales the kernel was
given and multiplies in float64, so comparing against it measures only the
kernel's own arithmetic (float32 accumulation, scale application, output
rounding), not quantisation error.

The layer reference comes in two forms:

* :func:`ref_moe_layer_quantized` repeats the kernel path's quantisation points
  (activations quantised before each GEMM, the first GEMM's output rounded to the
  output dtype before SiLU-and-mul) with the same quantiser, so its difference to
  the kernel path stays small;
* :func:`ref_moe_layer_float` is the plain float64 MoE layer from the original
  (unquantised) weights, the "true" answer an FP8 model approximates.
"""

from __future__ import annotations

import torch

from .quant import FP8_DTYPE, QuantMode, fp8_max, quantize_activations


def _expand_blocks(scale: torch.Tensor, rows: int, cols: int, bn: int, bk: int) -> torch.Tensor:
    """Expand a ``(..., cdiv(rows,bn), cdiv(cols,bk))`` block scale to ``(..., rows, cols)``."""
    s = scale.repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)
    return s[..., :rows, :cols]


def dequantize_weights(
    w_q: torch.Tensor,
    scale: torch.Tensor | None,
    mode: QuantMode,
    block_shape: tuple[int, int] | list[int] | None = None,
) -> torch.Tensor:
    """``(E, N, K)`` quantised weights -> float64."""
    w = w_q.to(torch.float64)
    if mode == "none" or scale is None:
        return w
    s = scale.to(torch.float64)
    if mode == "tensor":
        return w * s.reshape(-1, 1, 1)
    if mode == "channel":
        return w * s.reshape(w.size(0), w.size(1), 1)
    bn, bk = block_shape or (128, 128)
    return w * _expand_blocks(s, w.size(1), w.size(2), bn, bk)


def dequantize_activations(
    a_q: torch.Tensor,
    scale: torch.Tensor | None,
    mode: QuantMode,
    block_shape: tuple[int, int] | list[int] | None = None,
) -> torch.Tensor:
    """``(M, K)`` quantised activations -> float64."""
    a = a_q.to(torch.float64)
    if mode == "none" or scale is None:
        return a
    s = scale.to(torch.float64)
    if mode == "tensor":
        return a * s.reshape(1, 1)
    if mode == "channel":
        return a * s.reshape(-1, 1)
    _, bk = block_shape or (128, 128)
    return a * s.repeat_interleave(bk, dim=1)[:, : a.size(1)]


def ref_moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    topk_ids: torch.Tensor,
    top_k: int,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """One MoE GEMM on already dequantised float inputs.

    ``a`` is ``(rows, K)``, ``w`` ``(E_local, N, K)``, ``topk_ids`` ``(T, topk)`` with
    flat route ``i`` reading row ``i // top_k`` of ``a``.  Returns ``(T, topk, N)``
    in float64.  Routes to experts that ``expert_map`` marks -1 give zeros (what
    the kernel writes for ``expert_ids == -1`` blocks).
    """
    T, topk = topk_ids.shape
    flat = topk_ids.reshape(-1).to(torch.int64)
    if expert_map is not None:
        flat = expert_map.to(torch.int64)[flat]
    a64 = a.to(torch.float64)
    w64 = w.to(torch.float64)
    out = torch.zeros(flat.numel(), w.size(1), dtype=torch.float64, device=a.device)
    for e in torch.unique(flat).tolist():
        if e < 0:
            continue
        idx = torch.nonzero(flat == e).flatten()
        out[idx] = a64[idx // top_k] @ w64[e].T
    if mul_routed_weight:
        assert topk_weights is not None
        out *= topk_weights.reshape(-1, 1).to(torch.float64)
    return out.view(T, topk, -1)


def ref_fp8_moe_gemm(
    a_q: torch.Tensor,
    a_scale: torch.Tensor | None,
    w_q: torch.Tensor,
    w_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    mode: QuantMode,
    *,
    top_k: int | None = None,
    topk_weights: torch.Tensor | None = None,
    mul_routed_weight: bool = False,
    block_shape: tuple[int, int] | list[int] | None = None,
    expert_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantise the kernel's exact inputs, then :func:`ref_moe_gemm` (float64)."""
    return ref_moe_gemm(
        dequantize_activations(a_q, a_scale, mode, block_shape),
        dequantize_weights(w_q, w_scale, mode, block_shape),
        topk_ids,
        topk_ids.size(1) if top_k is None else top_k,
        topk_weights,
        mul_routed_weight,
        expert_map,
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """vLLM's SiLU-and-mul: ``silu(x[..., :d]) * x[..., d:]`` with ``d = N // 2``."""
    d = x.size(-1) // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def ref_moe_layer_float(
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
) -> torch.Tensor:
    """Unquantised MoE layer in float64: ``sum_j w_j * W2_e (silu_and_mul(W1_e x))``.

    ``w1`` is ``(E, 2 * I, H)`` (gate rows then up rows), ``w2`` ``(E, H, I)``.
    """
    T, topk = topk_ids.shape
    h1 = ref_moe_gemm(hidden, w1, topk_ids, topk)  # (T, topk, 2I)
    act = silu_and_mul(h1).reshape(T * topk, -1)
    h2 = ref_moe_gemm(act, w2, topk_ids, 1, topk_weights, mul_routed_weight=True)
    return h2.sum(dim=1)


def ref_moe_layer_quantized(
    hidden: torch.Tensor,
    w1_q: torch.Tensor,
    w1_scale: torch.Tensor | None,
    w2_q: torch.Tensor,
    w2_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    mode: QuantMode,
    *,
    block_shape: tuple[int, int] | list[int] | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    gemm1_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE layer through the same quantisation points as the kernel path.

    Activations are quantised with :func:`moe_kernels.quant.quantize_activations`
    before each GEMM; the GEMMs run in float64 on dequantised values; the first
    GEMM's output is rounded to ``out_dtype`` (as the kernel stores it) before
    SiLU-and-mul, whose result is rounded to ``out_dtype`` too (vLLM keeps the
    intermediate cache in the activation dtype).

    ``gemm1_out`` (``(M, topk, 2I)``, e.g. the kernel's own first-GEMM output)
    replaces the reference's first GEMM.  Chaining on it matters with per-token
    and per-block activation scales: a one-ulp difference in a row's largest
    value changes that row's FP8 scale and so the rounding of the whole row,
    which an independent reference cannot reproduce.
    """
    bs = block_shape if mode == "block" else None
    T, topk = topk_ids.shape
    a1_q, a1_s = quantize_activations(hidden, mode, bs)
    if gemm1_out is None:
        h1 = ref_fp8_moe_gemm(a1_q, a1_s, w1_q, w1_scale, topk_ids, mode, block_shape=bs)
    else:
        h1 = gemm1_out
    h1 = h1.to(out_dtype).to(torch.float64)
    act = silu_and_mul(h1).reshape(T * topk, -1).to(out_dtype)
    a2_q, a2_s = quantize_activations(act, mode, bs)
    h2 = ref_fp8_moe_gemm(
        a2_q,
        a2_s,
        w2_q,
        w2_scale,
        topk_ids,
        mode,
        top_k=1,
        topk_weights=topk_weights,
        mul_routed_weight=True,
        block_shape=bs,
    )
    return h2.sum(dim=1)


def fp8_groups(x: torch.Tensor, group: int = 128) -> torch.Tensor:
    """``(rows, K)`` through FP8 and back per row and ``group`` columns, in float64; the
    scale and the quotient in float32, as the fused decode kernels compute them."""
    out = torch.empty(x.shape, dtype=torch.float64, device=x.device)
    for start in range(0, x.size(1), group):
        part = x[:, start : start + group].float()
        amax = part.abs().amax(dim=1, keepdim=True).clamp(min=1e-10)
        scale = amax / torch.full_like(amax, fp8_max())  # divided, not a reciprocal's product
        out[:, start : start + group] = (part / scale).to(FP8_DTYPE).double() * scale.double()
    return out


def ref_moe_layer_decode(
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    group: int = 128,
) -> torch.Tensor:
    """The fused decode path's layer in float64 on dequantised weights, through its
    quantisation points: the hidden states per token and 128 columns, then SiLU-and-mul
    (float32 in the kernel, not rounded to ``hidden``'s dtype) per (token, expert) row and
    ``group`` columns (the path's ``intermediate_group`` for the launch)."""
    T, topk = topk_ids.shape
    h1 = ref_moe_gemm(fp8_groups(hidden), w1, topk_ids, topk)
    act = silu_and_mul(h1).reshape(T * topk, -1)
    h2 = ref_moe_gemm(fp8_groups(act, group), w2, topk_ids, 1, topk_weights, mul_routed_weight=True)
    return h2.sum(dim=1)
