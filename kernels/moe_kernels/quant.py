"""FP8 (e4m3) quantisation in torch, with the scale layouts vLLM's kernel reads.

Modes (``QuantMode``):

* ``"tensor"``: weights one scale per expert, ``B_scale`` shape ``(E,)``;
  activations one dynamic scale, ``A_scale`` shape ``(1,)``.
* ``"channel"``: weights one scale per output channel, ``B_scale`` ``(E, N, 1)``;
  activations one scale per token, ``A_scale`` ``(M, 1)``
  (vLLM's ``per_channel_quant=True`` / ``per_act_token_quant``).
* ``"block"``: weights one scale per ``block_n x block_k`` tile (128x128 in
  DeepSeek-style checkpoints), ``B_scale`` ``(E, cdiv(N, block_n), cdiv(K, block_k))``;
  activations one scale per token per ``block_k`` group, ``A_scale``
  ``(M, cdiv(K, block_k))`` row-major (``per_token_group_quant_fp8``).
* ``"none"``: no quantisation (bf16/fp16 weights and activations).

Scales are float32 and computed as ``amax / fp8_max`` (dynamic quantisation).
"""

from __future__ import annotations

from typing import Literal

import torch

QuantMode = Literal["tensor", "channel", "block", "none"]
QUANT_MODES: tuple[str, ...] = ("tensor", "channel", "block", "none")
FP8_DTYPE = torch.float8_e4m3fn
DEFAULT_BLOCK_SHAPE = (128, 128)
# vLLM clamps dynamic scales away from zero; a zero row must not divide by zero.
_MIN_AMAX = 1e-10


def fp8_max(dtype: torch.dtype = FP8_DTYPE) -> float:
    return float(torch.finfo(dtype).max)


def _to_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmax = fp8_max(dtype)
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype)


def _check_mode(mode: str) -> None:
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quant mode {mode!r}; expected one of {QUANT_MODES}")


def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    size = x.size(dim)
    extra = (-size) % multiple
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def quantize_weights(
    w: torch.Tensor,
    mode: QuantMode,
    block_shape: tuple[int, int] | list[int] | None = None,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Quantise expert weights ``w`` of shape ``(E, N, K)``; return ``(wq, B_scale)``."""
    _check_mode(mode)
    if w.dim() != 3:
        raise ValueError(f"weights must be (E, N, K), got {tuple(w.shape)}")
    if mode == "none":
        return w, None
    fmax = fp8_max(dtype)
    wf = w.float()
    if mode == "tensor":
        scale = wf.abs().amax(dim=(1, 2)).clamp(min=_MIN_AMAX) / fmax  # (E,)
        return _to_fp8(wf, scale[:, None, None], dtype), scale
    if mode == "channel":
        scale = wf.abs().amax(dim=2, keepdim=True).clamp(min=_MIN_AMAX) / fmax  # (E,N,1)
        return _to_fp8(wf, scale, dtype), scale
    bn, bk = block_shape or DEFAULT_BLOCK_SHAPE
    E, N, K = wf.shape
    wp = _pad_to(_pad_to(wf, 1, bn), 2, bk)
    nb, kb = wp.size(1) // bn, wp.size(2) // bk
    tiles = wp.view(E, nb, bn, kb, bk)
    scale = tiles.abs().amax(dim=(2, 4)).clamp(min=_MIN_AMAX) / fmax  # (E, nb, kb)
    q = _to_fp8(tiles, scale[:, :, None, :, None], dtype).view(E, nb * bn, kb * bk)
    return q[:, :N, :K].contiguous(), scale.contiguous()


def quantize_activations(
    a: torch.Tensor,
    mode: QuantMode,
    block_shape: tuple[int, int] | list[int] | None = None,
    static_scale: torch.Tensor | None = None,
    dtype: torch.dtype = FP8_DTYPE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Quantise activations ``a`` of shape ``(M, K)``; return ``(aq, A_scale)``.

    ``static_scale`` (per-tensor mode only) uses a given scale instead of the
    dynamic ``amax / fp8_max``.
    """
    _check_mode(mode)
    if a.dim() != 2:
        raise ValueError(f"activations must be (M, K), got {tuple(a.shape)}")
    if mode == "none":
        return a, None
    fmax = fp8_max(dtype)
    af = a.float()
    if mode == "tensor":
        if static_scale is not None:
            scale = static_scale.float().reshape(1).to(a.device)
        else:
            scale = (af.abs().amax().clamp(min=_MIN_AMAX) / fmax).reshape(1)
        return _to_fp8(af, scale, dtype), scale
    if static_scale is not None:
        raise ValueError("static_scale is only supported in 'tensor' mode")
    if mode == "channel":
        scale = af.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_AMAX) / fmax  # (M,1)
        return _to_fp8(af, scale, dtype), scale
    _, gk = block_shape or DEFAULT_BLOCK_SHAPE
    M, K = af.shape
    ap = _pad_to(af, 1, gk)
    groups = ap.view(M, -1, gk)
    scale = groups.abs().amax(dim=2).clamp(min=_MIN_AMAX) / fmax  # (M, K/gk)
    q = _to_fp8(groups, scale[:, :, None], dtype).view(M, -1)[:, :K]
    return q.contiguous(), scale.contiguous()
