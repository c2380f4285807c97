"""``moe-patch release``: record the series' content as the release of moe-patch's version."""

from __future__ import annotations

import click

from ..commands.release import check, check_failure, release
from ..errors import EXIT_LOCAL_IO, EXIT_STATE, EXIT_USAGE, EXIT_VERIFY_FAILED, command_epilog
from .options import pass_settings, series_option
from .render import render_release, render_release_check


@click.command(
    "release",
    epilog=command_epilog(
        [
            "moe-patch release            # write patches/releases/<version>.json",
            "moe-patch release --check    # exit 8 if the series changed and the version did not",
        ],
        {EXIT_USAGE, EXIT_STATE, EXIT_VERIFY_FAILED, EXIT_LOCAL_IO},
    ),
)
@click.option(
    "--check", "check_only", is_flag=True, help="Only compare the series with its last release."
)
@series_option
@pass_settings
def command(check_only, settings):
    """Record the series as released under moe-patch's version (maintainers).

    Writes patches/releases/<version>.json: the sha256 of every series, patch and upstream
    test file.  verify then fails when the series differs from the last release and the
    version has not moved.  Needs the release's section in CHANGELOG.md; prints the tag to
    create.  A record can be written again until its tag exists.
    """
    if check_only:
        compared = check(settings=settings)
        click.echo(render_release_check(compared))
        if error := check_failure(compared):
            raise error
        return
    click.echo(render_release(release(settings=settings)))
