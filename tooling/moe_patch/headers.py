"""What every patch of the series must say in its message, whatever it changes.

``verify`` fails a series whose patches lack any of it; ``export`` warns as it writes one.
"""

from __future__ import annotations

from . import probes
from .errors import MoePatchError
from .patchfile import Patch
from .upstreaming import upstreaming

UPSTREAM_STATUSES = ("Pending", "Submitted", "Backport", "Accepted", "Denied", "Inappropriate")


def header_problems(patch: Patch) -> list[str]:
    """What a patch's headers lack (Subject is checked by the parser itself)."""
    problems = []
    paragraphs = [p for p in patch.message.strip().split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        problems.append("no reason: the message needs a paragraph saying why, before the trailers")
    status = patch.trailer("Upstream-Status")
    if not status:
        problems.append("no Upstream-Status trailer")
    elif status.split()[0].rstrip(":") not in UPSTREAM_STATUSES:
        problems.append(
            f"Upstream-Status {status.split()[0]!r} is not one of {', '.join(UPSTREAM_STATUSES)}"
        )
    if not patch.trailer("Signed-off-by"):
        problems.append("no Signed-off-by trailer")
    for declaration in patch.trailer_values("Upstream-Probe"):
        try:
            probes.parse(declaration, patch.path.name)
        except MoePatchError as exc:
            problems.append(exc.message)
    try:
        upstreaming(patch)  # the test files it names exist beside the series
    except MoePatchError as exc:
        problems.append(exc.message)
    return problems
