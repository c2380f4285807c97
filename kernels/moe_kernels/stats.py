"""Error measures used to compare kernel output with a reference."""

from __future__ import annotations

import torch


def rel_frobenius_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref||_F / ||ref||_F`` in float64; NaN anywhere in ``out`` gives NaN."""
    o = out.to(torch.float64)
    r = ref.to(torch.float64)
    denom = torch.linalg.vector_norm(r)
    if denom == 0:
        return float(torch.linalg.vector_norm(o))
    return float(torch.linalg.vector_norm(o - r) / denom)


def row_rel_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Relative error of each row (last dim), float64; rows of zeros compare absolutely."""
    o = out.to(torch.float64).reshape(-1, out.size(-1))
    r = ref.to(torch.float64).reshape(-1, ref.size(-1))
    num = torch.linalg.vector_norm(o - r, dim=1)
    den = torch.linalg.vector_norm(r, dim=1)
    return torch.where(den > 0, num / den.clamp(min=1e-300), num)
