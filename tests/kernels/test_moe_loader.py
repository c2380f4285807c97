"""moe_kernels.loader: extracting fused_moe_kernel from a tree without importing vLLM."""

from __future__ import annotations

import re
import sys

import pytest
import torch
from moe_kernels import KernelLoadError, fused_moe_gemm, load_fused_moe_kernel, quantize_weights
from moe_kernels.loader import FUSED_MOE_REL

CORE_PARAMS = {
    "a_ptr", "b_ptr", "c_ptr", "a_scale_ptr", "b_scale_ptr", "topk_weights_ptr",
    "sorted_token_ids_ptr", "expert_ids_ptr", "num_tokens_post_padded_ptr",
    "N", "K", "EM", "num_valid_tokens", "group_n", "group_k",
    "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
    "MUL_ROUTED_WEIGHT", "top_k", "compute_type", "use_fp8_w8a8", "per_channel_quant",
}  # fmt: skip


def test_loads_kernel_from_tree(kernel, vllm_tree):
    src = (vllm_tree / FUSED_MOE_REL).read_text()
    assert CORE_PARAMS <= set(kernel.param_names)
    assert kernel.has_swap_ab == bool(re.search(r"^\s+SWAP_AB: tl\.constexpr", src, re.M))
    assert "write_zeros_to_output" in kernel.helpers
    gen = kernel.module_path.read_text()
    assert "vllm" not in "\n".join(line for line in gen.splitlines() if "import" in line)
    # the kernel keeps its line number, so Triton errors point into the tree's file
    def_line = src.splitlines().index("def fused_moe_kernel(") + 1
    assert gen.splitlines()[def_line - 1] == "def fused_moe_kernel("
    assert not [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]


def test_decorator_kwargs_match_runtime(kernel):
    """What the loader parses from the source is what Triton applies."""
    parsed = kernel.decorator_kwargs
    runtime = kernel.runtime_non_specialized()
    for key in ("do_not_specialize", "do_not_specialize_on_alignment"):
        want = {kernel.param_names[v] if isinstance(v, int) else v for v in parsed.get(key, [])}
        assert set(runtime[key]) == want


def _with_jit_kwargs(vllm_tree, tmp_path, kwargs: str):
    text = (vllm_tree / FUSED_MOE_REL).read_text()
    # Replace the decorator whether the tree has a bare @triton.jit or one with arguments.
    new, count = re.subn(
        r"@triton\.jit(?:\([^)]*\))?\ndef fused_moe_kernel\(",
        f"@triton.jit({kwargs})\ndef fused_moe_kernel(",
        text,
    )
    assert count == 1
    dst = tmp_path / "tree" / FUSED_MOE_REL
    dst.parent.mkdir(parents=True)
    dst.write_text(new)
    return dst.parents[len(FUSED_MOE_REL.parts) - 1]


def test_decorator_kwargs_parsed(vllm_tree, tmp_path, gen, device):
    tree = _with_jit_kwargs(
        vllm_tree,
        tmp_path,
        'do_not_specialize=["EM", "num_valid_tokens"], do_not_specialize_on_alignment=["N"]',
    )
    k = load_fused_moe_kernel(tree)
    assert k.decorator_kwargs == {
        "do_not_specialize": ["EM", "num_valid_tokens"],
        "do_not_specialize_on_alignment": ["N"],
    }
    rt = k.runtime_non_specialized()
    assert set(rt["do_not_specialize"]) == {"EM", "num_valid_tokens"}
    assert set(rt["do_not_specialize_on_alignment"]) == {"N"}
    # the annotated kernel still runs
    w = torch.randn((4, 64, 128), generator=gen, device=device)
    bq, bs = quantize_weights(w, "tensor")
    a = torch.randn((3, 128), generator=gen, device=device).bfloat16()
    ids = torch.tensor([[0, 2], [1, 2], [3, 0]], dtype=torch.int32, device=device)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1)
    run = fused_moe_gemm(k, a, bq, bs, ids, None, cfg, "tensor", naive=False)
    assert not run.C.isnan().any()


SYNTH_MAIN = """\
import torch
from vllm.triton_utils import tl, triton
from vllm.other_mod import outer_helper as renamed_helper, OTHER_CONST

SCALE = tl.constexpr(3)
UNUSED = torch.zeros(1)  # must not be pulled in


@triton.jit
def _inner(x):
    return x * SCALE


@triton.jit
def _middle(x):
    return _inner(x) + renamed_helper(x)


def plain_python():
    return 1


@triton.jit(do_not_specialize=[1])
def fused_moe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, _middle(x) + OTHER_CONST, mask=mask)
"""

SYNTH_OTHER = """\
from vllm.triton_utils import tl, triton

OTHER_CONST = tl.constexpr(100.0)


@triton.jit
def outer_helper(x):
    return x * 2
"""


def _synthetic_tree(tmp_path, main=SYNTH_MAIN):
    root = tmp_path / "synth"
    f = root / FUSED_MOE_REL
    f.parent.mkdir(parents=True)
    f.write_text(main)
    (root / "vllm" / "other_mod.py").write_text(SYNTH_OTHER)
    return root


def test_transitive_helpers_constants_and_vllm_imports(tmp_path, device):
    k = load_fused_moe_kernel(_synthetic_tree(tmp_path))
    assert set(k.helpers) == {"_inner", "_middle"}
    assert k.decorator_kwargs == {"do_not_specialize": [1]}
    assert k.runtime_non_specialized()["do_not_specialize"] == ("n",)
    gen = k.module_path.read_text()
    assert "UNUSED" not in gen and "plain_python" not in gen and "import torch" not in gen
    x = torch.arange(5, dtype=torch.float32, device=device)
    k.kernel[(1,)](x, 5, BLOCK=8)
    assert x.tolist() == [v * 3 + v * 2 + 100.0 for v in range(5)]


def test_errors_are_explicit(tmp_path):
    with pytest.raises(KernelLoadError, match="does not exist"):
        load_fused_moe_kernel(tmp_path / "nothing")
    root = _synthetic_tree(tmp_path, SYNTH_MAIN.replace("def fused_moe_kernel", "def other_kernel"))
    with pytest.raises(KernelLoadError, match="fused_moe_kernel not found"):
        load_fused_moe_kernel(root)
    bad = SYNTH_MAIN.replace(
        "return _inner(x) + renamed_helper(x)", "return _inner(x) + plain_python()"
    )
    (tmp_path / "b").mkdir()
    with pytest.raises(KernelLoadError, match="plain Python function"):
        load_fused_moe_kernel(_synthetic_tree(tmp_path / "b", bad))
    missing = SYNTH_MAIN.replace("x * SCALE", "x * NOT_DEFINED")
    (tmp_path / "c").mkdir()
    with pytest.raises(KernelLoadError, match="NOT_DEFINED"):
        load_fused_moe_kernel(_synthetic_tree(tmp_path / "c", missing))


def test_source_is_read_at_run_time(tmp_path):
    """Two trees that differ only in the kernel body give two distinct kernels."""
    a = load_fused_moe_kernel(_synthetic_tree(tmp_path / "a"))
    b_root = _synthetic_tree(
        tmp_path / "b", SYNTH_MAIN.replace("SCALE = tl.constexpr(3)", "SCALE = tl.constexpr(5)")
    )
    b = load_fused_moe_kernel(b_root)
    assert a.module_path != b.module_path and a.kernel is not b.kernel
    assert "SCALE = tl.constexpr(5)" in b.module_path.read_text()
