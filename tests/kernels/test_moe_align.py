"""moe_kernels.align: the torch version of vLLM's moe_align_block_size."""

from __future__ import annotations

import pytest
import torch
from moe_kernels.align import (
    max_num_tokens_padded,
    moe_align_block_size,
    prepare_expert_assignment,
)


def _check_invariants(topk_ids, block, E, sorted_ids, expert_ids, num_post, local=None):
    """Properties every consumer of the alignment relies on."""
    numel = topk_ids.numel()
    flat = topk_ids.flatten().long()
    total = int(num_post.item())
    assert sorted_ids.dtype == expert_ids.dtype == num_post.dtype == torch.int32
    assert total % block == 0
    assert sorted_ids.numel() == max_num_tokens_padded(numel, block, E)
    assert expert_ids.numel() == -(-sorted_ids.numel() // block)
    assert (sorted_ids[total:] == numel).all()
    assert (expert_ids[total // block :] == -1).all()
    seen = []
    for b in range(total // block):
        ids = sorted_ids[b * block : (b + 1) * block].long()
        real = ids[ids < numel]
        assert real.numel() > 0, "a block with no token"
        e = int(expert_ids[b])
        experts = flat[real]
        assert (experts == experts[0]).all(), "block mixes experts"
        expected = int(experts[0]) if local is None else int(local[experts[0]])
        assert e == expected
        # padding only at the end of the expert's last block
        pad = (ids == numel).nonzero()
        if pad.numel():
            assert (ids[int(pad[0]) :] == numel).all()
        seen += real.tolist()
    return sorted(seen)


def test_vllm_docstring_example():
    # From vLLM's moe_align_block_size docstring (expert ids 1..4, 5 experts).
    topk_ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    s, e, n = moe_align_block_size(topk_ids, 4, 5)
    assert int(n) == 16
    assert s[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert e[:4].tolist() == [1, 2, 3, 4]
    assert (e[4:] == -1).all()


@pytest.mark.parametrize("M,topk,E,block", [(1, 1, 4, 16), (3, 2, 8, 16), (7, 2, 8, 16),
                                            (33, 4, 16, 32), (64, 8, 32, 64), (5, 3, 64, 16)])  # fmt: skip
def test_random_routing_with_empty_experts(M, topk, E, block):
    g = torch.Generator().manual_seed(M * 1000 + E)
    used = torch.randperm(E, generator=g)[: max(topk, E // 2)]  # half the experts unused
    ids = torch.stack([used[torch.randperm(used.numel(), generator=g)[:topk]] for _ in range(M)])
    ids = ids.to(torch.int32)
    s, e, n = moe_align_block_size(ids, block, E)
    assert _check_invariants(ids, block, E, s, e, n) == list(range(ids.numel()))
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    expected_total = int(((counts + block - 1) // block * block).sum())
    assert int(n) == expected_total
    for x in range(E):
        assert ((e == x).sum() > 0) == (counts[x] > 0), "empty expert must own no block"


def test_fewer_routes_than_experts_buffer():
    ids = torch.tensor([[5, 1]], dtype=torch.int32)
    s, e, n = moe_align_block_size(ids, 16, 64)
    assert s.numel() == 2 * 16  # min(numel * block, numel + E * (block - 1))
    assert int(n) == 32 and e[:2].tolist() == [1, 5]


def test_expert_map_marks_remote_blocks():
    E, block = 8, 4
    local = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32)  # even experts local
    ids = torch.tensor([[0, 1], [2, 3], [1, 4], [7, 6], [0, 5]], dtype=torch.int32)
    s, e, n = moe_align_block_size(ids, block, E, expert_map=local)
    _check_invariants(ids, block, E, s, e, n, local=local)
    assert (e[: int(n) // block] == -1).sum() == 4  # experts 1, 3, 5, 7 have one block each
    # ignore_invalid_experts: remote routes dropped, local expert indices, no -1 before the tail
    s2, e2, n2 = moe_align_block_size(ids, block, E, expert_map=local, ignore_invalid_experts=True)
    nb = int(n2) // block
    assert nb == 4 and (e2[:nb] >= 0).all() and sorted(e2[:nb].tolist()) == [0, 1, 2, 3]
    routed = sorted(x for x in s2[: int(n2)].tolist() if x < ids.numel())
    assert routed == [i for i, x in enumerate(ids.flatten().tolist()) if local[x] >= 0]


def test_naive_assignment_rule():
    ids = torch.tensor([[3, 1]], dtype=torch.int32)
    s, e, n = prepare_expert_assignment(ids, 16, 8)  # 1 * 2 * 4 <= 8 -> naive
    assert s is None and e.tolist() == [3, 1] and int(n) == 2 * 16
    s, e, n = prepare_expert_assignment(ids, 16, 7)  # 8 > 7 -> aligned
    assert s is not None
    s, e, n = prepare_expert_assignment(ids, 16, 8, naive=False)
    assert s is not None
