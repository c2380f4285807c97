"""A branch's new tests, run on its base and on the branch: the proof vLLM's checklist asks for.

For every test file a branch adds under ``tests/``, ``pytest`` runs it in two scratch
``git worktree``s of the user's clone at once: on the branch's parent (the ``--onto``
commit, or the branch it is stacked on) with the test file copied in, and on the branch.  A test
earns its place when at least one of its tests fails (or errors, or is skipped for the
missing feature) on the base and all pass on the branch.  A file whose tests are all skipped
on the branch (they need a GPU, say) is listed as not run here, with pytest's reason.

Tests run with a Python that has vLLM's dependencies (its ``requirements/common.txt``, torch,
pytest): ``--python``, else ``MOE_PATCH_PR_PYTHON``, else the first of the clone's
``.venv/bin/python``, ``venv/bin/python``, ``python3`` on ``PATH`` and the Python running
moe-patch that imports torch and pytest.  The tree is put first on ``PYTHONPATH``; vLLM's own
``conftest.py`` files are loaded, unless their imports fail in that environment (vLLM's test
requirements missing): then the run is repeated without them.  Without a GPU,
``CUDA_VISIBLE_DEVICES`` is set empty, so that vLLM keeps the real Triton.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import git

from . import cache, gitutil

PYTHON_VARIABLE = "MOE_PATCH_PR_PYTHON"
_NOT_PASSED_ON = ("MOE_PATCH_DEBUG", "TRITON_INTERPRET")
TIMEOUT_S = 1800
OUTPUT_TAIL_CHARS = 6000
# Finds pytest and torch without importing torch (seconds), unless its build may have CUDA.
_PROBE = """
import importlib.metadata, importlib.util, sys
import pytest
torch = importlib.metadata.version("torch") if importlib.util.find_spec("torch") else ""
gpu = 0
if torch and "+cpu" not in torch:
    import torch as t
    gpu = int(t.cuda.is_available())
print(sys.version.split()[0], torch or "-", gpu)
"""


@dataclass
class Python:
    path: str
    versions: str  # "Python 3.12.3, torch 2.13.0+cpu"
    gpu: bool = False  # torch sees a CUDA device


@dataclass
class FileResult:
    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0
    problem: str = ""  # the first failure or error, one line
    skip_reason: str = ""


@dataclass
class Run:
    files: dict[str, FileResult] = field(default_factory=dict)
    returncode: int = 0
    without_conftest: bool = False
    problem: str = ""  # pytest did not report (crashed, timed out)
    output_tail: str = ""  # the end of what pytest printed, for a record of the run


def find_python(source: Path, given: str | None) -> tuple[Python | None, str]:
    """The Python to run tests with, or None and why not."""
    chosen = given or os.environ.get(PYTHON_VARIABLE)
    if chosen:
        found = _probe(chosen)
        if found is None:
            origin = "--python" if given else PYTHON_VARIABLE
            return None, f"{origin} {chosen} cannot import torch and pytest"
        return found, ""
    candidates = [
        source / ".venv" / "bin" / "python",
        source / "venv" / "bin" / "python",
        shutil.which("python3"),
        sys.executable,
    ]
    for candidate in dict.fromkeys(str(c) for c in candidates if c):
        if Path(candidate).exists():
            found = _probe(candidate)
            if found:
                return found, ""
    return None, (
        "no Python that imports torch and pytest was found (the clone's .venv, python3, "
        "moe-patch's own); pass --python with your vLLM development environment's"
    )


@functools.cache
def _probe(python: str) -> Python | None:
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=_env(None)
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    version, torch, gpu = (done.stdout.split() + ["?", "?", "0"])[:3]
    if torch == "-":
        return None  # a Python without torch cannot import vLLM
    if gpu == "1":
        return Python(python, f"Python {version}, torch {torch}, on a GPU", gpu=True)
    return Python(python, f"Python {version}, torch {torch}, no GPU", gpu=False)


def _env(tree: Path | None, gpu: bool = True) -> dict[str, str]:
    """The user's environment without what would steer Python or vLLM elsewhere.  Without
    a GPU, CUDA_VISIBLE_DEVICES is set empty, as a GPU worker without a device yet has it:
    vLLM then keeps the real Triton (its kernels' JIT attributes can be tested) instead of
    a placeholder.  TRITON_INTERPRET stays out too: it swaps every ``@triton.jit`` kernel
    for an interpreted one without those attributes, which is not what a reviewer runs."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_", "PYTHON", "PYTEST_")) and k not in _NOT_PASSED_ON
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return gitutil.without_repository_variables(env)


