"""Collect what the end-to-end benchmark needs on a GPU machine that has no network.

    python -m moe_patch.harness_wheels --vllm 0.21 --out .e2e/wheels
    python -m moe_e2e.bundle --wheels .e2e/wheels --out .e2e/bundle [--part-mib 45]

The first command (moe-patch's) puts the official wheel of the release and the wheel
``moe-patch wheel`` builds from it into ``.e2e/wheels``, described in ``wheels.json`` (the
release, the series version and commit, each wheel's sha256); this module takes that folder
as it is and imports nothing of moe-patch.  It writes ``payload.tar`` split into parts of at
most ``--part-mib`` MiB (``part-01`` ...) and ``bundle.json`` (each part's and the whole
payload's sha256), so the bundle can travel in pieces.  The payload holds:

* the official vLLM wheel of the release as byte segments: every byte except the members
  named by ``--drop`` (by default the FlashAttention-2 extension, 81 MB that Hopper never loads: vLLM uses FlashAttention 3 there),
  the API server's Swagger page script and the extension modules built for other Pythons than
  the GPU machine's (DeepGEMM ships one per CPython version);
  ``moe_e2e.stage`` re-creates the wheel with the dropped spans zeroed and installs every other
  member after checking it against the wheel's own RECORD;
* the members in which the wheel that ``moe-patch wheel`` builds differs from the official one
  (its dist-info and the patched files), so the patched install is the official one with those
  members replaced, checked against the patched wheel's RECORD;
* the Python packages vLLM imports on the engine's path that the GPU image lacks, as wheels for
  the GPU machine's Python (``--python-version``), downloaded through pip and so from pip's
  configured index;
* the model configurations (``moe_e2e.models``).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import lzma
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import models

# xz preset of the prebuilt FlashInfer modules: 1 packs 233 MiB in seconds, within a few
# percent of the slow presets.
AOT_XZ_PRESET = 1

# Packages vLLM 0.21 imports when it starts an engine (AsyncLLM, V1 engine core, GPU worker,
# Qwen3-MoE / Mixtral, FP8 and compressed-tensors MoE, FlashAttention backend) that the H200
# image lacks (docs/benchmarks.md says how the list was found).  Exact versions, so two bundles
# of the same release install the same code; where a release's own requirement excludes one,
# ``engine_requirements`` takes that requirement instead (the bundle records each wheel's hash).
ENGINE_DEPENDENCIES = (
    "annotated-types==0.8.0",
    "apache-tvm-ffi==0.1.9",
    "astor==0.8.1",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "compressed-tensors==0.15.0.1",
    "depyf==0.20.0",
    "dill==0.4.1",
    "distro==1.9.0",
    "fastapi==0.165.0",
    "gguf==0.19.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "jiter==0.19.0",
    "llguidance==1.3.0",
    "loguru==0.7.3",
    "msgspec==0.23.0",
    "openai==3.57.0",
    "openai-harmony==0.0.8",
    "opentelemetry-api==1.45.2",
    "partial-json-parser==0.2.1.1.post7",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "pyzmq==27.3.0",
    "setproctitle==1.3.8",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "truststore==0.10.5",
    "typing-inspection==0.4.5",
    "xgrammar==0.2.6",
)
GPU_PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_33_x86_64",
    "manylinux_2_32_x86_64",
    "manylinux_2_31_x86_64",  # llguidance 1.7 (vLLM 0.25)
    "manylinux_2_30_x86_64",
    "manylinux_2_29_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
DEFAULT_DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",)
# Left out too where the wheel has them: the API server's Swagger page script (no engine
# serves that page here)...
UNUSED_ASSETS = ("vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js",)
# ...and extension modules for a CPython other than the GPU machine's (``.cpython-312-``).
VERSIONED_EXTENSION = re.compile(r"\.cpython-(\d+)-[^/]*\.so$")
BENCH_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "tiny-qwen3-moe")
WHEELS_MANIFEST = "wheels.json"  # what moe_patch.harness_wheels writes beside the wheels


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_hashes(archive: zipfile.ZipFile) -> dict[str, str]:
    """A wheel's RECORD as {member: 'sha256=<urlsafe b64>'} (members without a hash left out)."""
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
    rows = csv.reader(io.StringIO(archive.read(name).decode("utf-8")))
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1]}


