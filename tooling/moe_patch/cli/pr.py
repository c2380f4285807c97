"""``moe-patch pr``: upstream-ready branches and descriptions for vLLM (see :mod:`moe_patch.pr`)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import pr as engine
from ..errors import (
    EXIT_PATCH_FAILED,
    EXIT_STATE,
    EXIT_VERIFY_FAILED,
    FETCHING,
    MoePatchError,
    command_epilog,
)
from ..report import render_pr
from .options import index_option, json_option, pass_settings, series_option


@click.command(
    "pr",
    epilog=command_epilog(
        [
            "moe-patch pr --source ~/src/vllm --onto upstream/main",
            "moe-patch pr --source ~/src/vllm --onto v0.33.0 --only jit-annotations",
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
    default=engine.DEFAULT_PREFIX,
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
@index_option
@json_option
@series_option
@pass_settings
def command(source, onto, prefix, out, only, force, as_json, settings):
    """Make one upstream-ready branch per patch that vLLM lacks at --onto.

    Each branch holds its patch as one commit with a vLLM-style title ([Perf] ...),
    the reasons as the body, the tests its Upstream-Test trailers name and a
    Signed-off-by for your git identity; it passes the target tree's own ruff
    configuration at the ruff version the tree pins.  Patches that are Inappropriate
    upstream or already upstream are skipped.  A PR description in the target's own
    template is written per branch, with the git push and gh pr create commands.
    Nothing is pushed.
    """
    report = engine.prepare(source, onto, out, prefix, list(only) or None, settings, force)
    click.echo(report.to_json() if as_json else render_pr(report))
    failed = [o.id for o in report.outcomes if o.status == engine.FAILED]
    if failed:
        raise MoePatchError(
            f"no branch for {', '.join(failed)}: see the report above", EXIT_PATCH_FAILED
        )
    lint = [o.id for o in report.outcomes if o.detail.startswith("lint fails")]
    if lint:
        raise MoePatchError(
            f"{', '.join(lint)}: lint fails with the target's own ruff configuration",
            EXIT_VERIFY_FAILED,
        )
