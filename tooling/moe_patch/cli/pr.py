"""``moe-patch pr``: upstream-ready branches and descriptions for vLLM (see :mod:`moe_patch.pr`)."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.pr import DEFAULT_PREFIX, failure, pr
from ..errors import EXIT_PATCH_FAILED, EXIT_STATE, EXIT_VERIFY_FAILED, FETCHING, command_epilog
from .options import index_option, json_option, pass_settings, series_option
from .render import render_pr, show


@click.command(
    "pr",
    epilog=command_epilog(
        [
            "moe-patch pr --source ~/src/vllm --onto upstream/main",
            "moe-patch pr --source ~/src/vllm --onto v0.33.0 --python ~/src/vllm/.venv/bin/python",
            "moe-patch pr --source ~/src/vllm --onto v0.33.0 --check",
        ],
        FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE, EXIT_VERIFY_FAILED},
    ),
)
@click.option(
    "--source",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Your vLLM git clone (its working tree and current branch are left as they are).",
)
@click.option(
    "--onto",
    required=True,
    metavar="REF",
    help="Base the branches on this ref: main, upstream/main, v0.33.0 or 0.33.0.",
)
@click.option(
    "--prefix",
    default=DEFAULT_PREFIX,
    show_default=True,
    help="Branch name prefix (branch = PREFIX + patch id).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the PR description files (<patch-id>.md) "
    "[default: moe-patch-pr/ in the clone's .git directory].",
)
@click.option("--only", multiple=True, metavar="ID", help="Only this patch (repeatable).")
@click.option("--force", is_flag=True, help="Replace branches of the same name.")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Only judge the existing branches and descriptions against the target's "
    "pull-request checklist (writes nothing).",
)
@click.option(
    "--python",
    metavar="PY",
    help="The Python that runs each branch's new tests on its base and on the branch (one "
    "with vLLM's dependencies, torch and pytest) [default: $MOE_PATCH_PR_PYTHON, else the "
    "clone's .venv, python3, moe-patch's own, the first that imports torch and pytest].",
)
@index_option
@json_option
@series_option
@pass_settings
def command(source, onto, prefix, out, only, force, check_only, python, as_json, settings):
    """Make one upstream-ready branch per patch that vLLM lacks at --onto, and check each
    against the target tree's own pull-request checklist.

    Each branch holds its patch as one commit with a vLLM-style title ([Kernel] ...), the
    patch's what and why as the body, the tests its Upstream-Test trailers name and a
    Signed-off-by for your git identity, on --onto or on the branch its Upstream-Depends
    trailer names.  Patches that are Inappropriate upstream or already upstream are
    skipped.  A description in the target's own template is written per branch.  Then
    every branch is checked (commit, template, overview, claims, evidence, size, repeats,
    complexity, ruff, docs, tests, placeholders, agents): its new tests run on its base
    and on it.  The report lists the branches in merge order with the commands that push
    them and open the pull requests.  Nothing is pushed.  Exit 8 when an item fails.
    """
    report = pr(
        source=source,
        onto=onto,
        out=out,
        prefix=prefix,
        only=list(only) or None,
        settings=settings,
        force=force,
        python=python,
        check_only=check_only,
    )
    show(report, as_json, render_pr)
    if error := failure(report):
        raise error
