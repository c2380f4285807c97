"""``moe-patch verify``: the series checked on every supported release, in one report."""

from __future__ import annotations

import json

import click

from ..commands.verify import failure, releases, verify
from ..errors import EXIT_VERIFY_FAILED, FETCHING, command_epilog
from .options import index_option, json_option, pass_settings, series_option
from .render import render_verify, show


@click.command(
    "verify",
    epilog=command_epilog(
        [
            "moe-patch verify                             # every supported release",
            "moe-patch verify --vllm 0.21.0 --vllm 0.33.0 --json",
            "moe-patch verify --vllm 0.21.0 --kernels     # also the kernel tests",
        ],
        FETCHING | {EXIT_VERIFY_FAILED},
    ),
)
@click.option(
    "--vllm",
    "versions",
    multiple=True,
    metavar="VERSION",
    help="Verify this release (repeatable) [default: every supported release].",
)
@click.option("--all", "all_releases", is_flag=True, help="Every supported release (default).")
@click.option("--kernels", is_flag=True, help="Also run the kernel tests on each patched tree.")
@click.option(
    "--kernels-python",
    metavar="PYTHON",
    envvar="MOE_PATCH_KERNELS_PYTHON",
    help="Python with torch and triton for --kernels [default: the one running moe-patch].",
)
@click.option(
    "-j", "--jobs", type=click.IntRange(1), help="Releases checked at once [default: CPUs]."
)
@click.option(
    "--list", "list_only", is_flag=True, help="Print the releases --all covers (JSON); exit."
)
@index_option
@json_option
@series_option
@pass_settings
def command(
    versions,
    all_releases,
    kernels,
    kernels_python,
    jobs,
    list_only,
    as_json,
    settings,
):
    """Check the series on every supported release: one report, non-zero if anything fails.

    Per series base: series-integrity (series file, headers, paths) and exported-form
    (re-exporting the applied commits reproduces the files byte for byte).  Per
    release: apply (in order, no fuzz; per-patch status), compile, ruff-check and
    ruff-format with the tree's own configuration and pinned ruff, and with --kernels
    the kernel tests against the patched tree.
    """
    if list_only:
        click.echo(json.dumps(releases(settings=settings)))
        return
    report = verify(
        versions=list(versions),
        all_releases=all_releases,
        kernels=kernels,
        kernels_python=kernels_python,
        jobs=jobs,
        settings=settings,
    )
    show(report, as_json, render_verify)
    if error := failure(report):
        raise error
