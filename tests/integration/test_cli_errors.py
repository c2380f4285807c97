"""Errors from the set-up around a command: no git, an interrupt while moe-patch loads, a git
variable of the caller's, absurd input, programs that are not there, and MOE_PATCH_DEBUG.
Each is one line and a documented exit code, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import git as gitpython
import pytest
from click.testing import CliRunner
from moe_patch.cli import main
from support import git

MODULE = [sys.executable, "-m", "moe_patch"]
SCRIPT = Path(sys.executable).with_name("moe-patch")


def _run(command, env=None):
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _one_line(result) -> str:
    """The one error line (progress lines may come before it)."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if "error" in line or "interrupted" in line] == lines[-1:]
    return lines[-1]


def test_without_git_help_and_version_work_and_commands_say_so(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    fake_index.add("1.1.0")
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # python and pip, no git
    assert shutil.which("git", path=env["PATH"]) is None
    for args in (["--help"], ["--version"], *([name, "--help"] for name in main.commands)):
        result = _run([*MODULE, *args], env)
        assert result.returncode == 0 and result.stderr == "", (args, result.stderr)
    needs_git = [
        ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "a")],
        ["checkout", "--vllm", "1.0.0", str(tmp_path / "c")],
        ["rebase", "--onto", "1.1.0", "--into", str(tmp_path / "r")],
        ["verify", "--vllm", "1.0.0"],
    ]
    for args in needs_git:
        result = _run([*MODULE, *args], env)
        line = _one_line(result)
        assert result.returncode == 2, (args, line)
        assert line == (
            "moe-patch: error: git is not installed or not on PATH; install git (2.32 or "
            "newer) or put it on PATH, then run the same command again"
        )
    for args in (["list"], ["clean", "--into", str(tmp_path / "a")]):  # no git needed
        assert _run([*MODULE, *args], env).returncode == 0


@pytest.mark.parametrize("entry", ["python -m moe_patch", "moe-patch"])
def test_an_interrupt_while_moe_patch_loads_is_one_line_and_exit_130(tmp_path, entry):
    """Ctrl-C lands while the modules import (click, the first of them, stands in)."""
    command = MODULE if entry.startswith("python") else [str(SCRIPT)]
    if entry == "moe-patch" and not SCRIPT.is_file():
        pytest.skip("moe-patch is not installed beside this Python")
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    result = _run([*command, "list"], env)
    assert result.returncode == 130
    assert _one_line(result) == "moe-patch: interrupted while starting; nothing was changed"


def test_git_namespace_of_the_caller_changes_nothing(
    fake_index, series_root, tmp_path, monkeypatch
):
    fake_index.add("1.0.0")
    monkeypatch.setenv("GIT_NAMESPACE", "elsewhere")
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    monkeypatch.delenv("GIT_NAMESPACE")
    assert git(tmp_path / "t", "for-each-ref", "refs/namespaces") == ""
    assert git(tmp_path / "t", "branch", "--show-current") == "moe-patch/v1.0.0"


@pytest.mark.parametrize("spec", ["1" * 5000, "0." + "9" * 5000, "v" + "1." * 3000 + "0"])
def test_an_absurdly_long_version_is_bad_input(cache_dir, tmp_path, spec):
    result = CliRunner().invoke(main, ["apply", "--vllm", spec, "--into", str(tmp_path / "t")])
    assert result.exit_code == 2, result.output
    assert "is not a vLLM version" in result.stderr and len(result.stderr) < 300
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ({"env": {"MOE_PATCH_RUFF": "/nowhere/ruff"}}, "MOE_PATCH_RUFF='/nowhere/ruff' is not"),
        (
            {"args": ["--kernels", "--kernels-python", "/nowhere/python"]},
            "--kernels-python '/nowhere/python' (or MOE_PATCH_KERNELS_PYTHON) is not",
        ),
        (
            {"args": ["--kernels"], "env": {"MOE_PATCH_KERNELS_PYTHON": "no-such-python"}},
            "--kernels-python 'no-such-python' (or MOE_PATCH_KERNELS_PYTHON) is not",
        ),
    ],
)
def test_a_program_pointing_nowhere_is_bad_input_not_a_full_disk(
    fake_index, series_root, monkeypatch, how, words
):
    fake_index.add("1.0.0")
    for key, value in how.get("env", {}).items():
        monkeypatch.setenv(key, value)
    args = ["verify", "--vllm", "1.0.0", *how.get("args", [])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert words in line and "free space" not in line and len(line.splitlines()) == 1


def _failing_checkout(monkeypatch):
    from moe_patch import sources

    real = sources.gitutil.run

    def run(cwd, *args, **kwargs):
        if "checkout" in args:
            said = b"error: some detail git gave first\nfatal: unable to read tree 0123abcd"
            raise gitpython.GitCommandError(["git", "-c", "a=b", "checkout", "-q"], 128, said)
        return real(cwd, *args, **kwargs)

    monkeypatch.setattr(sources.gitutil, "run", run)


@pytest.mark.parametrize("debug", ["", "0", "false", "1", "yes"])
def test_moe_patch_debug_shows_git_failures_in_full_only_when_on(
    fake_index, series_root, tmp_path, monkeypatch, debug
):
    fake_index.add("1.0.0")
    _failing_checkout(monkeypatch)
    monkeypatch.setenv("MOE_PATCH_DEBUG", debug)
    result = CliRunner().invoke(main, ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t")])
    assert result.exit_code == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "moe-patch: error: git checkout failed (fatal: unable to read tree 0123abcd); please "
        "report it with the command you ran (MOE_PATCH_DEBUG=1 shows all git said)"
    )
    on = debug in ("1", "yes")
    assert ("some detail git gave first" in result.stderr) == on
    assert ("cmdline: git -c a=b checkout -q" in result.stderr) == on
    assert ("Traceback (most recent call last)" in result.stderr) == on
    if not on:
        assert [ln for ln in result.stderr.splitlines() if "error" in ln] == [last]
