"""``moe-patch list``: the series, its bases and what each patch is for."""

from __future__ import annotations

from .. import gpu_runs, series
from ..settings import Settings


def list_series(vllm: str | None = None, settings: Settings | None = None) -> list[dict]:
    """One entry per (base, patch); with ``vllm``, only the series serving it."""
    series_root = (settings or Settings.resolve()).series_root
    known = series.required_bases(series_root)
    chosen = [series.base_for(vllm, series_root)] if vllm else known
    rows = []
    for base in chosen:
        loaded = series.load(base, series_root)
        gpu = gpu_runs.summary(loaded.directory)
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
                    "gpu": gpu,
                }
            )
    return rows


def serving_ranges(settings: Settings | None = None) -> dict[str, str]:
    """Base -> the releases its series serves, in words ("0.20.0 ≤ v < 0.25.0")."""
    known = series.required_bases((settings or Settings.resolve()).series_root)
    later = [*known[1:], None]
    return {
        base: f"{base} ≤ v < {after}" if after else f"{base} ≤ v"
        for base, after in zip(known, later, strict=True)
    }
