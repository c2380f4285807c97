"""Patching the vLLM installed in an environment, in place, and undoing it exactly.

The installed distribution is found like ``import vllm`` finds it (the first
``vllm-*.dist-info`` on ``sys.path``, or in ``--target``); its version comes from
its metadata.  The series is carried onto it as onto a wheel
(:mod:`moe_patch.release_diff`), after checking that every file it touches is the
one pip installed (its RECORD hash) and that everything can be written.

Everything moe-patch keeps lives in ``<vllm>.dist-info/moe-patch/`` and is listed
in RECORD, so ``pip uninstall`` removes it with the rest::

    state.json          what was changed: each file's bytes, mode and mtime before and after
    backup/<path>       the files as they were, RECORD included

Apply is all or nothing: backups and a state saying ``applying`` are written
first, then the files, RECORD, and the state saying ``applied``.  A failure on
the way restores what was written; an interrupted run leaves a state that
``status`` reports and ``revert`` finishes.  Revert restores every file byte for
byte (mode and modification time too, so the original ``.pyc`` files stay valid),
and refuses to touch a file that changed after moe-patch patched it.
"""

from __future__ import annotations

import contextlib
import csv
import email.parser
import hashlib
import io
import json
import os
import py_compile
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from installer.records import Hash, InvalidRecordEntry, RecordEntry, parse_record_file
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import __version__, cache, gpu_runs, release_diff, series, ui, versions
from . import wheel as wheels
from .errors import IntegrityError, LocalIOError, StateError, UsageError
from .report import as_json
from .settings import Settings

PROJECT = "vllm"
STATE_DIR = "moe-patch"
STATE_FILE = "state.json"
BACKUP_DIR = "backup"
APPLYING, APPLIED = "applying", "applied"


# ---------------------------------------------------------------- finding the install


@dataclass
class Install:
    site: Path  # the directory RECORD's paths are relative to
    dist_info: Path
    version: str  # from the distribution's metadata

    @property
    def state_dir(self) -> Path:
        return self.dist_info / STATE_DIR

    def rel(self, *parts: str) -> str:
        """A path inside the dist-info, as RECORD writes it."""
        return "/".join([self.dist_info.name, *parts])


def find(target: Path | None = None) -> Install:
    """The vLLM that ``import vllm`` would load (or the one in ``target``)."""
    if target is not None:
        target = target.expanduser().absolute()
        if not target.is_dir():
            raise UsageError(f"--target {target} does not exist or is not a directory")
        entries = [target]
    else:
        entries = [Path(p or ".").absolute() for p in sys.path]
    found = []
    for entry in entries:
        if not entry.is_dir():
            continue
        for child in sorted(entry.glob("*.dist-info")):
            if canonicalize_name(child.name[: -len(".dist-info")].rsplit("-", 1)[0]) == PROJECT:
                found.append(child)
        if found:
            break
    if not found:
        where = str(target) if target else f"the environment of {sys.executable}"
        raise UsageError(
            f"no vLLM is installed in {where}; install it, or point --target at the "
            "site-packages directory that holds it"
        )
    if len(found) > 1:
        raise StateError(
            f"{found[0].parent} holds {len(found)} vLLM distributions "
            f"({', '.join(f.name for f in found)}); a broken install: reinstall vllm"
        )
    dist_info = found[0]
    metadata = email.parser.BytesParser().parsebytes(
        _read(dist_info / "METADATA", "its METADATA"), headersonly=True
    )
    version = (metadata.get("Version") or "").strip()
    try:
        Version(version)
    except InvalidVersion:
        raise StateError(f"{dist_info} has no valid Version in its METADATA") from None
    direct = dist_info / "direct_url.json"
    if direct.is_file():
        with contextlib.suppress(ValueError, OSError):
            if json.loads(direct.read_text()).get("dir_info", {}).get("editable"):
                raise UsageError(
                    f"vLLM in {dist_info.parent} is an editable install of a source tree; "
                    "patch that tree with moe-patch apply --source DIR --in-place instead"
                )
    return Install(dist_info.parent, dist_info, version)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise LocalIOError(f"cannot read {what} ({path}: {exc.strerror})") from None


# ---------------------------------------------------------------- RECORD


