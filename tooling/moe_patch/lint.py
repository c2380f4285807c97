"""The ruff a vLLM tree is checked with: the version its pre-commit configuration pins.

vLLM's CI runs ruff through pre-commit at the ``rev`` of ``astral-sh/ruff-pre-commit`` in
``.pre-commit-config.yaml``; ruff's rules and formatting change between releases, so a check
with another version can pass here and fail there.  That version is installed once with pip
(the index pip is configured with) into ``<cache>/tools/ruff-X.Y.Z`` and reused.  Where it
cannot be installed (offline, no such wheel), the ruff installed with moe-patch is used and
the label says so.  ``MOE_PATCH_RUFF=<path>`` picks a binary outright.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import cache, children, gitutil
from .errors import UsageError
from .pipconfig import index_settings

PRE_COMMIT_CONFIG = ".pre-commit-config.yaml"
MISSING = "ruff not found: reinstall moe-patch (it depends on ruff) or set MOE_PATCH_RUFF"
# The ruff-pre-commit repository entry and the rev that follows it (before the next entry):
# a tag, or a commit with the tag `pre-commit autoupdate --freeze` writes beside it
# ("rev: f368fb3...  # frozen: v0.17.2", vLLM 0.34 on).
_PINNED = re.compile(
    r"repo:\s*\S*astral-sh/ruff-pre-commit\S*\s*\n(?:(?!\s*-\s*repo:).*\n)*?\s*rev:\s*"
    r"(?:[0-9a-f]{40}\s*#\s*frozen:\s*v?([0-9][0-9A-Za-z.]*)|['\"]?v?([0-9][0-9A-Za-z.]*))"
)


@dataclass(frozen=True)
class Ruff:
    path: str
    version: str | None  # None: unknown (a binary the user picked)
    origin: str  # why this one, for reports: "pinned by the tree's .pre-commit-config.yaml"


def pinned_version(tree: Path) -> str | None:
    """The ruff version ``tree``'s pre-commit configuration pins, if it pins one."""
    try:
        text = (tree / PRE_COMMIT_CONFIG).read_text(errors="replace")
    except OSError:
        return None
    match = _PINNED.search(text)
    return (match.group(1) or match.group(2)) if match else None


def configured() -> Ruff | None:
    """The ruff ``MOE_PATCH_RUFF`` picks, if it picks one; bad input if it names no program."""
    value = os.environ.get("MOE_PATCH_RUFF")
    if not value:
        return None
    if shutil.which(value) is None:
        raise UsageError(
            f"MOE_PATCH_RUFF={value!r} is not a program moe-patch can run; point it at a ruff "
            "binary, or unset it to use the ruff the tree pins"
        )
    return Ruff(value, None, "MOE_PATCH_RUFF")


def ruff_for(tree: Path, index_url: str | None = None) -> Ruff | None:
    """The ruff to check ``tree`` with; None when there is none at all."""
    chosen = configured()
    if chosen:
        return chosen
    installed = _installed()
    pinned = pinned_version(tree)
    if pinned is None:
        if installed is None:
            return None
        return Ruff(installed.path, installed.version, "installed; the tree pins no version")
    if installed and installed.version == pinned:
        return Ruff(installed.path, pinned, f"installed, the version {PRE_COMMIT_CONFIG} pins")
    path, why_not = _cached_ruff(pinned, index_url)
    if path:
        return Ruff(path, pinned, f"the version {PRE_COMMIT_CONFIG} pins")
    if installed is None:
        return None
    return Ruff(
        installed.path,
        installed.version,
        f"installed; {PRE_COMMIT_CONFIG} pins {pinned}, which could not be installed ({why_not})",
    )


def describe(ruff: Ruff) -> str:
    version = f"ruff {ruff.version}" if ruff.version else f"ruff at {ruff.path}"
    return f"{version} ({ruff.origin})"


