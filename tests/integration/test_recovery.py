"""After a killed run, the next run of the same command succeeds.

Git lock files a killed moe-patch's git left are removed (only those: a lock of the user's
git, or one a live process holds, is kept and named); a rebase killed mid-way goes on; the
throwaway trees of ``wheel`` and ``apply --installed`` live in the cache, where the next run
and ``clean`` find them; a long ``--into`` name fits its scratch name; an empty one is refused.
The sweep over many kill points per command is ``tests/integration/test_kill_points.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner
from killhook import run_killed
from moe_patch import treelock
from moe_patch.cli import main
from support import KERNEL_MODULE, git, make_sdist, release_files
from wheel_support import add_wheel, make_wheel, pip_install

CLI = [sys.executable, "-c", "from moe_patch.cli import main; main()"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def _applied(tmp_path, fake_index):
    fake_index.add("1.0.0")
    into = tmp_path / "t"
    assert run("apply", "--vllm", "1.0.0", "--into", str(into)).exit_code == 0
    return into


def _killed_holding(tree, *locks: str) -> None:
    """A moe-patch run killed while its git held ``locks`` (paths in the git directory): a
    process takes the tree's lock as every run does, its git child creates the lock files,
    and SIGKILL ends both before either can clean up."""
    code = (
        "import os, signal, sys; from pathlib import Path; from moe_patch import treelock\n"
        "tree = Path(sys.argv[1])\n"
        "with treelock.target_lock(tree):\n"
        "    for name in sys.argv[2:]:\n"
        "        lock = treelock.git_dir(tree) / name\n"
        "        lock.parent.mkdir(parents=True, exist_ok=True)\n"
        "        lock.write_text('')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tree), *locks])
    assert done.returncode == -signal.SIGKILL


GIT_LOCKS = ("index.lock", "HEAD.lock", "refs/heads/moe-patch/v1.0.0.lock")


def test_git_locks_a_killed_apply_left_are_removed_by_the_next_run(
    fake_index, series_root, tmp_path
):
    into = _applied(tmp_path, fake_index)
    head = git(into, "rev-parse", "HEAD")
    _killed_holding(into, *GIT_LOCKS)
    result = run("apply", "--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert not [name for name in GIT_LOCKS if (into / ".git" / name).exists()]
    assert not (into / ".git" / treelock.OWNER_FILE).exists()
    assert git(into, "rev-parse", "HEAD") == head
    assert git(into, "status", "--porcelain") == ""


@pytest.mark.parametrize(
    ("command", "locks"),
    [
        ("checkout -q --detach", ["index.lock"]),
        ("git am", ["REBASE_HEAD.lock", "packed-refs.lock"]),
        ("checkout -q -B", ["index.lock"]),
    ],
)
def test_an_apply_killed_while_its_git_holds_locks_is_finished_by_the_next(
    fake_index, series_root, tmp_path, command, locks
):
    """The kill of issue 44: the process group SIGKILLed while git holds ``index.lock`` (or
    the locks of the refs it updates); every later run failed with exit 1 "git reset
    failed ... please report it"."""
    into = _applied(tmp_path, fake_index)
    head = git(into, "rev-parse", "HEAD")
    args = ["apply", "--vllm", "1.0.0", "--into", str(into)]
    killed = run_killed(args, dict(os.environ), on=command, during=True)
    assert killed.returncode == -signal.SIGKILL
    assert [(into / ".git" / name).exists() for name in locks] == [True] * len(locks)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert list((into / ".git").rglob("*.lock")) == [into / ".git" / "moe-patch.lock"]
    assert git(into, "rev-parse", "HEAD") == head
    assert git(into, "status", "--porcelain") == ""


def test_clean_into_removes_the_git_locks_of_a_killed_run(fake_index, series_root, tmp_path):
    into = _applied(tmp_path, fake_index)
    _killed_holding(into, "index.lock")
    listed = run("clean", "--into", str(into), "--dry-run", "--json")
    assert listed.exit_code == 0, listed.output
    what = {(p["path"], p["what"]) for p in json.loads(listed.stdout)["removed"]}
    assert (str(into / ".git" / "index.lock"), "git lock of a killed run") in what
    assert (into / ".git" / "index.lock").exists()
    assert run("clean", "--into", str(into)).exit_code == 0
    assert not (into / ".git" / "index.lock").exists()
    assert run("apply", "--vllm", "1.0.0", "--into", str(into)).exit_code == 0


def test_a_git_lock_moe_patch_did_not_leave_is_kept_and_named(fake_index, series_root, tmp_path):
    """The user's own git holds the index (or was killed holding it): not ours to remove."""
    into = _applied(tmp_path, fake_index)
    (into / ".git" / "index.lock").write_text("")
    result = run("apply", "--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: {into / '.git' / 'index.lock'} exists: a git command is running "
        f"in {into}, or one was killed there; once none is running, delete that file and run "
        "again\n"
    )
    assert (into / ".git" / "index.lock").exists()


def test_a_lock_a_live_process_holds_open_is_never_removed(fake_index, series_root, tmp_path):
    """A killed moe-patch whose git child lives on (it was killed alone) still holds the
    index: the next run waits for nothing and removes nothing; it says so."""
    into = _applied(tmp_path, fake_index)
    _killed_holding(into, "index.lock")
    with open(into / ".git" / "index.lock", "a"):  # the surviving git child's handle
        result = run("apply", "--vllm", "1.0.0", "--into", str(into))
        assert result.exit_code == 7, result.output
        assert "index.lock exists: a git command is running" in result.stderr
        assert (into / ".git" / "index.lock").exists()
    assert run("apply", "--vllm", "1.0.0", "--into", str(into)).exit_code == 0


