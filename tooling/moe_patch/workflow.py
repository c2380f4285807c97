"""The developer workflow: the series as commits in a work tree, and back to patch files.

``checkout`` applies a base's series to that base release, one commit per patch, and
marks each commit with a ``Patch-Filename: <id>.patch`` trailer (the convention of
Electron's patch scripts) so that the patch keeps its file name through ``git commit
--amend``, ``git rebase -i`` and rewording.  The developer edits with plain git.
``export`` writes the commits on top of the base back to the series directory:

* each commit in the fixed ``git format-patch`` form of :mod:`moe_patch.export`, with
  the ``Patch-Filename`` trailer removed again, so unchanged commits reproduce the
  files byte for byte and nothing churns (no dates of the export, no version
  signature, no numbering, headers in git's fixed order);
* a commit without the trailer is a new patch, named after its subject;
* ``series`` lists them in commit order; patch files the old series listed and the
  new one does not are deleted.

The tree remembers what it was made from in ``.git/moe-patch-workflow.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git

from . import applier, cache, export, gitutil, identity, patchfile, series, sources, ui
from .errors import MoePatchError, PatchFailed, StateError, UsageError
from .headers import header_problems
from .patchfile import Patch
from .settings import Settings, require_writable

NAME_TRAILER = "Patch-Filename"
STATE_FILE = applier.CHECKOUT_RECORD
_TRAILER_LINE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: ")
_NAME_LINE = re.compile(rf"^{NAME_TRAILER}:\s*(\S.*?)\s*$", re.IGNORECASE)


# --- commit messages and their trailers ---------------------------------------------


def last_paragraph_start(lines: list[str]) -> int:
    """Index of the first line of the last paragraph of ``lines``."""
    at = len(lines)
    while at > 0 and lines[at - 1].strip():
        at -= 1
    return at


def add_trailer(message: str, key: str, value: str, before: tuple[str, ...] = ()) -> str:
    """``message`` with ``key: value`` added to its trailer block (a new block if it
    has none), placed before the first trailer whose key is in ``before``."""
    lines = message.rstrip("\n").split("\n")
    start = last_paragraph_start(lines)
    block = lines[start:]
    if block and start > 0 and all(_TRAILER_LINE.match(x) or x[:1].isspace() for x in block):
        at = len(lines)
        for offset, line in enumerate(block):
            if line.split(":", 1)[0].lower() in {b.lower() for b in before}:
                at = start + offset
                break
        lines.insert(at, f"{key}: {value}")
    else:
        lines += ["", f"{key}: {value}"]
    return "\n".join(lines) + "\n"


def split_name_trailer(message: str) -> tuple[str, str | None]:
    """``message`` without its ``Patch-Filename`` trailer, and the name it gave."""
    lines = message.rstrip("\n").split("\n")
    start = last_paragraph_start(lines)
    names = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _NAME_LINE.match(line))]
    names = [(i, n) for i, n in names if i >= start]
    if not names:
        return message, None
    if len({n for _, n in names}) > 1:
        raise UsageError(
            f"a commit carries {len(names)} different {NAME_TRAILER} trailers "
            f"({', '.join(n for _, n in names)}); keep one"
        )
    drop = {i for i, _ in names}
    kept = [line for i, line in enumerate(lines) if i not in drop]
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept) + "\n", names[0][1]


def commit_message(tree: Path, commit: str) -> str:
    raw = gitutil.run(tree, "cat-file", "commit", commit, strip_newline_in_stdout=False)
    return raw.split("\n\n", 1)[1] if "\n\n" in raw else ""


def author_of(tree: Path, commit: str) -> tuple[str, str, str]:
    """(name, email, raw date) of ``commit``'s author."""
    line = gitutil.run(tree, "log", "-1", "--format=%an%x00%ae%x00%ad", "--date=raw", commit)
    name, email, date = line.split("\0")
    return name, email, date


