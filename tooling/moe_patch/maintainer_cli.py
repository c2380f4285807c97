"""The click layer of the maintainer's commands: verify, rebase, checkout, export.

:func:`register` adds them to the ``moe-patch`` group of :mod:`moe_patch.cli`; the
work is done by the plain functions in :mod:`moe_patch.commands`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import rebase as rebase_engine
from . import verify as verify_engine
from .commands.checkout import checkout as checkout_command
from .commands.checkout import export as export_command
from .commands.rebase import rebase as rebase_command
from .commands.verify import releases as releases_command
from .commands.verify import verify as verify_command
from .errors import (
    EXIT_CONFLICT,
    EXIT_EXPORT_STALE,
    EXIT_INTEGRITY,
    EXIT_LOCAL_IO,
    EXIT_PATCH_FAILED,
    EXIT_STATE,
    EXIT_USAGE,
    EXIT_VERIFY_FAILED,
    FETCHING,
    RebaseStopped,
    command_epilog,
)
from .report import render_table

_index_option = click.option(
    "--index-url", metavar="URL", help="Package index to read releases from [default: pip's]."
)


def _fail(message: str, code: int) -> None:
    click.secho(f"moe-patch: error: {message}", err=True, fg="red")
    sys.exit(code)


def register(main: click.Group, series_option) -> None:
    @main.command(
        epilog=command_epilog(
            [
                "moe-patch verify                             # every supported release",
                "moe-patch verify --vllm 0.21.0 --vllm 0.33.0 --json",
                "moe-patch verify --vllm 0.21.0 --kernels     # also the kernel tests",
            ],
            FETCHING | {EXIT_VERIFY_FAILED},
        )
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
    @_index_option
    @click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
    @series_option
    def verify(
        versions,
        all_releases,
        kernels,
        kernels_python,
        jobs,
        list_only,
        index_url,
        as_json,
        series_root,
    ):
        """Check the series on every supported release: one report, non-zero if anything fails.

        Per series base: series-integrity (series file, headers, paths) and exported-form
        (re-exporting the applied commits reproduces the files byte for byte).  Per
        release: apply (in order, no fuzz; per-patch status), compile, ruff-check and
        ruff-format with the tree's own configuration, and with --kernels the kernel
        tests against the patched tree.
        """
        if list_only:
            click.echo(json.dumps(releases_command(series_root, index_url)))
            return
        report = verify_command(
            list(versions), all_releases, kernels, kernels_python, jobs, series_root, index_url
        )
        click.echo(report.to_json() if as_json else verify_engine.render(report))
        if not report.ok:
            failed = [f"{w} {c.name}" for w, c in report.all_checks() if c.status == "fail"]
            more = f" (+{len(failed) - 4} more)" if len(failed) > 4 else ""
            _fail(f"verify failed: {', '.join(failed[:4])}{more}", EXIT_VERIFY_FAILED)

    @main.command(
        epilog=command_epilog(
            [
                "moe-patch rebase --onto 0.34.0 --into work/rebase-0.34",
                "moe-patch rebase --continue --into work/rebase-0.34   # after resolving",
                "moe-patch rebase --abort --into work/rebase-0.34",
            ],
            FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE, EXIT_CONFLICT},
        )
    )
    @click.option("--onto", metavar="VERSION", help="The release to carry the series onto.")
    @click.option(
        "--from",
        "base",
        metavar="BASE",
        help="The series base to carry [default: the newest base older than --onto].",
    )
    @click.option(
        "--source",
        type=click.Path(path_type=Path),
        help="Take the --onto release from this checkout or unpacked tree (copied).",
    )
    @click.option("--git", "git_url", metavar="URL", help="Clone tag vVERSION from this remote.")
    @click.option(
        "--any-base",
        is_flag=True,
        help="Take a --source that is not the release (untagged, a branch) as --onto anyway.",
    )
    @click.option(
        "--into",
        type=click.Path(file_okay=False, path_type=Path),
        help="Work tree of the rebase [default: ./vllm-VERSION-rebase].",
    )
    @click.option("--continue", "continue_", is_flag=True, help="Go on after resolving a conflict.")
    @click.option("--skip", is_flag=True, help="Drop the conflicting patch from the new series.")
    @click.option("--abort", is_flag=True, help="Give up: remove the rebase's work tree.")
    @_index_option
    @series_option
    def rebase(
        onto, base, source, git_url, any_base, into, continue_, skip, abort, index_url, series_root
    ):
        """Replay the series onto another release with 3-way merges, patch by patch.

        Each patch is clean, refreshed (its context moved), dropped because the release
        already has it (recorded as Applied-Upstream in the old patch), or a conflict:
        then the rebase stops with conflict markers in the tree, like git rebase.  When
        every patch is done the new series is written to patches/vVERSION/ and a
        range-diff of the old series against the new one is printed.
        """
        actions = [a for a, on in (("continue", continue_), ("skip", skip), ("abort", abort)) if on]
        if len(actions) > 1:
            _fail("give one of --continue, --skip, --abort", 2)
        action = actions[0] if actions else None
        try:
            result = rebase_command(
                onto, base, into, source, git_url, action, series_root, index_url, any_base
            )
        except RebaseStopped as stopped:
            click.echo(_render_steps(stopped.state))
            click.echo(rebase_engine.resolve_instructions(stopped.state))
            raise
        if action == "abort":
            click.echo(
                f"rebase onto vLLM {result.onto} aborted: removed {result.tree}; "
                "the series directories were not touched"
            )
            return
        click.echo(_render_steps(result.state))
        count = sum(1 for s in result.state.steps if s.commit)
        click.echo(f"new series: {result.series_dir} ({count} patch{'es' if count != 1 else ''})")
        for entry in result.recorded:
            click.echo(f"recorded Applied-Upstream: {entry['version']} in {entry['path']}")
        click.echo(f"work tree: {result.state.tree} (edit, commit, then moe-patch export)")
        click.echo(f"\nrange-diff v{result.state.base} -> v{result.state.onto}:")
        click.echo(result.range_diff or "(both series are empty)")

    @main.command(
        epilog=command_epilog(
            ["moe-patch checkout --vllm 0.21.0 work/series-0.20   # then edit with git, export"],
            FETCHING | {EXIT_PATCH_FAILED, EXIT_STATE},
        )
    )
    @click.option(
        "--vllm", "vllm", metavar="VERSION", required=True, help="The release whose series to edit."
    )
    @click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
    @_index_option
    @series_option
    def checkout(vllm, directory, index_url, series_root):
        """The series serving VERSION as commits on its base release, in DIRECTORY.

        Each commit is one patch, marked with a Patch-Filename trailer.  Edit with plain
        git (commit --amend, rebase -i, new commits), then: moe-patch export DIRECTORY.
        """
        result = checkout_command(vllm, directory, series_root, index_url)
        rows = [[p["id"], p["commit"][:12], p["subject"]] for p in result.patches]
        click.echo(f"series v{result.base} checked out in {result.tree} on branch {result.branch}")
        click.echo(render_table(["patch", "commit", "subject"], rows))
        click.echo(f"edit with git on top of v{result.base}, then: moe-patch export {result.tree}")

    @main.command(
        name="export",
        epilog=command_epilog(
            [
                "moe-patch export work/series-0.20            # write the series files",
                "moe-patch export --check work/series-0.20    # exit 10 if they are stale",
                "moe-patch export --author 'Jane Dev <jane.dev@users.noreply.github.com>' work/series-0.20",
            ],
            {EXIT_USAGE, EXIT_INTEGRITY, EXIT_STATE, EXIT_EXPORT_STALE, EXIT_LOCAL_IO},
        ),
    )
    @click.argument(
        "directory", type=click.Path(file_okay=False, path_type=Path), default=".", required=False
    )
    @click.option(
        "--patches",
        "series_root",
        type=click.Path(file_okay=False, path_type=Path),
        help="Series root to write to [default: the one the tree was checked out from].",
    )
    @click.option("--check", is_flag=True, help="Write nothing; exit 10 if the files would change.")
    @click.option(
        "--author",
        metavar="'NAME <EMAIL>'",
        help="Write patches committed under a placeholder address (a domain reserved for "
        "examples) under this identity and its sign-off [default: MOE_PATCH_AUTHOR, else "
        "git's user.name and user.email].",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    def export_cmd(directory, series_root, check, author, as_json):
        """Write the commits of a checkout (or rebase) tree back to its series directory.

        Deterministic: unchanged commits reproduce their files byte for byte; no dates
        of the export, no version signature; patch files named by their Patch-Filename
        trailer (new commits: by their subject); series in commit order.
        """
        result = export_command(directory, series_root, check, author)
        if as_json:
            from dataclasses import asdict

            click.echo(json.dumps({**asdict(result), "changed": result.changed}, indent=2))
        else:
            rows = [[c["patch"], c["change"], (c["commit"] or "")[:12]] for c in result.changes]
            click.echo(render_table(["patch", "change", "commit"], rows))
            if result.written:
                click.echo(f"wrote {result.series_dir}")
            elif not result.changed:
                click.echo(f"{result.series_dir} is up to date")
        if check and result.changed:
            _fail(
                f"{result.series_dir} is not what the commits export to; run moe-patch export",
                EXIT_EXPORT_STALE,
            )


def _render_steps(state: rebase_engine.RebaseState) -> str:
    rows = [
        [
            s.id,
            s.result,
            (s.commit or "")[:12],
            (
                f"Applied-Upstream: {s.applied_upstream} ({s.detail})"
                if s.applied_upstream
                else s.detail
            ),
        ]
        for s in state.steps
    ]
    header = f"rebase of series v{state.base} onto vLLM {state.onto} in {state.tree}"
    return header + "\n" + render_table(["patch", "result", "commit", "detail"], rows)
