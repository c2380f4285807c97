"""A cached release is checked where it is read: a damaged one is rebuilt, never cloned."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from moe_patch import trees
from moe_patch.cli import main
from support import git


def _apply(into):
    return CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(into)])


def _overwrite(path, at: int, count: int = 21) -> None:
    """``count`` bytes of ``path`` overwritten in place, as a failing disk or a stray write
    does it (the cache's packs are read-only: made writable first)."""
    path.chmod(0o644)
    with open(path, "r+b") as handle:
        handle.seek(at)
        old = handle.read(count)
        handle.seek(at)
        handle.write(bytes(b ^ 0x5A for b in old))


@pytest.mark.parametrize("where", ["start", "middle", "last-object", "trailer"])
def test_a_pack_with_21_bytes_overwritten_is_rebuilt(
    cache_dir, fake_index, series_root, tmp_path, where
):
    fake_index.add("1.0.0")
    assert _apply(tmp_path / "a").exit_code == 0
    repo = cache_dir / "trees" / "v1.0.0.git"
    (pack,) = (repo / "objects" / "pack").glob("*.pack")
    size = pack.stat().st_size
    at = {"start": 12, "middle": size // 2, "last-object": size - 42, "trailer": size - 21}[where]
    _overwrite(pack, at)

    result = _apply(tmp_path / "b")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(
        f"moe-patch: warning: the cached vLLM 1.0.0 repository was damaged (objects/pack/"
        f"{pack.name} changed since it was cached); building it again\n"
    )
    assert git(tmp_path / "b", "status", "--porcelain") == ""
    assert git(tmp_path / "b", "rev-parse", "HEAD") == git(tmp_path / "a", "rev-parse", "HEAD")
    git(repo, "fsck", "--strict")  # the rebuilt entry
    again = _apply(tmp_path / "c")
    assert again.exit_code == 0 and "damaged" not in again.stderr


def test_a_cached_release_without_checksums_is_checked_once(
    cache_dir, fake_index, series_root, tmp_path
):
    """An entry cached by an earlier moe-patch has no checksum list: git fsck checks it once,
    and the list is written; a damaged one is rebuilt."""
    fake_index.add("1.0.0")
    assert _apply(tmp_path / "a").exit_code == 0
    repo = cache_dir / "trees" / "v1.0.0.git"
    listed = json.loads((repo / trees.CHECKSUMS).read_text())
    (repo / trees.CHECKSUMS).unlink()
    assert _apply(tmp_path / "b").exit_code == 0
    assert json.loads((repo / trees.CHECKSUMS).read_text()) == listed

    (repo / trees.CHECKSUMS).unlink()
    (pack,) = (repo / "objects" / "pack").glob("*.pack")
    _overwrite(pack, pack.stat().st_size - 42)
    result = _apply(tmp_path / "c")
    assert result.exit_code == 0, result.output
    assert "repository was damaged" in result.stderr and "building it again" in result.stderr
    assert git(tmp_path / "c", "status", "--porcelain") == ""
