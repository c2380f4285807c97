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
import os
import re
from pathlib import Path

import git
from packaging.version import Version

from . import cache, gitutil, probes, trees, ui
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
from .treelock import common_dir, git_dir, target_lock

STATE_FILE = "moe-patch-state.json"  # a tree apply made
CHECKOUT_RECORD = "moe-patch-workflow.json"  # a tree checkout or rebase made (workflow.py)
_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")
_DOES_NOT_EXIST = re.compile(r"error: (.+): (does not exist in index|No such file or directory)")


def branch_name(version: str) -> str:
    return f"moe-patch/v{version}"


def read_applied(tree: Path) -> dict:
    return _read_record(git_dir(tree) / STATE_FILE)


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_applied(tree: Path, state: dict) -> None:
    state = {**state, "tree": str(tree)}  # the evidence that this tree is moe-patch's
    data = (json.dumps(state, indent=1, sort_keys=True) + "\n").encode()
    cache.write_atomic(git_dir(tree) / STATE_FILE, data)  # a kill never leaves half a file


def record_made(tree: Path, final: Path, version: str, base: str) -> None:
    """Mark a tree this run made for ``version`` (on release commit ``base``) as moe-patch's,
    before it is renamed to ``final``: a run killed before its first patch still finds the
    tree its own."""
    data = {"tree": str(final), "bases": {branch_name(version): base}}
    text = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    cache.write_atomic(tree / ".git" / STATE_FILE, text)


