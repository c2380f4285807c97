"""``moe-patch checkout``: the series as commits on its base release, to edit with git."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.checkout import checkout
from ..errors import EXIT_PATCH_FAILED, EXIT_STATE, FETCHING, command_epilog
from .options import Folder, index_option, pass_settings, series_option
from .render import render_checkout


@click.command(
    "checkout",
    epilog=command_epilog(
        ["moe-patch checkout --vllm 0.21.0 work/series-0.20   # then edit with git, export"],
        FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE},
    ),
)
@click.option(
    "--vllm", "vllm", metavar="VERSION", required=True, help="The release whose series to edit."
)
@click.argument("directory", type=Folder(file_okay=False, path_type=Path))
@index_option
@series_option
@pass_settings
def command(vllm, directory, settings):
    """The series serving VERSION as commits on its base release, in DIRECTORY.

    Each commit is one patch, marked with a Patch-Filename trailer.  Edit with plain
    git (commit --amend, rebase -i, new commits), then: moe-patch export DIRECTORY.
    """
    click.echo(render_checkout(checkout(vllm=vllm, into=directory, settings=settings)))
