"""The JIT patch must keep fused_moe_kernel from specialising on token counts.

Fails if a patched kernel (the series applied to a release) regains a
specialisation on an argument that changes with every batch's token count,
whether in the decorator as written or in what Triton actually applies.
"""

from __future__ import annotations

import pytest
from moe_kernels import load_fused_moe_kernel

TOKEN_COUNT_ARGS = ("EM", "num_valid_tokens")


@pytest.mark.parametrize("label", ["0.21.0+moe", "0.33.0+moe"])
def test_patched_kernel_does_not_specialise_on_token_counts(release_trees, label):
    kernel = load_fused_moe_kernel(release_trees(label))
    declared = set(kernel.decorator_kwargs.get("do_not_specialize", []))
    applied = set(kernel.runtime_non_specialized()["do_not_specialize"])
    for name in TOKEN_COUNT_ARGS:
        assert name in declared, f"{label}: @triton.jit no longer lists {name} in do_not_specialize"
        assert name in applied, f"{label}: Triton specialises {name} despite the decorator"


@pytest.mark.parametrize("label", ["0.21.0", "0.33.0"])
def test_released_kernel_still_specialises(release_trees, label):
    """The guard above is not vacuous: the unpatched releases do specialise."""
    kernel = load_fused_moe_kernel(release_trees(label))
    applied = set(kernel.runtime_non_specialized()["do_not_specialize"])
    assert not applied & set(TOKEN_COUNT_ARGS)
