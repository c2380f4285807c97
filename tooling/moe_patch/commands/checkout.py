"""``moe-patch checkout`` and ``moe-patch export``: the series as commits, and back."""

from __future__ import annotations

from pathlib import Path

from .. import trees, workflow
from ..settings import Settings


def checkout(
    vllm: str | None, into: Path, settings: Settings | None = None
) -> workflow.CheckoutResult:
    settings = settings or Settings.resolve()
    version = trees.resolve_version(vllm, settings.index_url)
    return workflow.checkout(version, into, settings)


def export(
    tree: Path, series_root: Path | None = None, check: bool = False, author: str | None = None
) -> workflow.ExportResult:
    """``series_root`` only for a tree ``checkout`` did not make (it records its own)."""
    return workflow.export_tree(tree, series_root, check, author)
