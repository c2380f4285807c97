"""The click layer of ``moe-patch pr`` (the work is in :mod:`moe_patch.pr`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import EXIT_PATCH_FAILED, EXIT_STATE, EXIT_VERIFY_FAILED, FETCHING, command_epilog


def register(main: click.Group, series_option) -> None:
    @main.command(
        epilog=command_epilog(
            [
                "moe-patch pr --source ~/src/vllm --onto upstream/main",
                "moe-patch pr --source ~/src/vllm --onto v0.33.0 --only jit-annotations",
            ],
            FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE, EXIT_VERIFY_FAILED},
        )
    )
    @click.option(
        "--source",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Your vLLM git clone (its working tree and current branch are left as they are).",
    )
    @click.option(
        "--onto",
        required=True,
        metavar="REF",
        help="Base the branches on this ref: main, upstream/main, v0.33.0 or 0.33.0.",
    )
    @click.option(
        "--prefix",
        default="moe-patch/",
        show_default=True,
        help="Branch name prefix (branch = PREFIX + patch id).",
    )
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        help="Directory for the PR description files (<patch-id>.md) "
        "[default: moe-patch-pr/ in the clone's .git directory].",
    )
    @click.option("--only", multiple=True, metavar="ID", help="Only this patch (repeatable).")
    @click.option("--force", is_flag=True, help="Replace branches of the same name.")
    @click.option("--index-url", metavar="URL", help="Package index for the series base release.")
    @click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
    @series_option
    def pr(source, onto, prefix, out, only, force, index_url, as_json, series_root):
        """Make one upstream-ready branch per patch that vLLM lacks at --onto.

        Each branch holds its patch as one commit with a vLLM-style title ([Perf] ...),
        the reasons as the body, a test under tests/kernels/moe/ and a Signed-off-by
        for your git identity; it passes the target tree's own ruff configuration.
        Patches that are Inappropriate upstream or already upstream are skipped.  A PR
        description (Purpose / Test Plan / Test Result) is written per branch, with
        the git push and gh pr create commands.  Nothing is pushed.
        """
        from . import pr as engine

        report = engine.prepare(
            source, onto, out, prefix, list(only) or None, series_root, force, index_url
        )
        click.echo(report.to_json() if as_json else engine.render(report))
        if not report.ok:
            sys.exit(EXIT_PATCH_FAILED)
        if any(o.detail.startswith("lint fails") for o in report.outcomes):
            sys.exit(EXIT_VERIFY_FAILED)
