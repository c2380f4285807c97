"""Where the package index is: read from pip's own configuration, never hard-coded.

Precedence: an explicit ``--index-url``, then ``PIP_INDEX_URL``, then pip's
configuration files (``pip config``: ``install.index-url`` before
``global.index-url``), then pip's own built-in default.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit


def _userinfo_replaced(url: str, userinfo) -> str:
    """``url`` with its ``user:password@`` part replaced by ``userinfo(user, password)``
    (nothing when that is empty); an unparsable URL loses everything up to its ``@``."""
    try:
        parts = urlsplit(url)
        user, password, host, port = parts.username, parts.password, parts.hostname, parts.port
    except ValueError:  # an unparsable port: show nothing of the credentials part
        return url.split("@", 1)[-1] if "@" in url else url
    if user is None and password is None:
        return url
    shown = userinfo(user, password)
    netloc = (f"{shown}@" if shown else "") + (f"[{host}]" if host and ":" in host else host or "")
    return urlunsplit(parts._replace(netloc=netloc + (f":{port}" if port else "")))


def redact(url: str) -> str:
    """``url`` as pip shows it: a password, or a user name alone (a token), becomes ``****``."""
    return _userinfo_replaced(
        url, lambda user, password: "****" if password is None else f"{user}:****"
    )


def without_credentials(url: str) -> str:
    """``url`` with no user name or password: what may be written to disk."""
    return _userinfo_replaced(url, lambda user, password: "")


def _origin(url: str) -> tuple[str, str | None, int | None] | None:
    try:
        parts = urlsplit(url)
        return parts.scheme, parts.hostname, parts.port
    except ValueError:
        return None


@dataclass(frozen=True)
class IndexSettings:
    url: str
    cert: str | None = None  # CA bundle pip is configured with, if any

    @property
    def shown(self) -> str:
        """The URL for messages, credentials masked."""
        return redact(self.url)

    def auth_for(self, url: str) -> tuple[str, str] | None:
        """The index URL's user name and password, for ``url`` on the same host (as pip gives
        them): file URLs are kept without credentials, on disk and in the cache."""
        try:
            parts = urlsplit(self.url)
        except ValueError:
            return None
        if parts.username is None or _origin(url) != _origin(self.url):
            return None
        return unquote(parts.username), unquote(parts.password or "")


def _pip_config() -> dict[str, str]:
    """``pip config list`` as a dict (keys like ``global.index-url``); {} if pip is absent."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("'\"")
    return values


def _pip_default_index() -> str:
    try:
        from pip._internal.models.index import PyPI  # pip's built-in default index

        return PyPI.simple_url
    except ImportError:  # pragma: no cover - pip always ships with CPython's venv
        from .errors import UsageError

        raise UsageError(
            "cannot tell which package index to use: pip is not installed; "
            "pass --index-url or set PIP_INDEX_URL"
        ) from None


@functools.cache
def _configured() -> tuple[str | None, str | None]:
    config = _pip_config()
    url = None
    for key in (":env:.index-url", "install.index-url", "global.index-url"):
        if config.get(key):
            url = config[key]
            break
    cert = config.get(":env:.cert") or config.get("global.cert")
    return url, cert


def index_settings(index_url: str | None = None) -> IndexSettings:
    """The index to read releases from, honouring the precedence above."""
    env_url = os.environ.get("PIP_INDEX_URL")
    if index_url:
        url = index_url
        cert = os.environ.get("PIP_CERT")
    elif env_url:
        url = env_url
        cert = os.environ.get("PIP_CERT")
    else:
        url, cert = _configured()
        url = url or _pip_default_index()
    return IndexSettings(url=url.rstrip("/"), cert=cert or None)
