"""The user cache: where downloads and release trees live, and how it stays sound.

Layout under :func:`root` (``$MOE_PATCH_CACHE``, else the user cache directory,
which honours ``XDG_CACHE_HOME``)::

    index/vllm-<hash of index url>.json   release listing of one index
    sdist/vllm-X.Y.Z.tar.gz               verified source distributions
    trees/vX.Y.Z.git                      bare git repository, one commit tagged vX.Y.Z
    tools/ruff-X.Y.Z                      the ruff a tree pins (see lint.py)
    locks/<name>.lock                     one lock per entry
    scratch/<purpose>-<run>-XXXX          a run's throwaway trees (see :func:`scratch`)

Every entry is built beside its final name and renamed into place, so an entry
that exists is complete; a killed run leaves only ``*.part-*`` / ``.tmp-*``
names and its scratch folders, which nothing trusts and the next run removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import filelock
import platformdirs

from . import owners
from .errors import BusyError, UsageError

DEFAULT_LOCK_TIMEOUT = 900.0  # seconds; MOE_PATCH_LOCK_TIMEOUT overrides it


def seconds_from_env(name: str, default: float) -> float:
    """A duration from the environment variable ``name`` (seconds), else ``default``."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0 or seconds == float("inf"):
        raise UsageError(
            f"{name}={value!r} is not a number of seconds; "
            f"set it to one (e.g. {default:.0f}) or unset it"
        )
    return seconds


def lock_timeout() -> float:
    """How long to wait for another run's lock: ``MOE_PATCH_LOCK_TIMEOUT`` seconds, else 900."""
    return seconds_from_env("MOE_PATCH_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT)


def root() -> Path:
    configured = os.environ.get("MOE_PATCH_CACHE")
    path = Path(configured) if configured else Path(platformdirs.user_cache_dir("moe-patch"))
    return path.expanduser().absolute()


def subdir(name: str) -> Path:
    path = root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def locked(name: str, timeout: float | None = None) -> Iterator[None]:
    """Hold the cache lock ``name``; wait up to ``timeout`` s, then fail as busy."""
    lock = filelock.FileLock(str(subdir("locks") / f"{name}.lock"))
    wait = lock_timeout() if timeout is None else timeout
    try:
        lock.acquire(timeout=wait)
    except filelock.Timeout:
        raise BusyError(
            f"another moe-patch run holds the cache entry {name!r} (waited {wait:.0f} s); "
            "wait for it to finish, or set MOE_PATCH_LOCK_TIMEOUT"
        ) from None
    try:
        yield
    finally:
        lock.release()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a scratch file beside it, renamed over it.  The
    scratch name carries this run's tag, so the next write of ``path`` removes the scratch
    a killed run left (and never a live writer's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    owners.sweep(path.parent, f".{path.name}.part-")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.part-{owners.tag()}-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


SCRATCH = "scratch"


@contextlib.contextmanager
def scratch(purpose: str) -> Iterator[Path]:
    """A new empty folder under ``<cache>/scratch`` for a run's throwaway work, removed when
    the block ends (``purpose``: lower-case letters).  Its name carries this run's tag: the
    next run that makes scratch (and ``moe-patch clean``) removes the folders of runs that
    were killed."""
    directory = subdir(SCRATCH)
    owners.sweep(directory, f"{purpose}-")
    path = Path(tempfile.mkdtemp(dir=directory, prefix=f"{purpose}-{owners.tag()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def scratch_folders() -> list[tuple[Path, bool]]:
    """Every scratch folder, with whether the run that made it is alive."""
    return owners.tagged(root() / SCRATCH, "[a-z]+-")


def remove_leftovers(directory: Path, name: str) -> None:
    """Delete what a killed run left while building entry ``name`` (call under its lock)."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.name.startswith((f".{name}.part-", f".tmp-{name}-")):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
