"""``moe-patch wheel`` on synthetic releases: a fake index serving an sdist and a wheel."""

import json
import zipfile

import pytest
from click.testing import CliRunner
from moe_patch import __version__, cache, wheel
from moe_patch.cli import main
from support import author_series, make_sdist, release_files
from wheel_support import (
    COMPILED,
    COMPILED_BYTES,
    add_wheel,
    pip_install,
    record_problems,
    zip_record_problems,
)

KERNEL = "vllm/model_executor/layers/fused_moe/fused_moe.py"
LABEL = f"moe.{__version__}"


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def build(out, *extra):
    result = run("wheel", "--vllm", "1.0", "-o", str(out), "--json", *extra)
    report = json.loads(result.stdout) if result.exit_code == 0 else None
    return result, report


@pytest.fixture
def release(fake_index, series_root):
    fake_index.add("1.0.0")
    return add_wheel(fake_index, "1.0.0")


def test_patched_wheel_carries_the_series(release, tmp_path):
    result, report = build(tmp_path / "dist")
    assert result.exit_code == 0, result.output
    name = f"vllm-1.0.0+{LABEL}-1-py3-none-any.whl"
    path = tmp_path / "dist" / name
    assert report["path"] == str(path) and report["version"] == f"1.0.0+{LABEL}"
    assert [(p["id"], p["status"]) for p in report["patches"]] == [
        ("jit", "applied"),
        ("extra", "applied"),
    ]
    assert {f["path"]: f["change"] for f in report["files"]} == {
        KERNEL: "modified",
        "vllm/extra.py": "added",
        "vllm/_version.py": "version",
    }
    assert zip_record_problems(path) == []
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        info = f"vllm-1.0.0+{LABEL}.dist-info"
        assert names[-1] == f"{info}/RECORD"
        assert not any(n.startswith("vllm-1.0.0.dist-info/") for n in names)
        assert "do_not_specialize" in archive.read(KERNEL).decode()
        assert archive.read("vllm/extra.py") == b"FEATURE = True\n"
        assert archive.read(COMPILED) == COMPILED_BYTES
        version_module = archive.read("vllm/_version.py").decode()
        assert f"'1.0.0+{LABEL}'" in version_module
        metadata = archive.read(f"{info}/METADATA").decode()
        assert f"Version: 1.0.0+{LABEL}\n" in metadata
        assert "Version: not a header in the body" in metadata  # the body is left alone
        built = json.loads(archive.read(f"{info}/moe-patch.json"))
        assert built["vllm"] == "1.0.0" and [p["id"] for p in built["patches"]] == ["jit", "extra"]
        assert {i.date_time for i in archive.infolist()} == {archive.infolist()[0].date_time}
        assert {i.external_attr >> 16 for i in archive.infolist()} == {0o100644}

    target = pip_install(path, tmp_path / "site")
    assert (target / f"vllm-1.0.0+{LABEL}.dist-info").is_dir()
    assert "do_not_specialize" in (target / KERNEL).read_text()
    assert record_problems(target) == []


def test_compiled_members_keep_their_compressed_bytes(release, tmp_path, fake_index):
    _, report = build(tmp_path / "dist")
    official = cache.root() / "wheels" / release
    with zipfile.ZipFile(official) as before, zipfile.ZipFile(report["path"]) as after:
        old, new = before.getinfo(COMPILED), after.getinfo(COMPILED)
        assert (old.CRC, old.compress_size, old.compress_type) == (
            new.CRC,
            new.compress_size,
            new.compress_type,
        )


def test_same_inputs_same_bytes_and_warm_cache(release, tmp_path, fake_index):
    first, one = build(tmp_path / "a")
    downloads = [r for r in fake_index.requests if r.endswith(".whl")]
    second, two = build(tmp_path / "b")
    assert first.exit_code == second.exit_code == 0
    assert one["sha256"] == two["sha256"]
    a, b = (tmp_path / "a").iterdir(), (tmp_path / "b").iterdir()
    assert next(a).read_bytes() == next(b).read_bytes()
    assert [r for r in fake_index.requests if r.endswith(".whl")] == downloads  # cached


def test_source_date_epoch_sets_every_timestamp(release, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    _, report = build(tmp_path / "dist")
    with zipfile.ZipFile(report["path"]) as archive:
        assert {i.date_time for i in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def test_hash_mismatch_keeps_nothing(release, tmp_path, fake_index):
    fake_index.listed_hash[release] = "0" * 64
    result, _ = build(tmp_path / "dist")
    assert result.exit_code == 5
    assert "does not match the index's sha256" in result.stderr
    assert not list((cache.root() / "wheels").iterdir())
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_disk_full_leaves_no_new_out_folder(release, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wheel.zipfile.ZipFile, "writestr", full)
    (tmp_path / "kept").mkdir()
    result, _ = build(tmp_path / "kept" / "new" / "dist")
    assert result.exit_code == 11, result.output
    assert "No space left on device" in result.stderr
    assert list((tmp_path / "kept").iterdir()) == []  # made by the run, removed with it


def test_no_wheel_for_the_platform(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0", tag="cp38-abi3-manylinux_2_24_x86_64")
    result, _ = build(tmp_path / "dist", "--platform", "macosx_14_0_arm64")
    assert result.exit_code == 2
    assert "has no wheel for macosx_14_0_arm64" in result.stderr
    assert "manylinux_2_24_x86_64" in result.stderr


def test_wheel_that_differs_from_the_release_is_refused(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    files = release_files("1.0.0")
    files[KERNEL] = files[KERNEL].replace("@triton.jit\n", "@triton.jit()\n")
    add_wheel(fake_index, "1.0.0", files=files)
    result, _ = build(tmp_path / "dist")
    assert result.exit_code == 3
    assert "does not apply exactly to the vLLM 1.0.0 wheel" in result.stderr
    assert KERNEL in result.stderr
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def _series_with(tmp_path, monkeypatch, files, edit, fake_index):
    root = tmp_path / "other-series"
    author_series(root, "1.0.0", [{"id": "p", "edit": edit}], files=files)
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    fake_index.add("1.0.0", make_sdist("1.0.0", files))
    add_wheel(fake_index, "1.0.0", files=files)


def test_compiled_sources_are_refused(fake_index, tmp_path, monkeypatch):
    files = {**release_files("1.0.0"), "csrc/moe.cu": "// kernel\n"}
    _series_with(tmp_path, monkeypatch, files, {"csrc/moe.cu": "// faster kernel\n"}, fake_index)
    result, _ = build(tmp_path / "dist")
    assert result.exit_code == 3
    (error,) = [ln for ln in result.stderr.splitlines() if "error:" in ln]  # one line
    assert "patch p changes csrc/moe.cu, a compiled or build source" in error


def test_package_file_missing_from_the_wheel_is_refused(fake_index, tmp_path, monkeypatch):
    files = {**release_files("1.0.0"), "vllm/only_in_sdist.py": "X = 1\n"}
    _series_with(tmp_path, monkeypatch, files, {"vllm/only_in_sdist.py": "X = 2\n"}, fake_index)
    fake_index.archives.pop("vllm-1.0.0-1-py3-none-any.whl")
    add_wheel(fake_index, "1.0.0", files=release_files("1.0.0"))
    result, _ = build(tmp_path / "dist")
    assert result.exit_code == 3
    assert "vllm/only_in_sdist.py, which the vLLM 1.0.0 wheel does not contain" in result.stderr


def test_tests_and_docs_are_skipped_and_said(fake_index, tmp_path, monkeypatch):
    files = {**release_files("1.0.0"), "tests/test_moe.py": "def test(): pass\n"}
    edit = {"tests/test_moe.py": "def test(): assert True\n", "vllm/extra.py": "A = 1\n"}
    _series_with(tmp_path, monkeypatch, files, edit, fake_index)
    result = run("wheel", "--vllm", "1.0.0", "-o", str(tmp_path / "dist"))
    assert result.exit_code == 0, result.output
    assert "skipped (not in the wheel, not needed at run time): tests/test_moe.py" in result.stdout
    with zipfile.ZipFile(next((tmp_path / "dist").iterdir())) as archive:
        assert "vllm/extra.py" in archive.namelist()
        assert not any(n.startswith("tests/") for n in archive.namelist())


def test_no_series_for_the_release(fake_index, series_root, tmp_path):
    fake_index.add("0.9.0")
    add_wheel(fake_index, "0.9.0")
    result = run("wheel", "--vllm", "0.9.0", "-o", str(tmp_path / "dist"))
    assert result.exit_code == 2
    assert "no patch series serves vLLM 0.9.0" in result.stderr
    assert not [r for r in fake_index.requests if r.endswith(".whl")]


def test_local_version_and_platforms():
    assert wheel.patched_version("0.21.0", "0.1.0") == "0.21.0+moe.0.1.0"
    assert wheel.patched_version("0.21.0+cu129", "0.1.0") == "0.21.0+cu129.moe.0.1.0"
    assert wheel.patched_version("0.21.0", "1.0.0rc1") == "0.21.0+moe.1.0.0rc1"
    tags = wheel.platforms_for("manylinux_2_28_x86_64")
    assert "manylinux_2_24_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert wheel.platforms_for("manylinux2014_aarch64")[0] == "manylinux_2_17_aarch64"
    real = "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl"
    assert wheel.compatible(real, wheel.platforms_for("manylinux_2_28_x86_64"))
    assert not wheel.compatible(real, wheel.platforms_for("manylinux_2_17_x86_64"))
    assert not wheel.compatible(real, wheel.platforms_for("manylinux_2_28_aarch64"))


def test_version_module_rewrite():
    text = (
        b"__version__ = version = '0.21.0'\n__version_tuple__ = version_tuple = (0, 21, 0)\n"
        b"__commit_id__ = commit_id = 'gad7125a43'\n"
    )
    new = wheel.rewrite_version_module(text, "0.21.0+moe.0.1.0").decode()
    assert "__version__ = version = '0.21.0+moe.0.1.0'" in new
    assert "version_tuple = (0, 21, 0, 'moe.0.1.0')" in new
    assert "'gad7125a43'" in new
    assert wheel.rewrite_version_module(b"VERSION = '1'\n", "1+moe.0") is None


SETUP_PY = """\
import os

from setuptools import find_packages, setup

# What vLLM's setup.py reads for its Python-only build (checked, not used, here).
assert os.environ["VLLM_USE_PRECOMPILED"] == "1"
assert os.path.isfile(os.environ["VLLM_PRECOMPILED_WHEEL_LOCATION"])
setup(
    name="vllm",
    version=os.environ["VLLM_VERSION_OVERRIDE"],
    packages=find_packages(include=["vllm", "vllm.*"]),
)
"""


def test_precompiled_method_runs_the_trees_own_build(fake_index, tmp_path, monkeypatch):
    files = {**release_files("1.0.0"), "setup.py": SETUP_PY}
    for package in ("vllm/model_executor", "vllm/model_executor/layers"):
        files[f"{package}/__init__.py"] = ""
    files["vllm/model_executor/layers/fused_moe/__init__.py"] = ""
    edit = {KERNEL: release_files("1.0.0")[KERNEL].replace("@triton.jit", "@triton.jit()")}
    _series_with(tmp_path, monkeypatch, files, edit, fake_index)
    result, report = build(tmp_path / "dist", "--method", "precompiled", "--no-build-isolation")
    assert result.exit_code == 0, result.output
    assert report["method"] == "precompiled" and report["version"] == f"1.0.0+{LABEL}"
    with zipfile.ZipFile(report["path"]) as archive:
        assert "@triton.jit()" in archive.read(KERNEL).decode()
    assert report["path"].endswith(f"vllm-1.0.0+{LABEL}-py3-none-any.whl")


def test_no_build_isolation_needs_precompiled(release, tmp_path):
    result, _ = build(tmp_path / "dist", "--no-build-isolation")
    assert result.exit_code == 2 and "only applies to --method precompiled" in result.stderr


def test_index_lists_wheels_with_their_hashes(fake_index):
    from moe_patch import index
    from moe_patch.pipconfig import IndexSettings

    fake_index.add("1.0.0")
    name = add_wheel(fake_index, "1.0.0")
    fake_index.archives["vllm-1.1.0rc1-py3-none-any.whl"] = b"x"
    settings = IndexSettings(fake_index.url)
    assert [d.filename for d in index.distributions(settings)] == ["vllm-1.0.0.tar.gz"]
    (listed,) = index.wheels(settings, "1.0.0")
    assert listed.filename == name and len(listed.sha256) == 64
    assert index.wheels(settings, "1.1.0") == []


def test_listing_cached_before_wheels_were_listed_is_refreshed(fake_index):
    from moe_patch import index
    from moe_patch.pipconfig import IndexSettings

    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    settings = IndexSettings(fake_index.url)
    index.distributions(settings)
    path = index._listing_path(settings)
    old = json.loads(path.read_text())
    del old["wheels"]  # as an older moe-patch wrote it
    path.write_text(json.dumps(old))
    assert len(index.wheels(settings, "1.0.0")) == 1
    assert fake_index.requests.count("/simple/vllm/") == 2


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_wheel_is_written_with_the_umasks_mode(release, tmp_path, umask, mode):
    """Like any file the user's tools write: others may read it under umask 022."""
    import os
    import stat

    before = os.umask(umask)
    try:
        result, report = build(tmp_path / "dist")
    finally:
        os.umask(before)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(os.stat(report["path"]).st_mode) == mode
