"""Torch implementation of vLLM's ``moe_align_block_size`` semantics.

vLLM computes this with a CUDA op (``csrc/moe/moe_align_sum_kernels.cu``); the
fused-MoE Triton kernel consumes its three outputs:

* ``sorted_token_ids`` (int32, length ``max_num_tokens_padded``): flat indices
  ``i`` into ``topk_ids.flatten()`` grouped by expert, each expert's group padded
  to a multiple of ``block_size`` with the sentinel ``topk_ids.numel()``; every
  entry past the last expert's group is the sentinel too.
* ``expert_ids`` (int32, one per ``block_size`` block): the expert of each block;
  blocks past ``num_tokens_post_padded`` are ``-1``.  With an ``expert_map``
  (expert parallelism) blocks of experts that are not local are ``-1`` as well:
  the kernel writes zeros for those rows (``write_zeros_to_output``).
* ``num_tokens_post_padded`` (int32, shape ``(1,)``): the sum of the padded
  group sizes; the kernel returns early for blocks at or past it, so it never
  reads the ``-1`` tail of ``expert_ids``.

Experts that receive no token get no block at all.  Within an expert, tokens
keep their flat order (vLLM's large-batch CUDA path fills them with atomics, so
its order inside a group can differ; the kernel does not depend on it).
"""

from __future__ import annotations

import torch


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_num_tokens_padded(
    numel: int, block_size: int, num_experts: int, pad_sorted_ids: bool = False
) -> int:
    """Length of ``sorted_token_ids`` as vLLM allocates it."""
    n = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        n = cdiv(n, block_size) * block_size
    if numel < num_experts:
        n = min(numel * block_size, n)
    return n


def moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    pad_sorted_ids: bool = False,
    ignore_invalid_experts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``.

    Arguments mirror ``vllm.model_executor.layers.fused_moe.moe_align_block_size``:
    ``num_experts`` is the global expert count; ``expert_map`` maps a global expert
    to its local index or -1.  With ``ignore_invalid_experts=False`` all experts
    are aligned and blocks of non-local experts get ``expert_ids == -1``; with
    ``True`` routes to non-local experts are dropped (no -1 blocks) and
    ``expert_ids`` hold local indices.
    """
    device = topk_ids.device
    numel = topk_ids.numel()
    flat = topk_ids.reshape(-1).to(torch.int64)
    valid = (flat >= 0) & (flat < num_experts)
    ids = flat.clone()
    if expert_map is not None and ignore_invalid_experts:
        em = expert_map.to(device=device, dtype=torch.int64)
        mapped = torch.full_like(ids, -1)
        mapped[valid] = em[ids[valid]]
        valid &= mapped >= 0
        ids = mapped

    n_pad = max_num_tokens_padded(numel, block_size, num_experts, pad_sorted_ids)
    n_blocks = cdiv(n_pad, block_size)
    sorted_ids = torch.full((n_pad,), numel, dtype=torch.int32, device=device)
    expert_ids = torch.full((n_blocks,), -1, dtype=torch.int32, device=device)

    ids_valid = ids[valid]
    counts = torch.bincount(ids_valid, minlength=num_experts)[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    starts[1:] = torch.cumsum(padded, 0)
    total = int(starts[-1])
    if total > n_pad:  # cannot happen for valid inputs; guard the indexing below
        raise ValueError(f"padded token count {total} exceeds buffer size {n_pad}")

    src = torch.nonzero(valid).flatten()  # flat indices, ascending
    order = torch.argsort(ids_valid, stable=True)
    src_sorted = src[order]
    exp_sorted = ids_valid[order]
    unpadded_starts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    unpadded_starts[1:] = torch.cumsum(counts, 0)
    rank = torch.arange(exp_sorted.numel(), device=device) - unpadded_starts[exp_sorted]
    sorted_ids[starts[exp_sorted] + rank] = src_sorted.to(torch.int32)

    block_expert = torch.repeat_interleave(
        torch.arange(num_experts, device=device), padded // block_size
    )
    if expert_map is not None and not ignore_invalid_experts:
        block_expert = expert_map.to(device=device, dtype=torch.int64)[block_expert]
    expert_ids[: block_expert.numel()] = block_expert.to(torch.int32)
    num_post = torch.tensor([total], dtype=torch.int32, device=device)
    return sorted_ids, expert_ids, num_post


def use_naive_block_assignment(
    num_tokens: int, top_k: int, num_experts: int, expert_map: torch.Tensor | None = None
) -> bool:
    """vLLM's rule (0.20+) for skipping the alignment: one block per (token, expert)."""
    return expert_map is None and num_tokens * top_k * 4 <= num_experts


def naive_block_assignment(
    topk_ids: torch.Tensor, block_size_m: int
) -> tuple[None, torch.Tensor, torch.Tensor]:
    """The ``sorted_token_ids is None`` path of ``_prepare_expert_assignment``."""
    return (
        None,
        topk_ids.reshape(-1),
        torch.full(
            (1,), topk_ids.numel() * block_size_m, dtype=torch.int32, device=topk_ids.device
        ),
    )


def prepare_expert_assignment(
    topk_ids: torch.Tensor,
    block_size_m: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    *,
    naive: bool | None = None,
    ignore_invalid_experts: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """vLLM's ``_prepare_expert_assignment``: naive path or full alignment.

    ``naive=None`` applies :func:`use_naive_block_assignment`; a bool forces it.
    """
    T, top_k = topk_ids.shape
    if naive is None:
        naive = use_naive_block_assignment(T, top_k, num_experts, expert_map)
    if naive:
        return naive_block_assignment(topk_ids, block_size_m)
    return moe_align_block_size(
        topk_ids,
        block_size_m,
        num_experts,
        expert_map,
        ignore_invalid_experts=ignore_invalid_experts,
    )
