"""Options that several commands share, defined once, and the :class:`Settings` they make.

``--patches`` and ``--index-url`` are not parameters of the command functions: they are
remembered on the context, and :func:`pass_settings` hands the command one resolved
:class:`~moe_patch.settings.Settings` (also left on ``ctx.obj``), which it passes down.
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

from ..errors import UsageError
from ..settings import Settings


class Folder(click.Path):
    """A path that names a folder to make, change or read.  An empty one is refused: it would
    quietly mean the current directory (``--into "$UNSET"`` patching wherever you stand)."""

    def convert(self, value, param, ctx):
        if value == "":
            name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
            raise UsageError(f"{name} is empty; give a directory path ('.' for this one)")
        return super().convert(value, param, ctx)


def _remember(ctx: click.Context, param: click.Parameter, value):
    ctx.meta[f"moe_patch.{param.name}"] = value
    return value


def pass_settings(command):
    """Call ``command`` with ``settings=``: the places and index this invocation uses."""

    @functools.wraps(command)
    def with_settings(*args, **kwargs):
        ctx = click.get_current_context()
        ctx.obj = Settings.resolve(
            ctx.meta.get("moe_patch.series_root"), ctx.meta.get("moe_patch.index_url")
        )
        return command(*args, settings=ctx.obj, **kwargs)

    return with_settings


series_option = click.option(
    "--patches",
    "series_root",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="MOE_PATCH_SERIES",
    expose_value=False,
    callback=_remember,
    help="Series directory [default: patches/ of the moe-patch checkout you are in, else the "
    "series shipped with moe-patch].",
)
index_option = click.option(
    "--index-url",
    metavar="URL",
    expose_value=False,
    callback=_remember,
    help="Package index to read releases from [default: pip's].",
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print a machine-readable report."
)
target_option = click.option(
    "--target",
    type=Folder(file_okay=False, path_type=Path),
    help="Directory holding the installed vllm (site-packages, or a pip --target dir) "
    "[default: where this Python imports it from].",
)
installed_flag = click.option(
    "--installed", "installed_", is_flag=True, help="Act on the vLLM installed in this environment."
)
# status and revert act only on an installed vLLM: the flag says so, and is required.
installed_required = click.option(
    "--installed",
    "installed_",
    is_flag=True,
    help="Required: the vLLM installed in this environment (what this command acts on).",
)
