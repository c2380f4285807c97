"""``moe-patch rebase``: carry a series to another vLLM release, patch by patch.

The series for base ``FROM`` is committed on release ``FROM`` (exactly, as in
``checkout``), then each commit is cherry-picked onto release ``ONTO`` with git's
3-way merge.  Each patch ends as one of:

``clean``                       the patch applies as it was (only blob ids change)
``refreshed``                   it applies after its context moved or changed; the new
                                patch file carries the new context
``dropped (already upstream)``  ``ONTO`` already has the change (the patch's probe finds
                                it, the patch reverse-applies, or the merge is empty); the
                                old patch file records ``Applied-Upstream: ONTO``
``dropped (skipped)``           the developer skipped it with ``--skip``
``conflict``                    the merge needs a human: the rebase stops like ``git
                                rebase``, with conflict markers in the tree; resolve,
                                ``git add``, then ``--continue`` (or ``--skip`` / ``--abort``)

When every patch is done, the new series is written to ``patches/vONTO/`` (beside the
old one, which stays) and a ``git range-diff`` of the old series against the new one is
returned.  The state of a rebase in progress lives in ``.git/moe-patch-rebase/``.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git
from packaging.version import Version

from . import (
    applier,
    cache,
    export,
    gitutil,
    index,
    patchfile,
    series,
    sources,
    treelock,
    trees,
    ui,
    workflow,
)
from .errors import MoePatchError, RebaseStopped, StateError, UsageError
from .pipconfig import index_settings
from .settings import Settings, require_writable

STATE_DIR = "moe-patch-rebase"
CLEAN = "clean"
REFRESHED = "refreshed"
DROPPED_UPSTREAM = "dropped (already upstream)"
DROPPED_SKIPPED = "dropped (skipped)"
CONFLICT = "conflict"
PENDING = "pending"
BASE_REF = "refs/moe-patch/base"
_MARKER = re.compile(r"^(<{7}|>{7})( |$)", re.MULTILINE)


@dataclass
class Step:
    id: str
    name: str  # file name in the series
    old_commit: str
    result: str = PENDING
    detail: str = ""
    commit: str | None = None
    applied_upstream: str | None = None  # the release recorded as Applied-Upstream


@dataclass
class RebaseState:
    onto: str
    base: str  # the series base being carried ("--from")
    tree: str
    series_root: str
    onto_commit: str
    base_commit: str
    old_head: str
    steps: list[Step]
    current: int = 0  # index of the step being worked on
    conflicts: list[str] = field(default_factory=list)
    stopped_head: str | None = None


@dataclass
class RebaseResult:
    state: RebaseState
    done: bool
    series_dir: str | None = None
    range_diff: str = ""
    recorded: list[dict] = field(default_factory=list)  # {path, version}: Applied-Upstream added


def _state_dir(tree: Path) -> Path:
    return applier.git_dir(tree) / STATE_DIR


def _save(state: RebaseState) -> None:
    path = _state_dir(Path(state.tree)) / "state.json"
    cache.write_atomic(path, (json.dumps(asdict(state), indent=1) + "\n").encode())


def _load(tree: Path) -> RebaseState:
    data = json.loads((_state_dir(tree) / "state.json").read_text())
    data["steps"] = [Step(**s) for s in data["steps"]]
    return RebaseState(**data)


def in_progress(tree: Path) -> bool:
    try:
        return (_state_dir(tree) / "state.json").is_file()
    except (MoePatchError, git.GitCommandError):
        return False


def find_tree(into: Path | None) -> Path:
    """The tree of the rebase in progress: ``into``, the git tree around the current
    directory, or the one sub-directory of it that holds a rebase."""
    if into is not None:
        tree = into.expanduser().absolute()
        if not in_progress(tree):
            raise UsageError(f"no moe-patch rebase is in progress in {tree}")
        return tree
    here = Path.cwd()
    try:
        top = Path(gitutil.run(here, "rev-parse", "--show-toplevel"))
        if in_progress(top):
            return top
    except git.GitCommandError:
        pass
    found = [p for p in sorted(here.iterdir()) if (p / ".git").is_dir() and in_progress(p)]
    if len(found) == 1:
        return found[0].absolute()
    if found:
        raise UsageError(
            f"several rebases are in progress here ({', '.join(p.name for p in found)}); "
            "say which with --into DIR"
        )
    raise UsageError("no moe-patch rebase is in progress here; start one with --onto VERSION")


# --- starting -----------------------------------------------------------------------


def start(
    onto: str,
    base: str | None = None,
    into: Path | None = None,
    source: Path | None = None,
    git_url: str | None = None,
    settings: Settings | None = None,
    any_base: bool = False,
) -> RebaseResult:
    """Carry the series for ``base`` (default: the newest base older than ``onto``) onto
    release ``onto``; stops with :class:`RebaseStopped` at the first conflict."""
    if source and git_url:
        raise UsageError("give either --source or --git, not both")
    settings = settings or Settings.resolve()
    root, index_url = settings.series_root, settings.index_url
    require_writable(root, "rebase")
    known = series.bases(root)
    if base is None:
        older = [b for b in known if Version(b) < Version(onto)]
        if not older:
            raise UsageError(
                f"no series older than {onto} to carry forward; name one with --from "
                f"(bases: {', '.join(known) or 'none'})"
            )
        base = older[-1]
    elif base not in known:
        raise UsageError(f"there is no series for base {base}; bases: {', '.join(known) or 'none'}")
    if Version(base) == Version(onto):
        raise UsageError(f"the series is already based on {onto}; rebase it onto another release")
    into = (into or Path.cwd() / f"vllm-{onto}-rebase").expanduser().absolute()
    if (into / ".git").is_dir():
        again = _run_again(into, onto, base)
        if again is not None:
            return again
    target = root / f"v{onto}"
    if target.exists():
        raise UsageError(
            f"{target} already exists; remove it to rebase again, or edit it with checkout/export"
        )
    old = series.load(base, root)
    if (into / ".git" / STATE_DIR).is_dir() and _read_done(into) is None:
        shutil.rmtree(into)  # a run killed while it set the tree up
    if into.exists() and any(into.iterdir()):
        raise UsageError(f"{into} exists and is not empty; choose another --into")

    existed = into.exists()

    def mark(tree: Path) -> None:  # the tree is this rebase's until state.json exists
        _state_dir(tree).mkdir()

    if source:
        source = source.expanduser().absolute()
        sources.check_vllm_tree(source)
        sources.warn_version_mismatch(sources.detect_version(source), onto, source)
        sources.check_is_release(source, onto, any_base, index_url)
        work = sources.from_local(source, into, False, onto, mark=mark)
    elif git_url:
        work = sources.from_git_url(onto, into, git_url, mark=mark)
    else:
        work = sources.from_cache(onto, into, index_url, mark=mark)
    try:
        tree = work.path
        trees.fetch_release(
            tree, base, f"+refs/tags/{trees.release_tag(base)}:{BASE_REF}", index_url
        )
        base_commit = gitutil.run(tree, "rev-parse", BASE_REF)
        applier.check_symlinks(tree, base_commit, old.patches)
        applier.check_symlinks(tree, work.base, old.patches)
        commits = workflow.commit_series(tree, base_commit, old.patches)
        old_head = commits[-1] if commits else base_commit
        gitutil.run(tree, "branch", "-q", "-f", applier.branch_name(base), old_head)
        gitutil.run(tree, "checkout", "-q", "-B", applier.branch_name(onto), work.base)
        state = RebaseState(
            onto=onto,
            base=base,
            tree=str(tree),
            series_root=str(root),
            onto_commit=work.base,
            base_commit=base_commit,
            old_head=old_head,
            steps=[Step(p.id, p.path.name, c) for p, c in zip(old.patches, commits, strict=True)],
        )
        keep = _state_dir(tree) / "old"
        keep.mkdir(parents=True)
        for patch in old.patches:
            shutil.copyfile(patch.path, keep / patch.path.name)
        _save(state)
    except BaseException:
        shutil.rmtree(work.path, ignore_errors=True)
        if existed:
            into.mkdir(exist_ok=True)
        raise
    return _run(state)


def _run_again(into: Path, onto: str, base: str) -> RebaseResult | None:
    """The same ``rebase --onto`` run again on ``into``: it goes on with the rebase a killed
    run left there, or reports the one that finished (if the tree and the new series are
    still what it made); None when ``into`` holds neither."""
    if in_progress(into):
        state = _load(into)
        stopped = state.current < len(state.steps) and state.steps[state.current].result == CONFLICT
        if stopped or (state.onto, state.base) != (onto, base):
            raise StateError(
                f"a moe-patch rebase is already in progress in {into} (stopped or interrupted); "
                f"run moe-patch rebase --continue --into {into} (or --abort --into {into})"
            )
        ui.info(f"going on with the rebase onto vLLM {onto} that a run left in {into}")
        return continue_(into)
    done = _read_done(into)
    if done is None or (done.state.onto, done.state.base) != (onto, base):
        return None
    with treelock.target_lock(into):  # and what a run killed at its very end left
        shutil.rmtree(_state_dir(into), ignore_errors=True)
        target = Path(done.series_dir)
        if not target.is_dir():
            return None  # removed since, to rebase again: the caller says where
        present = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
        if present != _series_files(into, done.state):
            return None  # edited since: the caller says that the new series exists
    ui.info(f"the rebase onto vLLM {onto} in {into} is done; nothing left to do")
    return done


# --- the loop -----------------------------------------------------------------------


def _run(state: RebaseState) -> RebaseResult:
    tree = Path(state.tree)
    with treelock.target_lock(tree):
        while state.current < len(state.steps):
            step = state.steps[state.current]
            _replay(state, step)
            if step.result == CONFLICT:
                _save(state)
                stopped = RebaseStopped(_stop_message(state, step))
                stopped.state = state
                raise stopped
            state.current += 1
            _save(state)
        return _finish(state)


def _old_patch(state: RebaseState, step: Step) -> patchfile.Patch:
    return patchfile.read(_state_dir(Path(state.tree)) / "old" / step.name)


def _replay(state: RebaseState, step: Step) -> None:
    tree = Path(state.tree)
    old = _old_patch(state, step)
    evidence = applier.upstream_evidence(tree, old)
    if evidence:
        step.result, step.detail = DROPPED_UPSTREAM, evidence
        step.applied_upstream = first_release_with(old, state.base, state.onto)
        return
    try:
        gitutil.run(tree, "cherry-pick", "--no-commit", step.old_commit)
    except git.GitCommandError:
        conflicts = gitutil.run(tree, "diff", "--name-only", "--diff-filter=U").splitlines()
        if not conflicts:
            gitutil.run(tree, "reset", "-q", "--hard", "HEAD")
            raise StateError(
                f"git could not replay {step.name} on {state.onto} "
                f"({applier.where_it_fails(old, '')}); the rebase is stopped: --abort"
            ) from None
        step.result, state.conflicts = CONFLICT, conflicts
        state.stopped_head = gitutil.run(tree, "rev-parse", "HEAD")
        step.detail = f"merge conflict in {', '.join(conflicts)}"
        return
    _commit_step(state, step, resolved=False)


def first_release_with(patch: patchfile.Patch, base: str, onto: str) -> str:
    """The first release after ``base`` (up to ``onto``) that has ``patch``'s change, as
    far as the cached release trees tell (the DEP-3 meaning of ``Applied-Upstream``)."""
    try:
        listed = {d.version for d in index.distributions(index_settings(None))}
    except MoePatchError:
        return onto
    between = sorted((v for v in listed if Version(base) < Version(v) < Version(onto)), key=Version)
    for version in between:
        repo = trees.cached_repo(version)
        if repo is None:
            continue
        with cache.scratch("probe") as scratch:
            gitutil.run(scratch, "init", "-q")  # git apply works relative to this root
            for name in patch.files:
                try:
                    data = gitutil.run(
                        repo,
                        "show",
                        f"{trees.release_tag(version)}:{name}",
                        strip_newline_in_stdout=False,
                    )
                except git.GitCommandError:
                    continue
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                (scratch / name).write_text(data)
            if applier.upstream_evidence(scratch, patch):
                return version
    return onto


def _nothing_staged(tree: Path) -> bool:
    try:
        gitutil.run(tree, "diff", "--cached", "--quiet", "HEAD")
        return True
    except git.GitCommandError:
        return False


def _commit_step(state: RebaseState, step: Step, resolved: bool) -> None:
    tree = Path(state.tree)
    if _nothing_staged(tree):
        gitutil.run(tree, "reset", "-q", "--hard", "HEAD")
        step.result = DROPPED_UPSTREAM
        step.applied_upstream = first_release_with(_old_patch(state, step), state.base, state.onto)
        step.detail = f"after the 3-way merge nothing is left: vLLM {state.onto} has the change"
        return
    staged = gitutil.run(tree, "write-tree")
    head = gitutil.run(tree, "rev-parse", "HEAD")
    message = workflow.commit_message(tree, step.old_commit)
    if workflow.split_name_trailer(message)[1] is None:
        message = workflow.add_trailer(message, workflow.NAME_TRAILER, step.name)
    new = workflow.recommit(tree, step.old_commit, message, parent=head, tree_id=staged)
    gitutil.run(tree, "reset", "-q", "--soft", new)
    step.commit = new
    if resolved:
        step.result, step.detail = REFRESHED, "conflict resolved by hand"
    else:
        step.result, step.detail = _classify(state, step, new)


def _diff_part(data: bytes) -> list[str]:
    text = data.decode("utf-8", errors="replace")
    at = text.find("\ndiff --git ")
    return [line for line in text[at + 1 :].splitlines() if not line.startswith("index ")]


def _classify(state: RebaseState, step: Step, commit: str) -> tuple[str, str]:
    tree = Path(state.tree)
    old = (_state_dir(tree) / "old" / step.name).read_bytes()
    message = workflow.split_name_trailer(workflow.commit_message(tree, commit))[0]
    new = export.format_commit(tree, workflow.recommit(tree, commit, message))
    before, after = _diff_part(old), _diff_part(new)
    if before == after:
        return CLEAN, "applies as it was"
    if _without_hunk_headers(before) == _without_hunk_headers(after):
        old_starts = _HUNK_START.findall("\n".join(before))
        new_starts = _HUNK_START.findall("\n".join(after))
        moves = [
            f"hunk {i} line {a} -> {b}"
            for i, (a, b) in enumerate(zip(old_starts, new_starts, strict=True), 1)
            if a != b
        ]
        return REFRESHED, "context moved: " + (", ".join(moves) or "hunk headers changed")
    return REFRESHED, "context changed; merged 3-way"


def _without_hunk_headers(lines: list[str]) -> list[str]:
    return ["@@" if line.startswith("@@ ") else line for line in lines]


_HUNK_START = re.compile(r"^@@ -(\d+)", re.MULTILINE)


def _stop_message(state: RebaseState, step: Step) -> str:
    return (
        f"patch {step.id} conflicts with vLLM {state.onto} in {', '.join(state.conflicts)}; "
        f"resolve the markers in {state.tree}, git add the files, then "
        "moe-patch rebase --continue (or --skip, --abort)"
    )


# --- continue / skip / abort --------------------------------------------------------


def _stopped(tree: Path) -> RebaseState:
    state = _load(tree)
    if state.current >= len(state.steps) or state.steps[state.current].result != CONFLICT:
        raise StateError(f"the rebase in {tree} is not stopped at a conflict")
    return state


def continue_(into: Path | None = None) -> RebaseResult:
    tree = find_tree(into)
    with treelock.target_lock(tree):
        state = _load(tree)
        if state.current < len(state.steps):  # else only the finishing step was interrupted
            if state.steps[state.current].result != CONFLICT:
                _resume_interrupted(state)  # killed mid-step: redo that step
            else:
                _take_resolution(tree, _stopped(tree))
                state = _load(tree)
    return _run(state)


def _resume_interrupted(state: RebaseState) -> None:
    """Put the tree back where the last saved step left it (a killed run may have left a
    half-done cherry-pick or an unsaved commit); ``_run`` then redoes the current step."""
    done = [s.commit for s in state.steps[: state.current] if s.commit]
    gitutil.run(Path(state.tree), "reset", "-q", "--hard", done[-1] if done else state.onto_commit)
    step = state.steps[state.current]
    step.result, step.detail, step.commit, step.applied_upstream = PENDING, "", None, None


def _take_resolution(tree: Path, state: RebaseState) -> None:
    step = state.steps[state.current]
    present = [name for name in state.conflicts if (tree / name).is_file()]
    marked = [name for name in present if _MARKER.search((tree / name).read_text(errors="replace"))]
    if marked:
        raise StateError(f"{', '.join(marked)} still has conflict markers; resolve them first")
    if present:
        gitutil.run(tree, "add", "--", *present)
    unmerged = gitutil.run(tree, "diff", "--name-only", "--diff-filter=U").splitlines()
    if unmerged:
        raise StateError(f"{', '.join(unmerged)} still unmerged; resolve, git add, then --continue")
    head = gitutil.run(tree, "rev-parse", "HEAD")
    if head != state.stopped_head:  # the developer committed the resolution
        message = workflow.commit_message(tree, head)
        if workflow.split_name_trailer(message)[1] is None:
            message = workflow.add_trailer(message, workflow.NAME_TRAILER, step.name)
            gitutil.run(tree, "reset", "-q", "--soft", workflow.recommit(tree, head, message))
        step.commit = gitutil.run(tree, "rev-parse", "HEAD")
        step.result, step.detail = REFRESHED, "conflict resolved by hand"
    elif _nothing_staged(tree):
        raise StateError(
            f"nothing is staged for {step.id}; git add the resolution, or drop the patch with --skip"
        )
    else:
        _commit_step(state, step, resolved=True)
    state.current += 1
    state.conflicts, state.stopped_head = [], None
    _save(state)


def skip(into: Path | None = None) -> RebaseResult:
    tree = find_tree(into)
    with treelock.target_lock(tree):
        state = _stopped(tree)
        gitutil.run(tree, "reset", "-q", "--hard", state.stopped_head or "HEAD")
        step = state.steps[state.current]
        step.result, step.detail = DROPPED_SKIPPED, "left out of the new series by --skip"
        state.current += 1
        state.conflicts, state.stopped_head = [], None
        _save(state)
    return _run(state)


def abort(into: Path | None = None) -> RebaseState:
    """Give the rebase up: its tree is removed; the series directories were never touched."""
    tree = find_tree(into)
    with treelock.target_lock(tree):
        state = _load(tree)
        if Path(state.tree) != tree:
            raise StateError(f"the rebase state in {tree} names another tree; remove it by hand")
    doomed = sources.scratch_beside(tree)  # gone from its name at once: a kill leaves scratch
    tree.rename(doomed / tree.name)
    shutil.rmtree(doomed)
    return state


# --- finishing ----------------------------------------------------------------------


DONE_FILE = "moe-patch-rebase-done.json"  # in the git directory: what the finished rebase did


def _series_files(tree: Path, state: RebaseState) -> dict[str, bytes]:
    """The new series' files as ``tree``'s commits on ``ONTO`` export them."""
    exported = workflow.exported_series(tree, state.onto_commit)
    files = {i.name: i.data for i in exported}
    files[series.SERIES_FILE] = "".join(f"{i.name}\n" for i in exported).encode()
    return files


def _read_done(tree: Path) -> RebaseResult | None:
    try:
        data = json.loads((applier.git_dir(tree) / DONE_FILE).read_text())
        data["state"]["steps"] = [Step(**s) for s in data["state"]["steps"]]
        return RebaseResult(
            state=RebaseState(**data["state"]),
            done=True,
            series_dir=data["series_dir"],
            range_diff=data["range_diff"],
        )
    except (OSError, ValueError, KeyError, TypeError, git.GitCommandError):
        return None


def _finish(state: RebaseState) -> RebaseResult:
    tree = Path(state.tree)
    root = Path(state.series_root)
    target = root / f"v{state.onto}"
    files = _series_files(tree, state)
    if target.exists():
        present = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
        if present != files:  # else: a killed run got this far; finish what it started
            raise StateError(f"{target} appeared while the rebase ran; move it away and --continue")
    else:
        _write_series(target, files)
    result = RebaseResult(state=state, done=True, series_dir=str(target))
    for step in state.steps:
        if step.applied_upstream:
            recorded = _record_applied_upstream(root / f"v{state.base}" / step.name, state, step)
            if recorded:
                result.recorded.append({"path": recorded, "version": step.applied_upstream})
    workflow.write_checkout_record(
        tree, workflow.CheckoutRecord(state.onto, state.onto_commit, str(target))
    )
    old_range = f"{state.base_commit}..{state.old_head}"
    new_range = f"{state.onto_commit}..HEAD"
    try:
        result.range_diff = gitutil.run(
            tree, "range-diff", "--no-color", "--creation-factor=95", old_range, new_range
        )
    except git.GitCommandError as exc:
        result.range_diff = f"(git range-diff failed: {str(exc.stderr).strip()})"
    done = {"state": asdict(state), "series_dir": str(target), "range_diff": result.range_diff}
    cache.write_atomic(
        applier.git_dir(tree) / DONE_FILE, (json.dumps(done, indent=1) + "\n").encode()
    )
    # state.json first: from then on the rebase is done, whatever of the rest a kill leaves
    (_state_dir(tree) / "state.json").unlink()
    shutil.rmtree(_state_dir(tree), ignore_errors=True)
    return result


def _write_series(target: Path, files: dict[str, bytes]) -> None:
    """Write the new series directory whole: staged beside ``target`` (named with this
    process's id, so a later run removes what a killed one left), then renamed."""
    staging = sources.scratch_beside(target)
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _record_applied_upstream(path: Path, state: RebaseState, step: Step) -> str | None:
    """Add ``Applied-Upstream: ONTO`` to the old patch's trailers (if it is unchanged)."""
    kept = _state_dir(Path(state.tree)) / "old" / step.name
    if path.is_file() and path.read_bytes() == _with_applied_upstream(kept.read_bytes(), step):
        return str(path)  # a run killed after recording it
    if not path.is_file() or path.read_bytes() != kept.read_bytes():
        ui.warn(f"{path} changed during the rebase; not recording Applied-Upstream in it")
        return None
    patch = patchfile.read(path)
    if patch.trailer("Applied-Upstream"):
        return None
    data = _with_applied_upstream(path.read_bytes(), step)
    patchfile.parse(data, path)
    cache.write_atomic(path, data)
    return str(path)


def _with_applied_upstream(data: bytes, step: Step) -> bytes:
    return add_patch_trailer(data, "Applied-Upstream", step.applied_upstream)


def add_patch_trailer(data: bytes, key: str, value: str) -> bytes:
    """A patch file with ``key: value`` added to its message's trailers, after the
    ``Upstream-*`` trailers and before ``Signed-off-by``."""
    text = data.decode("utf-8")
    at = text.find("\ndiff --git ")
    head, diff = text[: at + 1], text[at + 1 :]
    separator = "\n---\n" if "\n---\n" in head else None
    if separator:
        message, rest = head.split(separator, 1)
        rest = separator + rest
    else:
        message, rest = head.rstrip("\n"), "\n" * (len(head) - len(head.rstrip("\n")))
    lines = message.split("\n")
    start = workflow.last_paragraph_start(lines)
    insert = len(lines)
    for offset, line in enumerate(lines[start:]):
        if line.lower().startswith(("signed-off-by:", f"{workflow.NAME_TRAILER.lower()}:")):
            insert = start + offset
            break
    lines.insert(insert, f"{key}: {value}")
    return ("\n".join(lines) + rest + diff).encode("utf-8")
