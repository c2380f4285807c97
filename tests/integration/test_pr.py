"""``moe-patch pr``: upstream-ready branches and vLLM's checklist, on a synthetic vLLM clone."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner
from killhook import run_killed
from moe_patch import contribution, pr, pr_checks, pr_description, pr_tests, series
from moe_patch.cli import main
from moe_patch.errors import StateError, UsageError
from moe_patch.upstreaming import Upstreaming, dependency_problems
from support import (
    JIT_EDIT,
    JIT_PROBE,
    PATCH_AUTHOR,
    author_series,
    git,
    release_files,
    tree_digest,
    write_files,
)

RESULTS = {
    "command": "python -m moe_kernels.jit_sweep --tree 1.0.0=a --tree 1.0.0+moe=b",
    "environment": {"gpu": "Test GPU 9000", "torch": "9.9.9", "triton": "8.8.8", "cuda": "7.7"},
    "shape": "tiny",
    "quant": "tensor",
    "sweep_token_counts": [1, 2, 3],
    "trace": {"steps": 11, "seed": 5},
    "results": {
        "1.0.0": {
            "sweep": {"variants": 41, "stalls": 23, "stall_seconds": 17.125},
            "trace": {"variants": 43, "stalls": 29, "stall_seconds": 19.5},
        },
        "1.0.0+moe": {
            "sweep": {"variants": 13, "stalls": 5, "stall_seconds": 3.25},
            "trace": {"variants": 17, "stalls": 7, "stall_seconds": 4.75},
        },
    },
}

KERNEL = "vllm/model_executor/layers/fused_moe/fused_moe.py"
JIT_TEST = "tests/kernels/moe/test_fused_moe_jit_specialization.py"
JIT_TEST_TEXT = f'''"""The kernel does not specialise on token counts."""

from pathlib import Path


def test_token_counts_are_not_specialised():
    source = Path("{KERNEL}").read_text()
    assert 'do_not_specialize=["EM", "num_valid_tokens"]' in source
'''
FEATURE_TEST = "tests/test_feature.py"
MORE_TEST = "tests/test_more.py"
JIT_BENCHMARK = "vllm bench latency --model org/a-model --batch-size 1"
JIT_DESCRIPTION = """## Overview
Stops the kernel from specialising on token counts.

## Claims
- Fewer compiled variants (table below).
- No change to what the kernel computes.

## Details
Triton specialises integer arguments; these change with every batch.

## Supporting material
How the sweep was run, at length.
"""


def _test_file(module: str, name: str) -> str:
    return f"from vllm.extra import {name}\n\n\ndef test_{name.lower()}():\n    assert {name}\n"


def write_series(root, results):
    """The synthetic series under ``root`` (with its upstream tests and a description
    source) and the results file its jit-annotations cites, under ``results``."""
    author_series(
        root,
        "1.0.0",
        [
            {
                "id": "jit-annotations",
                "subject": "fused_moe: do not specialise on token counts",
                "edit": JIT_EDIT,
                "trailers": [
                    "Upstream-Status: Pending",
                    JIT_PROBE,
                    "Upstream-Tag: [Perf]",
                    f"Upstream-Test: {JIT_TEST}",
                    "Upstream-Results: h200-jit-sweep.json",
                    f"Upstream-Benchmark: {JIT_BENCHMARK}",
                    "Assisted-by: an AI coding agent",
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
            {
                "id": "backport",
                "edit": {"vllm/backport.py": "X = 1\n"},
                "trailers": [
                    "Upstream-Status: Inappropriate [backport]",
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
            {
                "id": "feature",
                "subject": "feature: add it",
                "edit": {"vllm/extra.py": "FEATURE = True\n"},
                "trailers": [
                    "Upstream-Status: Pending",
                    f"Upstream-Test: {FEATURE_TEST}",
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
            {
                "id": "on-feature",
                "edit": {"vllm/extra.py": "FEATURE = True\nMORE = True\n"},
                "trailers": [
                    "Upstream-Status: Pending",
                    "Upstream-Title: [Bugfix] Add MORE",
                    "Upstream-Depends: feature",
                    f"Upstream-Test: {MORE_TEST}",
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
        ],
    )
    upstream = root / "upstream"
    for path, text in (
        (JIT_TEST, JIT_TEST_TEXT),
        (FEATURE_TEST, _test_file("vllm.extra", "FEATURE")),
        (MORE_TEST, _test_file("vllm.extra", "MORE")),
    ):
        (upstream / path).parent.mkdir(parents=True, exist_ok=True)
        (upstream / path).write_text(pr.SPDX_LINES + text)
    (upstream / "descriptions").mkdir()
    (upstream / "descriptions" / "jit-annotations.md").write_text(JIT_DESCRIPTION)
    results.mkdir()
    (results / "h200-jit-sweep.json").write_text(json.dumps(RESULTS))


def use_series(monkeypatch, root, results):
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    monkeypatch.setenv("MOE_PATCH_RESULTS", str(results))
    # The branches' tests run with the Python running these tests (it has torch and pytest).
    monkeypatch.setenv(pr_tests.PYTHON_VARIABLE, sys.executable)


@pytest.fixture
def pr_series(tmp_path, monkeypatch):
    root, results = tmp_path / "patches", tmp_path / "results"
    write_series(root, results)
    use_series(monkeypatch, root, results)
    return root


@pytest.fixture
def clone(tmp_path):
    return make_clone(tmp_path)


def make_clone(tmp_path):
    """The user's vLLM clone: tag v1.0.0, on their own branch, with an untracked file."""
    work = tmp_path / "vllm"
    write_files(work, release_files("1.0.0"))
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A", "-f")
    git(work, "commit", "-q", "-m", "base")
    git(work, "tag", "v1.0.0")
    git(work, "config", "user.name", "Jane Dev")
    git(work, "config", "user.email", "jane.dev@users.noreply.github.com")
    git(work, "checkout", "-q", "-b", "my-work")
    (work / "notes.txt").write_text("mine\n")
    return work


def state(work):
    return (
        git(work, "rev-parse", "HEAD"),
        git(work, "symbolic-ref", "HEAD"),
        git(work, "status", "--porcelain", "--untracked-files=all"),
        git(work, "worktree", "list", "--porcelain").count("worktree "),
    )


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def checks_of(report: dict, patch_id: str) -> dict[str, dict]:
    outcome = next(o for o in report["outcomes"] if o["id"] == patch_id)
    return {c["name"]: c for c in outcome["checks"]}


