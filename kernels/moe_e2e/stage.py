"""Put the end-to-end bundle together on the GPU machine and install both vLLMs side by side.

    python -m moe_e2e.stage --parts .e2e/bundle --into ~/moe-e2e

Parts may arrive over several calls: each run moves the parts it finds (checked against
``bundle.json``) to ``--into``; once all are there it checks the payload's sha256, unpacks it
and installs

* ``site-official``: every member of the official wheel but the dropped ones, each checked
  against the wheel's RECORD;
* ``site-patched``: the same files with the patched wheel's members in place, every file
  checked against the patched wheel's RECORD, so it holds what installing that wheel gives;
* ``site-deps``: the engine's missing packages (``pip install --no-index --target``), and
  FlashInfer modules built ahead of time in FlashInfer's AOT folder;
* ``models``: the model configurations;

and compiles every site's bytecode, as installing with pip does.

It prints what is still missing and exits 0 until every part is there; 1 on a checksum or
install failure.  A finished install is not redone.
"""

from __future__ import annotations

import argparse
import compileall
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from .bundle import record_digest, record_hashes, sha256_file


class StageError(Exception):
    pass


def collect_parts(source: Path, into: Path) -> tuple[dict, list[str]]:
    """Move the parts found in ``source`` to ``into/parts``; return the bundle and what is missing."""
    parts_dir = into / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    listing = source / "bundle.json"
    if listing.exists():
        shutil.copyfile(listing, into / "bundle.json")
    if not (into / "bundle.json").exists():
        raise StageError(f"no bundle.json in {source} or {into}: carry it with the first part")
    bundle = json.loads((into / "bundle.json").read_text())
    missing = []
    for part in bundle["parts"]:
        target = parts_dir / part["name"]
        found = source / part["name"]
        if not target.exists() and found.exists():
            if sha256_file(found) != part["sha256"]:
                raise StageError(f"{found} does not match bundle.json: carry it again")
            shutil.copyfile(found, target)
        if not target.exists():
            missing.append(part["name"])
    return bundle, missing


def assemble(bundle: dict, into: Path) -> Path:
    payload = into / "payload.tar"
    with open(payload, "wb") as out:
        for part in bundle["parts"]:
            with open(into / "parts" / part["name"], "rb") as handle:
                shutil.copyfileobj(handle, out)
    if sha256_file(payload) != bundle["payload_sha256"]:
        raise StageError("the assembled payload does not match bundle.json's sha256")
    unpacked = into / "payload"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(payload) as tar:
        tar.extractall(unpacked, filter="data")
    return unpacked


def rebuild_official(payload: Path, manifest: dict, into: Path) -> Path:
    """The official wheel with its dropped members' bytes zeroed, from the shipped segments."""
    spec = manifest["official_wheel"]
    wheel = into / spec["file"]
    with open(payload / "vllm-official.segments", "rb") as body, open(wheel, "wb") as out:
        out.truncate(spec["size"])
        for offset, length in spec["segments"]:
            out.seek(offset)
            out.write(body.read(length))
    return wheel


def extract_checked(wheel: Path, target: Path, skip: set[str]) -> int:
    """Install ``wheel``'s members (but ``skip``) into ``target``, each checked against RECORD."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        hashes = record_hashes(archive)
        for info in archive.infolist():
            name = info.filename
            if info.is_dir() or name in skip:
                continue
            data = archive.read(name)
            expected = hashes.get(name)
            if expected is not None and expected != record_digest(data):
                raise StageError(f"{wheel.name}: {name} does not match the wheel's RECORD")
            path = target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            count += 1
    return count


def install_patched(official_site: Path, overlay: Path, target: Path, skip: set[str]) -> int:
    """The official install with the patched wheel's own members, checked against its RECORD."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(official_site, target, copy_function=os.link)
    for dist_info in target.glob("*.dist-info"):
        shutil.rmtree(dist_info)
    with zipfile.ZipFile(overlay) as archive:
        for name in archive.namelist():
            path = target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a hard link into site-official: never write through it
            path.write_bytes(archive.read(name))
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        hashes = record_hashes(archive)
    checked = 0
    for name, expected in hashes.items():
        if name in skip:
            continue
        path = target / name
        if not path.exists() or record_digest(path.read_bytes()) != expected:
            raise StageError(f"patched install: {name} does not match {record}")
        checked += 1
    return checked


