"""Imports run one way: the kernel harness and the end-to-end benchmark take trees, wheels and
values as arguments and never import moe-patch, which calls into them (``moe-patch tune``,
``python -m moe_patch.harness_trees``, ``python -m moe_patch.harness_wheels``)."""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
HARNESS = ("moe_kernels", "moe_e2e")


def tool_imports(root: Path = KERNELS) -> list[str]:
    """``file:line`` of every import of moe_patch in the harness's modules, at any depth
    (inside functions too)."""
    found = []
    for package in HARNESS:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                else:
                    continue
                if any(n == "moe_patch" or n.startswith("moe_patch.") for n in names):
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return found


def test_the_harness_never_imports_the_tool():
    assert tool_imports() == []


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    (tmp_path / "moe_kernels").mkdir()
    (tmp_path / "moe_e2e").mkdir()
    (tmp_path / "moe_e2e" / "x.py").write_text(
        "import json\n\ndef f():\n    from moe_patch.errors import MoePatchError\n"
    )
    assert tool_imports(tmp_path) == ["moe_e2e/x.py:4"]