def record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def member_span(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> tuple[int, int]:
    """Byte range of a member in the archive: local header through the end of its data."""
    offsets = sorted(i.header_offset for i in archive.infolist()) + [archive.start_dir, size]
    end = min(o for o in offsets if o > info.header_offset)
    return info.header_offset, end


def unused_members(wheel: Path, python_version: str) -> tuple[str, ...]:
    """Members no engine on the GPU machine's ``python_version`` loads: ``UNUSED_ASSETS`` and
    extension modules built for another CPython."""
    tag = python_version.replace(".", "")
    with zipfile.ZipFile(wheel) as archive:
        return tuple(
            name
            for name in archive.namelist()
            if name in UNUSED_ASSETS
            or ((found := VERSIONED_EXTENSION.search(name)) and found.group(1) != tag)
        )


def kept_segments(wheel: Path, drop: tuple[str, ...]) -> tuple[list[list[int]], list[str]]:
    """The wheel's byte ranges with the members in ``drop`` left out, and the dropped names."""
    size = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        missing = [d for d in drop if d not in names]
        if missing:
            raise SystemExit(f"moe_e2e.bundle: {wheel.name} has no member {missing[0]} to drop")
        holes = sorted(member_span(archive, archive.getinfo(d), size) for d in drop)
    segments, position = [], 0
    for start, end in holes:
        if start > position:
            segments.append([position, start - position])
        position = end
    if position < size:
        segments.append([position, size - position])
    return segments, sorted(drop)


def patched_overlay(official: Path, patched: Path) -> tuple[bytes, list[str]]:
    """A zip of the patched wheel's members that the official wheel lacks or holds otherwise."""
    with zipfile.ZipFile(official) as old, zipfile.ZipFile(patched) as new:
        old_hashes = record_hashes(old)
        changed = [
            info.filename
            for info in new.infolist()
            if not info.is_dir()
            and (
                ".dist-info/" in info.filename
                or old_hashes.get(info.filename) is None
                or old_hashes[info.filename] != record_digest(new.read(info.filename))
            )
        ]
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as overlay:
            for name in sorted(changed):
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = new.getinfo(name).external_attr
                overlay.writestr(info, new.read(name), zipfile.ZIP_DEFLATED)
    return buffer.getvalue(), sorted(changed)


def wheel_requirements(wheel: Path, python_version: str = "3.12") -> dict[str, Requirement]:
    """The wheel's ``Requires-Dist`` lines that hold on the GPU machine (Linux x86_64, CPython
    ``python_version``, no extra), by canonical name."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode("utf-8").splitlines()
    machine = {
        "platform_machine": "x86_64",
        "platform_system": "Linux",
        "sys_platform": "linux",
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "extra": "",
    }
    found = {}
    for line in lines:
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(machine):
                found[canonicalize_name(requirement.name)] = requirement
    return found


def pinned_requirement(wheel: Path, name: str) -> str:
    """The ``name==version`` the wheel's own METADATA pins (vLLM pins FlashInfer exactly)."""
    requirement = wheel_requirements(wheel).get(canonicalize_name(name))
    pins = [spec for spec in requirement.specifier if spec.operator == "=="] if requirement else []
    if not pins:
        raise SystemExit(f"moe_e2e.bundle: {wheel.name} pins no {name}==VERSION")
    return f"{requirement.name}=={pins[0].version}"


def engine_requirements(wheel: Path, python_version: str = "3.12") -> list[str]:
    """``ENGINE_DEPENDENCIES`` for the release of ``wheel``: each at the list's version where
    the release's own requirement allows it, else at the release's requirement (0.25.1 pins
    compressed-tensors 0.17.0 and keeps fastapi below 0.137, where the list, found on 0.21,
    has 0.15.0.1 and 0.165.0)."""
    required = wheel_requirements(wheel, python_version)
    chosen = []
    for listed in map(Requirement, ENGINE_DEPENDENCIES):
        own = required.get(canonicalize_name(listed.name))
        version = next(iter(listed.specifier)).version
        keep = own is None or not own.specifier or own.specifier.contains(version, prereleases=True)
        chosen.append(str(listed) if keep else f"{listed.name}{own.specifier}")
    return chosen


def download_dependencies(directory: Path, python_version: str, requirements) -> list[Path]:
    """``pip download`` the engine's missing packages for the GPU machine (pip's own index)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--dest",
        str(directory),
    ]
    for platform in GPU_PLATFORMS:
        command += ["--platform", platform]
    result = subprocess.run(command + list(requirements), capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise SystemExit(f"moe_e2e.bundle: pip could not download the engine's packages: {last}")
    return sorted(directory.glob("*.whl"))


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_payload(
    path: Path,
    official: Path,
    segments,
    patched_zip: bytes,
    deps: list[Path],
    manifest: dict,
    prebuilt: tuple[Path, ...] = (),
) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, "manifest.json", json.dumps(manifest, indent=2).encode())
        with open(official, "rb") as handle:
            body = bytearray()
            for offset, length in segments:
                handle.seek(offset)
                body += handle.read(length)
        add_bytes(tar, "vllm-official.segments", bytes(body))
        add_bytes(tar, "vllm-patched-overlay.zip", patched_zip)
        for wheel in deps:
            add_bytes(tar, f"deps/{wheel.name}", wheel.read_bytes())
        for library in prebuilt:
            # CUDA fatbins compress about 9:1 (FlashInfer's SM90 MoE module: 233 -> 26 MiB;
            # its FP8 build 29 -> 2.9 MiB),
            # and every bundle part is a GPU call of its own.
            packed = lzma.compress(library.read_bytes(), preset=AOT_XZ_PRESET)
            add_bytes(tar, f"flashinfer-aot/{library.name}.xz", packed)
        for model in BENCH_MODELS:
            for kind in models.FP8_KINDS:
                text = models.config_json(model, kind)
                add_bytes(tar, f"models/{model}-{kind}/config.json", text.encode())


def split(path: Path, out: Path, part_bytes: int) -> list[dict]:
    parts = []
    with open(path, "rb") as handle:
        for number, block in enumerate(iter(lambda: handle.read(part_bytes), b""), start=1):
            name = f"part-{number:02d}"
            (out / name).write_bytes(block)
            parts.append({"name": name, "size": len(block), "sha256": sha256_bytes(block)})
    return parts


def read_wheels(folder: Path) -> dict:
    """``wheels.json`` of ``folder`` (``python -m moe_patch.harness_wheels``), each wheel
    checked against the sha256 it records; SystemExit naming what is missing or changed."""
    try:
        described = json.loads((folder / WHEELS_MANIFEST).read_text())
    except (OSError, ValueError):
        raise SystemExit(
            f"{folder} has no readable {WHEELS_MANIFEST}; make it with "
            f"python -m moe_patch.harness_wheels --vllm VERSION --out {folder}"
        ) from None
    for role in ("official", "patched"):
        wheel = folder / described[role]["file"]
        if not wheel.is_file() or sha256_file(wheel) != described[role]["sha256"]:
            raise SystemExit(
                f"{wheel} is missing or not the wheel {WHEELS_MANIFEST} "
                "describes; make the folder again"
            )
    return described


def build(
    wheels: Path,
    out: Path,
    part_mib: int,
    python_version: str,
    drop,
    with_flashinfer: bool = False,
    flashinfer_aot: tuple[Path, ...] = (),
) -> dict:
    """Write the bundle's parts to ``out`` from the two wheels in ``wheels``
    (:func:`read_wheels`).  ``flashinfer_aot``: FlashInfer JIT modules built ahead of time
    (``moe_e2e.flashinfer_aot``), carried with FlashInfer into its AOT folder."""
    with_flashinfer = with_flashinfer or bool(flashinfer_aot)
    described = read_wheels(wheels)
    official = wheels / described["official"]["file"]
    patched = wheels / described["patched"]["file"]
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("part-*"):
        stale.unlink()
    with tempfile.TemporaryDirectory(prefix="moe-e2e-") as scratch:
        scratch = Path(scratch)
        drop = (*drop, *unused_members(official, python_version))
        segments, dropped = kept_segments(official, drop)
        overlay, changed = patched_overlay(official, patched)
        requirements = engine_requirements(official, python_version)
        if with_flashinfer:
            requirements.append(pinned_requirement(official, "flashinfer-python"))
        deps = download_dependencies(scratch / "deps", python_version, requirements)
        manifest = {
            "vllm": described["vllm"],
            "series_version": described["series_version"],
            "series_commit": described["series_commit"],
            "official_wheel": {
                **described["official"],
                "segments": segments,
                "dropped": dropped,
            },
            "patched_wheel": {**described["patched"], "overlay_members": changed},
            "dependencies": {w.name: sha256_file(w) for w in deps},
            "flashinfer_aot": {library.name: sha256_file(library) for library in flashinfer_aot},
            "flashinfer_aot_builds": {
                library.name: json.loads(library.with_suffix(".json").read_text())
                for library in flashinfer_aot
                if library.with_suffix(".json").is_file()
            },
            "python_version": python_version,
        }
        payload = scratch / "payload.tar"
        write_payload(payload, official, segments, overlay, deps, manifest, flashinfer_aot)
        parts = split(payload, out, part_mib << 20)
        summary = {
            "vllm": described["vllm"],
            "series_version": described["series_version"],
            "series_commit": described["series_commit"],
            "payload_sha256": sha256_file(payload),
            "payload_size": payload.stat().st_size,
            "parts": parts,
            "official_wheel_sha256": described["official"]["sha256"],
            "patched_wheel_sha256": described["patched"]["sha256"],
        }
    (out / "bundle.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_e2e.bundle", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path(".e2e/wheels"),
        help="the folder python -m moe_patch.harness_wheels made (default: .e2e/wheels)",
    )
    parser.add_argument("--out", type=Path, default=Path(".e2e/bundle"))
    parser.add_argument(
        "--part-mib", type=int, default=45, help="largest part (MiB; default fits a 64 MiB call)"
    )
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    parser.add_argument(
        "--drop",
        action="append",
        default=None,
        help=f"wheel member left out (default: {', '.join(DEFAULT_DROP)})",
    )
    parser.add_argument(
        "--with-flashinfer",
        action="store_true",
        help="also bundle flashinfer-python at the release's pin (its kernels are JIT-built "
        "with the GPU machine's nvcc on first use)",
    )
    parser.add_argument(
        "--flashinfer-aot",
        type=Path,
        action="append",
        default=[],
        metavar="LIBRARY",
        help="a FlashInfer module built ahead of time (python -m moe_e2e.flashinfer_aot), "
        "installed into FlashInfer's AOT folder so it is not compiled there; implies "
        "--with-flashinfer",
    )
    args = parser.parse_args(argv)
    for library in args.flashinfer_aot:
        if not library.is_file():
            parser.error(
                f"--flashinfer-aot {library}: no such file (python -m moe_e2e.flashinfer_aot)"
            )
    summary = build(
        args.wheels,
        args.out,
        args.part_mib,
        args.python_version,
        args.drop if args.drop is not None else DEFAULT_DROP,
        args.with_flashinfer,
        tuple(args.flashinfer_aot),
    )
    sizes = ", ".join(f"{p['name']} {p['size'] / 2**20:.1f} MiB" for p in summary["parts"])
    print(f"vLLM {summary['vllm']} bundle in {args.out}: {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