def _record_rows(install: Install) -> tuple[list[str], dict[str, RecordEntry]]:
    """RECORD's lines (kept verbatim) and its entries by path."""
    data = _read(install.dist_info / "RECORD", "the RECORD of the installed vLLM")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateError(
            f"the RECORD of the installed vLLM is not UTF-8 (byte {exc.start}); reinstall vllm "
            "(pip install --force-reinstall --no-deps vllm==VERSION), then apply"
        ) from None
    lines = text.splitlines()
    entries = {}
    try:
        for row in parse_record_file(lines):
            entries[row[0]] = RecordEntry.from_elements(*row)
    except (InvalidRecordEntry, ValueError) as exc:
        raise StateError(f"the RECORD of the installed vLLM is malformed ({exc})") from None
    return lines, entries


def _row(path: str, data: bytes | None) -> str:
    entry = RecordEntry(
        path,
        Hash("sha256", wheels._b64(hashlib.sha256(data).digest())) if data is not None else None,
        len(data) if data is not None else None,
    )
    out = io.StringIO()
    csv.writer(out, delimiter=",", quotechar='"', lineterminator="\n").writerow(entry.to_row())
    return out.getvalue().rstrip("\n")


def _row_path(line: str) -> str | None:
    try:
        return next(csv.reader([line]))[0]
    except (StopIteration, csv.Error, IndexError):
        return None


# ---------------------------------------------------------------- state


@dataclass
class FileState:
    path: str
    change: str  # added | modified | deleted | compiled (a .pyc refreshed or removed)
    before: dict | None  # sha256, size, mode, mtime_ns; None: the file did not exist
    after: dict | None  # sha256, size; None: the file does not exist afterwards


@dataclass
class State:
    status: str
    moe_patch: str
    vllm: str
    series_base: str
    patches: list[dict]
    files: list[FileState]
    skipped: list[str] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    record: dict = field(default_factory=dict)  # RECORD before: sha256, size, mode, mtime_ns

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> State:
        raw = json.loads(data)
        raw["files"] = [FileState(**f) for f in raw["files"]]
        return cls(**raw)


def read_patch_record(install: Install) -> State | None:
    path = install.state_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        return State.from_bytes(path.read_bytes())
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise IntegrityError(
            f"moe-patch's state file {path} is unreadable ({exc}); reinstall vllm "
            f"(pip install --force-reinstall --no-deps vllm=={install.version})"
        ) from None


def _write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.moe-patch-tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _describe(path: Path) -> dict:
    st = path.stat()
    return {
        "sha256": cache.sha256_file(path),
        "size": st.st_size,
        "mode": st.st_mode & 0o7777,
        "mtime_ns": st.st_mtime_ns,
    }


def _sha(path: Path) -> str | None:
    return cache.sha256_file(path) if path.is_file() else None


# ---------------------------------------------------------------- reports


@dataclass
class InstalledReport:
    action: str  # apply | revert | status
    vllm: str
    location: str  # the dist-info directory
    state: str  # not patched | patched | unchanged | reverted | interrupted | moe-patch wheel | ...
    series_base: str | None = None
    moe_patch: str | None = None
    patches: list[dict] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)  # path, change, now
    skipped: list[str] = field(default_factory=list)
    detail: str = ""

    def to_json(self) -> str:
        return as_json(self)


def _lock(install: Install):
    key = hashlib.sha256(str(install.dist_info).encode()).hexdigest()[:16]
    return cache.locked(f"installed-{key}")


def _wheel_build_info(install: Install) -> dict | None:
    """What a moe-patch wheel says it carries; {} for a ``+moe`` build that does not say
    (``--method precompiled``); None for any other vLLM."""
    path = install.dist_info / wheels.BUILD_INFO
    if not path.is_file():
        local = Version(install.version).local or ""
        return {} if f"{wheels.LOCAL_PREFIX}." in f"{local}." else None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _check_version_module(install: Install) -> None:
    module = install.site / wheels.VERSION_MODULE
    if not module.is_file():
        return
    match = re.search(
        r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
        module.read_text(errors="replace"),
        re.MULTILINE,
    )
    if match and match.group(1) != install.version:
        raise StateError(
            f"the installed vllm package says it is {match.group(1)} but its metadata says "
            f"{install.version} ({install.dist_info}); a mixed-up install: reinstall vllm"
        )


def _release_version(install: Install, requested: str | None) -> str:
    version = Version(install.version)
    if requested is not None:
        wanted = versions.parse_spec(requested)
        if version.release[: len(wanted.release)] != wanted.release or (
            len(wanted.release) < 3 and len(version.release) < len(wanted.release)
        ):
            raise UsageError(
                f"the installed vLLM is {install.version}, not {requested} "
                f"({install.dist_info}); drop --vllm or install vllm=={requested}"
            )
    return version.public


