"""gitutil.run: the environment every git command of moe-patch runs in."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from moe_patch import gitutil


def _repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_no_automatic_gc_or_maintenance(tmp_path):
    repo = _repo(tmp_path)
    assert gitutil.run(repo, "config", "--get", "gc.auto") == "0"
    assert gitutil.run(repo, "config", "--get", "maintenance.auto") == "false"


def test_callers_config_variables_stay_out_but_identity_reads_see_them(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "user.name")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "Someone Else")
    monkeypatch.setenv("GIT_CONFIG_KEY_1", "diff.relative")
    monkeypatch.setenv("GIT_CONFIG_VALUE_1", "true")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'diff.context'='7'")
    assert gitutil.run(repo, "config", "--get", "diff.relative") == "false"
    assert gitutil.run(repo, "config", "--get", "diff.context") == "3"
    assert gitutil.user_setting(repo, "user.name") == "Someone Else"
    assert gitutil.run(repo, "config", "--get", "gc.auto") == "0"


def _logging_git(folder, log):
    """A ``git`` first on PATH that records each call's configuration, then runs git."""
    real = shutil.which("git")
    wrapper = folder / "git"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n" "$GIT_CONFIG_GLOBAL" "$GIT_CONFIG_NOSYSTEM" '
        f'"$GIT_CONFIG_COUNT" "$GIT_CONFIG_PARAMETERS" "$GIT_DIFF_OPTS" "$*" >> {log}\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    return folder


def test_every_git_call_runs_under_the_pinned_configuration(
    fake_index, series_root, tmp_path, monkeypatch
):
    """apply (a --source checkout too: GitPython's own calls), checkout, export, verify:
    each git process runs without the user's configuration and variables, with the pins;
    only the identity export signs with reads the user's."""
    from click.testing import CliRunner
    from moe_patch.cli import main
    from support import release_checkout

    fake_index.add("1.0.0")
    source = release_checkout(tmp_path / "src")
    log = tmp_path / "calls.log"
    (tmp_path / "bin").mkdir()
    bindir = _logging_git(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GIT_DIFF_OPTS", "--unified=7")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'diff.noprefix'='true'")
    monkeypatch.delenv("MOE_PATCH_AUTHOR")
    runs = [
        ["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "a")],
        ["apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(tmp_path / "s")],
        ["checkout", "--vllm", "1.0.0", str(tmp_path / "c")],
        ["export", "--check", str(tmp_path / "c")],
        ["verify", "--vllm", "1.0.0"],
    ]
    for args in runs:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    identity = [c for c in calls if c[5] in ("config --get user.name", "config --get user.email")]
    assert identity and all(c[3] for c in identity)  # the user's own, -c settings included
    controlled = [c for c in calls if c not in identity and "safe.directory" not in c[5]]
    assert len(controlled) > 50
    for global_, nosystem, count, parameters, diff_opts, command in controlled:
        assert (global_, nosystem, parameters, diff_opts) == (os.devnull, "1", "", ""), command
        assert int(count) >= len(gitutil.PINNED), command


@pytest.mark.parametrize("scope", ["global", "system"])
def test_a_network_clone_keeps_the_users_transport_settings_not_their_output_ones(
    fake_index, series_root, tmp_path, monkeypatch, scope
):
    """--git URL: the user's url.*.insteadOf (where credential helpers and proxies live too,
    in their global or system configuration) still reaches the remote; their core.autocrlf
    still changes nothing in the tree."""
    from click.testing import CliRunner
    from moe_patch import trees
    from moe_patch.cli import main
    from support import git, user_gitconfig

    fake_index.add("1.0.0")
    remote = trees.release_repo("1.0.0")
    text = (
        f'[url "{remote.as_uri()}"]\n\tinsteadOf = https://mirror.invalid/vllm\n'
        "[core]\n\tautocrlf = true\n"
    )
    if scope == "global":
        user_gitconfig(tmp_path, monkeypatch, text)
    else:
        (tmp_path / "gitconfig").write_text(text)
        monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(tmp_path / "gitconfig"))
        monkeypatch.delenv("GIT_CONFIG_NOSYSTEM", raising=False)
    into = tmp_path / "t"
    args = ["apply", "--vllm", "1.0.0", "--git", "https://mirror.invalid/vllm", "--into", str(into)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert b"\r\n" not in (into / "vllm" / "_version.py").read_bytes()
    assert git(into, "status", "--porcelain") == ""


def test_a_failed_write_on_a_full_disk_is_a_local_io_error(tmp_path, monkeypatch):
    import git as gitpython
    from moe_patch.errors import LocalIOError

    quiet = gitpython.GitCommandError(["git"], 128, b"fatal: could not set 'core.bare'")
    monkeypatch.setattr(gitutil, "_free_bytes", lambda path: 8192)
    with pytest.raises(
        LocalIOError, match=r"git init could not write: the disk holding .* is full"
    ):
        gitutil._raise_if_disk_full(quiet, ["-c", "a=b", "init", "-q"], [tmp_path])
    gitutil._raise_if_disk_full(quiet, ["rev-parse", "HEAD"], [tmp_path])  # a read: git's own
    monkeypatch.setattr(gitutil, "_free_bytes", lambda path: 10 << 30)
    gitutil._raise_if_disk_full(quiet, ["init"], [tmp_path])  # room enough: not the disk
    said = gitpython.GitCommandError(
        ["git"], 128, b"fatal: sha1 file 'x' write error. Out of diskspace"
    )
    with pytest.raises(LocalIOError):
        gitutil._raise_if_disk_full(said, ["checkout"], [tmp_path])


def test_output_as_gitpython_gives_it(tmp_path):
    """The keyword arguments callers pass as they would to GitPython's execute."""
    from support import git

    repo = _repo(tmp_path)
    (repo / "f").write_text("f\n")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "f")
    assert gitutil.run(repo, "rev-parse", "--git-dir") == ".git"
    assert gitutil.run(repo, "rev-parse", "--git-dir", strip_newline_in_stdout=False) == ".git\n"
    assert gitutil.run(repo, "rev-parse", "--git-dir", stdout_as_string=False) == b".git"
    status, out, said = gitutil.run(repo, "checkout", "--detach", with_extended_output=True)
    assert (status, out) == (0, "") and said.startswith("HEAD is now at ")
    assert not said.endswith("\n")
    message = tmp_path / "message"
    message.write_text("from standard input\n")
    with message.open("rb") as handle:
        made = gitutil.run(
            repo,
            "commit-tree",
            "HEAD^{tree}",
            env=gitutil.commit_env("a", "a@b.invalid", "@0 +0000"),
            istream=handle,
        )
    assert gitutil.run(repo, "cat-file", "commit", made).endswith("\n\nfrom standard input")
