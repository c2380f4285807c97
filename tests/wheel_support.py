"""Helpers for the wheel and installed-vLLM tests: synthetic wheels, installs, RECORD checks."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from support import release_files

# Stands in for a compiled extension: bytes no patch may change.
COMPILED = "vllm/_C.abi3.so"
COMPILED_BYTES = bytes(range(256)) * 4096 + b"\x7fELF tail"
WHEEL_NAME = "vllm-{version}-1-py3-none-any.whl"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(version: str, files: dict[str, str] | None = None, tag: str = "py3-none-any"):
    """(filename, bytes) of a wheel laid out like vLLM's: the release's ``vllm/`` files,
    a stand-in compiled module, and a dist-info with a correct RECORD."""
    source = files or release_files(version)
    members: dict[str, bytes] = {
        path: text.encode() for path, text in source.items() if path.startswith("vllm/")
    }
    members[COMPILED] = COMPILED_BYTES
    info = f"vllm-{version}.dist-info"
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\nRequires-Dist: torch\n\n"
        "# vLLM\n\nVersion: not a header in the body\n"
    ).encode()
    members[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n\n"
    ).encode()
    members[f"{info}/entry_points.txt"] = b"[console_scripts]\nvllm = vllm:main\n"
    members[f"{info}/top_level.txt"] = b"vllm\n"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in members.items():
        writer.writerow([name, f"sha256={_b64(data)}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    members[f"{info}/RECORD"] = record.getvalue().encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    filename = f"vllm-{version}-1-{tag}.whl"
    return filename, buffer.getvalue()


def add_wheel(fake_index, version: str, files=None, tag: str = "py3-none-any") -> str:
    filename, data = make_wheel(version, files, tag)
    fake_index.archives[filename] = data
    return filename


def pip_install(wheel: Path, target: Path) -> Path:
    """``pip install --no-deps --target``: the product's users install it this way."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        detail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise AssertionError(f"pip install {wheel.name} failed: " + " | ".join(detail))
    return target


def record_problems(site: Path) -> list[str]:
    """Every RECORD entry of each dist-info under ``site`` whose file is missing or
    whose hash or size is wrong (entries without a hash are only checked to exist)."""
    problems = []
    for record in site.glob("*.dist-info/RECORD"):
        for row in csv.reader(record.read_text().splitlines()):
            path, digest, size = row
            if path.startswith("../"):
                continue  # scripts: pip --target records them relative to its staging dir
            target = (site / path).resolve()
            if not target.is_file():
                if digest:
                    problems.append(f"missing {path}")
                continue
            if not digest:
                continue
            data = target.read_bytes()
            algo, _, value = digest.partition("=")
            if algo != "sha256" or value != _b64(data) or int(size) != len(data):
                problems.append(f"bad hash {path}")
    return problems


def zip_record_problems(wheel: Path) -> list[str]:
    """Every member of a wheel checked against its RECORD, both ways."""
    from wheel.wheelfile import WheelError, WheelFile

    problems = []
    with WheelFile(wheel) as archive:
        listed = set()
        for row in csv.reader(archive.read(archive.record_path).decode().splitlines()):
            listed.add(row[0])
        for name in archive.namelist():
            if name not in listed:
                problems.append(f"unlisted {name}")
            if name == archive.record_path:
                continue
            try:
                archive.read(name)
            except WheelError as exc:
                problems.append(str(exc))
        problems += [f"listed but absent {n}" for n in listed - set(archive.namelist())]
    return problems
