"""The oracle environments' cache discipline, with the pip build replaced by a
stand-in that writes a fake environment (fast; no network)."""

from __future__ import annotations

import threading
import time

import pytest
import venvs


@pytest.fixture
def tree(tmp_path):
    path = tmp_path / "vllm-tree"
    (path / "requirements").mkdir(parents=True)
    (path / "requirements" / "common.txt").write_text("numpy\n")
    return path


class Calls(list):
    fake = None


@pytest.fixture
def builds(monkeypatch):
    calls = Calls()

    def fake_build(work, common, torch):
        calls.append(work)
        time.sleep(0.2)  # long enough for a concurrent caller to reach the lock
        (work / "bin").mkdir(exist_ok=True)
        (work / "bin" / "python").write_text("")
        if getattr(fake_build, "fail", False):
            raise RuntimeError("pip failed")
        return {"torch": "2.13.0+cpu"}

    monkeypatch.setattr(venvs, "_build", fake_build)
    calls.fake = fake_build
    return calls


def test_built_once_then_reused(cache_dir, tree, builds):
    first = venvs.oracle_env(tree)
    second = venvs.oracle_env(tree)
    assert len(builds) == 1
    assert first.built_seconds is not None and second.built_seconds is None
    assert first.path == second.path and first.path.parent == cache_dir / "envs"
    assert second.info["torch"] == "2.13.0+cpu"


def test_concurrent_callers_share_one_build(cache_dir, tree, builds):
    found = []
    threads = [threading.Thread(target=lambda: found.append(venvs.oracle_env(tree))) for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len({e.path for e in found}) == 1


def test_failed_build_leaves_nothing_trusted(cache_dir, tree, builds):
    builds.fake.fail = True
    with pytest.raises(RuntimeError):
        venvs.oracle_env(tree)
    assert [p.name for p in (cache_dir / "envs").iterdir()] == []
    builds.fake.fail = False
    assert venvs.oracle_env(tree).path.is_dir()


def test_leftovers_of_a_killed_build_are_removed(cache_dir, tree, builds):
    key = venvs.key(b"numpy\n", venvs.torch_requirement())
    envs = cache_dir / "envs"
    leftover = envs / f".tmp-oracle-{key}-killed"
    leftover.mkdir(parents=True)
    unfinished = envs / f"oracle-{key}"  # no marker: never finished, not trusted
    (unfinished / "bin").mkdir(parents=True)
    env = venvs.oracle_env(tree)
    assert not leftover.exists()
    assert (env.path / venvs.MARKER).is_file() and len(builds) == 1


def test_recipe_changes_make_a_new_environment(cache_dir, tree, builds, monkeypatch):
    first = venvs.oracle_env(tree).path
    monkeypatch.setenv("MOE_PATCH_ORACLE_TORCH", "/wheels/torch-2.14.0+cpu-cp311.whl")
    second = venvs.oracle_env(tree).path
    (tree / "requirements" / "common.txt").write_text("numpy\nregex\n")
    third = venvs.oracle_env(tree).path
    assert len({first, second, third}) == 3 and len(builds) == 3