def install_dependencies(payload: Path, manifest: dict, target: Path) -> None:
    wheels = sorted((payload / "deps").glob("*.whl"))
    for wheel in wheels:
        if sha256_file(wheel) != manifest["dependencies"].get(wheel.name):
            raise StageError(f"{wheel.name} does not match the manifest")
    shutil.rmtree(target, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--target",
        str(target),
        *map(str, wheels),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise StageError("pip could not install the bundled packages: " + result.stderr[-400:])


def install_prebuilt(payload: Path, manifest: dict, site: Path) -> None:
    """FlashInfer modules built ahead of time go where FlashInfer looks before compiling:
    ``flashinfer/data/aot/<module>/<module>.so``."""
    for name, digest in manifest.get("flashinfer_aot", {}).items():
        if not (site / "flashinfer").is_dir():
            raise StageError(f"{name} is a FlashInfer module, but FlashInfer is not bundled")
        target = site / "flashinfer" / "data" / "aot" / Path(name).stem / name
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with lzma.open(payload / "flashinfer-aot" / f"{name}.xz") as packed:
                with open(partial, "wb") as out:
                    shutil.copyfileobj(packed, out, 1 << 20)
        except (OSError, EOFError, lzma.LZMAError) as error:
            partial.unlink(missing_ok=True)
            raise StageError(f"{name} could not be unpacked: {error}") from None
        if sha256_file(partial) != digest:
            partial.unlink()
            raise StageError(f"{name} does not match the manifest")
        partial.replace(target)


def compile_bytecode(site: Path) -> None:
    """Every module's bytecode, as pip's install writes it and unpacking does not: otherwise
    the first engine on a machine compiles it while it starts (20-25 s measured on an H200
    machine's first engine against the next ones) and start-up depends on engine order.
    A module that does not compile for this Python is left to fail where it is imported."""
    compileall.compile_dir(site, quiet=2, workers=0)


def stage(source: Path, into: Path) -> dict | None:
    # Absolute (not resolved: a symlinked folder keeps its name), so the engines and
    # the GPU test find the sites from any working directory.
    into = into.absolute()
    into.mkdir(parents=True, exist_ok=True)
    done = into / "staged.json"
    bundle, missing = collect_parts(source, into)
    if done.exists() and json.loads(done.read_text())["payload_sha256"] == bundle["payload_sha256"]:
        return json.loads(done.read_text())
    if missing:
        print(f"moe_e2e.stage: waiting for {', '.join(missing)} of {len(bundle['parts'])} parts")
        return None
    payload = assemble(bundle, into)
    manifest = json.loads((payload / "manifest.json").read_text())
    skip = set(manifest["official_wheel"]["dropped"])
    wheel = rebuild_official(payload, manifest, into)
    official_files = extract_checked(wheel, into / "site-official", skip)
    patched_files = install_patched(
        into / "site-official", payload / "vllm-patched-overlay.zip", into / "site-patched", skip
    )
    install_dependencies(payload, manifest, into / "site-deps")
    install_prebuilt(payload, manifest, into / "site-deps")
    for site in ("site-official", "site-patched", "site-deps"):
        compile_bytecode(into / site)
    shutil.rmtree(into / "models", ignore_errors=True)
    shutil.copytree(payload / "models", into / "models")
    for leftover in (into / "payload.tar", wheel):
        leftover.unlink()
    shutil.rmtree(into / "parts")
    summary = {
        "payload_sha256": bundle["payload_sha256"],
        "vllm": manifest["vllm"],
        "series_version": manifest["series_version"],
        "series_commit": manifest.get("series_commit"),  # bundles before 2026-12-06 lack it
        "official_wheel": {
            k: manifest["official_wheel"][k] for k in ("file", "sha256", "index_sha256", "dropped")
        },
        "patched_wheel": {
            k: manifest["patched_wheel"][k]
            for k in ("file", "sha256", "version", "overlay_members")
        },
        "official_files_checked": official_files,
        "patched_files_checked": patched_files,
        "dependencies": sorted(manifest["dependencies"]),
        "flashinfer_aot": sorted(manifest.get("flashinfer_aot", {})),
        # How each prebuilt module was built (moe_e2e.flashinfer_aot's summary: its kernel set)
        "flashinfer_aot_builds": manifest.get("flashinfer_aot_builds", {}),
        "sites": {
            "official": str(into / "site-official"),
            "patched": str(into / "site-patched"),
            "deps": str(into / "site-deps"),
        },
        "models": str(into / "models"),
    }
    done.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_e2e.stage", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--parts", type=Path, default=Path(".e2e/bundle"))
    parser.add_argument("--into", type=Path, default=Path("~/moe-e2e").expanduser())
    args = parser.parse_args(argv)
    try:
        summary = stage(args.parts, args.into)
    except StageError as error:
        print(f"moe_e2e.stage: {error}", file=sys.stderr)
        return 1
    if summary:
        print(
            f"moe_e2e.stage: vLLM {summary['vllm']} official ({summary['official_files_checked']} "
            f"files) and {summary['patched_wheel']['version']} ({summary['patched_files_checked']} "
            f"files) installed under {args.into}, every file checked against its wheel's RECORD"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
