"""Release-tree tier: real vLLM sdists, downloaded by moe-patch itself and cached
under the user cache directory (or $MOE_PATCH_CACHE), so a second run is fast."""

import pytest
from moe_patch import sources, trees


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
