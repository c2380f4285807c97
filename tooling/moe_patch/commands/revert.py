"""``moe-patch revert --installed``: ``apply --installed`` undone, byte for byte."""

from __future__ import annotations

from pathlib import Path

from .. import installed


def revert(target: Path | None = None) -> installed.InstalledReport:
    """Every file ``apply --installed`` changed in this environment's vLLM (or ``target``'s)
    back as the release shipped it, RECORD included."""
    return installed.revert(target)
