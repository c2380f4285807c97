"""Applying a series to a work tree: one commit per patch, and a report.

Each patch is, in order: recognised as already upstream (its declared probe
finds the feature, or it reverse-applies cleanly), applied with ``git am`` (no
fuzz; offsets are fine), applied with a 3-way merge against its series base, or
reported as failed with the file and hunk.  Commits are made with the patch's
own author and date as committer too, so re-applying the same series to the
same base gives the same commit ids: that is how a second run knows it changed
nothing.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import re
from pathlib import Path

import git
from packaging.version import Version

from . import cache, gitutil, probes, trees
from .errors import MoePatchError, PatchFormatError, StateError
from .patchfile import Patch
from .report import (
    APPLIED,
    APPLIED_3WAY,
    FAILED,
    NOT_ATTEMPTED,
    UPSTREAM,
    ApplyReport,
    PatchOutcome,
)
from .series import Series
from .treelock import git_dir, target_lock

STATE_FILE = "moe-patch-state.json"
_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")
_DOES_NOT_EXIST = re.compile(r"error: (.+): (does not exist in index|No such file or directory)")


def branch_name(version: str) -> str:
    return f"moe-patch/v{version}"


def read_applied(tree: Path) -> dict:
    try:
        return json.loads((git_dir(tree) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_applied(tree: Path, state: dict) -> None:
    data = (json.dumps(state, indent=1, sort_keys=True) + "\n").encode()
    cache.write_atomic(git_dir(tree) / STATE_FILE, data)  # a kill never leaves half a file


def _identity(patch: Patch) -> dict[str, str]:
    name, address = email.utils.parseaddr(patch.author)
    if not address:
        raise PatchFormatError(f"patch {patch.path.name} has no valid From: author")
    return gitutil.commit_env(name or address, address, patch.date)


def check_symlinks(tree: Path, base: str, patches: list[Patch]) -> None:
    """Refuse patches that would write through a symbolic link in the base tree."""
    prefixes = set()
    for patch in patches:
        for path in patch.files:
            parts = path.split("/")
            prefixes.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    if not prefixes:
        return
    listing = gitutil.run(tree, "ls-tree", "--full-tree", base, "--", *sorted(prefixes))
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        if meta.startswith("120000"):
            owner = next(
                p for p in patches if any(f == path or f.startswith(path + "/") for f in p.files)
            )
            raise PatchFormatError(
                f"patch {owner.path.name} touches {path!r}, a symbolic link in the tree "
                "that could lead outside it; refused"
            )


def apply_check(tree: Path, patch: Patch, *extra: str) -> str | None:
    """None if ``git apply --check`` accepts the patch, else git's error output."""
    try:
        gitutil.run(tree, "apply", "--check", *extra, str(patch.path))
        return None
    except git.GitCommandError as exc:
        return str(exc.stderr or exc)


def where_it_fails(patch: Patch, errors: str) -> str:
    match = _FAILED_AT.search(errors)
    if match:
        path, line = match.group(1), int(match.group(2))
        for hunk in patch.hunks:
            if hunk.path == path and hunk.source_start == line:
                return f"{path}: hunk {hunk.number} {hunk.header} does not apply"
        return f"{path}: hunk at line {line} does not apply"
    match = _DOES_NOT_EXIST.search(errors)
    if match:
        return f"{match.group(1)}: file does not exist in this tree"
    return gitutil.last_words(errors) or "does not apply"


def am(tree: Path, patch: Patch, three_way: bool) -> bool:
    # --keep: export writes subjects without a "[PATCH]" prefix (format-patch -k), so
    # mailinfo must not "clean" them either (it would eat a subject like ":").
    args = ["am", "-q", "--keep", "--committer-date-is-author-date", "--keep-cr"]
    if three_way:
        args.append("-3")
    identity = _identity(patch)
    try:
        gitutil.run(tree, *args, str(patch.path), env=identity)
        return True
    except git.GitCommandError:
        # --abort resets HEAD and writes a reflog entry: with no identity configured, git
        # would refuse it and leave the tree in the middle of the am.
        with contextlib.suppress(git.GitCommandError):
            gitutil.run(tree, "am", "--abort", env=identity)
        return False


def fetch_base_objects(
    tree: Path, series_base: str, index_url: str | None, patches: list[Patch] = ()
) -> bool:
    """Bring the blobs ``git am -3`` merges against into ``tree``: the series base
    release's, and those its ``patches`` make on it in turn.

    A patch's ``index`` line names the file as the patches before it left it on the
    base; when two patches change one file, the second one's preimage exists only
    once the first has been applied to the base."""
    try:
        trees.fetch_release(
            tree, series_base, f"refs/tags/{trees.release_tag(series_base)}", index_url
        )
    except (MoePatchError, git.GitCommandError):  # no base: no 3-way fallback
        return False
    _write_series_blobs(tree, patches)
    return True


def _write_series_blobs(tree: Path, patches: list[Patch]) -> None:
    """Apply ``patches`` to the fetched base in a scratch index (never the user's
    index or files): ``git apply --cached`` stores every postimage blob."""
    if not patches:
        return
    with cache.scratch("index") as scratch:
        env = {"GIT_INDEX_FILE": str(scratch / "index")}
        gitutil.run(tree, "read-tree", "FETCH_HEAD", env=env)
        for patch in patches:
            try:
                gitutil.run(tree, "apply", "--cached", str(patch.path), env=env)
            except git.GitCommandError:  # later patches would not find their preimages
                return