def failing(report: dict) -> dict[str, list[str]]:
    return {
        o["id"]: [c["name"] for c in o["checks"] if c["status"] == "fail"]
        for o in report["outcomes"]
        if any(c["status"] == "fail" for c in o["checks"])
    }


def test_branches_per_pending_patch_pass_the_checklist(pr_series, clone, tmp_path):
    before = state(clone)
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "1.0.0", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert failing(report) == {} and report["ok"]
    by_id = {o["id"]: o for o in report["outcomes"]}
    assert by_id["backport"]["status"] == pr.SKIPPED_INAPPROPRIATE
    assert by_id["jit-annotations"]["status"] == pr.BRANCH
    assert by_id["feature"]["status"] == pr.BRANCH
    assert by_id["on-feature"]["status"] == pr.STACKED  # declared: Upstream-Depends: feature
    assert by_id["on-feature"]["stacked_on"] == "moe-patch/feature"
    assert by_id["on-feature"]["detail"] == ""  # declared, so nothing to say about it
    assert state(clone) == before  # HEAD, branch, working tree, no worktree left behind
    assert [c["name"] for c in by_id["feature"]["checks"]] == list(pr_checks.ITEMS)

    branches = git(clone, "branch", "--list", "moe-patch/*", "--format=%(refname:short)").split()
    assert sorted(branches) == [
        "moe-patch/feature",
        "moe-patch/jit-annotations",
        "moe-patch/on-feature",
    ]
    tag = git(clone, "rev-parse", "v1.0.0")
    for branch in branches:
        message = git(clone, "log", "-1", "--format=%B", branch)
        assert message.rstrip().endswith(
            "Signed-off-by: Jane Dev <jane.dev@users.noreply.github.com>"
        )
        assert "Upstream-" not in message  # the series' own trailers stay in the series
        assert (
            git(clone, "log", "-1", "--format=%an <%ae>", branch)
            == "Jane Dev <jane.dev@users.noreply.github.com>"
        )
    jit_message = git(clone, "log", "-1", "--format=%B", "moe-patch/jit-annotations")
    assert jit_message.splitlines()[0] == "[Perf] Do not specialise on token counts"
    assert jit_message.rstrip().endswith(
        "Assisted-by: an AI coding agent\n"
        "Signed-off-by: Jane Dev <jane.dev@users.noreply.github.com>"
    )
    assert git(clone, "log", "-1", "--format=%s", "moe-patch/on-feature") == "[Bugfix] Add MORE"
    assert git(clone, "rev-parse", "moe-patch/jit-annotations^") == tag
    assert git(clone, "rev-parse", "moe-patch/on-feature^") == git(
        clone, "rev-parse", "moe-patch/feature"
    )
    added = git(clone, "show", f"moe-patch/jit-annotations:{JIT_TEST}") + "\n"
    assert added == (pr_series / "upstream" / JIT_TEST).read_text()  # the series' file, as is

    # The new tests failed on the base and passed on the branch, and the report says so.
    tests = checks_of(report, "jit-annotations")["tests"]["detail"]
    assert tests.startswith(f"{JIT_TEST}: on v1.0.0 1 failed (assert 'do_not_specialize")
    assert "on the branch 1 passed" in tests
    assert "on moe-patch/feature 1 failed" in checks_of(report, "on-feature")["tests"]["detail"]

    body = (out / "jit-annotations.md").read_text()
    for section in ("## Purpose", "## Test Plan", "## Test Result"):
        assert body.count(section) == 1
    assert "Stops the kernel from specialising on token counts." in body  # the source's words
    assert "<details>\n<summary>Supporting material</summary>" in body
    assert "| 41 / 17.1 s | 13 / 3.2 s |" in body  # the jit table: baseline, with this change
    assert "Measured on vLLM 1.0.0, this pull request's base." in body
    assert f"- `{JIT_BENCHMARK}`" in body
    assert (
        "Depends on the pull request from `moe-patch/feature`"
        in (out / "on-feature.md").read_text()
    )

    assert report["order"] == [
        "moe-patch/jit-annotations",
        "moe-patch/feature",
        "moe-patch/on-feature",
    ]
    commands = by_id["on-feature"]["commands"]
    # --onto named a release tag: each branch moves onto main before its pull request; the
    # stacked one onto its dependency's new head.
    feature_head = git(clone, "rev-parse", "moe-patch/feature")[:12]
    assert commands[0] == (
        f"git -C {clone} rebase --onto moe-patch/feature {feature_head} moe-patch/on-feature"
    )
    assert by_id["feature"]["commands"][0] == (
        f"git -C {clone} rebase --onto upstream/main v1.0.0 moe-patch/feature"
    )
    assert report["setup"][0] == (
        f"git -C {clone} remote add upstream https://github.com/vllm-project/vllm.git"
    )
    assert report["finish"][0].startswith(f"git -C {clone} switch my-work")
    for command in report["setup"] + [c for o in report["outcomes"] for c in o["commands"]]:
        assert "<" not in command and ">" not in command, command  # nothing to fill in


def test_patch_already_upstream_at_the_target_gets_no_branch(pr_series, clone, tmp_path):
    git(clone, "checkout", "-q", "main")
    for name, text in JIT_EDIT.items():
        (clone / name).write_text(text)
    git(clone, "commit", "-q", "-am", "upstream does it too")
    report = pr.prepare(clone, "main", tmp_path / "out", only=["jit-annotations"])
    assert report.outcomes[0].status == pr.SKIPPED_UPSTREAM
    assert "probe" in report.outcomes[0].detail
    assert not git(clone, "branch", "--list", "moe-patch/*")


def test_prefix_and_existing_branch_needs_force(pr_series, clone, tmp_path):
    report = pr.prepare(clone, "v1.0.0", tmp_path / "o", prefix="up/", only=["feature"])
    assert report.outcomes[0].branch == "up/feature"
    with pytest.raises(StateError, match="already exists"):
        pr.prepare(clone, "v1.0.0", tmp_path / "o", prefix="up/", only=["feature"])
    again = pr.prepare(clone, "v1.0.0", tmp_path / "o", prefix="up/", only=["feature"], force=True)
    assert again.outcomes[0].status == pr.BRANCH


