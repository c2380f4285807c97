"""``moe-patch export``: a checkout (or rebase) tree's commits written back as the series."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.export import export, failure
from ..errors import (
    EXIT_EXPORT_STALE,
    EXIT_INTEGRITY,
    EXIT_LOCAL_IO,
    EXIT_STATE,
    EXIT_USAGE,
    command_epilog,
)
from .render import export_json, render_export


@click.command(
    "export",
    epilog=command_epilog(
        [
            "moe-patch export work/series-0.20            # write the series files",
            "moe-patch export --check work/series-0.20    # exit 10 if they are stale",
            "moe-patch export --author 'Jane Dev <jane.dev@users.noreply.github.com>' work/series-0.20",
        ],
        {EXIT_USAGE, EXIT_INTEGRITY, EXIT_STATE, EXIT_EXPORT_STALE, EXIT_LOCAL_IO},
    ),
)
@click.argument(
    "directory", type=click.Path(file_okay=False, path_type=Path), default=".", required=False
)
@click.option(
    "--patches",
    "series_root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Series root to write to [default: the one the tree was checked out from].",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 10 if the files would change.")
@click.option(
    "--author",
    metavar="'NAME <EMAIL>'",
    help="Write patches committed under a placeholder address (a domain reserved for "
    "examples) under this identity and its sign-off [default: MOE_PATCH_AUTHOR, else "
    "git's user.name and user.email].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(directory, series_root, check, author, as_json):
    """Write the commits of a checkout (or rebase) tree back to its series directory.

    Deterministic: unchanged commits reproduce their files byte for byte; no dates
    of the export, no version signature; patch files named by their Patch-Filename
    trailer (new commits: by their subject); series in commit order.
    """
    result = export(tree=directory, series_root=series_root, check=check, author=author)
    click.echo(export_json(result) if as_json else render_export(result))
    if error := failure(result, check=check):
        raise error
