"""``moe-patch clean``: remove what killed runs left, and with ``--all`` the cache's entries.

Killed runs leave scratch names in the cache (``.tmp-<entry>-XXXX`` folders, ``.<entry>.part-``
files, ``scratch/<purpose>-<run>-XXXX`` folders), scratch trees beside ``--into``
(``.tmp-<into>-<run>-XXXX``) and git lock files in the tree they were changing; later runs
remove their own, ``clean`` removes them all.  Each name is removed under the lock of the
entry it belongs to, taken without waiting: what a live run is building or reading is kept and
reported.  Only names moe-patch makes are touched, so a cache pointed at a shared folder
(``MOE_PATCH_CACHE``) never loses anything else.  An entry is renamed to a scratch name before
it is deleted, so a clean that is itself killed leaves only scratch names, never half an entry.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import git

from .. import cache, sources, treelock
from ..errors import BusyError, MoePatchError

# Per cache folder: the entry names moe-patch makes, and the lock each entry is built under.
_ENTRIES = {
    "trees": (re.compile(r"v(?P<version>.+)\.git"), "vllm-{version}"),
    "sdist": (re.compile(r"vllm-(?P<version>.+?)\.(tar\.gz|zip)"), "vllm-{version}"),
    "wheels": (re.compile(r"vllm-(?P<version>[^-]+)(-.+\.whl)?"), "wheel-vllm-{version}"),
    "envs": (re.compile(r"(?P<name>oracle-[0-9a-f]+)"), "env-{name}"),
    "tools": (re.compile(r"(?P<name>ruff-[0-9][0-9A-Za-z.]*)"), "tool-{name}"),  # lint.py
    "index": (re.compile(r"vllm-[0-9a-f]+\.json"), None),  # written atomically, never locked
}


@dataclass
class CleanReport:
    removed: list[dict] = field(default_factory=list)  # {"path", "bytes", "what"}
    in_use: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def bytes(self) -> int:
        return sum(item["bytes"] for item in self.removed)

    def to_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "removed": self.removed,
            "bytes": self.bytes,
            "in_use": self.in_use,
        }


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir() or p.is_symlink())


def _scratch_owner(name: str) -> str | None:
    """The entry a scratch name was made for, or None if ``name`` is not a scratch name."""
    if name.startswith(".tmp-"):
        return name[len(".tmp-") :].rsplit("-", 1)[0]  # mkdtemp's suffix holds no "-"
    if name.startswith(".") and ".part-" in name:
        return name[1:].rsplit(".part-", 1)[0]
    return None


def _ours(folder: str, entry: str) -> tuple[bool, str | None]:
    """Whether ``entry`` is a name moe-patch makes in cache ``folder``, and the lock it is
    built under (None: written atomically, no lock)."""
    pattern, lock = _ENTRIES[folder]
    found = pattern.fullmatch(entry)
    if not found:
        return False, None
    return True, lock.format(**found.groupdict()) if lock else None


def _remove(path: Path) -> None:
    """Delete ``path`` by first renaming it to a scratch name beside it."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    doomed = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-{path.name}-"))
    path.rename(doomed / path.name)
    shutil.rmtree(doomed, ignore_errors=True)


def clean(everything: bool = False, into: Path | None = None, dry_run: bool = False) -> CleanReport:
    """Remove killed runs' leftovers (and with ``everything`` every cache entry); see module."""
    report = CleanReport(dry_run=dry_run)
    root = cache.root()
    for folder in _ENTRIES:
        directory = root / folder
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            owner = _scratch_owner(path.name)
            what = "leftover" if owner is not None else "entry"
            if owner is None and not everything:
                continue
            ours, lock = _ours(folder, owner if owner is not None else path.name)
            if ours:
                _take(report, path, what, lock, dry_run)
    for path, live in cache.scratch_folders():
        if live:
            report.in_use.append(str(path))
        else:
            _record(report, path, "leftover", dry_run)
    if into is not None:
        into = into.expanduser().absolute()
        if into.parent.is_dir():
            for scratch in sources.stale_scratch(into):
                _record(report, scratch, "scratch beside --into", dry_run)
        if (into / ".git").exists():
            _git_leftovers(report, into, dry_run)
    return report


def _git_leftovers(report: CleanReport, tree: Path, dry_run: bool) -> None:
    """The git lock files (and half-written objects) a killed run left in ``tree``."""
    try:
        if not (treelock.git_dir(tree) / treelock.OWNER_FILE).exists():
            return  # no moe-patch run was stopped while it changed the tree
        with treelock.held(tree):
            found = treelock.clear_after_kill(tree, remove=False)
            for path in found:
                report.removed.append(
                    {"path": str(path), "bytes": _size(path), "what": "git lock of a killed run"}
                )
            if not dry_run:
                treelock.clear_after_kill(tree)
    except BusyError:
        report.in_use.append(str(tree))
    except (git.GitCommandError, MoePatchError):
        return  # not a git tree after all: nothing of ours in it


def _take(report: CleanReport, path: Path, what: str, lock: str | None, dry_run: bool) -> None:
    if lock is None:
        _record(report, path, what, dry_run)
        return
    try:
        with cache.locked(lock, timeout=0):
            if path.exists() or path.is_symlink():
                _record(report, path, what, dry_run)
    except BusyError:
        report.in_use.append(str(path))


def _record(report: CleanReport, path: Path, what: str, dry_run: bool) -> None:
    size = _size(path)
    if not dry_run:
        _remove(path)
    report.removed.append({"path": str(path), "bytes": size, "what": what})


def failure(report: CleanReport) -> BusyError | None:
    """The error ``moe-patch clean`` exits with once it has printed ``report``: entries another
    run is using were kept."""
    if not report.in_use:
        return None
    count = len(report.in_use)
    return BusyError(
        f"{count} cache entr{'ies are' if count > 1 else 'y is'} "
        "in use by another moe-patch run and kept; run clean again when it has finished"
    )
