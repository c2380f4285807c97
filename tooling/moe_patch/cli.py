"""The ``moe-patch`` command line: a thin click layer over :mod:`moe_patch.commands`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import git

from . import __version__, gitutil
from .commands.apply import apply as apply_command
from .commands.clean import clean as clean_command
from .commands.list import list_series
from .errors import (
    EXIT_BUSY,
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_LOCAL_IO,
    EXIT_PATCH_FAILED,
    EXIT_STATE,
    EXIT_USAGE,
    FETCHING,
    LOCAL_IO_WORDS,
    MoePatchError,
    command_epilog,
)
from .maintainer_cli import register as _register_maintainer_commands
from .packaging_cli import installed_flag, target_option
from .packaging_cli import register as _register_packaging_commands
from .pr_cli import register as _register_pr_command
from .report import render_apply, render_clean, render_table

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Group(click.Group):
    """The one error policy: every failure is one line on stderr and a documented exit code
    (a :class:`MoePatchError`'s own, 11 for a local read or write, 1 for a bug), never a
    traceback."""

    def invoke(self, ctx):
        gitutil.isolate_process()
        try:
            return super().invoke(ctx)
        except MoePatchError as exc:
            click.secho(f"moe-patch: error: {exc.message}", err=True, fg="red")
            sys.exit(exc.exit_code)
        except OSError as exc:  # disk full, read-only or unwritable: one line, not a traceback
            where = f" ({exc.filename})" if exc.filename else ""
            click.secho(
                f"moe-patch: error: {exc.strerror or exc}{where}; what this run wrote was "
                "rolled back: free space or fix permissions, then run the same command again",
                err=True,
                fg="red",
            )
            sys.exit(EXIT_LOCAL_IO)
        except git.GitCommandError as exc:
            click.secho(f"moe-patch: error: {_git_failure(exc)}", err=True, fg="red")
            sys.exit(EXIT_LOCAL_IO if LOCAL_IO_WORDS.search(str(exc.stderr)) else EXIT_INTERNAL)
        except KeyboardInterrupt:
            click.secho("moe-patch: interrupted; run the same command again to finish", err=True)
            sys.exit(130)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: one line, the traceback only on request
            if os.environ.get("MOE_PATCH_DEBUG"):
                raise
            click.secho(
                f"moe-patch: internal error: {type(exc).__name__}: {exc}; please report it with "
                "the command you ran (MOE_PATCH_DEBUG=1 shows the traceback)",
                err=True,
                fg="red",
            )
            sys.exit(EXIT_INTERNAL)


def _git_failure(exc: git.GitCommandError) -> str:
    """One line for a git command that failed: which command and git's last words."""
    last = gitutil.last_words(str(exc.stderr or "")) or f"exit {exc.status}"
    verb = exc.command[1] if isinstance(exc.command, list) and len(exc.command) > 1 else "git"
    if LOCAL_IO_WORDS.search(str(exc.stderr)):
        return (
            f"git {verb} could not write ({last}); free space or fix permissions, "
            "then run the same command again"
        )
    return f"git {verb} failed ({last}); please report it with the command you ran"


@click.group(cls=_Group, context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="moe-patch")
def main():
    """Apply, verify and ship the moe-patch series for vLLM's FP8 fused-MoE path."""


_series_option = click.option(
    "--patches",
    "series_root",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="MOE_PATCH_SERIES",
    help="Series directory to use instead of the one shipped with moe-patch.",
)


@main.command(
    epilog=command_epilog(
        [
            "moe-patch apply --vllm 0.21                   # ./vllm-0.21.0, patched",
            "moe-patch apply --vllm 0.21.0 --into work/vllm --only swap-ab",
            "moe-patch apply --vllm 0.21 --source ~/src/vllm   # from a copy of your checkout",
            "moe-patch apply --installed                   # the vllm of this environment",
        ],
        FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE},
    )
)
@click.option(
    "--vllm", "vllm", metavar="VERSION", help="Release: 0.21 (newest 0.21.x), 0.21.0 or v0.21.0."
)
@click.option(
    "--into",
    type=click.Path(file_okay=False, path_type=Path),
    help="Work tree to create or update [default: ./vllm-VERSION].",
)
@click.option(
    "--source",
    type=click.Path(path_type=Path),
    help="Start from this vLLM checkout or unpacked tree (copied unless --in-place).",
)
@click.option(
    "--git",
    "git_url",
    metavar="URL",
    help="Clone tag vVERSION from this remote (e.g. https://github.com/vllm-project/vllm.git).",
)
@click.option(
    "--in-place", is_flag=True, help="Patch the clean --source checkout itself, on a new branch."
)
@click.option(
    "--any-base",
    is_flag=True,
    help="Patch a --source that is not the release (untagged, a branch) as if it were.",
)
@click.option("--only", multiple=True, metavar="ID", help="Apply only this patch (repeatable).")
@click.option(
    "--index-url", metavar="URL", help="Package index to read releases from [default: pip's]."
)
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
@installed_flag
@target_option
@_series_option
def apply(
    vllm,
    into,
    source,
    git_url,
    in_place,
    any_base,
    only,
    index_url,
    as_json,
    installed_,
    target,
    series_root,
):
    """Create or update a vLLM work tree with the series applied, one commit per patch.

    The release comes from its source distribution on the package index (hash
    checked, cached), from --source, or from --git.  Each patch is reported as
    applied, already upstream, or failed (with file and hunk).  Running it again
    gives the same commits and says so.  With --installed it patches the vLLM
    installed in this environment in place instead (see status / revert).
    """
    if installed_ or target:
        _apply_installed(
            vllm, into, source, git_url, in_place, only, index_url, as_json, target, series_root
        )
        return
    report = apply_command(
        vllm, into, source, git_url, in_place, list(only) or None, index_url, series_root, any_base
    )
    click.echo(report.to_json() if as_json else render_apply(report))
    if not report.ok:
        failed = next(o for o in report.outcomes if o.status == "failed")
        click.secho(
            f"moe-patch: error: patch {failed.id} failed ({failed.detail}); the tree is at the "
            f"last good commit on {report.branch}; refresh the patch for this release, "
            "or leave it out with --only",
            err=True,
            fg="red",
        )
        sys.exit(EXIT_PATCH_FAILED)