# ---------------------------------------------------------------- apply


def apply(
    target: Path | None = None,
    vllm: str | None = None,
    settings: Settings | None = None,
    only: list[str] | None = None,
) -> InstalledReport:
    settings = settings or Settings.resolve()
    install = find(target)
    version = _release_version(install, vllm)
    report = InstalledReport("apply", install.version, str(install.dist_info), "patched")
    built = _wheel_build_info(install)
    if built is not None:
        chosen = series.for_version(version, settings.series_root)
        same = bool(built) and [p.get("sha256") for p in built.get("patches", [])] == [
            hashlib.sha256(p.path.read_bytes()).hexdigest() for p in chosen.patches
        ]
        if same and not only:
            report.state = "unchanged (a moe-patch wheel with this series)"
            report.series_base, report.moe_patch = built.get("series_base"), built.get("moe_patch")
            report.patches = built.get("patches", [])
            return report
        raise StateError(
            f"the installed vLLM {install.version} is a moe-patch wheel"
            + (" of another series" if built else "")
            + "; install the official wheel (or a patched wheel of this series) instead"
        )
    _check_version_module(install)
    with _lock(install):
        state = read_patch_record(install)
        rdiff = release_diff.build(version, settings, only)
        patches = _patch_list(rdiff)
        if state is not None and state.status != APPLIED:
            # A run killed part-way: put back what it changed (as revert does), start again.
            _undo(install, state)
            ui.info(
                f"an earlier apply to {install.dist_info.parent} was interrupted; "
                "rolled back what it had changed, applying again"
            )
            state = None
        if state is not None:
            if state.patches == patches:
                _fill(report, state, install)
                report.state = "unchanged (already applied)"
                return report
            raise StateError(
                f"the installed vLLM is already patched with another series or selection "
                f"(moe-patch {state.moe_patch}); run moe-patch revert --installed first"
            )
        leftover = install.state_dir
        if leftover.exists():  # a run killed before it wrote its state: nothing was changed
            shutil.rmtree(leftover)
        gpu_runs.warn_if_unverified(
            series.for_version(version, settings.series_root).directory, version
        )
        _apply(install, rdiff, patches, report)
    return report


def _patch_list(rdiff: release_diff.ReleaseDiff) -> list[dict]:
    return [
        {"id": o.id, "status": o.status, "sha256": rdiff.patch_sha256.get(o.id, "")}
        for o in rdiff.report.outcomes
    ]


def _pycs(site: Path, path: str) -> list[str]:
    """The cached bytecode files of source ``path`` (RECORD-style paths)."""
    if not path.endswith(".py"):
        return []
    source = site / path
    cache_dir = source.parent / "__pycache__"
    if not cache_dir.is_dir():
        return []
    stem = source.stem + "."
    found = [p for p in cache_dir.iterdir() if p.name.startswith(stem) and p.name.endswith(".pyc")]
    return sorted(p.relative_to(site).as_posix() for p in found if p.is_file())


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


