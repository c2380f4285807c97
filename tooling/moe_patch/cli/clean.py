"""``moe-patch clean``: what killed runs left in the cache; --all empties it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..commands.clean import clean
from ..errors import EXIT_BUSY, EXIT_LOCAL_IO, EXIT_USAGE, BusyError, command_epilog
from ..report import render_clean
from .options import Folder


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
    report = clean(everything, into, dry_run)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else render_clean(report))
    if report.in_use:
        raise BusyError(
            f"{len(report.in_use)} cache entr{'ies are' if len(report.in_use) > 1 else 'y is'} "
            "in use by another moe-patch run and kept; run clean again when it has finished"
        )
