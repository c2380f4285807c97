"""Hostile environments and malformed answers: one-line errors, no traceback, no secret shown."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import git as git_module
import pytest
from click.testing import CliRunner
from moe_patch import cache, index
from moe_patch.cli import main
from moe_patch.errors import NetworkError, UsageError
from moe_patch.pipconfig import IndexSettings, redact
from support import (
    git,
    make_sdist,
    release_checkout,
    release_files,
    unrelated_repo,
    user_gitconfig,
)

JSON = "application/vnd.pypi.simple.v1+json"
SECRET_BASE = "https://alice:hunter2@index.example.invalid/simple/vllm/"


@pytest.mark.parametrize("files", [None, "vllm-1.0.0.tar.gz", {"a": 1}, 3])
def test_a_pep691_listing_whose_files_is_not_a_list_is_an_index_error(files):
    body = json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()
    with pytest.raises(NetworkError, match="not a valid PEP 691 listing") as caught:
        index.parse_listing(body, JSON, SECRET_BASE)
    assert "hunter2" not in caught.value.message and "alice:****@" in caught.value.message


def test_malformed_hashes_and_sizes_leave_those_fields_unknown():
    body = json.dumps(
        {
            "files": [
                {"filename": "vllm-1.0.0.tar.gz", "url": "a", "hashes": "sha256=00", "size": "12"},
                {
                    "filename": "vllm-1.1.0.tar.gz",
                    "url": "b",
                    "hashes": {"sha256": 7},
                    "size": True,
                },
                {
                    "filename": "vllm-1.2.0.tar.gz",
                    "url": "c",
                    "hashes": {"sha256": "ab"},
                    "size": 5,
                },
            ]
        }
    ).encode()
    dists = {d.version: d for d in index.parse_listing(body, JSON, "https://i/simple/vllm/")}
    assert (dists["1.0.0"].sha256, dists["1.0.0"].size) == (None, None)
    assert (dists["1.1.0"].sha256, dists["1.1.0"].size) == (None, None)
    assert (dists["1.2.0"].sha256, dists["1.2.0"].size) == ("ab", 5)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://alice:hunter2@host:8443/simple", "https://alice:****@host:8443/simple"),
        ("https://tok3n@host/simple", "https://****@host/simple"),
        ("https://host/simple", "https://host/simple"),
        ("/srv/index", "/srv/index"),
    ],
)
def test_credentials_are_masked_as_pip_masks_them(url, shown):
    assert redact(url) == shown
    assert IndexSettings(url).shown == shown


def test_an_unreachable_index_with_a_password_never_prints_it(cache_dir, tmp_path):
    # Port 9 (discard) on loopback: nothing listens there, the connection is refused at once.
    result = CliRunner().invoke(
        main,
        [
            "apply",
            "--vllm",
            "1.0.0",
            "--into",
            str(tmp_path / "t"),
            "--index-url",
            "http://alice:hunter2@127.0.0.1:9/simple",
        ],
    )
    assert result.exit_code == 4, result.output
    assert "hunter2" not in result.output and "alice:****@127.0.0.1:9" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", ""])
def test_a_bad_lock_timeout_is_a_usage_error_not_an_import_crash(monkeypatch, value):
    env = dict(os.environ, MOE_PATCH_LOCK_TIMEOUT=value)
    started = subprocess.run(
        [sys.executable, "-c", "import moe_patch.cli, moe_patch.cache"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert started.returncode == 0, started.stderr
    monkeypatch.setenv("MOE_PATCH_LOCK_TIMEOUT", value)
    with pytest.raises(UsageError, match="is not a number of seconds"):
        cache.lock_timeout()


def test_a_bad_lock_timeout_stops_a_command_with_exit_2(
    cache_dir, fake_index, tmp_path, monkeypatch
):
    fake_index.add("1.0.0")
    monkeypatch.setenv("MOE_PATCH_LOCK_TIMEOUT", "abc")
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 2, result.output
    assert "MOE_PATCH_LOCK_TIMEOUT='abc' is not a number of seconds" in result.output
    assert "Traceback" not in result.output
    monkeypatch.setenv("MOE_PATCH_LOCK_TIMEOUT", "12.5")
    assert cache.lock_timeout() == 12.5
    monkeypatch.delenv("MOE_PATCH_LOCK_TIMEOUT")
    assert cache.lock_timeout() == cache.DEFAULT_LOCK_TIMEOUT


def _state(repo):
    return git(repo, "for-each-ref"), git(repo, "config", "--local", "--list"), git(repo, "status")


def test_git_variables_of_a_hook_do_not_steer_moe_patch(
    cache_dir, fake_index, series_root, tmp_path, monkeypatch
):
    fake_index.add("1.0.0")
    repo = unrelated_repo(tmp_path)
    before = _state(repo)
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(repo))
    monkeypatch.setenv("GIT_INDEX_FILE", str(repo / ".git" / "index"))
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    for key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(key, raising=False)
    assert _state(repo) == before  # its remote, refs, config and files are as they were
    assert "moe-patch/v1.0.0" in git(tmp_path / "t", "branch", "--show-current")


def test_signing_and_failing_hooks_of_the_user_do_not_fail_the_series(
    cache_dir, fake_index, series_root, tmp_path, monkeypatch
):
    fake_index.add("1.0.0")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in ("pre-commit", "commit-msg", "post-checkout", "reference-transaction"):
        (hooks / name).write_text("#!/bin/sh\nexit 1\n")
        (hooks / name).chmod(0o755)
    user_gitconfig(
        tmp_path,
        monkeypatch,
        f"[core]\n\thooksPath = {hooks}\n\tautocrlf = true\n"
        "[commit]\n\tgpgSign = true\n[tag]\n\tgpgSign = true\n[gpg]\n\tprogram = false\n",
    )
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert git(tmp_path / "t", "status", "--porcelain") == ""


def test_scratch_trees_of_killed_runs_are_removed_by_the_next_run(
    cache_dir, fake_index, series_root, tmp_path
):
    fake_index.add("1.0.0")
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its pid belongs to no live process now
    dead = tmp_path / f".tmp-t-{finished.pid}-k1ll3d"
    (dead / "vllm").mkdir(parents=True)
    (dead / "vllm" / "big").write_bytes(b"x" * 1000)
    live = tmp_path / f".tmp-t-{os.getpid()}-runn1ng"  # a run still at work: kept
    live.mkdir()
    other = tmp_path / f".tmp-other-{finished.pid}-k1ll3d"  # another --into's: not ours
    other.mkdir()
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert not dead.exists() and live.exists() and other.exists()
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-t-"))
    assert leftovers == [live.name]


def test_a_symlink_as_into_is_bad_input_not_another_run(
    cache_dir, fake_index, series_root, tmp_path
):
    fake_index.add("1.0.0")
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(link)])
    assert result.exit_code == 2, result.output
    assert "is a symbolic link" in result.output and "another moe-patch run" not in result.output
    assert link.is_symlink() and list(target.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_into_on_another_filesystem_than_the_cache(cache_dir, fake_index, series_root, tmp_path):
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test's temporary folder")
    fake_index.add("1.0.0")
    into = Path(tempfile.mkdtemp(dir=other, prefix="moe-patch-test-")) / "t"
    try:
        result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(into)])
        assert result.exit_code == 0, result.output
        assert "moe-patch/v1.0.0" in git(into, "branch", "--show-current")
    finally:
        shutil.rmtree(into.parent, ignore_errors=True)


def _failing_git(stderr):
    def run(*args, **kwargs):
        raise git_module.GitCommandError(["git", "checkout", "-q"], 128, stderr.encode())

    return run


@pytest.mark.parametrize(
    ("stderr", "code", "words"),
    [
        (
            "error: unable to write file vllm/x.py: No space left on device\nfatal: cannot",
            11,
            "git checkout could not write (fatal: cannot); free space or fix permissions",
        ),
        (
            "fatal: unable to read tree 0123abcd",
            1,
            "git checkout failed (fatal: unable to read tree 0123abcd); please report it",
        ),
    ],
)
def test_a_git_failure_is_one_line_with_a_documented_code(
    cache_dir, fake_index, series_root, tmp_path, monkeypatch, stderr, code, words
):
    fake_index.add("1.0.0")
    from moe_patch import sources

    real = sources.gitutil.run

    def run(cwd, *args, **kwargs):
        if "checkout" in args:
            _failing_git(stderr)()
        return real(cwd, *args, **kwargs)

    monkeypatch.setattr(sources.gitutil, "run", run)
    into = tmp_path / "new" / "t"  # its parent too is made by the run, and removed with it
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(into)])
    assert result.exit_code == code, result.output
    assert words in result.stderr and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if "error" in line] == [
        line for line in result.stderr.splitlines() if line.startswith("moe-patch: error: git")
    ]
    assert not (tmp_path / "new").exists()


def test_an_unexpected_exception_is_one_line_exit_1_unless_debugging(
    cache_dir, fake_index, series_root, tmp_path, monkeypatch
):
    fake_index.add("1.0.0")
    from moe_patch import trees

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(trees, "resolve_version", broken)
    args = ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "moe-patch: internal error: KeyError: 'boom'; please report it" in result.stderr
    assert "Traceback" not in result.output
    for off in ("0", "false", "off", ""):
        monkeypatch.setenv("MOE_PATCH_DEBUG", off)
        quiet = CliRunner().invoke(main, args)
        assert quiet.exit_code == 1 and "Traceback" not in quiet.output, off
    monkeypatch.setenv("MOE_PATCH_DEBUG", "1")
    debug = CliRunner().invoke(main, args)
    assert debug.exit_code == 1
    assert (
        "Traceback (most recent call last)" in debug.stderr and "KeyError: 'boom'" in debug.stderr
    )
    assert debug.stderr.splitlines()[-1].startswith("moe-patch: internal error: KeyError")


@pytest.mark.parametrize("damage", ["delete", "truncate", "flip"])
def test_a_damaged_cached_release_is_rebuilt(cache_dir, fake_index, series_root, tmp_path, damage):
    fake_index.add("1.0.0")
    first = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    packs = list((cache_dir / "trees" / "v1.0.0.git" / "objects" / "pack").glob("*.pack"))
    assert packs
    for pack in packs:
        data = bytearray(pack.read_bytes())
        if damage == "delete":
            pack.unlink()
            continue
        pack.chmod(0o644)
        if damage == "truncate":
            pack.write_bytes(bytes(data[: len(data) // 2]))
        else:
            data[len(data) // 2] ^= 0xFF
            pack.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "repository was damaged" in result.stderr and "building it again" in result.stderr
    assert git(tmp_path / "a", "rev-parse", "HEAD") == git(tmp_path / "b", "rev-parse", "HEAD")
    again = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "c")])
    assert again.exit_code == 0 and "damaged" not in again.stderr


def _sdists(cache_dir):
    folder = cache_dir / "sdist"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_download_larger_than_the_listed_size_is_stopped(
    cache_dir, fake_index, series_root, tmp_path
):
    fake_index.add("1.0.0")
    fake_index.listed_size["vllm-1.0.0.tar.gz"] = 100  # the real archive is larger
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 5, result.output
    assert "sends more than the 100 bytes the index lists for vllm-1.0.0.tar.gz" in result.stderr
    assert _sdists(cache_dir) == [] and not (tmp_path / "t").exists()


def test_a_trickling_download_meets_its_deadline(
    cache_dir, fake_index, series_root, tmp_path, monkeypatch
):
    noise = os.urandom(2048).hex()  # incompressible: the archive takes many trickled chunks
    fake_index.add("1.0.0", make_sdist("1.0.0", {**release_files("1.0.0"), "noise.txt": noise}))
    assert len(fake_index.archives["vllm-1.0.0.tar.gz"]) > 8 * 256
    fake_index.delay = 0.1  # 256 bytes every 100 ms
    monkeypatch.setenv("MOE_PATCH_DOWNLOAD_DEADLINE", "0.3")
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 4, result.output
    assert "took longer than 0.3 s (MOE_PATCH_DOWNLOAD_DEADLINE)" in result.stderr
    assert _sdists(cache_dir) == []


@pytest.mark.parametrize(
    ("limit", "deadline", "words"),
    [
        (100, 120.0, "sends a vllm listing larger than 0 MiB"),
        (64 << 20, -1.0, "took longer than -1 s to send the vllm listing"),
    ],
)
def test_an_oversized_or_endless_listing_is_an_index_error(
    cache_dir, fake_index, tmp_path, monkeypatch, limit, deadline, words
):
    fake_index.add("1.0.0")
    monkeypatch.setattr(index, "LISTING_LIMIT", limit)
    monkeypatch.setattr(index, "LISTING_DEADLINE", deadline)
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 4, result.output
    assert words in result.stderr and "Traceback" not in result.output


def test_every_exit_code_is_documented_in_help_and_troubleshooting():
    import re

    from moe_patch import errors

    codes = sorted(
        v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)
    )
    assert codes == list(range(len(codes)))  # no gaps, no two names for one code
    manual = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()
    table = manual.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `(\d+)` \| \S", table, re.MULTILINE) == [str(c) for c in codes]
    for code in codes:
        assert re.search(rf"^\s*{code}\s+\S", errors.EXIT_CODES_HELP, re.MULTILINE), code
    assert " 11  a local read or write failed" in CliRunner().invoke(main, ["--help"]).output


def test_every_command_shows_examples_that_parse_and_only_its_exit_codes():
    import re
    import shlex

    from moe_patch import errors

    for name, command in main.commands.items():
        help_text = CliRunner().invoke(main, [name, "--help"]).output
        examples = help_text.split("Examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert examples, name
        for example in examples:
            words = shlex.split(example.split("#", 1)[0])
            assert words[:2] == ["moe-patch", name], example
            command.make_context(name, words[2:])  # options exist, values are valid
        codes = {
            int(c) for c in re.findall(r"^\s+(\d+)  ", help_text.split("Exit codes:")[1], re.M)
        }
        assert {0, 1} <= codes < set(errors.EXIT_MEANINGS), (name, codes)
    assert "10  export --check" not in CliRunner().invoke(main, ["apply", "--help"]).output


VANISHED_PACK = (
    "fatal: failed to copy file to '/t/.git/objects/pack/pack-1.idx': No such file or directory"
)


@pytest.mark.parametrize("second_clone_fails", [False, True])
def test_a_source_clone_that_loses_a_pack_is_retried_through_git_transport(
    fake_index, series_root, tmp_path, monkeypatch, second_clone_fails
):
    """The local clone copies object files and fails when gc moves one away; the retry reads
    through git's object store.  Two failures are the source's: exit 2, one line, no tree."""
    from moe_patch import sources

    source = release_checkout(tmp_path / "src")
    real = sources.gitutil.run
    clones = []

    def run(cwd, *args, **kwargs):
        if "clone" in args:
            clones.append(args)
            if "--no-hardlinks" in args or second_clone_fails:
                raise git_module.GitCommandError(["git", "clone"], 128, VANISHED_PACK.encode())
        return real(cwd, *args, **kwargs)

    monkeypatch.setattr(sources.gitutil, "run", run)
    into = tmp_path / "t"
    result = CliRunner().invoke(
        main, ["apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(into)]
    )
    assert ["--no-hardlinks" in args for args in clones] == [True, False]
    assert "--no-local" in clones[1]
    if second_clone_fails:
        assert result.exit_code == 2, result.output
        assert "cannot clone --source" in result.stderr and "git fsck" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
        assert not into.exists()
    else:
        assert result.exit_code == 0, result.output
        released = git(source, "rev-parse", "HEAD")
        assert git(into, "merge-base", released, "HEAD") == released
        assert git(into, "rev-parse", "HEAD") != released  # the series is on top
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
