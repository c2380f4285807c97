"""The patch series on disk: one directory per vLLM base release.

::

    patches/
      v0.20.0/
        series                  # quilt-style: one patch file name per line, in order
        jit-annotations.patch   # git format-patch form; the id is the file's stem

A release is served by the directory of the newest base release not newer than
it: its own when one exists, applied exactly; otherwise the nearest older base,
whose patches fall back to a 3-way merge when their context has moved.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import patchfile
from .errors import PatchFormatError, UsageError
from .patchfile import Patch

SERIES_FILE = "series"


_PROJECT_NAME = re.compile(r'^name\s*=\s*["\']moe-patch["\']', re.MULTILINE)


def default_root() -> Path:
    """``$MOE_PATCH_SERIES``; else the ``patches/`` of the moe-patch checkout the current
    directory is in; else that of the checkout moe-patch is installed from (editable);
    else the copy shipped inside the installed package (read-only, see
    :func:`require_writable`)."""
    configured = os.environ.get("MOE_PATCH_SERIES")
    if configured:
        return Path(configured)
    return project_path("patches") or packaged_root()


def project_path(*parts: str) -> Path | None:
    """``parts`` inside the moe-patch checkout around the current directory, else inside
    the checkout moe-patch is installed from (editable); None when there is neither."""
    try:
        here = _checkout_around(Path.cwd())
    except OSError:  # the current directory is gone
        here = None
    installed_from = Path(__file__).resolve().parents[2]
    if here is None and _checkout_around(installed_from) == installed_from:
        here = installed_from
    return here.joinpath(*parts) if here is not None else None


def packaged_root() -> Path:
    return Path(str(resources.files("moe_patch") / "_series"))


def _checkout_around(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that is a moe-patch checkout."""
    for folder in (start, *start.parents):
        if (folder / "patches" / "README.md").is_file():
            try:
                text = (folder / "pyproject.toml").read_text(errors="replace")
            except OSError:
                continue
            if _PROJECT_NAME.search(text):
                return folder
    return None


def require_writable(root: Path, command: str) -> None:
    """Refuse to write a series into the copy shipped inside the installed package."""
    shipped = packaged_root()
    try:
        inside = root.resolve().is_relative_to(shipped.resolve())
    except OSError:
        inside = False
    if inside and shipped.is_dir():
        raise UsageError(
            f"{command} writes a series, and {root} is the copy shipped inside the installed "
            "moe-patch: run it from a moe-patch checkout, or pass --patches DIR"
        )


@dataclass
class Series:
    base: str  # the base release, e.g. "0.20.0"
    directory: Path
    patches: list[Patch]

    def ids(self) -> list[str]:
        return [p.id for p in self.patches]

    def select(self, only: tuple[str, ...] | list[str] | None) -> list[Patch]:
        if not only:
            return list(self.patches)
        unknown = [i for i in only if i not in self.ids()]
        if unknown:
            raise UsageError(
                f"no patch {', '.join(unknown)} in the series for base {self.base}; "
                f"known: {', '.join(self.ids())}"
            )
        return [p for p in self.patches if p.id in only]


def bases(root: Path | None = None) -> list[str]:
    """The base releases that have a series directory, oldest first."""
    root = root or default_root()
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            if entry.is_dir() and entry.name.startswith("v") and (entry / SERIES_FILE).exists():
                try:
                    found.append(Version(entry.name[1:]))
                except InvalidVersion:
                    continue
    return [str(v) for v in sorted(found)]


def base_for(version: str, root: Path | None = None) -> str:
    """The base release whose series serves ``version``."""
    known = bases(root)
    eligible = [b for b in known if Version(b) <= Version(version)]
    if not eligible:
        raise UsageError(
            f"no patch series serves vLLM {version}: the oldest base is "
            f"{known[0] if known else '(none)'}; pick a release from there on"
        )
    return eligible[-1]


def load(base: str, root: Path | None = None) -> Series:
    """Read and check every patch of the series for ``base`` (nothing is written)."""
    directory = (root or default_root()) / f"v{base}"
    try:
        lines = (directory / SERIES_FILE).read_text().splitlines()
    except OSError:
        raise UsageError(
            f"there is no series for base {base} ({directory / SERIES_FILE})"
        ) from None
    names = []
    for line in lines:
        entry = line.split("#", 1)[0].strip()
        if entry:
            names.append(entry.split()[0])  # quilt allows "-p1" after the name
    seen: set[str] = set()
    patches = []
    for name in names:
        patchfile.check_path(name, SERIES_FILE)
        if "/" in name:
            raise PatchFormatError(
                f"{directory / SERIES_FILE} lists {name!r}; patches must sit beside it"
            )
        if name in seen:
            raise PatchFormatError(f"{directory / SERIES_FILE} lists {name} twice")
        seen.add(name)
        path = directory / name
        if not path.is_file():
            raise PatchFormatError(
                f"{directory / SERIES_FILE} lists {name}, which does not exist; "
                "restore the file or remove the line"
            )
        patches.append(patchfile.read(path))
    return Series(base=base, directory=directory, patches=patches)


def for_version(version: str, root: Path | None = None) -> Series:
    return load(base_for(version, root), root)
