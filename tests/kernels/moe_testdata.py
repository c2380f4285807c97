"""Random test data for the fused-MoE kernel tests.

Magnitudes vary per expert, output channel, 128-wide K group, 128x128 tile and
token (log-normal factors), so a kernel that applies a wrong, shared or
misplaced scale gives a large error instead of one hidden by uniform data.
"""

from __future__ import annotations

import math

import torch

# Error bounds (relative Frobenius norm); kernels/README.md "Tolerances" explains them.
#
# Tight bounds, against float64 references fed the kernel's exact FP8 inputs (for the
# layer: chained on the kernel's own first-GEMM output).  Only float32 accumulation and
# the final rounding to bf16 differ: bf16 keeps 8 significant bits, a rounding error of
# at most 2^-8 = 3.9e-3 per element, ~1.7e-3 rms rounding to nearest; Triton's CPU
# interpreter truncates instead (measured 3.3e-3 median, 4.6e-3 worst).  A wrong scale,
# expert, row or K block gives errors of order 1.
GEMM_TOL = 1e-2
GEMM_ROW_TOL = 2e-2  # every output row on its own, so one bad token cannot hide
# Layer output vs the quantisation-matched reference chained on the kernel's own
# first-GEMM output: two roundings to bf16 (GEMM 2's output, then the top-k sum);
# measured 3.7e-3 median, 5.0e-3 worst.
LAYER_TOL = 1.5e-2
# Loose sanity bounds, against plain float64 math on the unquantised data, so they
# include FP8 quantisation error: e4m3 keeps 4 significant bits, ~2.6% rms relative
# error per quantised operand.  A GEMM has two (A, B): measured median 3.7e-2, worst
# 6.9e-2 in 40000 draws (one token, per-tensor).  The layer has four, and SiLU turns a
# gate value g's relative error into |g| times that where g is strongly negative: when
# a token's chosen experts' gates mostly are, its output is small and made of those
# values.  One token, 40000 draws: median 6.4e-2, 99.99th percentile 0.27-0.30, worst
# 0.43 (per-tensor and block alike): the earlier 0.25 would fail about one CI run in
# 170 (some 30 one-token layer cases a run).
# A missing SiLU or routed weight, or a wrong expert, gives errors of 1 and more.
GEMM_FLOAT_TOL = 1e-1
LAYER_FLOAT_TOL = 6e-1


def _lognormal(shape, gen, device, sigma=0.5) -> torch.Tensor:
    return torch.exp(sigma * torch.randn(shape, generator=gen, device=device))


def _group_factor(rows_shape, K, gen, device, group=128) -> torch.Tensor:
    g = _lognormal((*rows_shape, math.ceil(K / group)), gen, device)
    return g.repeat_interleave(group, dim=-1)[..., :K]


def make_weights(E, N, K, gen, device) -> torch.Tensor:
    """float32 ``(E, N, K)`` expert weights with varied magnitudes (per expert,
    output channel, K group and 128x128 tile)."""
    w = torch.randn((E, N, K), generator=gen, device=device) / math.sqrt(K)
    w = w * _lognormal((E, 1, 1), gen, device)
    w = w * _lognormal((E, N, 1), gen, device)
    w = w * _group_factor((E, 1), K, gen, device)
    tiles = _lognormal((E, math.ceil(N / 128), math.ceil(K / 128)), gen, device)
    return w * tiles.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :N, :K]


def make_activations(M, K, gen, device, dtype=torch.bfloat16) -> torch.Tensor:
    a = torch.randn((M, K), generator=gen, device=device)
    a = a * _lognormal((M, 1), gen, device) * _group_factor((M,), K, gen, device)
    return a.to(dtype)


def make_routing(M, topk, E, gen, device, n_dead: int = 1):
    """``topk_ids`` (int32) and ``topk_weights`` (float32, rows sum to 1).

    ``n_dead`` experts are never chosen, so at least that many experts get zero
    tokens; each token picks ``topk`` distinct experts among the others.
    """
    assert topk <= E - n_dead
    perm = torch.randperm(E, generator=gen, device=device)
    alive = perm[n_dead:]
    scores = torch.rand((M, alive.numel()), generator=gen, device=device)
    ids = alive[scores.argsort(dim=1)[:, :topk]].to(torch.int32)
    w = torch.rand((M, topk), generator=gen, device=device) + 0.1
    w = w / w.sum(dim=1, keepdim=True)
    return ids, w.float()


def zero_token_experts(topk_ids: torch.Tensor, E: int) -> list[int]:
    counts = torch.bincount(topk_ids.flatten().long(), minlength=E)
    return [e for e in range(E) if counts[e] == 0]


def assert_gemm_matches(C: torch.Tensor, ref: torch.Tensor) -> None:
    """A GEMM output against its exact-input float64 reference: as a whole and row by row."""
    from moe_kernels.stats import rel_frobenius_error, row_rel_errors

    err = rel_frobenius_error(C, ref)
    assert err < GEMM_TOL, f"rel. Frobenius error {err:.3e}"
    worst = float(row_rel_errors(C, ref).max())
    assert worst < GEMM_ROW_TOL, f"worst row rel. error {worst:.3e}"
