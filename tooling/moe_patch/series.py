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

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import patchfile
from .errors import PatchFormatError, UsageError
from .patchfile import Patch
from .settings import default_series_root

SERIES_FILE = "series"


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
    root = root or default_series_root()
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            if entry.is_dir() and entry.name.startswith("v") and (entry / SERIES_FILE).exists():
                try:
                    found.append(Version(entry.name[1:]))
                except InvalidVersion:
                    continue
    return [str(v) for v in sorted(found)]


def required_bases(root: Path) -> list[str]:
    """:func:`bases`, refusing a folder that holds no series (a mistyped --patches)."""
    known = bases(root)
    if not known:
        raise UsageError(
            f"there is no series under {root}; give --patches the folder that holds v<base>/series"
        )
    return known


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
    directory = (root or default_series_root()) / f"v{base}"
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
