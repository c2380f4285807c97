"""The v2 and v5 forms' quantisation points in float64 (``moe_kernels.reference`` has the
product version, ``reference.ref_moe_layer_decode``)."""

import torch


def fp8(x: torch.Tensor) -> torch.Tensor:
    """Through FP8 and back over the last axis; scale and quotient in float32 and exactly
    rounded, as the kernels compute them (``div_rn``).  The divisor is a tensor: PyTorch
    multiplies a CUDA tensor divided by a Python number by its reciprocal, a bit short of
    the division, and the FP8 ties break the other way wherever a scale comes out an ulp
    off (the CPU divides)."""
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True).clamp(min=1e-10)
    scale = amax / torch.full_like(amax, 448.0)
    return (x / scale).to(torch.float8_e4m3fn).double() * scale.double()


def emulate(x, w1d, w2d, ids, tw, group=128, rounded=True):
    """Hidden states in FP8 per token and 128 columns; SiLU-and-mul (rounded to ``x``'s
    dtype first where ``rounded``: v2) in FP8 per (token, expert) and ``group`` columns."""
    tokens, hidden = x.shape
    inter = w2d.size(2)
    xq = fp8(x.view(tokens, -1, 128)).view(tokens, hidden)
    out = torch.zeros(tokens, w2d.size(1), dtype=torch.float64, device=w2d.device)
    for t in range(tokens):
        for k in range(ids.size(1)):
            e = ids[t, k]
            h = w1d[e] @ xq[t]
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            act = act.to(x.dtype) if rounded else act
            act = torch.cat([fp8(act[i : i + group]) for i in range(0, inter, group)])
            out[t] += tw[t, k] * (w2d[e] @ act)
    return out


def group_width(form, config, tokens, top_k, experts, inter, sms) -> int:
    """The width of the intermediate's quantisation groups ``form`` uses for a launch: the
    config's ``block_i``, else the form's own choice (v9), else 64."""
    chosen = getattr(form, "intermediate_group", None)
    return config.get("block_i") or (chosen(tokens, top_k, experts, inter, sms) if chosen else 64)
