"""A disk that fills up at any point of a checkout: exit 11 and one line, never exit 1 ("please
report it") or exit 3 (a patch that "does not apply").

git says so in many ways, most without the errno ("could not set
'core.repositoryformatversion'", "sha1 file ... write error. Out of diskspace", "couldn't
write HEAD.lock", a ``git am`` that fails): the tree's folder is put on a small tmpfs filled
to a different number of free pages each time, so that the disk runs out at each step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import make_sdist, mount_tmpfs, release_files

CLI = [sys.executable, "-c", "from moe_patch.cli import main; main()"]


@pytest.fixture
def small_disk(tmp_path):
    yield mount_tmpfs(tmp_path / "small", "2m")
    subprocess.run(["umount", str(tmp_path / "small")], check=True)


def _leave_free(mountpoint, pages: int) -> None:
    for entry in mountpoint.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    free = shutil.disk_usage(mountpoint).free
    (mountpoint / "filler").write_bytes(b"\0" * max(0, free - pages * 4096))


def test_a_disk_filling_up_at_any_step_is_exit_11(
    fake_index, series_root, cache_dir, small_disk, tmp_path
):
    modules = {f"vllm/m{i}.py": "x = 1\n" * 50 for i in range(60)}  # ~100 pages checked out
    fake_index.add("1.0.0", make_sdist("1.0.0", {**release_files("1.0.0"), **modules}))
    warm = subprocess.run([*CLI, "apply", "--vllm", "1.0.0", "--into", str(tmp_path / "warm")])
    assert warm.returncode == 0
    env = dict(os.environ, TMPDIR=str(small_disk))
    seen = set()
    for pages in range(0, 132, 4):
        _leave_free(small_disk, pages)
        for args in (
            ["checkout", "--vllm", "1.0.0", str(small_disk / "c")],
            ["apply", "--vllm", "1.0.0", "--into", str(small_disk / "t")],
        ):
            result = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True)
            assert "Traceback" not in result.stderr
            assert result.returncode in (0, 11), (pages, args[0], result.stderr)
            if result.returncode == 11:
                assert len(result.stderr.strip().splitlines()) == 1, result.stderr
                assert "free space" in result.stderr
            seen.add(result.returncode)
            for made in ("c", "t"):
                shutil.rmtree(small_disk / made, ignore_errors=True)
    assert seen == {0, 11}  # the sweep reached both a full disk and one with room enough
