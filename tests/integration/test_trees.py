"""Downloading, verifying and caching release trees."""

import tarfile

import pytest
from moe_patch import cache, trees
from moe_patch.errors import IntegrityError, NetworkError
from support import make_sdist, tar_member, tree_digest


def test_release_repo_is_a_tagged_single_commit(fake_index):
    fake_index.add("1.0.0")
    repo = trees.release_repo("1.0.0")
    from support import git

    assert git(repo, "rev-list", "--count", "v1.0.0") == "1"
    files = git(repo, "ls-tree", "-r", "--name-only", "v1.0.0").splitlines()
    assert "vllm/_version.py" in files  # ignored by the tree's .gitignore, still committed
    assert not list((cache.root() / "sdist").iterdir())  # the sdist is not kept twice


def test_same_archive_same_commit(fake_index, tmp_path, monkeypatch):
    fake_index.add("1.0.0")
    first = trees.release_repo("1.0.0")
    from support import git

    commit = git(first, "rev-parse", "v1.0.0")
    monkeypatch.setenv("MOE_PATCH_CACHE", str(tmp_path / "other-cache"))
    assert git(trees.release_repo("1.0.0"), "rev-parse", "v1.0.0") == commit


def test_cache_is_reused_without_network(fake_index):
    fake_index.add("1.0.0")
    trees.release_repo("1.0.0")
    fake_index.mode = "error"
    seen = len(fake_index.requests)
    assert trees.release_repo("1.0.0").is_dir()
    assert len(fake_index.requests) == seen


def test_a_run_killed_after_publishing_leaves_nothing_behind(fake_index):
    """Killed between renaming the repository into place and its clean-up: the scratch
    folder and the sdist stay; the next run that finds the repository removes them,
    offline, and keeps another release's files."""
    fake_index.add("1.0.0")
    repo = trees.release_repo("1.0.0")
    scratch = repo.parent / f".tmp-{repo.name}-killed"
    (scratch / "src").mkdir(parents=True)
    (scratch / "src" / "setup.py").write_text("")
    sdists = cache.root() / "sdist"
    (sdists / "vllm-1.0.0.tar.gz").write_bytes(b"complete but never unlinked")
    (sdists / "vllm-1.0.0.post1.tar.gz").write_bytes(b"another release")
    fake_index.mode = "error"
    assert trees.release_repo("1.0.0") == repo
    assert sorted(p.name for p in repo.parent.iterdir()) == [repo.name]
    assert sorted(p.name for p in sdists.iterdir()) == ["vllm-1.0.0.post1.tar.gz"]


def test_hash_mismatch_leaves_nothing(fake_index):
    fake_index.add("1.0.0")
    fake_index.listed_hash["vllm-1.0.0.tar.gz"] = "0" * 64
    with pytest.raises(IntegrityError, match="does not match the index's sha256"):
        trees.release_repo("1.0.0")
    assert not list((cache.root() / "sdist").iterdir())
    assert not list((cache.root() / "trees").iterdir())


def test_interrupted_download_leaves_no_trusted_file(fake_index):
    fake_index.add("1.0.0")
    fake_index.mode = "truncate"
    with pytest.raises((NetworkError, IntegrityError)):
        trees.release_repo("1.0.0")
    assert not list((cache.root() / "sdist").iterdir())
    assert trees.cached_repo("1.0.0") is None
    fake_index.mode = "ok"
    assert trees.release_repo("1.0.0").is_dir()


@pytest.mark.parametrize(
    "member",
    [
        tar_member("vllm-1.0.0/../../escaped.txt"),
        tar_member("/tmp/absolute-escape.txt"),
        tar_member("vllm-1.0.0/link", tarfile.SYMTYPE, "/etc/passwd"),
        tar_member("vllm-1.0.0/uplink", tarfile.SYMTYPE, "../../.."),
    ],
    ids=["dotdot", "absolute", "symlink-absolute", "symlink-up"],
)
def test_hostile_archive_is_refused(fake_index, tmp_path, member):
    fake_index.add("1.0.0", make_sdist("1.0.0", extra_members=[member]))
    outside = tmp_path / "escaped.txt"
    with pytest.raises(IntegrityError, match="unsafe member"):
        trees.release_repo("1.0.0")
    assert not outside.exists()
    assert trees.cached_repo("1.0.0") is None
    assert not [p for p in (cache.root() / "trees").iterdir()]


def test_corrupt_archive(fake_index):
    fake_index.add("1.0.0", b"\x1f\x8b this is not gzip")
    with pytest.raises(IntegrityError, match="not a readable archive"):
        trees.release_repo("1.0.0")
    assert trees.cached_repo("1.0.0") is None


def test_concurrent_builds_share_one_entry(fake_index):
    import threading

    fake_index.add("1.0.0")
    results, errors = [], []

    def build():
        try:
            results.append(trees.release_repo("1.0.0"))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert fake_index.requests.count("/files/vllm-1.0.0.tar.gz") == 1
    assert sorted(p.name for p in (cache.root() / "trees").iterdir()) == ["v1.0.0.git"]
    assert tree_digest(results[0]) != "absent"
