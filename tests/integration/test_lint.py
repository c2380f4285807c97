"""Which ruff checks a tree: the version its pre-commit configuration pins, installed once
into the cache through pip; else the installed one, labelled as such."""

import base64
import csv
import hashlib
import io
import os
import stat
import zipfile
from pathlib import Path

import pytest
from moe_patch import lint
from moe_patch.errors import UsageError

PINNED = """\
repos:
- repo: https://github.com/google/yapf
  rev: v0.40.2
  hooks:
  - id: yapf
- repo: https://github.com/astral-sh/ruff-pre-commit
  # a comment between the entry and its rev
  rev: {rev}
  hooks:
  - id: ruff-check
- repo: https://github.com/crate-ci/typos
  rev: v1.43.5
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PINNED.format(rev="v0.14.0"), "0.14.0"),
        (PINNED.format(rev="'v0.6.5'"), "0.6.5"),
        (PINNED.format(rev='"0.1.9"'), "0.1.9"),
        # pinned to a commit, the tag in pre-commit's "frozen" comment (vLLM 0.34.0)
        (
            PINNED.format(rev="f368fb366ff7f2f808dd324b83a6d32267799e19  # frozen: v0.17.2"),
            "0.17.2",
        ),
        (PINNED.format(rev="1234567890123456789012345678901234567890  # frozen: v0.9.1"), "0.9.1"),
        ("repos:\n- repo: https://github.com/crate-ci/typos\n  rev: v1.43.5\n", None),
        # ruff's entry without a rev of its own: the next entry's rev is not ruff's
        (
            "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  hooks: []\n"
            "- repo: https://github.com/crate-ci/typos\n  rev: v1.43.5\n",
            None,
        ),
    ],
)
def test_pinned_version(tmp_path, text, expected):
    (tmp_path / ".pre-commit-config.yaml").write_text(text)
    assert lint.pinned_version(tmp_path) == expected


def test_no_pre_commit_config_pins_nothing(tmp_path):
    assert lint.pinned_version(tmp_path) is None


def _fake_ruff_wheel(folder: Path, version: str) -> None:
    """A wheel named ruff whose script prints ``ruff VERSION``, in a folder pip reads as a
    simple index (``<index>/ruff/index.html``)."""
    script = f"#!/bin/sh\necho 'ruff {version}'\n".encode()
    info = f"ruff-{version}.dist-info"
    members = {
        f"ruff-{version}.data/scripts/ruff": script,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: ruff\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    members[f"{info}/RECORD"] = record.getvalue().encode()
    project = folder / "ruff"
    project.mkdir(parents=True, exist_ok=True)
    filename = f"ruff-{version}-py3-none-any.whl"
    with zipfile.ZipFile(project / filename, "w") as wheel:
        for name, data in members.items():
            member = zipfile.ZipInfo(name)
            member.external_attr = (0o755 | stat.S_IFREG) << 16
            wheel.writestr(member, data)
    (project / "index.html").write_text(f'<html><body><a href="{filename}">{filename}</a>')


@pytest.fixture
def tree(tmp_path):
    path = tmp_path / "tree"
    path.mkdir()
    (path / ".pre-commit-config.yaml").write_text(PINNED.format(rev="v0.0.7"))
    return path


def test_the_pinned_version_is_installed_once_into_the_cache(cache_dir, tmp_path, tree):
    index = tmp_path / "index"
    _fake_ruff_wheel(index, "0.0.7")
    ruff = lint.ruff_for(tree, index.as_uri())
    assert (ruff.version, ruff.origin) == ("0.0.7", "the version .pre-commit-config.yaml pins")
    assert Path(ruff.path).is_relative_to(cache_dir)
    assert lint.run(ruff, tree, "--version").stdout == "ruff 0.0.7\n"
    tools = cache_dir / "tools"
    assert sorted(p.name for p in tools.iterdir()) == ["ruff-0.0.7"]  # no scratch left
    (index / "ruff").rename(tmp_path / "gone")  # the index is not asked again
    assert lint.ruff_for(tree, index.as_uri()) == ruff


def test_an_uninstallable_pin_falls_back_to_the_installed_ruff_and_says_why(
    cache_dir, tmp_path, tree
):
    empty = tmp_path / "empty-index"
    empty.mkdir()
    ruff = lint.ruff_for(tree, empty.as_uri())
    assert ruff is not None and ruff.version != "0.0.7"
    assert ruff.origin.startswith("installed; .pre-commit-config.yaml pins 0.0.7, which could not")
    assert lint.describe(ruff).startswith(f"ruff {ruff.version} (installed;")
    assert [p.name for p in (cache_dir / "tools").iterdir()] == []  # nothing half-installed


def test_moe_patch_ruff_picks_the_binary(monkeypatch, tree, tmp_path):
    mine = tmp_path / "my-ruff"
    mine.write_text("#!/bin/sh\n")
    mine.chmod(0o755)
    monkeypatch.setenv("MOE_PATCH_RUFF", str(mine))
    assert lint.ruff_for(tree) == lint.Ruff(str(mine), None, "MOE_PATCH_RUFF")
    monkeypatch.setenv("MOE_PATCH_RUFF", "/nowhere/no-such-ruff")
    with pytest.raises(UsageError, match="MOE_PATCH_RUFF='/nowhere/no-such-ruff' is not a program"):
        lint.ruff_for(tree)


def test_a_tree_without_a_pin_uses_the_installed_ruff(cache_dir, tmp_path):
    ruff = lint.ruff_for(tmp_path)
    assert ruff.origin == "installed; the tree pins no version"
    assert os.access(ruff.path, os.X_OK)