def apply_series(
    tree: Path,
    base: str,
    version: str,
    series: Series,
    only: list[str] | None = None,
    index_url: str | None = None,
) -> ApplyReport:
    """Apply ``series`` (or the ``only`` patches of it) on ``base`` in ``tree``."""
    patches = series.select(only)
    branch = branch_name(version)
    report = ApplyReport(
        vllm=version, series_base=series.base, tree=str(tree), branch=branch, base_commit=base
    )
    repo = gitutil.open_repo(tree)
    with target_lock(tree):
        state = read_applied(tree)
        running = state.get("running") or {}
        if running:
            _recover_interrupted(tree)
        gitutil.require_clean(repo, "target tree")
        previous = _branch_head(tree, branch)
        ours = {state.get("heads", {}).get(branch), running.get("from"), running.get("to")}
        if previous and previous not in ours:
            raise StateError(
                f"branch {branch} in {tree} has commits moe-patch did not make; "
                "move them to another branch or delete it, then run again"
            )
        check_symlinks(tree, base, patches)
        for patch in patches:
            for declaration in patch.trailer_values("Upstream-Probe"):
                probes.parse(declaration, patch.path.name)

        if not running:
            _refuse_unsaved_detached_head(tree, base)
        _write_applied(tree, {**state, "running": {"branch": branch, "from": previous}})
        gitutil.run(tree, "checkout", "-q", "--detach", base)
        fetched_base = Version(series.base) == Version(version)
        failed = False
        for patch in patches:
            outcome = PatchOutcome(
                patch.id, patch.subject, NOT_ATTEMPTED, upstream_status=patch.upstream_status
            )
            report.outcomes.append(outcome)
            if failed:
                continue
            upstream = upstream_evidence(tree, patch)
            if upstream:
                outcome.status, outcome.detail = UPSTREAM, upstream
                continue
            errors = apply_check(tree, patch)
            if errors is None and am(tree, patch, three_way=False):
                outcome.status = APPLIED
            else:
                if not fetched_base:
                    fetched_base = fetch_base_objects(tree, series.base, index_url, series.patches)
                if fetched_base and am(tree, patch, three_way=True):
                    outcome.status = APPLIED_3WAY
                else:
                    outcome.status, failed = FAILED, True
                    outcome.detail = where_it_fails(patch, errors or apply_check(tree, patch) or "")
                    continue
            outcome.commit = gitutil.run(tree, "rev-parse", "HEAD")

        head = gitutil.run(tree, "rev-parse", "HEAD")
        report.head = head
        report.unchanged = previous == head
        heads = {**state.get("heads", {})}
        heads[branch] = head
        done = {"heads": heads, "bases": {**state.get("bases", {}), branch: base}}
        # A kill between these two writes leaves "running" set with both heads known.
        _write_applied(tree, {**done, "running": {"branch": branch, "from": previous, "to": head}})
        gitutil.run(tree, "checkout", "-q", "-B", branch, head)
        _write_applied(tree, done)
    return report


def _recover_interrupted(tree: Path) -> None:
    """Undo what a killed run left half-done (its ``git am``, its uncommitted files);
    its commits stay reachable from the state file, and the run starts over."""
    repo_dir = git_dir(tree)
    if (repo_dir / "rebase-apply").exists():
        with contextlib.suppress(git.GitCommandError):
            gitutil.run(
                tree, "am", "--abort", env=gitutil.commit_env(*trees.IDENTITY, "@315532800 +0000")
            )
    gitutil.run(tree, "reset", "-q", "--hard")


def _refuse_unsaved_detached_head(tree: Path, base: str) -> None:
    """Refuse to move a detached HEAD that holds commits no branch or tag has."""
    try:
        gitutil.run(tree, "symbolic-ref", "-q", "HEAD")
        return  # on a branch: checking out base loses nothing
    except git.GitCommandError:
        pass
    head = gitutil.run(tree, "rev-parse", "HEAD")
    if head == base or not gitutil.run(
        tree, "rev-list", "-n", "1", "HEAD", "--not", "--branches", "--tags"
    ):
        return
    raise StateError(
        f"HEAD of {tree} is detached at {head[:12]} with commits on no branch; "
        "save them with git switch -c NAME, then run again"
    )


def recorded_base(tree: Path, version: str) -> str | None:
    return read_applied(tree).get("bases", {}).get(branch_name(version))


def _branch_head(tree: Path, branch: str) -> str | None:
    try:
        return gitutil.run(tree, "rev-parse", "-q", "--verify", f"refs/heads/{branch}")
    except git.GitCommandError:
        return None


def upstream_evidence(tree: Path, patch: Patch) -> str | None:
    for declaration in patch.trailer_values("Upstream-Probe"):
        result = probes.run(declaration, tree, patch.path.name)
        if result.found:
            return f"probe: {result.detail}"
    if apply_check(tree, patch, "-R") is None:
        return "the tree already contains this change (it reverse-applies cleanly)"
    return None
