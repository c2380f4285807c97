"""``moe-patch apply``: a vLLM work tree with the series applied, or (``installed``) the
vLLM installed in an environment patched in place."""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import applier, gitutil, gpu_runs, series, sources, trees
from ..errors import PatchFailed, UsageError
from ..installed import InstalledReport
from ..installed import apply as apply_installed
from ..report import FAILED, ApplyReport
from ..settings import Settings


def apply(
    vllm: str | None,
    into: Path | None = None,
    source: Path | None = None,
    git_url: str | None = None,
    in_place: bool = False,
    only: list[str] | None = None,
    settings: Settings | None = None,
    any_base: bool = False,
    *,
    installed: bool = False,
    target: Path | None = None,
) -> ApplyReport | InstalledReport:
    """The series applied to a work tree (``into``), or with ``installed`` (or a ``target``
    folder) to the installed vLLM (:func:`moe_patch.installed.apply`)."""
    settings = settings or Settings.resolve()
    if installed or target:
        if into or source or git_url or in_place:
            raise UsageError("--installed patches the installed vLLM; drop --into/--source/--git")
        return apply_installed(target, vllm, settings, only or None)
    index_url = settings.index_url
    if source and git_url:
        raise UsageError("give either --source or --git, not both")
    if in_place and not source:
        raise UsageError("--in-place only applies to a --source checkout")
    if in_place and into:
        raise UsageError("--in-place patches --source itself; drop --into")

    detected = None
    if source:
        source = source.expanduser().absolute()
        sources.check_vllm_tree(source)
        detected = sources.detect_version(source)
        if vllm is None and detected is None:
            raise UsageError(f"cannot tell which vLLM release {source} is; pass --vllm VERSION")
    version = trees.resolve_version(vllm or detected, index_url, offline_ok=bool(source or git_url))
    if source:
        sources.warn_version_mismatch(detected, version, source)
        sources.check_is_release(source, version, any_base, index_url)
    elif any_base:
        raise UsageError("--any-base is for a --source that is not a release; drop it")
    chosen = series.for_version(version, settings.series_root)
    chosen.select(only)  # reject unknown ids before touching anything
    gpu_runs.warn_if_unverified(chosen.directory, version)

    target = (
        source if in_place else (into or Path.cwd() / f"vllm-{version}").expanduser().absolute()
    )
    work = _prepare(version, target, source, git_url, in_place, index_url)
    try:
        return applier.apply_series(work.path, work.base, version, chosen, only, index_url)
    except BaseException:
        if work.created and not applier.read_applied(work.path).get("heads"):
            shutil.rmtree(work.path, ignore_errors=True)  # nothing of value was made yet
        raise


def failure(report: ApplyReport | InstalledReport) -> PatchFailed | None:
    """The error ``moe-patch apply`` exits with once it has printed ``report``: the patch that
    failed to apply to the work tree (an installed vLLM is never left half patched)."""
    if not isinstance(report, ApplyReport) or report.ok:
        return None
    failed = next(o for o in report.outcomes if o.status == FAILED)
    return PatchFailed(
        f"patch {failed.id} failed ({failed.detail}); the tree is at the last good commit "
        f"on {report.branch}; refresh the patch for this release, or leave it out with --only"
    )


def _prepare(version, target: Path, source, git_url, in_place, index_url) -> sources.WorkTree:
    if in_place:
        return sources.from_local(source, None, True, version)
    if (target / ".git").exists():
        base = applier.owned_base(target, version, source)  # else the user's: refused
        return sources.WorkTree(target, base, created=False)

    def mark(tree: Path) -> None:  # a run killed before its first patch finds it its own
        applier.record_made(tree, target, version, gitutil.run(tree, "rev-parse", "HEAD"))

    if source:
        return sources.from_local(source, target, False, version, mark=mark)
    if git_url:
        return sources.from_git_url(version, target, git_url, mark=mark)
    return sources.from_cache(version, target, index_url, mark=mark)
