"""``moe-patch list``: the series, its bases and what each patch is for."""

from __future__ import annotations

from .. import series
from ..settings import Settings


def list_series(vllm: str | None = None, settings: Settings | None = None) -> list[dict]:
    """One entry per (base, patch); with ``vllm``, only the series serving it."""
    series_root = (settings or Settings.resolve()).series_root
    known = series.required_bases(series_root)
    chosen = [series.base_for(vllm, series_root)] if vllm else known
    rows = []
    for base in chosen:
        loaded = series.load(base, series_root)
        for position, patch in enumerate(loaded.patches, start=1):
            rows.append(
                {
                    "base": base,
                    "position": position,
                    "id": patch.id,
                    "subject": patch.subject,
                    "upstream_status": patch.upstream_status,
                    "probes": patch.trailer_values("Upstream-Probe"),
                    "files": patch.files,
                    "reason": patch.reason,
                }
            )
    return rows
