"""Writing commits back out as patch files, deterministically.

The form is fixed so that a re-export of unchanged commits reproduces the
files byte for byte: a zero ``From`` hash, full blob ids (so ``git am -3`` can
merge), no diffstat, no version signature, no ``[PATCH n/m]`` numbering, and none
of the headers a git configuration can add (``format.headers``, ``format.to``,
``format.cc`` are lists and ``format.attach`` has no "off" value: only these options
clear them; :mod:`moe_patch.gitutil` pins the rest).
"""

from __future__ import annotations

from pathlib import Path

from . import gitutil

FORMAT_PATCH_ARGS = (
    "format-patch",
    "--stdout",
    "--zero-commit",
    "--full-index",
    "--no-signature",
    "--no-stat",
    "--no-numbered",
    "--no-add-header",
    "--no-to",
    "--no-cc",
    "--no-attach",
    "--keep-subject",
    "--encoding=UTF-8",
)


def format_commit(tree: Path, commit: str) -> bytes:
    """One commit in the series' patch form."""
    text = gitutil.run(tree, *FORMAT_PATCH_ARGS, "-1", commit, strip_newline_in_stdout=False)
    return text.encode("utf-8")
