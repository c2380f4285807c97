"""``moe-patch rebase``: the series carried onto another release, patch by patch."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.rebase import rebase
from ..errors import (
    EXIT_CONFLICT,
    EXIT_PATCH_FAILED,
    EXIT_STATE,
    FETCHING,
    RebaseStopped,
    UsageError,
    command_epilog,
)
from .options import Folder, index_option, pass_settings, series_option
from .render import render_rebase, render_rebase_aborted, render_rebase_stopped


@click.command(
    "rebase",
    epilog=command_epilog(
        [
            "moe-patch rebase --onto 0.34.0 --into work/rebase-0.34",
            "moe-patch rebase --continue --into work/rebase-0.34   # after resolving",
            "moe-patch rebase --abort --into work/rebase-0.34",
        ],
        FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE, EXIT_CONFLICT},
    ),
)
@click.option("--onto", metavar="VERSION", help="The release to carry the series onto.")
@click.option(
    "--from",
    "base",
    metavar="BASE",
    help="The series base to carry [default: the newest base older than --onto].",
)
@click.option(
    "--source",
    type=Folder(path_type=Path),
    help="Take the --onto release from this checkout or unpacked tree (copied).",
)
@click.option("--git", "git_url", metavar="URL", help="Clone tag vVERSION from this remote.")
@click.option(
    "--any-base",
    is_flag=True,
    help="Take a --source that is not the release (untagged, a branch) as --onto anyway.",
)
@click.option(
    "--into",
    type=Folder(file_okay=False, path_type=Path),
    help="Work tree of the rebase [default: ./vllm-VERSION-rebase].",
)
@click.option("--continue", "continue_", is_flag=True, help="Go on after resolving a conflict.")
@click.option("--skip", is_flag=True, help="Drop the conflicting patch from the new series.")
@click.option("--abort", is_flag=True, help="Give up: remove the rebase's work tree.")
@index_option
@series_option
@pass_settings
def command(onto, base, source, git_url, any_base, into, continue_, skip, abort, settings):
    """Replay the series onto another release with 3-way merges, patch by patch.

    Each patch is clean, refreshed (its context moved), dropped because the release
    already has it (recorded as Applied-Upstream in the old patch), or a conflict:
    then the rebase stops with conflict markers in the tree, like git rebase.  When
    every patch is done the new series is written to patches/vVERSION/ and a
    range-diff of the old series against the new one is printed.
    """
    actions = [a for a, on in (("continue", continue_), ("skip", skip), ("abort", abort)) if on]
    if len(actions) > 1:
        raise UsageError("give one of --continue, --skip, --abort")
    action = actions[0] if actions else None
    try:
        result = rebase(
            onto=onto,
            base=base,
            into=into,
            source=source,
            git_url=git_url,
            action=action,
            settings=settings,
            any_base=any_base,
        )
    except RebaseStopped as stopped:
        click.echo(render_rebase_stopped(stopped.state))
        raise
    click.echo(render_rebase_aborted(result) if action == "abort" else render_rebase(result))
