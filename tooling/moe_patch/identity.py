"""Who a series' patches are by: the identity ``export`` writes, and placeholder addresses.

A patch committed under an address in a domain reserved for examples and tests (RFC 2606,
RFC 6761) names no one who can be reached: it is a placeholder.  ``export`` writes such
patches under the series identity instead: ``--author "Name <email>"``, else
``MOE_PATCH_AUTHOR`` (set but empty: keep every identity as committed), else the user's git
configuration as the exported tree sees it, unless that is a placeholder too.  Patches by
anyone else keep their author and sign-offs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import gitutil
from .errors import UsageError

_RESERVED_DOMAIN = re.compile(
    r"@(.+\.)?(example|invalid|test|localhost|example\.(com|net|org))>?$", re.IGNORECASE
)
_NAME_ADDR = re.compile(r"^\s*([^<>]*?)\s*<([^<>\s]+@[^<>\s]+)>\s*$")
_SIGNED_OFF = re.compile(r"^Signed-off-by:\s*(.+)$", re.IGNORECASE)


def is_placeholder(address: str) -> bool:
    """Whether ``address`` (``a@b`` or ``Name <a@b>``) is in a reserved domain."""
    return bool(_RESERVED_DOMAIN.search(address.strip()))


def parse(text: str, where: str = "--author") -> tuple[str, str]:
    found = _NAME_ADDR.match(text)
    if not found or not found.group(1):
        raise UsageError(f"{where} {text!r} is not of the form 'Name <email>'; give one like that")
    return found.group(1), found.group(2)


def series_identity(tree: Path, given: str | None = None) -> tuple[str, str] | None:
    """The identity placeholder patches are exported under, or None to keep them as they are."""
    if given:
        chosen = parse(given)
    elif "MOE_PATCH_AUTHOR" in os.environ:
        value = os.environ["MOE_PATCH_AUTHOR"]
        if not value.strip():
            return None
        chosen = parse(value, "MOE_PATCH_AUTHOR")
    else:
        name = gitutil.user_setting(tree, "user.name")
        email = gitutil.user_setting(tree, "user.email")
        if not name or not email:  # not configured
            return None
        chosen = (name, email)
    if is_placeholder(chosen[1]):
        if given:
            raise UsageError(f"--author {given!r} is a placeholder address; give a real one")
        return None
    return chosen


def restamp(message: str, identity: tuple[str, str]) -> str:
    """``message`` with each placeholder sign-off replaced by ``identity``'s (once)."""
    stamp = f"Signed-off-by: {identity[0]} <{identity[1]}>"
    lines, seen = [], False
    for line in message.split("\n"):
        signed = _SIGNED_OFF.match(line)
        if signed and (is_placeholder(signed.group(1)) or line.strip() == stamp):
            if seen:
                continue
            line, seen = stamp, True
        lines.append(line)
    return "\n".join(lines)
