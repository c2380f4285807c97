"""One moe-patch run at a time in a work tree, and what a killed run left there.

A run that changes a tree holds moe-patch's lock in the tree's git directory
(``moe-patch.lock``) and, while it holds it, a record of its process
(``moe-patch-owner.json``: process id, start time, wall clock), written before any git
command runs there and removed at the end.  A SIGKILL skips that removal, and the git child
it had started may leave its own lock files (``index.lock``, ``HEAD.lock``, ref locks), which
stop every later git command in the tree.  The next run, holding the lock, finds the record
of a process that is gone and removes what that run's git left; a git lock of anyone else
is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from . import cache, gitutil, owners
from .errors import BusyError, StateError


def git_dir(tree: Path) -> Path:
    return Path(gitutil.run(tree, "rev-parse", "--absolute-git-dir"))


def common_dir(tree: Path) -> Path:
    """The git directory all work trees of ``tree``'s repository share."""
    found = Path(gitutil.run(tree, "rev-parse", "--git-common-dir"))
    return found if found.is_absolute() else (tree / found).absolute()


OWNER_FILE = "moe-patch-owner.json"
# What git writes beside the file it locks; a lock a killed git left stops every later git.
_GIT_LOCK = ".lock"
# What git leaves in the object store when it is killed mid-write.
_GIT_TEMPORARY = ("tmp_obj_", "tmp_pack_", "tmp_idx_", "tmp_rev_")


@contextlib.contextmanager
def target_lock(tree: Path):
    """Hold ``tree`` for this run: moe-patch's lock, and a record of this process.

    The record is written before any git command runs in the tree and removed at the end.
    Finding one of a process that is gone means a run was killed there: the git lock files
    created since that run started, which no live process holds open, are its git's, and
    are removed (with git's half-written objects), so that the next run can go on."""
    owner = git_dir(tree) / OWNER_FILE
    with held(tree):
        clear_after_kill(tree)
        _refuse_foreign_git_lock(tree)
        cache.write_atomic(owner, (json.dumps(owners.record()) + "\n").encode())
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                owner.unlink()


@contextlib.contextmanager
def held(tree: Path):
    """moe-patch's lock of ``tree``, taken without waiting (:class:`BusyError` if taken)."""
    import filelock

    lock = filelock.FileLock(str(git_dir(tree) / "moe-patch.lock"))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        raise BusyError(
            f"another moe-patch run is changing {tree}; wait for it to finish"
        ) from None
    try:
        yield
    finally:
        lock.release()


def clear_after_kill(tree: Path, remove: bool = True) -> list[Path]:
    """What a killed moe-patch run's git left in ``tree``, removed unless ``remove`` is False
    (call under :func:`held`): nothing unless :data:`OWNER_FILE` names a process that is gone."""
    where = git_dir(tree)
    try:
        owner = json.loads((where / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(owner, dict):
        return []
    pid = owner.get("pid")
    if not isinstance(pid, int) or owners.alive(pid, owner.get("start")):
        return []
    since = float(owner.get("since") or 0) - 1.0  # file times may be coarser than the clock
    common = common_dir(tree)
    candidates = []
    for path in _walk(where, common) + (_walk(common, common) if common != where else []):
        name = path.name
        git_lock = name.endswith(_GIT_LOCK) and name != "moe-patch.lock"
        half_written = name.startswith(_GIT_TEMPORARY) and "objects" in path.parts
        if git_lock or half_written:
            with contextlib.suppress(OSError):
                if path.lstat().st_mtime >= since:
                    candidates.append(path)
    busy = owners.held_open(candidates)
    left = [path for path in candidates if path not in busy]
    if remove:
        for path in left:
            owners.remove(path)
        if not busy:  # else the record stays: the next run looks again
            with contextlib.suppress(OSError):
                (where / OWNER_FILE).unlink()
    return left


def _walk(folder: Path, common: Path) -> list[Path]:
    """Every file under ``folder`` but the git directories of other worktrees."""
    found = []
    for root, dirs, files in os.walk(folder):
        if Path(root) == common and "worktrees" in dirs:
            dirs.remove("worktrees")
        found.extend(Path(root) / name for name in files)
    return found


def _refuse_foreign_git_lock(tree: Path) -> None:
    """A git lock that is not a killed run's of ours: a git command is working in the tree,
    or the user's was killed; say so instead of failing at the first git command."""
    where = git_dir(tree)
    for name in ("index.lock", "HEAD.lock"):
        if (where / name).exists():
            raise StateError(
                f"{where / name} exists: a git command is running in {tree}, or one was "
                "killed there; once none is running, delete that file and run again"
            )
