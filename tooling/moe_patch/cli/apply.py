"""``moe-patch apply``: a patched vLLM work tree, or (--installed) the installed vLLM."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.apply import apply, failure
from ..errors import EXIT_PATCH_FAILED, EXIT_STATE, FETCHING, command_epilog
from .options import (
    Folder,
    index_option,
    installed_flag,
    json_option,
    pass_settings,
    series_option,
    target_option,
)
from .render import render_apply, render_installed, show


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
    report = apply(
        vllm=vllm,
        into=into,
        source=source,
        git_url=git_url,
        in_place=in_place,
        only=list(only) or None,
        settings=settings,
        any_base=any_base,
        installed=installed_,
        target=target,
    )
    show(report, as_json, render_installed if installed_ or target else render_apply)
    if error := failure(report):
        raise error
