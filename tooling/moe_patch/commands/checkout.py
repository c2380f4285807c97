"""``moe-patch checkout``: the series as commits on its base release, to edit with git."""

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
