"""Released versions of the series: the record ``moe-patch release`` writes, the
``release-version`` check ``verify`` runs on it, and the version named by what the series
makes (wheels, result files, bundles)."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import __version__, releases
from moe_patch.cli import main
from moe_patch.errors import StateError, UsageError
from support import git

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(main, list(args))


def change_a_patch(root: Path) -> None:
    patch = next(root.glob("v*/*.patch"))
    patch.write_text(patch.read_text().replace("\nWhy", "\nWhy ever", 1))


def test_content_is_every_series_patch_and_upstream_file_and_nothing_else(series_root):
    (series_root / "upstream" / "tests").mkdir(parents=True)
    (series_root / "upstream" / "tests" / "test_x.py").write_text("def test(): pass\n")
    (series_root / "README.md").write_text("# notes\n")
    (series_root / "v1.0.0" / "gpu-runs.json").write_text('{"runs": []}\n')
    assert sorted(releases.content(series_root)) == [
        "upstream/tests/test_x.py",
        "v1.0.0/extra.patch",
        "v1.0.0/jit.patch",
        "v1.0.0/series",
    ]


def test_the_check_passes_as_released_and_fails_when_a_patch_moved_without_the_version(
    series_root,
):
    assert releases.compare(series_root, "1.0.0").status == "skip"
    releases.record(series_root, "1.0.0")
    assert json.loads((series_root / "releases" / "1.0.0.json").read_text())["version"] == "1.0.0"
    assert releases.compare(series_root, "1.0.0") == releases.Comparison(
        "pass", "as released in 1.0.0"
    )
    change_a_patch(series_root)
    failed = releases.compare(series_root, "1.0.0")
    assert failed.status == "fail"
    assert "differs from release 1.0.0 (v1.0.0/" in failed.detail
    assert "move __version__" in failed.detail
    moved = releases.compare(series_root, "1.1.0")
    assert moved.status == "pass" and moved.detail.startswith("1.1.0 (not released yet)")
    older = releases.compare(series_root, "0.9.0")
    assert older.status == "fail" and "older than the series' last release 1.0.0" in older.detail


def test_a_record_is_rewritten_until_its_tag_exists_then_it_is_final(series_root, tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    git(checkout, "init", "-q")
    releases.record(series_root, "1.0.0", checkout=checkout)
    change_a_patch(series_root)
    releases.record(series_root, "1.0.0", checkout=checkout)  # not tagged: rewritten
    assert releases.compare(series_root, "1.0.0").status == "pass"
    (checkout / "f").write_text("x\n")
    git(checkout, "add", "f")
    git(checkout, "-c", "user.name=x", "-c", "user.email=x@example.invalid", "commit", "-qm", "x")
    git(checkout, "tag", "v1.0.0")
    change_a_patch(series_root)
    with pytest.raises(StateError, match="release 1.0.0 is tagged"):
        releases.record(series_root, "1.0.0", checkout=checkout)
    releases.record(series_root, "1.0.1", checkout=checkout)
    with pytest.raises(UsageError, match="release 1.0.1 is recorded already; 1.0.0 is older"):
        releases.record(series_root, "1.0.0", checkout=checkout)


def test_a_damaged_or_misnamed_record_is_one_line_error(series_root):
    (series_root / "releases").mkdir()
    (series_root / "releases" / "1.0.0.json").write_text("{not json")
    with pytest.raises(UsageError, match="is not a release record"):
        releases.compare(series_root, "1.0.0")
    (series_root / "releases" / "1.0.0.json").write_text('{"version": "2.0.0", "files": {}}')
    with pytest.raises(UsageError, match="its name must be 2.0.0.json"):
        releases.compare(series_root, "1.0.0")


def test_release_command_needs_the_changelog_section_then_prints_the_tag(
    series_root, tmp_path, monkeypatch
):
    checkout = tmp_path / "project"
    shutil.copytree(series_root, checkout / "patches")
    (checkout / "pyproject.toml").write_text('[project]\nname = "moe-patch"\n')
    (checkout / "patches" / "README.md").write_text("# the series\n")
    (checkout / "CHANGELOG.md").write_text("# Changelog\n\n## [Unreleased]\n")
    monkeypatch.delenv("MOE_PATCH_SERIES")
    monkeypatch.chdir(checkout)
    refused = run("release")
    assert refused.exit_code == 2
    assert f"CHANGELOG.md has no '## [{__version__}] - YYYY-MM-DD' section" in refused.stderr
    assert not (checkout / "patches" / "releases").exists()
    (checkout / "CHANGELOG.md").write_text(
        f"# Changelog\n\n## [Unreleased]\n\n## [{__version__}] - 2026-12-06\n\n- first\n"
    )
    done = run("release")
    assert done.exit_code == 0, done.output
    assert (checkout / "patches" / "releases" / f"{__version__}.json").is_file()
    assert f"git tag -a v{__version__} -m 'moe-patch {__version__}'" in done.stdout
    assert run("release", "--check").exit_code == 0
    change_a_patch(checkout / "patches")
    checked = run("release", "--check")
    assert checked.exit_code == 8 and "release-version fail" in checked.stdout


def test_verify_fails_when_the_series_moved_and_the_version_did_not(fake_index, series_root):
    fake_index.add("1.0.0")
    releases.record(series_root, __version__)
    change_a_patch(series_root)
    result = run("verify", "--vllm", "1.0.0", "--json", "--jobs", "1")
    report = json.loads(result.stdout)
    assert result.exit_code == 8 and not report["ok"]
    assert report["release"]["name"] == "release-version"
    assert report["release"]["status"] == "fail"
    assert "series release-version" in result.stderr


def test_the_shipped_series_is_its_last_release_or_the_version_has_moved():
    """The check verify runs, on this checkout: a patch changed after a release must come
    with a new version (docs/releasing.md); run `moe-patch release` to record it."""
    checked = releases.compare(ROOT / "patches", __version__)
    assert checked.status == "pass", checked.detail
    assert releases.records(ROOT / "patches"), "no release recorded under patches/releases/"


def test_the_version_is_named_by_what_the_series_makes(series_root, tmp_path):
    from moe_patch import wheel

    assert wheel.local_label() == "moe." + __version__
    pinned = tmp_path / "pinned"
    (pinned / "tooling" / "moe_patch").mkdir(parents=True)
    (pinned / "tooling" / "moe_patch" / "__init__.py").write_text('__version__ = "9.8.7"\n')
    assert releases.series_version(pinned / "patches") == "9.8.7"
    assert releases.series_version(series_root) == __version__  # no checkout around it
    assert releases.series_commit(series_root) == "unknown"  # not in a git checkout
    assert releases.series_commit(ROOT / "patches").rstrip("+") == git(
        ROOT, "rev-parse", "--short", "HEAD"
    )
