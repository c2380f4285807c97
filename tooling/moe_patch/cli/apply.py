"""``moe-patch apply``: a patched vLLM work tree, or (--installed) the installed vLLM."""

from __future__ import annotations

from pathlib import Path

import click

from .. import installed
from ..commands.apply import apply as apply_tree
from ..errors import (
    EXIT_PATCH_FAILED,
    EXIT_STATE,
    FETCHING,
    PatchFailed,
    UsageError,
    command_epilog,
)
from ..report import render_apply, render_installed
from .options import (
    Folder,
    index_option,
    installed_flag,
    json_option,
    pass_settings,
    series_option,
    target_option,
)


@click.command(
    "apply",
    epilog=command_epilog(
        [
            "moe-patch apply --vllm 0.21                   # ./vllm-0.21.0, patched",
            "moe-patch apply --vllm 0.21.0 --into work/vllm --only swap-ab",
            "moe-patch apply --vllm 0.21 --source ~/src/vllm   # from a copy of your checkout",
            "moe-patch apply --installed                   # the vllm of this environment",
        ],
        FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE},
    ),
)
@click.option(
    "--vllm", "vllm", metavar="VERSION", help="Release: 0.21 (newest 0.21.x), 0.21.0 or v0.21.0."
)
@click.option(
    "--into",
    type=Folder(file_okay=False, path_type=Path),
    help="Work tree to create or update [default: ./vllm-VERSION].",
)
@click.option(
    "--source",
    type=Folder(path_type=Path),
    help="Start from this vLLM checkout or unpacked tree (copied unless --in-place).",
)
@click.option(
    "--git",
    "git_url",
    metavar="URL",
    help="Clone tag vVERSION from this remote (e.g. https://github.com/vllm-project/vllm.git).",
)
@click.option(
    "--in-place", is_flag=True, help="Patch the clean --source checkout itself, on a new branch."
)
@click.option(
    "--any-base",
    is_flag=True,
    help="Patch a --source that is not the release (untagged, a branch) as if it were.",
)
@click.option("--only", multiple=True, metavar="ID", help="Apply only this patch (repeatable).")
@index_option
@json_option
@installed_flag
@target_option
@series_option
@pass_settings
def command(
    vllm,
    into,
    source,
    git_url,
    in_place,
    any_base,
    only,
    as_json,
    installed_,
    target,
    settings,
):
    """Create or update a vLLM work tree with the series applied, one commit per patch.

    The release comes from its source distribution on the package index (hash
    checked, cached), from --source, or from --git.  Each patch is reported as
    applied, already upstream, or failed (with file and hunk).  Running it again
    gives the same commits and says so.  With --installed it patches the vLLM
    installed in this environment in place instead (see status / revert).
    """
    if installed_ or target:
        if into or source or git_url or in_place:
            raise UsageError("--installed patches the installed vLLM; drop --into/--source/--git")
        report = installed.apply(target, vllm, settings, list(only) or None)
        click.echo(report.to_json() if as_json else render_installed(report))
        return
    report = apply_tree(
        vllm, into, source, git_url, in_place, list(only) or None, settings, any_base
    )
    click.echo(report.to_json() if as_json else render_apply(report))
    if not report.ok:
        failed = next(o for o in report.outcomes if o.status == "failed")
        raise PatchFailed(
            f"patch {failed.id} failed ({failed.detail}); the tree is at the last good commit "
            f"on {report.branch}; refresh the patch for this release, or leave it out with --only"
        )
