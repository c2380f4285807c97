"""Thin helpers over GitPython for the few git operations moe-patch needs."""

from __future__ import annotations

import os
from pathlib import Path

import git

from .errors import StateError, UsageError

# A fixed identity and environment so that commits made by moe-patch are
# reproducible byte for byte (same tree + same patch -> same commit id).
_QUIET_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


# No automatic gc / maintenance after our commands: git would detach it into the
# background, where it repacks a tree moe-patch may be removing (rebase --abort
# failed with ENOENT that way) and spends the user's CPU after we have returned.
_NO_AUTO_MAINTENANCE = (("gc.auto", "0"), ("maintenance.auto", "false"))


# moe-patch commits patches into trees it made: the user's hooks, signing and line-ending
# conversion must neither fail those commits nor change what they hold.
_OWN_COMMITS = (
    ("core.hooksPath", os.devnull),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("core.autocrlf", "false"),
    ("core.fsmonitor", "false"),
)

# Variables that point git at another repository, index or object store (git's own list,
# ``git rev-parse --local-env-vars``, less the explicit ``-c`` / GIT_CONFIG_COUNT settings,
# which stay and come before moe-patch's own).  A git hook or wrapper sets them; they must
# not steer the commands moe-patch runs in the trees it names.
_REPOSITORY_VARIABLES = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_OBJECT_DIRECTORY",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
)


def without_repository_variables(env: dict[str, str]) -> dict[str, str]:
    """``env`` less the variables that would make git work on another repository."""
    return {key: value for key, value in env.items() if key not in _REPOSITORY_VARIABLES}


def isolate_process() -> None:
    """Drop those variables from this process too: GitPython's own git calls inherit it."""
    for key in _REPOSITORY_VARIABLES:
        os.environ.pop(key, None)


def _with_config(env: dict[str, str], pairs) -> dict[str, str]:
    """Add ``pairs`` through GIT_CONFIG_COUNT/KEY/VALUE, after any the caller set."""
    count = int(env.get("GIT_CONFIG_COUNT") or 0)
    for key, value in pairs:
        env[f"GIT_CONFIG_KEY_{count}"] = key
        env[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    env["GIT_CONFIG_COUNT"] = str(count)
    return env


def run(cwd: Path | str, *args: str, env: dict[str, str] | None = None, **kwargs) -> str:
    """``git ARGS`` in ``cwd``; raises :class:`git.GitCommandError` on failure."""
    full_env = without_repository_variables(dict(os.environ))
    full_env.update(_QUIET_ENV)
    if env:
        full_env.update(env)
    _with_config(full_env, _NO_AUTO_MAINTENANCE + _OWN_COMMITS)
    return git.Git(str(cwd)).execute(["git", *args], env=full_env, **kwargs)


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{path} is not a git repository") from None


def is_dirty(repo: git.Repo) -> bool:
    """Tracked files modified or staged (untracked files are the user's own business)."""
    return repo.is_dirty(index=True, working_tree=True, untracked_files=False)


def require_clean(repo: git.Repo, what: str) -> None:
    if is_dirty(repo):
        raise StateError(
            f"{what} {repo.working_tree_dir} has uncommitted changes; "
            "commit or stash them first (moe-patch changed nothing)"
        )
    git_dir = Path(repo.git_dir)
    for marker in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD"):
        if (git_dir / marker).exists():
            raise StateError(
                f"{what} {repo.working_tree_dir} is in the middle of a git "
                f"{marker.split('-')[0].split('_')[0].lower()}; finish or abort it first"
            )


def last_words(output: str) -> str | None:
    """The last non-empty line of git's output, without GitPython's ``stderr: '…'`` wrapping
    (None when git said nothing)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    return lines[-1].removeprefix("stderr:").strip().strip("'")


def commit_env(name: str, email: str, date: str) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }
