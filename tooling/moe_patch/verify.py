"""``moe-patch verify``: is the series true on every release it claims to serve?

One report, every check named:

per series base (``patches/vX.Y.Z``)
  ``series-integrity``  the ``series`` file and the patch files agree both ways; every
                        patch parses, has a Subject, a reason, ``Upstream-Status`` and
                        ``Signed-off-by``, and stays inside the tree
  ``exported-form``     applied to its base release, every patch is reproduced byte for
                        byte by re-exporting its commit (the files are up to date)
the whole series
  ``release-version``   the series is what the last release recorded (``patches/releases/``),
                        or moe-patch's version has moved past it (:mod:`moe_patch.releases`)
per release
  ``apply``             the series applies in order, without fuzz; the per-patch status
                        (applied / 3-way / already upstream) is what ``apply`` reports
  ``compile``           every Python file the series touches compiles
  ``ruff-check``        ``ruff check`` with the tree's own configuration passes on the
  ``ruff-format``       touched files, and ``ruff format --check`` too (findings already
                        present in the unpatched file are reported, not counted)
  ``kernels``           (``--kernels``) the kernel tests run against the patched tree

Releases are checked in parallel, each in its own temporary tree from the cache.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import git
from packaging.version import Version

from . import (
    applier,
    cache,
    export,
    gitutil,
    index,
    lint,
    patchfile,
    releases,
    series,
    sources,
    trees,
)
from .errors import MoePatchError, UsageError
from .headers import header_problems
from .pipconfig import index_settings
from .report import APPLIED, FAIL, FAILED, PASS, SKIP, as_json
from .settings import Settings
from .upstreaming import dependency_problems

SERIES_CHECKS = ("series-integrity", "exported-form")
RELEASE_CHECKS = ("apply", "compile", "ruff-check", "ruff-format", "kernels")
PYTHON_SUFFIXES = (".py", ".pyi")


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""


@dataclass
class SeriesResult:
    base: str
    checks: list[Check] = field(default_factory=list)


@dataclass
class ReleaseResult:
    version: str
    base: str
    checks: list[Check] = field(default_factory=list)
    patches: list[dict] = field(default_factory=list)  # id, status, detail, upstream_status
    seconds: float = 0.0

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)


@dataclass
class VerifyReport:
    series: list[SeriesResult] = field(default_factory=list)
    releases: list[ReleaseResult] = field(default_factory=list)
    release: Check | None = None  # release-version: the series against its last release
    jobs: int = 1
    elapsed_s: float = 0.0

    def all_checks(self) -> list[tuple[str, Check]]:
        found = [(f"v{s.base}", c) for s in self.series for c in s.checks]
        found += [("series", self.release)] if self.release else []
        return found + [(r.version, c) for r in self.releases for c in r.checks]

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for _, c in self.all_checks())

    def counts(self) -> Counter:
        return Counter(c.status for _, c in self.all_checks())

    def to_json(self) -> str:
        return as_json(self, ok=self.ok, counts=dict(self.counts()))


# --- which releases -----------------------------------------------------------------


def supported_releases(settings: Settings | None = None) -> list[str]:
    """Every release on the package index that a series serves (from the oldest base on)."""
    settings = settings or Settings.resolve()
    known = series.required_bases(settings.series_root)
    oldest = Version(known[0])
    listed = [d.version for d in index.distributions(index_settings(settings.index_url))]
    return sorted({v for v in listed if Version(v) >= oldest}, key=Version)


# --- series-level checks ------------------------------------------------------------


def check_integrity(base: str, series_root: Path) -> Check:
    directory = series_root / f"v{base}"
    problems: list[str] = []
    try:
        lines = (directory / series.SERIES_FILE).read_text().splitlines()
    except OSError:
        return Check("series-integrity", FAIL, f"{directory / series.SERIES_FILE} is missing")
    listed: list[str] = []
    for line in lines:
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        name = entry.split()[0]
        if name in listed:
            problems.append(f"series lists {name} twice")
        listed.append(name)
    on_disk = sorted(p.name for p in directory.glob("*.patch"))
    for name in on_disk:
        if name not in listed:
            problems.append(f"{name} is not listed in series")
    read = []
    for name in dict.fromkeys(listed):
        path = directory / name
        if "/" in name or not path.is_file():
            problems.append(f"series lists {name}, which does not exist")
            continue
        try:
            patch = patchfile.read(path)
        except MoePatchError as exc:
            problems.append(exc.message)
            continue
        read.append(patch)
        problems += [f"{name}: {p}" for p in header_problems(patch)]
    problems += dependency_problems(read)
    count = len(read)
    if problems:
        return Check("series-integrity", FAIL, "; ".join(problems))
    return Check(
        "series-integrity",
        PASS,
        f"{count} patch{'es' if count != 1 else ''}: series file, headers and paths agree",
    )


def check_exported_form(tree: Path, chosen: series.Series, outcomes) -> Check:
    problems = []
    for patch, outcome in zip(chosen.patches, outcomes, strict=True):
        if outcome.status != APPLIED or not outcome.commit:
            problems.append(f"{patch.path.name} is '{outcome.status}' on its own base")
            continue
        again = export.format_commit(tree, outcome.commit)
        original = patch.path.read_bytes()
        if again != original:
            problems.append(f"{patch.path.name}: {_first_difference(original, again)}")
    if problems:
        return Check(
            "exported-form",
            FAIL,
            "; ".join(problems) + " (regenerate with moe-patch checkout, then moe-patch export)",
        )
    return Check(
        "exported-form",
        PASS,
        f"re-exporting {len(chosen.patches)} commit(s) reproduces the files byte for byte",
    )


def _first_difference(original: bytes, again: bytes) -> str:
    old, new = original.decode(errors="replace"), again.decode(errors="replace")
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number, (a, b) in enumerate(zip(old_lines, new_lines, strict=False), start=1):
        if a != b:
            return f"line {number} is {a[:60]!r}, the re-export has {b[:60]!r}"
    if len(old_lines) != len(new_lines):
        return f"{len(old_lines)} lines, the re-export has {len(new_lines)}"
    return "differs from its re-export in line endings or the final newline"


# --- release-level checks -----------------------------------------------------------


def touched_python_files(tree: Path, base_commit: str) -> list[str]:
    listing = gitutil.run(tree, "diff", "--name-only", "--diff-filter=d", base_commit, "HEAD")
    return [f for f in listing.splitlines() if f.endswith(PYTHON_SUFFIXES)]


def check_compile(tree: Path, files: list[str]) -> Check:
    problems = []
    for name in files:
        try:
            compile((tree / name).read_bytes(), name, "exec", dont_inherit=True)
        except SyntaxError as exc:
            problems.append(f"{name}:{exc.lineno}: {exc.msg}")
        except (ValueError, OSError) as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        return Check("compile", FAIL, "; ".join(problems))
    return Check("compile", PASS, f"{len(files)} file(s) compile")


def check_ruff_lint(ruff: lint.Ruff, tree: Path, files: list[str], base_commit: str) -> Check:
    config, label = lint.config(tree)
    label = f"{label}, {lint.describe(ruff)}"
    common = ["check", "--no-cache", "--output-format", "json", "--exit-zero", *config]
    proc = lint.run(ruff, tree, *common, "--", *files)
    if proc.returncode != 0:
        return Check("ruff-check", FAIL, f"ruff could not run: {lint.error(proc)}")
    findings = json.loads(proc.stdout or "[]")
    new, old = [], 0
    by_file: dict[str, list[dict]] = {}
    for item in findings:
        by_file.setdefault(os.path.relpath(item["filename"], tree), []).append(item)
    for name, items in by_file.items():
        before: Counter = Counter()
        text = lint.base_text(tree, base_commit, name)
        if text is not None:
            base = lint.run(ruff, tree, *common, "--stdin-filename", name, "-", stdin=text)
            before = Counter((i["code"], i["message"]) for i in json.loads(base.stdout or "[]"))
        for item in items:
            key = (item["code"], item["message"])
            if before[key] > 0:
                before[key] -= 1
                old += 1
            else:
                row = item.get("location", {}).get("row", "?")
                new.append(f"{name}:{row}: {item['code'] or 'error'} {item['message']}")
    if new:
        more = f" (+{len(new) - 3} more)" if len(new) > 3 else ""
        return Check("ruff-check", FAIL, "; ".join(new[:3]) + more + f" [{label}]")
    note = f"; {old} finding(s) already in the unpatched files" if old else ""
    return Check("ruff-check", PASS, f"{len(files)} file(s) clean with the tree's {label}{note}")


def check_ruff_format(ruff: lint.Ruff, tree: Path, files: list[str], base_commit: str) -> Check:
    config, label = lint.config(tree)
    label = f"{label}, {lint.describe(ruff)}"
    proc = lint.run(ruff, tree, "format", "--diff", "--no-cache", *config, "--", *files)
    if proc.returncode == 0:
        return Check(
            "ruff-format", PASS, f"{len(files)} file(s) formatted as the tree's {label} says"
        )
    if proc.returncode != 1:
        return Check("ruff-format", FAIL, f"ruff could not run: {lint.error(proc)}")
    ours, theirs = [], []
    for name, diff in _split_diff(proc.stdout, tree).items():
        text = lint.base_text(tree, base_commit, name)
        if text is not None:
            args = ("format", "--check", "--no-cache", *config, "--stdin-filename", name, "-")
            unformatted_before = lint.run(ruff, tree, *args, stdin=text).returncode == 1
            if unformatted_before and not _touches_patch(tree, diff, name, base_commit):
                theirs.append(name)
                continue
        ours.append(name)
    if ours:
        return Check(
            "ruff-format", FAIL, f"would reformat the patched lines of {', '.join(ours)} [{label}]"
        )
    return Check(
        "ruff-format",
        PASS,
        f"{len(files)} file(s): the patched lines are formatted ({', '.join(theirs)} "
        "was not formatted before the series either)",
    )


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)
_DIFF_FILE = re.compile(r"^--- (.+)\n\+\+\+ ", re.MULTILINE)


def _split_diff(text: str, tree: Path) -> dict[str, str]:
    """The formatter's unified diff, per file (paths relative to the tree)."""
    marks = list(_DIFF_FILE.finditer(text))
    parts = {}
    for at, mark in enumerate(marks):
        end = marks[at + 1].start() if at + 1 < len(marks) else len(text)
        name = mark.group(1).strip()
        name = os.path.relpath(name, tree) if os.path.isabs(name) else name
        parts[name] = text[mark.start() : end]
    return parts


