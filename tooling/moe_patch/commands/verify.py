"""``moe-patch verify``: every check on every supported release, one report."""

from __future__ import annotations

from .. import verify as engine
from ..errors import UsageError
from ..settings import Settings


def verify(
    versions: list[str] | None = None,
    all_releases: bool = False,
    kernels: bool = False,
    kernels_python: str | None = None,
    jobs: int | None = None,
    settings: Settings | None = None,
) -> engine.VerifyReport:
    if versions and all_releases:
        raise UsageError("give --vllm VERSION or --all, not both")
    return engine.verify(versions or None, kernels, kernels_python, jobs, settings)


def releases(settings: Settings | None = None) -> list[str]:
    """The releases ``verify --all`` covers (what a CI matrix runs over)."""
    return engine.supported_releases(settings)
