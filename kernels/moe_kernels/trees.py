"""The vLLM trees a GPU run of the harness needs, made on any machine with the package index.

A label names a release as released (``0.21.0``) or with the series that serves it applied
(``0.21.0+moe``); moe-patch's own download path and cache bring the release, and its applier
the series of this checkout.  The harness reads only a tree's fused-MoE folder and
``vllm/_version.py``, so what a device call has to carry is those (about 3 MB a tree):

    python -m moe_kernels.trees 0.21.0 0.21.0+moe 0.33.0 0.33.0+moe --out .gpu/trees

writes ``.gpu/trees/<label>/`` for each label and ``.gpu/trees/trees.json``: per label what
it is, the series commit it was made from, and the sha256 of its ``fused_moe.py``, the file
a result's ``--tree LABEL=.gpu/trees/LABEL`` then names.  Needs moe-patch installed
(``pip install -e .``); the GPU machine needs only the folders (``.gpu/`` is ignored by git,
so a device call carries it by name).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from .loader import FUSED_MOE_REL

VERSION_REL = Path("vllm", "_version.py")


def split_label(label: str) -> tuple[str, bool]:
    """``X.Y.Z`` or ``X.Y.Z+moe`` -> (version, with the series)."""
    version, plus, suffix = label.partition("+")
    if plus and suffix != "moe":
        raise ValueError(f"{label!r}: a tree label is X.Y.Z or X.Y.Z+moe")
    return version, bool(plus)


def build_tree(label: str, into: Path) -> Path:
    """The whole vLLM tree ``label`` names, at ``into`` (a git work tree on the release)."""
    from moe_patch import series, sources
    from moe_patch.applier import apply_series

    version, patched = split_label(label)
    work = sources.from_cache(version, into, None)
    if patched:
        report = apply_series(work.path, work.base, version, series.for_version(version))
        if not report.ok:
            raise RuntimeError(f"the series did not apply to {version}: {report.to_json()}")
    return work.path


def _series_commit() -> str:
    """The commit of the checkout whose series moe-patch applies (``+`` if its patches have
    uncommitted changes); "unknown" outside a git checkout."""
    import git
    from moe_patch import gitutil
    from moe_patch.settings import default_series_root

    root = default_series_root()
    if not root.is_dir():
        return "unknown"
    try:
        head = gitutil.run(root, "rev-parse", "--short", "HEAD")
        dirty = gitutil.run(root, "status", "--porcelain", "--", ".")
    except (OSError, git.GitCommandError):
        return "unknown"
    return head + ("+" if dirty else "")


def harness_trees(labels: list[str], out: Path) -> dict[str, dict]:
    """``out/<label>/`` holding each tree's fused-MoE folder and ``vllm/_version.py``, and
    ``out/trees.json`` describing them; returns that description."""
    out.mkdir(parents=True, exist_ok=True)
    commit = _series_commit()
    described = {}
    with tempfile.TemporaryDirectory(prefix="moe-trees-") as scratch:
        for label in labels:
            version, patched = split_label(label)
            whole = build_tree(label, Path(scratch) / label)
            target = out / label
            if target.exists():
                shutil.rmtree(target)
            for rel in (FUSED_MOE_REL.parent, VERSION_REL):
                source = whole / rel
                if source.is_dir():
                    shutil.copytree(
                        source, target / rel, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    (target / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target / rel)
            kernel = (target / FUSED_MOE_REL).read_bytes()
            described[label] = {
                "tree": f"vLLM {version} with the series at commit {commit}"
                if patched
                else f"vLLM {version} as released",
                "fused_moe.py sha256": hashlib.sha256(kernel).hexdigest(),
            }
    (out / "trees.json").write_text(json.dumps(described, indent=1) + "\n")
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labels", nargs="+", metavar="LABEL", help="X.Y.Z or X.Y.Z+moe")
    parser.add_argument("--out", type=Path, required=True, help="folder for the trees")
    args = parser.parse_args(argv)
    try:
        for label in args.labels:
            split_label(label)
    except ValueError as exc:
        parser.error(str(exc))
    for label, facts in harness_trees(args.labels, args.out).items():
        print(f"{args.out / label}: {facts['tree']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
