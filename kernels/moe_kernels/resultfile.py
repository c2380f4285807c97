"""Result files as the harness writes and reads them: JSON, gzip-compressed where the name
ends in ``.gz``.

A run of tens of thousands of rows (issue 18's evidence run) stays in the repository between
device sessions and travels to the device with the working tree; compressed it is a sixth of
its size.  No torch here: the report and the claims' check (``tests/evidence.py``) read
result files on any machine.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def encode(path: Path, report: dict) -> str | bytes:
    """The file's content: JSON text, or its gzip (no timestamp, so a report gives the same
    bytes each time) for a name ending in ``.gz``."""
    text = json.dumps(report, indent=1)
    if path.suffix == ".gz":
        return gzip.compress(text.encode(), compresslevel=6, mtime=0)
    return text


def read_report(path: Path) -> dict:
    """A result file, compressed or not; a ValueError for one that is not whole."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as error:  # not gzip, or cut short
            raise ValueError(f"not a whole gzip file ({error})") from None
    return json.loads(data)


def markdown_path(path: Path) -> Path:
    """Where a result file's Markdown goes: beside it, ``.json`` or ``.json.gz`` replaced."""
    return path.with_name(path.name.removesuffix(".gz").removesuffix(".json") + ".md")
