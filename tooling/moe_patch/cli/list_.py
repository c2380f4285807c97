"""``moe-patch list``: the series, its patches and their upstream status."""

from __future__ import annotations

import json

import click

from ..commands.list import list_series, serving_ranges
from ..errors import EXIT_USAGE, command_epilog
from .options import pass_settings, series_option
from .render import render_list


@click.command(
    "list",
    epilog=command_epilog(["moe-patch list", "moe-patch list --vllm 0.33.0 --json"], {EXIT_USAGE}),
)
@click.option(
    "--vllm",
    "vllm",
    metavar="VERSION",
    help="Only the series that serves this release (exact version).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@series_option
@pass_settings
def command(vllm, as_json, settings):
    """Show the series: base releases, patches in order, upstream status, GPU runs."""
    rows = list_series(vllm=vllm, settings=settings)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        click.echo(render_list(rows, serving_ranges(settings=settings)))
