"""Fixtures shared by every tier; the helpers behind them live in support.py."""

from support import cache_dir, fake_index, series_root  # noqa: F401 (fixtures)
