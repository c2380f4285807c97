"""Build FlashInfer's SM90 CUTLASS fused-MoE module on a machine without a GPU.

    python -m moe_e2e.flashinfer_aot --vllm 0.21 --out .e2e/flashinfer [--jobs 2]

With FlashInfer installed, vLLM 0.21.0 sends per-tensor FP8 MoE with static activation scales
on Hopper to FlashInfer's CUTLASS MoE GEMMs, which FlashInfer compiles with nvcc on first use:
182 translation units (about 2 minutes and 6 GB each on one core), more than a GPU session
can spend.  This builds the same module ahead of time, at the FlashInfer version the release
pins, with FlashInfer's own build description (its ``gen_cutlass_fused_moe_sm90_module``
writes the ninja file) and this machine's nvcc, which must be the GPU machine's major version.
``moe_e2e.bundle --flashinfer-aot OUT/fused_moe_90.so`` carries the library into FlashInfer's
ahead-of-time folder on the GPU machine, where FlashInfer loads it instead of compiling.

The build runs in ``--work`` (default: a folder in the user cache), so an interrupted build
resumes where it stopped: ninja keeps every finished object.  What the headers need that the
CUDA toolkit here may lack (cuBLAS, cuRAND, NVRTC) comes from NVIDIA's wheels through pip.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

MODULE = "fused_moe_90"
ARCH = "9.0a"
# What imports FlashInfer's build description (not what the built library links).
IMPORT_PACKAGES = ("ninja", "nvidia-ml-py", "einops", "tabulate", "tqdm")
# Headers and the NVRTC library the CUDA sources include and link, for CUDA 13.
CUDA_WHEELS = (
    "nvidia-cublas==13.10.0.20",
    "nvidia-curand==10.4.5.25",
    "nvidia-cuda-nvrtc==13.5.37",
)


class BuildError(Exception):
    pass


def default_work(flashinfer: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "moe-e2e" / f"flashinfer-{flashinfer}"


def pip(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--quiet", *args], capture_output=True, text=True
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise BuildError(f"pip {args[0]} failed: {last}")


def nvcc_version(cuda_home: Path) -> str:
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.exists():
        raise BuildError(f"no nvcc under {cuda_home}: set CUDA_HOME to a CUDA 13 toolkit")
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+\.\d+)", out)
    if not found:
        raise BuildError(f"{nvcc} --version says no release")
    return found.group(1)


def prepare(work: Path, flashinfer: str, tvm_ffi: str) -> dict:
    """FlashInfer and its build helpers in ``work/site``; the CUDA wheels' headers and libraries
    under ``work/cuda/nvidia/cu13``; a stand-in ``libcuda.so`` to link against (the driver
    provides the real one)."""
    site, cuda, wheels = work / "site", work / "cuda", work / "wheels"
    if not (site / "flashinfer").is_dir():
        pip(
            "install",
            "--no-deps",
            "--target",
            str(site),
            f"flashinfer-python=={flashinfer}",
            tvm_ffi,
            *IMPORT_PACKAGES,
        )
    toolkit = cuda / "nvidia" / "cu13"
    if not (toolkit / "include").is_dir():
        pip("download", "--no-deps", "--only-binary=:all:", "--dest", str(wheels), *CUDA_WHEELS)
        for wheel in sorted(wheels.glob("nvidia_*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if re.match(r"nvidia/cu13/(include|lib)/.+[^/]$", member):
                        target = cuda / member
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(archive.read(member))
        (toolkit / "lib" / "libnvrtc.so").unlink(missing_ok=True)
        (toolkit / "lib" / "libnvrtc.so").symlink_to("libnvrtc.so.13")
    stub = cuda / "stubs" / "libcuda.so"
    if not stub.exists():
        stub.parent.mkdir(parents=True, exist_ok=True)
        command = ["cc", "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(stub), "-x", "c", "-"]
        try:
            subprocess.run(command, input="", text=True, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as error:
            raise BuildError(f"cannot build a stand-in libcuda.so with cc: {error}") from None
    return {
        "site": site,
        "include": toolkit / "include",
        "lib": toolkit / "lib",
        "stubs": stub.parent,
    }


def build_env(work: Path, paths: dict, cuda_home: Path) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(paths["site"]),
            "FLASHINFER_WORKSPACE_BASE": str(work / "workspace"),
            "FLASHINFER_CUDA_ARCH_LIST": ARCH,
            "CUDA_HOME": str(cuda_home),
            "CPLUS_INCLUDE_PATH": str(paths["include"]),
            "LIBRARY_PATH": os.pathsep.join([str(paths["lib"]), str(paths["stubs"])]),
        }
    )
    return env


def write_ninja(env: dict) -> Path:
    """FlashInfer's own build description of the module; returns its build folder."""
    script = (
        "from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module as gen\n"
        "spec = gen()\nspec.write_ninja()\nprint(spec.build_dir)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError("FlashInfer's build description failed: " + result.stderr[-400:])
    return Path(result.stdout.strip().splitlines()[-1])


def build(vllm: str, out: Path, work: Path | None, jobs: int, index_url: str | None) -> dict:
    from moe_patch import wheel as wheels
    from moe_patch.trees import resolve_version

    from .bundle import ENGINE_DEPENDENCIES, pinned_requirement, sha256_file

    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = nvcc_version(cuda_home)
    if not nvcc.startswith("13."):
        raise BuildError(f"nvcc {nvcc}: the GPU machine's torch is built for CUDA 13; use nvcc 13")
    official, _ = wheels.official_wheel(resolve_version(vllm, index_url), None, index_url)
    flashinfer = pinned_requirement(official, "flashinfer-python").split("==")[1]
    tvm_ffi = next(r for r in ENGINE_DEPENDENCIES if r.startswith("apache-tvm-ffi=="))
    work = work or default_work(flashinfer)
    paths = prepare(work, flashinfer, tvm_ffi)
    env = build_env(work, paths, cuda_home)
    build_dir = write_ninja(env)
    ninja = paths["site"] / "bin" / "ninja"
    started = time.monotonic()
    result = subprocess.run([str(ninja), "-C", str(build_dir), "-k", "0", "-j", str(jobs)], env=env)
    library = build_dir / f"{MODULE}.so"
    if result.returncode != 0 or not library.exists():
        raise BuildError(f"ninja failed in {build_dir} (run again to resume; its log says why)")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, out / library.name)
    summary = {
        "module": MODULE,
        "flashinfer": flashinfer,
        "vllm": vllm,
        "nvcc": nvcc,
        "arch": ARCH,
        "file": library.name,
        "sha256": sha256_file(out / library.name),
        "size": library.stat().st_size,
        "build_s_this_run": round(time.monotonic() - started),
    }
    (out / f"{MODULE}.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_e2e.flashinfer_aot", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--vllm", default="0.21", help="release whose FlashInfer pin to build")
    parser.add_argument("--out", type=Path, default=Path(".e2e/flashinfer"))
    parser.add_argument("--work", type=Path, default=None, help="build folder (resumable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--index-url", default=None, help="package index (default: pip's)")
    args = parser.parse_args(argv)
    from moe_patch.errors import MoePatchError

    try:
        summary = build(args.vllm, args.out, args.work, args.jobs, args.index_url)
    except (BuildError, MoePatchError) as error:  # moe-patch's: the release or its wheel
        print(f"moe_e2e.flashinfer_aot: {error}", file=sys.stderr)
        return 1
    print(
        f"{summary['file']}: FlashInfer {summary['flashinfer']}, nvcc {summary['nvcc']}, "
        f"{summary['size'] / 2**20:.0f} MiB, sha256 {summary['sha256'][:12]}… in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
