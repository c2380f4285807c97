"""``moe-patch revert --installed``: apply --installed undone, byte for byte."""

from __future__ import annotations

import click

from ..commands.revert import revert
from ..errors import EXIT_BUSY, EXIT_LOCAL_IO, EXIT_STATE, EXIT_USAGE, UsageError, command_epilog
from .options import installed_required, json_option, target_option
from .render import render_installed, show


@click.command(
    "revert",
    epilog=command_epilog(
        ["moe-patch revert --installed"], {EXIT_USAGE, EXIT_BUSY, EXIT_STATE, EXIT_LOCAL_IO}
    ),
)
@installed_required
@target_option
@json_option
def command(installed_, target, as_json):
    """Undo apply --installed: every file back byte for byte, RECORD included."""
    if not installed_:
        raise UsageError("moe-patch revert works on an installed vLLM: pass --installed")
    show(revert(target=target), as_json, render_installed)
