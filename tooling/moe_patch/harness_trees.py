"""The vLLM trees a GPU run of the kernel harness needs, made on any machine with the package
index.

A label names a release as released (``0.21.0``), with the series that serves it applied
(``0.21.0+moe``), or with the series and the release's own config files in place of the
series' tables (``0.21.0+untuned``: the tree a search for those tables runs on); moe-patch's
download path and cache bring the release, and its applier the series (``$MOE_PATCH_SERIES``,
else this checkout's).  The harness reads only a tree's fused-MoE folder and
``vllm/_version.py`` (:func:`moe_kernels.trees.harness_files`), so what a device call has to
carry is those, about 3 MB a tree:

    python -m moe_patch.harness_trees 0.21.0 0.21.0+moe 0.33.0 0.33.0+moe --out .gpu/trees

writes ``.gpu/trees/<label>/`` for each label and ``.gpu/trees/trees.json``: per label what
it is, the series version and commit it was made from, the sha256 of its ``fused_moe.py`` and
the tree's fingerprint.  A run then names ``--tree LABEL=.gpu/trees/LABEL``; the harness
copies what ``trees.json`` says of each tree into its result file, and ``--resume`` refuses a
tree whose fingerprint changed.  The GPU machine needs only the folders (``.gpu/`` is ignored
by git, so a device call carries it by name), not moe-patch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from . import gitutil, releases, series, sources
from .applier import apply_series
from .errors import MoePatchError
from .settings import default_series_root

FUSED_MOE = Path("vllm", "model_executor", "layers", "fused_moe", "fused_moe.py")
CONFIGS = FUSED_MOE.parent / "configs"
KERNELS_MISSING = "the kernel harness needs torch and triton: pip install 'moe-patch[kernels]'"

# A label's suffix: the release as released, with the series, or with the series and the
# release's own config files (what a search for the series' tables runs on).
KINDS = ("", "moe", "untuned")
LABELS = "X.Y.Z, X.Y.Z+moe or X.Y.Z+untuned"


def split_label(label: str) -> tuple[str, str]:
    """``X.Y.Z``, ``X.Y.Z+moe`` or ``X.Y.Z+untuned`` -> (version, "" / "moe" / "untuned")."""
    version, _, kind = label.partition("+")
    if kind not in KINDS or not version:
        raise ValueError(f"{label!r}: a tree label is {LABELS}")
    return version, kind


def build_tree(
    label: str, into: Path, index_url: str | None = None, series_root: Path | None = None
) -> Path:
    """The whole vLLM tree ``label`` names, at ``into`` (a git work tree on the release;
    ``index_url``: the package index a release not in moe-patch's cache comes from, None
    for pip's; ``series_root``: the series applied, None for :func:`default_series_root`)."""
    version, kind = split_label(label)
    work = sources.from_cache(version, into, index_url)
    if kind:
        chosen = series.for_version(version, series_root or default_series_root())
        report = apply_series(work.path, work.base, version, chosen)
        if not report.ok:
            raise RuntimeError(f"the series did not apply to {version}: {report.to_json()}")
    if kind == "untuned":  # the release's config files in place of the series' tables
        shutil.rmtree(work.path / CONFIGS)
        gitutil.run(work.path, "checkout", work.base, "--", CONFIGS.as_posix())
    return work.path


def harness_trees(
    labels: list[str], out: Path, index_url: str | None = None, series_root: Path | None = None
) -> dict[str, dict]:
    """``out/<label>/`` holding each tree's fused-MoE folder and ``vllm/_version.py``, and
    ``out/trees.json`` describing them; returns that description."""
    from moe_kernels.trees import copy_harness_files, fingerprint

    root = series_root or default_series_root()
    version, commit = releases.series_version(root), releases.series_commit(root)
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    with tempfile.TemporaryDirectory(prefix="moe-trees-") as scratch:
        for label in labels:
            release, kind = split_label(label)
            target = out / label
            copy_harness_files(build_tree(label, Path(scratch) / label, index_url, root), target)
            kernel = (target / FUSED_MOE).read_bytes()
            made[label] = {
                "tree": f"vLLM {release} "
                + (f"with the series at commit {commit}" if kind else "as released")
                + (f" and {release}'s own config files" if kind == "untuned" else ""),
                **({"series_version": version, "series_commit": commit} if kind else {}),
                "fused_moe.py sha256": hashlib.sha256(kernel).hexdigest(),
                "fingerprint": fingerprint(target),
            }
    (out / "trees.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_patch.harness_trees", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("labels", nargs="+", metavar="LABEL", help=LABELS)
    parser.add_argument("--out", type=Path, required=True, help="folder for the trees")
    parser.add_argument("--index-url", default=None, help="package index (default: pip's)")
    args = parser.parse_args(argv)
    try:
        for label in args.labels:
            split_label(label)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        import moe_kernels.trees  # noqa: F401
    except ImportError:
        print(f"{parser.prog}: {KERNELS_MISSING}", file=sys.stderr)
        return 2
    try:
        made = harness_trees(args.labels, args.out, args.index_url)
    except MoePatchError as exc:
        print(f"{parser.prog}: {exc.message}", file=sys.stderr)
        return exc.exit_code
    for label, facts in made.items():
        print(f"{args.out / label}: {facts['tree']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
