"""``moe-patch wheel``: a patched vLLM wheel, vllm-X.Y.Z+moe.<series version>-….whl."""

from __future__ import annotations

from pathlib import Path

import click

from ..commands.wheel import METHODS, wheel
from ..errors import EXIT_PATCH_FAILED, FETCHING, command_epilog
from .options import Folder, index_option, json_option, pass_settings, series_option
from .render import render_wheel, show


@click.command(
    "wheel",
    epilog=command_epilog(
        [
            "moe-patch wheel --vllm 0.21 -o dist/         # then: pip install dist/vllm-*.whl",
            "moe-patch wheel --vllm 0.21 --platform manylinux_2_28_aarch64",
        ],
        FETCHING | {EXIT_PATCH_FAILED},
    ),
)
@click.option("--vllm", "vllm", metavar="VERSION", help="Release: 0.21 (newest 0.21.x) or 0.21.0.")
@click.option(
    "-o",
    "--out",
    "out_dir",
    type=Folder(file_okay=False, path_type=Path),
    default=Path("dist"),
    show_default=True,
    help="Directory for the wheel.",
)
@click.option(
    "--platform",
    metavar="TAG",
    help="Platform of the official wheel, e.g. manylinux_2_28_aarch64 [default: this machine's].",
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
@index_option
@json_option
@series_option
@pass_settings
def command(vllm, out_dir, platform, method, no_build_isolation, as_json, settings):
    """Build a patched vLLM wheel: vllm-X.Y.Z+moe.<series version>-….whl.

    The official wheel of the release (through pip, sha256-checked against the
    index, cached) with the series applied to its vllm/ package, a PEP 440 local
    version, and its dist-info rewritten (METADATA, RECORD, moe-patch.json).  Every
    compiled file stays byte-identical; the same inputs give the same bytes.
    Refuses, with the reason, a series that changes compiled sources or files the
    wheel lacks that matter at run time.
    """
    result = wheel(
        vllm=vllm,
        out_dir=out_dir,
        platform=platform,
        settings=settings,
        method=method,
        build_isolation=not no_build_isolation,
    )
    show(result, as_json, render_wheel)
