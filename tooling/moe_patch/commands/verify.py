"""``moe-patch verify``: every check on every supported release, one report."""

from __future__ import annotations

from .. import verify as engine
from ..errors import EXIT_VERIFY_FAILED, MoePatchError, UsageError
from ..report import FAIL
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


def failure(report: engine.VerifyReport) -> MoePatchError | None:
    """The error ``moe-patch verify`` exits with once it has printed ``report``: the checks
    that failed, the first four named."""
    if report.ok:
        return None
    failed = [f"{w} {c.name}" for w, c in report.all_checks() if c.status == FAIL]
    more = f" (+{len(failed) - 4} more)" if len(failed) > 4 else ""
    return MoePatchError(f"verify failed: {', '.join(failed[:4])}{more}", EXIT_VERIFY_FAILED)