def _same_dir(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# --- whose tree is it ---------------------------------------------------------------


def owned_base(tree: Path, version: str, source: Path | None = None) -> str:
    """The release commit of ``tree``, if it is a tree moe-patch made for ``version``.

    The evidence is what moe-patch wrote and can check: its state record in the tree's git
    directory names this very tree (records of earlier moe-patch versions name none) and the
    release commit it was made from, which the tree holds.  Any other tree is the user's
    (a clone of their own, a worktree, a --source): a :class:`StateError` that says what to
    do, and nothing is changed."""
    gitutil.open_repo(tree)  # a git tree at all, else a usage error
    record = read_applied(tree)
    named = record.get("tree")
    base = record.get("bases", {}).get(branch_name(version))
    if source is not None and _same_dir(source, tree):
        raise StateError(
            f"--source and --into are both {tree}: moe-patch patches a copy of --source in a "
            "new --into, or the checkout itself on a new branch with --in-place"
        )
    if named is not None and not _same_dir(named, tree):
        raise StateError(
            f"{tree} holds the record of the tree moe-patch made at {named} (it was moved or "
            "copied); move it back, or give a new --into"
        )
    if base and _has_commit(tree, base):
        return base
    if record.get("bases") and named is not None:
        made = ", ".join(sorted(b.removeprefix("moe-patch/v") for b in record["bases"]))
        raise StateError(
            f"{tree} is the tree moe-patch made for vLLM {made}; give another --into for "
            f"vLLM {version}"
        )
    if (git_dir(tree) / CHECKOUT_RECORD).is_file():
        raise StateError(
            f"{tree} is a tree for editing the series (moe-patch checkout or rebase), not one "
            "apply made; give apply another --into"
        )
    main = _main_worktree(tree)
    if main is not None and read_applied(main).get("tree"):
        raise StateError(
            f"{tree} is a git worktree of {main}, which moe-patch made; apply --into {main}, "
            f"or patch this worktree on a new branch with --source {tree} --in-place"
        )
    raise StateError(
        f"{tree} is a git checkout moe-patch did not make; give another --into, or patch it "
        f"on a new branch with --source {tree} --in-place"
    )


def _has_commit(tree: Path, commit: str) -> bool:
    try:
        gitutil.run(tree, "cat-file", "-e", f"{commit}^{{commit}}")
        return True
    except git.GitCommandError:
        return False


def _worktrees(tree: Path) -> list[tuple[Path, str | None]]:
    """Every work tree of ``tree``'s repository, the main one first, with its branch."""
    listing = gitutil.run(tree, "worktree", "list", "--porcelain")
    found: list[tuple[Path, str | None]] = []
    for block in listing.split("\n\n"):
        fields = dict(line.split(" ", 1) for line in block.splitlines() if " " in line)
        if "worktree" in fields:
            found.append((Path(fields["worktree"]), fields.get("branch")))
    return found


def _main_worktree(tree: Path) -> Path | None:
    """The main work tree of the repository ``tree`` is a linked worktree of (else None)."""
    if common_dir(tree) == git_dir(tree):
        return None
    found = _worktrees(tree)
    return found[0][0] if found else None


def _heads_made(tree: Path) -> set[str]:
    """The branch heads moe-patch recorded in any work tree of ``tree``'s repository: refs
    are shared by all of them, so a branch made in one is moe-patch's in the others too."""
    common = common_dir(tree)
    records = [common / STATE_FILE, *sorted(common.glob(f"worktrees/*/{STATE_FILE}"))]
    heads: set[str] = set()
    for path in records:
        record = _read_record(path)
        heads.update(v for v in record.get("heads", {}).values() if isinstance(v, str))
        running = record.get("running") or {}
        heads.update(running[k] for k in ("from", "to") if isinstance(running.get(k), str))
    return heads


def _refuse_branch_of_another_worktree(tree: Path, branch: str) -> None:
    for path, checked_out in _worktrees(tree):
        if checked_out == f"refs/heads/{branch}" and not _same_dir(path, tree):
            raise StateError(
                f"branch {branch} is checked out in {path}, another work tree of {tree}'s "
                f"repository; apply --into {path}, or switch that tree to another branch"
            )


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
    return _diff_check(tree, patch.path, *extra)


def _diff_check(tree: Path, diff: Path, *extra: str) -> str | None:
    try:
        gitutil.run(tree, "apply", "--check", *extra, str(diff))
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
        if previous and previous not in ours | _heads_made(tree):
            raise StateError(
                f"branch {branch} in {tree} has commits moe-patch did not make; "
                "move them to another branch or delete it, then run again"
            )
        _refuse_branch_of_another_worktree(tree, branch)
        was_on = running.get("was_on") if running else _current_branch(tree)
        check_symlinks(tree, base, patches)
        for patch in patches:
            for declaration in patch.trailer_values("Upstream-Probe"):
                probes.parse(declaration, patch.path.name)

        if not running:
            _refuse_unsaved_detached_head(tree, base)
        _write_applied(
            tree, {**state, "running": {"branch": branch, "from": previous, "was_on": was_on}}
        )
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
        _write_applied(
            tree,
            {**done, "running": {"branch": branch, "from": previous, "to": head, "was_on": was_on}},
        )
        gitutil.run(tree, "checkout", "-q", "-B", branch, head)
        _write_applied(tree, done)
    if was_on and was_on != branch:
        ui.info(
            f"{tree}: switched from branch {was_on} to {branch} (git switch {was_on} goes back)"
        )
    return report


def _current_branch(tree: Path) -> str | None:
    try:
        return gitutil.run(tree, "symbolic-ref", "-q", "--short", "HEAD")
    except git.GitCommandError:  # detached
        return None


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
    made = _commit_made_for(tree, patch)
    if made and _reverse_applies(tree, made):
        return (
            f"the tree already contains this change as commit {made[:12]} made it "
            "(a 3-way merge; its diff reverse-applies cleanly)"
        )
    return None


_OWN_HISTORY = 64  # commits of HEAD's first-parent history searched for an earlier run's


def _commit_made_for(tree: Path, patch: Patch) -> str | None:
    """The commit an earlier run made for ``patch`` near HEAD (same author, date and
    subject: commits are made with the patch's own), if any.

    A patch merged 3-way differs from what it became on the tree, so its own reverse may
    not apply where the commit's does."""
    address = email.utils.parseaddr(patch.author)[1]
    try:
        when = int(email.utils.parsedate_to_datetime(patch.date).timestamp())
    except (TypeError, ValueError):
        return None
    try:
        log = gitutil.run(
            tree, "log", "--first-parent", f"-n{_OWN_HISTORY}", "--format=%H%x00%ae%x00%at%x00%s"
        )
    except git.GitCommandError:  # no commits yet
        return None
    for line in log.splitlines():
        commit, author, at, subject = line.split("\0", 3)
        if author == address and at == str(when) and subject == patch.subject:
            return commit
    return None


def _reverse_applies(tree: Path, commit: str) -> bool:
    with cache.scratch("diff") as scratch:
        diff = scratch / "commit.diff"
        try:
            made = gitutil.run(
                tree, "diff-tree", "-p", "--binary", "--no-color", f"{commit}^", commit
            )
        except git.GitCommandError:  # no parent
            return False
        diff.write_text(made + "\n")
        return _diff_check(tree, diff, "-R") is None
