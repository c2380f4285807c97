"""``moe-patch list``: the series, its bases and what each patch is for."""

from __future__ import annotations

from pathlib import Path

from .. import series


def list_series(vllm: str | None = None, series_root: Path | None = None) -> list[dict]:
    """One entry per (base, patch); with ``vllm``, only the series serving it."""
    chosen = [series.base_for(vllm, series_root)] if vllm else series.bases(series_root)
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
