"""``moe-patch clean``: what killed runs left in the cache; --all empties it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..commands.clean import clean, failure
from ..errors import EXIT_BUSY, EXIT_LOCAL_IO, EXIT_USAGE, command_epilog
from .options import Folder
from .render import render_clean


@click.command(
    "clean",
    epilog=command_epilog(
        [
            "moe-patch clean --dry-run                     # what killed runs left, with sizes",
            "moe-patch clean --into vllm-0.21.0            # also what killed runs left there",
            "moe-patch clean --all                         # empty the cache",
        ],
        {EXIT_USAGE, EXIT_BUSY, EXIT_LOCAL_IO},
    ),
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Also remove every cache entry: downloads, release trees, wheels, listings.",
)
@click.option(
    "--into",
    type=Folder(path_type=Path),
    help="Also remove the scratch trees killed runs left beside this --into, and the git "
    "locks they left in it.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(everything, into, dry_run, as_json):
    """Remove what killed runs left in the cache (and beside --into); --all empties the cache.

    Entries another run is using are kept (exit 6 when any was)."""
    report = clean(everything=everything, into=into, dry_run=dry_run)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else render_clean(report))
    if error := failure(report):
        raise error
