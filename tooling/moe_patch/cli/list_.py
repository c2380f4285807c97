"""``moe-patch list``: the series, its patches and their upstream status."""

from __future__ import annotations

import json

import click

from ..commands.list import list_series, serving_ranges
from ..errors import EXIT_USAGE, command_epilog
from ..report import render_table
from .options import pass_settings, series_option


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
    rows = list_series(vllm, settings)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = [
        [f"v{r['base']}", str(r["position"]), r["id"], r["upstream_status"], r["subject"]]
        for r in rows
    ]
    click.echo(render_table(["base", "#", "patch", "upstream", "subject"], table))
    click.echo("")
    serves = serving_ranges(settings)
    gpu = {r["base"]: r["gpu"] for r in rows}
    table = [[f"v{base}", serves[base], facts] for base, facts in gpu.items()]
    click.echo(render_table(["series", "serves vLLM", "on a GPU"], table))