def _apply(install: Install, rdiff, patches: list[dict], report: InstalledReport) -> None:
    site = install.site
    what = f"the installed vLLM {install.version}"
    lines, record = _record_rows(install)
    layout = release_diff.plan(rdiff, set(record), what)

    originals: dict[str, bytes] = {}
    for change in layout.carried:
        path = site / change.path
        if change.path in record:
            if path.is_symlink() or not path.is_file():
                raise StateError(
                    f"{path} is listed in RECORD but is {'a link' if path.is_symlink() else 'missing'}; "
                    f"reinstall vllm (pip install --force-reinstall --no-deps vllm=={install.version})"
                )
            data = path.read_bytes()
            entry = record[change.path]
            if entry.hash_ is None or not entry.validate(data):
                raise StateError(
                    f"{change.path} differs from the vLLM {install.version} release "
                    "(its RECORD hash): someone else changed it; reinstall vllm "
                    f"(pip install --force-reinstall --no-deps vllm=={install.version}) "
                    "or undo that change first"
                )
            originals[change.path] = data
        elif path.exists() or path.is_symlink():
            raise StateError(f"{path} exists, but the series adds it; remove it first")
    carried = release_diff.carry(rdiff, layout.carried, originals, what)

    # Everything that will be written or replaced, and where.
    pyc_paths = {c.path: _pycs(site, c.path) for c in layout.carried if c.path in originals}
    new_dirs: list[str] = []
    for change in layout.carried:
        parent = (site / change.path).parent
        while not parent.exists():
            new_dirs.append(parent.relative_to(site).as_posix())
            parent = parent.parent
    dirs = {(site / c.path).parent for c in layout.carried}
    dirs |= {(site / p).parent for ps in pyc_paths.values() for p in ps}
    dirs = {d if d.exists() else _existing_parent(d) for d in dirs} | {install.dist_info}
    blocked = sorted(str(d) for d in dirs if not _writable(d))
    blocked += sorted(str(site / p) for p in originals if not _writable(site / p))
    if blocked:
        raise LocalIOError(
            f"{blocked[0]} is not writable; run as its owner (or root), or use a "
            "patched wheel (moe-patch wheel) in the image instead"
        )

    files: list[FileState] = []
    for change in layout.carried:
        path = site / change.path
        new = carried[change.path].data
        after = (
            None if new is None else {"sha256": hashlib.sha256(new).hexdigest(), "size": len(new)}
        )
        before = _describe(path) if change.path in originals else None
        files.append(FileState(change.path, change.kind, before, after))
    for pycs in pyc_paths.values():
        for pyc in pycs:
            files.append(FileState(pyc, "compiled", _describe(site / pyc), None))
    state = State(
        status=APPLYING,
        moe_patch=__version__,
        vllm=install.version,
        series_base=rdiff.series_base,
        patches=patches,
        files=files,
        skipped=[c.path for c in layout.skipped],
        created_dirs=sorted(set(new_dirs)),
    )

    record_path = install.dist_info / "RECORD"
    record_before = _describe(record_path)
    record_bytes = record_path.read_bytes()
    state.record = record_before
    backups = install.state_dir / BACKUP_DIR
    written: list[str] = []
    try:
        for entry in files:
            if entry.before is not None:
                _write_atomic(backups / entry.path, (site / entry.path).read_bytes())
        _write_atomic(backups / install.dist_info.name / "RECORD", record_bytes)
        _write_atomic(install.state_dir / STATE_FILE, state.to_bytes())

        by_path = {f.path: f for f in files}
        for change in layout.carried:
            path = site / change.path
            result = carried[change.path]
            written.append(change.path)
            if result.data is None:
                path.unlink()
            else:
                mode = (
                    by_path[change.path].before["mode"]
                    if change.path in originals
                    else (0o755 if result.executable else 0o644)
                )
                _write_atomic(path, result.data, mode)
        for source, pycs in pyc_paths.items():
            for pyc in pycs:
                written.append(pyc)
                after = _refresh_pyc(site, source, pyc, carried[source].data is not None)
                by_path[pyc].after = after

        _write_atomic(
            record_path,
            _new_record(install, lines, record, files, backups, record_bytes),
            record_before["mode"],
        )
        state.status = APPLIED
        _write_atomic(install.state_dir / STATE_FILE, state.to_bytes())
    except BaseException:
        _rollback(install, state, written, record_bytes, record_before)
        raise
    _fill(report, state, install)


