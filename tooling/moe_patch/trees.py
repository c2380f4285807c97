"""Release trees in the cache: a release's sdist turned into a one-commit git repository.

``release_repo("0.21.0")`` returns ``trees/v0.21.0.git``, a bare repository whose
single commit holds the unpacked sdist and is tagged ``v0.21.0``.  Commits are
made with a fixed identity and the archive's own timestamp, so the same sdist
gives the same commit id on every machine.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

import git

from . import cache, download, gitutil, index, ui, versions
from .errors import IntegrityError, UsageError, is_local_io
from .pipconfig import index_settings

IDENTITY = ("moe-patch", "moe-patch@localhost")


def release_tag(version: str) -> str:
    return f"v{version}"


def resolve_version(
    spec: str | None, index_url: str | None = None, offline_ok: bool = False
) -> str:
    """The release ``spec`` names (0.21: the newest 0.21.x); the index is asked only when
    neither ``offline_ok`` nor the cache can answer for an exact version."""
    if spec is None:
        raise UsageError("say which release: --vllm VERSION (e.g. --vllm 0.21)")
    if versions.is_exact(spec):
        exact = str(versions.parse_spec(spec))
        if offline_ok or cached_repo(exact):
            return exact
    settings = index_settings(index_url)
    releases = [d.version for d in index.distributions(settings)]
    return versions.resolve(spec, releases, settings.shown)


def cached_repo(version: str) -> Path | None:
    path = cache.root() / "trees" / f"{release_tag(version)}.git"
    return path if path.is_dir() else None


def discard_if_damaged(version: str) -> bool:
    """Remove the cached repository of ``version`` if ``git fsck`` finds it damaged (a pack
    deleted, truncated or changed on disk); the next ``release_repo`` builds it again.
    Called after a git command on it failed, so a sound cache costs nothing."""
    repo = cached_repo(version)
    if repo is None:
        return False
    why = _fsck(version, repo)
    if why is None:
        return False
    _discard(version, repo, why)
    return True


def _fsck(version: str, repo: Path) -> str | None:
    """Why ``git fsck`` finds ``repo`` damaged, or None if it is sound."""
    try:
        gitutil.run(repo, "fsck", "--no-progress", "--no-dangling")
        gitutil.run(repo, "rev-parse", "--verify", "-q", f"{release_tag(version)}^{{tree}}")
        return None
    except git.GitCommandError as exc:
        return gitutil.last_words(str(exc.stderr or "")) or "fsck failed"


def _discard(version: str, repo: Path, why: str) -> None:
    with cache.locked(f"vllm-{version}"):
        if repo.is_dir():
            doomed = Path(tempfile.mkdtemp(dir=repo.parent, prefix=f".tmp-{repo.name}-"))
            repo.rename(doomed / repo.name)  # gone from its name at once, then deleted
            shutil.rmtree(doomed, ignore_errors=True)
    _sound.pop(repo, None)
    ui.warn(f"the cached vLLM {version} repository was damaged ({why}); building it again")


# --- checking a cached repository where it is read -----------------------------------

# Beside the objects of each cached repository: the sha256 of every file git reads the
# release from, written when the entry is built.  A changed byte anywhere (a pack overwritten,
# truncated or deleted) no longer matches, and the entry is rebuilt before anything reads it.
CHECKSUMS = "moe-patch-sha256.json"
# The repositories this process found sound, with the size, time and inode of their files:
# checked again only when one of those changed.
_sound: dict[Path, list] = {}


def _files(repo: Path) -> list[Path]:
    """The files git reads a release from: ``objects/``, ``refs/``, ``HEAD``, ``packed-refs``."""
    paths = [repo / "HEAD", repo / "packed-refs"]
    for folder in ("objects", "refs"):
        paths += sorted(p for p in (repo / folder).rglob("*") if p.is_file())
    return [p for p in paths if p.is_file()]


def _signature(repo: Path) -> list | None:
    signature = []
    try:
        for path in _files(repo):
            st = path.stat()
            signature.append((path.name, st.st_size, st.st_mtime_ns, st.st_ino))
    except OSError:  # changing under us: checked in full
        return None
    return signature


def _read_files(repo: Path) -> dict[str, str]:
    return {p.relative_to(repo).as_posix(): cache.sha256_file(p) for p in _files(repo)}


def write_checksums(repo: Path) -> None:
    data = {"files": _read_files(repo)}
    cache.write_atomic(
        repo / CHECKSUMS, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    )


def _damage(version: str, repo: Path) -> str | None:
    """Why the cached ``repo`` is not what was cached, or None if it is."""
    try:
        recorded = json.loads((repo / CHECKSUMS).read_text())["files"]
    except FileNotFoundError:  # cached by an earlier moe-patch: check it once, the slow way
        why = _fsck(version, repo)
        if why is None:
            with cache.locked(f"vllm-{version}"):
                write_checksums(repo)
        return why
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKSUMS} is unreadable"
    try:
        now = _read_files(repo)
    except OSError as exc:
        return f"{exc.filename}: {exc.strerror}"
    for name in sorted(set(recorded) | set(now)):
        if name not in now:
            return f"{name} is missing"
        if recorded.get(name) != now[name]:
            return f"{name} changed since it was cached" if name in recorded else f"{name} is new"
    return None


def fetch_release(tree: Path, version: str, refspec: str, index_url: str | None = None) -> None:
    """``git fetch`` release ``version``'s tag from the cache into ``tree`` (``refspec`` names
    where it goes); a damaged cached repository is rebuilt and the fetch tried once more."""
    command = ["fetch", "-q", "--no-tags"]
    try:
        gitutil.run(tree, *command, str(release_repo(version, index_url)), refspec)
    except git.GitCommandError:
        if not discard_if_damaged(version):
            raise
        gitutil.run(tree, *command, str(release_repo(version, index_url)), refspec)


def release_repo(version: str, index_url: str | None = None) -> Path:
    """The cached bare repository of release ``version``, building it if needed."""
    existing = cached_repo(version)
    if existing:
        _sweep_after_kill(version, existing)
        signature = _signature(existing)
        if signature is not None and _sound.get(existing) == signature:
            return existing
        why = _damage(version, existing)
        if why is None:
            _sound[existing] = signature
            return existing
        _discard(version, existing, why)
    trees = cache.subdir("trees")
    name = f"{release_tag(version)}.git"
    with cache.locked(f"vllm-{version}"):
        final = trees / name
        if final.is_dir():  # another run built it while we waited for the lock
            return final
        cache.remove_leftovers(trees, name)
        settings = index_settings(index_url)
        dist = index.cached_distribution(settings, version) or _lookup(settings, version)
        sdist = download.fetch_sdist(dist, settings)
        ui.info(f"unpacking {sdist.name} into the cache")
        try:
            build_repo_from_archive(sdist, version, final)
        finally:
            with contextlib.suppress(FileNotFoundError):  # consumed, or refused
                sdist.unlink()
    return final


def _sweep_after_kill(version: str, repo: Path) -> None:
    """Remove what a run killed after publishing ``repo`` but before its clean-up left:
    its scratch folder beside the repository and the sdist it was built from.  Builds
    now publish last; this clears caches that earlier moe-patch versions left so."""
    sdists = cache.root() / "sdist"
    stale = [p for p in repo.parent.iterdir() if p.name.startswith(f".tmp-{repo.name}-")]
    if sdists.is_dir():
        names = {f"vllm-{version}.tar.gz", f"vllm-{version}.zip"}
        stale += [p for p in sdists.iterdir() if p.name in names]
    if not stale:
        return
    with cache.locked(f"vllm-{version}"):  # a live builder finishes its own clean-up first
        for path in stale:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _lookup(settings, version: str) -> index.Distribution:
    for dist in index.distributions(settings):
        if dist.version == version:
            return dist
    for dist in index.distributions(settings, refresh=True):
        if dist.version == version:
            return dist
    raise UsageError(f"vLLM {version} has no source distribution on {settings.shown}")


def build_repo_from_archive(archive: Path, version: str, final: Path) -> None:
    """Unpack ``archive`` safely, commit it as ``final`` (a bare repo) and consume it.

    Publishing is the last step: the unpacked files and the archive are gone before
    the rename, so a run killed anywhere leaves either no ``final`` (and ``.tmp-*``
    folders the next build removes) or a complete ``final`` and nothing else."""
    repo_dir = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{final.name}-"))
    unpacked = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{final.name}-src-"))
    try:
        date = _extract(archive, unpacked / "src")
        top = _single_top_dir(unpacked / "src", archive)
        commit_directory(top, repo_dir, version, date, bare=True)
        gitutil.run(repo_dir, "repack", "-a", "-d", "-q")
        gitutil.run(repo_dir, "prune-packed")
        write_checksums(repo_dir)
        shutil.rmtree(unpacked)
        archive.unlink()  # kept in the repository: never trusted again
        repo_dir.rename(final)
    except BaseException:
        shutil.rmtree(unpacked, ignore_errors=True)
        shutil.rmtree(repo_dir, ignore_errors=True)
        raise


def _extract(archive: Path, dest: Path) -> str:
    """Extract with tarfile's ``data`` filter (no absolute paths, no ``..``, no links
    out, no devices); return the archive's timestamp as a git date."""
    dest.mkdir()
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                parts = PurePosixPath(member.name).parts
                if member.name.startswith(("/", "\\")) or ".." in parts:
                    raise tarfile.FilterError(f"member {member.name!r} points outside the archive")
            tar.extractall(dest, filter="data")
    except tarfile.FilterError as exc:
        raise IntegrityError(
            f"{archive.name} holds an unsafe member ({exc}); nothing of it was kept in "
            "the cache: the archive is not a genuine release"
        ) from None
    except OSError as exc:
        if is_local_io(exc):
            raise  # disk full, permissions: the CLI says so (exit 11), not "a bad archive"
        raise _unreadable(archive, exc) from None
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise _unreadable(archive, exc) from None
    newest = max((m.mtime for m in members), default=0)
    return f"@{int(newest) or 315532800} +0000"


