"""Release-tree tier: real vLLM sdists, downloaded by moe-patch itself and cached
under the user cache directory (or $MOE_PATCH_CACHE), so a second run is fast."""

import pytest
from moe_patch import sources, trees

SUPPORTED = [
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
]


@pytest.fixture(scope="session")
def release_repo():
    """The cached bare repository of a release (downloaded once per cache)."""
    return trees.release_repo


@pytest.fixture
def release_tree(tmp_path):
    """An unpatched work tree of a release, made by the product's own code path."""

    def make(version: str):
        return sources.from_cache(version, tmp_path / f"vllm-{version}", None).path

    return make
