"""Fixtures shared by every tier; the helpers behind them live in support.py."""

import pytest
from support import authored_series, cache_dir, fake_index, series_root  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _export_keeps_committed_identities(monkeypatch):
    """``export`` would write placeholder-authored patches under the git identity of the
    machine running the tests; keep them as committed unless a test says otherwise."""
    monkeypatch.setenv("MOE_PATCH_AUTHOR", "")
