"""``moe-patch pr``: upstream-ready branches, on a synthetic vLLM clone (fast)."""

import json
import os
import subprocess

import pytest
from click.testing import CliRunner
from moe_patch import pr
from moe_patch.cli import main
from moe_patch.errors import StateError, UsageError
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


JIT_TEST = "tests/kernels/moe/test_fused_moe_jit_specialization.py"
JIT_TEST_TEXT = '''"""The kernel does not specialise on token counts."""


def test_it():
    assert sum([1, 2]) == 3
'''
JIT_BENCHMARK = "vllm bench latency --model org/a-model --batch-size 1"


@pytest.fixture
def pr_series(tmp_path, monkeypatch):
    root = tmp_path / "patches"
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
            },
            {
                "id": "on-feature",
                "edit": {"vllm/extra.py": "FEATURE = True\nMORE = False\n"},
                "trailers": [
                    "Upstream-Status: Pending",
                    "Upstream-Title: [Bugfix] Add MORE",
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
        ],
    )
    (root / "upstream" / JIT_TEST).parent.mkdir(parents=True)
    (root / "upstream" / JIT_TEST).write_text(pr.SPDX_LINES + JIT_TEST_TEXT)
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    results = tmp_path / "results"
    results.mkdir()
    (results / "h200-jit-sweep.json").write_text(json.dumps(RESULTS))
    monkeypatch.setenv("MOE_PATCH_RESULTS", str(results))
    return root


@pytest.fixture
def clone(tmp_path):
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


def test_branches_per_pending_patch_with_signoff_title_and_description(pr_series, clone, tmp_path):
    before = state(clone)
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "1.0.0", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    by_id = {o["id"]: o for o in report["outcomes"]}
    assert by_id["backport"]["status"] == pr.SKIPPED_INAPPROPRIATE
    assert by_id["jit-annotations"]["status"] == pr.BRANCH
    assert by_id["feature"]["status"] == pr.BRANCH
    assert by_id["on-feature"]["status"] == pr.STACKED
    assert by_id["on-feature"]["stacked_on"] == "moe-patch/feature"
    assert state(clone) == before  # HEAD, branch, working tree, no worktree left behind

    branches = git(clone, "branch", "--list", "moe-patch/*", "--format=%(refname:short)").split()
    assert sorted(branches) == [
        "moe-patch/feature",
        "moe-patch/jit-annotations",
        "moe-patch/on-feature",
    ]
    tag = git(clone, "rev-parse", "v1.0.0")
    titles = {}
    for branch in branches:
        message = git(clone, "log", "-1", "--format=%B", branch)
        titles[branch] = message.splitlines()[0]
        assert message.rstrip().endswith(
            "Signed-off-by: Jane Dev <jane.dev@users.noreply.github.com>"
        )
        assert "Upstream-" not in message  # the series' own trailers stay in the series
        if branch == "moe-patch/jit-annotations":  # its attribution, in git's trailer block
            assert message.rstrip().endswith(
                "Assisted-by: an AI coding agent\n"
                "Signed-off-by: Jane Dev <jane.dev@users.noreply.github.com>"
            )
        assert (
            git(clone, "log", "-1", "--format=%an <%ae>", branch)
            == "Jane Dev <jane.dev@users.noreply.github.com>"
        )
    assert titles["moe-patch/jit-annotations"] == "[Perf] Do not specialise on token counts"
    assert titles["moe-patch/feature"] == "[Misc] Add it"
    assert titles["moe-patch/on-feature"] == "[Bugfix] Add MORE"
    assert git(clone, "rev-parse", "moe-patch/jit-annotations^") == tag
    assert git(clone, "rev-parse", "moe-patch/on-feature^") == git(
        clone, "rev-parse", "moe-patch/feature"
    )

    added = git(clone, "show", f"moe-patch/jit-annotations:{JIT_TEST}") + "\n"
    assert added == (pr_series / "upstream" / JIT_TEST).read_text()  # the series' file, as is
    assert by_id["jit-annotations"]["tests"] == [JIT_TEST]
    assert git(clone, "ls-tree", "-r", "--name-only", "moe-patch/feature").count("tests/") == 0
    assert all(line.split(":")[1].startswith(" pass") for line in by_id["jit-annotations"]["lint"])

    body = (out / "jit-annotations.md").read_text()
    for section in ("## Purpose", "## Test Plan", "## Test Result"):
        assert body.count(section) == 1
    assert "Why jit-annotations exists." in body
    for text in ("Test GPU 9000", "9.9.9", "8.8.8", RESULTS["command"]):
        assert text in body
    assert "| 1.0.0 | sweep | 41 → 13 | 23 → 5 | 17.12 → 3.25 |" in body
    assert "| 1.0.0 | trace | 43 → 17 | 29 → 7 | 19.50 → 4.75 |" in body
    assert f"on the base branch, then on this one: `{JIT_BENCHMARK}`" in body
    assert "stacked on `moe-patch/feature`" in (out / "on-feature.md").read_text()
    commands = by_id["jit-annotations"]["commands"]
    assert any(c.startswith("gh pr create --repo vllm-project/vllm") for c in commands)
    assert any(" push " in c and c.endswith("moe-patch/jit-annotations") for c in commands)
    # --onto named a release tag: the branch is moved onto main before the pull request.
    assert commands[0].startswith(f"git -C {clone} rebase --onto upstream/main v1.0.0 ")
    assert " --base main " in commands[-1]


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
    import sys

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
    details = [line.strip() for line in result.output.splitlines() if "nor on" in line]
    assert details == [
        "applies neither on main nor on moe-patch/jit-annotations (error: vllm/extra.py: "
        "already exists in working directory); " + HINT,
        "applies neither on main nor on moe-patch/jit-annotations (vllm/extra.py: hunk 1 "
        "@@ -1,1 +1,2 @@ does not apply); " + HINT,
    ]
    assert "(the series for vLLM 1.0.0, the release main is or contains)" in result.output