def _touches_patch(tree: Path, formatter_diff: str, name: str, base: str) -> bool:
    """Does the formatter want to change lines that the series added or changed?"""
    wanted = set()  # lines of the patched file the formatter would change
    line = 0
    for text in formatter_diff.splitlines():
        match = _HUNK.match(text)
        if match:
            line = int(match.group(1))
        elif text.startswith("-") and not text.startswith("---"):
            wanted.add(line)
            line += 1
        elif text.startswith("+") and not text.startswith("+++"):
            wanted.update((line - 1, line))  # an insertion touches its neighbours
        elif text.startswith(" "):
            line += 1
    ours = gitutil.run(tree, "diff", "--no-ext-diff", "-U0", base, "HEAD", "--", name)
    for match in _HUNK.finditer(ours):
        start, length = int(match.group(3)), int(match.group(4) or 1)
        if wanted.intersection(range(start, start + max(length, 1))):
            return True
    return False


def check_kernels(tree: Path, python: str | None, tests: Path) -> Check:
    if not tests.is_dir():
        return Check(
            "kernels",
            FAIL,
            f"no kernel tests at {tests}: they ship with a moe-patch checkout, not the package; "
            "run from a checkout or set MOE_PATCH_KERNEL_TESTS to its tests/kernels",
        )
    command = [
        python or sys.executable,
        "-m",
        "pytest",
        str(tests),
        "--confcutdir",
        str(tests),
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    env = {**os.environ, "MOE_KERNELS_TREES": str(tree)}
    cwd = tests.parent.parent if tests.parent.name == "tests" else tests
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    lines = [line.strip("= ").strip() for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else f"pytest exited with {proc.returncode}"
    if proc.returncode == 0:
        return Check("kernels", PASS, summary)
    if proc.returncode == 5:
        return Check("kernels", FAIL, f"no kernel tests ran ({summary})")
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return Check("kernels", FAIL, "; ".join(failed[:3] + [summary]))


# --- running it ---------------------------------------------------------------------


@dataclass
class _Job:
    version: str
    base: str
    release: bool  # run the release checks
    exported: bool  # this is a series base: run the exported-form check


def _run_job(
    job: _Job, settings: Settings, kernels: bool, kernels_python, workdir: Path
) -> tuple[ReleaseResult | None, Check | None]:
    index_url = settings.index_url
    started = time.perf_counter()
    result = ReleaseResult(job.version, job.base) if job.release else None
    exported: Check | None = None
    into = Path(tempfile.mkdtemp(prefix=f"vllm-{job.version}-", dir=workdir))
    try:
        try:
            chosen = series.load(job.base, settings.series_root)
            work = sources.from_cache(job.version, into, index_url)
            report = applier.apply_series(
                work.path, work.base, job.version, chosen, None, index_url
            )
        except (MoePatchError, git.GitCommandError) as exc:
            exc = exc if isinstance(exc, MoePatchError) else MoePatchError(_git_error(exc))
            if result:
                result.checks.append(Check("apply", FAIL, exc.message))
                result.checks += [Check(n, SKIP, "not run: apply failed") for n in _rest(kernels)]
            if job.exported:
                exported = Check("exported-form", FAIL, exc.message)
            return result, exported
        if job.exported:
            exported = check_exported_form(work.path, chosen, report.outcomes)
        if result is None:
            return None, exported
        result.patches = [
            {
                "id": o.id,
                "status": o.status,
                "detail": o.detail,
                "upstream_status": o.upstream_status,
            }
            for o in report.outcomes
        ]
        statuses = ", ".join(f"{o.id}: {o.status}" for o in report.outcomes) or "empty series"
        if not report.ok:
            failed = next(o for o in report.outcomes if o.status == FAILED)
            result.checks.append(Check("apply", FAIL, f"{failed.id}: {failed.detail}"))
            result.checks += [Check(n, SKIP, "not run: apply failed") for n in _rest(kernels)]
            return result, exported
        inexact = [o.id for o in report.outcomes if o.status != APPLIED]
        if job.version == job.base and inexact:
            detail = f"{statuses} (on its own base every patch must apply exactly)"
            result.checks.append(Check("apply", FAIL, detail))
        else:
            result.checks.append(Check("apply", PASS, statuses))
        files = touched_python_files(work.path, work.base)
        result.checks.append(check_compile(work.path, files))
        ruff = lint.ruff_for(work.path, index_url) if files else None
        if not files:
            result.checks += [
                Check(n, PASS, "no Python file touched") for n in ("ruff-check", "ruff-format")
            ]
        elif ruff is None:
            missing = lint.MISSING
            result.checks += [Check(n, FAIL, missing) for n in ("ruff-check", "ruff-format")]
        else:
            result.checks.append(check_ruff_lint(ruff, work.path, files, work.base))
            result.checks.append(check_ruff_format(ruff, work.path, files, work.base))
        if kernels:
            result.checks.append(
                check_kernels(work.path, kernels_python, settings.kernel_tests_dir)
            )
        return result, exported
    finally:
        shutil.rmtree(into, ignore_errors=True)
        if result:
            result.seconds = round(time.perf_counter() - started, 2)


def _listed(version: str, index_url: str | None) -> bool:
    try:
        return any(d.version == version for d in index.distributions(index_settings(index_url)))
    except MoePatchError:
        return False


def _git_error(exc: git.GitCommandError) -> str:
    lines = [line.strip() for line in str(exc.stderr or exc).splitlines() if line.strip()]
    return f"git failed: {lines[-1] if lines else exc}"


def _rest(kernels: bool) -> list[str]:
    return [n for n in RELEASE_CHECKS[1:] if kernels or n != "kernels"]


def verify(
    versions: list[str] | None = None,
    kernels: bool = False,
    kernels_python: str | None = None,
    jobs: int | None = None,
    settings: Settings | None = None,
) -> VerifyReport:
    """Verify the series on ``versions`` (default: every supported release)."""
    started = time.perf_counter()
    settings = settings or Settings.resolve()
    gitutil.require_git()  # set-up problems are bad input before any work, not failed checks
    lint.configured()
    if kernels and kernels_python and shutil.which(kernels_python) is None:
        raise UsageError(
            f"--kernels-python {kernels_python!r} (or MOE_PATCH_KERNELS_PYTHON) is not a program "
            "moe-patch can run; give the path of a Python that has torch and triton"
        )
    root, index_url = settings.series_root, settings.index_url
    known = series.required_bases(root)
    if versions:
        chosen = list(dict.fromkeys(trees.resolve_version(v, index_url) for v in versions))
        bases = sorted({series.base_for(v, root) for v in chosen}, key=Version)
    else:
        chosen = supported_releases(settings)
        bases = known
    plan: dict[str, _Job] = {}
    for version in chosen:
        plan[version] = _Job(version, series.base_for(version, root), True, version in bases)
    unreleased = []  # bases made with rebase --source from a release the index lacks
    for base in bases:
        if base not in plan and not trees.cached_repo(base) and not _listed(base, index_url):
            unreleased.append(base)
            continue
        plan.setdefault(base, _Job(base, base, False, True))
    jobs = max(1, jobs or os.cpu_count() or 1)
    report = VerifyReport(jobs=jobs)
    exported: dict[str, Check] = {}
    # Under the cache, named for this run: a killed verify's trees are swept by the next
    # run that makes scratch and by `moe-patch clean`.
    with cache.scratch("verify") as workdir:
        ordered = sorted(plan.values(), key=lambda j: Version(j.version))
        arguments = (settings, kernels, kernels_python, workdir)
        if jobs == 1 or len(ordered) == 1:
            outcomes = [_run_job(j, *arguments) for j in ordered]
        else:
            # Processes, not threads: CPython's ast (used by probes and the compile check)
            # is not safe to use from several threads at once.
            context = multiprocessing.get_context("spawn")
            workers = min(jobs, len(ordered))
            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
                futures = [pool.submit(_run_job, j, *arguments) for j in ordered]
                outcomes = [f.result() for f in futures]
        for job, (result, check) in zip(ordered, outcomes, strict=True):
            if result:
                report.releases.append(result)
            if check:
                exported[job.version] = check
    for base in bases:
        checks = [check_integrity(base, root)]
        why = f"vLLM {base} is not on the package index yet" if base in unreleased else "not run"
        checks.append(exported.get(base) or Check("exported-form", SKIP, why))
        report.series.append(SeriesResult(base, checks))
    released = releases.compare(root)
    report.release = Check("release-version", released.status, released.detail)
    report.elapsed_s = round(time.perf_counter() - started, 1)
    return report