def recommit(
    tree: Path,
    commit: str,
    message: str,
    parent: str | None = None,
    tree_id: str | None = None,
    author: tuple[str, str] | None = None,
) -> str:
    """A commit with ``commit``'s author (or ``author``, keeping the date; also as committer)
    and ``message``, on ``parent`` (default: ``commit``'s) with ``tree_id`` (default:
    ``commit``'s tree).

    The same inputs give the same commit id, so nothing made this way churns."""
    parent = parent or gitutil.run(tree, "rev-parse", f"{commit}^")
    tree_id = tree_id or gitutil.run(tree, "rev-parse", f"{commit}^{{tree}}")
    name, email, date = author_of(tree, commit)
    if author:
        name, email = author
    with _readable(message.encode("utf-8")) as handle:
        return gitutil.run(
            tree,
            "commit-tree",
            tree_id,
            "-p",
            parent,
            env=gitutil.commit_env(name, email, f"@{date}"),
            istream=handle,  # the message, on standard input
        )


_PIPE_HOLDS = 60_000  # bytes a pipe takes without a reader (Linux: 64 KiB)


def _readable(data: bytes):
    """``data`` to read from: a pipe already holding it, so that no file is written that a
    killed run would leave behind (a file without a name for a message too long for that)."""
    if len(data) > _PIPE_HOLDS:
        handle = tempfile.TemporaryFile()
        handle.write(data)
        handle.seek(0)
        return handle
    read, write = os.pipe()
    with os.fdopen(write, "wb") as writer:
        writer.write(data)
    return os.fdopen(read, "rb")


# --- a series as commits ------------------------------------------------------------


def commit_series(tree: Path, base_commit: str, patches: list[Patch]) -> list[str]:
    """Commit ``patches`` exactly (no 3-way merge) on ``base_commit``, each marked with
    its file name; HEAD is left detached at the last one.  Returns the commits."""
    gitutil.run(tree, "checkout", "-q", "--detach", base_commit)
    commits = []
    for patch in patches:
        if not applier.am(tree, patch, three_way=False):
            raise PatchFailed(
                f"patch {patch.path.name} does not apply to its own base release; the series "
                "is broken there (see moe-patch verify)"
            )
        head = gitutil.run(tree, "rev-parse", "HEAD")
        marked = add_trailer(commit_message(tree, head), NAME_TRAILER, patch.path.name)
        new = recommit(tree, head, marked)
        gitutil.run(tree, "reset", "-q", "--soft", new)
        commits.append(new)
    return commits


@dataclass
class ExportedPatch:
    name: str
    commit: str
    data: bytes
    placeholder: str | None = None  # the placeholder identity it kept, if it kept one


