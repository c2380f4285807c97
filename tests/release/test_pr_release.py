"""``moe-patch pr`` on a real release tree (0.33.0): branches ready for vLLM."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from moe_patch import lint, pr
from moe_patch.settings import Settings

pytestmark = [pytest.mark.release, pytest.mark.network]


def git(cwd, *args, env=None):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from moe_patch import sources

    root = tmp_path_factory.mktemp("pr")
    work = sources.from_cache("0.33.0", root / "vllm", None).path
    git(work, "config", "user.name", "Jane Dev")
    git(work, "config", "user.email", "jane.dev@users.noreply.github.com")
    git(work, "checkout", "-q", "-b", "my-work")
    before = (git(work, "rev-parse", "HEAD"), git(work, "status", "--porcelain"))
    report = pr.prepare(work, "0.33.0", root / "prs")
    return work, report, before, root / "prs"


def test_branches_only_for_patches_upstream_lacks(made):
    work, report, before, _ = made
    status = {o.id: o.status for o in report.outcomes}
    assert status == {
        "jit-annotations": pr.BRANCH,
        "backend-selector": pr.BRANCH,
        "swap-ab-split-k": pr.BRANCH,
        "triton-moe-warmup": pr.BRANCH,
    }
    assert (git(work, "rev-parse", "HEAD"), git(work, "status", "--porcelain")) == before
    assert git(work, "symbolic-ref", "--short", "HEAD") == "my-work"
    assert git(work, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_commits_are_signed_off_titled_and_lint_clean(made):
    work, report, _, _ = made
    tag = git(work, "rev-parse", "v0.33.0")
    ruff = lint.ruff_for(work)
    assert ruff.version == lint.pinned_version(work) == "0.14.0"  # vLLM's pre-commit pin
    config = ["--config", str(work / "pyproject.toml")]
    for outcome in report.outcomes:
        if not outcome.branch:
            continue
        assert git(work, "rev-parse", f"{outcome.branch}^") == tag
        message = git(work, "log", "-1", "--format=%B", outcome.branch)
        title = message.splitlines()[0]
        assert title.split("] ", 1)[0] in ("[Perf", "[Kernel")
        assert message.rstrip().endswith(
            "Signed-off-by: Jane Dev <jane.dev@users.noreply.github.com>"
        )
        assert all(": pass " in line for line in outcome.lint), outcome.lint
        assert all("ruff 0.14.0" in line for line in outcome.lint), outcome.lint
        assert outcome.tests and all(t.startswith("tests/kernels/moe/test_") for t in outcome.tests)
        for path in outcome.tests:
            text = git(work, "show", f"{outcome.branch}:{path}") + "\n"
            assert text.startswith(pr.SPDX_LINES)
            for args in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
                proc = subprocess.run(
                    [ruff.path, *args, *config, "--stdin-filename", path, "-"],
                    cwd=work,
                    input=text,
                    capture_output=True,
                    text=True,
                )
                assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pr_bodies_follow_the_template_with_the_measured_numbers(made):
    work, report, _, out = made
    results = json.loads(
        (Settings.resolve().results_dir / "provenance/h200-jit-sweep.json").read_text()
    )
    body = (out / "jit-annotations.md").read_text()
    # vLLM 0.33.0's own pull-request template: each of its headings once, each filled.
    template = git(work, "show", f"v0.33.0:{pr.TEMPLATE_PATH}")
    headings = [line for line in template.splitlines() if line.startswith("## ")]
    assert len(headings) >= 3
    for heading in headings:
        assert body.count(heading + "\n") == 1, heading
        section = body.split(heading + "\n", 1)[1].split("\n## ", 1)[0].split("\n---\n")[0]
        assert section.strip() and "<!--" not in section, heading
    assert template.split("\n---\n", 1)[1].strip() in body  # its checklist and footer kept
    assert "<paste" not in body and "<changed files>" not in body
    assert results["environment"]["gpu"] in body and results["command"] in body
    assert results["environment"]["torch"] in body and results["environment"]["triton"] in body
    for label in ("0.21.0", "0.33.0"):
        b, a = results["results"][label]["sweep"], results["results"][f"{label}+moe"]["sweep"]
        assert (
            f"| {label} | sweep | {b['variants']} → {a['variants']} | {b['stalls']} → "
            f"{a['stalls']} | {b['stall_seconds']:.2f} → {a['stall_seconds']:.2f} |"
        ) in body
    backend = (out / "backend-selector.md").read_text()
    e2e = json.loads(
        (
            Settings.resolve().results_dir / "provenance/h200-e2e-qwen3-30b-a3b-dynamic-ct.json"
        ).read_text()
    )
    for variant in e2e["variants"]:  # every engine's row, with the backend it ran
        assert f"| {variant['name']} | {variant['moe_backend']} | " in backend
    assert "vllm bench latency --model Qwen/Qwen3-30B-A3B-FP8" in backend
    split_k = (out / "swap-ab-split-k.md").read_text()
    assert "python benchmarks/kernels/benchmark_moe.py --model deepseek-ai/DeepSeek-V3" in split_k
    assert "Before: vLLM 0.33.0 as released" in split_k
    # vLLM 0.33.0's AGENTS.md: every item it asks an AI-assisted description to state is answered.
    for text in (body, backend, split_k):
        asked = text.split("## What AGENTS.md asks a description to state\n\n", 1)[1]
        asked = asked.split("\n---\n", 1)[0].strip().splitlines()
        assert len(asked) == 4 and not [line for line in asked if line.startswith("- [ ]")]
        assert "AI assistance was used: an AI coding agent" in asked[3]
    machine = (
        str(work),
        str(Path.home()),
        tempfile.gettempdir(),
        str(Settings.resolve().results_dir),
    )
    for text in (body, backend, split_k):
        assert not [path for path in machine if path in text]  # no path of this machine


def test_no_git_identity_is_refused_and_changes_nothing(made, tmp_path):
    work, *_ = made
    home = tmp_path / "home"
    home.mkdir()
    plain = dict(os.environ, HOME=str(home), GIT_CONFIG_NOSYSTEM="1", XDG_CONFIG_HOME=str(home))
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--shared", str(work), str(clone), env=plain)
    refs = git(clone, "for-each-ref", env=plain)
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "moe-patch"),
            "pr",
            "--source",
            str(clone),
            "--onto",
            "v0.33.0",
        ],
        cwd=tmp_path,
        env=plain,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("moe-patch: error: no git identity")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert git(clone, "for-each-ref", env=plain) == refs
    assert not (clone / ".git" / "moe-patch-pr").exists()
