"""Released versions of the series: what each release's patch files were, and whether the
series in hand may still carry the version it says.

moe-patch and its series share one version, ``__version__`` in ``moe_patch/__init__.py``.
A release records the series' content when it is cut (``moe-patch release``)::

    patches/releases/0.2.0.json     {"version": "0.2.0", "files": {"v0.20.0/series": sha256, ...}}

``files`` covers what changes what ``apply`` does: every base's ``series`` and ``*.patch``
files and the test files the patches' pull requests add (``upstream/``).  ``verify`` compares
the series in hand with the newest record: patch files that differ from it while the version
has not moved are a failure, so the same version never names two series.  A record may be
rewritten until its release is tagged (``git tag vX.Y.Z``); after that it is final.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from . import __version__, gitutil
from .errors import StateError, UsageError

RELEASES_DIR = "releases"


@dataclass(frozen=True)
class Record:
    version: str
    files: dict[str, str]  # path under the series root -> sha256
    path: Path


@dataclass(frozen=True)
class Comparison:
    """The series in hand against the newest release record."""

    status: str  # "pass" / "fail" / "skip" (the words verify's report uses)
    detail: str


def content(series_root: Path) -> dict[str, str]:
    """Path (relative to ``series_root``, POSIX) -> sha256 of every file that makes the series:
    each ``v<base>/series`` and ``v<base>/*.patch``, and everything under ``upstream/``."""
    root = Path(series_root)
    found: dict[str, str] = {}
    for base in sorted(p for p in root.glob("v*") if p.is_dir()):
        for path in sorted([*base.glob("series"), *base.glob("*.patch")]):
            found[path.relative_to(root).as_posix()] = _sha256(path)
    upstream = root / "upstream"
    for path in sorted(upstream.rglob("*")) if upstream.is_dir() else []:
        if path.is_file() and "__pycache__" not in path.parts:
            found[path.relative_to(root).as_posix()] = _sha256(path)
    return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def records(series_root: Path) -> list[Record]:
    """Every release recorded beside the series, oldest first."""
    folder = Path(series_root) / RELEASES_DIR
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            version = str(Version(data["version"]))
            files = dict(data["files"])
        except (OSError, ValueError, KeyError, TypeError, InvalidVersion):
            raise UsageError(
                f"{path} is not a release record ({{'version': ..., 'files': {{...}}}}); "
                "restore it from git"
            ) from None
        if path.stem != version:
            raise UsageError(f"{path} records release {version}; its name must be {version}.json")
        found.append(Record(version, files, path))
    return sorted(found, key=lambda r: Version(r.version))


def changed_files(old: dict[str, str], new: dict[str, str]) -> list[str]:
    return sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))


def _summary(names: list[str]) -> str:
    more = f" (+{len(names) - 3} more)" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def compare(series_root: Path, version: str = __version__) -> Comparison:
    """The ``release-version`` check of ``verify``."""
    known = records(series_root)
    if not known:
        return Comparison("skip", f"no release recorded under {Path(series_root) / RELEASES_DIR}")
    latest = known[-1]
    if Version(version) < Version(latest.version):
        return Comparison(
            "fail",
            f"moe-patch is {version}, older than the series' last release {latest.version}: "
            "run the moe-patch of this checkout",
        )
    changed = changed_files(latest.files, content(series_root))
    if Version(version) > Version(latest.version):
        since = (
            f"changed since {latest.version}: {_summary(changed)}"
            if changed
            else (f"as released in {latest.version}")
        )
        return Comparison("pass", f"{version} (not released yet); {since}")
    if changed:
        return Comparison(
            "fail",
            f"the series differs from release {latest.version} ({_summary(changed)}) but the "
            f"version is still {version}: move __version__ in tooling/moe_patch/__init__.py "
            "and record the release (docs/releasing.md)",
        )
    return Comparison("pass", f"as released in {version}")


def tag_name(version: str = __version__) -> str:
    return f"v{version}"


def _tagged(checkout: Path, tag: str) -> bool:
    try:
        gitutil.run(checkout, "rev-parse", "-q", "--verify", f"refs/tags/{tag}")
    except (OSError, git.GitCommandError):
        return False
    return True


def record(series_root: Path, version: str = __version__, checkout: Path | None = None) -> Record:
    """Write ``releases/<version>.json`` for the series in hand.  Refuses a version older than
    the newest record, and a record whose release is tagged already (``checkout``'s git) and
    whose content would change: a tagged release is final."""
    root = Path(series_root)
    now = content(root)
    if not any(name.endswith(".patch") for name in now):
        raise UsageError(f"there is no series under {root}; nothing to release")
    known = records(root)
    newer = [r.version for r in known if Version(r.version) > Version(version)]
    if newer:
        raise UsageError(
            f"release {newer[-1]} is recorded already; {version} is older: move __version__ "
            "in tooling/moe_patch/__init__.py past it"
        )
    path = root / RELEASES_DIR / f"{version}.json"
    same = next((r for r in known if r.version == version), None)
    if same is not None and same.files != now and checkout and _tagged(checkout, tag_name(version)):
        raise StateError(
            f"release {version} is tagged ({tag_name(version)}) and the series differs from it "
            f"({_summary(changed_files(same.files, now))}): move __version__ in "
            "tooling/moe_patch/__init__.py, then record the new release"
        )
    path.parent.mkdir(exist_ok=True)
    text = json.dumps({"version": version, "files": now}, indent=1, sort_keys=True) + "\n"
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(text)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return Record(version, now, path)


def series_version(series_root: Path) -> str:
    """The version of the series in ``series_root``: ``__version__`` of the moe-patch checkout
    that holds it (a pinned worktree's, say), else this moe-patch's."""
    init = Path(series_root).parent / "tooling" / "moe_patch" / "__init__.py"
    try:
        found = re.search(r'^__version__ = "([^"]+)"', init.read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else __version__


def series_commit(series_root: Path) -> str:
    """The commit of the git checkout whose tracked files hold ``series_root`` (short hash,
    ``+`` when the series has uncommitted changes); "unknown" elsewhere (the copy inside an
    installed package).  Result files, wheels and bundles record it beside the version."""
    try:
        if not gitutil.run(series_root, "ls-files", "--", ".").strip():
            return "unknown"
        head = gitutil.run(series_root, "rev-parse", "--short", "HEAD")
        dirty = gitutil.run(series_root, "status", "--porcelain", "--", ".")
    except (OSError, git.GitCommandError):
        return "unknown"
    return head.strip() + ("+" if dirty.strip() else "")


def changelog_has(changelog: Path, version: str) -> bool:
    """Does ``changelog`` (Keep a Changelog) have a ``## [version] - YYYY-MM-DD`` section?"""
    try:
        text = changelog.read_text()
    except OSError:
        return False
    heading = rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}\s*$"
    return re.search(heading, text, re.MULTILINE) is not None
