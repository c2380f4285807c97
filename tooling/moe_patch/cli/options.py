"""Options that several commands share, defined once."""

from __future__ import annotations

from pathlib import Path

import click

series_option = click.option(
    "--patches",
    "series_root",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="MOE_PATCH_SERIES",
    help="Series directory to use instead of the one shipped with moe-patch.",
)
index_option = click.option(
    "--index-url", metavar="URL", help="Package index to read releases from [default: pip's]."
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print a machine-readable report."
)
target_option = click.option(
    "--target",
    type=click.Path(file_okay=False, path_type=Path),
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
