"""What happened to each patch, as a terminal table or as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import click

APPLIED = "applied"
APPLIED_3WAY = "applied (3-way)"
UPSTREAM = "already upstream"
FAILED = "failed"
NOT_ATTEMPTED = "not attempted"
SKIPPED = "skipped"

_COLOURS = {APPLIED: "green", APPLIED_3WAY: "green", UPSTREAM: "cyan", FAILED: "red"}


@dataclass
class PatchOutcome:
    id: str
    subject: str
    status: str
    detail: str = ""
    commit: str | None = None
    upstream_status: str = ""


@dataclass
class ApplyReport:
    vllm: str
    series_base: str
    tree: str
    branch: str
    base_commit: str
    head: str | None = None
    unchanged: bool = False
    outcomes: list[PatchOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.status != FAILED for o in self.outcomes)

    def to_json(self) -> str:
        data = asdict(self)
        data["ok"] = self.ok
        data["patches"] = data.pop("outcomes")
        return json.dumps(data, indent=2)


def render_table(
    headers: list[str],
    rows: list[list[str]],
    colour_column: int | None = None,
    *,
    colour_columns: set[int] | None = None,
    colours: dict[str, str] | None = None,
) -> str:
    """A plain aligned table; cells of the coloured columns are styled by value."""
    coloured = set(colour_columns or ()) | ({colour_column} if colour_column is not None else set())
    palette = _COLOURS if colours is None else colours
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            text = cell.ljust(width)
            if i in coloured and cell in palette:
                text = click.style(text, fg=palette[cell])
            cells.append(text)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def render_apply(report: ApplyReport) -> str:
    rows = [
        [o.id, o.status, (o.commit or "")[:12], o.detail or o.upstream_status]
        for o in report.outcomes
    ]
    table = render_table(["patch", "status", "commit", "detail"], rows, colour_column=1)
    state = "unchanged (already applied)" if report.unchanged else (report.head or "")[:12]
    return (
        f"vLLM {report.vllm} in {report.tree} (series base v{report.series_base})\n"
        f"{table}\n"
        f"branch {report.branch}: {state}"
    )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def render_clean(report) -> str:
    """``moe-patch clean``'s table: what was (or would be) removed, and what was in use."""
    verb = "would remove" if report.dry_run else "removed"
    if not report.removed and not report.in_use:
        return "nothing to clean"
    lines = [
        f"{verb} {item['path']} ({item['what']}, {_mib(item['bytes'])})" for item in report.removed
    ]
    lines += [f"kept {path}: another moe-patch run is using it" for path in report.in_use]
    lines.append(f"{verb} {len(report.removed)} item(s), {_mib(report.bytes)}")
    return "\n".join(lines)
