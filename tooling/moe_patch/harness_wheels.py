"""The two vLLM wheels the end-to-end benchmark compares, made on any machine with the package
index.

    python -m moe_patch.harness_wheels --vllm 0.21 --out .e2e/wheels

puts into ``--out`` the official wheel of the release (moe-patch's own download, checked
against the index's sha256), the wheel ``moe-patch wheel`` builds from it with the series
(``$MOE_PATCH_SERIES``, else this checkout's) and ``wheels.json``: the release, the series
version and commit, and each wheel's file, size and sha256 (the patched one's version and
patches too).  The benchmark takes the folder as it is (``python -m moe_e2e.bundle --wheels
.e2e/wheels``, ``python -m moe_e2e.flashinfer_aot --wheels .e2e/wheels``) and never imports
moe-patch; two builds of one series give the same patched wheel.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from . import releases
from . import wheel as wheels
from .cache import sha256_file
from .commands.wheel import wheel as build_patched
from .errors import MoePatchError
from .settings import Settings

MANIFEST = "wheels.json"
# The GPU machine's platform: the official wheel vLLM publishes for it.
GPU_PLATFORM = "manylinux_2_24_x86_64"


def harness_wheels(
    vllm: str, out: Path, platform: str = GPU_PLATFORM, settings: Settings | None = None
) -> dict:
    """Both wheels of ``vllm`` and ``out/wheels.json`` describing them; returns that."""
    settings = settings or Settings.resolve()
    patched = build_patched(vllm, out, platform=platform, settings=settings)
    official, dist = wheels.official_wheel(patched.vllm, platform, settings.index_url)
    shutil.copy2(official, out / official.name)
    described = {
        "vllm": patched.vllm,
        "series_version": releases.series_version(settings.series_root),
        "series_commit": releases.series_commit(settings.series_root),
        "platform": platform,
        "official": {
            "file": official.name,
            "sha256": sha256_file(out / official.name),
            "index_sha256": dist.sha256,
            "size": official.stat().st_size,
        },
        "patched": {
            "file": Path(patched.path).name,
            "sha256": patched.sha256,
            "size": patched.size,
            "version": patched.version,
            "patches": patched.patches,
        },
    }
    (out / MANIFEST).write_text(json.dumps(described, indent=2) + "\n")
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_patch.harness_wheels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--vllm", default="0.21", help="release (default: 0.21)")
    parser.add_argument("--out", type=Path, default=Path(".e2e/wheels"))
    parser.add_argument(
        "--platform",
        default=GPU_PLATFORM,
        help=f"the official wheel's platform tag, the GPU machine's (default: {GPU_PLATFORM})",
    )
    parser.add_argument("--index-url", default=None, help="package index (default: pip's)")
    args = parser.parse_args(argv)
    try:
        made = harness_wheels(
            args.vllm, args.out, args.platform, Settings.resolve(index_url=args.index_url)
        )
    except MoePatchError as exc:
        print(f"{parser.prog}: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(
        f"vLLM {made['vllm']} in {args.out}: {made['official']['file']}, "
        f"{made['patched']['file']} (series {made['series_version']} at {made['series_commit']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
