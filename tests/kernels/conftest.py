"""Fixtures for the kernel harness tests.

* Without CUDA, Triton's CPU interpreter is switched on here (TRITON_INTERPRET=1),
  and triton imported under it, before any test module imports triton.
* ``vllm_tree``: one vLLM source tree per parameter.  Trees come from
  ``MOE_KERNELS_TREES`` (paths separated by ``os.pathsep``) or the defaults
  below; a missing tree is skipped.  This is the one place that decides which
  trees the kernel tests run on.
* Random data: every test draws from its own generator, seeded from the
  session seed (``MOE_KERNELS_SEED``, else random per run, shown in the header)
  and the test's id, so each run uses fresh data and a failure can be replayed.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # triton.language defines its own helpers (the combine functions of tl.sum, tl.cumsum)
    # with @jit when it is first imported: imported now, they are the interpreter's even
    # where a test later imports moe_kernels with the variable unset (tune's GPU check).
    import triton.language  # noqa: F401

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
try:  # the package is mapped by the project's pyproject; fall back to the source folder
    import moe_kernels  # noqa: F401
except ImportError:
    sys.path.insert(0, str(KERNELS))

import pytest  # noqa: E402

# Releases the kernel tests run on by default (one of each series), each unpatched and with the
# series applied ("+moe"); moe-patch itself downloads (and caches) them.
DEFAULT_RELEASES = ("0.21.0", "0.33.0", "0.34.0")
SESSION_SEED = int(os.environ.get("MOE_KERNELS_SEED") or random.SystemRandom().randrange(2**31))


def tree_paths() -> list[str]:
    """Tree paths from MOE_KERNELS_TREES, else release labels built on demand."""
    env = os.environ.get("MOE_KERNELS_TREES")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return [f"{v}{suffix}" for v in DEFAULT_RELEASES for suffix in ("", "+moe")]


@pytest.fixture(scope="session")
def release_trees(tmp_path_factory):
    """Build a release tree (label ``X.Y.Z`` or ``X.Y.Z+moe``) through moe-patch's
    own download path and cache, once per session."""
    built: dict[str, Path] = {}

    def build(label: str) -> Path:
        if label not in built:
            try:
                import moe_patch  # noqa: F401
            except ImportError:
                pytest.skip("moe_patch is not installed: set MOE_KERNELS_TREES to tree paths")
            from moe_patch.harness_trees import build_tree

            built[label] = build_tree(label, tmp_path_factory.mktemp("trees") / label)
        return built[label]

    return build


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_report_header(config):
    mode = "triton interpreter (CPU)" if os.environ.get("TRITON_INTERPRET") == "1" else "CUDA"
    return [
        f"moe_kernels: trees={tree_paths()} mode={mode} "
        f"MOE_KERNELS_SEED={SESSION_SEED} (set it to replay this run's data)"
    ]


def pytest_collection_modifyitems(config, items):
    # Release trees named by label are downloaded through moe-patch: those tests need the
    # package index the first time, so -m "not network" leaves them out offline.
    downloads = not os.environ.get("MOE_KERNELS_TREES")
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if downloads and "release_trees" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.network)
            item.add_marker(pytest.mark.release)
        if skip and "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=tree_paths(), ids=lambda p: Path(p).name)
def vllm_tree(request, release_trees) -> Path:
    label = request.param
    path = Path(label) if os.sep in label else release_trees(label)
    if not (path / "vllm/model_executor/layers/fused_moe/fused_moe.py").is_file():
        pytest.skip(f"vLLM tree not found: {path}")
    return path


@pytest.fixture
def kernel(vllm_tree):
    from moe_kernels import load_fused_moe_kernel

    return load_fused_moe_kernel(vllm_tree)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gen(request, device) -> torch.Generator:
    digest = hashlib.sha256(f"{SESSION_SEED}:{request.node.nodeid}".encode()).digest()
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return g
