"""Python environments that import a vLLM release's source tree without a GPU.

One environment per distinct recipe, cached in the user cache beside the
release trees::

    <moe_patch.cache.root()>/envs/oracle-<key>/     a venv, complete once it exists
    <moe_patch.cache.root()>/locks/env-oracle-<key>.lock

Recipe: a CPU build of torch plus the release's ``requirements/common.txt``
(vLLM's own list of what its Python code imports on every platform), and the
pytest this test run uses (to run the series' upstream tests inside the tree).
The key hashes the recipe (interpreter version, torch requirement, pytest
version, the bytes of common.txt), so releases whose common.txt is the same share one environment,
and an edit to any part builds a new one.

torch: the releases pin a CUDA torch in requirements/cuda.txt (2.11.0 for
0.20 … 0.25, 2.14.0 for 0.33), but the package index's Linux torch wheels are
CUDA builds of a few GB, and the CPU wheel index is not reachable from CI.
The oracle code path imports torch but runs no kernel, so one CPU build serves
every release: ``torch==2.13.0`` by default, which the machines this project
runs on (developers' and CI's) install from a local CPU wheel through pip's
configured find-links.  ``MOE_PATCH_ORACLE_TORCH`` overrides it with any pip
requirement or wheel path (e.g. a CPU wheel of the release's own pin).  The
chosen torch is also passed as a constraint, so no package of common.txt can
make pip replace it with a CUDA build.

An environment is built in a temporary directory next to its final name under
the entry's lock and renamed into place when pip has finished and the import
check has passed, so concurrent test runs build it once and an interrupted
build leaves only a ``.tmp-*`` directory, which the next build removes.
Only ``<env>/bin/python`` is used (scripts' ``#!`` lines keep the temporary
path; a venv's interpreter finds its site-packages from its own location).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from moe_patch import cache

DEFAULT_TORCH = "torch==2.13.0"
RECIPE = 2  # bump when the way environments are built changes
PYTEST = f"pytest=={importlib.metadata.version('pytest')}"
MARKER = "moe-patch-env.json"


@dataclass
class Env:
    path: Path
    built_seconds: float | None  # None: taken from the cache
    info: dict

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def torch_requirement() -> str:
    return os.environ.get("MOE_PATCH_ORACLE_TORCH") or DEFAULT_TORCH


def key(common_txt: bytes, torch: str) -> str:
    digest = hashlib.sha256()
    for part in (
        f"recipe {RECIPE}",
        f"python {sys.version_info.major}.{sys.version_info.minor}",
        f"torch {torch}",
        PYTEST,
    ):
        digest.update(part.encode() + b"\n")
    digest.update(common_txt)
    return digest.hexdigest()[:16]


def oracle_env(tree: Path) -> Env:
    """The environment for the vLLM source tree ``tree``, built if needed."""
    common = (tree / "requirements" / "common.txt").read_bytes()
    torch = torch_requirement()
    name = f"oracle-{key(common, torch)}"
    envs = cache.subdir("envs")
    final = envs / name
    if _complete(final):
        return Env(final, None, _info(final))
    with cache.locked(f"env-{name}", timeout=float(os.environ.get("MOE_PATCH_LOCK_TIMEOUT", 1800))):
        if _complete(final):  # another run built it while we waited
            return Env(final, None, _info(final))
        if final.exists():  # not ours to trust: no marker, so never finished
            shutil.rmtree(final)
        cache.remove_leftovers(envs, name)
        work = Path(tempfile.mkdtemp(dir=envs, prefix=f".tmp-{name}-"))
        try:
            started = time.perf_counter()
            info = _build(work, common, torch)
            info["build_seconds"] = round(time.perf_counter() - started, 1)
            (work / MARKER).write_text(json.dumps(info, indent=1) + "\n")
            os.replace(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return Env(final, info["build_seconds"], info)


def _complete(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "bin" / "python").exists()


def _info(path: Path) -> dict:
    return json.loads((path / MARKER).read_text())


def _build(work: Path, common: bytes, torch: str) -> dict:
    log = work / "build.log"
    subprocess.run([sys.executable, "-m", "venv", str(work)], check=True)
    python = work / "bin" / "python"
    (work / "common.txt").write_bytes(common)
    constraints = work / "constraints.txt"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    # torch first and alone, then common.txt with torch held to what was installed.
    _run(pip + [torch], log)
    version = _run([str(python), "-c", "import torch; print(torch.__version__)"], log)
    constraints.write_text(f"torch=={version.strip()}\n")
    _run(pip + ["-r", str(work / "common.txt"), "-c", str(constraints)], log)
    _run(pip + [PYTEST, "-c", str(constraints)], log)
    check = "import torch, transformers, pydantic; print(torch.version.cuda)"
    cuda = _run([str(python), "-c", check], log).strip()
    if cuda != "None":
        raise RuntimeError(
            f"the oracle environment got a CUDA build of torch ({torch_requirement()}, CUDA {cuda}); "
            "set MOE_PATCH_ORACLE_TORCH to a CPU build (a requirement or a wheel path)"
        )
    return {
        "recipe": RECIPE,
        "python": sys.version.split()[0],
        "torch": version.strip(),
        "torch_requirement": torch,
        "pytest": PYTEST,
    }


def _run(command: list[str], log: Path) -> str:
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=handle, text=True)
        handle.write(done.stdout)
    if done.returncode:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"building an oracle environment failed: {command[2:6]} …\n{tail}")
    return done.stdout
