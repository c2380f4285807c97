"""``moe-patch pr``: one upstream-ready branch per patch vLLM lacks, checked against the
target's own pull-request checklist (the engine is :mod:`moe_patch.pr`)."""

from __future__ import annotations

from .. import pr as engine
from ..errors import EXIT_PATCH_FAILED, EXIT_VERIFY_FAILED, MoePatchError

DEFAULT_PREFIX = engine.DEFAULT_PREFIX


# The engine's own function is the command's: every option by keyword, as ``pr`` passes them.
pr = engine.prepare


def failure(report: engine.PrReport) -> MoePatchError | None:
    """The error ``moe-patch pr`` exits with once it has printed ``report``: a patch that got
    no branch, else a branch the checklist fails."""
    failed = [o.id for o in report.outcomes if o.status == engine.FAILED]
    if failed:
        return MoePatchError(
            f"no branch for {', '.join(failed)}: see the report above", EXIT_PATCH_FAILED
        )
    failing = [o.id for o in report.outcomes if o.check_failed]
    if failing:
        return MoePatchError(
            f"{', '.join(failing)}: the pull-request checklist fails (see the items above)",
            EXIT_VERIFY_FAILED,
        )
    return None
