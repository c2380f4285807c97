"""``moe-patch pr``: one upstream-ready branch per patch that vLLM lacks at a target ref.

For each patch of the series serving the target, in series order:

* ``Upstream-Status: Inappropriate [...]`` (a backport, a local change): skipped;
* already upstream at the target (its ``Upstream-Probe`` finds the feature, or it
  reverse-applies cleanly: the same evidence as ``apply``): skipped;
* otherwise a branch ``<prefix><patch-id>`` holding the change as one commit: a
  vLLM-style title (``[Kernel] …``), the patch's message (what and why) as the body, the
  tests its ``Upstream-Test:`` trailers name (kept in the series' ``upstream/`` folder), the
  moe-patch trailers removed and a DCO ``Signed-off-by:`` for the user's git identity.
  The branch is based on the target, or on the branch of the patch its
  ``Upstream-Depends:`` trailer names (a patch that applies only on top of the previous one
  is stacked on it too, and the report says the trailer is missing).

Then, for every branch, the pull-request checklist of the target tree
(:mod:`moe_patch.pr_checks`): the branch's new tests run on its base and on it
(:mod:`moe_patch.pr_tests`), its description (:mod:`moe_patch.pr_description`) written to
``--out`` and judged, its lines checked with the ruff the tree pins.  The report lists the
branches in merge order with the commands that push them and open the pull requests
(:mod:`moe_patch.remotes`).  ``--check`` runs the checklist alone on existing branches.
Nothing is pushed.

The work happens in a detached ``git worktree`` of the user's repository in a temporary
directory.  Branch refs are written last, in one ``git update-ref`` transaction, after every
description has been written to a staging folder; if anything fails before the descriptions
are in place, the refs go back to what they were.  The user's HEAD, branch and working
tree are untouched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from . import applier, gitutil, lint, pr_checks, pr_tests, remotes, series, verify
from .contribution import Rules, read_rules
from .errors import LocalIOError, MoePatchError, StateError, UsageError, is_local_io
from .identity import is_placeholder
from .patchfile import Patch
from .pr_checks import Item
from .pr_description import BranchFacts, describe
from .report import FAIL, PASS, as_json
from .settings import Settings
from .upstreaming import body_for, title_for, upstreaming

DEFAULT_PREFIX = "moe-patch/"
SPDX_LINES = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
UPSTREAM_REPO = remotes.UPSTREAM_REPO
# Outcomes per patch.
BRANCH, STACKED, SKIPPED_INAPPROPRIATE, SKIPPED_UPSTREAM, FAILED = (
    "branch",
    "branch (stacked)",
    "skipped: inappropriate upstream",
    "skipped: already upstream",
    "failed",
)


@dataclass
class PrOutcome:
    id: str
    status: str
    detail: str = ""
    branch: str | None = None
    commit: str | None = None
    parent: str | None = None  # the commit the branch sits on
    title: str | None = None
    stacked_on: str | None = None  # the branch it depends on
    tests: list[str] = field(default_factory=list)
    lint: list[str] = field(default_factory=list)  # one line per check
    lint_ok: bool | None = None
    description: str | None = None  # path of the PR description file
    checks: list[Item] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    @property
    def check_failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)


@dataclass
class PrReport:
    source: str
    onto: str
    onto_commit: str
    series_base: str
    series_reason: str = ""
    checked_only: bool = False  # --check: existing branches judged, nothing written
    python: str = ""  # what ran the branches' tests, or why nothing did
    outcomes: list[PrOutcome] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # branches in merge order
    setup: list[str] = field(default_factory=list)  # commands to run once, first
    finish: list[str] = field(default_factory=list)  # commands to run once, last
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.status != FAILED and not o.check_failed for o in self.outcomes)

    def to_json(self) -> str:
        return as_json(self, ok=self.ok)


# --- inputs -------------------------------------------------------------------------


def git_identity(repo: Path) -> tuple[str, str]:
    """``user.name`` and ``user.email`` from the user's git configuration for ``repo``."""
    values = [gitutil.user_setting(repo, key) or "" for key in ("user.name", "user.email")]
    name, email = values
    if not name or not email:
        missing = " and ".join(
            k for k, v in zip(("user.name", "user.email"), values, strict=True) if not v
        )
        raise UsageError(
            f"no git identity for the DCO sign-off: set {missing} "
            '(git config --global user.name "Your Name"; git config --global user.email '
            "you@example.com); nothing was changed"
        )
    if is_placeholder(email):
        raise UsageError(
            f"your git user.email {email} is a placeholder address (a domain reserved for "
            "examples): an upstream commit needs one that reaches you; set a real one "
            "(git config user.email ...); nothing was changed"
        )
    return name, email


