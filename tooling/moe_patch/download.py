"""Downloading a release's source distribution into the cache, hash-checked."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

import requests

from . import cache, streaming, ui
from .errors import IntegrityError, NetworkError
from .index import Distribution
from .pipconfig import IndexSettings


def fetch_sdist(dist: Distribution, settings: IndexSettings) -> Path:
    """The verified sdist of ``dist`` in the cache, downloading it if needed.

    The file is streamed to a ``.part-`` name and renamed only once its sha256
    matches the index's, so an interrupted or corrupt download is never trusted.
    The deadline and the size the index lists hold while it streams.
    Call with the release's cache lock held.
    """
    if not dist.sha256:
        raise IntegrityError(
            f"the package index lists {dist.filename} without a sha256 hash; "
            "moe-patch only installs verified archives: use an index that publishes hashes"
        )
    allowed = streaming.deadline()
    directory = cache.subdir("sdist")
    final = directory / dist.filename
    if final.exists():
        if cache.sha256_file(final) == dist.sha256:
            return final
        final.unlink()  # corrupted on disk since it was verified: fetch again
    cache.remove_leftovers(directory, dist.filename)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{dist.filename}.part-")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _stream(dist, settings, allowed, out)
        if digest != dist.sha256:
            raise IntegrityError(
                f"{dist.filename} does not match the index's sha256 "
                f"(expected {dist.sha256[:12]}…, got {digest[:12]}…); "
                "the download was discarded: retry, and report it if it persists"
            )
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final


def _stream(dist: Distribution, settings: IndexSettings, allowed: float, out) -> str:
    """Write ``dist``'s body to ``out``; its sha256."""
    digest = hashlib.sha256()
    try:
        response, ends = streaming.get(
            dist.url, allowed, verify=settings.cert or True, auth=settings.auth_for(dist.url)
        )
        with response:
            if response.status_code != 200:
                raise NetworkError(
                    f"download of {dist.filename} failed with HTTP "
                    f"{response.status_code}; retry, or check --index-url"
                )
            total = int(response.headers.get("Content-Length") or dist.size or 0)
            if dist.size and total > dist.size:
                raise streaming.TooLarge
            with ui.progress(total or None, f"downloading {dist.filename}") as advance:
                for piece in streaming.pieces(response, ends, dist.size):
                    out.write(piece)
                    digest.update(piece)
                    advance(len(piece))
    except streaming.TooLarge:
        raise IntegrityError(
            f"the server sends more than the {dist.size} bytes the index lists for "
            f"{dist.filename}; the download was stopped and discarded: report it if it persists"
        ) from None
    except streaming.TooSlow:
        raise NetworkError(
            f"download of {dist.filename} took longer than {allowed:g} s "
            "(MOE_PATCH_DOWNLOAD_DEADLINE); nothing partial was kept: run the command again, "
            "or allow more time"
        ) from None
    except requests.RequestException as exc:
        raise NetworkError(
            f"download of {dist.filename} was interrupted ({type(exc).__name__}); "
            "run the command again to retry"
        ) from None
    return digest.hexdigest()
