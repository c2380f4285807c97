"""SIGKILL at many points, and concurrent runs.

Each kill-loop runs an operation in a subprocess, kills it (SIGKILL, no clean-up) after a
seeded random delay, then runs what a user would run next and checks that the result is
exactly what an uninterrupted run gives: the same commits, the same files, the same
installed bytes.  Where the next run cannot finish by itself it must say so in one line
naming the command that recovers.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import git, tree_digest
from wheel_support import make_wheel, pip_install, record_problems

CLI = [sys.executable, "-c", "from moe_patch.cli import main; main()"]
POINTS = int(os.environ.get("MOE_PATCH_KILL_POINTS", "50"))


def cli(*args, env=None, check=True):
    result = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def killed_at(delay: float, *args, env=None) -> bool:
    """Start ``moe-patch ARGS``; SIGKILL it after ``delay`` s. True if it was killed."""
    process = subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        process.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        return True


def timed(*args, env=None) -> float:
    start = time.monotonic()
    cli(*args, env=env)
    return time.monotonic() - start


def work_files(tree: Path) -> str:
    """Digest of the checked-out files (not .git, whose packing may differ)."""
    scratch = tree.parent / f"{tree.name}-files"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(tree, scratch, ignore=shutil.ignore_patterns(".git"))
    try:
        return tree_digest(scratch)
    finally:
        shutil.rmtree(scratch)


class KillPoints:
    """Kill times for ``POINTS`` kills that land while the command runs.

    Delays are drawn over the run's duration; a run that finished before its kill tells how
    long a run really takes, so the window shrinks to that and another point is drawn (at most
    ``3 * POINTS`` tries). A kill that lands after the run has ended tests nothing."""

    def __init__(self, duration: float, seed: int):
        self.rng = random.Random(seed)
        self.limit = duration * 0.9
        self.landed = self.tries = 0

    def __iter__(self):
        while self.landed < POINTS and self.tries < 3 * POINTS:
            self.tries += 1
            yield self.rng.uniform(0.05, max(self.limit, 0.1))

    def record(self, delay: float, killed: bool) -> None:
        if killed:
            self.landed += 1
        else:
            self.limit = min(self.limit, delay * 0.9)

    def check(self) -> None:
        assert self.landed == POINTS, f"only {self.landed} of {self.tries} kills landed mid-run"


def leftovers(into: Path) -> list[str]:
    """What a run left beside ``into``: scratch trees and temporary files of its name."""
    return sorted(
        p.name for p in into.parent.iterdir() if p.name.startswith((f".tmp-{into.name}", ".tmp"))
    )


def test_kill_apply_and_download_at_many_points(fake_index, series_root, tmp_path):
    """``apply`` from a cold cache (index listing, sdist download, unpack, clone, patches)."""
    fake_index.add("1.0.0")
    fake_index.delay = 0.02  # the download takes a while, so kills land inside it
    env = dict(os.environ)
    # The faster of two cold runs (the first also warms the OS's caches), so kills land early.
    took = []
    for attempt in ("first", "reference"):
        env["MOE_PATCH_CACHE"] = str(tmp_path / f"cache-{attempt}")
        reference = tmp_path / attempt
        took.append(timed("apply", "--vllm", "1.0.0", "--into", str(reference), env=env))
    duration = min(took)
    head = git(reference, "rev-parse", "moe-patch/v1.0.0")
    files = work_files(reference)

    points = KillPoints(duration, seed=9)
    for point, delay in enumerate(points):
        env["MOE_PATCH_CACHE"] = str(tmp_path / f"cache-{point}")
        into = tmp_path / f"t-{point}"
        points.record(
            delay, killed_at(delay, "apply", "--vllm", "1.0.0", "--into", str(into), env=env)
        )
        cli("apply", "--vllm", "1.0.0", "--into", str(into), env=env)  # the next run finishes
        assert git(into, "rev-parse", "moe-patch/v1.0.0") == head, f"kill at {delay:.2f} s"
        assert git(into, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0"
        assert git(into, "status", "--porcelain") == ""
        assert work_files(into) == files
        cache = Path(env["MOE_PATCH_CACHE"])
        assert [p.name for p in (cache / "trees").iterdir()] == ["v1.0.0.git"]
        assert not list((cache / "sdist").iterdir())  # no half download kept
        assert leftovers(into) == [], f"kill at {delay:.2f} s"
    points.check()


def test_kill_reapply_on_an_existing_tree(fake_index, series_root, tmp_path):
    """A second ``apply`` over an existing tree (state file, branch move) killed anywhere."""
    fake_index.add("1.0.0")
    env = dict(os.environ)
    reference = tmp_path / "reference"
    cli("apply", "--vllm", "1.0.0", "--into", str(reference), env=env)
    duration = timed("apply", "--vllm", "1.0.0", "--into", str(reference), env=env)
    head = git(reference, "rev-parse", "moe-patch/v1.0.0")
    into = tmp_path / "t"
    cli("apply", "--vllm", "1.0.0", "--into", str(into), env=env)
    points = KillPoints(duration, seed=11)
    for delay in points:
        points.record(
            delay, killed_at(delay, "apply", "--vllm", "1.0.0", "--into", str(into), env=env)
        )
        result = cli("apply", "--vllm", "1.0.0", "--into", str(into), "--json", env=env)
        assert git(into, "rev-parse", "moe-patch/v1.0.0") == head, f"kill at {delay:.2f} s"
        assert git(into, "status", "--porcelain") == ""
        assert '"unchanged": true' in result.stdout
        assert leftovers(into) == [], f"kill at {delay:.2f} s"
    points.check()


def installed_digest(site: Path) -> str:
    """Every file of an install but those that hold the patch time (bytecode of the patched
    files, RECORD's hashes of it, the state file's mtimes); RECORD is checked on its own."""
    scratch = site.parent / f"{site.name}-files"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(site, scratch, ignore=shutil.ignore_patterns("*.pyc", "RECORD", "state.json"))
    try:
        return tree_digest(scratch)
    finally:
        shutil.rmtree(scratch)


@pytest.fixture
def wheel_file(tmp_path):
    name, data = make_wheel("1.0.0")
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_kill_apply_installed_at_many_points(fake_index, series_root, tmp_path, wheel_file):
    fake_index.add("1.0.0")
    env = dict(os.environ)
    pristine = pip_install(wheel_file, tmp_path / "pristine")
    site = tmp_path / "site"
    shutil.copytree(pristine, site, symlinks=True)  # copy2 keeps mtimes: same bytecode
    duration = timed("apply", "--installed", "--target", str(site), env=env)
    patched = installed_digest(site)

    points = KillPoints(duration, seed=13)
    for delay in points:
        shutil.rmtree(site)
        shutil.copytree(pristine, site, symlinks=True)
        before = tree_digest(site)
        points.record(
            delay, killed_at(delay, "apply", "--installed", "--target", str(site), env=env)
        )
        result = cli("apply", "--installed", "--target", str(site), env=env, check=False)
        if result.returncode == 7:  # interrupted: the message names the command that recovers
            assert result.stderr == (
                f"moe-patch: error: an earlier apply to {site} was interrupted; "
                "run moe-patch revert --installed first\n"
            )
            cli("revert", "--installed", "--target", str(site), env=env)
            assert tree_digest(site) == before  # revert restores every byte
            cli("apply", "--installed", "--target", str(site), env=env)
        else:
            assert result.returncode == 0, result.stderr
        assert installed_digest(site) == patched, f"kill at {delay:.2f} s"
        assert record_problems(site) == []
        assert leftovers(site) == [], f"kill at {delay:.2f} s"
    points.check()


# --- concurrency ------------------------------------------------------------------------


def _together(*commands, env):
    processes = [
        subprocess.Popen(
            [*CLI, *c], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for c in commands
    ]
    return [(p.wait(), p.stderr.read()) for p in processes]


def test_two_applies_on_one_cache(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    fake_index.delay = 0.01
    env = dict(os.environ)
    for round_ in range(3):
        env["MOE_PATCH_CACHE"] = str(tmp_path / f"cache-{round_}")
        a, b = tmp_path / f"a-{round_}", tmp_path / f"b-{round_}"
        results = _together(
            ["apply", "--vllm", "1.0.0", "--into", str(a)],
            ["apply", "--vllm", "1.0.0", "--into", str(b)],
            env=env,
        )
        assert [code for code, _ in results] == [0, 0], results
        assert git(a, "rev-parse", "HEAD") == git(b, "rev-parse", "HEAD")
        downloads = [r for r in fake_index.requests if r.startswith("/files/")]
        assert len(downloads) == round_ + 1  # one download per cache, shared by both runs
        repo = Path(env["MOE_PATCH_CACHE"]) / "trees" / "v1.0.0.git"
        git(repo, "fsck", "--strict")  # never a corrupt cache entry
        assert [p.name for p in repo.parent.iterdir()] == ["v1.0.0.git"]


def test_two_applies_on_one_target(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    env = dict(os.environ)
    cli("apply", "--vllm", "1.0.0", "--into", str(tmp_path / "warm"), env=env)  # warm cache
    head = git(tmp_path / "warm", "rev-parse", "HEAD")
    for round_ in range(4):
        into = tmp_path / f"t-{round_}"
        if round_ % 2:  # an existing tree, updated twice at once
            cli("apply", "--vllm", "1.0.0", "--into", str(into), env=env)
        results = _together(*[["apply", "--vllm", "1.0.0", "--into", str(into)]] * 2, env=env)
        for code, stderr in results:
            assert code in (0, 6), stderr
            if code == 6:
                assert stderr.startswith("moe-patch: error: another moe-patch run ")
                assert stderr.count("\n") == 1
        assert 0 in [code for code, _ in results]
        assert git(into, "rev-parse", "HEAD") == head
        assert git(into, "status", "--porcelain") == ""


def test_lock_held_past_the_timeout_is_a_busy_error(fake_index, series_root, tmp_path):
    import filelock
    from moe_patch import cache

    fake_index.add("1.0.0")
    env = dict(os.environ, MOE_PATCH_LOCK_TIMEOUT="0.5")
    lock = filelock.FileLock(str(cache.subdir("locks") / "vllm-1.0.0.lock"))
    with lock:
        result = cli(
            "apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t"), env=env, check=False
        )
    assert result.returncode == 6
    assert result.stderr == (
        "moe-patch: error: another moe-patch run holds the cache entry 'vllm-1.0.0' "
        "(waited 0 s); wait for it to finish, or set MOE_PATCH_LOCK_TIMEOUT\n"
    )
    assert not (tmp_path / "t").exists()
    assert cli("apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t"), env=env).returncode == 0


def test_kill_rebase_at_many_points(fake_index, series_root, tmp_path):
    from support import KERNEL_MODULE, make_sdist, release_files

    fake_index.add("1.0.0")
    moved = "# a new header comment\n" + KERNEL_MODULE.replace("return 1\n", "return 2\n")
    fake_index.add("1.1.0", make_sdist("1.1.0", release_files("1.1.0", moved)))
    env = dict(os.environ)
    cli("apply", "--vllm", "1.1.0", "--into", str(tmp_path / "warm"), env=env)  # warm cache

    def fresh_series(name):
        root = tmp_path / name
        shutil.copytree(series_root, root)
        env["MOE_PATCH_SERIES"] = str(root)
        return root

    root = fresh_series("ref-series")
    reference = tmp_path / "reference"
    duration = timed("rebase", "--onto", "1.1.0", "--into", str(reference), env=env)
    head = git(reference, "rev-parse", "HEAD")
    written = {p.name: p.read_bytes() for p in (root / "v1.1.0").iterdir()}
    assert set(written) == {"series", "jit.patch", "extra.patch"}

    recovered, points = 0, KillPoints(duration, seed=17)
    for point, delay in enumerate(points):
        root = fresh_series(f"series-{point}")
        into = tmp_path / f"r-{point}"
        command = ["rebase", "--onto", "1.1.0", "--into", str(into)]
        points.record(delay, killed_at(delay, *command, env=env))
        result = cli(*command, env=env, check=False)
        if result.returncode == 7:
            assert result.stderr == (
                f"moe-patch: error: a moe-patch rebase is already in progress in {into} "
                f"(stopped or interrupted); run moe-patch rebase --continue --into {into} "
                f"(or --abort --into {into})\n"
            )
            cli("rebase", "--continue", "--into", str(into), env=env)
            recovered += 1
        elif result.returncode == 2 and "already exists" in result.stderr:
            pass  # the killed run had finished writing the series: nothing left to do
        else:
            assert result.returncode == 0, (delay, result.stderr)
        assert {p.name: p.read_bytes() for p in (root / "v1.1.0").iterdir()} == written
        if (into / ".git").is_dir():
            assert git(into, "rev-parse", "HEAD") == head, f"kill at {delay:.2f} s"
        assert leftovers(into) == [], f"kill at {delay:.2f} s"
        assert leftovers(root / "v1.1.0") == [], f"kill at {delay:.2f} s"
    points.check()


def test_kill_wheel_at_many_points(fake_index, series_root, tmp_path):
    """``wheel`` (official wheel download, patched members, RECORD, the new wheel's write)
    killed anywhere: the next run writes the same wheel, and nothing else is left in the
    output folder or the cache."""
    from wheel_support import add_wheel

    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    fake_index.delay = 0.02
    env = dict(os.environ)
    took = []
    for attempt in ("first", "reference"):  # the faster of two cold runs, as for apply
        env["MOE_PATCH_CACHE"] = str(tmp_path / f"cache-{attempt}")
        reference = tmp_path / f"dist-{attempt}"
        took.append(timed("wheel", "--vllm", "1.0.0", "-o", str(reference), env=env))
    duration = min(took)
    (built,) = reference.iterdir()

    points = KillPoints(duration, seed=19)
    for point, delay in enumerate(points):
        env["MOE_PATCH_CACHE"] = str(tmp_path / f"cache-{point}")
        dist = tmp_path / f"dist-{point}"
        points.record(delay, killed_at(delay, "wheel", "--vllm", "1.0.0", "-o", str(dist), env=env))
        cli("wheel", "--vllm", "1.0.0", "-o", str(dist), env=env)
        assert [p.name for p in dist.iterdir()] == [built.name], f"kill at {delay:.2f} s"
        assert (dist / built.name).read_bytes() == built.read_bytes(), f"kill at {delay:.2f} s"
        cache = Path(env["MOE_PATCH_CACHE"])
        stray = [
            p for p in cache.rglob("*") if p.name.startswith((".tmp", "tmp")) or ".part" in p.name
        ]
        assert stray == [], f"kill at {delay:.2f} s"
        assert leftovers(dist) == [], f"kill at {delay:.2f} s"
    points.check()