def _existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _refresh_pyc(site: Path, source: str, pyc: str, source_exists: bool) -> dict | None:
    """Recompile ``pyc`` like it was (optimisation, invalidation mode) when this
    interpreter wrote that kind; otherwise remove it (Python rebuilds it on import)."""
    target = site / pyc
    name = target.name[len(Path(source).stem) + 1 : -len(".pyc")]  # cpython-311[.opt-1]
    tag, _, opt = name.partition(".")
    header = target.read_bytes()[:16]
    if (
        not source_exists
        or tag != sys.implementation.cache_tag
        or (opt and not opt.startswith("opt-"))
    ):
        target.unlink()
        return None
    flags = int.from_bytes(header[4:8], "little")
    mode = (
        py_compile.PycInvalidationMode.TIMESTAMP
        if not flags & 0b1
        else py_compile.PycInvalidationMode.CHECKED_HASH
        if flags & 0b10
        else py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    level = int(opt[len("opt-") :]) if opt else 0
    try:
        py_compile.compile(
            str(site / source),
            cfile=str(target),
            doraise=True,
            optimize=level,
            invalidation_mode=mode,
        )
    except py_compile.PyCompileError:
        target.unlink(missing_ok=True)
        return None
    data = target.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _new_record(install, lines, record, files, backups: Path, record_bytes: bytes) -> bytes:
    site = install.site
    by_path = {f.path: f for f in files}
    out = []
    for line in lines:
        path = _row_path(line)
        entry = by_path.get(path) if path is not None else None
        if entry is None:
            out.append(line)
        elif entry.after is None:
            continue  # the file is gone
        elif entry.change == "compiled" and record[path].hash_ is None:
            out.append(line)  # pip lists bytecode without a hash: keep its line as it was
        else:
            out.append(_row(path, (site / path).read_bytes()))
    for entry in files:
        if entry.before is None and entry.after is not None:
            out.append(_row(entry.path, (site / entry.path).read_bytes()))
    for entry in files:
        if entry.before is not None:
            backup = backups / entry.path
            out.append(_row(install.rel(STATE_DIR, BACKUP_DIR, entry.path), backup.read_bytes()))
    out.append(
        _row(install.rel(STATE_DIR, BACKUP_DIR, install.dist_info.name, "RECORD"), record_bytes)
    )
    out.append(_row(install.rel(STATE_DIR, STATE_FILE), None))
    return ("\n".join(out) + "\n").encode("utf-8")


def _rollback(install: Install, state: State, written: list[str], record_bytes, record_before):
    """Undo a failed apply from what is still in memory and in the backups."""
    site = install.site
    by_path = {f.path: f for f in state.files}
    for path in reversed(written):
        entry = by_path[path]
        with contextlib.suppress(OSError):
            if entry.before is None:
                (site / path).unlink(missing_ok=True)
            else:
                _restore(
                    site / path, (install.state_dir / BACKUP_DIR / path).read_bytes(), entry.before
                )
    with contextlib.suppress(OSError):
        _restore(install.dist_info / "RECORD", record_bytes, record_before)
    for directory in reversed(state.created_dirs):
        with contextlib.suppress(OSError):
            (site / directory).rmdir()
    shutil.rmtree(install.state_dir, ignore_errors=True)


def _remove_partial_writes(install: Install, state: State) -> None:
    """Remove the temporary files a run killed inside a write leaves next to the file
    it was replacing: ours (``.NAME.moe-patch-tmp``, :func:`_write_atomic`) and
    py_compile's (``NAME.pyc.<digits>``).  Only a SIGKILL skips the writers' own
    clean-up, so the names are theirs alone."""
    paths = [install.site / entry.path for entry in state.files]
    for path in [*paths, install.dist_info / "RECORD"]:
        path.with_name(f".{path.name}.moe-patch-tmp").unlink(missing_ok=True)
    for entry, path in zip(state.files, paths, strict=True):
        if entry.change == "compiled" and path.parent.is_dir():
            for leftover in path.parent.iterdir():
                suffix = leftover.name[len(path.name) + 1 :]
                if leftover.name.startswith(f"{path.name}.") and suffix.isdigit():
                    leftover.unlink(missing_ok=True)


def _restore(path: Path, data: bytes, before: dict) -> None:
    _write_atomic(path, data, before["mode"])
    os.utime(path, ns=(before["mtime_ns"], before["mtime_ns"]))


# ---------------------------------------------------------------- revert


def revert(target: Path | None = None) -> InstalledReport:
    install = find(target)
    report = InstalledReport("revert", install.version, str(install.dist_info), "not patched")
    with _lock(install):
        state = read_patch_record(install)
        if state is None:
            if install.state_dir.exists():  # killed before its state was written
                shutil.rmtree(install.state_dir)
            report.detail = "moe-patch has not patched this vLLM in place; nothing to revert"
            if _wheel_build_info(install) is not None:
                report.state = "moe-patch wheel"
                report.detail = (
                    "this vLLM is a moe-patch wheel; install the official wheel to go back "
                    f"(pip install --force-reinstall --no-deps vllm=={Version(install.version).public})"
                )
            return report
        _undo(install, state)
        _fill(report, state, install)
        report.state = "reverted"
        report.patches = [{**patch, "status": "reverted"} for patch in state.patches]
        for item in report.files:
            item["now"] = "release"
    return report


def _undo(install: Install, state: State) -> None:
    """Put back every file ``state`` recorded, byte for byte, and drop moe-patch's record
    (call under the install's lock).  The record goes last, its state file first: a run
    killed in here leaves either the record whole, to undo again, or nothing to undo."""
    site = install.site
    backups = install.state_dir / BACKUP_DIR
    changed = [f.path for f in state.files if _now(site, f) == "changed"]
    if changed:
        raise StateError(
            f"{changed[0]} changed after moe-patch patched it"
            + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")
            + "; revert would lose that change: reinstall vllm instead "
            f"(pip install --force-reinstall --no-deps vllm=={Version(install.version).public})"
        )
    saved = {}
    for entry in state.files:
        if entry.before is not None:
            data = _read(backups / entry.path, f"moe-patch's backup of {entry.path}")
            if hashlib.sha256(data).hexdigest() != entry.before["sha256"]:
                raise IntegrityError(
                    f"moe-patch's backup of {entry.path} is corrupt; reinstall vllm "
                    f"(pip install --force-reinstall --no-deps vllm=={install.version})"
                )
            saved[entry.path] = data
    record_backup = _read(
        backups / install.dist_info.name / "RECORD", "moe-patch's backup of RECORD"
    )
    if hashlib.sha256(record_backup).hexdigest() != state.record.get("sha256"):
        raise IntegrityError(
            "moe-patch's backup of RECORD is corrupt; reinstall vllm "
            f"(pip install --force-reinstall --no-deps vllm=={install.version})"
        )
    for entry in state.files:
        path = site / entry.path
        if entry.before is None:
            path.unlink(missing_ok=True)
            for pyc in _pycs(site, entry.path):  # written by Python on import
                (site / pyc).unlink(missing_ok=True)
        else:
            _restore(path, saved[entry.path], entry.before)
    _restore(install.dist_info / "RECORD", record_backup, state.record)
    _remove_partial_writes(install, state)
    for directory in reversed(state.created_dirs):
        pycache = site / directory / "__pycache__"
        with contextlib.suppress(OSError):
            if pycache.is_dir() and not any(pycache.iterdir()):
                pycache.rmdir()
            (site / directory).rmdir()
    (install.state_dir / STATE_FILE).unlink()
    shutil.rmtree(install.state_dir)


# ---------------------------------------------------------------- status


def _now(site: Path, entry: FileState) -> str:
    """``patched``, ``release`` or ``changed``: where one file of the state stands."""
    current = _sha(site / entry.path)
    after = entry.after["sha256"] if entry.after else None
    before = entry.before["sha256"] if entry.before else None
    if entry.change == "compiled":
        # bytecode is derived: Python may rebuild it on import; never a change to protect
        return "release" if current == before else "patched"
    if current == after:
        return "patched"
    if current == before:
        return "release"
    return "changed"


def _fill(report: InstalledReport, state: State, install: Install) -> None:
    report.series_base = state.series_base
    report.moe_patch = state.moe_patch
    report.patches = state.patches
    report.skipped = state.skipped
    report.files = [
        {"path": f.path, "change": f.change, "now": _now(install.site, f)}
        for f in state.files
        if f.change != "compiled"
    ]


def status(target: Path | None = None, settings: Settings | None = None) -> InstalledReport:
    settings = settings or Settings.resolve()
    install = find(target)
    report = InstalledReport("status", install.version, str(install.dist_info), "not patched")
    built = _wheel_build_info(install)
    if built is not None:
        report.state = "moe-patch wheel"
        report.series_base, report.moe_patch = built.get("series_base"), built.get("moe_patch")
        report.patches = built.get("patches", [])
        report.files = [
            {"path": p, "change": "modified", "now": "patched"} for p in built.get("files", [])
        ]
        return report
    state = read_patch_record(install)
    if state is None:
        try:
            chosen = series.for_version(Version(install.version).public, settings.series_root)
            report.series_base = chosen.base
            report.detail = (
                f"series v{chosen.base} serves it ({len(chosen.patches)} patches): "
                "moe-patch apply --installed"
            )
        except UsageError as exc:
            report.detail = exc.message
        return report
    _fill(report, state, install)
    nows = {f["now"] for f in report.files}
    if state.status != APPLIED:
        report.state = "interrupted"
        report.detail = (
            "an apply was interrupted: run moe-patch apply --installed again to finish it, "
            "or revert --installed to undo it"
        )
    elif "changed" in nows:
        report.state = "changed"
        report.detail = "files changed after moe-patch patched them (see below)"
    elif nows == {"release"}:
        report.state = "reinstalled"
        report.detail = "the files are the release's again; run moe-patch revert --installed"
    else:
        report.state = "patched"
    return report
