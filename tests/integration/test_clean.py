"""``moe-patch clean``: killed runs' leftovers, --all, entries in use, foreign files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import filelock
from click.testing import CliRunner
from moe_patch import cache
from moe_patch.cli import main
from support import tree_digest, write_files


def run(*args):
    return CliRunner().invoke(main, list(args))


def _cache_with_everything(root):
    """Entries and leftovers as moe-patch names them, and a user's own files beside them."""
    made = {
        "trees/v1.0.0.git/HEAD": "ref: refs/heads/main\n",
        "trees/.tmp-v1.0.0.git-ab12cd34/x": "half a tree",
        "sdist/.vllm-1.0.0.tar.gz.part-zz9": "half a download",
        "wheels/vllm-1.0.0-1-cp38-abi3-manylinux_2_24_x86_64.whl": "a wheel",
        "wheels/.tmp-vllm-1.0.0-q1w2e3/partial.whl": "half a wheel",
        "envs/oracle-0123abcd/bin/python": "#!",
        "tools/ruff-0.14.0/bin/ruff": "#!",
        "tools/.tmp-ruff-0.14.0-x7y8/bin/ruff": "#!",
        "index/vllm-5a06749b2297be54.json": "{}",
        "index/.vllm-5a06749b2297be54.json.part-k3": "{",
    }
    foreign = {"trees/notes.txt": "mine", "wheels/other-2.0-py3-none-any.whl": "mine"}
    write_files(root, {**made, **foreign})
    return foreign


def _names(root):
    """The cache's files but its lock files (bookkeeping that clean keeps: deleting a lock
    file another run waits on would let two runs hold "the same" lock)."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] != "locks"
    )


def test_clean_removes_leftovers_and_keeps_entries(cache_dir):
    _cache_with_everything(cache_dir)
    before = _names(cache_dir)
    dry = run("clean", "--dry-run", "--json")
    assert dry.exit_code == 0 and _names(cache_dir) == before
    result = run("clean", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["removed"] == json.loads(dry.stdout)["removed"]
    assert {item["what"] for item in report["removed"]} == {"leftover"}
    assert len(report["removed"]) == 5
    assert _names(cache_dir) == [
        "envs/oracle-0123abcd/bin/python",
        "index/vllm-5a06749b2297be54.json",
        "tools/ruff-0.14.0/bin/ruff",
        "trees/notes.txt",
        "trees/v1.0.0.git/HEAD",
        "wheels/other-2.0-py3-none-any.whl",
        "wheels/vllm-1.0.0-1-cp38-abi3-manylinux_2_24_x86_64.whl",
    ]
    assert run("clean").stdout == "nothing to clean\n"


def test_clean_all_empties_the_cache_but_never_touches_other_files(cache_dir):
    foreign = _cache_with_everything(cache_dir)
    outside = cache_dir.parent / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the cache's")
    (cache_dir / "trees" / "v2.0.0.git").symlink_to(outside)
    result = run("clean", "--all")
    assert result.exit_code == 0, result.output
    assert _names(cache_dir) == sorted(foreign)
    assert (outside / "keep.txt").read_text() == "not the cache's"  # a link is unlinked only
    assert result.stdout.splitlines()[-1].startswith("removed 11 item(s), ")


def test_an_entry_in_use_is_kept_and_the_exit_code_says_busy(cache_dir):
    _cache_with_everything(cache_dir)
    held = filelock.FileLock(str(cache.subdir("locks") / "vllm-1.0.0.lock"))
    with held:
        result = run("clean", "--all")
    assert result.exit_code == 6
    kept = [line for line in result.stdout.splitlines() if line.startswith("kept ")]
    assert len(kept) == 3  # the tree, its scratch folder and the half download
    assert (cache_dir / "trees" / "v1.0.0.git" / "HEAD").exists()
    assert not (cache_dir / "wheels").exists() or not any(
        p.name.startswith("vllm-") for p in (cache_dir / "wheels").iterdir()
    )


def test_clean_into_removes_scratch_of_dead_runs_only(cache_dir, tmp_path):
    into = tmp_path / "work" / "t"
    into.parent.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = into.parent / f".tmp-t-{int(dead.stdout)}-abc123"
    live = into.parent / f".tmp-t-{os.getpid()}-def456"
    other = into.parent / ".tmp-u-1-x"
    for folder in (stale, live, other):
        (folder / "vllm").mkdir(parents=True)
    before = tree_digest(live)
    result = run("clean", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert not stale.exists() and tree_digest(live) == before and other.exists()
    assert "scratch beside --into" in result.stdout