def test_a_dependency_left_out_with_only_is_named(pr_series, clone, tmp_path):
    report = pr.prepare(clone, "v1.0.0", tmp_path / "o", only=["on-feature"])
    assert report.outcomes[0].status == pr.FAILED
    assert report.outcomes[0].detail == (
        "depends on feature (Upstream-Depends), which has no branch: run pr for both "
        "(--only feature too)"
    )
    assert not git(clone, "branch", "--list", "moe-patch/*")


def _refused(clone, tmp_path, *extra, env=None):
    digest = tree_digest(clone)
    result = subprocess.run(
        ["moe-patch", "pr", "--source", str(clone), "--out", str(tmp_path / "o"), *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("moe-patch: error:"), result.stderr
    assert tree_digest(clone) == digest
    assert not (tmp_path / "o").exists()
    return errors[0], result.returncode


@pytest.fixture
def cli_env(pr_series, tmp_path):
    bindir = os.path.dirname(sys.executable)
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")


def test_refuses_without_git_identity(pr_series, clone, tmp_path, cli_env):
    git(clone, "config", "--unset", "user.name")
    git(clone, "config", "--unset", "user.email")
    home = tmp_path / "empty-home"
    home.mkdir()
    env = dict(cli_env, HOME=str(home), GIT_CONFIG_NOSYSTEM="1", XDG_CONFIG_HOME=str(home))
    for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        env.pop(key, None)
    message, code = _refused(clone, tmp_path, "--onto", "v1.0.0", env=env)
    assert "user.name and user.email" in message and code == 2


def test_refuses_a_placeholder_git_identity(pr_series, clone, tmp_path, cli_env):
    """An address in a domain reserved for examples reaches no one: it never goes upstream."""
    git(clone, "config", "user.email", "jane@example.com")
    before = git(clone, "for-each-ref")
    message, code = _refused(clone, tmp_path, "--onto", "v1.0.0", env=cli_env)
    assert "jane@example.com is a placeholder address" in message and code == 2
    assert git(clone, "for-each-ref") == before


def test_refuses_dirty_tree(pr_series, clone, tmp_path, cli_env):
    (clone / "vllm" / "__init__.py").write_text("# edited\n")
    message, code = _refused(clone, tmp_path, "--onto", "v1.0.0", env=cli_env)
    assert "uncommitted changes" in message and code == 7


def test_refuses_unknown_ref(pr_series, clone, tmp_path, cli_env):
    message, code = _refused(clone, tmp_path, "--onto", "v9.9.9", env=cli_env)
    assert "--onto v9.9.9 is not a branch, tag or commit" in message and code == 2


def test_refuses_a_repository_that_is_not_vllm(pr_series, tmp_path, cli_env):
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("not vLLM\n")
    git(other, "init", "-q", "-b", "main")
    git(other, "add", "-A")
    git(other, "-c", "user.name=a", "-c", "user.email=a@b.invalid", "commit", "-qm", "x")
    git(other, "tag", "v1.0.0")
    git(other, "config", "user.name", "Jane Dev")
    git(other, "config", "user.email", "jane.dev@users.noreply.github.com")
    message, code = _refused(other, tmp_path, "--onto", "v1.0.0", env=cli_env)
    assert code == 2
    assert message == (
        f"moe-patch: error: v1.0.0 in {other} is not vLLM (it has no vllm/__init__.py); "
        "point --source at a clone of vllm-project/vllm"
    )


def test_a_patch_that_does_not_apply_names_file_and_hunk_and_says_rebase(
    pr_series, clone, tmp_path
):
    git(clone, "checkout", "-q", "main")
    (clone / "vllm" / "extra.py").write_text("SOMETHING_ELSE = 1\n")
    git(clone, "add", "vllm/extra.py")
    git(clone, "commit", "-qm", "main moves on")
    result = run("pr", "--source", str(clone), "--onto", "main", "--out", str(tmp_path / "o"))
    assert result.exit_code == 3, result.output
    details = [line.strip() for line in result.output.splitlines() if line.startswith("    ")]
    details = [line for line in details if "appl" in line or "depends" in line]
    assert details == [
        "applies neither on main nor on moe-patch/jit-annotations (error: vllm/extra.py: "
        "already exists in working directory); " + HINT,
        "depends on feature (Upstream-Depends), which got no branch",
    ]
    assert "(the series for vLLM 1.0.0, the release main is or contains)" in result.output


HINT = (
    "carry the series there first: moe-patch rebase --onto 1.0.0, then run pr again with the "
    "new series"
)


TEMPLATE = """<!-- markdownlint-disable -->
PLEASE FILL IN THE DESCRIPTION HERE, AS THE TEMPLATE OF VLLM 0.22 SAID.

## Overview

<!-- Summarize the change in 1-2 lines. Link relevant issues and PRs. -->

## Claims

<!-- State the accomplishments in a few concrete bullets. -->

## Validation

<!-- Evidence and how to reproduce it. -->

## Details

<!-- Why, and the trade-offs. -->

## Anything else

<!-- Optional. -->

---

<details>
<summary> Checklist </summary>

- [ ] A checklist item of the project.
- [ ] AI assistance was used during the creation of this PR.
</details>

A footer line of the project.
"""

CONTRIBUTING = """# Contributing

### Documenting User-Visible Changes

Environment variables are documented in their `environment_variables` comment.

### Notes for Large Changes

(>500 LOC excluding kernel/data/config/test), we would expect a GitHub issue (RFC).

### Pull Request Limits

The current cap is 2 open PRs.
"""


def _with_rules(clone, **files):
    """The clone's main branch with vLLM's contribution files (path -> text)."""
    git(clone, "checkout", "-q", "main")
    for path, text in files.items():
        (clone / path).parent.mkdir(parents=True, exist_ok=True)
        (clone / path).write_text(text)
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "contribution rules")


def test_descriptions_fill_the_targets_own_template(pr_series, clone, tmp_path):
    _with_rules(clone, **{".github/PULL_REQUEST_TEMPLATE.md": TEMPLATE})
    git(clone, "remote", "add", "mine", "git@github.com:jane-dev/vllm.git")
    git(clone, "remote", "add", "origin", "https://github.com/vllm-project/vllm")
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "main", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # The remotes the clone has: upstream by its URL (any name), the fork and its user.
    assert report["setup"] == []  # --onto main: no rebase, no fetch, nothing to add
    commands = report["outcomes"][0]["commands"]
    assert commands[0] == f"git -C {clone} push -u mine moe-patch/jit-annotations"
    assert ' --head "jane-dev:moe-patch/jit-annotations" ' in commands[1]
    body = (out / "jit-annotations.md").read_text()
    assert body.startswith("<!-- markdownlint-disable -->\n\n## Overview\n")  # no instructions
    for heading in ("## Overview", "## Claims", "## Validation", "## Details", "## Anything else"):
        assert body.count(heading) == 1, heading
    assert "<!--" not in body.replace("<!-- markdownlint-disable -->", "")
    overview = body.split("## Overview\n\n", 1)[1].split("\n\n## ", 1)[0]
    assert overview == "Stops the kernel from specialising on token counts."
    assert "## Claims\n\n- Fewer compiled variants (table below).\n" in body
    assert "## Anything else\n\nNot applicable." in body
    assert body.endswith(  # the checklist kept; the AI box ticked (the patch's Assisted-by)
        "- [ ] A checklist item of the project.\n"
        "- [x] AI assistance was used during the creation of this PR.\n"
        "</details>\n\nA footer line of the project.\n"
    )
    validation = body.split("## Validation", 1)[1].split("## Details")[0]
    assert "| configuration | baseline | with this change | change | runs | spread |" in validation
    assert f"`pytest {JIT_TEST} -v`" in validation
    assert checks_of(report, "jit-annotations")["template"]["detail"].startswith(
        "5 sections (.github/PULL_REQUEST_TEMPLATE.md), each once, checklist kept"
    )


def _made(clone, tmp_path, *extra):
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "main", "--out", str(out), *extra)
    assert result.exit_code == 0, result.output
    return out


