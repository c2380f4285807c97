"""``moe-patch pr``: one upstream-ready branch per patch that vLLM lacks at a target ref.

For each patch of the series serving the target, in series order:

* ``Upstream-Status: Inappropriate [...]`` (a backport, a local change): skipped;
* already upstream at the target (its ``Upstream-Probe`` finds the feature, or it
  reverse-applies cleanly: the same evidence as ``apply``): skipped;
* otherwise a branch ``<prefix><patch-id>`` based on the target, holding the change as
  one commit: a vLLM-style title (``[Perf] …``), the patch's reasons as the body, the
  tests its ``Upstream-Test:`` trailers name (kept in the series' ``upstream/`` folder), the
  moe-patch trailers removed and a DCO ``Signed-off-by:`` for the user's git identity.
  A patch that does not apply on the target alone but does on top of the previous
  candidate is stacked on that branch, and the report says so.

The touched Python files are checked with the target tree's own ruff configuration and the
ruff version it pins (:mod:`moe_patch.lint`; ``ruff check``, ``ruff format --check``); lines
the patch adds are fixed by ruff first when the file was clean before it (never reformatting
upstream's own lines).  Each branch gets a PR description in the target's own pull-request
template (without one: ``## Purpose``, ``## Test Plan``, ``## Test Result``) written to
``--out``, with the ``git push`` / ``gh pr create`` commands.
Nothing is pushed.

The work happens in a detached ``git worktree`` of the user's repository in a temporary
directory; branches are shared refs, so they appear in the user's repository and the
worktree is removed afterwards.  The user's HEAD, branch and working tree are untouched.

The PR title's tag comes from an ``Upstream-Title:`` trailer in the patch when it has one
(the whole title), else ``Upstream-Tag:`` and the subject, else ``[Misc]`` and the subject.
Every other upstreaming fact is a trailer too: see :func:`upstreaming`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from . import applier, contribution, gitutil, lint, series, verify
from .contribution import RULES_PATH
from .errors import MoePatchError, StateError, UsageError
from .identity import is_placeholder
from .patchfile import Patch
from .report import PASS, as_json
from .settings import Settings
from .upstreaming import Upstreaming, upstreaming

DEFAULT_PREFIX = "moe-patch/"
SPDX_LINES = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)
UPSTREAM_REPO = "vllm-project/vllm"
# Trailers that belong to the series, not to an upstream commit.
SERIES_TRAILERS = {
    "upstream-status",
    "upstream-probe",
    "applied-upstream",
    "forwarded",
    "patch-filename",
    "signed-off-by",
    "upstream-title",
    "upstream-tag",
    "upstream-test",
    "upstream-results",
    "upstream-benchmark",
}

# Outcomes per patch.
BRANCH, STACKED, SKIPPED_INAPPROPRIATE, SKIPPED_UPSTREAM, FAILED = (
    "branch",
    "branch (stacked)",
    "skipped: inappropriate upstream",
    "skipped: already upstream",
    "failed",
)


# Token counts the PR description's benchmark table shows (decode sizes).
PR_TABLE_M = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class PrOutcome:
    id: str
    status: str
    detail: str = ""
    branch: str | None = None
    commit: str | None = None
    title: str | None = None
    stacked_on: str | None = None
    tests: list[str] = field(default_factory=list)
    lint: list[str] = field(default_factory=list)  # one line per check
    description: str | None = None  # path of the PR description file
    commands: list[str] = field(default_factory=list)


@dataclass
class PrReport:
    source: str
    onto: str
    onto_commit: str
    series_base: str
    series_reason: str = ""
    outcomes: list[PrOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.status != FAILED for o in self.outcomes)

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


def title_for(patch: Patch) -> str:
    explicit = patch.trailer("Upstream-Title")
    if explicit:
        return explicit
    tag = upstreaming(patch).tag
    subject = re.sub(r"^[\w./-]+:\s+", "", patch.subject)  # "fused_moe: do x" -> "do x"
    return f"{tag} {subject[:1].upper()}{subject[1:]}"


def body_for(patch: Patch) -> str:
    """The patch's message without the series' own trailers."""
    paragraphs = [p for p in patch.message.strip().split("\n\n") if p.strip()]
    if paragraphs:
        kept = [
            line
            for line in paragraphs[-1].splitlines()
            if line.split(":", 1)[0].strip().lower() not in SERIES_TRAILERS
        ]
        if kept:
            paragraphs[-1] = "\n".join(kept)
        else:
            paragraphs.pop()
    return "\n\n".join(paragraphs)


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


# --- the work -----------------------------------------------------------------------


@contextlib.contextmanager
def _worktree(repo: Path, commit: str):
    holder = Path(tempfile.mkdtemp(prefix="moe-patch-pr-"))
    path = holder / "vllm"
    gitutil.run(repo, "worktree", "add", "-q", "--detach", str(path), commit)
    try:
        yield path
    finally:
        with contextlib.suppress(git.GitCommandError):
            gitutil.run(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(holder, ignore_errors=True)
        with contextlib.suppress(git.GitCommandError):
            gitutil.run(repo, "worktree", "prune")


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
    with tempfile.NamedTemporaryFile("wb", prefix="moe-patch-msg-", delete=False) as handle:
        handle.write(message.encode("utf-8"))
    try:
        commit = gitutil.run(work, "commit-tree", tree_id, "-p", base, "-F", handle.name, env=env)
    finally:
        Path(handle.name).unlink(missing_ok=True)
    gitutil.run(work, "reset", "-q", "--hard", commit)
    return commit


def _lint(work: Path, base: str) -> tuple[bool, list[str]]:
    ruff = lint.ruff_for(work)
    files = [
        f
        for f in gitutil.run(work, "diff", "--name-only", "--diff-filter=d", base, "HEAD").split()
        if f.endswith(verify.PYTHON_SUFFIXES)
    ]
    if not files:
        return True, ["no Python files"]
    if not ruff:
        return False, [lint.MISSING]
    checks = [
        verify.check_ruff_lint(ruff, work, files, base),
        verify.check_ruff_format(ruff, work, files, base),
    ]
    return all(c.status == PASS for c in checks), [
        f"{c.name}: {c.status} ({c.detail})" for c in checks
    ]


_GITHUB_OWNER = re.compile(r"github\.com[:/]+([A-Za-z0-9][A-Za-z0-9-]*)/")


def _fork_remote(repo: Path) -> tuple[str, str]:
    """The remote to push to (the first that is not vllm-project/vllm) and the GitHub user
    that owns it, for ``gh pr create --head USER:BRANCH``."""
    try:
        remotes = gitutil.run(repo, "remote", "-v").splitlines()
    except git.GitCommandError:
        remotes = []
    for line in remotes:
        parts = line.split()
        if len(parts) >= 2 and UPSTREAM_REPO not in parts[1] and "(push)" in line:
            owner = _GITHUB_OWNER.search(parts[1])
            return parts[0], owner.group(1) if owner else "<your-github-user>"
    return "<your-fork-remote>", "<your-github-user>"


def prepare(
    source: Path,
    onto: str,
    out: Path | None = None,
    prefix: str = DEFAULT_PREFIX,
    only: list[str] | None = None,
    settings: Settings | None = None,
    force: bool = False,
) -> PrReport:
    settings = settings or Settings.resolve()
    series_root, index_url = settings.series_root, settings.index_url
    source = source.expanduser().absolute()
    repo = gitutil.open_repo(source)
    if repo.bare:
        raise UsageError(f"--source {source} is a bare repository; use a clone with a work tree")
    name, email = git_identity(source)
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
    existing = [
        prefix + p.id
        for p in patches
        if gitutil.run(source, "branch", "--list", prefix + p.id).strip()
    ]
    if existing and not force:
        many = len(existing) > 1
        raise StateError(
            f"{'branches' if many else 'branch'} {', '.join(existing)} already "
            f"{'exist' if many else 'exists'} in {source}; delete {'them' if many else 'it'}, "
            f"or pass --force to replace {'them' if many else 'it'} (nothing was changed)"
        )
    try:
        current = gitutil.run(source, "symbolic-ref", "-q", "--short", "HEAD")
    except git.GitCommandError:
        current = None
    if current in existing:
        raise StateError(f"{current} is checked out in {source}; switch branches first")

    report = PrReport(str(source), onto_name, onto_commit, base, reason)
    if out is None:  # beside the repository's refs, never in its working tree
        common = gitutil.run(source, "rev-parse", "--git-common-dir")
        out = (source / common).resolve() / "moe-patch-pr"
    out = out.expanduser().absolute()
    fetched: list[bool] = []

    with applier.target_lock(source), _worktree(source, onto_commit) as work:

        def base_fetch() -> bool:
            if not fetched:
                fetched.append(
                    applier.fetch_base_objects(work, chosen.base, index_url, chosen.patches)
                )
            return fetched[0]

        previous: PrOutcome | None = None
        for patch in patches:
            outcome = PrOutcome(patch.id, FAILED)
            report.outcomes.append(outcome)
            status = patch.upstream_status
            if status.lower().startswith("inappropriate"):
                outcome.status, outcome.detail = SKIPPED_INAPPROPRIATE, status
                continue
            gitutil.run(work, "checkout", "-q", "--detach", onto_commit)
            evidence = applier.upstream_evidence(work, patch)
            if evidence:
                outcome.status, outcome.detail = SKIPPED_UPSTREAM, evidence
                continue
            parent = onto_commit
            if not _apply(work, patch, base_fetch):
                where = _where(work, patch)
                if previous is None:
                    outcome.detail = (
                        f"does not apply on {onto_name} ({where}); {_rebase_hint(version)}"
                    )
                    continue
                gitutil.run(work, "checkout", "-q", "--detach", previous.commit)
                if not _apply(work, patch, base_fetch):
                    outcome.detail = (
                        f"applies neither on {onto_name} nor on {previous.branch} ({where}); "
                        f"{_rebase_hint(version)}"
                    )
                    continue
                parent = previous.commit
                outcome.stacked_on = previous.branch
            _make_branch(work, patch, parent, outcome, prefix, name, email)
            outcome.status = STACKED if outcome.stacked_on else BRANCH
            previous = outcome

    fork = _fork_remote(source)
    template, rules = (_file_at(source, onto_commit, p) for p in (TEMPLATE_PATH, RULES_PATH))
    for outcome in report.outcomes:
        if outcome.branch:
            patch = next(p for p in patches if p.id == outcome.id)
            text = describe(patch, outcome, report, template, rules, settings.results_dir)
            _write_description(out, patch, outcome, report, fork, text)
    return report


def _file_at(repo: Path, commit: str, path: str) -> str | None:
    try:
        return gitutil.run(repo, "show", f"{commit}:{path}")
    except git.GitCommandError:
        return None  # the target has no such file


def _make_branch(
    work: Path,
    patch: Patch,
    parent: str,
    outcome: PrOutcome,
    prefix: str,
    name: str,
    email: str,
) -> None:
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
    commit = _commit(work, parent, message, name, email)
    ok, lines = _lint(work, parent)
    outcome.lint = lines
    branch = prefix + patch.id
    gitutil.run(work, "branch", "-f", branch, commit)
    outcome.branch, outcome.commit, outcome.title = branch, commit, title_for(patch)
    if not ok:
        outcome.detail = "lint fails with the tree's own ruff configuration: fix before pushing"


# --- the PR description -------------------------------------------------------------


def results_section(plan: Upstreaming, results_dir: Path) -> str:
    """The Test Result section: the measurements of each file ``plan.results`` names, under
    ``results_dir`` (the project's ``kernels/results``), in order."""
    if not plan.results:
        return "No benchmark results are recorded for this change."
    return "\n\n".join(result_file_section(name, results_dir) for name in plan.results)


def result_file_section(name: str, results_dir: Path) -> str:
    try:
        data = json.loads((results_dir / name).read_text())
    except (OSError, ValueError):
        return f"The benchmark results file {name} was not found; run the benchmark."
    if "rows" in data:
        return _bench_section(data)
    if "variants" in data:
        return _e2e_section(data)
    env = data.get("environment", {})
    results = data.get("results", {})
    sweep = data.get("sweep_token_counts") or []
    trace = data.get("trace") or {}
    lines = [
        f"Compile stalls of `fused_moe_kernel` ({data.get('shape', '?')}, FP8 "
        f"{data.get('quant', '?')}), each run in a fresh process with an empty Triton cache.",
        "",
        f"- GPU: {env.get('gpu', '?')} ({env.get('sm_count', '?')} SMs); torch "
        f"{env.get('torch', '?')}, triton {env.get('triton', '?')}, CUDA {env.get('cuda', '?')}, "
        f"Python {env.get('python', '?')}",
        f"- sweep: {len(sweep)} token counts from {min(sweep, default='?')} to "
        f"{max(sweep, default='?')}; trace: {trace.get('steps', '?')} steps "
        f"(seed {trace.get('seed', '?')})",
        f"- command: `{data.get('command', '?')}`",
        "",
        "| vLLM | run | compiled variants before → after | compile stalls before → after "
        "| seconds stalled before → after |",
        "|---|---|---|---|---|",
    ]
    for label in results:
        after = results.get(f"{label}+moe")
        if "+" in label or not after:
            continue
        for run in ("sweep", "trace"):
            b, a = results[label].get(run), after.get(run)
            if not b or not a:
                continue
            lines.append(
                f"| {label} | {run} | {b['variants']} → {a['variants']} | "
                f"{b['stalls']} → {a['stalls']} | "
                f"{b['stall_seconds']:.2f} → {a['stall_seconds']:.2f} |"
            )
    return "\n".join(lines)


def _bench_section(data: dict) -> str:
    """A ``moe_kernels.bench`` run as a table: each release against itself with the
    patch (variants ``X`` and ``X+moe``), median microseconds per call."""
    env = data.get("environment", {})
    times = {
        (row["shape"], row["gemm"], row["quant"], row["M"], row["variant"]): row["us"]
        for row in data["rows"]
    }
    pairs = sorted(
        {
            (k[4], f"{k[4]}+moe")
            for k in times
            if "+" not in k[4] and (*k[:4], f"{k[4]}+moe") in times
        }
    )
    releases = ", ".join(f"vLLM {before}" for before, _ in pairs)
    lines = [
        "Median time per call (µs), lower is better; each row measured in the same run, "
        "on fresh random FP8 data checked against a float64 reference. Before: "
        f"{releases} as released; after: the same release with this change.",
        "",
        f"- GPU: {env.get('gpu', '?')} ({env.get('sm_count', '?')} SMs); torch "
        f"{env.get('torch', '?')}, triton {env.get('triton', '?')}, CUDA {env.get('cuda', '?')}, "
        f"Python {env.get('python', '?')}",
        f"- command: `{data.get('command', '?')}`",
        "",
        "| model shape | GEMM | FP8 scales | M | before | after | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = sorted({k[:4] for k in times if k[3] in PR_TABLE_M})
    for before, after in pairs:
        for cell in cells:
            b, a = times.get((*cell, before)), times.get((*cell, after))
            if b is None or a is None:
                continue
            shape, gemm, quant, m = cell
            lines.append(f"| {shape} | {gemm} | {quant} | {m} | {b:.1f} | {a:.1f} | {b / a:.2f}× |")
    return "\n".join(lines)


def _e2e_section(data: dict) -> str:
    """A ``moe_e2e.run`` report as a table: per engine, its MoE backend, the median time to
    first token of a lone prompt at each length, the median time per output token at each
    decode batch size, and the throughput run's output tokens per second."""
    env = data.get("environment", {})
    spec = data.get("spec", {})
    prompts = list(spec.get("prefill_lens") or [])
    batches = list(spec.get("decode_batches") or [])
    columns = [f"TTFT {n} tok" for n in prompts] + [f"TPOT B={b}" for b in batches]
    lines = [
        f"End to end, vLLM {data.get('vllm', '?')} wheels (the official one, and the same "
        f"wheel with this change), {data.get('model', '?')} with dummy weights; each row one "
        "engine in a fresh process. Median milliseconds (lower is better): TTFT of one prompt "
        "alone, TPOT per output token at batch size B; tok/s: output tokens per second.",
        "",
        f"- GPU: {env.get('gpu', '?')}; torch {env.get('torch', '?')}, "
        f"triton {env.get('triton', '?')}, Python {env.get('python', '?')}",
        f"- command: {_runnable(data.get('command', ''))}",
        "",
        "| engine | MoE backend | " + " | ".join(columns) + " | tok/s |",
        "|---|---|" + "---|" * len(columns) + "---|",
    ]
    for variant in data.get("variants", []):
        result = variant.get("result") or {}
        if not result.get("decode"):
            continue
        cells = [(result.get("prefill") or {}).get(str(n), {}).get("median_ms") for n in prompts]
        cells += [result["decode"].get(str(b), {}).get("median_ms") for b in batches]
        rate = (result.get("throughput") or {}).get("output_tokens_per_s")
        lines.append(
            f"| {variant.get('name', '?')} | {variant.get('moe_backend') or '?'} | "
            + " | ".join("–" if c is None else f"{c:.2f}" for c in cells)
            + f" | {'–' if rate is None else f'{rate:.0f}'} |"
        )
    return "\n".join(lines)


TEMPLATE_PATH = ".github/PULL_REQUEST_TEMPLATE.md"
# Which of our sections fills a heading of the target's pull-request template, by its words.
_HEADING_KINDS = (
    (("purpose", "overview", "summary"), "purpose"),
    (("claim",), "claims"),
    (("test plan",), "plan"),
    (("test result",), "results"),
    (("validation", "testing"), "validation"),
    (("detail", "motivation", "design"), "details"),
    (("documentation", "release note"), "documentation"),
)
_COMMENT = re.compile(r"<!--(?!\s*markdownlint).*?-->\s*", re.S)


def description_sections(patch: Patch, outcome: PrOutcome, results_dir: Path) -> dict[str, str]:
    """What a pull request for ``patch`` says, by kind of section."""
    plan = upstreaming(patch)
    tests = outcome.tests or []
    plan_lines = [f"- `pytest {t} -v`" for t in tests]
    changed = " ".join(sorted({*patch.files, *tests}))
    plan_lines.append(f"- `pre-commit run --files {changed}` (ruff check, ruff format)")
    for command in plan.benchmarks:
        plan_lines.append(f"- on the base branch, then on this one: `{command}`")
    stacked = (
        f"\n\nThis PR is stacked on `{outcome.stacked_on}`; merge that one first."
        if outcome.stacked_on
        else ""
    )
    claims = results_section(plan, results_dir)
    results = [claims]
    if tests:
        results += ["", "New tests, to be run on a GPU with this branch installed:", ""]
        results += [f"- `pytest {t} -v`" for t in tests]
    if outcome.lint:
        results += ["", "Lint with the tree's own configuration:", ""]
        results += [f"- {line}" for line in outcome.lint]
    body = body_for(patch)
    return {
        "purpose": body.split("\n\n", 1)[0] + stacked,
        "claims": claims,
        "validation": "\n".join(plan_lines) + "\n\n" + "\n".join(results),
        "plan": "\n".join(plan_lines),
        "results": "\n".join(results),
        "details": body,
        "documentation": "None: no user-facing documentation changes.",
    }


def _runnable(command: str) -> str:
    """A recorded benchmark command as a reviewer can use it: one that names paths of the
    machine that measured is given as the harness module it ran."""
    if not command:
        return "moe-patch's kernel harness (numbers below)"
    if re.search(r"(^|[\s=])/", command):
        module = next((w for w in command.split() if w.startswith("moe_kernels.")), None)
        where = f"`python -m {module}`" if module else "the kernel harness"
        return f"{where} of moe-patch's kernel harness (numbers below)"
    return f"`{command}`"


def describe(
    patch: Patch,
    outcome: PrOutcome,
    report: PrReport,
    template: str | None,
    rules: str | None,
    results_dir: Path,
) -> str:
    """The pull request's description: the target's own template (``TEMPLATE_PATH`` at
    ``--onto``) with every section filled, its checklist and footer kept (without one,
    Purpose / Test Plan / Test Result), and what the target's contribution rules
    (``RULES_PATH``) ask a description to state."""
    sections = description_sections(patch, outcome, results_dir)
    asked = _contribution_section(patch, outcome, report, rules)
    if not template:
        return (
            f"## Purpose\n\n{sections['purpose']}\n\n## Test Plan\n\n{sections['plan']}\n\n"
            f"## Test Result\n\n{sections['results']}\n" + (f"\n{asked}\n" if asked else "")
        )
    head, rule, footer = template.partition("\n---\n")
    out = []
    for block in re.split(r"(?m)^(?=## )", _COMMENT.sub("", head)):
        first, _, _ = block.partition("\n")
        if not first.startswith("## "):  # keep directives, drop the template's instructions
            kept = [line for line in block.splitlines() if line.strip().startswith("<!--")]
            out.append("\n".join(kept))
            continue
        heading = first[3:].strip().lower()
        kind = next((k for words, k in _HEADING_KINDS if any(w in heading for w in words)), None)
        out.append(f"{first}\n\n{sections.get(kind) or 'Not applicable.'}")
    if asked:
        out.append(asked)
    text = "\n\n".join(part for part in out if part) + "\n"
    return (text + (rule + footer if rule else "")).rstrip("\n") + "\n"


def _contribution_section(
    patch: Patch, outcome: PrOutcome, report: PrReport, rules: str | None
) -> str | None:
    items = contribution.required_items(rules or "")
    if not items:
        return None
    title = (outcome.title or title_for(patch)).split("] ", 1)[-1]
    lines = contribution.answers(
        items,
        target=f"`{report.onto}` ({report.onto_commit[:12]})",
        search=" ".join(title.split()[:6]).replace('"', ""),
        checks=[line.split(" (", 1)[0] for line in outcome.lint],
        untested=[f"pytest {t}" for t in outcome.tests] + upstreaming(patch).benchmarks,
        assisted_by=patch.trailer_values("Assisted-by"),
    )
    return f"## What {contribution.RULES_PATH} asks a description to state\n\n" + "\n".join(lines)


def _write_description(
    out: Path,
    patch: Patch,
    outcome: PrOutcome,
    report: PrReport,
    fork: tuple[str, str],
    text: str,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{patch.id}.md"
    path.write_text(text)
    outcome.description = str(path)
    base = pr_base(report.onto)
    title = (outcome.title or "").replace('"', '\\"')
    outcome.commands = [
        f"git -C {report.source} push {fork[0]} {outcome.branch}",
        f"gh pr create --repo {UPSTREAM_REPO} --base {base or 'main'} --head "
        f'{fork[1]}:{outcome.branch} --title "{title}" --body-file {path}',
    ]
    if base is None:  # a release tag: vLLM merges pull requests into main
        outcome.commands.insert(
            0,
            f"git -C {report.source} rebase --onto upstream/main {report.onto} "
            f"{outcome.branch}   # --onto was {report.onto}; the pull request goes to main",
        )


def pr_base(onto: str) -> str | None:
    """The upstream branch a pull request from ``onto`` goes to: the branch itself (without
    its remote), or None for a tag or a commit (then it goes to main after a rebase)."""
    name = onto.rsplit("/", 1)[-1] if "/" in onto else onto
    if re.fullmatch(r"v?\d+(\.\d+)+\S*|[0-9a-f]{7,40}", name):
        return None
    return name


__all__ = ["prepare", "PrReport", "PrOutcome", "MoePatchError"]
