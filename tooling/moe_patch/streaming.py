"""An HTTP body read within limits that hold while it streams, not after it has arrived.

A request has a deadline for the whole of it, however slowly the server trickles its bytes
(each read waits at most the time left), and a size it may not pass (reading stops as soon as
it does, and holds no more than one piece in memory).  ``requests``' ``iter_content`` cannot
give either: urllib3 fills each piece before returning it, so a piece of any size waits for
the server, and ``iter_content(None)`` reads the whole body first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import requests
import urllib3

from . import cache

DEFAULT_DEADLINE = 1800.0  # seconds for one request; MOE_PATCH_DOWNLOAD_DEADLINE overrides it
PIECE = 64 << 10  # bytes read at most per call
READ_TIMEOUT = 60.0  # seconds one wait for the server may last, whatever the deadline


class TooSlow(Exception):
    """The deadline passed before the body ended."""


class TooLarge(Exception):
    """The body passed its limit."""


def deadline() -> float:
    """Seconds one request to the package index may take, its body included:
    ``MOE_PATCH_DOWNLOAD_DEADLINE``, else :data:`DEFAULT_DEADLINE`."""
    return cache.seconds_from_env("MOE_PATCH_DOWNLOAD_DEADLINE", DEFAULT_DEADLINE)


def get(
    url: str, seconds: float, wait: float = READ_TIMEOUT, **kwargs
) -> tuple[requests.Response, float]:
    """``GET url`` (streamed) and the monotonic time its deadline, ``seconds`` from now,
    ends at: connecting and the headers are bounded by it too (:class:`TooSlow`), and each
    wait for the server by ``wait``."""
    ends = time.monotonic() + seconds
    wait = min(wait, seconds)
    if wait <= 0:
        raise TooSlow
    try:
        return requests.get(url, stream=True, timeout=(wait, wait), **kwargs), ends
    except requests.Timeout:
        if time.monotonic() >= ends:
            raise TooSlow from None
        raise


def pieces(
    response: requests.Response, ends: float, limit: int | None = None, wait: float = READ_TIMEOUT
) -> Iterator[bytes]:
    """The (decoded) body of ``response`` as it arrives; :class:`TooSlow` once ``ends``
    (monotonic) has passed, :class:`TooLarge` as soon as more than ``limit`` bytes came.
    A broken connection raises :class:`requests.ConnectionError`."""
    raw = response.raw
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    total = 0
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            raise TooSlow
        if sock is not None:
            sock.settimeout(min(wait, left))
        amount = PIECE if limit is None else min(PIECE, limit - total + 1)
        try:
            piece = raw.read1(amount, decode_content=True)  # what has arrived, no waiting
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if time.monotonic() >= ends:
                raise TooSlow from None
            raise requests.ConnectionError(str(exc)) from None
        if not piece:
            return
        total += len(piece)
        if limit is not None and total > limit:
            raise TooLarge
        yield piece
