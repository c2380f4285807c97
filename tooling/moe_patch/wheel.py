"""A patched vLLM wheel made from the official one.

Every patch of the series is Python/Triton only, so the patched wheel is the
official wheel of the release with the series carried onto its ``vllm/`` package
(:mod:`moe_patch.release_diff`), a PEP 440 local version ``X.Y.Z+moe.<series
version>``, and a rewritten ``.dist-info`` (METADATA, RECORD, and a
``moe-patch.json`` that says which series it carries).  Every other member keeps
its compressed bytes: the compiled extensions are copied, not recompressed, so they
are byte-identical to the official wheel's.

The official wheel comes through pip (``pip download``, honouring pip's own
configuration and certificates), is checked against the sha256 the package index
lists for it, and is cached under ``<cache>/wheels/``.  The output is
reproducible: sorted members, one timestamp (``SOURCE_DATE_EPOCH``, else the
newest one in the official wheel), fixed permissions, and rewritten members
stored uncompressed so the bytes do not depend on the local zlib.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from installer.records import Hash, InvalidRecordEntry, RecordEntry, parse_record_file
from packaging import tags as pytags
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version
from wheel.wheelfile import WheelError, WheelFile

from . import __version__, cache, children, index, owners, release_diff, ui
from .errors import LOCAL_IO_WORDS, IntegrityError, LocalIOError, NetworkError, UsageError
from .pipconfig import IndexSettings, index_settings
from .report import as_json

PROJECT = "vllm"
LOCAL_PREFIX = "moe"
BUILD_INFO = "moe-patch.json"  # in the patched wheel's .dist-info
VERSION_MODULE = "vllm/_version.py"
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # PKWARE APPNOTE 4.3.7, local file header
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


# ---------------------------------------------------------------- versions


def local_label(series_version: str = __version__) -> str:
    """``moe.<series version>``, made a valid PEP 440 local segment."""
    return f"{LOCAL_PREFIX}." + re.sub(r"[^A-Za-z0-9]+", ".", series_version).strip(".")


def patched_version(version: str, series_version: str = __version__) -> str:
    parsed = Version(version)
    label = local_label(series_version)
    text = f"{parsed.public}+{parsed.local}.{label}" if parsed.local else f"{parsed}+{label}"
    try:
        return str(Version(text))
    except InvalidVersion:  # pragma: no cover - local_label only makes valid segments
        raise UsageError(f"{text!r} is not a valid PEP 440 version") from None


# ---------------------------------------------------------------- platforms


def platforms_for(platform: str | None) -> list[str]:
    """The platform tags a wheel may carry to install on ``platform`` (default: here)."""
    if platform is None:
        return list(pytags.platform_tags())
    name = platform.strip().replace("-", "_").replace(".", "_")
    for legacy, (major, minor) in _LEGACY_MANYLINUX.items():
        if name.startswith(legacy + "_"):
            name = f"manylinux_{major}_{minor}_{name[len(legacy) + 1 :]}"
    match = _MANYLINUX.match(name)
    if not match:
        return [name]
    major, minor, arch = int(match.group(1)), int(match.group(2)), match.group(3)
    found = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, -1, -1)]
    found += [f"{legacy}_{arch}" for legacy, v in _LEGACY_MANYLINUX.items() if (major, minor) >= v]
    return found


def compatible(filename: str, platforms: list[str]) -> bool:
    supported = set(pytags.cpython_tags(platforms=platforms)) | set(
        pytags.compatible_tags(platforms=platforms)
    )
    return bool(parse_wheel_filename(filename)[3] & supported)


# ---------------------------------------------------------------- the official wheel


def official_wheel(
    version: str, platform: str | None = None, index_url: str | None = None
) -> tuple[Path, index.Distribution]:
    """The official wheel of ``version`` for ``platform``, verified, from the cache or pip."""
    settings = index_settings(index_url)
    platforms = platforms_for(platform)
    listed = index.wheels(settings, version)
    candidates = [w for w in listed if compatible(w.filename, platforms)]
    if not candidates:
        where = platform or "this machine"
        others = ", ".join(sorted({w.filename.rsplit("-", 1)[-1][:-4] for w in listed}))
        raise UsageError(
            f"vLLM {version} has no wheel for {where} on {settings.shown}"
            + (f" (it has: {others}); pass --platform" if others else "")
        )
    directory = cache.subdir("wheels")
    found = _cached(directory, candidates)
    if found:
        _sweep_after_kill(directory, version)
        return found
    with cache.locked(f"wheel-vllm-{version}"):
        found = _cached(directory, candidates)  # another run may have fetched it meanwhile
        if found:
            return found
        cache.remove_leftovers(directory, f"vllm-{version}")
        return _download(version, platform, platforms, settings, directory, listed)


def _sweep_after_kill(directory: Path, version: str) -> None:
    """Remove the scratch folder of a run killed after it put the wheel in place but before
    its clean-up (under the entry's lock, so a live download's scratch is never touched)."""
    name = f"vllm-{version}"
    stale = (f".{name}.part-", f".tmp-{name}-")
    if any(path.name.startswith(stale) for path in directory.iterdir()):
        with cache.locked(f"wheel-{name}"):
            cache.remove_leftovers(directory, name)


def _cached(directory: Path, candidates) -> tuple[Path, index.Distribution] | None:
    for dist in candidates:
        path = directory / dist.filename
        if path.is_file():
            if dist.sha256 and cache.sha256_file(path) == dist.sha256:
                return path, dist
            path.unlink()  # changed on disk since it was verified: fetch it again
    return None


def _download(version, platform, platforms, settings: IndexSettings, directory, listed):
    scratch = Path(tempfile.mkdtemp(dir=directory, prefix=f".tmp-vllm-{version}-"))
    try:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--dest",
            str(scratch),
            "--index-url",
            settings.url,
        ]
        if settings.cert:
            command += ["--cert", settings.cert]
        if platform:
            for tag in platforms:
                command += ["--platform", tag]
        command.append(f"{PROJECT}=={version}")
        interactive = sys.stderr.isatty()
        if not interactive:
            command[4:4] = ["--progress-bar", "off", "--quiet"]
        # pip's own temporary files go in the scratch folder too: a killed pip's are removed
        # with it, never left in the system's /tmp.
        (scratch / "tmp").mkdir()
        env = {**os.environ, "TMPDIR": str(scratch / "tmp")}
        ui.info(f"downloading the official vLLM {version} wheel through pip")
        try:
            done = children.run(
                command,
                env=env,
                stdout=None if interactive else subprocess.PIPE,
                stderr=None if interactive else subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise NetworkError(f"cannot run pip to download the wheel ({exc.strerror})") from None
        if done.returncode != 0:
            if "DO NOT MATCH THE HASHES" in (done.stderr or ""):
                raise IntegrityError(
                    f"the vLLM {version} wheel pip downloaded does not match the index's "
                    "sha256; the download was discarded: retry, and report it if it persists"
                )
            lines = [ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()]
            local = next((ln for ln in lines if LOCAL_IO_WORDS.search(ln)), None)
            if local:
                raise LocalIOError(
                    f"pip could not write the vLLM {version} wheel into the cache ({local}); "
                    "free space or fix permissions, then run the same command again"
                )
            why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), None)
            raise NetworkError(
                f"pip could not download the vLLM {version} wheel "
                f"({why or f'pip exited with {done.returncode}'}); check the network, "
                "--index-url and --platform"
            )
        got = sorted(scratch.glob("*.whl"))
        if len(got) != 1:
            raise NetworkError(f"pip download of vLLM {version} left {len(got)} wheels, not one")
        path = got[0]
        dist = next((w for w in listed if w.filename == path.name), None)
        if dist is None:
            raise IntegrityError(
                f"pip downloaded {path.name}, which the package index {settings.shown} does not "
                "list for this release; nothing was kept"
            )
        if not dist.sha256:
            raise IntegrityError(
                f"the package index lists {dist.filename} without a sha256 hash; "
                "moe-patch only uses verified archives: use an index that publishes hashes"
            )
        digest = cache.sha256_file(path)
        if digest != dist.sha256:
            raise IntegrityError(
                f"{dist.filename} does not match the index's sha256 "
                f"(expected {dist.sha256[:12]}…, got {digest[:12]}…); "
                "the download was discarded: retry, and report it if it persists"
            )
        final = directory / dist.filename
        os.replace(path, final)
        return final, dist
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------- the patched wheel


@dataclass
class WheelResult:
    vllm: str
    version: str  # the patched wheel's version, e.g. 0.21.0+moe.0.1.0
    path: str
    sha256: str
    size: int
    source: str  # the official wheel's file name
    source_sha256: str
    series_base: str
    method: str = "repack"
    patches: list[dict] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)  # carried: path, change
    skipped: list[dict] = field(default_factory=list)  # not at run time: path, patches
    seconds: float = 0.0

    def to_json(self) -> str:
        return as_json(self)


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _timestamp(infos: list[zipfile.ZipInfo]) -> tuple[int, int, int, int, int, int]:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.strip().isdigit():
        return time.gmtime(max(int(epoch), 315532800))[:6]
    return max((i.date_time for i in infos), default=(1980, 1, 1, 0, 0, 0))


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the umask (0644 under umask 022)."""
    umask = os.umask(0o077)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    return 0o666 & ~umask


