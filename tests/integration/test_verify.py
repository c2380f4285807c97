"""``moe-patch verify`` on synthetic releases served by a fake index."""

import json
import textwrap

from click.testing import CliRunner
from moe_patch.cli import main
from support import (
    KERNEL_MODULE,
    PATCH_AUTHOR,
    author_series,
    make_sdist,
    release_files,
    write_files,
)

RUFF_CONFIG = '[tool.ruff]\nline-length = 88\n\n[tool.ruff.lint]\nselect = ["E", "F"]\n'


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def verify_json(*args):
    result = run("verify", "--json", *args)
    return result, json.loads(result.stdout)


def checks(report, where):
    if where.startswith("v"):
        entry = next(s for s in report["series"] if f"v{s['base']}" == where)
    else:
        entry = next(r for r in report["releases"] if r["version"] == where)
    return {c["name"]: (c["status"], c["detail"]) for c in entry["checks"]}


def test_every_check_passes_on_every_supported_release(fake_index, series_root):
    fake_index.add("0.9.0")  # older than every base: not supported
    fake_index.add("1.0.0")
    moved = KERNEL_MODULE.replace("    return 1\n", "    return 2  # changed\n")
    fake_index.add("1.1.0", make_sdist("1.1.0", release_files("1.1.0", moved)))
    assert json.loads(run("verify", "--list").stdout) == ["1.0.0", "1.1.0"]
    result, report = verify_json()
    assert result.exit_code == 0, result.output
    assert report["ok"] and [r["version"] for r in report["releases"]] == ["1.0.0", "1.1.0"]
    assert set(checks(report, "v1.0.0")) == {"series-integrity", "exported-form"}
    assert set(checks(report, "1.1.0")) == {"apply", "compile", "ruff-check", "ruff-format"}
    assert all(s == "pass" for s, _ in checks(report, "1.1.0").values())
    statuses = {p["id"]: p["status"] for p in report["releases"][1]["patches"]}
    assert statuses == {"jit": "applied (3-way)", "extra": "applied"}
    table = run("verify").stdout
    for word in ("series-integrity", "exported-form", "ruff-format", "jit: applied (3-way)"):
        assert word in table
    assert "0 failed" in table


def test_one_release_checks_its_series_base_too(fake_index, series_root):
    fake_index.add("1.0.0")
    fake_index.add("1.1.0")
    result, report = verify_json("--vllm", "1.1")
    assert result.exit_code == 0, result.output
    assert [r["version"] for r in report["releases"]] == ["1.1.0"]
    assert checks(report, "v1.0.0")["exported-form"][0] == "pass"


