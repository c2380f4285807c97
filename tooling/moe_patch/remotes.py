"""Where ``moe-patch pr``'s branches go: the clone's remotes, read, and the commands to run.

The upstream remote is the one whose URL is GitHub's vllm-project/vllm (any name: ``origin``
in a clone of upstream, ``upstream`` beside a fork).  The fork is the first other remote on
github.com, and its owner is the GitHub user for ``gh pr create --head USER:BRANCH``.  What
the clone lacks is added by the commands printed first (``git remote add``; ``gh repo fork``
where there is no fork), and a user ``pr`` cannot read from a remote is asked of ``gh`` in
the command itself (``$(gh api user --jq .login)``), so every command runs as printed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import git

from . import gitutil

UPSTREAM_REPO = "vllm-project/vllm"
UPSTREAM_URL = f"https://github.com/{UPSTREAM_REPO}.git"
GH_USER = "$(gh api user --jq .login)"  # the signed-in GitHub user, asked of gh when run
_GITHUB = re.compile(
    r"github\.com[:/]+([A-Za-z0-9][A-Za-z0-9-]*)/([A-Za-z0-9._-]+?)(?:\.git)?/*$", re.IGNORECASE
)


@dataclass
class Remotes:
    upstream: str | None = None  # the remote that is vllm-project/vllm
    fork: str | None = None  # the remote to push to
    user: str | None = None  # the GitHub user that owns the fork
    names: set[str] = field(default_factory=set)


def read(repo: Path) -> Remotes:
    found = Remotes()
    try:
        listing = gitutil.run(repo, "remote", "-v").splitlines()
    except git.GitCommandError:
        listing = []
    for line in listing:
        parts = line.split()
        if len(parts) < 3:
            continue
        name, url, kind = parts[0], parts[1], parts[2]
        found.names.add(name)
        owner = _GITHUB.search(url)
        if owner is None:
            continue
        if f"{owner.group(1)}/{owner.group(2)}".lower() == UPSTREAM_REPO:
            if kind == "(fetch)" and found.upstream is None:
                found.upstream = name
        elif kind == "(push)" and found.fork is None:
            found.fork, found.user = name, owner.group(1)
    return found


def _free(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}{n}", n + 1
    return candidate


@dataclass
class Plan:
    setup: list[str]  # once, before the branches' commands
    upstream: str  # the upstream remote's name, existing or to be added
    fork: str
    head_owner: str  # a GitHub user, or GH_USER's command substitution


def plan(repo: Path, needs_main: bool) -> Plan:
    """The remotes the commands use, and the commands that add what is missing."""
    remotes = read(repo)
    where = shlex.quote(str(repo))
    setup = []
    upstream = remotes.upstream
    if upstream is None:
        upstream = _free("upstream", remotes.names)
        remotes.names.add(upstream)
        setup.append(f"git -C {where} remote add {upstream} {UPSTREAM_URL}")
    if needs_main:
        setup.append(f"git -C {where} fetch {upstream} main")
    fork, owner = remotes.fork, remotes.user
    if fork is None:
        fork = _free("fork", remotes.names)
        setup += [
            f"gh repo fork {UPSTREAM_REPO} --clone=false",
            f'git -C {where} remote add {fork} "https://github.com/{GH_USER}/vllm.git"',
        ]
        owner = GH_USER
    return Plan(setup, upstream, fork, owner or GH_USER)
