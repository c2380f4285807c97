"""Downloading a release's source distribution into the cache, hash-checked."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from pathlib import Path

import requests

from . import cache, ui
from .errors import IntegrityError, NetworkError
from .index import Distribution
from .pipconfig import IndexSettings

DEFAULT_DEADLINE = 1800.0  # seconds for one download; MOE_PATCH_DOWNLOAD_DEADLINE overrides it


def _check_size(dist: Distribution, size: int) -> None:
    """The index lists the file's size: a server that sends more is not sending that file."""
    if dist.size and size > dist.size:
        raise IntegrityError(
            f"the server sends more than the {dist.size} bytes the index lists for "
            f"{dist.filename}; the download was stopped and discarded: report it if it persists"
        )


def fetch_sdist(dist: Distribution, settings: IndexSettings) -> Path:
    """The verified sdist of ``dist`` in the cache, downloading it if needed.

    The file is streamed to a ``.part-`` name and renamed only once its sha256
    matches the index's, so an interrupted or corrupt download is never trusted.
    Call with the release's cache lock held.
    """
    if not dist.sha256:
        raise IntegrityError(
            f"the package index lists {dist.filename} without a sha256 hash; "
            "moe-patch only installs verified archives: use an index that publishes hashes"
        )
    deadline = cache.seconds_from_env("MOE_PATCH_DOWNLOAD_DEADLINE", DEFAULT_DEADLINE)
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
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            try:
                response = requests.get(
                    dist.url, stream=True, timeout=60, verify=settings.cert or True
                )
                if response.status_code != 200:
                    raise NetworkError(
                        f"download of {dist.filename} failed with HTTP "
                        f"{response.status_code}; retry, or check --index-url"
                    )
                total = int(response.headers.get("Content-Length") or dist.size or 0)
                _check_size(dist, total)
                written, started = 0, time.monotonic()
                with ui.progress(total or None, f"downloading {dist.filename}") as advance:
                    for chunk in response.iter_content(None):  # as it arrives
                        written += len(chunk)
                        _check_size(dist, written)
                        if time.monotonic() - started > deadline:
                            raise NetworkError(
                                f"download of {dist.filename} took longer than {deadline:g} s "
                                "(MOE_PATCH_DOWNLOAD_DEADLINE); nothing partial was kept: run "
                                "the command again, or allow more time"
                            )
                        out.write(chunk)
                        digest.update(chunk)
                        advance(len(chunk))
            except requests.RequestException as exc:
                raise NetworkError(
                    f"download of {dist.filename} was interrupted ({type(exc).__name__}); "
                    "run the command again to retry"
                ) from None
        if digest.hexdigest() != dist.sha256:
            raise IntegrityError(
                f"{dist.filename} does not match the index's sha256 "
                f"(expected {dist.sha256[:12]}…, got {digest.hexdigest()[:12]}…); "
                "the download was discarded: retry, and report it if it persists"
            )
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return final
