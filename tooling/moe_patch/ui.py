"""Terminal output: warnings and progress on stderr, so stdout stays for reports."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import click


def warn(message: str) -> None:
    click.secho(f"moe-patch: warning: {message}", err=True, fg="yellow")


def info(message: str) -> None:
    click.echo(f"moe-patch: {message}", err=True)


@contextlib.contextmanager
def progress(total: int | None, label: str) -> Iterator[callable]:
    """A progress bar on a terminal, nothing otherwise; yields ``advance(n)``."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    with click.progressbar(length=total or 0, label=label, file=sys.stderr) as bar:
        yield bar.update
