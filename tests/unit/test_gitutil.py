"""gitutil.run: the environment every git command of moe-patch runs in."""

from __future__ import annotations

import subprocess

from moe_patch import gitutil


def _repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_no_automatic_gc_or_maintenance(tmp_path):
    repo = _repo(tmp_path)
    assert gitutil.run(repo, "config", "--get", "gc.auto") == "0"
    assert gitutil.run(repo, "config", "--get", "maintenance.auto") == "false"


def test_callers_own_config_variables_are_kept(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "user.name")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "Someone Else")
    assert gitutil.run(repo, "config", "--get", "user.name") == "Someone Else"
    assert gitutil.run(repo, "config", "--get", "gc.auto") == "0"
