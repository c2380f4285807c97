"""Build FlashInfer's SM90 CUTLASS fused-MoE module on a machine without a GPU.

    python -m moe_e2e.flashinfer_aot --wheels .e2e/wheels --out .e2e/flashinfer [--jobs 2] [--kernels all]

With FlashInfer installed, vLLM 0.21.0 sends per-tensor FP8 MoE with static activation scales
on Hopper to FlashInfer's CUTLASS MoE GEMMs, which FlashInfer compiles with nvcc on first use:
181 translation units (up to 7 minutes and 6 GB each on one core), more than a GPU session can
spend.  This builds the same module ahead of time, at the FlashInfer version the release's
official wheel pins (the wheel in ``--wheels``, the folder ``python -m
moe_patch.harness_wheels`` makes), with FlashInfer's own build description (its
``gen_cutlass_fused_moe_sm90_module`` writes the ninja file) and this machine's nvcc, which
must be the GPU machine's major version.
``moe_e2e.bundle --flashinfer-aot OUT/fused_moe_90.so`` carries the library into FlashInfer's
ahead-of-time folder on the GPU machine, where FlashInfer loads it instead of compiling.

``--kernels fp8`` (the default) compiles the translation units the FP8 x FP8 path needs: the
runner, the bindings and helpers, and of the kernel-instantiation units (FlashInfer's generated
CUTLASS instantiations, one ``MoeGemmRunner`` file per data-type pair) only those that
instantiate FP8 x FP8 kernels: 32 of 181 units for FlashInfer 0.6.8.post1, every FP8 x FP8
grouped-GEMM tile of the full module.  The other data types' kernels, which no FP8 engine
calls, are replaced by stubs that end the process naming the symbol if anything ever calls
one, so an FP8 engine runs the same kernels as with the full module or stops loudly.
``--kernels all`` builds FlashInfer's module unchanged (about six core-hours).

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
KERNEL_SETS = ("fp8", "all")
# Units that only instantiate kernels for some data types: FlashInfer's generated CUTLASS
# instantiations and its MoeGemmRunner<activation, weight, output> files.
INSTANTIATION_UNIT = re.compile(r"(?:/moe_gemm_kernels_\w+\.cu|\.generated\.cu)$")
FP8_PAIR = re.compile(r"__nv_fp8_e4m3\s*,\s*__nv_fp8_e4m3\b")
# Mangled names in TensorRT-LLM's namespace, where the left-out units define everything:
# functions, const members, vtables, typeinfo and guard variables.
TRTLLM_SYMBOL = re.compile(r"^_Z(?:T[VIS]|GV)?NK?12tensorrt_llm")
BUILD_LINE = re.compile(r"^build (\S+): (\w+) (.+)$")
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


def ninja_units(build_dir: Path) -> tuple[list[tuple[str, str]], str]:
    """The (object, source) pairs FlashInfer's ninja file compiles, and its library target."""
    units, library = [], None
    for line in (build_dir / "build.ninja").read_text().splitlines():
        found = BUILD_LINE.match(line)
        if not found:
            continue
        target, rule, inputs = found.groups()
        if rule == "link":
            library = target
        else:
            units.append((target, inputs.strip()))
    if library is None or not units:
        raise BuildError(f"{build_dir / 'build.ninja'} has no library to link")
    return units, library