@contextlib.contextmanager
def scratch_tree(repo: Path, commit: str):
    """A detached worktree of ``repo`` at ``commit`` in the cache's scratch, removed after
    (a killed run's is swept by the next run and by ``moe-patch clean``; the worktree's
    record in ``repo`` is pruned by the next ``pr``)."""
    with cache.scratch("prtests") as holder:
        path = holder / "vllm"
        _forget_swept_trees(repo, holder.parent)
        gitutil.run(repo, "worktree", "add", "-q", "--detach", str(path), commit)
        try:
            yield path
        finally:
            with contextlib.suppress(git.GitCommandError):
                gitutil.run(repo, "worktree", "remove", "--force", str(path))
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(git.GitCommandError):
                gitutil.run(repo, "worktree", "prune")


def _forget_swept_trees(repo: Path, scratch: Path) -> None:
    """Drop ``repo``'s records of scratch trees a killed run left, once swept: git keeps a
    worktree killed while being added locked ("initializing"), which ``prune`` skips."""
    with contextlib.suppress(git.GitCommandError):
        listing = gitutil.run(repo, "worktree", "list", "--porcelain")
        for line in listing.splitlines():
            path = Path(line.removeprefix("worktree "))
            ours = path.is_relative_to(scratch) or path.is_relative_to(scratch.resolve())
            if line.startswith("worktree ") and ours and not path.exists():
                with contextlib.suppress(git.GitCommandError):
                    gitutil.run(repo, "worktree", "unlock", str(path))
        gitutil.run(repo, "worktree", "prune")


def run_tests(tree: Path, python: Python, tests: list[str]) -> Run:
    """``pytest`` on ``tests`` (paths relative to ``tree``), in ``tree``."""
    run = _pytest(tree, python, tests, conftest=True)
    if run.problem.startswith("ImportError while loading conftest"):
        run = _pytest(tree, python, tests, conftest=False)
        run.without_conftest = True
    return run


