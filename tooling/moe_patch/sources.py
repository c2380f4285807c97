"""Getting a vLLM work tree to patch: from the cache, a local tree, or a git remote.

Every path ends with a git work tree whose ``base`` commit is the unpatched
release.  A new tree is built beside its final name and renamed into place, so
an interrupted run never leaves a half-made tree under the name the user gave.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from . import folders, gitutil, owners, trees, ui
from .errors import (
    LOCAL_IO_WORDS,
    BusyError,
    LocalIOError,
    MoePatchError,
    NetworkError,
    UsageError,
)
from .pipconfig import redact

DEFAULT_REMOTE = "https://github.com/vllm-project/vllm.git"
_VERSION_ASSIGN = re.compile(
    r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
    re.MULTILINE,
)


@dataclass
class WorkTree:
    path: Path
    base: str  # commit id of the unpatched tree
    created: bool  # made by this run (removed again if the run fails early)


def detect_version(tree: Path) -> str | None:
    """The vLLM version a source tree says it is, if it says."""
    candidates = []
    version_file = tree / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_ASSIGN.search(version_file.read_text(errors="replace"))
        if match:
            candidates.append(match.group(1))
    pkg_info = tree / "PKG-INFO"
    if pkg_info.is_file():
        for line in pkg_info.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                candidates.append(line.split(":", 1)[1].strip())
    if (tree / ".git").exists():
        try:
            tag = gitutil.run(tree, "describe", "--tags", "--exact-match", "HEAD")
            candidates.insert(0, tag)
        except git.GitCommandError:
            pass
    for text in candidates:
        try:
            return str(Version(text.lstrip("v")))
        except InvalidVersion:
            continue
    return None


def check_vllm_tree(tree: Path) -> None:
    if not tree.is_dir():
        raise UsageError(f"--source {tree} does not exist or is not a directory")
    if not (tree / "vllm" / "__init__.py").is_file():
        raise UsageError(f"--source {tree} is not a vLLM source tree (no vllm/__init__.py)")


# Called on a new tree before it is moved to --into: a caller that must recognise its
# own half-made tree after a kill marks it here, so it never appears unmarked.
Marker = Callable[[Path], None]


def _fresh_target(into: Path) -> Path:
    if into.is_symlink():
        raise UsageError(
            f"--into {into} is a symbolic link (to {into.resolve()}); "
            "give the real path, or another --into"
        )
    if into.exists() and not into.is_dir():
        raise UsageError(f"--into {into} exists and is not a directory; choose another --into")
    if into.exists() and any(into.iterdir()):
        raise UsageError(
            f"{into} exists and is not a tree made by moe-patch; choose another --into"
        )
    return scratch_beside(into)


# A file name may be 255 bytes: the scratch name of a long --into keeps the start of its name
# and a hash of the rest, so that ".tmp-", the run's tag and mkdtemp's suffix still fit.
_NAME_KEPT = 64


def _scratch_prefix(path: Path) -> str:
    name = path.name
    if len(name.encode()) > _NAME_KEPT:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = f"{name.encode()[:40].decode(errors='ignore')}~{digest}"
    return f".tmp-{name}-"


def scratch_beside(path: Path) -> Path:
    """A new scratch folder beside ``path`` (``.tmp-<name>-<run>-XXXX``), where ``path`` is
    built before it is renamed into place; the scratch killed runs left beside it is removed
    first."""
    sweep_scratch(path)
    prefix = _scratch_prefix(path) + owners.tag() + "-"
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=prefix))


def stale_scratch(into: Path) -> list[Path]:
    """The scratch trees that killed runs left beside ``into``.

    A run builds its tree in ``.tmp-<into>-<run>-XXXX`` and renames it to ``into`` at the
    end, so a folder of that name whose process is gone is what a kill left behind (up to
    ~120 MB each); one of a live run is not listed.
    """
    return owners.stale(into.parent, _scratch_prefix(into))


def sweep_scratch(into: Path) -> list[Path]:
    """Remove :func:`stale_scratch` of ``into``; the removed paths."""
    return owners.sweep(into.parent, _scratch_prefix(into))


def _move_into_place(tmp: Path, into: Path) -> None:
    try:
        if into.exists():
            into.rmdir()  # empty (checked by _fresh_target)
        tmp.rename(into)
    except OSError:  # another run put its tree there meanwhile
        raise BusyError(
            f"another moe-patch run created {into} meanwhile; "
            "wait for it to finish, then run the same command again"
        ) from None


def from_cache(
    version: str, into: Path, index_url: str | None, mark: Marker | None = None
) -> WorkTree:
    def build(tmp: Path) -> str:
        try:
            _clone_release(trees.release_repo(version, index_url), tmp, version)
        except git.GitCommandError:
            if not trees.discard_if_damaged(version):
                raise
            _empty(tmp)
            _clone_release(trees.release_repo(version, index_url), tmp, version)
        return gitutil.run(tmp, "rev-parse", "HEAD")

    return _made_beside(into, build, mark)


def _made_beside(into: Path, build: Callable[[Path], str], mark: Marker | None) -> WorkTree:
    """``into`` made by ``build`` (which returns the base commit) in a scratch folder beside
    it, then moved into place: a failure or a kill never leaves half a tree at ``into``.
    A foreign ``into`` is refused before ``build`` downloads or copies anything."""
    with folders.made(into.parent):  # a failed run leaves no new parent folders either
        tmp = _fresh_target(into)
        try:
            base = build(tmp)
            if mark:
                mark(tmp)
            _move_into_place(tmp, into)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return WorkTree(into, base, created=True)


def _empty(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()


def _clone_release(repo: Path, tmp: Path, version: str) -> None:
    # A path source is cloned locally anyway (hard links where they can be made); an
    # explicit --local would make git fail instead of copying across filesystems.
    gitutil.run(tmp.parent, "clone", "-q", "--no-checkout", str(repo), str(tmp))
    gitutil.run(tmp, "remote", "remove", "origin")
    # Writing ~5000 files dominates a warm apply: let git use every core.
    command = ["-c", "checkout.workers=0", "-c", "checkout.thresholdForParallelism=1"]
    command += ["checkout", "-q", "--detach", trees.release_tag(version)]
    status, _, said = gitutil.run(tmp, *command, with_extended_output=True)
    # git's parallel checkout exits 0 when it could not read an object ("finished with
    # pending entries"), leaving files out: a damaged object store, whatever the status says.
    if re.search(r"^(error|fatal):", said, re.MULTILINE):
        raise git.GitCommandError(["git", *command], status, said)


def _clone_url(url: str) -> str:
    """``url`` as git should be given it: a local path as a file:// URL, so that ``--depth``
    is honoured (git ignores it for plain paths and copies the whole history)."""
    if "://" in url or url.startswith("git@"):
        return url
    path = Path(url).expanduser()
    return path.absolute().as_uri() if path.exists() else url


def from_git_url(version: str, into: Path, url: str, mark: Marker | None = None) -> WorkTree:
    tag = trees.release_tag(version)

    def build(tmp: Path) -> str:
        try:
            gitutil.run(
                tmp.parent,
                "clone",
                "-q",
                "--depth",
                "1",
                "--branch",
                tag,
                "--single-branch",
                _clone_url(url),
                str(tmp),
                transport=True,  # the user's credentials, proxies and url.*.insteadOf
            )
        except git.GitCommandError as exc:
            said = str(exc.stderr or "")
            if re.search(r"Remote branch \S+ not found|couldn't find remote ref", said):
                raise UsageError(
                    f"{redact(url)} has no tag {tag}; check --vllm, or give a remote that "
                    "has the release's tag"
                ) from None
            if LOCAL_IO_WORDS.search(said):
                raise LocalIOError(
                    f"cannot write the clone of {tag} ({_git_reason(exc)}); free space or fix "
                    "permissions, then run the same command again"
                ) from None
            raise NetworkError(
                f"cannot clone tag {tag} from {redact(url)} ({_git_reason(exc)}); "
                "check the URL and that the tag exists"
            ) from None
        gitutil.run(tmp, "checkout", "-q", "--detach", tag)
        return gitutil.run(tmp, "rev-parse", "HEAD")

    return _made_beside(into, build, mark)


def from_local(
    source: Path, into: Path | None, in_place: bool, version: str, mark: Marker | None = None
) -> WorkTree:
    """A copy of ``source`` (a git checkout or an unpacked tree), or ``source`` itself."""
    check_vllm_tree(source)
    is_repo = (source / ".git").exists()
    if is_repo:
        gitutil.require_clean(gitutil.open_repo(source), "--source checkout")
        head = gitutil.run(source, "rev-parse", "HEAD")
    if in_place:
        if not is_repo:
            raise UsageError(f"--in-place needs a git checkout, and {source} is not one")
        return WorkTree(source, head, created=False)
    if into is None:
        raise UsageError("--source needs --into DIR for the patched copy (or --in-place)")

    def build(tmp: Path) -> str:
        if is_repo:
            _clone_source(source, tmp)
            gitutil.run(tmp, "checkout", "-q", "--detach", head)
            return head
        shutil.copytree(source, tmp, symlinks=True, dirs_exist_ok=True)
        return trees.commit_directory(tmp, tmp, version, "@315532800 +0000", bare=False)

    return _made_beside(into, build, mark)


def _clone_source(source: Path, tmp: Path) -> None:
    """Clone the user's checkout into ``tmp``, tolerating a ``git gc`` running on it.

    The local clone copies ``.git/objects`` file by file (fast, no packing) and fails when a
    repack moves a pack away mid-copy.  git's own transport reads objects through the object
    store, which re-scans packs that vanish, so it is the retry; a second failure is the
    source's to fix."""
    try:
        gitutil.run(
            tmp.parent, "clone", "-q", "--no-checkout", "--no-hardlinks", str(source), str(tmp)
        )
        return
    except git.GitCommandError as exc:
        _raise_if_local_io(exc)
    _empty(tmp)
    try:
        gitutil.run(tmp.parent, "clone", "-q", "--no-checkout", "--no-local", str(source), str(tmp))
    except git.GitCommandError as exc:
        _raise_if_local_io(exc)
        raise UsageError(
            f"cannot clone --source {source} ({_git_reason(exc)}); if git is changing it (gc, "
            "fetch), wait and run the same command again, otherwise check it with git fsck"
        ) from None


