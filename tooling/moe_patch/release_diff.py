"""The series as one diff against a release, and carrying that diff onto packaged files.

A wheel and an installed vLLM hold the release's ``vllm/`` package, not its source
tree, so the series cannot be applied to them with ``git am``.  Instead:

1. :func:`build` applies the series to the release's source tree exactly as
   ``moe-patch apply`` does (same cache, same per-patch outcomes, 3-way fallback
   included) in a throwaway tree, and keeps the resulting ``git diff``;
2. :func:`plan` sorts every file of that diff: carried (the package ships it, or
   a patch adds it to the package), skipped (tests, docs: nothing at run time), or
   refused (compiled or build sources, or a file the package should have but lacks);
3. :func:`carry` applies the diff of the carried files onto the package's own
   bytes with ``git apply`` in a throwaway repository: no fuzz, so a file that
   differs from the release where the series touches it fails instead of being
   patched approximately.
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import git

from . import applier, cache, gitutil, series, sources
from .errors import PatchFailed
from .patchfile import check_path
from .report import ApplyReport
from .settings import Settings

ADDED, MODIFIED, DELETED = "added", "modified", "deleted"

# Paths of a source tree that nothing imports at run time: a patch may touch them,
# and a wheel or an installed vLLM simply does without that part of it.
NOT_AT_RUN_TIME = ("tests/", "docs/", "examples/", "benchmarks/", ".github/", ".buildkite/")
# Sources that end up compiled into the extension modules, or that steer the build
# and the package metadata: a package made from the official binaries cannot carry them.
COMPILED_SUFFIXES = {
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".cu",
    ".cuh",
    ".h",
    ".hh",
    ".hpp",
    ".hip",
    ".inl",
    ".cmake",
}
BUILD_PREFIXES = ("csrc/", "cmake/", "requirements/")
BUILD_FILES = {"setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "CMakeLists.txt"}


@dataclass
class FileChange:
    path: str
    kind: str  # ADDED | MODIFIED | DELETED
    patches: list[str]  # ids of the patches that touch it


@dataclass
class ReleaseDiff:
    version: str
    series_base: str
    report: ApplyReport  # what ``apply`` reports for each patch on this release
    diff: bytes  # git diff (binary, full index) from the release to the patched tree
    changes: list[FileChange]
    patch_sha256: dict[str, str]  # patch id -> sha256 of its file: the exact series used

    @property
    def applied_ids(self) -> list[str]:
        return [o.id for o in self.report.outcomes if o.commit]


@dataclass
class Plan:
    carried: list[FileChange] = field(default_factory=list)
    skipped: list[FileChange] = field(default_factory=list)


def build(
    version: str,
    settings: Settings | None = None,
    only: list[str] | None = None,
) -> ReleaseDiff:
    """Apply the series serving ``version`` to its source tree; keep the diff."""
    settings = settings or Settings.resolve()
    index_url = settings.index_url
    chosen = series.for_version(version, settings.series_root)
    patches = chosen.select(only)
    # The throwaway tree (~100 MB for a real release) lives in the cache, named after this
    # run: a killed run's is removed by the next one, never left in the system's /tmp.
    with cache.scratch("release") as scratch:
        work = sources.from_cache(version, scratch / f"vllm-{version}", index_url)
        report = applier.apply_series(work.path, work.base, version, chosen, only, index_url)
        if not report.ok:
            failed = next(o for o in report.outcomes if o.status == "failed")
            raise PatchFailed(
                f"patch {failed.id} does not apply to vLLM {version} ({failed.detail}); "
                "refresh the patch for this release, or leave it out with --only"
            )
        head = report.head or work.base
        diff = gitutil.run(
            work.path,
            "diff",
            "--no-ext-diff",
            "--binary",
            "--full-index",
            "--no-renames",
            "--no-color",
            work.base,
            head,
            strip_newline_in_stdout=False,
            stdout_as_string=False,
        )
        listing = gitutil.run(
            work.path, "diff", "--name-status", "--no-renames", "-z", work.base, head
        )
    changes = []
    fields = [f for f in listing.split("\0") if f]
    for status, path in zip(fields[0::2], fields[1::2], strict=True):
        check_path(path, "the series")
        kind = {"A": ADDED, "D": DELETED}.get(status[:1], MODIFIED)
        owners = [p.id for p in patches if path in p.files]
        changes.append(FileChange(path, kind, owners))
    return ReleaseDiff(
        version=version,
        series_base=chosen.base,
        report=report,
        diff=diff,
        changes=changes,
        patch_sha256={p.id: hashlib.sha256(p.path.read_bytes()).hexdigest() for p in patches},
    )


def _is_compiled_or_build(path: str) -> bool:
    pure = PurePosixPath(path)
    return (
        pure.suffix.lower() in COMPILED_SUFFIXES
        or path.startswith(BUILD_PREFIXES)
        or pure.name in BUILD_FILES
    )


def _not_at_run_time(path: str) -> bool:
    pure = PurePosixPath(path)
    return path.startswith(NOT_AT_RUN_TIME) or (
        len(pure.parts) == 1 and pure.suffix.lower() in (".md", ".rst")
    )


def plan(rdiff: ReleaseDiff, shipped: set[str], what: str) -> Plan:
    """Sort the diff's files for a package holding ``shipped`` (paths like ``vllm/x.py``).

    Raises :class:`PatchFailed` naming the patch and the file, with the reason, when
    a file matters at run time but the package cannot carry it.
    """
    packages = {p.split("/", 1)[0] for p in shipped if "/" in p}
    result = Plan()
    for change in rdiff.changes:
        owner = ", ".join(change.patches) or "the series"
        top = change.path.split("/", 1)[0] if "/" in change.path else None
        if change.path in shipped:
            result.carried.append(change)
        elif _is_compiled_or_build(change.path):
            raise PatchFailed(
                f"patch {owner} changes {change.path}, a compiled or build source: {what} "
                "keeps vLLM's compiled files as released, so it cannot carry that change; "
                "build vLLM from the patched tree (moe-patch apply) instead"
            )
        elif top in packages and change.kind == ADDED:
            result.carried.append(change)  # a new module of the package
        elif top in packages:
            raise PatchFailed(
                f"patch {owner} changes {change.path}, which {what} does not contain; "
                f"it is not the vLLM {rdiff.version} release the series was made for"
            )
        elif _not_at_run_time(change.path):
            result.skipped.append(change)
        else:
            raise PatchFailed(
                f"patch {owner} changes {change.path}, which is not in {what} and may "
                "matter at run time; build vLLM from the patched tree (moe-patch apply) instead"
            )
    return result


@dataclass
class Carried:
    data: bytes | None  # None: the series deletes the file
    executable: bool


def carry(
    rdiff: ReleaseDiff, files: list[FileChange], originals: dict[str, bytes], what: str
) -> dict[str, Carried]:
    """The carried files after the series: ``git apply`` (exact context, no fuzz) of
    the release diff onto ``originals`` (path -> the package's bytes)."""
    if not files:
        return {}
    with cache.scratch("carry") as scratch:
        work = scratch / "tree"
        work.mkdir()
        gitutil.run(work, "init", "-q")
        for path, data in originals.items():
            target = work / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        diff_file = scratch / "series.diff"
        diff_file.write_bytes(rdiff.diff)
        includes = [f"--include={_glob_escape(f.path)}" for f in files]
        try:
            gitutil.run(work, "apply", "--check", *includes, str(diff_file))
            gitutil.run(work, "apply", *includes, str(diff_file))
        except git.GitCommandError as exc:
            reason = [ln for ln in str(exc.stderr or "").splitlines() if "error:" in ln]
            detail = reason[0].split("error:", 1)[1].strip().strip("'") if reason else "rejected"
            raise PatchFailed(
                f"the series does not apply exactly to {what} ({detail}); its files are "
                f"not those of the vLLM {rdiff.version} release the series was made for"
            ) from None
        result = {}
        for change in files:
            target = work / change.path
            if target.is_file() and not target.is_symlink():
                mode = target.stat().st_mode
                result[change.path] = Carried(target.read_bytes(), bool(mode & stat.S_IXUSR))
            else:
                result[change.path] = Carried(None, False)
    return result


def _glob_escape(path: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]\\" else c for c in path)