def exported_series(
    tree: Path,
    base_commit: str,
    head: str = "HEAD",
    series_author: tuple[str, str] | None = None,
    series_dir: Path | None = None,
) -> list[ExportedPatch]:
    """Every commit from ``base_commit`` to ``head`` in patch form, named, in order; with
    ``series_author``, commits by a placeholder identity are written under it instead (its
    sign-off replacing theirs), see :mod:`moe_patch.identity`, unless their file in
    ``series_dir`` already holds exactly what they export to: a patch the user did not touch
    keeps its bytes."""
    try:
        gitutil.run(tree, "merge-base", "--is-ancestor", base_commit, head)
    except git.GitCommandError:
        raise StateError(
            f"{head} in {tree} is not built on the series base {base_commit[:12]}; "
            "rebase your work onto it first"
        ) from None
    merges = gitutil.run(tree, "rev-list", "--min-parents=2", f"{base_commit}..{head}")
    if merges:
        raise StateError(
            f"{tree} has merge commits on top of the base ({merges.split()[0][:12]}); "
            "a series is a straight line of commits: rebase them away"
        )
    listing = gitutil.run(tree, "rev-list", "--reverse", f"{base_commit}..{head}")
    result: list[ExportedPatch] = []
    for commit in listing.split():
        original = commit_message(tree, commit)
        message, name = split_name_trailer(original)
        if name is None:
            name = slug(message.split("\n", 1)[0]) + ".patch"
        elif not name.endswith(".patch") or "/" in name or name.startswith("."):
            raise UsageError(
                f"commit {commit[:12]} names its patch {name!r}; a {NAME_TRAILER} must be a "
                "plain file name ending in .patch"
            )
        if name in {p.name for p in result}:
            raise UsageError(
                f"two commits export to {name}; give one a {NAME_TRAILER}: <other>.patch trailer"
            )
        if gitutil.run(tree, "diff-tree", "--no-commit-id", "--name-only", "-r", commit) == "":
            raise StateError(f"commit {commit[:12]} ({name}) changes nothing; drop it")
        author_name, author_email, _ = author_of(tree, commit)
        placeholder = identity.is_placeholder(author_email)
        data = export.format_commit(
            tree, recommit(tree, commit, message) if message != original else commit
        )
        untouched = series_dir is not None and _holds(series_dir / name, data)
        author = series_author if placeholder and series_author and not untouched else None
        if author:
            restamped = identity.restamp(message, author)
            data = export.format_commit(tree, recommit(tree, commit, restamped, author=author))
        patchfile.parse(data, Path(name))  # the series accepts it, or a one-line error
        kept = placeholder and not author and not untouched
        kept = f"{author_name} <{author_email}>" if kept else None
        result.append(ExportedPatch(name, commit, data, kept))
    return result


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def slug(subject: str) -> str:
    """A patch file stem from a subject, the way ``git format-patch`` names files."""
    text = re.sub(r"[^A-Za-z0-9._]+", "-", subject.lower()).strip("-.")
    text = re.sub(r"\.{2,}", ".", text)[:52].rstrip("-.")
    return text or "patch"


# --- which series a checkout (or finished rebase) tree edits -------------------------


@dataclass
class CheckoutRecord:
    base: str  # the series base release, e.g. "0.20.0"
    base_commit: str
    series_dir: str  # absolute path of patches/vX.Y.Z: where export writes


def write_checkout_record(tree: Path, record: CheckoutRecord) -> None:
    data = (json.dumps(asdict(record), indent=1, sort_keys=True) + "\n").encode()
    cache.write_atomic(applier.git_dir(tree) / STATE_FILE, data)


def read_checkout_record(tree: Path) -> CheckoutRecord | None:
    try:
        path = applier.git_dir(tree) / STATE_FILE
        return CheckoutRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, git.GitCommandError):
        return None


# --- checkout -----------------------------------------------------------------------


@dataclass
class CheckoutResult:
    tree: str
    base: str
    version: str
    branch: str
    series_dir: str
    patches: list[dict] = field(default_factory=list)


def checkout(version: str, into: Path, settings: Settings | None = None) -> CheckoutResult:
    """The series serving ``version`` as commits on its base release in ``into``."""
    settings = settings or Settings.resolve()
    base = series.base_for(version, settings.series_root)
    chosen = series.load(base, settings.series_root)
    into = into.expanduser().absolute()
    if into.exists() and any(into.iterdir()):
        raise UsageError(f"{into} exists and is not empty; choose another directory")
    if base != version:
        ui.info(
            f"vLLM {version} is served by the series for base {base}; checking it out on "
            f"{base}, where it applies exactly (make a series for {version} with rebase)"
        )
    existed = into.exists()
    work = sources.from_cache(base, into, settings.index_url)
    try:
        applier.check_symlinks(work.path, work.base, chosen.patches)
        commits = commit_series(work.path, work.base, chosen.patches)
        branch = applier.branch_name(base)
        gitutil.run(work.path, "checkout", "-q", "-B", branch)
        write_checkout_record(
            work.path, CheckoutRecord(base, work.base, str(chosen.directory.absolute()))
        )
    except BaseException:
        shutil.rmtree(work.path, ignore_errors=True)
        if existed:
            into.mkdir(exist_ok=True)
        raise
    return CheckoutResult(
        tree=str(work.path),
        base=base,
        version=version,
        branch=branch,
        series_dir=str(chosen.directory.absolute()),
        patches=[
            {"id": p.id, "commit": c, "subject": p.subject}
            for p, c in zip(chosen.patches, commits, strict=True)
        ],
    )


