"""``moe-patch status --installed``: whether the installed vLLM is patched, file by file."""

from __future__ import annotations

from pathlib import Path

from .. import installed
from ..settings import Settings


def status(
    target: Path | None = None, settings: Settings | None = None
) -> installed.InstalledReport:
    """The vLLM installed in this environment (or in ``target``) against the series."""
    return installed.status(target, settings)
