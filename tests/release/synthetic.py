"""A synthetic "next vLLM release", made from a real release tree.

The changes are the ones real releases make around the series' patches: lines
inserted above the patched kernel and inside it (right next to a patch's context),
and a neighbouring kernel renamed (so the hunk header's function context changes).
With ``conflict=True`` the release also rewrites the very line a patch changes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
NEIGHBOUR = "fused_moe_kernel_gptq_awq"
RENAMED = "fused_moe_kernel_wna16"
CONFLICTING_DECORATOR = "@triton.jit(launch_metadata=None)"
HELPER = (
    "@triton.jit\n"
    "def _synthetic_release_helper(x):\n"
    "    # new in the synthetic next release\n"
    "    return x + 1\n"
    "\n"
    "\n"
)


def _replace_once(text: str, old: str, new: str, start: int = 0) -> str:
    at = text.index(old, start)  # ValueError: the real tree changed shape; update this helper
    return text[:at] + new + text[at + len(old) :]


def next_release(
    source: Path, dest: Path, version: str, from_version: str, conflict: bool = False
) -> Path:
    """Copy the release tree ``source`` (version ``from_version``) to ``dest`` as
    release ``version`` with the changes described above."""
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    path = dest / FUSED_MOE
    text = path.read_text()
    # lines inserted above the patched kernels
    text = _replace_once(text, "@triton.jit\ndef ", HELPER + "@triton.jit\ndef ")
    # a neighbouring kernel renamed (definition and callers)
    assert NEIGHBOUR in text
    for file in dest.joinpath("vllm").rglob("*.py"):
        content = file.read_text()
        if NEIGHBOUR in content:
            file.write_text(content.replace(NEIGHBOUR, RENAMED))
    text = text.replace(NEIGHBOUR, RENAMED)
    # lines inserted inside the patched kernel: next to the patch's context, and in its body
    kernel = text.index("def fused_moe_kernel(")
    text = _replace_once(
        text,
        "    # Pointers to matrices\n",
        "    # Pointers to matrices (documented in the synthetic release)\n"
        "    # a_ptr: activations, b_ptr: weights, c_ptr: output\n",
        kernel,
    )
    text = _replace_once(
        text,
        "    pid = tl.program_id(axis=0)\n",
        "    pid = tl.program_id(axis=0)\n    # a line the synthetic release added\n",
        kernel,
    )
    if conflict:
        text = _replace_once(
            text,
            "@triton.jit\ndef fused_moe_kernel(",
            f"{CONFLICTING_DECORATOR}\ndef fused_moe_kernel(",
        )
    path.write_text(text)
    old_tuple = ", ".join(from_version.split("."))
    new_tuple = ", ".join(version.split("."))
    for name in ("PKG-INFO", "vllm/_version.py"):
        file = dest / name
        if file.is_file():
            content = file.read_text().replace(from_version, version)
            file.write_text(content.replace(f"({old_tuple})", f"({new_tuple})"))
    return dest