HINT = (
    "carry the series there first: moe-patch rebase --onto 1.0.0, then run pr again with the "
    "new series"
)


TEMPLATE = """<!-- markdownlint-disable -->
PLEASE FILL IN THE DESCRIPTION HERE, AS THE TEMPLATE OF VLLM 0.22 SAID.

## Overview

<!-- What changes, in a line or two. -->

## Claims

<!-- Bullets. -->

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
</details>

A footer line of the project.
"""


def test_descriptions_fill_the_targets_own_template(pr_series, clone, tmp_path):
    git(clone, "checkout", "-q", "main")
    (clone / ".github").mkdir()
    (clone / ".github" / "PULL_REQUEST_TEMPLATE.md").write_text(TEMPLATE)
    git(clone, "add", ".github")
    git(clone, "commit", "-qm", "a template")
    git(clone, "remote", "add", "mine", "git@github.com:jane-dev/vllm.git")
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "main", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    commands = json.loads(result.stdout)["outcomes"][0]["commands"]
    assert commands[0] == f"git -C {clone} push mine moe-patch/jit-annotations"
    assert " --head jane-dev:moe-patch/jit-annotations " in commands[1]
    body = (out / "jit-annotations.md").read_text()
    assert body.startswith("<!-- markdownlint-disable -->\n\n## Overview\n")  # no instructions
    for heading in ("## Overview", "## Claims", "## Validation", "## Details", "## Anything else"):
        assert body.count(heading) == 1, heading
    assert "<!--" not in body.replace("<!-- markdownlint-disable -->", "")
    overview = body.split("## Overview\n\n", 1)[1].split("\n\n## ", 1)[0]
    assert overview == "Why jit-annotations exists."
    assert "## Anything else\n\nNot applicable." in body
    assert body.endswith(
        "- [ ] A checklist item of the project.\n</details>\n\nA footer line of the project.\n"
    )
    assert "<paste" not in body and "<changed files>" not in body
    assert "| 1.0.0 | sweep | 41 → 13 |" in body.split("## Claims", 1)[1].split("## Validation")[0]
    assert "`pytest tests/kernels/moe/test_fused_moe_jit_specialization.py -v`" in body


def test_a_recorded_command_with_machine_paths_is_not_quoted():
    quoted = pr._runnable("python -m moe_kernels.jit_sweep --tree 1.0.0=/srv/t --out /srv/out/x")
    assert "/srv" not in quoted and "`python -m moe_kernels.jit_sweep`" in quoted
    assert (
        pr._runnable("python -m moe_kernels.bench --M 1") == "`python -m moe_kernels.bench --M 1`"
    )


def test_the_pull_request_base_follows_onto():
    assert pr.pr_base("main") == "main"
    assert pr.pr_base("upstream/main") == "main"
    assert pr.pr_base("v0.33.0") is None and pr.pr_base("0.33.0") is None
    assert pr.pr_base("0123abcd") is None


def test_title_and_body_helpers(pr_series):
    from moe_patch import series

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


def test_benchmark_results_become_a_before_after_table(tmp_path):
    rows = [
        {"shape": "s", "gemm": "layer", "quant": "block", "M": m, "variant": v, "us": us}
        for m, v, us in [
            (1, "9.9.0", 80.0), (1, "9.9.0+moe", 64.0),
            (2, "9.9.0", 90.0), (2, "9.9.0+moe", 90.0),
            (256, "9.9.0", 500.0), (256, "9.9.0+moe", 500.0),  # beyond decode: left out
            (4, "9.9.0", 100.0),  # no patched row to compare with: left out
        ]
    ]  # fmt: skip
    data = {"command": "python -m moe_kernels.bench …", "environment": {"gpu": "G"}, "rows": rows}
    (tmp_path / "bench.json").write_text(json.dumps(data))
    text = pr.results_section(pr.Upstreaming(tag="[Perf]", results=("bench.json",)), tmp_path)
    table = [line for line in text.splitlines() if line.startswith("| s ")]
    assert table == [
        "| s | layer | block | 1 | 80.0 | 64.0 | 1.25× |",
        "| s | layer | block | 2 | 90.0 | 90.0 | 1.00× |",
    ]
    assert "GPU: G" in text and "`python -m moe_kernels.bench …`" in text


