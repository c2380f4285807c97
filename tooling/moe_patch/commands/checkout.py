"""``moe-patch checkout`` and ``moe-patch export``: the series as commits, and back."""

from __future__ import annotations

from pathlib import Path

from .. import workflow
from .apply import resolve_version


def checkout(
    vllm: str | None, into: Path, series_root: Path | None = None, index_url: str | None = None
) -> workflow.CheckoutResult:
    version = resolve_version(vllm, index_url)
    return workflow.checkout(version, into, series_root, index_url)


def export(
    tree: Path, series_root: Path | None = None, check: bool = False, author: str | None = None
) -> workflow.ExportResult:
    return workflow.export_tree(tree, series_root, check, author)
