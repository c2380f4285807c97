"""``moe-patch export``: the commits of a checkout (or rebase) tree written back as the series."""

from __future__ import annotations

from pathlib import Path

from .. import workflow
from ..errors import EXIT_EXPORT_STALE, MoePatchError


def export(
    tree: Path, series_root: Path | None = None, check: bool = False, author: str | None = None
) -> workflow.ExportResult:
    """``series_root`` only for a tree ``checkout`` did not make (it records its own)."""
    return workflow.export_tree(tree, series_root, check, author)


def failure(result: workflow.ExportResult, check: bool) -> MoePatchError | None:
    """The error ``moe-patch export --check`` exits with once it has printed ``result``: the
    series files are not what the commits export to."""
    if not (check and result.changed):
        return None
    return MoePatchError(
        f"{result.series_dir} is not what the commits export to; run moe-patch export",
        EXIT_EXPORT_STALE,
    )
