"""Where a command reads its series, results and kernel tests, and which index it asks."""

from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import settings
from moe_patch.cli import main
from moe_patch.errors import UsageError
from moe_patch.settings import Settings


def _project(folder):
    (folder / "patches").mkdir(parents=True)
    (folder / "patches" / "README.md").write_text("# the series\n")
    (folder / "pyproject.toml").write_text('[project]\nname = "moe-patch"\n')
    return folder


def test_the_series_is_the_one_of_the_checkout_you_stand_in(tmp_path, monkeypatch):
    """A second clone of the project, with the tool installed from the first: commands run
    inside the second one read (and rebase writes) its own patches/."""
    monkeypatch.delenv("MOE_PATCH_SERIES", raising=False)
    clone = _project(tmp_path / "my-clone")
    (clone / "tooling").mkdir()
    monkeypatch.chdir(clone / "tooling")
    assert settings.default_series_root() == clone / "patches"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "patches").mkdir()  # a patches/ folder of something that is not moe-patch
    (elsewhere / "patches" / "README.md").write_text("not ours\n")
    (elsewhere / "pyproject.toml").write_text('[project]\nname = "other"\n')
    monkeypatch.chdir(elsewhere)
    installed_from = Path(settings.__file__).resolve().parents[2] / "patches"
    assert settings.default_series_root() == (
        installed_from
        if (installed_from / "README.md").is_file()
        else settings.packaged_series_root()
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(tmp_path / "mine"))
    assert settings.default_series_root() == tmp_path / "mine"


def test_the_shipped_copy_is_never_written(tmp_path, monkeypatch):
    shipped = tmp_path / "site-packages" / "moe_patch" / "_series"
    (shipped / "v1.0.0").mkdir(parents=True)
    monkeypatch.setattr(settings, "packaged_series_root", lambda: shipped)
    with pytest.raises(UsageError, match="the copy shipped inside the installed moe-patch"):
        settings.require_writable(shipped, "rebase")
    settings.require_writable(
        _project(tmp_path / "clone") / "patches", "rebase"
    )  # a checkout: fine


def test_options_and_environment_resolve_into_one_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("MOE_PATCH_SERIES", raising=False)
    clone = _project(tmp_path / "clone")
    monkeypatch.chdir(clone)
    monkeypatch.setenv("MOE_PATCH_RESULTS", str(tmp_path / "numbers"))
    monkeypatch.delenv("MOE_PATCH_KERNEL_TESTS", raising=False)
    resolved = Settings.resolve(None, "https://mirror.example.invalid/simple")
    assert resolved == Settings(
        series_root=clone / "patches",
        index_url="https://mirror.example.invalid/simple",
        results_dir=tmp_path / "numbers",
        kernel_tests_dir=clone / "tests" / "kernels",
    )
    given = Settings.resolve(tmp_path / "other", "")
    assert given.series_root == tmp_path / "other" and given.index_url is None


def test_a_command_gets_the_settings_its_options_name(tmp_path, monkeypatch):
    """--patches reaches the engine through the one Settings the command resolves."""
    seen = []
    from moe_patch.cli import list_ as list_command

    monkeypatch.setattr(
        list_command, "list_series", lambda vllm, settings: seen.append(settings) or []
    )
    result = CliRunner().invoke(main, ["list", "--patches", str(tmp_path / "mine"), "--json"])
    assert result.exit_code == 0, result.output
    assert seen == [Settings.resolve(tmp_path / "mine")]
    assert seen[0].series_root == (tmp_path / "mine").absolute()


def test_a_patches_folder_without_a_series_is_bad_input(tmp_path):
    result = CliRunner().invoke(main, ["list", "--patches", str(tmp_path / "typo")])
    assert result.exit_code == 2
    assert result.stderr == (
        f"moe-patch: error: there is no series under {tmp_path / 'typo'}; give --patches the "
        "folder that holds v<base>/series\n"
    )
