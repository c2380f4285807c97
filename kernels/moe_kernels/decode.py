"""vLLM's fused decode MoE path (``fused_moe_decode.py``), run from a source tree.

A tree with the series' ``fused-decode`` patch has the module: its three Triton
kernels and their launcher need torch and triton only (the parts that decide when vLLM
takes the path import vLLM lazily and are not called here).  The module is imported
from a copy whose ``from vllm.triton_utils import tl, triton`` line imports the real
packages instead, on the same line, so Triton's errors point at the tree's lines.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace

from . import interpreter_compat
from .loader import FUSED_MOE_REL, KernelLoadError, import_source

DECODE_REL = FUSED_MOE_REL.parent / "fused_moe_decode.py"
_VLLM_TRITON = "from vllm.triton_utils import tl, triton"
_REAL_TRITON = "import triton; import triton.language as tl"


def has_fused_decode(tree: str | os.PathLike[str]) -> bool:
    return (Path(tree) / DECODE_REL).is_file()


def load_fused_moe_decode(tree: str | os.PathLike[str]) -> ModuleType:
    """The tree's ``fused_moe_decode`` module; ``KernelLoadError`` if it has none."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        # the kernels loop over runtime bounds and quantise to FP8 themselves
        interpreter_compat.apply()
        interpreter_compat.apply_fp8_rounding()
    source = Path(tree).resolve() / DECODE_REL
    if not source.is_file():
        raise KernelLoadError(f"{source} does not exist (the tree has no fused decode path)")
    text = source.read_text()
    if _VLLM_TRITON not in text:
        raise KernelLoadError(f"{source} does not import triton as {_VLLM_TRITON!r}")
    text = text.replace(_VLLM_TRITON, _REAL_TRITON)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return import_source(
        text, f"{digest}/vllm_fused_moe_decode_{digest}.py", f"_moe_kernels_decode_{digest}"
    )


def fused_decode_tokens(
    tree: str | os.PathLike[str],
    experts_shape: tuple[int, int],
    block: bool,
    static_activations: bool = False,
) -> int:
    """The largest decode batch the tree's rule sends down the fused path for a layer of
    ``experts_shape`` (hidden, intermediate) in FP8 (128x128 blocks, or per-tensor weights
    with dynamic or static activation scales), read from the tree's own module
    (``max_fused_tokens`` and ``MAX_EXPERT_BYTES``); 0 where it has no fused path or the
    rule never takes it.  The rule's other conditions (Hopper, vLLM's Triton experts, no
    expert parallelism, SiLU) are the engine's to meet."""
    if not has_fused_decode(tree):
        return 0
    module = load_fused_moe_decode(tree)
    hidden, intermediate = experts_shape
    if 3 * hidden * intermediate > module.MAX_EXPERT_BYTES:  # gate, up and down in FP8
        return 0
    quant = SimpleNamespace(
        block_shape=[128, 128] if block else None,
        per_out_ch_quant=False,
        per_act_token_quant=False,
        a1_scale=1.0 if static_activations else None,
    )
    return int(module.max_fused_tokens(quant))