def _raise_if_local_io(exc: git.GitCommandError) -> None:
    if LOCAL_IO_WORDS.search(str(exc.stderr or "")):
        raise LocalIOError(
            f"cannot write the copy of --source ({_git_reason(exc)}); free space or fix "
            "permissions, then run the same command again"
        ) from None


def _git_reason(exc: git.GitCommandError) -> str:
    return gitutil.last_words(str(exc.stderr or "")) or f"git exited with {exc.status}"


def check_is_release(
    source: Path, requested: str, any_base: bool = False, index_url: str | None = None
) -> None:
    """Refuse a --source that is not release ``requested``: a git checkout whose HEAD is
    neither tagged with it nor holds the release's files; a tree whose PKG-INFO or
    vllm/_version.py does not say exactly it.  With ``any_base``, patch it anyway and say so."""
    if (source / ".git").exists():
        try:
            tag = gitutil.run(source, "describe", "--tags", "--exact-match", "HEAD")
        except git.GitCommandError:
            tag = None
        if tag is not None and _same_release(tag, requested):
            return
        head = gitutil.run(source, "rev-parse", "--short=12", "HEAD")
        differ = release_files_differ(source, requested, index_url)
        if differ == []:
            ui.info(f"{source}: HEAD {head} is untagged but holds vLLM {requested}'s files")
            return
        reason = f"its HEAD ({head}) is not tagged v{requested}"
        if differ:
            shown = ", ".join(differ[:3]) + (
                f" (+{len(differ) - 3} more)" if len(differ) > 3 else ""
            )
            reason += f" and its files differ from the release's: {shown}"
    else:
        detected = detect_version(source)
        if detected is not None and _same_release(detected, requested):
            return
        reason = (
            f"it says it is vLLM {detected}"
            if detected
            else "it does not say which release it is (no PKG-INFO or vllm/_version.py)"
        )
    if any_base:
        ui.warn(f"--any-base: patching {source} as vLLM {requested}, though {reason}")
        return
    raise UsageError(
        f"--source {source} is not the vLLM {requested} release: {reason}; check out "
        f"v{requested}, or pass --any-base to patch it as {requested} anyway"
    )


