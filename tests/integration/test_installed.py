"""``apply --installed`` / ``status --installed`` / ``revert --installed`` on a synthetic
vLLM installed with pip into a --target directory."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import installed
from moe_patch.cli import main
from support import tree_digest
from wheel_support import make_wheel, pip_install, record_problems

KERNEL = "vllm/model_executor/layers/fused_moe/fused_moe.py"


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_json(*args):
    result = run(*args, "--json")
    return result, (json.loads(result.stdout) if result.stdout.startswith("{") else None)


@pytest.fixture(scope="module")
def installed_once(tmp_path_factory):
    """vLLM 1.0.0 installed by pip into a --target directory (bytecode compiled by pip)."""
    folder = tmp_path_factory.mktemp("installed-vllm-1.0.0")
    name, data = make_wheel("1.0.0")
    (folder / name).write_bytes(data)
    return pip_install(folder / name, folder / "site")


@pytest.fixture
def site(fake_index, series_root, tmp_path, installed_once):
    """A fresh copy of that install for each test (pip runs once per module)."""
    fake_index.add("1.0.0")
    return Path(shutil.copytree(installed_once, tmp_path / "site", symlinks=True))


def test_round_trip_restores_every_byte(site):
    before = tree_digest(site)
    result, report = run_json("apply", "--installed", "--target", str(site))
    assert result.exit_code == 0, result.output
    assert report["state"] == "patched"
    assert {f["path"]: (f["change"], f["now"]) for f in report["files"]} == {
        KERNEL: ("modified", "patched"),
        "vllm/extra.py": ("added", "patched"),
    }
    assert "do_not_specialize" in (site / KERNEL).read_text()
    assert (site / "vllm/extra.py").read_text() == "FEATURE = True\n"
    assert record_problems(site) == []  # RECORD lists the new hashes, backups and state
    record = (site / "vllm-1.0.0.dist-info/RECORD").read_text()
    assert "vllm/extra.py,sha256=" in record
    assert "vllm-1.0.0.dist-info/moe-patch/state.json,," in record

    result, report = run_json("status", "--installed", "--target", str(site))
    assert report["state"] == "patched" and report["series_base"] == "1.0.0"
    result, report = run_json("apply", "--installed", "--target", str(site))
    assert result.exit_code == 0 and report["state"] == "unchanged (already applied)"

    result, report = run_json("revert", "--installed", "--target", str(site))
    assert result.exit_code == 0 and report["state"] == "reverted"
    assert [(p["id"], p["status"]) for p in report["patches"]] == [
        ("jit", "reverted"),
        ("extra", "reverted"),
    ]
    assert tree_digest(site) == before
    result = run("revert", "--installed", "--target", str(site))
    assert result.exit_code == 0 and "nothing to revert" in result.stdout
    assert run("status", "--installed", "--target", str(site)).stdout.startswith(
        f"vLLM 1.0.0 at {site}/vllm-1.0.0.dist-info: not patched"
    )


def test_bytecode_is_refreshed_so_python_runs_the_patch(site):
    import importlib.util
    import sys

    pyc = site / "vllm/model_executor/layers/fused_moe/__pycache__"
    own = list(pyc.glob(f"fused_moe.{sys.implementation.cache_tag}.pyc"))
    assert own, "pip compiles bytecode on install"
    old = own[0].read_bytes()
    assert run("apply", "--installed", "--target", str(site)).exit_code == 0
    new = own[0].read_bytes()
    assert new[:4] == importlib.util.MAGIC_NUMBER and new != old
    source = site / KERNEL
    # pip's bytecode is timestamp-based; the refreshed one is too, and matches the patched file
    assert int.from_bytes(new[4:8], "little") == int.from_bytes(old[4:8], "little") == 0
    assert int.from_bytes(new[12:16], "little") == source.stat().st_size
    assert int.from_bytes(new[8:12], "little") == int(source.stat().st_mtime)
    assert record_problems(site) == []


def test_file_changed_by_someone_else_is_refused(site):
    (site / KERNEL).write_text((site / KERNEL).read_text() + "# local hack\n")
    before = tree_digest(site)
    result = run("apply", "--installed", "--target", str(site))
    assert result.exit_code == 7
    assert f"{KERNEL} differs from the vLLM 1.0.0 release" in result.stderr
    assert tree_digest(site) == before


def test_a_record_that_is_not_utf8_is_refused_in_one_line(site):
    record = site / "vllm-1.0.0.dist-info/RECORD"
    record.write_bytes(record.read_bytes() + b"vllm/caf\xe9.py,,\n")
    before = tree_digest(site)
    result = CliRunner().invoke(main, ["apply", "--installed", "--target", str(site)])
    assert result.exit_code == 7, result.output
    assert "the RECORD of the installed vLLM is not UTF-8" in result.stderr
    assert "Traceback" not in result.output and tree_digest(site) == before


def test_version_mismatch_is_refused(site):
    before = tree_digest(site)
    result = run("apply", "--installed", "--target", str(site), "--vllm", "1.1")
    assert result.exit_code == 2
    assert "the installed vLLM is 1.0.0, not 1.1" in result.stderr
    assert run("apply", "--installed", "--target", str(site), "--vllm", "1.0").exit_code == 0
    run("revert", "--installed", "--target", str(site))
    assert tree_digest(site) == before


def test_version_module_that_disagrees_is_refused(site):
    (site / "vllm/_version.py").write_text("__version__ = version = '0.9.0'\n")
    result = run("apply", "--installed", "--target", str(site))
    assert result.exit_code == 7
    assert "says it is 0.9.0 but its metadata says 1.0.0" in result.stderr


def test_no_series_for_the_installed_release(fake_index, series_root, tmp_path):
    name, data = make_wheel("0.9.0")
    (tmp_path / name).write_bytes(data)
    site = pip_install(tmp_path / name, tmp_path / "site")
    result = run("apply", "--installed", "--target", str(site))
    assert result.exit_code == 2
    assert "no patch series serves vLLM 0.9.0" in result.stderr
    assert "the oldest base is 1.0.0" in run("status", "--installed", "--target", str(site)).stdout


def test_not_writable_is_refused_before_anything_changes(site, monkeypatch):
    before = tree_digest(site)
    locked = site / "vllm/model_executor/layers/fused_moe"
    monkeypatch.setattr(installed, "_writable", lambda path: path != locked)
    result = run("apply", "--installed", "--target", str(site))
    assert result.exit_code == 11
    assert f"{locked} is not writable" in result.stderr
    assert tree_digest(site) == before


def test_failure_half_way_leaves_the_install_as_it_was(site, monkeypatch):
    before = tree_digest(site)
    monkeypatch.setattr(installed, "_write_atomic", _fail_on_second_package_file(site, OSError))
    with pytest.raises(OSError):
        installed.apply(site)
    assert tree_digest(site) == before


def _fail_on_second_package_file(site, error):
    """A _write_atomic that fails when the second file of the package is written."""
    real = installed._write_atomic
    package = []

    def write(path, data, mode=None):
        if path.is_relative_to(site / "vllm"):
            package.append(path)
            if len(package) == 2:  # the first package file is already replaced
                raise error(28, "No space left on device")
        return real(path, data, mode)

    return write


def test_interrupted_apply_is_reported_and_the_next_apply_finishes_it(site, monkeypatch):
    before = tree_digest(site)
    real = installed._write_atomic

    class Killed(BaseException):  # stands in for a kill: no clean-up may run
        def __init__(self, *args):
            super().__init__()

    monkeypatch.setattr(installed, "_write_atomic", _fail_on_second_package_file(site, Killed))
    monkeypatch.setattr(installed, "_rollback", lambda *args: None)
    with pytest.raises(Killed):
        installed.apply(site)
    monkeypatch.setattr(installed, "_write_atomic", real)
    assert tree_digest(site) != before  # half-patched on disk

    result, report = run_json("status", "--installed", "--target", str(site))
    assert report["state"] == "interrupted"
    result = run("apply", "--installed", "--target", str(site))
    assert result.exit_code == 0, result.output
    assert (
        f"moe-patch: an earlier apply to {site} was interrupted; rolled back what it had "
        "changed, applying again\n"
    ) in result.stderr
    assert run_json("status", "--installed", "--target", str(site))[1]["state"] == "patched"
    assert record_problems(site) == []
    assert run("revert", "--installed", "--target", str(site)).exit_code == 0
    assert tree_digest(site) == before  # the backups the next apply took are the release's


def test_revert_removes_what_a_kill_mid_write_left_behind(site, monkeypatch):
    """A SIGKILL inside a write leaves the writer's temporary file: ours beside the file
    being replaced, py_compile's (``NAME.pyc.<id>``) beside the bytecode."""
    before = tree_digest(site)
    real = installed._write_atomic

    class Killed(BaseException):
        def __init__(self, *args):
            super().__init__()

    def killed_mid_write(path, data, mode=None):
        if path.is_relative_to(site / "vllm"):  # the first package file, half written
            path.with_name(f".{path.name}.moe-patch-tmp").write_bytes(data[: len(data) // 2])
            raise Killed
        return real(path, data, mode)

    monkeypatch.setattr(installed, "_write_atomic", killed_mid_write)
    monkeypatch.setattr(installed, "_rollback", lambda *args: None)
    with pytest.raises(Killed):
        installed.apply(site)
    monkeypatch.setattr(installed, "_write_atomic", real)
    (pyc,) = (site / KERNEL).parent.glob("__pycache__/fused_moe.*.pyc")
    pyc.with_name(f"{pyc.name}.140234567").write_bytes(b"half a pyc")  # py_compile's temp name
    assert tree_digest(site) != before

    assert run("revert", "--installed", "--target", str(site)).exit_code == 0
    assert tree_digest(site) == before


def test_revert_refuses_to_lose_a_later_change(site):
    assert run("apply", "--installed", "--target", str(site)).exit_code == 0
    (site / KERNEL).write_text("# replaced\n")
    result = run("revert", "--installed", "--target", str(site))
    assert result.exit_code == 7
    assert f"{KERNEL} changed after moe-patch patched it" in result.stderr
    _, report = run_json("status", "--installed", "--target", str(site))
    assert report["state"] == "changed"
    assert {f["path"]: f["now"] for f in report["files"]}[KERNEL] == "changed"


def test_patched_wheel_install_is_recognised(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    from wheel_support import add_wheel

    add_wheel(fake_index, "1.0.0")
    assert run("wheel", "--vllm", "1.0.0", "-o", str(tmp_path / "dist")).exit_code == 0
    site = pip_install(next((tmp_path / "dist").iterdir()), tmp_path / "site")
    _, report = run_json("status", "--installed", "--target", str(site))
    assert report["state"] == "moe-patch wheel" and report["series_base"] == "1.0.0"
    before = tree_digest(site)
    result, report = run_json("apply", "--installed", "--target", str(site))
    assert result.exit_code == 0 and report["state"].startswith("unchanged")
    assert tree_digest(site) == before


def test_usage_errors(site, tmp_path):
    assert run("status").exit_code == 2
    assert "pass --installed" in run("revert").stderr
    result = run("apply", "--installed", "--target", str(tmp_path / "empty-nothing"))
    assert result.exit_code == 2 and "does not exist" in result.stderr
    (tmp_path / "empty").mkdir()
    result = run("status", "--installed", "--target", str(tmp_path / "empty"))
    assert result.exit_code == 2 and "no vLLM is installed in" in result.stderr
    result = run("apply", "--installed", "--target", str(site), "--into", str(tmp_path / "x"))
    assert result.exit_code == 2


def test_the_revert_report_lists_no_patch_as_applied(site):
    assert run("apply", "--installed", "--target", str(site)).exit_code == 0
    result = run("revert", "--installed", "--target", str(site))
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["jit", "reverted"] in rows and ["extra", "reverted"] in rows
    assert "applied" not in result.stdout
