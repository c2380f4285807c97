"""Output folders a run makes: created with their parents, removed again if the run fails."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def made(path: Path) -> Iterator[Path]:
    """Make ``path`` and its missing parents; if the block raises, remove the ones this call
    made, deepest first, where they are empty again (what the block wrote inside them is its
    own to roll back), so a failed run leaves no new folders behind."""
    missing = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