def _pytest(tree: Path, python: Python, tests: list[str], conftest: bool) -> Run:
    with tempfile.TemporaryDirectory(prefix="moe-patch-pr-junit-") as scratch:
        report = Path(scratch) / "junit.xml"
        command = [
            python.path, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            f"--junitxml={report}", "-o", "junit_family=xunit1",
            *([] if conftest else ["--noconftest"]), *tests,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, cwd=tree, env=_env(tree, python.gpu), capture_output=True, text=True,
                timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Run(returncode=124, problem=f"pytest ran past {TIMEOUT_S} s")
        except OSError as exc:
            return Run(returncode=127, problem=f"pytest did not start: {exc.strerror}")
        output = (done.stdout or "") + (done.stderr or "")
        tail = output[-OUTPUT_TAIL_CHARS:]
        if not report.is_file():
            return Run(returncode=done.returncode, problem=_first_line(output), output_tail=tail)
        run = Run(returncode=done.returncode, output_tail=tail)
        _read_junit(report, tests, run)
        if not any(r.passed or r.failed or r.skipped for r in run.files.values()):
            run.problem = _first_line(output)
        return run


def _first_line(output: str) -> str:
    for line in output.splitlines():
        line = line.strip()
        if line.startswith(("ImportError while loading conftest", "E ", "ERROR")):
            return line.removeprefix("E").strip()[:200]
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "pytest said nothing"


def _read_junit(report: Path, tests: list[str], run: Run) -> None:
    for test in tests:
        run.files[test] = FileResult()
    for case in ET.parse(report).getroot().iter("testcase"):
        test = _file_of(case, tests)
        if test is None:
            continue
        result = run.files[test]
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            result.failed += 1
            if not result.problem:
                message = failure.get("message") or ""
                if message in ("", "collection failure"):  # the error is in the traceback
                    said = [ln[1:].strip() for ln in (failure.text or "").splitlines()
                            if ln.startswith("E ")]  # fmt: skip
                    message = said[-1] if said else message or "error"
                result.problem = _one_line(message)
        elif skipped is not None:
            result.skipped += 1
            if not result.skip_reason:
                result.skip_reason = _skip_reason(skipped)
        else:
            result.passed += 1


def _one_line(message: str) -> str:
    """A failure as a description can quote it: the assertion without pytest's "+ where"
    explanation, enum and object reprs shortened (``<Backend.X: 'X'>`` -> ``Backend.X``,
    ``<function f at 0x...>`` -> ``…``) and folders dropped from paths."""
    text = " ".join(message.split()).split(" + where ")[0]
    text = re.sub(r"<([\w.]+): [^<>]*>", r"\1", text)
    while re.search(r"<[^<>]*>", text):
        text = re.sub(r"<[^<>]*>", "…", text)
    text = re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+", "", text)
    return text[:100]


def _skip_reason(skipped: ET.Element) -> str:
    """pytest's reason for a skip; a module skipped while collected says it in the text."""
    message = skipped.get("message") or ""
    found = re.search(r"Skipped: (.*?)['\"]\)?\s*$", skipped.text or "")
    if found and (not message or message == "collection skipped"):
        message = found.group(1)
    return _one_line(message)


def _file_of(case: ET.Element, tests: list[str]) -> str | None:
    """The test file a JUnit testcase belongs to (``file`` where pytest records it, else its
    dotted ``classname``)."""
    named = case.get("file")
    if named in tests:
        return named
    classname = case.get("classname") or ""
    for test in tests:
        dotted = test.removesuffix(".py").replace("/", ".")
        if classname == dotted or classname.startswith(dotted + "."):
            return test
    return tests[0] if len(tests) == 1 else None


@dataclass
class Evidence:
    """What a branch's new tests did on its base and on the branch."""

    tests: list[str]
    base_name: str
    python: str = ""  # the versions it ran with
    base: Run | None = None
    branch: Run | None = None
    not_run: str = ""  # why nothing ran

    def verdicts(self) -> list[tuple[str, bool | None, str]]:
        """Per test file: (file, True pass / False fail / None not run here, why)."""
        if self.not_run:
            return [(t, False, f"not run: {self.not_run}") for t in self.tests]
        out = []
        for test in self.tests:
            on_branch = self.branch.files.get(test) if self.branch else None
            on_base = self.base.files.get(test) if self.base else None
            if on_branch is None or not (on_branch.passed or on_branch.failed or on_branch.skipped):
                problem = self.branch.problem if self.branch else ""
                out.append((test, False, f"did not run on the branch ({problem})"))
            elif on_branch.failed:
                out.append(
                    (test, False, f"fails on the branch: {on_branch.failed} failed "
                     f"({on_branch.problem})")
                )  # fmt: skip
            elif not on_branch.passed:
                out.append(
                    (test, None, f"all {on_branch.skipped} skipped here ({on_branch.skip_reason}):"
                     " run it on a GPU machine")
                )  # fmt: skip
            elif on_base and (on_base.failed or (on_base.skipped and not on_base.passed)):
                why = on_base.problem or on_base.skip_reason
                out.append(
                    (test, True, f"on {self.base_name} {_counts(on_base)} ({why}); on the branch "
                     f"{_counts(on_branch)}")
                )  # fmt: skip
            elif on_base is None or not (on_base.passed or on_base.failed or on_base.skipped):
                problem = self.base.problem if self.base else ""
                out.append(
                    (test, True, f"on {self.base_name} it cannot run ({problem}); on the branch "
                     f"{_counts(on_branch)}")
                )  # fmt: skip
            else:
                out.append(
                    (test, False, f"passes on {self.base_name} too ({_counts(on_base)}): it does "
                     "not exercise the change")
                )  # fmt: skip
        return out


def _counts(result: FileResult) -> str:
    parts = []
    for count, word in ((result.failed, "failed"), (result.passed, "passed"),
                        (result.skipped, "skipped")):  # fmt: skip
        if count:
            parts.append(f"{count} {word}")
    return ", ".join(parts) or "nothing ran"


def evidence_for(
    repo: Path,
    parent: str,
    branch_commit: str,
    tests: list[str],
    base_name: str,
    python: Python | None,
    why_no_python: str,
) -> Evidence:
    """Run ``tests`` (files the branch adds) on ``parent`` and on ``branch_commit``."""
    evidence = Evidence(tests, base_name)
    if not tests:
        return evidence
    if python is None:
        evidence.not_run = why_no_python
        return evidence
    evidence.python = python.versions
    # Base and branch in two worktrees at once: each run spends most of its time importing
    # vLLM, which does not share a core well with anything but another such import.
    with scratch_tree(repo, parent) as base, scratch_tree(repo, branch_commit) as tree:
        for test in tests:
            text = gitutil.run(
                repo, "show", f"{branch_commit}:{test}", strip_newline_in_stdout=False
            )
            (base / test).parent.mkdir(parents=True, exist_ok=True)
            (base / test).write_text(text)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            on_base = pool.submit(run_tests, base, python, tests)
            on_branch = pool.submit(run_tests, tree, python, tests)
            evidence.base, evidence.branch = on_base.result(), on_branch.result()
    if evidence.branch.without_conftest:
        evidence.python += ", pytest --noconftest (vLLM's test requirements missing)"
    return evidence
