"""Reading vLLM's releases from a PEP 503 / PEP 691 simple package index.

The listing is cached (see :mod:`moe_patch.cache`) so that a run with a warm
cache needs no network: a fresh listing is used for ``LISTING_TTL`` seconds,
and a stale one is used, with a warning, when the index cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import requests
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from . import cache, streaming, ui
from .errors import NetworkError
from .pipconfig import IndexSettings, redact, without_credentials

PROJECT = "vllm"
LISTING_TTL = 600  # seconds a cached listing counts as fresh
TIMEOUT = 30  # seconds one wait for the index to answer may last
LISTING_LIMIT = 64 << 20  # bytes: PyPI's vllm listing is a few MB; reading stops past it
# seconds for the whole listing, however slowly it trickles in (MOE_PATCH_DOWNLOAD_DEADLINE,
# the limit of every request, when that is shorter)
LISTING_DEADLINE = 120.0
_JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class Distribution:
    """One source distribution of a release, as the index lists it."""

    version: str
    filename: str
    url: str
    sha256: str | None
    size: int | None = None


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, bool]] = []  # (href, text, yanked)
        self._href: str | None = None
        self._yanked = False

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            attributes = dict(attrs)
            self._href = attributes.get("href")
            self._yanked = "data-yanked" in attributes

    def handle_data(self, data):
        if self._href is not None:
            self.links.append((self._href, data.strip(), self._yanked))
            self._href = None


def _sdist(filename: str, url: str, sha256: str | None, size=None) -> Distribution | None:
    try:
        name, version = parse_sdist_filename(filename)
    except InvalidSdistFilename:
        return None
    if name != PROJECT or version.is_prerelease or version.is_devrelease:
        return None
    return Distribution(str(version), filename, url, sha256, size)


def _wheel(filename: str, url: str, sha256: str | None, size=None) -> Distribution | None:
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    if name != PROJECT or version.is_prerelease or version.is_devrelease or version.local:
        return None
    return Distribution(str(version), filename, url, sha256, size)


def parse_listing(body: bytes, content_type: str, base_url: str) -> list[Distribution]:
    """The non-yanked, final-release sdists in an index page (JSON or HTML)."""
    return _parse(body, content_type, base_url, _sdist)


def parse_wheel_listing(body: bytes, content_type: str, base_url: str) -> list[Distribution]:
    """The non-yanked, final-release wheels in an index page (JSON or HTML)."""
    return _parse(body, content_type, base_url, _wheel)


def _parse(body: bytes, content_type: str, base_url: str, keep) -> list[Distribution]:
    dists: list[Distribution] = []
    if "json" in content_type:
        try:
            data = json.loads(body)
            files = data["files"]
            if not isinstance(files, list):
                raise TypeError("files is not a list")
        except (ValueError, KeyError, TypeError):
            raise NetworkError(
                f"the package index at {redact(base_url)} answered with a page that is not a "
                "valid PEP 691 listing; check --index-url / PIP_INDEX_URL"
            ) from None
        for entry in files:
            if not isinstance(entry, dict) or entry.get("yanked"):
                continue
            hashes = entry.get("hashes")
            sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
            size = entry.get("size")
            dist = keep(
                str(entry.get("filename", "")),
                without_credentials(urljoin(base_url, str(entry.get("url", "")))),
                sha256 if isinstance(sha256, str) else None,
                size if isinstance(size, int) and not isinstance(size, bool) else None,
            )
            if dist:
                dists.append(dist)
    else:
        parser = _AnchorParser()
        page = body.decode("utf-8", errors="replace")
        parser.feed(page)
        if not parser.links:
            raise NetworkError(
                f"the package index at {redact(base_url)} answered with a page that lists no "
                "files; check --index-url / PIP_INDEX_URL"
            )
        for href, text, yanked in parser.links:
            if yanked:
                continue
            url, fragment = urldefrag(without_credentials(urljoin(base_url, href)))
            sha256 = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
            dist = keep(text or url.rsplit("/", 1)[-1], url, sha256)
            if dist:
                dists.append(dist)
    return dists


def _listing_path(settings: IndexSettings) -> Path:
    key = hashlib.sha256(settings.url.encode()).hexdigest()[:16]
    return cache.root() / "index" / f"{PROJECT}-{key}.json"


def _fetch(settings: IndexSettings) -> tuple[list[Distribution], list[Distribution]]:
    """The sdists and the wheels the index lists for the project."""
    page = f"{settings.url}/{PROJECT}/"
    allowed = min(LISTING_DEADLINE, streaming.deadline())
    try:
        response, ends = streaming.get(
            page, allowed, TIMEOUT, headers={"Accept": _JSON_ACCEPT}, verify=settings.cert or True
        )
        with response:
            if response.status_code != 200:
                raise NetworkError(
                    f"the package index {settings.shown} answered HTTP {response.status_code} "
                    f"for {PROJECT}; check --index-url / PIP_INDEX_URL"
                )
            declared = int(response.headers.get("Content-Length") or 0)
            if declared > LISTING_LIMIT:
                raise streaming.TooLarge
            body = bytearray()
            for piece in streaming.pieces(response, ends, LISTING_LIMIT, TIMEOUT):
                body += piece
    except streaming.TooLarge:
        raise NetworkError(
            f"the package index {settings.shown} sends a {PROJECT} listing larger than "
            f"{LISTING_LIMIT >> 20} MiB; check --index-url / PIP_INDEX_URL"
        ) from None
    except streaming.TooSlow:
        raise NetworkError(
            f"the package index {settings.shown} took longer than {allowed:g} s to send the "
            f"{PROJECT} listing; try again, or check --index-url"
        ) from None
    except requests.RequestException as exc:
        raise NetworkError(
            f"cannot reach the package index {settings.shown} ({type(exc).__name__}); "
            "check the network or --index-url / PIP_INDEX_URL"
        ) from None
    args = (body, response.headers.get("Content-Type", ""), response.url or page)
    return parse_listing(*args), parse_wheel_listing(*args)


def distributions(settings: IndexSettings, refresh: bool = False) -> list[Distribution]:
    """Every final vLLM release with an sdist on the index, oldest first."""
    path = _listing_path(settings)
    cached = _read_listing(path)
    if cached is not None and not refresh and time.time() - cached[0] < LISTING_TTL:
        return cached[1]
    try:
        dists, wheel_dists = _fetch(settings)
    except NetworkError as exc:
        if cached is None:
            raise
        ui.warn(f"{exc.message}; using the release list cached {_age(cached[0])} ago")
        return cached[1]
    dists.sort(key=lambda d: Version(d.version))
    wheel_dists.sort(key=lambda d: (Version(d.version), d.filename))
    cache.write_atomic(
        path,
        json.dumps(
            {
                "fetched": time.time(),
                "index": settings.shown,
                "files": [asdict(d) for d in dists],
                "wheels": [asdict(d) for d in wheel_dists],
            },
            indent=1,
        ).encode(),
    )
    return dists


def wheels(settings: IndexSettings, version: str, refresh: bool = False) -> list[Distribution]:
    """The wheels the index lists for release ``version`` (any platform)."""
    cached = _read_wheels(_listing_path(settings))
    if refresh or cached is None or not any(w.version == version for w in cached):
        distributions(settings, refresh=True)
        cached = _read_wheels(_listing_path(settings)) or []
    return [w for w in cached if w.version == version]


def _read_wheels(path: Path) -> list[Distribution] | None:
    """The wheels of a cached listing; None if there is none, or it predates wheel lists."""
    try:
        data = json.loads(path.read_text())
        return [Distribution(**f) for f in data["wheels"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_listing(path: Path) -> tuple[float, list[Distribution]] | None:
    try:
        data = json.loads(path.read_text())
        return float(data["fetched"]), [Distribution(**f) for f in data["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _age(fetched: float) -> str:
    minutes = max(0, int(time.time() - fetched) // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def cached_distribution(settings: IndexSettings, version: str) -> Distribution | None:
    """The sdist entry for ``version`` from the cached listing, without any network."""
    cached = _read_listing(_listing_path(settings))
    if cached:
        for dist in cached[1]:
            if dist.version == version:
                return dist
    return None
