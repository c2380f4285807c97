"""The vLLM trees a GPU run of the harness needs, made on any machine with the package index.

A label names a release as released (``0.21.0``), with the series that serves it applied
(``0.21.0+moe``), or with the series and the release's own config files in place of the
series' tables (``0.21.0+untuned``: the tree a search for those tables runs on); moe-patch's
own download path and cache bring the release, and its applier the series of this checkout.
The harness reads only a tree's fused-MoE folder and ``vllm/_version.py``, so what a device
call has to carry is those (about 3 MB a tree):

    python -m moe_kernels.trees 0.21.0 0.21.0+moe 0.33.0 0.33.0+moe --out .gpu/trees

writes ``.gpu/trees/<label>/`` for each label and ``.gpu/trees/trees.json``: per label what
it is, the series commit it was made from, the sha256 of its ``fused_moe.py`` and the tree's
:func:`fingerprint`, the file a result's ``--tree LABEL=.gpu/trees/LABEL`` then names.  Result
files record each tree's fingerprint too, and ``--resume`` refuses a tree whose fingerprint
changed: a run spread over several device sessions measures one series, not whichever was
checked out when each session began.  Needs moe-patch installed
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


def harness_files(tree: Path) -> list[Path]:
    """What the harness reads of a vLLM tree, relative to it, in a stable order: every file
    of the fused-MoE folder (the kernel, the launcher rules and dispatch lifted from it, the
    config tables) and ``vllm/_version.py`` where the tree has one."""
    folder = tree / FUSED_MOE_REL.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{tree} is not a vLLM tree: it has no {FUSED_MOE_REL.parent}")
    files = [
        path.relative_to(tree)
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]
    if (tree / VERSION_REL).is_file():
        files.append(VERSION_REL)
    return sorted(files, key=lambda rel: rel.as_posix())


def fingerprint(tree: Path) -> str:
    """sha256 over :func:`harness_files` (each one's path and bytes): two trees with one
    fingerprint launch the same kernel with the same configs, wherever they lie."""
    digest = hashlib.sha256()
    for rel in harness_files(Path(tree)):
        data = (Path(tree) / rel).read_bytes()
        digest.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


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


def build_tree(label: str, into: Path, index_url: str | None = None) -> Path:
    """The whole vLLM tree ``label`` names, at ``into`` (a git work tree on the release;
    ``index_url``: the package index a release not in moe-patch's cache comes from, None
    for pip's)."""
    from moe_patch import gitutil, series, sources
    from moe_patch.applier import apply_series

    version, kind = split_label(label)
    work = sources.from_cache(version, into, index_url)
    if kind:
        report = apply_series(work.path, work.base, version, series.for_version(version))
        if not report.ok:
            raise RuntimeError(f"the series did not apply to {version}: {report.to_json()}")
    if kind == "untuned":  # the release's config files in place of the series' tables
        configs = FUSED_MOE_REL.parent / "configs"
        shutil.rmtree(work.path / configs)
        gitutil.run(work.path, "checkout", work.base, "--", configs.as_posix())
    return work.path


def _series() -> tuple[str, str]:
    """The version and commit of the series moe-patch applies (its checkout's; the commit
    ends in ``+`` if its patches have uncommitted changes, "unknown" outside git)."""
    from moe_patch import releases
    from moe_patch.settings import default_series_root

    root = default_series_root()
    return releases.series_version(root), releases.series_commit(root)


def copy_harness_files(tree: Path, target: Path) -> None:
    """``target`` made anew holding :func:`harness_files` of ``tree``: a tree the harness
    reads as it reads ``tree``, with the same fingerprint."""
    files = harness_files(Path(tree))
    if target.exists():
        shutil.rmtree(target)
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(tree) / rel, target / rel)


def fingerprints_of(specs: list[str]) -> dict[str, str]:
    """Label -> :func:`fingerprint` for ``LABEL=PATH`` specs, as bench and tune take trees
    (FileNotFoundError naming a path that is not a vLLM tree)."""
    return {
        label: fingerprint(Path(path)) for label, _, path in (spec.partition("=") for spec in specs)
    }


def described(specs: list[str]) -> dict[str, dict | None]:
    """Label -> what ``trees.json`` beside the tree's folder says of it (the release, the
    series version and commit it was made from, its fingerprint), for ``LABEL=PATH`` specs;
    None for a tree that was not made by :func:`harness_trees`."""
    found: dict[str, dict | None] = {}
    for label, _, path in (spec.partition("=") for spec in specs):
        folder = Path(path)
        try:
            listing = json.loads((folder.parent / "trees.json").read_text())
        except (OSError, ValueError):
            listing = {}
        entry = listing.get(folder.name) if isinstance(listing, dict) else None
        found[label] = entry if isinstance(entry, dict) else None
    return found


def fingerprint_changes(recorded: dict[str, str] | None, current: dict[str, str]) -> str | None:
    """Why a result file's trees (``recorded``: label -> fingerprint) are not ``current``,
    in words; None when they are the same trees."""
    if recorded is None:
        return "it records no tree fingerprints (written before the harness kept them)"
    changed = [label for label in current if recorded.get(label) != current[label]]
    if not changed:
        return None
    return (
        f"{', '.join(changed)} changed since it was written (the fused-MoE folder's "
        "fingerprint differs: another series or release)"
    )


def harness_trees(labels: list[str], out: Path) -> dict[str, dict]:
    """``out/<label>/`` holding each tree's fused-MoE folder and ``vllm/_version.py``, and
    ``out/trees.json`` describing them; returns that description."""
    out.mkdir(parents=True, exist_ok=True)
    version, commit = _series()
    made = {}
    with tempfile.TemporaryDirectory(prefix="moe-trees-") as scratch:
        for label in labels:
            release, kind = split_label(label)
            target = out / label
            copy_harness_files(build_tree(label, Path(scratch) / label), target)
            kernel = (target / FUSED_MOE_REL).read_bytes()
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labels", nargs="+", metavar="LABEL", help=LABELS)
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
