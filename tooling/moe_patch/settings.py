"""Where a command reads its series, measurements and kernel tests, and which package index
it asks: resolved once from the command's options and the environment, then passed down.

The places default to the moe-patch checkout you stand in (so a second clone of the
project uses its own series), else the checkout moe-patch is installed from (editable),
else, for the series only, the copy shipped inside the installed package, which is
read-only (:func:`require_writable`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import UsageError

_PROJECT_NAME = re.compile(r'^name\s*=\s*["\']moe-patch["\']', re.MULTILINE)


@dataclass(frozen=True)
class Settings:
    series_root: Path  # the series directory: one v<base>/ folder per base release
    index_url: str | None = None  # None: pip's own index configuration
    results_dir: Path = Path("kernels", "results")  # measurements pr's descriptions show
    kernel_tests_dir: Path = Path("tests", "kernels")  # what verify --kernels runs

    @classmethod
    def resolve(cls, series_root: Path | None = None, index_url: str | None = None) -> Settings:
        """``--patches`` (else ``$MOE_PATCH_SERIES``, else :func:`default_series_root`),
        ``--index-url``, ``$MOE_PATCH_RESULTS`` and ``$MOE_PATCH_KERNEL_TESTS``."""
        root = series_root or default_series_root()
        results = os.environ.get("MOE_PATCH_RESULTS")
        tests = os.environ.get("MOE_PATCH_KERNEL_TESTS")
        return cls(
            series_root=root.expanduser().absolute(),
            index_url=index_url or None,
            results_dir=Path(results) if results else _results_dir(),
            kernel_tests_dir=Path(tests).absolute() if tests else _in_project("tests", "kernels"),
        )


def default_series_root() -> Path:
    """``$MOE_PATCH_SERIES``; else the ``patches/`` of the moe-patch checkout the current
    directory is in; else that of the checkout moe-patch is installed from (editable);
    else the copy shipped inside the installed package."""
    configured = os.environ.get("MOE_PATCH_SERIES")
    if configured:
        return Path(configured)
    return project_path("patches") or packaged_series_root()


def packaged_series_root() -> Path:
    return Path(str(resources.files("moe_patch") / "_series"))


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


def _results_dir() -> Path:
    # Without a checkout, the results the patches cite, shipped inside the package.
    return project_path("kernels", "results") or Path(
        str(resources.files("moe_patch") / "_results")
    )


def _in_project(*parts: str) -> Path:
    # Without a checkout the relative path stays: what reads it says it is missing.
    return project_path(*parts) or Path(*parts).absolute()


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
    shipped = packaged_series_root()
    try:
        inside = root.resolve().is_relative_to(shipped.resolve())
    except OSError:
        inside = False
    if inside and shipped.is_dir():
        raise UsageError(
            f"{command} writes a series, and {root} is the copy shipped inside the installed "
            "moe-patch: run it from a moe-patch checkout, or pass --patches DIR"
        )