def _installed() -> Ruff | None:
    beside = Path(sys.executable).parent / ("ruff.exe" if os.name == "nt" else "ruff")
    path = str(beside) if beside.is_file() else shutil.which("ruff")
    if not path:
        return None
    return Ruff(path, _version_of(path), "installed")


def _version_of(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = done.stdout.split()
    return words[1] if done.returncode == 0 and len(words) >= 2 else None


def _binary_in(folder: Path) -> Path:
    return folder / "bin" / ("ruff.exe" if os.name == "nt" else "ruff")


def _cached_ruff(version: str, index_url: str | None) -> tuple[str | None, str]:
    """``ruff==version`` from the cache, installing it there first if needed."""
    if not re.fullmatch(r"[0-9][0-9A-Za-z.]*", version):
        return None, f"{version!r} is not a version"
    tools = cache.subdir("tools")
    final = tools / f"ruff-{version}"
    if _binary_in(final).is_file():
        return str(_binary_in(final)), ""
    with cache.locked(f"tool-ruff-{version}"):
        if _binary_in(final).is_file():
            return str(_binary_in(final)), ""
        cache.remove_leftovers(tools, f"ruff-{version}")
        if final.exists():  # a folder without its binary: not ours to trust
            shutil.rmtree(final, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(dir=tools, prefix=f".tmp-ruff-{version}-"))
        try:
            settings = index_settings(index_url)
            command = [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
                "--target", str(scratch), "--index-url", settings.url, f"ruff=={version}",
            ]  # fmt: skip
            if settings.cert:
                command[4:4] = ["--cert", settings.cert]
            try:
                done = children.run(
                    command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"pip did not run: {exc}"
            if done.returncode != 0 or not _binary_in(scratch).is_file():
                lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
                return None, (lines[-1] if lines else f"pip exited with {done.returncode}")
            os.replace(scratch, final)
            return str(_binary_in(final)), ""
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


# --- running it on a tree -------------------------------------------------------------


def config(tree: Path) -> tuple[list[str], str]:
    """The tree's own ruff configuration, as ruff arguments and a label."""
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file() and "[tool.ruff" in pyproject.read_text(errors="replace"):
        return ["--config", str(pyproject)], "pyproject.toml"
    for name in ("ruff.toml", ".ruff.toml"):
        if (tree / name).is_file():
            return ["--config", str(tree / name)], name
    return ["--isolated"], "ruff's defaults (the tree has no ruff configuration)"


def run(ruff: Ruff, tree: Path, *args: str, stdin: str | None = None):
    return subprocess.run(
        [ruff.path, *args],
        cwd=tree,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


def error(proc) -> str:
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[0].strip() if lines else f"ruff exited with {proc.returncode}"


def base_text(tree: Path, base_commit: str, name: str) -> str | None:
    """``name`` as it was at ``base_commit``; None if the change adds it."""
    try:
        return gitutil.run(tree, "show", f"{base_commit}:{name}", strip_newline_in_stdout=False)
    except Exception:
        return None


def fix_added_lines(ruff: Ruff, tree: Path, files: list[str], base: str) -> None:
    """Let ruff fix and format files that were clean before the change (never reformatting
    upstream's own lines in a file that was not)."""
    args, _ = config(tree)
    for name in files:
        text = base_text(tree, base, name)
        if text is None:
            clean_format = clean_lint = True
        else:
            stdin = ("--stdin-filename", name, "-")
            fmt = ("format", "--check", "--no-cache", *args, *stdin)
            clean_format = run(ruff, tree, *fmt, stdin=text).returncode == 0
            lint = ("check", "--no-cache", "--quiet", *args, *stdin)
            clean_lint = run(ruff, tree, *lint, stdin=text).returncode == 0
        if clean_lint:
            run(ruff, tree, "check", "--fix", "--no-cache", "--quiet", *args, name)
        if clean_format:
            run(ruff, tree, "format", "--no-cache", "--quiet", *args, name)
