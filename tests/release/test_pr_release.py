"""``moe-patch pr`` on real release trees (0.33.0, 0.34.0): branches vLLM's reviewers would
take, judged by the tree's own pull-request checklist.

Each branch's new tests run on its base and on it with the release's oracle environment
(CPU torch and the release's ``requirements/common.txt``: ``tests/release/oracle/venvs.py``),
the same one the oracle tests build, so CI builds it once.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from moe_patch import contribution, lint, pr, pr_checks
from moe_patch.settings import Settings

sys.path.insert(0, str(Path(__file__).with_name("oracle")))
import venvs  # noqa: E402  (the oracle tier's environments)

sys.path.insert(0, str(Path(__file__).parent))
import gpu_branch_tests  # noqa: E402  (the GPU-only tests' runs on a GPU machine)

pytestmark = [pytest.mark.release, pytest.mark.network]

BRANCH_TESTS = Path(__file__).resolve().parents[2] / "kernels" / "results" / "branch-tests"

# The branches of the 0.25+ series (0.33.0) and of the 0.34.0 series, in merge order.
ORDER = [
    "moe-patch/jit-annotations",
    "moe-patch/backend-selector",
    "moe-patch/fp8-moe-backend-env",
    "moe-patch/swap-ab-split-k",
    "moe-patch/split-k-launch-rules",
    "moe-patch/h200-fp8-moe-configs",
    "moe-patch/triton-moe-warmup",
    "moe-patch/fused-decode",
]


def git(cwd, *args, env=None):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


@pytest.fixture(scope="module", params=["0.33.0", "0.34.0"])
def made(request, tmp_path_factory):
    from moe_patch import sources

    version = request.param
    root = tmp_path_factory.mktemp(f"pr-{version}")
    work = sources.from_cache(version, root / "vllm", None).path
    git(work, "config", "user.name", "Jane Dev")
    git(work, "config", "user.email", "jane.dev@users.noreply.github.com")
    git(work, "checkout", "-q", "-b", "my-work")
    before = (git(work, "rev-parse", "HEAD"), git(work, "status", "--porcelain"))
    python = venvs.oracle_env(work).python
    report = pr.prepare(work, version, root / "prs", python=str(python))
    return version, work, report, before, root / "prs", python


def test_every_branch_passes_the_trees_own_checklist(made):
    version, work, report, before, _, _ = made
    assert report.order == ORDER
    failing = {o.id: [(c.name, c.detail) for c in o.checks if c.status != "pass"]
               for o in report.outcomes}  # fmt: skip
    assert failing == {o.id: [] for o in report.outcomes}
    assert all([c.name for c in o.checks] == list(pr_checks.ITEMS) for o in report.outcomes)
    assert (git(work, "rev-parse", "HEAD"), git(work, "status", "--porcelain")) == before
    assert git(work, "symbolic-ref", "--short", "HEAD") == "my-work"
    assert git(work, "worktree", "list", "--porcelain").count("worktree ") == 1
    by_id = {o.id: o for o in report.outcomes}
    # One focused change per branch, each on --onto or on the branch it depends on.
    assert by_id["fp8-moe-backend-env"].stacked_on == "moe-patch/backend-selector"
    assert by_id["split-k-launch-rules"].stacked_on == "moe-patch/swap-ab-split-k"
    assert by_id["h200-fp8-moe-configs"].stacked_on == "moe-patch/split-k-launch-rules"
    tag = git(work, "rev-parse", f"v{version}")
    for branch_id in ("jit-annotations", "backend-selector", "swap-ab-split-k"):
        assert git(work, "rev-parse", f"{by_id[branch_id].branch}^") == tag
    # The new tests: every CPU-runnable one failed on its base and passed on its branch.
    tests = {o.id: {c.name: c for c in o.checks}["tests"].detail for o in report.outcomes}
    for branch_id in ("jit-annotations", "backend-selector", "fp8-moe-backend-env",
                      "split-k-launch-rules", "triton-moe-warmup"):  # fmt: skip
        assert " failed" in tests[branch_id].split("; on the branch")[0], tests[branch_id]
        assert "on the branch" in tests[branch_id] and "passed" in tests[branch_id]
    assert tests["swap-ab-split-k"].startswith("GPU-only, not run here: ")
    assert tests["h200-fp8-moe-configs"] == "no code change: no new test needed"


def test_commits_are_signed_off_short_and_lint_clean(made, tmp_path):
    version, work, report, _, _, _ = made
    ruff = lint.ruff_for(work)
    assert ruff.version == lint.pinned_version(work)  # vLLM's pre-commit pin
    config = ["--config", str(work / "pyproject.toml")]
    for outcome in report.outcomes:
        message = git(work, "log", "-1", "--format=%B", outcome.branch)
        assert message.splitlines()[0].startswith(("[Kernel] ", "[Core] "))
        assert message.rstrip().endswith(
            "Signed-off-by: Jane Dev <jane.dev@users.noreply.github.com>"
        )
        assert "Assisted-by: an AI coding agent" in message
        assert all(": pass " in line for line in outcome.lint) or outcome.lint_ok is None
        # In a checkout of the branch: ruff sorts an import of a module the branch adds as
        # first-party only where the module's file exists.
        checkout = tmp_path / outcome.id
        git(work, "worktree", "add", "-q", "--detach", str(checkout), outcome.branch)
        try:
            for path in outcome.tests:
                text = (checkout / path).read_text()
                assert text.startswith(pr.SPDX_LINES)
                for args in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
                    proc = subprocess.run(
                        [ruff.path, *args, *config, "--stdin-filename", path, "-"],
                        cwd=checkout,
                        input=text,
                        capture_output=True,
                        text=True,
                    )
                    assert proc.returncode == 0, proc.stdout + proc.stderr
        finally:
            git(work, "worktree", "remove", "--force", str(checkout))


def test_descriptions_follow_the_template_and_label_their_numbers(made):
    version, work, report, _, out, _ = made
    template = git(work, "show", f"v{version}:{contribution.TEMPLATE_PATH}")
    headings = [line for line in template.splitlines() if line.startswith("## ")]
    assert headings == ["## Overview", "## Claims", "## Validation", "## Details"]
    machine = (str(work), str(Path.home()), tempfile.gettempdir(),
               str(Settings.resolve().results_dir))  # fmt: skip
    for outcome in report.outcomes:
        body = Path(outcome.description).read_text()
        for heading in headings:
            assert body.count(heading + "\n") == 1, (outcome.id, heading)
        assert template.split("\n---\n", 1)[1].strip().replace("- [ ] AI", "- [x] AI") in body
        assert not [path for path in machine if path in body]  # no path of this machine
        assert "moe_kernels" not in body and "kernels/studies" not in body
    jit = (out / "jit-annotations.md").read_text()
    configs = (out / "h200-fp8-moe-configs.md").read_text()
    if version == "0.33.0":  # runs on the pull request's own base release
        assert "Measured on vLLM 0.33.0, this pull request's base." in jit
        assert "Measured on vLLM 0.33.0, this pull request's base." in configs
    else:  # no run on 0.34.0 yet: the release it was measured on, said so
        assert "Measured on vLLM 0.33.0 (no run on 0.34.0, this pull request's base)." in jit
    assert "| configuration | baseline | with this change | change | runs | spread |" in configs
    assert "python benchmarks/kernels/benchmark_moe.py --model deepseek-ai/DeepSeek-V3" in configs
    env = (out / "fp8-moe-backend-env.md").read_text()
    assert "Depends on the pull request from `moe-patch/backend-selector`" in env


def test_check_alone_passes_on_the_branches_pr_made(made):
    version, work, _, _, out, python = made
    refs = git(work, "for-each-ref")
    report = pr.prepare(
        work, version, out, only=["jit-annotations"], python=str(python), check_only=True
    )
    assert report.ok and [c.status for c in report.outcomes[0].checks] == ["pass"] * len(
        pr_checks.ITEMS
    )
    assert git(work, "for-each-ref") == refs


def test_no_git_identity_is_refused_and_changes_nothing(made, tmp_path):
    _, work, *_ = made
    home = tmp_path / "home"
    home.mkdir()
    plain = dict(os.environ, HOME=str(home), GIT_CONFIG_NOSYSTEM="1", XDG_CONFIG_HOME=str(home))
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--shared", str(work), str(clone), env=plain)
    refs = git(clone, "for-each-ref", env=plain)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "moe-patch"), "pr", "--source", str(clone),
         "--onto", "v0.33.0"],
        cwd=tmp_path,
        env=plain,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("moe-patch: error: no git identity")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert git(clone, "for-each-ref", env=plain) == refs
    assert not (clone / ".git" / "moe-patch-pr").exists()


def test_the_gpu_only_tests_were_shown_on_a_gpu_for_these_very_branches(made):
    """CI has no GPU: a branch whose new tests need one was run on a GPU machine
    (``gpu_branch_tests.py``), and the record is of the change this branch makes today."""
    version, work, report, *_ = made
    records = [json.loads(path.read_text()) for path in BRANCH_TESTS.glob("*.json")]
    gpu_only = [o for o in report.outcomes
                if {c.name: c for c in o.checks}["tests"].detail.startswith("GPU-only")]  # fmt: skip
    assert [o.id for o in gpu_only] == ["swap-ab-split-k", "fused-decode"]
    for outcome in gpu_only:
        parent = git(work, "rev-parse", f"{outcome.branch}^")
        today = gpu_branch_tests.diff_sha256(work, parent, outcome.branch)
        of_today = [r for r in records if r["parent_describe"] == f"v{version}"
                    and r["branch"] == outcome.branch and r["diff_sha256"] == today]  # fmt: skip
        shown = [r for r in of_today if all(v["shown"] is True for v in r["verdicts"])]
        assert shown, f"no GPU run shows {outcome.branch} on v{version}: run it (gpu_branch_tests)"
        assert all(r["tests"] == outcome.tests for r in shown)


def test_a_gpu_record_names_no_path_of_the_gpu_machine():
    """pytest's warnings name the files of the machine's packages, in both forms it uses, and a
    collection error the copy of the tree the test ran in."""
    output = (
        "../../../../opt/torch/.venv/lib/python3.12/site-packages/torch/jit/_script.py:365: 1\n"
        "  /usr/lib/python3/dist-packages/../site-packages/torch/x.py:2: DeprecationWarning\n"
        "tests/kernels/moe/test_fused_moe_split_k_kernel.py:107: AssertionError\n"
        "ImportError while importing test module '/{root}/.cache/moe-patch/scratch/"
        "prtests-1718.53018-j0j61kfk/vllm/tests/kernels/moe/test_fused_moe_decode.py'.\n"
    ).format(root="root")  # spelt so that this file names no machine
    assert gpu_branch_tests._anonymous(output) == (
        "<site-packages>/torch/jit/_script.py:365: 1\n"
        "  <site-packages>/torch/x.py:2: DeprecationWarning\n"
        "tests/kernels/moe/test_fused_moe_split_k_kernel.py:107: AssertionError\n"
        "ImportError while importing test module "
        "'<scratch>/vllm/tests/kernels/moe/test_fused_moe_decode.py'.\n"
    )
