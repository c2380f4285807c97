"""Concurrent runs: one cache shared by two applies, one target wanted by two, a lock held
past its timeout.  (SIGKILL at many points of each command: test_kill_points.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import git

CLI = [sys.executable, "-c", "from moe_patch.cli import main; main()"]


def cli(*args, env=None, check=True):
    result = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


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
