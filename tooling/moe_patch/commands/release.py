"""``moe-patch release``: record the series as released under moe-patch's version."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import __version__, releases
from ..errors import EXIT_VERIFY_FAILED, MoePatchError, UsageError
from ..report import FAIL
from ..settings import Settings, project_path, require_writable


@dataclass
class ReleaseResult:
    version: str
    tag: str
    record: str  # the record file written
    files: int  # files of the series it records
    changed: list[str]  # files that differ from the previous release (all, for the first)
    previous: str | None


def release(settings: Settings | None = None, version: str = __version__) -> ReleaseResult:
    """Write ``releases/<version>.json`` for the series in hand, after checking that the
    checkout's CHANGELOG.md has the release's section."""
    settings = settings or Settings.resolve()
    root = settings.series_root
    require_writable(root, "release")
    changelog = project_path("CHANGELOG.md")
    if changelog is None or not releases.changelog_has(changelog, version):
        raise UsageError(
            f"CHANGELOG.md has no '## [{version}] - YYYY-MM-DD' section: move the Unreleased "
            "entries under it first (docs/releasing.md)"
        )
    known = [r for r in releases.records(root) if r.version != version]
    previous = known[-1] if known else None
    written = releases.record(root, version, checkout=Path(changelog).parent)
    changed = releases.changed_files(previous.files if previous else {}, written.files)
    return ReleaseResult(
        version=version,
        tag=releases.tag_name(version),
        record=str(written.path),
        files=len(written.files),
        changed=changed,
        previous=previous.version if previous else None,
    )


def check(settings: Settings | None = None, version: str = __version__) -> releases.Comparison:
    """The series in hand against its last release (what verify's release-version check says)."""
    return releases.compare((settings or Settings.resolve()).series_root, version)


def check_failure(result: releases.Comparison) -> MoePatchError | None:
    """The error ``moe-patch release --check`` exits with once it has printed ``result``."""
    if result.status != FAIL:
        return None
    return MoePatchError("release --check failed", EXIT_VERIFY_FAILED)
