"""A corpus of hostile or broken inputs, one case each.

Every case drives the CLI and asserts three things: the exact one-line error on
stderr, the exit code, and that every target (work tree, source tree, cache,
site-packages) is byte-for-byte what it was before (``tree_digest``).
"""

from __future__ import annotations

import errno
import hashlib
import io
import socket
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import index, installed
from moe_patch.cli import main
from support import (
    author_series,
    git,
    make_sdist,
    release_files,
    tar_member,
    tree_digest,
    write_files,
)
from wheel_support import make_wheel, pip_install


@dataclass
class Case:
    args: list[str]
    code: int
    message: str
    targets: list[Path] = field(default_factory=list)


CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def _series(tmp_path, monkeypatch, patches=None):
    root = author_series(
        tmp_path / "p", "1.0.0", patches or [{"id": "ok", "edit": {"vllm/extra.py": "x = 1\n"}}]
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    return root / "v1.0.0"


def _rewrite(patch: Path, old: str, new: str) -> None:
    patch.write_text(patch.read_text().replace(old, new))


def _apply_fresh(tmp_path, cache_dir, code, message):
    into = tmp_path / "t"
    return Case(["apply", "--vllm", "1.0.0", "--into", str(into)], code, message, [into, cache_dir])


def _source_checkout(tmp_path) -> Path:
    source = tmp_path / "src"
    write_files(source, release_files("1.0.0"))
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A", "-f")
    git(source, "commit", "-q", "-m", "v1.0.0")
    git(source, "tag", "v1.0.0")
    return source


# --- patches and series -----------------------------------------------------------------


@case
def patch_path_dotdot(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    _rewrite(directory / "ok.patch", "/vllm/extra.py", "/../outside.py")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch ok.patch touches '../outside.py', a path outside the tree; refused",
    )


@case
def patch_path_absolute(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    _rewrite(directory / "ok.patch", "/vllm/extra.py", "//tmp/outside.py")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch ok.patch touches '/tmp/outside.py', a path outside the tree; refused",
    )


@case
def patch_into_git_dir(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    _rewrite(directory / "ok.patch", "/vllm/extra.py", "/.git/hooks/post-commit")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch ok.patch touches '.git/hooks/post-commit', a path outside the tree; refused",
    )


@case
def patch_through_symlink_in_tree(tmp_path, monkeypatch, fake_index, cache_dir):
    _series(tmp_path, monkeypatch, [{"id": "ok", "edit": {"vllm/linked/x.py": "x = 1\n"}}])
    link = tarfile.TarInfo("vllm-1.0.0/vllm/linked")
    link.type, link.linkname = tarfile.SYMTYPE, "../vllm"
    fake_index.add("1.0.0", make_sdist("1.0.0", extra_members=[(link, None)]))
    case_ = _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch ok.patch touches 'vllm/linked', a symbolic link in the tree that could lead "
        "outside it; refused",
    )
    case_.targets = case_.targets[:1]  # the release itself is cached: that is fine
    return case_


@case
def patch_creates_symlink(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    _rewrite(directory / "ok.patch", "new file mode 100644", "new file mode 120000")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path, cache_dir, 5, "patch ok.patch creates or changes a symbolic link; refused"
    )


