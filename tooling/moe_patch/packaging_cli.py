"""The click layer of the packaging commands: ``wheel``, ``status`` and ``revert``
(``apply --installed`` is an option of ``apply`` in :mod:`moe_patch.cli`).

:func:`register` adds them to the ``moe-patch`` group; the work is done by
:mod:`moe_patch.commands.wheel` and :mod:`moe_patch.installed`.
"""

from __future__ import annotations

from pathlib import Path

import click

from . import installed
from .commands.wheel import METHODS
from .commands.wheel import wheel as wheel_command
from .errors import (
    EXIT_BUSY,
    EXIT_LOCAL_IO,
    EXIT_PATCH_FAILED,
    EXIT_STATE,
    EXIT_USAGE,
    FETCHING,
    UsageError,
    command_epilog,
)
from .report import render_table

_index_option = click.option(
    "--index-url", metavar="URL", help="Package index to read releases from [default: pip's]."
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


def render_installed(report: installed.InstalledReport) -> str:
    lines = [f"vLLM {report.vllm} at {report.location}: {report.state}"]
    if report.series_base:
        lines[0] += f" (series v{report.series_base}"
        lines[0] += f", moe-patch {report.moe_patch})" if report.moe_patch else ")"
    if report.patches:
        rows = [[p["id"], p.get("status", "")] for p in report.patches]
        lines.append(render_table(["patch", "status"], rows, colour_column=1))
    if report.files:
        rows = [[f["path"], f["change"], f["now"]] for f in report.files]
        lines.append(
            render_table(
                ["file", "change", "now"],
                rows,
                colour_column=2,
                colours={"patched": "green", "release": "cyan", "changed": "red"},
            )
        )
    for path in report.skipped:
        lines.append(f"skipped (not installed, not needed at run time): {path}")
    if report.detail:
        lines.append(report.detail)
    return "\n".join(lines)


def render_wheel(result) -> str:
    rows = [[p["id"], p["status"], p["detail"]] for p in result.patches]
    changed = ", ".join(f["path"] for f in result.files) or "none"
    lines = [
        f"{result.path}",
        f"  vLLM {result.version} ({result.method}), {result.size / 1e6:.1f} MB, "
        f"sha256 {result.sha256}",
        f"  from {result.source} (sha256 {result.source_sha256[:16]}…), "
        f"series base v{result.series_base}",
        render_table(["patch", "status", "detail"], rows, colour_column=1),
        f"files changed: {changed}",
    ]
    for item in result.skipped:
        lines.append(f"skipped (not in the wheel, not needed at run time): {item['path']}")
    lines.append(f"done in {result.seconds:.1f} s")
    return "\n".join(lines)


def _require_installed(flag: bool, command: str) -> None:
    if not flag:
        raise UsageError(f"moe-patch {command} works on an installed vLLM: pass --installed")


def register(main: click.Group, series_option) -> None:
    @main.command(
        epilog=command_epilog(
            [
                "moe-patch wheel --vllm 0.21 -o dist/         # then: pip install dist/vllm-*.whl",
                "moe-patch wheel --vllm 0.21 --platform manylinux_2_28_aarch64",
            ],
            FETCHING | {EXIT_PATCH_FAILED},
        )
    )
    @click.option(
        "--vllm", "vllm", metavar="VERSION", help="Release: 0.21 (newest 0.21.x) or 0.21.0."
    )
    @click.option(
        "-o",
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("dist"),
        show_default=True,
        help="Directory for the wheel.",
    )
    @click.option(
        "--platform",
        metavar="TAG",
        help="Platform of the official wheel, e.g. manylinux_2_28_aarch64 [default: this "
        "machine's].",
    )
    @click.option(
        "--method",
        type=click.Choice(METHODS),
        default="repack",
        show_default=True,
        help="repack: the official wheel with the series carried onto it (seconds); "
        "precompiled: vLLM's own setup.py build of the patched tree with "
        "VLLM_USE_PRECOMPILED=1 (minutes, needs vLLM's build requirements).",
    )
    @click.option(
        "--no-build-isolation",
        is_flag=True,
        help="precompiled: build with this environment's packages instead of an isolated one.",
    )
    @_index_option
    @click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
    @series_option
    def wheel(vllm, out_dir, platform, method, no_build_isolation, index_url, as_json, series_root):
        """Build a patched vLLM wheel: vllm-X.Y.Z+moe.<series version>-….whl.

        The official wheel of the release (through pip, sha256-checked against the
        index, cached) with the series applied to its vllm/ package, a PEP 440 local
        version, and its dist-info rewritten (METADATA, RECORD, moe-patch.json).  Every
        compiled file stays byte-identical; the same inputs give the same bytes.
        Refuses, with the reason, a series that changes compiled sources or files the
        wheel lacks that matter at run time.
        """
        result = wheel_command(
            vllm, out_dir, platform, index_url, series_root, method, not no_build_isolation
        )
        click.echo(result.to_json() if as_json else render_wheel(result))

    @main.command(
        epilog=command_epilog(
            [
                "moe-patch status --installed",
                "moe-patch status --installed --target /opt/venv/lib/python3.12/site-packages",
            ],
            {EXIT_USAGE, EXIT_LOCAL_IO},
        )
    )
    @installed_required
    @target_option
    @click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
    @series_option
    def status(installed_, target, as_json, series_root):
        """Say whether the installed vLLM is patched, with what, and file by file."""
        _require_installed(installed_, "status")
        report = installed.status(target, series_root)
        click.echo(report.to_json() if as_json else render_installed(report))

    @main.command(
        epilog=command_epilog(
            ["moe-patch revert --installed"], {EXIT_USAGE, EXIT_BUSY, EXIT_STATE, EXIT_LOCAL_IO}
        )
    )
    @installed_required
    @target_option
    @click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
    def revert(installed_, target, as_json):
        """Undo apply --installed: every file back byte for byte, RECORD included."""
        _require_installed(installed_, "revert")
        report = installed.revert(target)
        click.echo(report.to_json() if as_json else render_installed(report))