def test_a_placeholder_author_is_never_a_co_author(pr_series):
    from moe_patch import series

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


def test_an_end_to_end_report_is_shown_per_engine(tmp_path):
    from moe_patch.upstreaming import Upstreaming

    def engine(name, backend, tpot, rate):
        decode = {str(b): {"median_ms": t} for b, t in zip((1, 16), tpot, strict=True)}
        prefill = {"4000": {"median_ms": tpot[0] * 20}}
        result = {"prefill": prefill, "decode": decode, "throughput": {"output_tokens_per_s": rate}}
        return {"name": name, "moe_backend": backend, "result": result}

    report = {
        "vllm": "1.0.0",
        "model": "a-moe",
        "command": "python -m moe_e2e.run --staged staged --out here",
        "environment": {"gpu": "Test GPU 9000", "torch": "9.9.9", "triton": "8.8.8"},
        "spec": {"prefill_lens": [4000], "decode_batches": [1, 16]},
        "variants": [
            engine("a-moe-official", "VLLM_CUTLASS", (5.14, 9.61), 2456.4),
            engine("a-moe-patched", "TRITON", (3.92, 8.33), 2757.0),
            {"name": "a-moe-broken", "returncode": 1, "result": None},
        ],
    }
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "run.json").write_text(json.dumps(report))
    text = pr.results_section(Upstreaming(results=("e2e/run.json",)), tmp_path)
    assert "vLLM 1.0.0 wheels" in text and "Test GPU 9000" in text
    assert "| engine | MoE backend | TTFT 4000 tok | TPOT B=1 | TPOT B=16 | tok/s |" in text
    assert "| a-moe-official | VLLM_CUTLASS | 102.80 | 5.14 | 9.61 | 2456 |" in text
    assert "| a-moe-patched | TRITON | 78.40 | 3.92 | 8.33 | 2757 |" in text
    assert "a-moe-broken" not in text  # an engine that did not run has no row
    assert "`python -m moe_e2e.run --staged staged --out here`" in text
    # Several Upstream-Results: trailers: every file's section, in the order given.
    report["model"] = "b-moe"
    (tmp_path / "e2e" / "second.json").write_text(json.dumps(report))
    both = pr.results_section(Upstreaming(results=("e2e/run.json", "e2e/second.json")), tmp_path)
    assert both.index("a-moe") < both.index("b-moe") and both.startswith(text)
    missing = pr.results_section(Upstreaming(results=("e2e/run.json", "nope.json")), tmp_path)
    assert missing.endswith(
        "The benchmark results file nope.json was not found; run the benchmark."
    )


AGENTS = """# Agent Instructions

### Accountability

- PR descriptions for AI-assisted work **must** include:
    - Why this is not duplicating an existing PR.
    - Test commands run and results.
    - Model evaluation results when the change affects output, accuracy, or serving.
    - Clear statement that AI assistance was used.
    - A haiku about the change.
- Another rule that is not about the description.
"""


def test_required_items_are_read_from_the_rules():
    from moe_patch import contribution

    assert contribution.required_items(AGENTS) == [
        "Why this is not duplicating an existing PR.",
        "Test commands run and results.",
        "Model evaluation results when the change affects output, accuracy, or serving.",
        "Clear statement that AI assistance was used.",
        "A haiku about the change.",
    ]
    assert contribution.required_items("# No such list\n- a rule\n") == []


def test_descriptions_state_what_the_targets_contribution_rules_ask(pr_series, clone, tmp_path):
    git(clone, "checkout", "-q", "main")
    (clone / "AGENTS.md").write_text(AGENTS)
    git(clone, "add", "AGENTS.md")
    git(clone, "commit", "-qm", "contribution rules")
    out = tmp_path / "prs"
    result = run("pr", "--source", str(clone), "--onto", "main", "--out", str(out))
    assert result.exit_code == 0, result.output
    head = git(clone, "rev-parse", "main")[:12]
    jit = (out / "jit-annotations.md").read_text()
    asked = jit.split("## What AGENTS.md asks a description to state\n\n", 1)[1].splitlines()
    assert asked[0].startswith(
        f"- Why this is not duplicating an existing PR. `main` ({head}) does not have this change"
    )
    assert '--search "Do not specialise on token counts"' in asked[0]
    assert asked[1].startswith("- Test commands run and results. Run while preparing this branch: ")
    assert "ruff-check: pass; ruff-format: pass." in asked[1]
    assert f"`pytest {JIT_TEST}`, `{JIT_BENCHMARK}`" in asked[1]
    assert asked[2].endswith("No model accuracy evaluation was run for this change.")
    assert asked[3] == (
        "- Clear statement that AI assistance was used. AI assistance was used: an AI coding "
        "agent (the commit's `Assisted-by:` trailer). The submitter reviews every changed line."
    )
    assert asked[4] == "- [ ] A haiku about the change."  # no answer: left to the submitter
    feature = (out / "feature.md").read_text()
    assert "The patch records no AI assistance (no `Assisted-by:`)." in feature