def _zinfo(name: str, date_time, executable: bool) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=date_time)
    info.create_system = 3  # unix: external_attr carries the permissions
    info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
    return info


def _copy_raw(out: zipfile.ZipFile, src, member: zipfile.ZipInfo, info: zipfile.ZipInfo) -> None:
    """Append ``member`` of the open archive file ``src`` to ``out`` under ``info``,
    copying its compressed bytes as they are (zipfile has no public call for this)."""
    if member.flag_bits & 0x1:
        raise IntegrityError(f"{member.filename} in the official wheel is encrypted")
    src.seek(member.header_offset)
    header = _LOCAL_HEADER.unpack(src.read(_LOCAL_HEADER.size))
    if header[0] != b"PK\x03\x04":
        raise IntegrityError(f"the official wheel is corrupt at {member.filename}")
    src.seek(member.header_offset + _LOCAL_HEADER.size + header[9] + header[10])
    info.compress_type = member.compress_type
    info.CRC, info.compress_size, info.file_size = (
        member.CRC,
        member.compress_size,
        member.file_size,
    )
    info.flag_bits = 0  # sizes and CRC go in the header: no data descriptor
    zip64 = info.file_size > zipfile.ZIP64_LIMIT or info.compress_size > zipfile.ZIP64_LIMIT
    info.header_offset = out.fp.tell()
    out._writecheck(info)
    out._didModify = True
    out.fp.write(info.FileHeader(zip64))
    left = member.compress_size
    while left:
        block = src.read(min(left, 1 << 22))
        if not block:
            raise IntegrityError(f"the official wheel is truncated at {member.filename}")
        out.fp.write(block)
        left -= len(block)
    out.filelist.append(info)
    out.NameToInfo[info.filename] = info
    out.start_dir = out.fp.tell()