def _unreadable(archive: Path, exc: Exception) -> IntegrityError:
    return IntegrityError(
        f"{archive.name} is not a readable archive ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0].rstrip(':') if str(exc) else 'empty'}); "
        "it was discarded: retry, and report it if it persists"
    )


def _single_top_dir(unpacked: Path, archive: Path) -> Path:
    entries = list(unpacked.iterdir())
    if len(entries) != 1 or not entries[0].is_dir():
        raise IntegrityError(
            f"{archive.name} does not have the single top-level directory of an sdist"
        )
    return entries[0]


def commit_directory(src: Path, git_dir: Path, version: str, date: str, bare: bool) -> str:
    """Commit every file under ``src`` (ignore rules included: ``-f``) and tag it."""
    args = ["init", "-q"] + (["--bare"] if bare else []) + [str(git_dir)]
    gitutil.run(git_dir.parent, *args)
    if bare:
        env = {"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(src)}
        cwd = src
    else:
        env, cwd = {}, git_dir
    env.update(gitutil.commit_env(*IDENTITY, date))
    gitutil.run(cwd, "add", "-A", "-f", ".", env=env)
    gitutil.run(
        cwd,
        "commit",
        "-q",
        "--no-verify",
        "--allow-empty",
        "-m",
        f"vLLM {version} (source distribution)",
        env=env,
    )
    gitutil.run(cwd, "tag", release_tag(version), env=env)
    return gitutil.run(cwd, "rev-parse", "HEAD", env=env)


def discard_partial(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
