"""What happened to each patch: the outcomes the engines report, and their JSON.

How a report reads on a terminal is the command line's business (:mod:`moe_patch.cli.render`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

APPLIED = "applied"
APPLIED_3WAY = "applied (3-way)"
UPSTREAM = "already upstream"
FAILED = "failed"
NOT_ATTEMPTED = "not attempted"
SKIPPED = "skipped"
PASS, FAIL, SKIP = "pass", "fail", "skip"  # verify's checks


def as_json(report, **extra) -> str:
    """A report (a dataclass) as indented JSON, ``extra`` keys added or replacing fields."""
    return json.dumps({**asdict(report), **extra}, indent=2)


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
