"""Turning a user's version spec (``0.21``, ``0.21.0``, ``v0.21.0``) into a release."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from .errors import UsageError

_LONGEST = 64  # characters: longer is no version (and would make a huge integer)


def parse_spec(spec: str) -> Version:
    text = spec.strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    try:
        if len(text) > _LONGEST:
            raise InvalidVersion(text)
        version = Version(text)
    except ValueError:  # InvalidVersion, or a number Python will not convert
        shown = spec if len(spec) <= _LONGEST else f"{spec[:20]}… ({len(spec)} characters)"
        raise UsageError(
            f"{shown!r} is not a vLLM version; give one like 0.21 (newest 0.21.x) or 0.21.0"
        ) from None
    if version.local or version.epoch:
        raise UsageError(f"{spec!r} is not a vLLM release version; give one like 0.21.0")
    return version


def is_exact(spec: str) -> bool:
    """``0.21`` names a series of releases; ``0.21.0`` (or longer) names one."""
    return len(parse_spec(spec).release) >= 3


def resolve(spec: str, releases: Iterable[str], where: str = "the package index") -> str:
    """The release ``spec`` names among ``releases``; a one-line error if none."""
    wanted = parse_spec(spec)
    known = sorted({Version(r) for r in releases})
    if len(wanted.release) <= 2:
        matches = [v for v in known if v.release[: len(wanted.release)] == wanted.release]
        if matches:
            return str(matches[-1])
    elif wanted in known:
        return str(known[known.index(wanted)])
    raise UsageError(
        f"unknown vLLM version {spec}: not among the releases on {where}; "
        f"nearest releases: {', '.join(nearest(wanted, known)) or 'none'}"
    )


def nearest(wanted: Version, known: list[Version], count: int = 2) -> list[str]:
    """Up to ``count`` releases either side of ``wanted``."""
    at = bisect.bisect_left(known, wanted)
    return [str(v) for v in known[max(0, at - count) : at + count]]
