"""``moe-patch status --installed``: whether the installed vLLM is patched, file by file."""

from __future__ import annotations

import click

from ..commands.status import status
from ..errors import EXIT_LOCAL_IO, EXIT_USAGE, UsageError, command_epilog
from .options import installed_required, json_option, pass_settings, series_option, target_option
from .render import render_installed, show


@click.command(
    "status",
    epilog=command_epilog(
        [
            "moe-patch status --installed",
            "moe-patch status --installed --target /opt/venv/lib/python3.12/site-packages",
        ],
        {EXIT_USAGE, EXIT_LOCAL_IO},
    ),
)
@installed_required
@target_option
@json_option
@series_option
@pass_settings
def command(installed_, target, as_json, settings):
    """Say whether the installed vLLM is patched, with what, and file by file."""
    if not installed_:
        raise UsageError("moe-patch status works on an installed vLLM: pass --installed")
    show(status(target=target, settings=settings), as_json, render_installed)
