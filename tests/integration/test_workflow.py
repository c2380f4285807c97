"""``moe-patch checkout`` / ``export``: the series as commits, and back, deterministically."""

import json

from click.testing import CliRunner
from moe_patch import workflow
from moe_patch.cli import main
from support import PATCH_AUTHOR, git, tree_digest

TRAILERS = f"\n\nWhy.\n\nUpstream-Status: Pending\nSigned-off-by: {PATCH_AUTHOR}\n"


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def checkout(fake_index, tmp_path, version="1.0.0"):
    fake_index.add("1.0.0")
    work = tmp_path / "work"
    result = run("checkout", "--vllm", version, str(work))
    assert result.exit_code == 0, result.output
    return work


def export_json(*args):
    result = run("export", "--json", *args)
    return result, json.loads(result.stdout)


def changes(report):
    return {c["patch"]: c["change"] for c in report["changes"]}


def test_checkout_then_export_reproduces_the_series(fake_index, series_root, tmp_path):
    before = tree_digest(series_root)
    work = checkout(fake_index, tmp_path)
    assert git(work, "log", "--format=%s", "v1.0.0..HEAD").splitlines() == ["extra", "jit"]
    assert git(work, "log", "-1", "--format=%(trailers:key=Patch-Filename,valueonly)") == (
        "extra.patch"
    )
    assert git(work, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0"
    result, report = export_json(str(work))
    assert result.exit_code == 0
    assert changes(report) == {"jit.patch": "unchanged", "extra.patch": "unchanged"}
    assert not report["written"] and tree_digest(series_root) == before
    assert run("export", str(work), "--check").exit_code == 0


def test_edit_amend_and_export(fake_index, series_root, tmp_path):
    work = checkout(fake_index, tmp_path)
    (work / "vllm" / "extra.py").write_text("FEATURE = False\n")
    git(work, "commit", "-q", "-a", "--amend", "--no-edit")
    stale = run("export", str(work), "--check")
    assert stale.exit_code == 10 and "is not what the commits export to" in stale.stderr
    result, report = export_json(str(work))
    assert result.exit_code == 0 and report["written"]
    assert changes(report) == {"jit.patch": "unchanged", "extra.patch": "updated"}
    text = (series_root / "v1.0.0" / "extra.patch").read_text()
    assert "+FEATURE = False" in text and "Patch-Filename" not in text
    assert text.startswith("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001")
    first = tree_digest(series_root)
    _, again = export_json(str(work))  # no churn: the same commits export to the same bytes
    assert not again["written"] and tree_digest(series_root) == first
    assert run("export", str(work), "--check").exit_code == 0


def test_new_reworded_and_dropped_commits(fake_index, series_root, tmp_path):
    work = checkout(fake_index, tmp_path)
    # reword jit's subject: its Patch-Filename keeps the file name
    git(work, "rebase", "-q", "--exec", "true", "v1.0.0")  # no-op, proves plain git is fine
    message = workflow.commit_message(work, "HEAD~1").replace("jit", "jit, reworded", 1)
    git(work, "checkout", "-q", "HEAD~1")
    (tmp_path / "msg").write_text(message)
    git(work, "commit", "-q", "--amend", "-F", str(tmp_path / "msg"))
    git(work, "cherry-pick", "moe-patch/v1.0.0")
    git(work, "branch", "-f", "moe-patch/v1.0.0")
    git(work, "checkout", "-q", "moe-patch/v1.0.0")
    # a new patch, named after its subject
    (work / "vllm" / "more.py").write_text("MORE = 1\n")
    git(work, "add", "vllm/more.py")
    git(work, "commit", "-q", "-m", "Add: more things!\n\nWhy.\n\nUpstream-Status: Pending\n")
    result, report = export_json(str(work))
    assert changes(report) == {
        "jit.patch": "updated",
        "extra.patch": "unchanged",
        "add-more-things.patch": "added",
    }
    assert report["problems"] == ["add-more-things.patch: no Signed-off-by trailer"]
    assert "add-more-things.patch: no Signed-off-by trailer (verify will fail" in result.stderr
    git(work, "commit", "-q", "--amend", "-m", "Add: more things!" + TRAILERS)
    result, report = export_json(str(work))
    assert result.exit_code == 0, result.output
    assert report["problems"] == []
    assert changes(report) == {
        "jit.patch": "unchanged",  # the first export above wrote the reworded jit.patch
        "extra.patch": "unchanged",
        "add-more-things.patch": "updated",
    }
    directory = series_root / "v1.0.0"
    assert (directory / "series").read_text() == "jit.patch\nextra.patch\nadd-more-things.patch\n"
    assert "Subject: jit, reworded" in (directory / "jit.patch").read_text()
    # drop extra
    git(work, "rebase", "-q", "--onto", "HEAD~2", "HEAD~1")
    result, report = export_json(str(work))
    assert changes(report)["extra.patch"] == "removed"
    assert not (directory / "extra.patch").exists()
    assert (directory / "series").read_text() == "jit.patch\nadd-more-things.patch\n"
    verify = run("verify", "--vllm", "1.0.0")
    assert verify.exit_code == 0, verify.output


def test_refusals(fake_index, series_root, tmp_path):
    work = checkout(fake_index, tmp_path)
    (work / "vllm" / "extra.py").write_text("dirty\n")
    result = run("export", str(work))
    assert result.exit_code == 7 and "has uncommitted changes" in result.stderr
    git(work, "checkout", "-q", "--", "vllm/extra.py")
    git(work, "commit", "-q", "--allow-empty", "-m", "nothing")
    result = run("export", str(work))
    assert result.exit_code == 7 and "changes nothing; drop it" in result.stderr
    plain = tmp_path / "plain"
    assert run("apply", "--vllm", "1.0.0", "--into", str(plain)).exit_code == 0
    result = run("export", str(plain))
    assert result.exit_code == 2 and "was not made by moe-patch checkout or rebase" in result.stderr
    again = run("checkout", "--vllm", "1.0.0", str(work))
    assert again.exit_code == 2 and "is not empty" in again.stderr


def test_checkout_of_a_later_release_uses_its_base(fake_index, series_root, tmp_path):
    fake_index.add("1.1.0")
    work = checkout(fake_index, tmp_path, version="1.1.0")
    assert git(work, "describe", "--tags", "HEAD~2") == "v1.0.0"


def test_trailer_helpers_round_trip():
    message = "Subject\n\nBody.\n\nUpstream-Status: Pending\nSigned-off-by: A <a@b>\n"
    marked = workflow.add_trailer(message, "Patch-Filename", "x.patch")
    assert marked.endswith("Signed-off-by: A <a@b>\nPatch-Filename: x.patch\n")
    assert workflow.split_name_trailer(marked) == (message, "x.patch")
    bare = "Subject only\n"
    assert workflow.split_name_trailer(workflow.add_trailer(bare, "Patch-Filename", "y.patch")) == (
        bare,
        "y.patch",
    )
    assert workflow.slug("fused_moe: Do *not* specialise!") == "fused_moe-do-not-specialise"


JANE = "Jane Dev <jane.dev@users.noreply.github.com>"


def _headers(path):
    text = path.read_text()
    message = text.split("\ndiff --git ", 1)[0]
    return message, text[len(message) :]


def _amend_extra(work):
    """Touch the extra patch (its commit keeps the placeholder author)."""
    (work / "vllm" / "extra.py").write_text("FEATURE = False\n")
    git(work, "commit", "-q", "-a", "--amend", "--no-edit")


def test_export_writes_touched_placeholder_patches_under_the_series_author(
    fake_index, series_root, tmp_path, monkeypatch
):
    work = checkout(fake_index, tmp_path)
    _amend_extra(work)
    real = "Real Person <real.person@vllm.ai>"
    (work / "vllm" / "more.py").write_text("MORE = 1\n")
    git(work, "add", "vllm/more.py")
    git(work, "commit", "-q", "--author", real, "-m", f"more{TRAILERS}".replace(PATCH_AUTHOR, real))
    jit = (series_root / "v1.0.0" / "jit.patch").read_bytes()

    result, report = export_json("--author", JANE, str(work))
    assert result.exit_code == 0, result.output
    assert changes(report) == {
        "jit.patch": "unchanged",  # not touched: its bytes stay, placeholder and all
        "extra.patch": "updated",
        "more.patch": "added",
    }
    assert (series_root / "v1.0.0" / "jit.patch").read_bytes() == jit
    message, diff = _headers(series_root / "v1.0.0" / "extra.patch")
    assert "+FEATURE = False" in diff
    assert "From: Jane Dev <jane.dev@users.noreply.github.com>" in message
    assert message.count("Signed-off-by:") == 1 and f"Signed-off-by: {JANE}" in message
    assert "example.invalid" not in message
    more, _ = _headers(series_root / "v1.0.0" / "more.patch")
    assert f"From: {real}" in more and f"Signed-off-by: {real}" in more and "Jane" not in more
    assert "placeholder" not in result.stderr
    # The same identity again: nothing changes (the export is deterministic).
    _, again = export_json("--author", JANE, str(work))
    assert set(changes(again).values()) == {"unchanged"} and not again["written"]
    assert run("export", "--check", "--author", JANE, str(work)).exit_code == 0
    # Without one, the touched commit's placeholder identity is what it exports to, and it
    # says so (the untouched jit.patch is no news).
    monkeypatch.setenv("MOE_PATCH_AUTHOR", "")
    stale = run("export", "--check", str(work))
    assert stale.exit_code == 10
    assert "1 patch(es) keep the placeholder identity Test Author <author@example.invalid>" in (
        stale.stderr
    )


def test_series_author_from_the_environment_or_git_config(
    fake_index, series_root, tmp_path, monkeypatch
):
    work = checkout(fake_index, tmp_path)
    monkeypatch.setenv("MOE_PATCH_AUTHOR", JANE)
    result, report = export_json("--check", str(work))
    assert result.exit_code == 0 and set(changes(report).values()) == {"unchanged"}
    _amend_extra(work)
    _, report = export_json("--check", str(work))
    assert changes(report) == {"jit.patch": "unchanged", "extra.patch": "updated"}
    monkeypatch.delenv("MOE_PATCH_AUTHOR")
    git(work, "config", "user.name", "Git Configured")
    git(work, "config", "user.email", "git.configured@vllm.ai")
    run("export", str(work))
    message, _ = _headers(series_root / "v1.0.0" / "extra.patch")
    assert "From: Git Configured <git.configured@vllm.ai>" in message
    message, _ = _headers(series_root / "v1.0.0" / "jit.patch")
    assert "Git Configured" not in message
    git(work, "config", "user.email", "someone@example.com")  # a placeholder is no default
    assert workflow.identity.series_identity(work) is None


def test_a_bad_author_is_refused_in_one_line(fake_index, series_root, tmp_path):
    work = checkout(fake_index, tmp_path)
    before = tree_digest(series_root)
    for given, words in (
        ("Jane", "is not of the form 'Name <email>'; give one like that"),
        ("Jane <jane@example.com>", "is a placeholder address; give a real one"),
    ):
        result = CliRunner().invoke(main, ["export", "--author", given, str(work)])
        assert result.exit_code == 2
        assert result.stderr.strip().splitlines() == [
            f"moe-patch: error: --author {given!r} {words}"
        ]
    assert tree_digest(series_root) == before


def test_restamp_replaces_placeholder_sign_offs_once():
    message = (
        "Subject\n\nWhy.\n\nUpstream-Status: Pending\n"
        "Signed-off-by: A <a@example.invalid>\nSigned-off-by: B <b@x.test>\n"
        "Signed-off-by: Real <real@vllm.ai>\n"
    )
    assert workflow.identity.restamp(message, ("Jane", "jane@vllm.ai")) == (
        "Subject\n\nWhy.\n\nUpstream-Status: Pending\n"
        "Signed-off-by: Jane <jane@vllm.ai>\nSigned-off-by: Real <real@vllm.ai>\n"
    )
