"""What the harness reads of a vLLM tree, and how a result file names the trees it measured.

The harness reads only a tree's fused-MoE folder and ``vllm/_version.py``
(:func:`harness_files`), so a copy of those (:func:`copy_harness_files`, about 3 MB) is the
tree to it.  Result files record each tree's :func:`fingerprint`, and ``--resume`` refuses a
tree whose fingerprint changed: a run spread over several device sessions measures one
series, not whichever was checked out when each session began.  What a tree was made from
(the release, the series version and commit) is what ``trees.json`` beside its folder says
(:func:`described`); moe-patch writes it with the trees it makes for a GPU run
(``python -m moe_patch.harness_trees``).  Nothing here imports moe-patch: the harness takes
trees as paths.
"""

from __future__ import annotations

import hashlib
import json
import shutil
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
    None for a tree without such an entry (not made by ``moe_patch.harness_trees``)."""
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
