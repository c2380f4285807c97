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
from types import ModuleType

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