def _record(source: WheelFile) -> dict[str, RecordEntry]:
    text = source.read(source.record_path).decode("utf-8")
    entries = {}
    try:
        for row in parse_record_file(text.splitlines()):
            entries[row[0]] = RecordEntry.from_elements(*row)
    except (InvalidRecordEntry, ValueError) as exc:
        raise IntegrityError(f"the official wheel's RECORD is malformed ({exc})") from None
    return entries


def _verify_members(source: WheelFile, names: list[str]) -> None:
    """Read every member through WheelFile, which checks it against RECORD."""
    try:
        for name in names:
            with source.open(name) as handle:
                while handle.read(1 << 22):
                    pass
    except (WheelError, zipfile.BadZipFile, OSError, EOFError) as exc:
        raise IntegrityError(f"the official wheel fails its own RECORD ({exc})") from None


def rewrite_metadata(text: bytes, version: str) -> bytes:
    head, sep, body = text.partition(b"\n\n")
    lines = head.split(b"\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(b"Version:")]
    if len(hits) != 1:
        raise IntegrityError("the official wheel's METADATA has no single Version field")
    lines[hits[0]] = b"Version: " + version.encode()
    return b"\n".join(lines) + sep + body


def rewrite_version_module(text: bytes, version: str) -> bytes | None:
    """``vllm/_version.py`` (setuptools-scm's) saying ``version``; None if it has another form."""
    parsed = Version(version)
    source = text.decode("utf-8")
    items = [*parsed.release] + ([parsed.local] if parsed.local else [])
    new, count = re.subn(
        r"^(__version__\s*=\s*version\s*=\s*)(['\"])[^'\"]*\2",
        lambda m: f"{m.group(1)}{m.group(2)}{version}{m.group(2)}",
        source,
        flags=re.MULTILINE,
    )
    new, count_tuple = re.subn(
        r"^(__version_tuple__\s*=\s*version_tuple\s*=\s*)\([^)]*\)",
        lambda m: m.group(1) + "(" + ", ".join(repr(i) for i in items) + ")",
        new,
        flags=re.MULTILINE,
    )
    if count != 1 or count_tuple > 1:
        return None
    return new.encode("utf-8")


def build(
    source_path: Path,
    source_dist: index.Distribution,
    rdiff: release_diff.ReleaseDiff,
    out_dir: Path,
    series_version: str = __version__,
) -> WheelResult:
    """Write the patched wheel of ``source_path`` into ``out_dir``; return what it holds."""
    _name, src_version, _build, _tags = parse_wheel_filename(source_path.name)
    if str(src_version) != rdiff.version:
        raise IntegrityError(f"{source_path.name} is not a wheel of vLLM {rdiff.version}")
    new_version = patched_version(str(src_version), series_version)
    parts = source_path.name[: -len(".whl")].split("-")  # name-version[-build]-py-abi-platform
    parts[1] = new_version  # build tag and compatibility tags stay the official wheel's
    filename = "-".join(parts) + ".whl"
    try:
        source = WheelFile(source_path)
    except (WheelError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise IntegrityError(f"{source_path.name} is not a readable wheel ({exc})") from None
    with source, open(source_path, "rb") as raw:
        infos = [i for i in source.infolist() if not i.is_dir()]
        old_info = source.dist_info_path
        new_info = f"{PROJECT}-{new_version}.dist-info"
        record = _record(source)
        members = {i.filename: i for i in infos}
        package = {n for n in members if not n.startswith(old_info + "/")}
        unlisted = sorted(n for n in members if n not in record and n != source.record_path)
        if unlisted:
            raise IntegrityError(f"the official wheel has {unlisted[0]}, which RECORD lacks")

        layout = release_diff.plan(rdiff, package, f"the vLLM {rdiff.version} wheel")
        originals = {c.path: source.read(c.path) for c in layout.carried if c.path in package}
        carried = release_diff.carry(
            rdiff, layout.carried, originals, f"the vLLM {rdiff.version} wheel"
        )
        rewritten: dict[str, tuple[bytes, bool]] = {}
        for path, result in carried.items():
            if result.data is not None:
                rewritten[path] = (result.data, result.executable)
        if VERSION_MODULE in package and VERSION_MODULE not in carried:
            text = rewrite_version_module(source.read(VERSION_MODULE), new_version)
            if text is None:
                ui.warn(f"{VERSION_MODULE} has an unknown form; it keeps saying {src_version}")
            else:
                rewritten[VERSION_MODULE] = (text, _executable(members[VERSION_MODULE]))
        deleted = {p for p, r in carried.items() if r.data is None}
        _verify_members(source, sorted(package - set(rewritten) - deleted))

        date_time = _timestamp(infos)
        payload = sorted((package - deleted) | set(rewritten))
        info_files = sorted(
            n[len(old_info) + 1 :]
            for n in members
            if n.startswith(old_info + "/") and n != source.record_path
        )
        build_info = _build_info(rdiff, source_dist, layout, series_version)
        metadata = rewrite_metadata(source.read(f"{old_info}/METADATA"), new_version)

        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / filename
        owners.sweep(out_dir, f".{filename}.part-")  # what a killed run left half-written
        fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=f".{filename}.part-{owners.tag()}-")
        os.fchmod(fd, _new_file_mode())  # mkstemp's 0600 is for the unfinished file only
        os.close(fd)
        tmp = Path(tmp_name)
        rows: list[RecordEntry] = []
        try:
            with zipfile.ZipFile(tmp, "w", allowZip64=True) as out:

                def put(arcname: str, data: bytes, executable: bool = False) -> None:
                    out.writestr(_zinfo(arcname, date_time, executable), data, zipfile.ZIP_STORED)
                    digest = Hash("sha256", _b64(hashlib.sha256(data).digest()))
                    rows.append(RecordEntry(arcname, digest, len(data)))

                for path in payload:
                    if path in rewritten:
                        put(path, *rewritten[path])
                    else:
                        member = members[path]
                        _copy_raw(out, raw, member, _zinfo(path, date_time, _executable(member)))
                        rows.append(record[path])
                extra = {"METADATA": metadata, BUILD_INFO: build_info}
                for leaf in sorted(set(info_files) | set(extra)):
                    arcname = f"{new_info}/{leaf}"
                    if leaf in extra:
                        put(arcname, extra[leaf])
                    else:
                        member = members[f"{old_info}/{leaf}"]
                        _copy_raw(out, raw, member, _zinfo(arcname, date_time, False))
                        old = record[member.filename]
                        rows.append(RecordEntry(arcname, old.hash_, old.size))
                record_path = f"{new_info}/RECORD"
                rows.append(RecordEntry(record_path, None, None))
                text = io.StringIO()
                writer = csv.writer(text, delimiter=",", quotechar='"', lineterminator="\n")
                writer.writerows(row.to_row() for row in rows)
                out.writestr(
                    _zinfo(record_path, date_time, False),
                    text.getvalue().encode("utf-8"),
                    zipfile.ZIP_STORED,
                )
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    result = wheel_result(final, new_version, source_path, source_dist, rdiff, layout)
    if VERSION_MODULE in rewritten and VERSION_MODULE not in carried:
        result.files.append({"path": VERSION_MODULE, "change": "version", "patches": []})
    return result


def wheel_result(
    path: Path,
    new_version: str,
    source_path: Path,
    source_dist: index.Distribution,
    rdiff: release_diff.ReleaseDiff,
    layout,
    method: str = "repack",
) -> WheelResult:
    """The report of a built wheel: what it is, what it came from, what changed."""
    return WheelResult(
        vllm=rdiff.version,
        version=new_version,
        path=str(path),
        sha256=cache.sha256_file(path),
        size=path.stat().st_size,
        source=source_path.name,
        source_sha256=source_dist.sha256 or "",
        series_base=rdiff.series_base,
        method=method,
        patches=_outcomes(rdiff),
        files=[{"path": c.path, "change": c.kind, "patches": c.patches} for c in layout.carried],
        skipped=[{"path": c.path, "patches": c.patches} for c in layout.skipped],
    )


def _executable(member: zipfile.ZipInfo) -> bool:
    return bool((member.external_attr >> 16) & 0o111)


def _outcomes(rdiff: release_diff.ReleaseDiff) -> list[dict]:
    return [
        {"id": o.id, "status": o.status, "detail": o.detail or o.upstream_status}
        for o in rdiff.report.outcomes
    ]


def _build_info(rdiff, source_dist, layout, series_version: str) -> bytes:
    """What the wheel carries, for ``moe-patch status --installed`` and for people."""
    data = {
        "moe_patch": series_version,
        "vllm": rdiff.version,
        "series_base": rdiff.series_base,
        "official_wheel": {"filename": source_dist.filename, "sha256": source_dist.sha256},
        "patches": [
            {
                "id": o.id,
                "status": o.status,
                "sha256": rdiff.patch_sha256.get(o.id, ""),
            }
            for o in rdiff.report.outcomes
        ],
        "files": sorted(c.path for c in layout.carried),
        "skipped": sorted(c.path for c in layout.skipped),
    }
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


# ---------------------------------------------------------------- --method precompiled


def build_precompiled(
    tree: Path,
    official: Path,
    version: str,
    out_dir: Path,
    build_isolation: bool = True,
) -> Path:
    """vLLM's own Python-only build of the patched ``tree``: its ``setup.py`` with
    ``VLLM_USE_PRECOMPILED=1`` takes the compiled files from ``official``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    owners.sweep(out_dir, ".precompiled-")  # a killed run's
    with tempfile.TemporaryDirectory(
        dir=out_dir, prefix=f".precompiled-{owners.tag()}-"
    ) as scratch:
        env = dict(os.environ)
        (Path(scratch) / "tmp").mkdir()
        env.update(
            {
                "TMPDIR": str(Path(scratch) / "tmp"),  # pip's build trees: removed with scratch
                "VLLM_USE_PRECOMPILED": "1",
                "VLLM_PRECOMPILED_WHEEL_LOCATION": str(official),
                # setup.py would add "+precompiled"; we give the version ourselves
                "VLLM_VERSION_OVERRIDE": version,
                "SETUPTOOLS_SCM_PRETEND_VERSION": version,
            }
        )
        command = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--disable-pip-version-check",
            "--wheel-dir",
            scratch,
            str(tree),
        ]
        if not build_isolation:
            command.insert(5, "--no-build-isolation")
        ui.info("building the patched tree with vLLM's setup.py (VLLM_USE_PRECOMPILED=1)")
        done = children.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr if sys.stderr.isatty() else subprocess.PIPE,
            stderr=None if sys.stderr.isatty() else subprocess.STDOUT,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            lines = [ln.strip() for ln in (done.stdout or "").splitlines() if ln.strip()]
            tail = lines[-1] if lines else f"pip exited with {done.returncode}"
            raise UsageError(
                f"vLLM's precompiled build of the patched tree failed ({tail}); "
                "the default method (--method repack) needs no build"
            )
        built = sorted(Path(scratch).glob("*.whl"))
        if len(built) != 1:
            raise UsageError(f"vLLM's precompiled build made {len(built)} wheels, not one")
        final = out_dir / built[0].name
        os.replace(built[0], final)
    return final
