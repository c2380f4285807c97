"""``moe-patch rebase``: carry the series onto another release; continue, skip, abort."""

from __future__ import annotations

from pathlib import Path

from .. import rebase as engine
from .. import trees, versions
from ..errors import UsageError
from ..settings import Settings


def rebase(
    onto: str | None = None,
    base: str | None = None,
    into: Path | None = None,
    source: Path | None = None,
    git_url: str | None = None,
    action: str | None = None,  # "continue" | "skip" | "abort"
    settings: Settings | None = None,
    any_base: bool = False,
):
    """A :class:`~moe_patch.rebase.RebaseResult` (or the aborted state); raises
    :class:`~moe_patch.errors.RebaseStopped` when a patch conflicts."""
    if action:
        if onto or base or source or git_url:
            raise UsageError(f"--{action} takes no --onto, --from, --source or --git")
        if action == "abort":
            return engine.abort(into)
        return engine.continue_(into) if action == "continue" else engine.skip(into)
    settings = settings or Settings.resolve()
    if not onto:
        raise UsageError("say where to: --onto VERSION (or --continue, --skip, --abort)")
    if source or git_url:
        if not versions.is_exact(onto):
            raise UsageError(f"with --source or --git, --onto needs an exact release, not {onto}")
        onto = str(versions.parse_spec(onto))
    else:
        onto = trees.resolve_version(onto, settings.index_url)
    if base is not None:
        base = str(versions.parse_spec(base))
    return engine.start(onto, base, into, source, git_url, settings, any_base)