def _apply_installed(
    vllm, into, source, git_url, in_place, only, index_url, as_json, target, series_root
):
    from . import installed
    from .errors import UsageError
    from .packaging_cli import render_installed

    if into or source or git_url or in_place:
        raise UsageError("--installed patches the installed vLLM; drop --into/--source/--git")
    report = installed.apply(target, vllm, index_url, series_root, list(only) or None)
    click.echo(report.to_json() if as_json else render_installed(report))


@main.command(
    name="list",
    epilog=command_epilog(["moe-patch list", "moe-patch list --vllm 0.33.0 --json"], {EXIT_USAGE}),
)
@click.option(
    "--vllm",
    "vllm",
    metavar="VERSION",
    help="Only the series that serves this release (exact version).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_series_option
def list_cmd(vllm, as_json, series_root):
    """Show the series: base releases, patches in order, upstream status."""
    rows = list_series(vllm, series_root)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = [
        [f"v{r['base']}", str(r["position"]), r["id"], r["upstream_status"], r["subject"]]
        for r in rows
    ]
    click.echo(render_table(["base", "#", "patch", "upstream", "subject"], table))


@main.command(
    name="clean",
    epilog=command_epilog(
        [
            "moe-patch clean --dry-run                     # what killed runs left, with sizes",
            "moe-patch clean --into vllm-0.21.0            # also scratch trees beside it",
            "moe-patch clean --all                         # empty the cache",
        ],
        {EXIT_BUSY, EXIT_LOCAL_IO},
    ),
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Also remove every cache entry: downloads, release trees, wheels, listings.",
)
@click.option(
    "--into",
    type=click.Path(path_type=Path),
    help="Also remove the scratch trees killed runs left beside this --into.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def clean_cmd(everything, into, dry_run, as_json):
    """Remove what killed runs left in the cache (and beside --into); --all empties the cache.

    Entries another run is using are kept (exit 6 when any was)."""
    report = clean_command(everything, into, dry_run)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(render_clean(report))
    if report.in_use:
        sys.exit(EXIT_BUSY)


_register_maintainer_commands(main, _series_option)
_register_packaging_commands(main, _series_option)
_register_pr_command(main, _series_option)
