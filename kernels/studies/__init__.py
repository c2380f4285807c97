"""One-off GPU studies behind some of the committed results; not part of the installed package.

Each is a module run from the repository root with the harness importable, e.g.
``PYTHONPATH=kernels python -m studies.read_ceiling ...`` (see kernels/README.md); they use
only the public names of :mod:`moe_kernels` (timing and shapes from ``moe_kernels.measure``).
"""

import sys
from pathlib import Path


def emit(text: str, out: Path | None) -> None:
    """A study's report: written to ``--out`` where given, else to standard output."""
    if out:
        out.write_text(text)
    else:
        sys.stdout.write(text)
