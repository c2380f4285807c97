"""``moe-patch apply`` end to end on synthetic releases served by a fake index."""

import json
import os

from click.testing import CliRunner
from moe_patch.cli import main
from support import (
    JIT_EDIT,
    JIT_PROBE,
    KERNEL_MODULE,
    PATCH_AUTHOR,
    author_series,
    git,
    kernel_with_decorator,
    make_sdist,
    release_files,
    tree_digest,
    write_files,
)

KERNEL_PATH = "vllm/model_executor/layers/fused_moe/fused_moe.py"


def run(*args, cwd=None):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def apply_json(*args):
    result = run("apply", "--json", *args)
    return result, (json.loads(result.stdout) if result.stdout.strip().startswith("{") else None)


def test_apply_creates_one_commit_per_patch(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    into = tmp_path / "tree"
    result, report = apply_json("--vllm", "1.0", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert [(p["id"], p["status"]) for p in report["patches"]] == [
        ("jit", "applied"),
        ("extra", "applied"),
    ]
    assert git(into, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0"
    assert git(into, "log", "--format=%s", "v1.0.0..HEAD").splitlines() == ["extra", "jit"]
    assert git(into, "log", "-1", "--format=%an <%ae>", "HEAD") == PATCH_AUTHOR
    assert (
        '@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])'
        in (into / KERNEL_PATH).read_text()
    )
    assert git(into, "status", "--porcelain") == ""


def test_apply_twice_is_idempotent(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    into = tmp_path / "tree"
    _, first = apply_json("--vllm", "1.0.0", "--into", str(into))
    result, second = apply_json("--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 0
    assert first["unchanged"] is False and second["unchanged"] is True
    assert first["head"] == second["head"]
    assert [p["commit"] for p in first["patches"]] == [p["commit"] for p in second["patches"]]
    text = run("apply", "--vllm", "1.0.0", "--into", str(into)).stdout
    assert "unchanged (already applied)" in text


def test_same_inputs_same_commits_in_another_tree(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    _, first = apply_json("--vllm", "1.0.0", "--into", str(tmp_path / "a"))
    _, second = apply_json("--vllm", "1.0.0", "--into", str(tmp_path / "b"))
    assert first["head"] == second["head"]


def test_only_applies_the_named_patch(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    result, report = apply_json("--vllm", "1.0.0", "--into", str(tmp_path / "t"), "--only", "extra")
    assert result.exit_code == 0
    assert [p["id"] for p in report["patches"]] == ["extra"]
    result = run("apply", "--vllm", "1.0.0", "--into", str(tmp_path / "u"), "--only", "nope")
    assert result.exit_code == 2
    assert "no patch nope in the series" in result.stderr
    assert not (tmp_path / "u").exists()


def test_already_upstream_by_probe(fake_index, series_root, tmp_path):
    # Upstream marks the arguments differently (other order, extra argument):
    # reverse-applying our patch fails, the declared probe still finds the feature.
    upstream = kernel_with_decorator(
        '@triton.jit(do_not_specialize=["num_valid_tokens", "EM", "K"])'
    )
    fake_index.add("1.1.0", make_sdist("1.1.0", release_files("1.1.0", upstream)))
    result, report = apply_json("--vllm", "1.1.0", "--into", str(tmp_path / "t"))
    assert result.exit_code == 0, result.output
    jit = report["patches"][0]
    assert jit["status"] == "already upstream" and jit["detail"].startswith("probe: ")
    assert report["patches"][1]["status"] == "applied"


def test_already_upstream_by_reverse_apply(fake_index, tmp_path, monkeypatch):
    root = author_series(
        tmp_path / "p", "1.0.0", [{"id": "extra", "edit": {"vllm/extra.py": "FEATURE = True\n"}}]
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    files = release_files("1.2.0")
    files["vllm/extra.py"] = "FEATURE = True\n"
    fake_index.add("1.2.0", make_sdist("1.2.0", files))
    result, report = apply_json("--vllm", "1.2.0", "--into", str(tmp_path / "t"))
    assert result.exit_code == 0
    assert report["patches"][0]["status"] == "already upstream"
    assert "reverse-applies" in report["patches"][0]["detail"]


def test_moved_context_falls_back_to_three_way(fake_index, series_root, tmp_path):
    # 1.3.0 changed the lines right above the kernel: the patch's context no
    # longer matches, but a 3-way merge against its base 1.0.0 resolves it.
    fake_index.add("1.0.0")
    moved = KERNEL_MODULE.replace(
        "def helper():\n    return 1\n", "def helper():\n    return 2  # changed\n"
    )
    fake_index.add("1.3.0", make_sdist("1.3.0", release_files("1.3.0", moved)))
    result, report = apply_json("--vllm", "1.3.0", "--into", str(tmp_path / "t"))
    assert result.exit_code == 0, result.output
    assert report["patches"][0]["status"] == "applied (3-way)"
    text = (tmp_path / "t" / KERNEL_PATH).read_text()
    assert "return 2  # changed" in text and 'do_not_specialize=["EM", "num_valid_tokens"]' in text


def test_a_patch_merged_three_way_is_recognised_on_the_patched_tree(
    fake_index, tmp_path, monkeypatch
):
    # The release added lines just below where the patch inserts: the first run merges
    # it 3-way; on the patched tree neither the patch nor its reverse applies any more
    # (and a second merge conflicts), so only the commit the first run made shows that
    # the change is there.
    from moe_patch import applier, series

    base_text = "A = 1\n\nB = 2\n"
    root = author_series(
        tmp_path / "p",
        "1.0.0",
        [{"id": "insert", "edit": {"vllm/extra.py": "A = 1\nW = 0\n\nB = 2\n"}}],
        files={**release_files("1.0.0"), "vllm/extra.py": base_text},
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    fake_index.add(
        "1.0.0", make_sdist("1.0.0", {**release_files("1.0.0"), "vllm/extra.py": base_text})
    )
    files = release_files("1.3.0")
    files["vllm/extra.py"] = "A = 1\n\nif A:\n    U = 3\n\nB = 2\n"
    fake_index.add("1.3.0", make_sdist("1.3.0", files))
    into = tmp_path / "t"
    result, report = apply_json("--vllm", "1.3.0", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert report["patches"][0]["status"] == "applied (3-way)"
    patched = git(into, "rev-parse", "HEAD")

    again = applier.apply_series(into, patched, "1.3.0", series.for_version("1.3.0"))
    outcome = again.outcomes[0]
    assert outcome.status == "already upstream", outcome.detail
    assert f"commit {report['patches'][0]['commit'][:12]}" in outcome.detail
    assert git(into, "rev-parse", "HEAD") == patched
    assert git(into, "status", "--porcelain") == ""


def test_three_way_for_a_second_patch_to_the_same_file(fake_index, tmp_path, monkeypatch):
    # Both patches change the kernel file.  The second one's preimage is the file as
    # the first left it on 1.0.0, a blob no release contains.  On 1.3.0 the first
    # applies as it is (so no merge ever writes that blob) and the second, whose
    # context moved, needs a 3-way merge.
    jit_text = JIT_EDIT[KERNEL_PATH]
    body_text = jit_text.replace("        return\n", "        return  # nothing to do\n")
    root = author_series(
        tmp_path / "p",
        "1.0.0",
        [
            {"id": "jit", "edit": JIT_EDIT},
            {"id": "body", "edit": {KERNEL_PATH: body_text}},
        ],
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    fake_index.add("1.0.0")
    moved = KERNEL_MODULE.replace("):\n    pid", "):  # changed\n    pid")
    fake_index.add("1.3.0", make_sdist("1.3.0", release_files("1.3.0", moved)))
    result, report = apply_json("--vllm", "1.3.0", "--into", str(tmp_path / "t"))
    assert result.exit_code == 0, result.output
    assert [p["status"] for p in report["patches"]] == ["applied", "applied (3-way)"]
    text = (tmp_path / "t" / KERNEL_PATH).read_text()
    for line in ("):  # changed", "return  # nothing to do", "do_not_specialize"):
        assert line in text, line
    assert git(tmp_path / "t", "status", "--porcelain") == ""


def test_failing_patch_names_file_and_hunk(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    rewritten = "# nothing of the old kernel is left\n"
    fake_index.add("1.4.0", make_sdist("1.4.0", release_files("1.4.0", rewritten)))
    into = tmp_path / "t"
    result = run("apply", "--vllm", "1.4.0", "--into", str(into), "--json")
    assert result.exit_code == 3
    report = json.loads(result.stdout)
    jit, extra = report["patches"]
    assert jit["status"] == "failed"
    assert jit["detail"].startswith(f"{KERNEL_PATH}: hunk 1 @@ -")
    assert extra["status"] == "not attempted"
    assert "the tree is at the last good commit on moe-patch/v1.4.0" in result.stderr
    assert [line for line in result.stderr.splitlines() if "error" in line] == [
        f"moe-patch: error: patch jit failed ({jit['detail']}); the tree is at the last good commit "
        "on moe-patch/v1.4.0; refresh the patch for this release, or leave it out with --only"
    ]
    assert git(into, "rev-parse", "HEAD") == git(into, "rev-parse", "v1.4.0")
    assert git(into, "status", "--porcelain") == ""
    assert not (into / ".git" / "rebase-apply").exists()


def test_patch_escaping_the_tree_is_rejected_before_any_write(fake_index, tmp_path, monkeypatch):
    root = author_series(
        tmp_path / "p", "1.0.0", [{"id": "ok", "edit": {"vllm/extra.py": "x = 1\n"}}]
    )
    patch = root / "v1.0.0" / "ok.patch"
    patch.write_text(
        patch.read_text()
        .replace("a/vllm/extra.py", "a/../outside.py")
        .replace("b/vllm/extra.py", "b/../outside.py")
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    fake_index.add("1.0.0")
    into = tmp_path / "t"
    result = run("apply", "--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 5
    assert (
        result.stderr
        == "moe-patch: error: patch ok.patch touches '../outside.py', a path outside the tree; refused\n"
    )
    assert not into.exists() and not (tmp_path / "outside.py").exists()
    assert not [r for r in fake_index.requests if r.startswith("/files/")]  # nothing downloaded


def test_patch_through_a_symlink_in_the_tree_is_rejected(fake_index, tmp_path, monkeypatch):
    root = author_series(
        tmp_path / "p", "1.0.0", [{"id": "ok", "edit": {"vllm/linked/x.py": "x = 1\n"}}]
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    import tarfile

    link = tarfile.TarInfo("vllm-1.0.0/vllm/linked")
    link.type, link.linkname = tarfile.SYMTYPE, "../vllm"  # stays inside: the archive is fine
    fake_index.add("1.0.0", make_sdist("1.0.0", extra_members=[(link, None)]))
    into = tmp_path / "t"
    result = run("apply", "--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 5
    assert "a symbolic link in the tree" in result.stderr
    assert not into.exists()


def test_dirty_source_checkout_is_refused_and_untouched(fake_index, series_root, tmp_path):
    source = tmp_path / "src"
    write_files(source, release_files("1.0.0"))
    git(source, "init", "-q")
    git(source, "add", "-A", "-f")
    git(source, "commit", "-q", "-m", "v1.0.0")
    git(source, "tag", "v1.0.0")
    (source / "vllm" / "__init__.py").write_text("# local edit\n")
    before = tree_digest(source)
    for extra in ([], ["--in-place"]):
        into = [] if extra else ["--into", str(tmp_path / "t")]
        result = run("apply", "--vllm", "1.0.0", "--source", str(source), *into, *extra)
        assert result.exit_code == 7
        assert "has uncommitted changes; commit or stash them first" in result.stderr
        assert tree_digest(source) == before
    assert not (tmp_path / "t").exists()


def test_source_checkout_copied_and_in_place(fake_index, series_root, tmp_path):
    source = tmp_path / "src"
    write_files(source, release_files("1.0.0"))
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A", "-f")
    git(source, "commit", "-q", "-m", "v1.0.0")
    git(source, "tag", "v1.0.0")
    before = tree_digest(source)
    result, report = apply_json("--source", str(source), "--into", str(tmp_path / "copy"))
    assert result.exit_code == 0, result.output
    assert report["vllm"] == "1.0.0"  # read from the tree itself
    assert tree_digest(source) == before
    result, report = apply_json("--source", str(source), "--in-place")
    assert result.exit_code == 0
    assert git(source, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0"
    assert git(source, "rev-parse", "main") == report["base_commit"]


def test_unpacked_source_tree(fake_index, series_root, tmp_path):
    source = tmp_path / "unpacked"
    write_files(source, release_files("1.0.0"))
    before = tree_digest(source)
    result, report = apply_json(
        "--vllm", "1.0.0", "--source", str(source), "--into", str(tmp_path / "t")
    )
    assert result.exit_code == 0, result.output
    assert report["patches"][0]["status"] == "applied"
    assert tree_digest(source) == before


def test_source_of_another_version_is_refused(fake_index, series_root, tmp_path):
    source = tmp_path / "unpacked"
    write_files(source, release_files("1.1.0"))
    result = run("apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(tmp_path / "t"))
    assert result.exit_code == 2
    assert "is vLLM 1.1.0, not 1.0.0" in result.stderr


def test_source_that_is_not_vllm(fake_index, series_root, tmp_path):
    (tmp_path / "junk").mkdir()
    result = run(
        "apply",
        "--vllm",
        "1.0.0",
        "--source",
        str(tmp_path / "junk"),
        "--into",
        str(tmp_path / "t"),
    )
    assert result.exit_code == 2
    assert "is not a vLLM source tree" in result.stderr


def test_git_url_clones_the_release_tag(fake_index, series_root, tmp_path):
    from moe_patch import trees

    fake_index.add("1.0.0")
    remote = trees.release_repo("1.0.0")
    result, report = apply_json(
        "--vllm", "1.0.0", "--git", remote.as_uri(), "--into", str(tmp_path / "t")
    )
    assert result.exit_code == 0, result.output
    assert [p["status"] for p in report["patches"]] == ["applied", "applied"]
    bad = run(
        "apply",
        "--vllm",
        "1.0.0",
        "--git",
        (tmp_path / "none").as_uri(),
        "--into",
        str(tmp_path / "u"),
    )
    assert bad.exit_code == 4 and "cannot clone tag v1.0.0" in bad.stderr
    assert not (tmp_path / "u").exists()
    # A local path is cloned shallow too (git ignores --depth for plain paths).
    local, report = apply_json(
        "--vllm", "1.0.0", "--git", str(remote), "--into", str(tmp_path / "l")
    )
    assert local.exit_code == 0, local.output
    assert git(tmp_path / "l", "rev-parse", "--is-shallow-repository") == "true"
    # A remote without the release's tag is bad input, not a network failure.
    untagged = run(
        "apply", "--vllm", "1.1.0", "--git", remote.as_uri(), "--into", str(tmp_path / "w")
    )
    assert untagged.exit_code == 2, untagged.output
    assert f"{remote.as_uri()} has no tag v1.1.0; check --vllm" in untagged.stderr
    assert not (tmp_path / "w").exists()


def test_foreign_commits_on_the_branch_are_protected(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    into = tmp_path / "t"
    apply_json("--vllm", "1.0.0", "--into", str(into))
    (into / "mine.txt").write_text("my work\n")
    git(into, "add", "mine.txt")
    git(into, "commit", "-q", "-m", "my own work")
    head = git(into, "rev-parse", "HEAD")
    result = run("apply", "--vllm", "1.0.0", "--into", str(into))
    assert result.exit_code == 7 and "has commits moe-patch did not make" in result.stderr
    assert git(into, "rev-parse", "HEAD") == head


def test_unknown_version_from_index(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    fake_index.add("1.1.0")
    result = run("apply", "--vllm", "1.0.5", "--into", str(tmp_path / "t"))
    assert result.exit_code == 2
    assert result.stderr.startswith("moe-patch: error: unknown vLLM version 1.0.5")
    assert "nearest releases: 1.0.0, 1.1.0" in result.stderr
    assert not (tmp_path / "t").exists()


def test_version_older_than_every_base(fake_index, series_root, tmp_path):
    fake_index.add("0.9.0")
    result = run("apply", "--vllm", "0.9.0", "--into", str(tmp_path / "t"))
    assert result.exit_code == 2 and "no patch series serves vLLM 0.9.0" in result.stderr


def test_index_down_without_cache(fake_index, series_root, tmp_path):
    fake_index.mode = "error"
    result = run("apply", "--vllm", "1.0", "--into", str(tmp_path / "t"))
    assert result.exit_code == 4 and "answered HTTP 503" in result.stderr


def test_warm_cache_needs_no_network(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    apply_json("--vllm", "1.0.0", "--into", str(tmp_path / "a"))
    fake_index.mode = "error"
    seen = len(fake_index.requests)
    result, report = apply_json("--vllm", "1.0.0", "--into", str(tmp_path / "b"))
    assert result.exit_code == 0 and report["ok"]
    assert len(fake_index.requests) == seen


def test_list(series_root):
    result = run("list", "--json")
    rows = json.loads(result.stdout)
    assert [(r["base"], r["id"]) for r in rows] == [("1.0.0", "jit"), ("1.0.0", "extra")]
    assert rows[0]["probes"] == [JIT_PROBE.split(": ", 1)[1]]
    table = run("list").stdout
    assert "v1.0.0" in table and "jit" in table


def test_source_that_is_not_the_release_needs_any_base(fake_index, series_root, tmp_path):
    """A clone on a branch past the release (any real vLLM clone's main) is not 1.0.0: moe-patch
    says so instead of patching it under that name, unless --any-base says to."""
    source = tmp_path / "src"
    write_files(source, release_files("1.0.0"))
    (source / "PKG-INFO").unlink(missing_ok=True)
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A", "-f")
    git(source, "commit", "-q", "-m", "v1.0.0")
    git(source, "tag", "v1.0.0")
    (source / "NEWS").write_text("after the release\n")
    git(source, "add", "NEWS")
    git(source, "commit", "-q", "-m", "main moves on")
    head = git(source, "rev-parse", "--short=12", "HEAD")
    before = tree_digest(source)
    args = ["apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(tmp_path / "t")]
    refused = run(*args)
    assert refused.exit_code == 2
    assert refused.stderr == (
        f"moe-patch: error: --source {source} is not the vLLM 1.0.0 release: its HEAD ({head}) "
        "is not tagged v1.0.0; check out v1.0.0, or pass --any-base to patch it as 1.0.0 "
        "anyway\n"
    )
    assert not (tmp_path / "t").exists() and tree_digest(source) == before
    anyway = run(*args, "--any-base")
    assert anyway.exit_code == 0, anyway.output
    assert "--any-base: patching" in anyway.stderr and f"HEAD ({head})" in anyway.stderr
    assert tree_digest(source) == before
    assert run("apply", "--vllm", "1.0.0", "--any-base").exit_code == 2  # needs a --source


def test_untagged_source_holding_the_release_files_is_the_release(
    fake_index, series_root, tmp_path
):
    """A git repository made from the unpacked release (no tag; git leaves out the files its
    .gitignore names, such as the generated vllm/_version.py) is that release; one file
    changed, and it is not, naming the file."""
    fake_index.add("1.0.0")
    source = tmp_path / "src"
    write_files(source, release_files("1.0.0"))
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "imported from the sdist")
    assert "vllm/_version.py" not in git(source, "ls-files")
    into = tmp_path / "t"
    result = run("apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(into))
    assert result.exit_code == 0, result.output
    assert "is untagged but holds vLLM 1.0.0's files" in result.stderr

    (source / "vllm/__init__.py").write_text("CHANGED = True\n")
    git(source, "commit", "-q", "-am", "a local change")
    head = git(source, "rev-parse", "--short=12", "HEAD")
    again = run("apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(tmp_path / "u"))
    assert again.exit_code == 2
    assert again.stderr.startswith(
        f"moe-patch: error: --source {source} is not the vLLM 1.0.0 release: its HEAD ({head}) "
        "is not tagged v1.0.0 and its files differ from the release's: vllm/__init__.py;"
    )
    assert not (tmp_path / "u").exists()


def test_a_failing_patch_without_any_git_identity_leaves_no_am_behind(
    fake_index, series_root, tmp_path, monkeypatch
):
    """With no identity git can use (none configured, and useConfigOnly so that git guesses
    none from the host), the failed patch's `git am --abort` still runs: the identity moe-patch
    commits with is passed to it too."""
    fake_index.add("1.0.0")
    rewritten = "# nothing of the old kernel is left\n"
    fake_index.add("1.4.0", make_sdist("1.4.0", release_files("1.4.0", rewritten)))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "user.useConfigOnly")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "true")
    for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("EMAIL", raising=False)
    into = tmp_path / "t"
    result = run("apply", "--vllm", "1.4.0", "--into", str(into))
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    assert not (into / ".git" / "rebase-apply").exists()
    again = run("apply", "--vllm", "1.4.0", "--into", str(into))
    assert again.exit_code == 3 and "middle of a git" not in again.stderr