@case
def patch_binary_bytes(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    (directory / "ok.patch").write_bytes(b"From 0\x00\x01\x02 binary")
    fake_index.add("1.0.0")
    return _apply_fresh(tmp_path, cache_dir, 5, "patch ok.patch is binary, not a text patch")


@case
def patch_git_binary_diff(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    _rewrite(directory / "ok.patch", "--- /dev/null", "GIT binary patch\n--- /dev/null")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch ok.patch carries a binary diff; only text patches are allowed",
    )


@case
def patch_truncated(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(
        tmp_path,
        monkeypatch,
        [{"id": "ok", "edit": {"vllm/extra.py": "".join(f"x{i} = {i}\n" for i in range(20))}}],
    )
    patch = directory / "ok.patch"
    patch.write_bytes(patch.read_bytes()[:-60])
    fake_index.add("1.0.0")
    return _apply_fresh(tmp_path, cache_dir, 5, MESSAGES["truncated"])


@case
def patch_not_format_patch(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    (directory / "ok.patch").write_text("just some notes\n")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch ok.patch is not in git format-patch form (no leading 'From ' line)",
    )


@case
def series_lists_missing_file(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    (directory / "series").write_text("ok.patch\nmissing.patch\n")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        f"{directory / 'series'} lists missing.patch, which does not exist; "
        "restore the file or remove the line",
    )


@case
def series_duplicate_ids(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    (directory / "series").write_text("ok.patch\nok.patch\n")
    fake_index.add("1.0.0")
    return _apply_fresh(tmp_path, cache_dir, 5, f"{directory / 'series'} lists ok.patch twice")


@case
def series_entry_escapes(tmp_path, monkeypatch, fake_index, cache_dir):
    directory = _series(tmp_path, monkeypatch)
    (directory / "series").write_text("../../evil.patch\n")
    fake_index.add("1.0.0")
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        "patch series touches '../../evil.patch', a path outside the tree; refused",
    )


# --- archives and the index ---------------------------------------------------------------


def _archive_case(tmp_path, series_root, fake_index, cache_dir, member, reason):
    fake_index.add("1.0.0", make_sdist("1.0.0", extra_members=[member]))
    return _apply_fresh(
        tmp_path,
        cache_dir,
        5,
        f"vllm-1.0.0.tar.gz holds an unsafe member ({reason}); nothing of it was kept in the "
        "cache: the archive is not a genuine release",
    )


@case
def archive_member_dotdot(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    return _archive_case(
        tmp_path,
        series_root,
        fake_index,
        cache_dir,
        tar_member("vllm-1.0.0/../../escaped.txt"),
        "member 'vllm-1.0.0/../../escaped.txt' points outside the archive",
    )


@case
def archive_member_absolute(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    return _archive_case(
        tmp_path,
        series_root,
        fake_index,
        cache_dir,
        tar_member("/tmp/absolute-escape.txt"),
        "member '/tmp/absolute-escape.txt' points outside the archive",
    )


@case
def archive_symlink_out(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    return _archive_case(
        tmp_path,
        series_root,
        fake_index,
        cache_dir,
        tar_member("vllm-1.0.0/link", tarfile.SYMTYPE, "/etc/passwd"),
        "'vllm-1.0.0/link' is a link to an absolute path",
    )


@case
def archive_hardlink_out(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    return _archive_case(
        tmp_path,
        series_root,
        fake_index,
        cache_dir,
        tar_member("vllm-1.0.0/hard", tarfile.LNKTYPE, "/etc/passwd"),
        "'vllm-1.0.0/hard' is a link to an absolute path",
    )


@case
def archive_wrong_hash(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    fake_index.listed_hash["vllm-1.0.0.tar.gz"] = "ab" * 32
    got = hashlib.sha256(fake_index.archives["vllm-1.0.0.tar.gz"]).hexdigest()[:12]
    return _apply_fresh(tmp_path, cache_dir, 5, MESSAGES["hash"].format(got=got))


@case
def archive_not_an_archive(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0", b"\x1f\x8b this is not gzip")
    return _apply_fresh(tmp_path, cache_dir, 5, MESSAGES["corrupt"])


@case
def index_garbage(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    fake_index.mode = "garbage"
    return _apply_fresh(tmp_path, cache_dir, 4, MESSAGES["garbage"].format(url=fake_index.url))


@case
def index_silent(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    monkeypatch.setattr(index, "TIMEOUT", 0.5)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/simple"
    into = tmp_path / "t"
    monkeypatch.setattr(f"{__name__}._keep_alive", listener)
    return Case(
        ["apply", "--vllm", "1.0", "--into", str(into), "--index-url", url],
        4,
        MESSAGES["timeout"].format(url=url),
        [into, cache_dir],
    )


_keep_alive = None


@case
def version_not_a_version(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    return Case(
        ["apply", "--vllm", "banana", "--into", str(tmp_path / "t")],
        2,
        MESSAGES["version"],
        [tmp_path / "t", cache_dir],
    )


# --- sources and targets ------------------------------------------------------------------


@case
def source_not_vllm(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    source = tmp_path / "notvllm"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "__init__.py").write_text("")
    return Case(
        ["apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(tmp_path / "t")],
        2,
        f"--source {source} is not a vLLM source tree (no vllm/__init__.py)",
        [source, tmp_path / "t", cache_dir],
    )


@case
def source_dirty_in_place(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    source = _source_checkout(tmp_path)
    (source / "vllm" / "__init__.py").write_text("# local edit\n")
    return Case(
        ["apply", "--vllm", "1.0.0", "--source", str(source), "--in-place"],
        7,
        f"--source checkout {source} has uncommitted changes; commit or stash them first "
        "(moe-patch changed nothing)",
        [source, cache_dir],
    )


def _applied_tree(tmp_path) -> Path:
    into = tmp_path / "t"
    assert (
        CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(into)]).exit_code == 0
    )
    return into


@case
def target_dirty(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    into = _applied_tree(tmp_path)
    (into / "vllm" / "extra.py").write_text("mine\n")
    return Case(
        ["apply", "--vllm", "1.0.0", "--into", str(into)],
        7,
        f"target tree {into} has uncommitted changes; commit or stash them first "
        "(moe-patch changed nothing)",
        [into, cache_dir],
    )


@case
def target_detached_head_with_work(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    into = _applied_tree(tmp_path)
    git(into, "checkout", "-q", "--detach")
    (into / "mine.py").write_text("mine = 1\n")
    git(into, "add", "mine.py")
    git(into, "commit", "-q", "-m", "my work, on no branch")
    head = git(into, "rev-parse", "HEAD")
    return Case(
        ["apply", "--vllm", "1.0.0", "--into", str(into)],
        7,
        f"HEAD of {into} is detached at {head[:12]} with commits on no branch; "
        "save them with git switch -c NAME, then run again",
        [into, cache_dir],
    )


@case
def target_foreign_commits(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    into = _applied_tree(tmp_path)
    (into / "mine.py").write_text("mine = 1\n")
    git(into, "add", "mine.py")
    git(into, "commit", "-q", "-m", "my work")
    return Case(
        ["apply", "--vllm", "1.0.0", "--into", str(into)],
        7,
        f"branch moe-patch/v1.0.0 in {into} has commits moe-patch did not make; "
        "move them to another branch or delete it, then run again",
        [into, cache_dir],
    )


@case
def target_not_ours(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    into = tmp_path / "t"
    (into / "x").mkdir(parents=True)
    (into / "x" / "f").write_text("mine\n")
    return Case(
        ["apply", "--vllm", "1.0.0", "--into", str(into)],
        2,
        f"{into} exists and is not a tree made by moe-patch; choose another --into",
        [into, cache_dir],
    )


@case
def target_is_a_device(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    fake_index.add("1.0.0")
    message = "--into /dev/null exists and is not a directory; choose another --into"
    return Case(["apply", "--vllm", "1.0.0", "--into", "/dev/null"], 2, message, [cache_dir])


@case
def target_busy(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    import filelock

    fake_index.add("1.0.0")
    into = _applied_tree(tmp_path)
    lock = filelock.FileLock(str(into / ".git" / "moe-patch.lock"))
    lock.acquire()
    monkeypatch.setattr(f"{__name__}._keep_alive", lock)
    return Case(
        ["apply", "--vllm", "1.0.0", "--into", str(into)],
        6,
        f"another moe-patch run is changing {into}; wait for it to finish",
        [into / "vllm", cache_dir],
    )


# --- installed vLLM -----------------------------------------------------------------------


def _site(tmp_path, fake_index):
    fake_index.add("1.0.0")
    name, data = make_wheel("1.0.0")
    wheel = tmp_path / name
    wheel.write_bytes(data)
    return pip_install(wheel, tmp_path / "site")


@case
def installed_read_only(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    site = _site(tmp_path, fake_index)
    locked = site / "vllm/model_executor/layers/fused_moe"
    monkeypatch.setattr(installed, "_writable", lambda path: path != locked)
    return Case(
        ["apply", "--installed", "--target", str(site)],
        11,
        MESSAGES["readonly"].format(locked),
        [site],
    )


@case
def installed_disk_full(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    site = _site(tmp_path, fake_index)
    real = installed._write_atomic
    written = []

    def write(path, data, mode=None):
        if path.is_relative_to(site / "vllm"):
            written.append(path)
            if len(written) == 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, mode)

    monkeypatch.setattr(installed, "_write_atomic", write)
    return Case(
        ["apply", "--installed", "--target", str(site)],
        11,
        lambda: MESSAGES["diskfull"].format(written[1]),
        [site],
    )


@case
def cache_disk_full(tmp_path, monkeypatch, fake_index, cache_dir, series_root):
    from moe_patch import download

    fake_index.add("1.0.0")

    class Full(io.RawIOBase):
        pass

    real_fdopen = download.os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real_fdopen(fd, mode, *args, **kwargs)
        if "w" in mode:

            def write(data):
                raise OSError(errno.ENOSPC, "No space left on device")

            handle.write = write
        return handle

    monkeypatch.setattr(download.os, "fdopen", fdopen)
    return _apply_fresh(tmp_path, cache_dir, 11, MESSAGES["cachefull"])


_ROLLED_BACK = (
    "; what this run wrote was rolled back: free space or fix permissions, then run the same "
    "command again"
)
MESSAGES = {
    "truncated": "patch ok.patch has a malformed diff (Hunk is shorter than expected)",
    "symlink": "vllm-1.0.0.tar.gz holds an unsafe member ('vllm-1.0.0/link' is a link to an "
    "absolute path); nothing of it was kept in the cache: the archive is not a genuine release",
    "hardlink": "vllm-1.0.0.tar.gz holds an unsafe member ('vllm-1.0.0/hard' is a link to an "
    "absolute path); nothing of it was kept in the cache: the archive is not a genuine release",
    "hash": "vllm-1.0.0.tar.gz does not match the index's sha256 (expected abababababab…, got "
    "{got}…); the download was discarded: retry, and report it if it persists",
    "corrupt": "vllm-1.0.0.tar.gz is not a readable archive (ReadError: file could not be "
    "opened successfully); it was discarded: retry, and report it if it persists",
    "garbage": "the package index at {url}/vllm/ answered with a page that is not a valid "
    "PEP 691 listing; check --index-url / PIP_INDEX_URL",
    "timeout": "cannot reach the package index {url} (ReadTimeout); check the network or "
    "--index-url / PIP_INDEX_URL",
    "version": "'banana' is not a vLLM version; give one like 0.21 (newest 0.21.x) or 0.21.0",
    "readonly": "{} is not writable; run as its owner (or root), or use a patched wheel "
    "(moe-patch wheel) in the image instead",
    "diskfull": "No space left on device ({})" + _ROLLED_BACK,
    "cachefull": "No space left on device" + _ROLLED_BACK,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(name, tmp_path, monkeypatch, request):
    fixtures = {n: request.getfixturevalue(n) for n in ("fake_index", "cache_dir")}
    function = CASES[name]
    if "series_root" in function.__code__.co_varnames[: function.__code__.co_argcount]:
        fixtures["series_root"] = request.getfixturevalue("series_root")
    spec = function(tmp_path=tmp_path, monkeypatch=monkeypatch, **fixtures)
    cache_dir = fixtures["cache_dir"]
    before = {str(t): _digest(t, cache_dir) for t in spec.targets}
    result = CliRunner().invoke(main, spec.args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    message = spec.message() if callable(spec.message) else spec.message
    assert errors == [f"moe-patch: error: {message}"], result.stderr
    assert result.exit_code == spec.code
    assert {str(t): _digest(t, cache_dir) for t in spec.targets} == before
    assert not list(tmp_path.glob(".tmp-*")), "a half-made tree was left beside the target"


def _digest(path: Path, cache_dir: Path) -> str:
    """``tree_digest``; for the cache, of its entries only (trees/, sdist/, wheels/): the
    release listing and the lock files are bookkeeping, not entries."""
    if path != cache_dir:
        return tree_digest(path)
    return "|".join(
        tree_digest(path / name)
        for name in ("trees", "sdist", "wheels")
        if any((path / name).iterdir() if (path / name).is_dir() else ())
    )


def test_into_a_regular_file_is_bad_input_like_a_device(fake_index, cache_dir, tmp_path):
    fake_index.add("1.0.0")
    into = tmp_path / "t"
    into.write_text("not a tree\n")
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(into)])
    assert result.exit_code == 2 and "is a file" in result.stderr
    assert into.read_text() == "not a tree\n"