# --- export -------------------------------------------------------------------------

UNCHANGED, UPDATED, ADDED, REMOVED = "unchanged", "updated", "added", "removed"


@dataclass
class ExportResult:
    series_dir: str
    base: str
    changes: list[dict] = field(default_factory=list)  # {"patch", "change", "commit"}
    series_changed: bool = False
    written: bool = False
    problems: list[str] = field(default_factory=list)  # header problems verify would report

    @property
    def changed(self) -> bool:
        return self.series_changed or any(c["change"] != UNCHANGED for c in self.changes)


def _series_names(directory: Path) -> tuple[list[str], list[str]]:
    """(patch names listed in ``series``, its leading comment lines)."""
    try:
        lines = (directory / series.SERIES_FILE).read_text().splitlines()
    except OSError:
        return [], []
    names, header = [], []
    for line in lines:
        entry = line.split("#", 1)[0].strip()
        if entry:
            names.append(entry.split()[0])
        elif not names and line.startswith("#"):
            header.append(line)
    return names, header


def export_tree(
    tree: Path, series_root: Path | None = None, check: bool = False, author: str | None = None
) -> ExportResult:
    """Write the commits of a checkout (or finished rebase) tree back to its series."""
    tree = tree.expanduser().absolute()
    repo = gitutil.open_repo(tree)
    state = read_checkout_record(tree)
    if state is None:
        raise UsageError(
            f"{tree} was not made by moe-patch checkout or rebase; "
            "start with: moe-patch checkout --vllm VERSION DIR"
        )
    if (applier.git_dir(tree) / "moe-patch-rebase").exists():
        raise StateError(f"{tree} is in the middle of a moe-patch rebase; finish or abort it first")
    gitutil.require_clean(repo, "work tree")
    directory = (
        series_root.expanduser().absolute() / f"v{state.base}"
        if series_root
        else Path(state.series_dir)
    )
    exported = exported_series(
        tree,
        state.base_commit,
        series_author=identity.series_identity(tree, author),
        series_dir=directory,
    )
    kept = sorted({item.placeholder for item in exported if item.placeholder})
    if kept:
        ui.warn(
            f"{sum(1 for i in exported if i.placeholder)} patch(es) keep the placeholder "
            f"identity {', '.join(kept)}: pass --author 'Name <email>' or set git's "
            "user.name and user.email to export them under yours"
        )
    old_names, header = _series_names(directory)
    result = ExportResult(series_dir=str(directory), base=state.base)
    for item in exported:
        target = directory / item.name
        if target.is_file() and target.read_bytes() == item.data:
            change = UNCHANGED
        else:
            change = UPDATED if item.name in old_names else ADDED
        result.changes.append({"patch": item.name, "change": change, "commit": item.commit})
    new_names = [item.name for item in exported]
    for name in old_names:
        if name not in new_names:
            result.changes.append({"patch": name, "change": REMOVED, "commit": None})
    result.series_changed = new_names != old_names
    for item in exported:
        for problem in header_problems(patchfile.parse(item.data, directory / item.name)):
            result.problems.append(f"{item.name}: {problem}")
            ui.warn(f"{item.name}: {problem} (verify will fail on it)")
    if check or not result.changed:
        return result
    require_writable(directory.parent, "export")
    directory.mkdir(parents=True, exist_ok=True)
    for item in exported:
        target = directory / item.name
        if not (target.is_file() and target.read_bytes() == item.data):
            cache.write_atomic(target, item.data)
    if result.series_changed:
        text = "".join(f"{line}\n" for line in header) + "".join(f"{n}\n" for n in new_names)
        cache.write_atomic(directory / series.SERIES_FILE, text.encode())
    for change in result.changes:
        if change["change"] == REMOVED:
            (directory / change["patch"]).unlink(missing_ok=True)
    result.written = True
    try:
        series.load(state.base, directory.parent)
    except MoePatchError as exc:
        ui.warn(f"the exported series does not pass its own checks: {exc.message}")
    return result