def fp8_units(units: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Objects an FP8 x FP8 engine needs, and the kernel-instantiation units left out."""
    kept, left_out = [], []
    for target, source in units:
        if INSTANTIATION_UNIT.search(source) and not FP8_PAIR.search(Path(source).read_text()):
            left_out.append(source)
        else:
            kept.append(target)
    return kept, left_out


def nm_symbols(objects: list[str], *flags: str) -> set[str]:
    result = subprocess.run(["nm", *flags, *objects], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError("nm failed: " + (result.stderr.strip().splitlines() or ["?"])[-1])
    return {fields[-1] for fields in map(str.split, result.stdout.splitlines()) if fields}


def missing_symbols(objects: list[str]) -> list[str]:
    """TensorRT-LLM symbols the kept objects use and none of them defines: what the left-out
    kernel-instantiation units would have defined."""
    undefined = nm_symbols(objects, "--undefined-only", "--no-sort")
    defined = nm_symbols(objects, "--defined-only", "--no-sort")
    return sorted(s for s in undefined - defined if TRTLLM_SYMBOL.match(s))


def stub_source(symbols: list[str]) -> str:
    lines = [
        "// Written by moe_e2e.flashinfer_aot for an FP8-only build of FlashInfer's fused_moe_90:",
        "// one function per symbol of the kernel units it left out.  Calling one ends the process.",
        "#include <cstdio>",
        "#include <cstdlib>",
        "",
        "[[noreturn]] static void moe_e2e_not_built(const char* symbol) {",
        '  std::fprintf(stderr, "fused_moe_90 built with --kernels fp8 by moe_e2e.flashinfer_aot "',
        '               "has no %s: rebuild with --kernels all\\n", symbol);',
        "  std::abort();",
        "}",
        "",
    ]
    for number, symbol in enumerate(symbols):
        lines += [
            f'extern "C" void moe_e2e_stub_{number}() __asm__("{symbol}");',
            f'void moe_e2e_stub_{number}() {{ moe_e2e_not_built("{symbol}"); }}',
        ]
    return "\n".join(lines) + "\n"


def run_ninja(ninja: Path, build_dir: Path, jobs: int, env: dict, *args: str) -> None:
    command = [str(ninja), "-C", str(build_dir), "-k", "0", "-j", str(jobs), *args]
    if subprocess.run(command, env=env).returncode != 0:
        raise BuildError(f"ninja failed in {build_dir} (run again to resume; its log says why)")


def build_fp8_only(ninja: Path, build_dir: Path, jobs: int, env: dict) -> tuple[Path, dict]:
    """Compile the FP8 x FP8 units, stub what the others define, link; the library and facts."""
    units, library = ninja_units(build_dir)
    kept, left_out = fp8_units(units)
    run_ninja(ninja, build_dir, jobs, env, *kept)
    symbols = missing_symbols(kept)
    subset = build_dir / "fp8-only"
    subset.mkdir(exist_ok=True)
    stubs = subset / "not_built_stubs.cpp"
    stubs.write_text(stub_source(symbols))
    output = subset / Path(library).name
    text = (build_dir / "build.ninja").read_text()
    link = next(line for line in text.splitlines() if line.startswith(f"build {library}: link "))
    objects = " ".join([*kept, str(subset / "not_built_stubs.o")])
    text = text.replace(
        link,
        f"build {subset / 'not_built_stubs.o'}: compile {stubs}\nbuild {output}: link {objects}",
    )
    text = re.sub(r"^default .*$", f"default {output}", text, flags=re.MULTILINE)
    (subset / "build.ninja").write_text(text)
    run_ninja(ninja, build_dir, jobs, env, "-f", str(subset / "build.ninja"), str(output))
    unresolved = [
        s
        for s in nm_symbols([str(output)], "--dynamic", "--undefined-only")
        if TRTLLM_SYMBOL.match(s)
    ]
    if unresolved:
        raise BuildError(
            f"{output.name} still lacks {len(unresolved)} symbols, e.g. {unresolved[0]}"
        )
    facts = {
        "units_built": len(kept),
        "units_in_module": len(units),
        "units_left_out": sorted(Path(source).name for source in left_out),
        "stubbed_symbols": len(symbols),
    }
    return output, facts


def build(
    wheels: Path,
    out: Path,
    work: Path | None,
    jobs: int,
    kernels: str = "fp8",
) -> dict:
    from .bundle import ENGINE_DEPENDENCIES, pinned_requirement, read_wheels, sha256_file

    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = nvcc_version(cuda_home)
    if not nvcc.startswith("13."):
        raise BuildError(f"nvcc {nvcc}: the GPU machine's torch is built for CUDA 13; use nvcc 13")
    described = read_wheels(wheels)
    vllm, official = described["vllm"], wheels / described["official"]["file"]
    flashinfer = pinned_requirement(official, "flashinfer-python").split("==")[1]
    tvm_ffi = next(r for r in ENGINE_DEPENDENCIES if r.startswith("apache-tvm-ffi=="))
    work = work or default_work(flashinfer)
    paths = prepare(work, flashinfer, tvm_ffi)
    env = build_env(work, paths, cuda_home)
    build_dir = write_ninja(env)
    ninja = paths["site"] / "bin" / "ninja"
    started = time.monotonic()
    if kernels == "fp8":
        library, facts = build_fp8_only(ninja, build_dir, jobs, env)
    else:
        run_ninja(ninja, build_dir, jobs, env)
        library, facts = build_dir / f"{MODULE}.so", {}
    if not library.exists():
        raise BuildError(f"ninja made no {library.name} in {library.parent}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, out / library.name)
    summary = {
        "module": MODULE,
        "flashinfer": flashinfer,
        "vllm": vllm,
        "nvcc": nvcc,
        "arch": ARCH,
        "kernels": kernels,
        **facts,
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
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path(".e2e/wheels"),
        help="the folder python -m moe_patch.harness_wheels made: the release whose "
        "FlashInfer pin to build (default: .e2e/wheels)",
    )
    parser.add_argument("--out", type=Path, default=Path(".e2e/flashinfer"))
    parser.add_argument("--work", type=Path, default=None, help="build folder (resumable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--kernels",
        choices=KERNEL_SETS,
        default="fp8",
        help="fp8: the FP8 x FP8 kernels an FP8 engine runs, the rest stubbed (default; about "
        "a sixth of the build); all: FlashInfer's whole module",
    )
    args = parser.parse_args(argv)
    try:
        summary = build(args.wheels, args.out, args.work, args.jobs, args.kernels)
    except BuildError as error:
        print(f"moe_e2e.flashinfer_aot: {error}", file=sys.stderr)
        return 1
    print(
        f"{summary['file']} ({summary['kernels']} kernels): FlashInfer {summary['flashinfer']}, "
        f"nvcc {summary['nvcc']}, {summary['size'] / 2**20:.0f} MiB, "
        f"sha256 {summary['sha256'][:12]}… in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