def resolve_ref(repo: Path, ref: str) -> tuple[str, str]:
    """(commit, the name that resolved) for ``ref``: as given, as tag ``v<ref>``, or as
    ``origin/<ref>``."""
    candidates = [ref]
    if not ref.startswith("v"):
        candidates.append(f"v{ref}")
    candidates.append(f"origin/{ref}")
    for name in candidates:
        try:
            commit = gitutil.run(repo, "rev-parse", "-q", "--verify", f"{name}^{{commit}}")
            return commit, name
        except git.GitCommandError:
            continue
    raise UsageError(
        f"--onto {ref} is not a branch, tag or commit of {repo}; fetch it first "
        "(git fetch upstream) or name an existing ref"
    )


def ref_version(repo: Path, commit: str, name: str) -> str | None:
    """The vLLM release a ref is, or the newest release tag it contains."""
    texts = [name.rsplit("/", 1)[-1]]
    with contextlib.suppress(git.GitCommandError):
        texts.append(gitutil.run(repo, "describe", "--tags", "--abbrev=0", commit))
    for text in texts:
        try:
            version = Version(text.lstrip("v"))
        except InvalidVersion:
            continue
        if not version.is_devrelease and not version.is_prerelease:
            return str(version)
    return None


# --- commit messages ----------------------------------------------------------------


def commit_message(patch: Patch, name: str, email: str) -> str:
    body = body_for(patch)
    author = patch.author
    trailers = []
    if author and email.lower() not in author.lower() and not is_placeholder(author):
        trailers.append(f"Co-authored-by: {author}")
    trailers.append(f"Signed-off-by: {name} <{email}>")
    *paragraphs, last = body.split("\n\n")
    if paragraphs and all(_TRAILER_LINE.match(line) for line in last.splitlines()):
        body = "\n\n".join(paragraphs)  # the patch's own kept trailers (Assisted-by:) lead
        trailers = last.splitlines() + trailers
    return "\n".join([title_for(patch), "", body, "", *trailers]) + "\n"


_TRAILER_LINE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: \S")


# --- building the branches ----------------------------------------------------------


def _require_vllm(repo: Path, commit: str, name: str) -> None:
    """Refuse a repository that is not vLLM before anything is downloaded or branched."""
    try:
        gitutil.run(repo, "cat-file", "-e", f"{commit}:vllm/__init__.py")
    except git.GitCommandError:
        raise UsageError(
            f"{name} in {repo} is not vLLM (it has no vllm/__init__.py); point --source at "
            "a clone of vllm-project/vllm"
        ) from None


def _where(work: Path, patch: Patch) -> str:
    """The file and hunk where ``patch`` stops applying on the commit ``work`` is at."""
    return applier.where_it_fails(patch, applier.apply_check(work, patch) or "")


def _rebase_hint(version: str | None) -> str:
    onto = version or "VERSION"
    return (
        f"carry the series there first: moe-patch rebase --onto {onto}, then run pr again "
        "with the new series"
    )