def release_files_differ(source: Path, version: str, index_url: str | None = None):
    """The paths where ``source``'s HEAD and release ``version`` (its source distribution)
    hold different files, sorted; files only the release has that ``source`` ignores (such
    as the generated ``vllm/_version.py``) do not count.  None if the release is unavailable."""
    try:
        release = trees.release_repo(version, index_url)
    except MoePatchError:
        return None
    ours = _blobs(source, "HEAD")
    theirs = _blobs(release, f"refs/tags/{trees.release_tag(version)}")
    differ = sorted(p for p in ours.keys() | theirs.keys() if ours.get(p) != theirs.get(p))
    only_release = [p for p in differ if p not in ours]
    if only_release and len(only_release) <= 100:
        try:
            ignored = set(gitutil.run(source, "check-ignore", "--", *only_release).splitlines())
        except git.GitCommandError:  # exit 1: none of them is ignored
            ignored = set()
        differ = [p for p in differ if p not in ignored]
    return differ


def _blobs(repo: Path, rev: str) -> dict[str, str]:
    """path -> blob id of every file at ``rev`` (a symbolic link counts by its target)."""
    listing = gitutil.run(repo, "ls-tree", "-r", "-z", "--full-tree", rev)
    found = {}
    for entry in listing.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            found[path] = meta.split()[2]
    return found


def _same_release(text: str, requested: str) -> bool:
    try:
        return Version(text.lstrip("v")) == Version(requested)
    except InvalidVersion:
        return False


def warn_version_mismatch(detected: str | None, requested: str, source: Path) -> None:
    if detected and Version(detected).public != requested:
        if Version(detected).is_devrelease or Version(detected).local:
            ui.warn(f"{source} says it is vLLM {detected}; patching it as {requested}")
            return
        raise UsageError(
            f"--source {source} is vLLM {detected}, not {requested}; "
            f"pass --vllm {detected} or another --source"
        )