def test_series_integrity_problems_are_named(fake_index, tmp_path, monkeypatch):
    root = author_series(
        tmp_path / "p",
        "1.0.0",
        [
            {
                "id": "nosob",
                "edit": {"vllm/a.py": "A = 1\n"},
                "trailers": ["Upstream-Status: Pending"],
            },
            {
                "id": "badstatus",
                "edit": {"vllm/b.py": "B = 1\n"},
                "trailers": ["Upstream-Status: Maybe", f"Signed-off-by: {PATCH_AUTHOR}"],
            },
            {
                "id": "notest",
                "edit": {"vllm/c.py": "C = 1\n"},
                "trailers": [
                    "Upstream-Status: Pending",
                    "Upstream-Test: tests/kernels/moe/test_c.py",
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
        ],
    )
    (root / "v1.0.0" / "stray.patch").write_bytes((root / "v1.0.0" / "nosob.patch").read_bytes())
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    fake_index.add("1.0.0")
    result, report = verify_json()
    assert result.exit_code == 8
    status, detail = checks(report, "v1.0.0")["series-integrity"]
    assert status == "fail"
    assert "nosob.patch: no Signed-off-by trailer" in detail
    assert "badstatus.patch: Upstream-Status 'Maybe' is not one of" in detail
    assert "stray.patch is not listed in series" in detail
    assert "notest.patch names Upstream-Test tests/kernels/moe/test_c.py, which is not in" in detail
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == ["moe-patch: error: verify failed: v1.0.0 series-integrity"]


def test_series_listing_a_missing_file(fake_index, series_root):
    fake_index.add("1.0.0")
    with open(series_root / "v1.0.0" / "series", "a") as handle:
        handle.write("gone.patch\n")
    result, report = verify_json()
    assert result.exit_code == 8
    assert (
        "series lists gone.patch, which does not exist"
        in checks(report, "v1.0.0")["series-integrity"][1]
    )
    assert checks(report, "1.0.0")["apply"][0] == "fail"


def test_exported_form_catches_a_hand_edited_patch(fake_index, series_root):
    fake_index.add("1.0.0")
    patch = series_root / "v1.0.0" / "extra.patch"
    text = patch.read_text()
    # Still a valid patch that applies, but not what git format-patch writes.
    patch.write_text(text.replace("\n\ndiff --git", "\n---\n vllm/extra.py | 1 +\n\ndiff --git", 1))
    result, report = verify_json()
    assert result.exit_code == 8
    status, detail = checks(report, "v1.0.0")["exported-form"]
    assert status == "fail" and detail.startswith("extra.patch: ")
    assert "moe-patch checkout, then moe-patch export" in detail
    assert checks(report, "1.0.0")["apply"][0] == "pass"


def test_a_patch_that_fails_skips_the_tree_checks(fake_index, series_root):
    fake_index.add("1.0.0")
    fake_index.add("1.4.0", make_sdist("1.4.0", release_files("1.4.0", "# rewritten\n")))
    result, report = verify_json()
    assert result.exit_code == 8
    found = checks(report, "1.4.0")
    assert found["apply"][0] == "fail" and "hunk 1" in found["apply"][1]
    assert {found[n][0] for n in ("compile", "ruff-check", "ruff-format")} == {"skip"}
    assert all(s == "pass" for s, _ in checks(report, "1.0.0").values())


def test_compile_and_ruff_use_the_trees_own_configuration(fake_index, tmp_path, monkeypatch):
    files = release_files("1.0.0")
    files["pyproject.toml"] = RUFF_CONFIG
    files["vllm/old.py"] = "import os\n\nX = [1,\n  2]\n\nY = 1\n"  # unused import, unformatted
    edits = {
        "fine": {"vllm/old.py": "import os\n\nX = [1,\n  2]\n\nY = 2\n"},
        "lint": {"vllm/new.py": "import sys\n"},
        "style": {"vllm/style.py": "Z = [1,\n    2]\n"},
        "syntax": {"vllm/bad.py": "def broken(:\n"},
    }
    for name, edit in edits.items():
        root = author_series(tmp_path / name, "1.0.0", [{"id": name, "edit": edit}], files=files)
        monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
        fake_index.archives.clear()
        fake_index.add("1.0.0", make_sdist("1.0.0", files))
        result, report = verify_json()
        found = checks(report, "1.0.0")
        if name == "fine":
            assert result.exit_code == 0, found
            assert "already in the unpatched files" in found["ruff-check"][1]
            assert "was not formatted before the series either" in found["ruff-format"][1]
        elif name == "lint":
            assert found["ruff-check"][0] == "fail"
            assert "vllm/new.py:1: F401" in found["ruff-check"][1]
            assert "pyproject.toml" in found["ruff-check"][1]
        elif name == "style":
            assert found["ruff-check"][0] == "pass"
            status, detail = found["ruff-format"]
            assert status == "fail"
            assert detail.startswith(
                "would reformat the patched lines of vllm/style.py [pyproject.toml, ruff "
            )
        else:
            assert found["compile"][0] == "fail" and "vllm/bad.py:1" in found["compile"][1]
        assert result.exit_code == (0 if name == "fine" else 8)


def test_kernels_run_against_each_patched_tree(fake_index, series_root, tmp_path, monkeypatch):
    fake_index.add("1.0.0")
    tests = tmp_path / "kernel-tests"
    tests.mkdir()
    (tests / "test_tree.py").write_text(
        textwrap.dedent(
            """\
            import os
            from pathlib import Path

            def test_patched_tree_is_given():
                tree = Path(os.environ["MOE_KERNELS_TREES"])
                assert (tree / "vllm" / "extra.py").read_text() == "FEATURE = True\\n"
            """
        )
    )
    monkeypatch.setenv("MOE_PATCH_KERNEL_TESTS", str(tests))
    result, report = verify_json("--kernels")
    assert result.exit_code == 0, result.output
    status, detail = checks(report, "1.0.0")["kernels"]
    assert status == "pass" and detail.startswith("1 passed"), detail
    (tests / "test_tree.py").write_text("def test_broken():\n    assert False\n")
    result, report = verify_json("--kernels")
    assert result.exit_code == 8
    status, detail = checks(report, "1.0.0")["kernels"]
    assert status == "fail" and "test_broken" in detail


def test_bad_input(fake_index, series_root):
    fake_index.add("1.0.0")
    result = run("verify", "--vllm", "1.0.0", "--all")
    assert result.exit_code == 2 and "not both" in result.stderr
    result = run("verify", "--vllm", "1.7")
    assert result.exit_code == 2 and "unknown vLLM version 1.7" in result.stderr


def test_a_base_the_index_does_not_have_is_skipped(fake_index, series_root, tmp_path):
    """After rebase --source onto a release that is not published yet."""
    fake_index.add("1.0.0")
    source = tmp_path / "src"
    write_files(source, release_files("2.0.0"))
    into = str(tmp_path / "w")
    assert run("rebase", "--onto", "2.0.0", "--source", str(source), "--into", into).exit_code == 0
    result, report = verify_json()
    assert result.exit_code == 0, result.output
    assert checks(report, "v2.0.0")["series-integrity"][0] == "pass"
    assert checks(report, "v2.0.0")["exported-form"] == (
        "skip",
        "vLLM 2.0.0 is not on the package index yet",
    )