def _check(clone, out, *extra):
    result = run(
        "pr", "--source", str(clone), "--onto", "main", "--out", str(out), "--check", "--json",
        *extra,
    )  # fmt: skip
    return result.exit_code, json.loads(result.stdout)


def test_check_alone_judges_existing_branches_and_writes_nothing(pr_series, clone, tmp_path):
    _with_rules(clone, **{".github/PULL_REQUEST_TEMPLATE.md": TEMPLATE})
    out = _made(clone, tmp_path)
    refs, written = git(clone, "for-each-ref"), tree_digest(out)
    code, report = _check(clone, out)
    assert code == 0 and report["ok"] and report["checked_only"]
    assert [o["checks"] != [] for o in report["outcomes"]] == [True, False, True, True]
    assert git(clone, "for-each-ref") == refs and tree_digest(out) == written


# Each planted defect, written into a description pr made, fails its item, and only it.
DEFECTS = {
    "size": lambda body: body.replace("## Details\n\n", "## Details\n\n" + "Lorem ipsum. " * 400),
    "repeats": lambda body: body.replace(
        "## Details\n\n",
        "## Details\n\nTriton specialises integer arguments; these change with every batch.\n\n",
    ),
    "placeholders": lambda body: body.replace(
        "## Details\n\n", "## Details\n\nOpen it as <your-github-user> and TODO.\n\n"
    ),
    "overview": lambda body: body.replace(
        "Stops the kernel from specialising on token counts.",
        "Stops the kernel\nfrom specialising\non token counts.",
    ),
    "claims": lambda body: body.replace(
        "- No change to what the kernel computes.",
        "\n".join(f"- Claim {n}." for n in range(6)) + "\n\nAnd a paragraph.",
    ),
    "evidence": lambda body: body.replace(
        "## Details\n\n", "## Details\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    ),
    "template": lambda body: body.replace("- [ ] A checklist item of the project.\n", ""),
    "agents": lambda body: body.replace("- Clear statement", "- [ ] Clear statement"),
}


@pytest.fixture(scope="module")
def made_once(tmp_path_factory):
    """pr's branch and description for jit-annotations, made once for the planted defects."""
    where = tmp_path_factory.mktemp("made-once")
    root, results = where / "patches", where / "results"
    write_series(root, results)
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_series(monkeypatch, root, results)
        clone = make_clone(where)
        _with_rules(clone, **{".github/PULL_REQUEST_TEMPLATE.md": TEMPLATE, "AGENTS.md": AGENTS})
        out = _made(clone, where, "--only", "jit-annotations")
    return root, results, clone, out


@pytest.mark.parametrize("item", DEFECTS)
def test_a_planted_defect_in_a_description_fails_its_item(made_once, tmp_path, monkeypatch, item):
    root, results, made_clone, made_out = made_once
    use_series(monkeypatch, root, results)
    clone, out = tmp_path / "vllm", tmp_path / "prs"
    shutil.copytree(made_clone, clone, symlinks=True)
    shutil.copytree(made_out, out)
    path = out / "jit-annotations.md"
    planted = DEFECTS[item](path.read_text())
    assert planted != path.read_text()
    path.write_text(planted)
    code, report = _check(clone, out, "--only", "jit-annotations")
    assert code == 8
    assert failing(report) == {"jit-annotations": [item]}


def _branch_defect(
    tmp_path,
    monkeypatch,
    clone,
    patch: dict,
    files: dict | None = None,
    tree: dict | None = None,
    rules: dict | None = None,
):
    """A one-patch series (authored on the release's files and ``tree``) whose branch carries
    a defect, for a clone whose main has ``rules`` (and ``tree``); the checks pr reports on
    the branch and the items that fail."""
    _with_rules(clone, **(rules or {}), **(tree or {}))
    root = tmp_path / "defect-series"
    author_series(root, "1.0.0", [patch], {**release_files("1.0.0"), **(tree or {})})
    for path, text in (files or {}).items():
        (root / "upstream" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "upstream" / path).write_text(text)
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    result = run(
        "pr", "--source", str(clone), "--onto", "main", "--out", str(tmp_path / "o"), "--json"
    )
    assert result.exit_code == 8, result.output
    report = json.loads(result.stdout)
    return checks_of(report, patch["id"]), failing(report)[patch["id"]]


def _trailers(*lines):
    return ["Upstream-Status: Pending", *lines, f"Signed-off-by: {PATCH_AUTHOR}"]


def test_a_test_that_passes_on_the_base_fails_the_tests_item(
    pr_series, clone, tmp_path, monkeypatch
):
    checks, failed = _branch_defect(
        tmp_path,
        monkeypatch,
        clone,
        {
            "id": "weak",
            "edit": {"vllm/extra.py": "FEATURE = True\n"},
            "trailers": _trailers("Upstream-Test: tests/test_weak.py"),
        },
        {"tests/test_weak.py": "def test_nothing():\n    assert True\n"},
    )
    assert failed == ["tests"]
    assert checks["tests"]["detail"] == (
        "tests/test_weak.py: passes on main too (1 passed): it does not exercise the change"
    )


def test_a_code_change_without_a_test_fails_the_tests_item(pr_series, clone, tmp_path, monkeypatch):
    checks, failed = _branch_defect(
        tmp_path, monkeypatch, clone, {"id": "untested", "edit": {"vllm/extra.py": "X = 1\n"}}
    )
    assert failed == ["tests"]
    assert checks["tests"]["detail"].startswith("code changes (vllm/extra.py, ...) and no new test")


ENVS = 'import os\n\nenvironment_variables = {\n    "VLLM_A": lambda: os.getenv("VLLM_A"),\n}\n'


@pytest.mark.parametrize(
    ("edit", "trailers", "test", "why"),
    [
        (
            {
                "vllm/envs.py": ENVS.replace(
                    "}\n", '    "VLLM_NEW": lambda: os.getenv("VLLM_NEW"),\n}\n'
                )
            },
            [],
            "from vllm.envs import environment_variables\n\n\ndef test_it():\n"
            '    assert "VLLM_NEW" in environment_variables\n',
            "VLLM_NEW has no environment_variables comment",
        ),
        (
            {"vllm/extra.py": "DEFAULT = 'triton'\n"},
            ["Upstream-Docs: docs/design/backends.md"],
            _test_file("vllm.extra", "DEFAULT"),
            "the patch's Upstream-Docs page docs/design/backends.md is not changed",
        ),
    ],
    ids=["env-var-without-comment", "declared-page-unchanged"],
)
def test_a_user_visible_change_without_docs_fails_the_docs_item(
    pr_series, clone, tmp_path, monkeypatch, edit, trailers, test, why
):
    checks, failed = _branch_defect(
        tmp_path,
        monkeypatch,
        clone,
        {
            "id": "visible",
            "edit": edit,
            "trailers": _trailers("Upstream-Test: tests/test_visible.py", *trailers),
        },
        {"tests/test_visible.py": test},
        tree={"vllm/envs.py": ENVS},
        rules={"docs/contributing/README.md": CONTRIBUTING},
    )
    assert failed == ["docs"], checks
    assert checks["docs"]["detail"] == f"{why} (docs/contributing/README.md)"


def test_a_documented_env_var_passes_the_docs_item(pr_series, clone, tmp_path, monkeypatch):
    _with_rules(clone, **{"docs/contributing/README.md": CONTRIBUTING, "vllm/envs.py": ENVS})
    documented = ENVS.replace(
        "}\n", '    # What it does.\n    "VLLM_NEW": lambda: os.getenv("VLLM_NEW"),\n}\n'
    )
    root = tmp_path / "ok-series"
    author_series(
        root,
        "1.0.0",
        [{"id": "visible", "edit": {"vllm/envs.py": documented}}],
        {**release_files("1.0.0"), "vllm/envs.py": ENVS},
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    report = pr.prepare(clone, "main", tmp_path / "o")
    docs = {c.name: c for c in report.outcomes[0].checks}["docs"]
    assert docs.status == "pass" and docs.detail.startswith("documented: VLLM_NEW")


def test_commit_message_figures_and_length_fail_the_commit_item(
    pr_series, clone, tmp_path, monkeypatch
):
    long_body = "\n".join(f"Line {n} of why." for n in range(14))
    checks, failed = _branch_defect(
        tmp_path,
        monkeypatch,
        clone,
        {
            "id": "chatty",
            "subject": f"fused_moe: be faster\n\n{long_body}\nIt went 29.7 -> 20.2 us, 1.47x.",
            "edit": {"docs/notes.md": "What it does.\n"},
        },
    )
    assert failed == ["commit"]
    detail = checks["commit"]["detail"]
    assert "the body has 16 lines (at most 12: what and why)" in detail
    assert "the body quotes measurements (29.7 ->, 20.2 us, 1.47x)" in detail


def test_code_and_config_tables_in_one_branch_fail_the_complexity_item(
    pr_series, clone, tmp_path, monkeypatch
):
    checks, failed = _branch_defect(
        tmp_path,
        monkeypatch,
        clone,
        {
            "id": "mixed",
            "edit": {
                "vllm/extra.py": "FEATURE = True\n",
                "vllm/configs/E=8.json": '{"1": {"BLOCK_SIZE_M": 16}}\n',
            },
            "trailers": _trailers("Upstream-Test: tests/test_mixed.py"),
        },
        {"tests/test_mixed.py": _test_file("vllm.extra", "FEATURE")},
    )
    assert failed == ["complexity"]
    assert "vLLM reviews tables as a config-only pull request" in checks["complexity"]["detail"]


def _module(body_lines: int, triton: bool) -> str:
    """A module of about ``body_lines`` lines: one function, a Triton kernel or not."""
    head = "import triton\nimport triton.language as tl\n\n\n@triton.jit\n" if triton else ""
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    return f"{head}def work(x_ptr):\n{body}    return x0\n\n\nFEATURE = True\n"


@pytest.mark.parametrize("triton", [False, True], ids=["python", "triton-kernel"])
def test_a_large_change_needs_an_rfc_unless_its_lines_are_kernels(
    pr_series, clone, tmp_path, monkeypatch, triton
):
    """vLLM's rule counts no kernel lines towards the 500 that call for an RFC: a Triton
    kernel in a Python file is one (what lies outside it still counts)."""
    _with_rules(clone, **{"docs/contributing/README.md": CONTRIBUTING})
    root = tmp_path / "big-series"
    author_series(
        root,
        "1.0.0",
        [
            {
                "id": "big",
                "edit": {"vllm/extra.py": _module(600, triton)},
                "trailers": _trailers("Upstream-Test: tests/test_big.py"),
            }
        ],
    )
    (root / "upstream" / "tests").mkdir(parents=True)
    (root / "upstream" / "tests" / "test_big.py").write_text(_test_file("vllm.extra", "FEATURE"))
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    report = pr.prepare(clone, "main", tmp_path / "o")
    item = {c.name: c for c in report.outcomes[0].checks}["complexity"]
    if triton:
        assert item.status == "pass", item.detail
        assert ", 603 kernel, " in item.detail  # the decorator, the def, 600 lines, return
    else:
        assert item.status == "fail"
        assert "kernel" not in item.detail.split(";")[0]
        assert "lines besides kernel/data/config/test: above 500" in item.detail


def test_triton_kernel_spans_take_decorators_and_only_jit_functions():
    text = (
        "import triton\nfrom triton import jit\n\n\n@triton.jit\ndef a(x):\n    return x\n\n\n"
        "@triton.autotune(configs=[], key=[])\n@jit\ndef b(x):\n    y = x\n    return y\n\n\n"
        "def host(x):\n    return a[(1,)](x)\n"
    )
    assert pr_checks.triton_kernel_spans(text) == [(5, 7), (10, 14)]
    assert pr_checks.triton_kernel_spans("def broken(:\n") == []


def test_a_gpu_only_test_is_listed_not_failed(pr_series, clone, tmp_path, monkeypatch):
    root = tmp_path / "gpu-series"
    author_series(
        root,
        "1.0.0",
        [
            {
                "id": "gpu",
                "edit": {"vllm/extra.py": "FEATURE = True\n"},
                "trailers": _trailers("Upstream-Test: tests/test_gpu.py"),
            }
        ],
    )
    (root / "upstream" / "tests").mkdir(parents=True)
    (root / "upstream" / "tests" / "test_gpu.py").write_text(
        "import pytest\n\npytest.skip('needs an NVIDIA GPU', allow_module_level=True)\n"
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    report = pr.prepare(clone, "v1.0.0", tmp_path / "o")
    tests = {c.name: c for c in report.outcomes[0].checks}["tests"]
    assert tests.status == "pass"
    assert tests.detail == (
        "GPU-only, not run here: tests/test_gpu.py: all 1 skipped here (needs an NVIDIA GPU): "
        "run it on a GPU machine"
    )
    body = (tmp_path / "o" / "gpu.md").read_text()
    assert "`tests/test_gpu.py`: all 1 skipped here (needs an NVIDIA GPU)" in body


def test_the_users_interpreter_and_vllm_settings_stay_out_of_the_branch_tests(
    pr_series, clone, tmp_path, monkeypatch
):
    """TRITON_INTERPRET=1 (a CPU test session sets it) would swap vLLM's kernels for
    interpreted ones that lack their JIT attributes; the branch's tests run as a reviewer's."""
    root = tmp_path / "env-series"
    author_series(
        root,
        "1.0.0",
        [
            {
                "id": "env",
                "edit": {"vllm/extra.py": "FEATURE = True\n"},
                "trailers": _trailers("Upstream-Test: tests/test_env.py"),
            }
        ],
    )
    (root / "upstream" / "tests").mkdir(parents=True)
    (root / "upstream" / "tests" / "test_env.py").write_text(
        "import os\n\nfrom vllm import extra\n\n\n"
        "def test_run_as_a_reviewer_runs_it():\n"
        "    assert extra.FEATURE\n"
        "    assert 'TRITON_INTERPRET' not in os.environ\n"
        "    assert 'VLLM_FEATURE_OFF' not in os.environ\n"
    )
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("VLLM_FEATURE_OFF", "1")
    report = pr.prepare(clone, "v1.0.0", tmp_path / "o")
    tests = {c.name: c for c in report.outcomes[0].checks}["tests"]
    assert (tests.status, tests.detail) == (
        "pass",
        "tests/test_env.py: on v1.0.0 1 failed (ImportError: cannot import name 'extra' from "
        "'vllm' (__init__.py)); on the branch 1 passed",
    )


def test_without_a_python_for_the_tests_the_tests_item_fails(
    pr_series, clone, tmp_path, monkeypatch
):
    monkeypatch.setenv(pr_tests.PYTHON_VARIABLE, str(tmp_path / "no-python"))
    report = pr.prepare(clone, "v1.0.0", tmp_path / "o", only=["feature"])
    tests = {c.name: c for c in report.outcomes[0].checks}["tests"]
    assert tests.status == "fail"
    assert tests.detail == (
        f"{FEATURE_TEST}: not run: {pr_tests.PYTHON_VARIABLE} {tmp_path / 'no-python'} cannot "
        "import torch and pytest"
    )


def test_a_failed_description_write_leaves_the_branches_as_they_were(
    pr_series, clone, tmp_path, monkeypatch
):
    """Issue 44: --force with an --out that cannot be written replaced the branches, then
    said "rolled back".  Now nothing changes, and the message says so."""
    first = pr.prepare(clone, "v1.0.0", tmp_path / "first")
    git(clone, "commit", "-q", "--allow-empty", "-m", "the user's own commit")
    refs = git(clone, "for-each-ref")
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o555)
    real_write = type(out).write_text

    def refuse(path, *args, **kwargs):  # a read-only filesystem, even for root
        if str(path).startswith(str(out)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(type(out), "write_text", refuse)
    result = CliRunner().invoke(
        main,
        ["pr", "--source", str(clone), "--onto", "v1.0.0", "--out", str(out), "--force"],
    )
    assert result.exit_code == 11, result.output
    assert "no branch was changed" in result.output
    assert git(clone, "for-each-ref") == refs  # every branch where it was
    assert [o.branch for o in first.outcomes if o.branch]  # there were branches to replace
    assert list(out.iterdir()) == []  # no staging folder left


def test_an_out_that_is_a_file_is_refused_before_anything_changes(pr_series, clone, tmp_path):
    out = tmp_path / "a-file"
    out.write_text("mine\n")
    refs = git(clone, "for-each-ref")
    with pytest.raises(UsageError, match=f"--out {out} is not a folder"):
        pr.prepare(clone, "v1.0.0", out)
    assert git(clone, "for-each-ref") == refs


def test_the_pull_request_base_follows_onto():
    assert pr.pr_base("main") == "main"
    assert pr.pr_base("upstream/main") == "main"
    assert pr.pr_base("v0.33.0") is None and pr.pr_base("0.33.0") is None
    assert pr.pr_base("0123abcd") is None


def test_merge_order_puts_each_branch_after_its_dependency():
    outcomes = [
        pr.PrOutcome("c", pr.STACKED, branch="p/c", stacked_on="p/b"),
        pr.PrOutcome("a", pr.BRANCH, branch="p/a"),
        pr.PrOutcome("b", pr.STACKED, branch="p/b", stacked_on="p/a"),
        pr.PrOutcome("x", pr.SKIPPED_UPSTREAM),
    ]
    assert [o.branch for o in pr.merge_order(outcomes)] == ["p/a", "p/b", "p/c"]


def test_dependencies_must_name_one_earlier_patch(pr_series):
    patches = {p.id: p for p in series.load("1.0.0").patches}
    assert dependency_problems(list(patches.values())) == []
    reordered = [patches["on-feature"], patches["feature"]]
    assert dependency_problems(reordered) == [
        "on-feature.patch: Upstream-Depends feature is not an earlier patch of this series"
    ]


def test_title_and_body_helpers(pr_series):
    patches = {p.id: p for p in series.load("1.0.0").patches}
    assert pr.title_for(patches["on-feature"]) == "[Bugfix] Add MORE"
    body = pr.body_for(patches["on-feature"])
    assert body == "Why on-feature exists."
    with pytest.raises(UsageError):
        pr.resolve_ref(pr_series, "nope")  # not a git repository ref


def test_descriptions_default_to_the_git_directory(pr_series, clone):
    before = state(clone)
    report = pr.prepare(clone, "v1.0.0", only=["feature"])
    assert report.outcomes[0].description == str(clone / ".git" / "moe-patch-pr" / "feature.md")
    assert state(clone) == before


def test_benchmark_results_become_one_compact_table(tmp_path):
    rows = [
        {"shape": "s", "gemm": "layer", "quant": "block", "M": m, "variant": v, "us_all": us}
        for m, v, us in [
            (1, "9.9.0", [80.0] * 5), (1, "9.9.0+moe", [64.0, 64.0, 64.0, 65.0, 66.0]),
            (8, "9.9.0", [90.0] * 5), (8, "9.9.0+moe", [90.0] * 5),
            (2, "9.9.0", [100.0] * 5), (2, "9.9.0+moe", [125.0] * 5),  # not picked: summed up
            (4, "9.9.0", [100.0] * 5),  # no patched row to compare with: left out
        ]
    ]  # fmt: skip
    data = {"command": "python -m moe_kernels.bench …", "environment": {"gpu": "G, 1.0, 9 MiB"}}
    (tmp_path / "bench.json").write_text(json.dumps({**data, "rows": rows}))
    table = pr_description.result_table("bench.json", tmp_path, "9.9.0", {"M": "1,8"})
    assert table.header == pr_description.HEADER
    assert table.rows == [
        ["s, block FP8, layer, M = 1", "80.0 µs", "64.0 µs", "1.25× faster", "5", "2.3%"],
        ["s, block FP8, layer, M = 8", "90.0 µs", "90.0 µs", "level", "5", "0.0%"],
        ["all 3 cases of the run (shapes, scales, M)", "", "", "1.00× geometric mean, "
         "0.80–1.25×", "", ""],
    ]  # fmt: skip
    assert table.label.startswith("Measured on vLLM 9.9.0, this pull request's base. G.")
    other = pr_description.result_table("bench.json", tmp_path, "9.10.0", {"M": "1"})
    assert other.label.startswith(
        "Measured on vLLM 9.9.0 (no run on 9.10.0, this pull request's base)."
    )


def test_an_end_to_end_run_is_one_row_per_engine_pair_and_batch(tmp_path):
    def engine(name, backend, tpot, wheel, **asked):
        decode = {str(b): {"median_ms": t, "tpot_ms": [t, t * 1.01, t * 0.99]} for b, t in tpot}
        result = {"decode": decode, "first_ttft_s": tpot[0][1] / 10}
        return {"name": name, "moe_backend": backend, "wheel": wheel, "result": result, **asked}

    report = {
        "vllm": "1.0.0",
        "model": "a-moe",
        "environment": {"gpu": "Test GPU 9000", "torch": "9.9.9"},
        "variants": [
            engine("a-moe-static-official", "FLASHINFER_CUTLASS", [(1, 8.0), (16, 40.0)], "official"),
            engine("a-moe-static-patched", "TRITON", [(1, 4.0), (16, 8.0)], "patched"),
            engine(
                "a-moe-static-patched-env-flashinfer_cutlass", "FLASHINFER_CUTLASS",
                [(1, 8.2), (16, 41.0)], "patched", fp8_env="flashinfer_cutlass",
            ),
            {"name": "a-moe-broken-official", "returncode": 1, "result": None},
        ],
    }  # fmt: skip
    (tmp_path / "e2e.json").write_text(json.dumps(report))
    table = pr_description.result_table("e2e.json", tmp_path, "1.0.0", {"batch": "1,16"})
    assert table.rows == [
        ["a-moe-static, batch 1 (FLASHINFER_CUTLASS → TRITON)", "8.00 ms", "4.00 ms",
         "2.00× faster", "3", "2.0%"],
        ["a-moe-static, batch 16 (FLASHINFER_CUTLASS → TRITON)", "40.00 ms", "8.00 ms",
         "5.00× faster", "3", "2.0%"],
    ]  # fmt: skip
    assert (
        "Baseline: the official wheel; with this change: the wheel with the moe-patch series."
        in table.label
    )
    same_wheel = pr_description.result_table(
        "e2e.json", tmp_path, "1.0.0", {"baseline": "patched-env-flashinfer_cutlass", "batch": "1"}
    )
    assert same_wheel.rows[0][:3] == ["a-moe-static, batch 1 (FLASHINFER_CUTLASS → TRITON)",
                                      "8.20 ms", "4.00 ms"]  # fmt: skip
    assert "`VLLM_FP8_MOE_BACKEND=flashinfer_cutlass`" in same_wheel.label
    first = pr_description.result_table("e2e.json", tmp_path, "1.0.0", {"metric": "first_ttft"})
    assert first.rows == [["a-moe-static, first request (FLASHINFER_CUTLASS → TRITON)",
                           "800 ms", "400 ms", "2.00× faster", "1", "–"]]  # fmt: skip
    missing = pr_description.result_table("nope.json", tmp_path, "1.0.0")
    assert missing.rows == [] and "nope.json was not found" in missing.label


def test_a_placeholder_author_is_never_a_co_author(pr_series):
    patch = series.load("1.0.0").patches[0]
    assert patch.author.endswith("@example.invalid>")
    message = pr.commit_message(patch, "Jane Dev", "jane@users.noreply.github.com")
    assert "Co-authored-by" not in message and "example.invalid" not in message
    assert message.endswith("Signed-off-by: Jane Dev <jane@users.noreply.github.com>\n")
    patch.author = "Ada Lovelace <ada@users.noreply.github.com>"
    message = pr.commit_message(patch, "Jane Dev", "jane@users.noreply.github.com")
    assert "Co-authored-by: Ada Lovelace <ada@users.noreply.github.com>" in message
    shipped = "Seed e888ebcc maintainers <maintainers@users.noreply.a-seed-e888ebcc.example>"
    assert pr.is_placeholder(shipped) and not pr.is_placeholder("A <a@vllm.ai>")


AGENTS = """# Agent Instructions

### Accountability

- PR descriptions for AI-assisted work **must** include:
    - Why this is not duplicating an existing PR.
    - Test commands run and results.
    - Model evaluation results when the change affects output, accuracy, or serving.
    - Clear statement that AI assistance was used.
- Another rule that is not about the description.
"""

SKILL = """# PR Checklist

- Low complexity: < 50 lines. Generally easy.
- Medium complexity: 50-250 lines.
- High complexity: > 250 lines. May introduce significant complexity.

For reproducible bugs, the PR must show the new test failing without the fix.
Keep Claims to a few concrete bullets and explain motivation briefly.
"""


def test_rules_are_read_from_the_targets_files():
    rules = contribution.rules_from(
        {
            contribution.TEMPLATE_PATH: TEMPLATE,
            contribution.RULES_PATH: AGENTS + "\n- [ ] A haiku\n",
            contribution.CONTRIBUTING_PATH: CONTRIBUTING
            + "### PR Title and Classification\n\nAny descriptive tag is accepted.\n",
            contribution.CHECKLIST_PATH: SKILL,
        }
    )
    assert rules.sections == [
        "## Overview", "## Claims", "## Validation", "## Details", "## Anything else"
    ]  # fmt: skip
    assert rules.overview_lines == 2 and rules.claims_as_bullets
    assert rules.bands == (50, 250) and rules.failing_test_first
    assert (rules.rfc_lines, rules.rfc_excludes) == (500, ("kernel", "data", "config", "test"))
    assert rules.docs_rule and rules.pr_cap == 2 and rules.title_tags == ()
    assert len(rules.must_include) == 4
    assert rules.source["complexity"] == contribution.CHECKLIST_PATH
    older = contribution.rules_from(
        {
            contribution.CONTRIBUTING_PATH: "### PR Title and Classification\n\n"
            "Please use one of the following:\n\n- `[Bugfix]` for bug fixes.\n"
            "- `[Hardware][Vendor]` for hardware.\n\n### Code Quality\n"
        }
    )
    assert older.title_tags == ("[Bugfix]", "[Hardware]", "[Vendor]")
    assert older.template is None and older.bands is None and not older.docs_rule
    assert contribution.required_items("# No such list\n- a rule\n") == []


def test_descriptions_state_what_the_targets_contribution_rules_ask(pr_series, clone, tmp_path):
    _with_rules(clone, **{"AGENTS.md": AGENTS})
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "main", "--out", str(out))
    assert result.exit_code == 0, result.output
    head = git(clone, "rev-parse", "main")[:12]
    jit = (out / "jit-annotations.md").read_text()
    asked = jit.split("## What AGENTS.md asks a description to state\n\n", 1)[1].splitlines()
    assert asked[0].startswith(
        f"- Why this is not duplicating an existing PR. `main` ({head}) lacks this change"
    )
    assert '--search "Do not specialise on token counts"' in asked[0]
    assert asked[1] == (
        "- Test commands run and results. Run while preparing this branch: ruff-check: pass; "
        "ruff-format: pass; the new tests on the base and on this branch (results under Test "
        "Result). Left to a GPU machine or the reviewer: the benchmarks under Test Result."
    )
    assert asked[2].endswith("No model accuracy evaluation was run for this change.")
    assert asked[3] == (
        "- Clear statement that AI assistance was used. AI assistance was used: an AI coding "
        "agent (the commit's `Assisted-by:` trailer). The submitter reviews every changed line."
    )
    feature = (out / "feature.md").read_text()
    assert "The patch records no AI assistance (no `Assisted-by:`)." in feature


def test_upstreaming_reads_every_fact_from_trailers(pr_series):
    patches = {p.id: p for p in series.load("1.0.0").patches}
    plan = pr.upstreaming(patches["on-feature"])
    assert plan.depends == ("feature",) and list(plan.tests) == [MORE_TEST]
    assert pr.upstreaming(patches["jit-annotations"]).assisted_by == ["an AI coding agent"]
    assert Upstreaming().tag == "[Misc]"


def test_the_shipped_patch_messages_say_what_and_why_without_figures():
    """Issue 45/46: a patch's message says what and why in a few lines, as vLLM's history
    writes them; measurements (in-sample or not) live in its description and the docs."""
    from moe_patch.settings import default_series_root

    root = default_series_root()
    checked = 0
    for base in series.bases(root):
        for patch in series.load(base, root).patches:
            body = [line for line in pr.body_for(patch).splitlines() if line.strip()]
            body = [line for line in body if not pr._TRAILER_LINE.match(line)]
            assert len(body) <= pr_checks.MAX_BODY_LINES, (patch.path, len(body))
            assert pr_checks._FIGURE.findall("\n".join(body)) == [], patch.path
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize("during", ["worktree add", "-m pytest"])
def test_a_killed_pr_leaves_nothing_the_next_run_keeps(pr_series, clone, tmp_path, cli_env, during):
    """Killed while a branch's tests get their scratch trees or run: the next run of the
    same command succeeds, and no scratch tree or worktree record of the killed one stays."""
    scratch = tmp_path / "cache" / "scratch"
    cli_env = dict(cli_env, MOE_PATCH_CACHE=str(scratch.parent))
    out = tmp_path / "prs"
    args = ["pr", "--source", str(clone), "--onto", "v1.0.0", "--out", str(out)]
    killed = run_killed(args, cli_env, on=f"{during}#2", during=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert list(scratch.iterdir())  # what the killed run left
    done = subprocess.run(
        [sys.executable, "-c", "from moe_patch.cli import main; main()", *args],
        env=cli_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not list(scratch.iterdir())
    assert git(clone, "worktree", "list", "--porcelain").count("worktree ") == 1