def _apply(work: Path, patch: Patch, base_fetch) -> bool:
    if applier.apply_check(work, patch) is None and applier.am(work, patch, three_way=False):
        return True
    # A 3-way merge needs the patch's preimage blobs: a clone with history, or the
    # previous candidate's commit (before SPDX lines / ruff fixes), usually has them;
    # else the series base release is fetched from the cache.
    if applier.am(work, patch, three_way=True):
        return True
    return bool(base_fetch()) and applier.am(work, patch, three_way=True)


def _add_spdx(work: Path, base: str) -> list[str]:
    """Put vLLM's SPDX lines on top of Python files the change adds; returns them."""
    added = gitutil.run(work, "diff", "--name-only", "--diff-filter=A", base, "HEAD")
    fixed = []
    for name in added.splitlines():
        path = work / name
        if name.endswith(".py") and path.is_file():
            text = path.read_text()
            if "SPDX-License-Identifier" not in "".join(text.splitlines(True)[:2]):
                path.write_text(SPDX_LINES + text)
                fixed.append(name)
    return fixed


def _commit(work: Path, base: str, message: str, name: str, email: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
    gitutil.run(work, "add", "-A")
    tree_id = gitutil.run(work, "write-tree")
    with tempfile.TemporaryFile() as handle:  # unlinked at once: nothing left if killed
        handle.write(message.encode("utf-8"))
        handle.seek(0)
        commit = gitutil.run(
            work, "commit-tree", tree_id, "-p", base, "-F", "-", env=env, istream=handle
        )
    gitutil.run(work, "reset", "-q", "--hard", commit)
    return commit


def _lint(work: Path, base: str) -> tuple[bool | None, list[str]]:
    """ruff check / ruff format on the Python files changed since ``base`` (None: none)."""
    ruff = lint.ruff_for(work)
    files = [
        f
        for f in gitutil.run(work, "diff", "--name-only", "--diff-filter=d", base, "HEAD").split()
        if f.endswith(verify.PYTHON_SUFFIXES)
    ]
    if not files:
        return None, ["no Python files"]
    if not ruff:
        return False, [lint.MISSING]
    checks = [
        verify.check_ruff_lint(ruff, work, files, base),
        verify.check_ruff_format(ruff, work, files, base),
    ]
    return all(c.status == PASS for c in checks), [
        f"{c.name}: {c.status} ({c.detail})" for c in checks
    ]


@contextlib.contextmanager
def _worktree(repo: Path, commit: str):
    with pr_tests.scratch_tree(repo, commit) as path:
        yield path


def _make_commit(
    work: Path, patch: Patch, parent: str, outcome: PrOutcome, name: str, email: str
) -> None:
    """Commit ``patch`` (applied in ``work`` on ``parent``) as the branch's one commit."""
    gitutil.run(work, "reset", "-q", "--soft", parent)
    for path, text in upstreaming(patch).tests.items():
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        outcome.tests.append(path)
    # Commit once so the SPDX and ruff steps can compare against the parent.
    message = commit_message(patch, name, email)
    _commit(work, parent, message, name, email)
    _add_spdx(work, parent)
    ruff = lint.ruff_for(work)
    if ruff:
        changed = gitutil.run(work, "diff", "--name-only", "--diff-filter=d", parent)
        files = [f for f in changed.split() if f.endswith(verify.PYTHON_SUFFIXES)]
        lint.fix_added_lines(ruff, work, files, parent)
    outcome.commit = _commit(work, parent, message, name, email)
    outcome.parent = parent
    outcome.lint_ok, outcome.lint = _lint(work, parent)
    outcome.title = title_for(patch)


def _build(
    source: Path,
    work: Path,
    report: PrReport,
    patches: list[Patch],
    prefix: str,
    identity: tuple[str, str],
    version: str | None,
    base_fetch,
) -> None:
    """One commit per patch that gets a branch (no ref is written here)."""
    onto_commit, onto_name = report.onto_commit, report.onto
    built: dict[str, PrOutcome] = {}
    upstream: set[str] = set()
    previous: PrOutcome | None = None
    for patch in patches:
        outcome = PrOutcome(patch.id, FAILED, branch=None)
        report.outcomes.append(outcome)
        status = patch.upstream_status
        if status.lower().startswith("inappropriate"):
            outcome.status, outcome.detail = SKIPPED_INAPPROPRIATE, status
            continue
        gitutil.run(work, "checkout", "-q", "--detach", onto_commit)
        evidence = applier.upstream_evidence(work, patch)
        if evidence:
            outcome.status, outcome.detail = SKIPPED_UPSTREAM, evidence
            upstream.add(patch.id)
            continue
        parent, stacked_on = onto_commit, None
        declared = upstreaming(patch).depends
        if declared and declared[0] not in upstream:
            parent, stacked_on, problem = _dependency(
                source, declared[0], built, prefix, {p.id for p in patches}
            )
            if problem:
                outcome.detail = problem
                continue
        gitutil.run(work, "checkout", "-q", "--detach", parent)
        if not _apply(work, patch, base_fetch):
            where = _where(work, patch)
            if declared or previous is None:
                on = stacked_on or onto_name
                outcome.detail = f"does not apply on {on} ({where}); {_rebase_hint(version)}"
                continue
            gitutil.run(work, "checkout", "-q", "--detach", previous.commit)
            if not _apply(work, patch, base_fetch):
                outcome.detail = (
                    f"applies neither on {onto_name} nor on {previous.branch} ({where}); "
                    f"{_rebase_hint(version)}"
                )
                continue
            parent, stacked_on = previous.commit, previous.branch
            outcome.detail = (
                f"applies only on top of {previous.branch}: declare Upstream-Depends: "
                f"{previous.id} in the patch"
            )
        _make_commit(work, patch, parent, outcome, *identity)
        outcome.branch, outcome.stacked_on = prefix + patch.id, stacked_on
        outcome.status = STACKED if stacked_on else BRANCH
        built[patch.id] = previous = outcome


def _dependency(
    source: Path, dependency: str, built: dict[str, PrOutcome], prefix: str, tried: set[str]
) -> tuple[str, str | None, str]:
    """(parent commit, branch stacked on, problem) for a patch whose Upstream-Depends names
    ``dependency`` (not upstream at the target): its branch from this run, else, when this
    run left it out, an existing one."""
    if dependency in built:
        return built[dependency].commit, built[dependency].branch, ""
    if dependency in tried:
        return "", None, f"depends on {dependency} (Upstream-Depends), which got no branch"
    existing = _branch_head(source, prefix + dependency)
    if existing:
        return existing, prefix + dependency, ""
    problem = (
        f"depends on {dependency} (Upstream-Depends), which has no branch: run pr for both "
        f"(--only {dependency} too)"
    )
    return "", None, problem


def _branch_head(repo: Path, branch: str) -> str | None:
    try:
        return gitutil.run(repo, "rev-parse", "-q", "--verify", f"refs/heads/{branch}")
    except git.GitCommandError:
        return None


# --- judging a branch ---------------------------------------------------------------


def _assess(
    source: Path,
    outcome: PrOutcome,
    patch: Patch,
    base_name: str,
    python: pr_tests.Python | None,
    why_no_python: str,
) -> tuple[pr_checks.Branch, pr_tests.Evidence]:
    """Everything the checklist needs about ``outcome``'s branch except its description."""
    parent, commit = outcome.parent, outcome.commit
    numstat = gitutil.run(source, "diff", "--numstat", "--no-renames", parent, commit)
    files: dict[str, tuple[int, int]] = {}
    for line in numstat.splitlines():
        added, removed, path = line.split("\t", 2)
        files[path] = (
            int(added) if added.isdigit() else 0,
            int(removed) if removed.isdigit() else 0,
        )
    added_lines: dict[str, list[str]] = {}
    new_texts: dict[str, str] = {}
    kernel_lines: dict[str, int] = {}
    for path in files:
        if not path.endswith(".py"):
            continue
        diff = gitutil.run(source, "diff", "-U0", parent, commit, "--", path)
        added_lines[path] = [
            ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")
        ]
        with contextlib.suppress(git.GitCommandError):
            new_texts[path] = gitutil.run(
                source, "show", f"{commit}:{path}", strip_newline_in_stdout=False
            )
        if path in new_texts:
            kernel_lines[path] = _added_in(diff, pr_checks.triton_kernel_spans(new_texts[path]))
    new_tests = gitutil.run(
        source, "diff", "--name-only", "--diff-filter=A", parent, commit, "--", "tests"
    ).split()
    tests = [t for t in new_tests if Path(t).name.startswith("test_") and t.endswith(".py")]
    evidence = pr_tests.evidence_for(
        source, parent, commit, tests, base_name, python, why_no_python
    )
    plan = upstreaming(patch)
    branch = pr_checks.Branch(
        name=outcome.branch or "",
        base_name=base_name,
        message=gitutil.run(source, "log", "-1", "--format=%B", commit),
        commits=int(gitutil.run(source, "rev-list", "--count", f"{parent}..{commit}")),
        expected_parent=True,
        description=None,
        files=files,
        added=added_lines,
        new_texts=new_texts,
        depends_on=outcome.stacked_on,
        docs=plan.docs,
        assisted=bool(plan.assisted_by),
        lint_ok=outcome.lint_ok,
        lint=outcome.lint,
        tests=evidence.verdicts(),
        triton_kernel_lines={p: n for p, n in kernel_lines.items() if n},
    )
    return branch, evidence


_HUNK = re.compile(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", re.M)


def _added_in(diff: str, spans: list[tuple[int, int]]) -> int:
    """How many lines a ``-U0`` diff adds inside ``spans`` of the new file's lines."""
    added = set()
    for match in _HUNK.finditer(diff):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        added.update(range(start, start + count))
    return sum(1 for line in added if any(a <= line <= b for a, b in spans))


def _facts(
    outcome: PrOutcome, report: PrReport, version: str | None, branch: pr_checks.Branch,
    evidence: pr_tests.Evidence, titles: dict[str, str],
) -> BranchFacts:  # fmt: skip
    results = []
    untested = []
    for test, ok, why in evidence.verdicts():
        if ok is None:
            untested.append(f"pytest {test}")
        results.append(f"`{test}`: {why}" + (f" ({evidence.python})" if ok else ""))
    return BranchFacts(
        title=outcome.title or "",
        base_name=report.onto,
        base_commit=report.onto_commit,
        base_version=version,
        depends_on=outcome.stacked_on,
        depends_title=titles.get(outcome.stacked_on or ""),
        tests=list(evidence.tests),
        test_results=results,
        untested=untested,
        lint=outcome.lint,
        files=sorted(branch.files),
    )


# --- follow-up commands -------------------------------------------------------------


def merge_order(outcomes: list[PrOutcome]) -> list[PrOutcome]:
    """Branches in the order their pull requests merge: every branch after the one it
    depends on, otherwise in series order."""
    with_branch = [o for o in outcomes if o.branch]
    placed: list[PrOutcome] = []
    names = {o.branch for o in with_branch}
    while len(placed) < len(with_branch):
        for outcome in with_branch:
            ready = (
                not outcome.stacked_on
                or outcome.stacked_on not in names
                or any(p.branch == outcome.stacked_on for p in placed)
            )
            if outcome not in placed and ready:
                placed.append(outcome)
                break
        else:  # a cycle cannot be built; keep series order
            placed += [o for o in with_branch if o not in placed]
    return placed


def _follow_up(report: PrReport, source: Path, current: str | None, rules: Rules) -> None:
    ordered = merge_order(report.outcomes)
    report.order = [o.branch for o in ordered if o.branch]
    if not ordered:
        return
    base = pr_base(report.onto)
    needs_main = base is None
    plan = remotes.plan(source, needs_main)
    report.setup = plan.setup
    where = shlex.quote(str(source))
    for outcome in ordered:
        commands = []
        if needs_main:
            if outcome.stacked_on:
                commands.append(
                    f"git -C {where} rebase --onto {outcome.stacked_on} {outcome.parent[:12]} "
                    f"{outcome.branch}"
                )
            else:
                commands.append(
                    f"git -C {where} rebase --onto {plan.upstream}/main {report.onto} "
                    f"{outcome.branch}"
                )
        commands.append(f"git -C {where} push -u {plan.fork} {outcome.branch}")
        title = (outcome.title or "").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
        head = f"{plan.head_owner}:{outcome.branch}"
        commands.append(
            f"gh pr create --repo {UPSTREAM_REPO} --base {base or 'main'} "
            f'--head "{head}" --title "{title}" --body-file {shlex.quote(outcome.description or "")}'
        )
        outcome.commands = commands
    if needs_main:
        back = f"switch {current}" if current else f"switch --detach {report.onto}"
        report.finish = [f"git -C {where} {back}   # the rebases leave the last branch checked out"]
    if rules.pr_cap and len(report.order) > rules.pr_cap:
        report.notes.append(
            f"{len(report.order)} pull requests: vLLM lets a contributor without write access "
            f"have {rules.pr_cap} open at once ({rules.source['pr_cap']}); open them in merge "
            "order as the earlier ones merge"
        )


def pr_base(onto: str) -> str | None:
    """The upstream branch a pull request from ``onto`` goes to: the branch itself (without
    its remote), or None for a tag or a commit (then it goes to main after a rebase)."""
    name = onto.rsplit("/", 1)[-1] if "/" in onto else onto
    if re.fullmatch(r"v?\d+(\.\d+)+\S*|[0-9a-f]{7,40}", name):
        return None
    return name


# --- writing: descriptions first, refs last, all or nothing -------------------------


def _prepare_out(out: Path) -> tuple[Path, list[Path]]:
    """``out`` made if needed (the folders made, for a rollback) and a staging folder in it;
    refused before anything is branched if it cannot be written."""
    made = []
    for folder in reversed([out, *out.parents]):
        if not folder.exists():
            made.append(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".moe-patch-pr-", dir=out))
    except OSError as exc:
        _remove(made)
        if isinstance(exc, (NotADirectoryError, FileExistsError)):
            raise UsageError(f"--out {out} is not a folder; name a folder") from None
        raise LocalIOError(
            f"cannot write the pull-request descriptions to {out} ({exc.strerror}); "
            "free space, fix permissions or pass another --out (no branch was changed)"
        ) from None
    return staging, made


def _remove(folders: list[Path]) -> None:
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _update_refs(source: Path, updates: list[tuple[str, str, str | None]]) -> None:
    """Set ``refs/heads/BRANCH`` to each commit, checking each old value (None: must not
    exist), in one transaction: all of them or none."""
    lines = ["start"]
    for branch, new, old in updates:
        lines.append(f"update refs/heads/{branch} {new} {old or '0' * len(new)}")
    lines += ["prepare", "commit"]
    gitutil.run(source, "update-ref", "--stdin", istream=_stdin("\n".join(lines) + "\n"))


def _stdin(text: str):
    handle = tempfile.TemporaryFile()
    handle.write(text.encode())
    handle.seek(0)
    return handle


def _write(
    source: Path,
    out: Path,
    staging: Path,
    made: list[Path],
    texts: dict[str, str],
    updates: list[tuple[str, str, str | None]],
) -> None:
    """Descriptions into ``staging``, then the refs, then the descriptions into ``out``;
    the refs are restored if the last step fails."""
    try:
        try:
            for name, text in texts.items():
                (staging / name).write_text(text)
        except OSError as exc:
            raise _no_descriptions(out, exc) from None
        _update_refs(source, updates)
        try:
            for name in texts:
                os.replace(staging / name, out / name)
        except OSError as exc:
            _restore_refs(source, updates)
            raise _no_descriptions(out, exc) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove(made)
        raise
    shutil.rmtree(staging, ignore_errors=True)


def _restore_refs(source: Path, updates: list[tuple[str, str, str | None]]) -> None:
    lines = ["start"]
    for branch, new, old in updates:
        if old:
            lines.append(f"update refs/heads/{branch} {old} {new}")
        else:
            lines.append(f"delete refs/heads/{branch} {new}")
    lines += ["prepare", "commit"]
    gitutil.run(source, "update-ref", "--stdin", istream=_stdin("\n".join(lines) + "\n"))


def _no_descriptions(out: Path, exc: OSError) -> MoePatchError:
    if not is_local_io(exc):
        return UsageError(
            f"cannot write the pull-request descriptions to {out} ({exc.strerror}); pass "
            "another --out (no branch was changed)"
        )
    return LocalIOError(
        f"cannot write the pull-request descriptions to {out} ({exc.strerror}); free space, "
        "fix permissions or pass another --out (no branch was changed)"
    )


# --- the command --------------------------------------------------------------------


def prepare(
    source: Path,
    onto: str,
    out: Path | None = None,
    prefix: str = DEFAULT_PREFIX,
    only: list[str] | None = None,
    settings: Settings | None = None,
    force: bool = False,
    python: str | None = None,
    check_only: bool = False,
) -> PrReport:
    """Make the branches and descriptions (or, ``check_only``, judge existing ones) and
    run the checklist on each; see the module's docstring."""
    settings = settings or Settings.resolve()
    series_root, index_url = settings.series_root, settings.index_url
    source = source.expanduser().absolute()
    repo = gitutil.open_repo(source)
    if repo.bare:
        raise UsageError(f"--source {source} is a bare repository; use a clone with a work tree")
    identity = None if check_only else git_identity(source)
    gitutil.require_clean(repo, "--source checkout")
    onto_commit, onto_name = resolve_ref(source, onto)
    _require_vllm(source, onto_commit, onto_name)
    version = ref_version(source, onto_commit, onto_name)
    known = series.required_bases(series_root)
    base = series.base_for(version, series_root) if version else known[-1]
    reason = (
        f"the series for vLLM {version}, the release {onto_name} is or contains"
        if version
        else f"the newest series: {onto_name} contains no release tag (fetch tags to choose)"
    )
    chosen = series.load(base, series_root)
    patches = chosen.select(only)
    existing = {p.id: _branch_head(source, prefix + p.id) for p in patches}
    try:
        current = gitutil.run(source, "symbolic-ref", "-q", "--short", "HEAD")
    except git.GitCommandError:
        current = None
    if not check_only:
        taken = [prefix + i for i, head in existing.items() if head]
        if taken and not force:
            many = len(taken) > 1
            raise StateError(
                f"{'branches' if many else 'branch'} {', '.join(taken)} already "
                f"{'exist' if many else 'exists'} in {source}; delete {'them' if many else 'it'}, "
                f"or pass --force to replace {'them' if many else 'it'} (nothing was changed)"
            )
        if current in taken:
            raise StateError(f"{current} is checked out in {source}; switch branches first")

    report = PrReport(str(source), onto_name, onto_commit, base, reason, checked_only=check_only)
    if out is None:  # beside the repository's refs, never in its working tree
        common = gitutil.run(source, "rev-parse", "--git-common-dir")
        out = (source / common).resolve() / "moe-patch-pr"
    out = out.expanduser().absolute()
    rules = read_rules(source, onto_commit)
    staging, made = (None, []) if check_only else _prepare_out(out)
    fetched: list[bool] = []
    by_id = {p.id: p for p in patches}

    try:
        with applier.target_lock(source), _worktree(source, onto_commit) as work:

            def base_fetch() -> bool:
                if not fetched:
                    fetched.append(
                        applier.fetch_base_objects(work, chosen.base, index_url, chosen.patches)
                    )
                return fetched[0]

            if check_only:
                _existing(source, work, report, patches, prefix, existing)
            else:
                _build(source, work, report, patches, prefix, identity, version, base_fetch)
            found, why_not = pr_tests.find_python(source, python)
            report.python = found.versions + f" ({found.path})" if found else why_not
            titles = {o.branch: o.title for o in report.outcomes if o.branch}
            texts: dict[str, str] = {}
            judged = []
            for outcome in report.outcomes:
                if not outcome.branch or outcome.commit is None:
                    continue
                base_name = outcome.stacked_on or onto_name
                branch, evidence = _assess(
                    source, outcome, by_id[outcome.id], base_name, found, why_not
                )
                path = out / f"{outcome.id}.md"
                outcome.description = str(path)
                if check_only:
                    wanted = _expected_parent(source, outcome, onto_commit)
                    branch.expected_parent = wanted == outcome.parent
                    branch.commits = int(
                        gitutil.run(source, "rev-list", "--count", f"{wanted}..{outcome.commit}")
                    )
                    try:
                        branch.description = path.read_text()
                    except OSError:
                        branch.description = None
                else:
                    facts = _facts(outcome, report, version, branch, evidence, titles)
                    texts[path.name] = describe(
                        by_id[outcome.id], facts, rules, settings.results_dir
                    )
                    branch.description = texts[path.name]
                branch.local_paths = (str(source), str(settings.results_dir), str(Path.home()))
                judged.append((outcome, branch))
            if not check_only:
                updates = [
                    (o.branch, o.commit, existing.get(o.id)) for o in report.outcomes if o.branch
                ]
                _write(source, out, staging, made, texts, updates)
                staging = None
            for outcome, branch in judged:
                outcome.checks = pr_checks.check_branch(branch, rules)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            _remove(made)
    _follow_up(report, source, current, rules)
    return report


def _existing(
    source: Path,
    work: Path,
    report: PrReport,
    patches: list[Patch],
    prefix: str,
    heads: dict[str, str | None],
) -> None:
    """``--check``: the branches a run of pr made, found by name."""
    for patch in patches:
        outcome = PrOutcome(patch.id, FAILED)
        report.outcomes.append(outcome)
        status = patch.upstream_status
        if status.lower().startswith("inappropriate"):
            outcome.status, outcome.detail = SKIPPED_INAPPROPRIATE, status
            continue
        head = heads.get(patch.id)
        if head is None:
            gitutil.run(work, "checkout", "-q", "--detach", report.onto_commit)
            evidence = applier.upstream_evidence(work, patch)
            if evidence:
                outcome.status, outcome.detail = SKIPPED_UPSTREAM, evidence
            else:
                outcome.detail = f"no branch {prefix + patch.id}: run moe-patch pr first"
            continue
        declared = upstreaming(patch).depends
        outcome.branch, outcome.commit = prefix + patch.id, head
        outcome.parent = gitutil.run(source, "rev-parse", f"{head}^")
        outcome.title = gitutil.run(source, "log", "-1", "--format=%s", head)
        if declared and heads.get(declared[0]):
            outcome.stacked_on = prefix + declared[0]
        outcome.status = STACKED if outcome.stacked_on else BRANCH
        gitutil.run(work, "checkout", "-q", "--detach", head)
        outcome.lint_ok, outcome.lint = _lint(work, outcome.parent)


def _expected_parent(source: Path, outcome: PrOutcome, onto_commit: str) -> str:
    """The commit a branch must sit on: --onto, or the head of the branch it depends on."""
    if outcome.stacked_on:
        return _branch_head(source, outcome.stacked_on) or onto_commit
    return onto_commit


__all__ = ["prepare", "PrReport", "PrOutcome", "MoePatchError"]
