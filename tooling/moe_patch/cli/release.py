"""``moe-patch release``: record the series' content as the release of moe-patch's version."""

from __future__ import annotations

import click

from ..commands.release import check, release
from ..errors import (
    EXIT_LOCAL_IO,
    EXIT_STATE,
    EXIT_USAGE,
    EXIT_VERIFY_FAILED,
    MoePatchError,
    command_epilog,
)
from .options import pass_settings, series_option


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
        result = check(settings)
        click.echo(f"release-version {result.status}: {result.detail}")
        if result.status == "fail":
            raise MoePatchError("release --check failed", EXIT_VERIFY_FAILED)
        return
    result = release(settings)
    since = f"since {result.previous}" if result.previous else "(the first release)"
    click.echo(
        f"recorded {result.record}: {result.files} files, {len(result.changed)} changed {since}"
    )
    click.echo("commit it, then tag the commit that contains it:")
    click.echo(f"  git tag -a {result.tag} -m 'moe-patch {result.version}'")