@pytest.fixture
def rebase_world(fake_index, series_root, tmp_path, monkeypatch):
    """Releases 1.0.0 and 1.1.0 (the kernel moved and changed), a warm cache."""
    fake_index.add("1.0.0")
    moved = "# a new header comment\n" + KERNEL_MODULE.replace("return 1\n", "return 2\n")
    fake_index.add("1.1.0", make_sdist("1.1.0", release_files("1.1.0", moved)))
    assert run("apply", "--vllm", "1.1.0", "--into", str(tmp_path / "warm")).exit_code == 0
    return series_root


def test_a_rebase_killed_mid_way_can_continue(rebase_world, tmp_path):
    into = tmp_path / "r"
    command = ["rebase", "--onto", "1.1.0", "--into", str(into)]
    killed = run_killed(command, dict(os.environ), on="cherry-pick")
    assert killed.returncode == -signal.SIGKILL
    (into / ".git" / "index.lock").write_text("")  # the cherry-pick died holding the index
    result = run("rebase", "--continue", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert (rebase_world / "v1.1.0" / "series").read_text() == "jit.patch\nextra.patch\n"
    assert git(into, "status", "--porcelain") == ""


def test_the_same_rebase_command_finishes_a_killed_one_and_reports_a_done_one(
    rebase_world, tmp_path
):
    into = tmp_path / "r"
    command = ["rebase", "--onto", "1.1.0", "--into", str(into)]
    assert run_killed(command, dict(os.environ), on="cherry-pick#2").returncode == -9
    result = run(*command)
    assert result.exit_code == 0, result.output
    assert (
        f"moe-patch: going on with the rebase onto vLLM 1.1.0 that a run left in {into}\n"
        in result.stderr
    )
    written = {p.name: p.read_bytes() for p in (rebase_world / "v1.1.0").iterdir()}
    again = run(*command)
    assert again.exit_code == 0, again.output
    assert f"moe-patch: the rebase onto vLLM 1.1.0 in {into} is done; nothing left to do\n" in (
        again.stderr
    )
    assert again.stdout == result.stdout  # the same report, range-diff included
    assert {p.name: p.read_bytes() for p in (rebase_world / "v1.1.0").iterdir()} == written


@pytest.mark.parametrize("command", ["wheel", "apply-installed"])
def test_the_throwaway_tree_of_a_killed_run_lives_in_the_cache(
    command, fake_index, series_root, cache_dir, tmp_path
):
    """``wheel`` and ``apply --installed`` apply the series to a throwaway release tree
    (~100 MB for a real release): under the cache, named after the run, swept by the next
    run and by ``clean``; never left in the system's temporary folder."""
    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    name, data = make_wheel("1.0.0")
    (tmp_path / name).write_bytes(data)
    site = pip_install(tmp_path / name, tmp_path / "site")
    args = {
        "wheel": ["wheel", "--vllm", "1.0.0", "-o", str(tmp_path / "dist")],
        "apply-installed": ["apply", "--installed", "--target", str(site)],
    }[command]
    temporary = tmp_path / "tmpdir"
    temporary.mkdir()
    env = dict(os.environ, TMPDIR=str(temporary))
    assert run_killed(args, env, on="git am").returncode == -signal.SIGKILL
    assert list(temporary.iterdir()) == []
    (left,) = (cache_dir / "scratch").iterdir()
    assert left.name.startswith("release-") and (left / "vllm-1.0.0").is_dir()

    listed = run("clean", "--dry-run", "--json")
    assert listed.exit_code == 0, listed.output
    assert {"path": str(left), "what": "leftover"}.items() <= json.loads(listed.stdout)["removed"][
        0
    ].items()
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert list((cache_dir / "scratch").iterdir()) == []
    assert list(temporary.iterdir()) == []


def test_clean_removes_a_killed_runs_scratch_and_keeps_a_live_ones(cache_dir, tmp_path):
    from moe_patch import cache

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with cache.scratch("release") as live:
        left = cache.subdir("scratch") / f"release-{dead.pid}-abcd1234"
        (left / "vllm-1.0.0").mkdir(parents=True)
        result = run("clean", "--json")
        assert result.exit_code == 6, result.output
        report = json.loads(result.stdout)
        assert [p["path"] for p in report["removed"]] == [str(left)]
        assert report["in_use"] == [str(live)]
        assert live.is_dir() and not left.exists()


def test_a_250_character_into_name_fits_its_scratch_name(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    into = tmp_path / ("v" * 250)
    result = run("apply", "--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert git(into, "status", "--porcelain") == ""
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize(
    "args",
    [
        ["apply", "--vllm", "1.0.0", "--into", ""],
        ["apply", "--vllm", "1.0.0", "--source", ""],
        ["rebase", "--onto", "1.1.0", "--into", ""],
        ["wheel", "--vllm", "1.0.0", "-o", ""],
        ["checkout", "--vllm", "1.0.0", ""],
        ["clean", "--into", ""],
    ],
)
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(
    args, fake_index, series_root, tmp_path, monkeypatch
):
    fake_index.add("1.0.0")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = run(*args)
    assert result.exit_code == 2, result.output
    name = "DIRECTORY" if args[0] == "checkout" else args[-2]
    assert result.stderr == (
        f"moe-patch: error: {name} is empty; give a directory path ('.' for this one)\n"
    )
    assert list(here.iterdir()) == []
