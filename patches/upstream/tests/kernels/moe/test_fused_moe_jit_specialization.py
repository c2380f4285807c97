# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""fused_moe_kernel must not specialise on per-batch token counts.

Triton specialises integer arguments on ``== 1`` and ``% 16 == 0``; EM and
num_valid_tokens change with every batch, so specialising on them compiles new
kernel variants on the request path.

Run `pytest tests/kernels/moe/test_fused_moe_jit_specialization.py`.
"""

import pytest

from vllm.model_executor.layers.fused_moe.fused_moe import fused_moe_kernel
from vllm.triton_utils import HAS_TRITON

pytestmark = pytest.mark.skipif(
    not HAS_TRITON, reason="needs Triton (vLLM stubs it out without a GPU driver)"
)


def _not_specialized() -> set[str]:
    names = list(fused_moe_kernel.arg_names)
    return {
        names[arg] if isinstance(arg, int) else arg
        for arg in fused_moe_kernel.do_not_specialize
    }


@pytest.mark.parametrize("arg", ["EM", "num_valid_tokens"])
def test_fused_moe_kernel_does_not_specialize_token_counts(arg: str):
    assert arg in fused_moe_kernel.arg_names
    assert arg in _not_specialized()
