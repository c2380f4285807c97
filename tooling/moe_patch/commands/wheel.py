"""``moe-patch wheel``: the official wheel of a release with the series carried onto it."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

from .. import cache, folders, gpu_runs, release_diff, releases, series, trees
from .. import wheel as wheels
from ..errors import PatchFailed, UsageError
from ..settings import Settings
from .apply import apply as apply_tree

METHODS = ("repack", "precompiled")


def wheel(
    vllm: str | None,
    out_dir: Path,
    platform: str | None = None,
    settings: Settings | None = None,
    method: str = "repack",
    build_isolation: bool = True,
) -> wheels.WheelResult:
    started = time.monotonic()
    settings = settings or Settings.resolve()
    index_url = settings.index_url
    if method not in METHODS:
        raise UsageError(f"--method is one of {', '.join(METHODS)}, not {method!r}")
    if not build_isolation and method != "precompiled":
        raise UsageError("--no-build-isolation only applies to --method precompiled")
    version = trees.resolve_version(vllm, index_url)
    chosen = series.for_version(version, settings.series_root)  # no series: say so first
    gpu_runs.warn_if_unverified(chosen.directory, version)
    out_dir = out_dir.expanduser().absolute()
    official, dist = wheels.official_wheel(version, platform, index_url)
    rdiff = release_diff.build(version, settings)
    label = releases.series_version(settings.series_root)  # the series' own checkout's version
    with folders.made(out_dir):  # a failed build leaves no new --out behind
        if method == "repack":
            result = wheels.build(official, dist, rdiff, out_dir, label)
        else:
            result = _precompiled(
                version, official, dist, rdiff, out_dir, settings, build_isolation, label
            )
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _precompiled(version, official, dist, rdiff, out_dir, settings: Settings, isolation, label):
    with zipfile.ZipFile(official) as archive:
        shipped = {n for n in archive.namelist() if ".dist-info/" not in n and not n.endswith("/")}
    what = f"the vLLM {version} wheel"
    layout = release_diff.plan(rdiff, shipped, what)  # refuses compiled sources the same way
    new_version = wheels.patched_version(version, label)
    with cache.scratch("precompiled") as scratch:
        report = apply_tree(version, scratch / f"vllm-{version}", settings=settings)
        if not report.ok:  # pragma: no cover - release_diff.build already applied it
            raise PatchFailed(f"the series does not apply to vLLM {version}")
        path = wheels.build_precompiled(
            Path(report.tree), official, new_version, out_dir, build_isolation=isolation
        )
    return wheels.wheel_result(path, new_version, official, dist, rdiff, layout, "precompiled")
