"""How a patch of the series goes upstream, read from the patch's own ``Upstream-*`` trailers.

``Upstream-Tag``        the vLLM PR title's tag(s) (``[Kernel]``, ``[Perf][MoE]``); default
                        ``[Misc]``
``Upstream-Depends``    the id of the patch of the same series whose pull request must be
                        merged first: the branch is stacked on that one's
``Upstream-Test``       a test file the pull request adds, by its path in vLLM; the file is
                        kept under the series root's ``upstream/`` folder at that path
``Upstream-Docs``       a page under ``docs/`` the change must update (a user-visible change
                        the reference pages do not generate, such as a new default)
``Upstream-Results``    a results file under ``kernels/results/`` for the description's
                        table, optionally followed by ``key=value`` row selectors (repeated:
                        several, the first shown, the others collapsed)
``Upstream-Benchmark``  a command a reviewer runs inside vLLM, on the base and on the branch
``Assisted-by``         how the change was written; kept in the upstream commit

The upstream commit's title and message (:func:`title_for`, :func:`body_for`) come from the
patch too.  A new patch needs no change to the tool: everything ``pr`` does with it comes
from these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import patchfile
from .errors import PatchFormatError
from .patchfile import Patch


@dataclass(frozen=True)
class Upstreaming:
    """How one patch goes upstream (see the module's docstring)."""

    tag: str = "[Misc]"
    depends: tuple[str, ...] = ()
    tests: dict[str, str] = field(default_factory=dict)  # path in vLLM -> content
    docs: tuple[str, ...] = ()
    results: tuple[str, ...] = ()  # "file [key=value ...]" under kernels/results/
    benchmarks: list[str] = field(default_factory=list)
    assisted_by: list[str] = field(default_factory=list)


UPSTREAM_FILES = "upstream"  # beside the series directories

# Trailers that belong to the series, not to an upstream commit.
SERIES_TRAILERS = {
    "upstream-status",
    "upstream-probe",
    "applied-upstream",
    "forwarded",
    "patch-filename",
    "signed-off-by",
    "upstream-title",
    "upstream-tag",
    "upstream-depends",
    "upstream-test",
    "upstream-docs",
    "upstream-results",
    "upstream-benchmark",
}


def upstreaming(patch: Patch) -> Upstreaming:
    """The patch's upstreaming facts; a test it names must exist under ``upstream/``."""
    files = patch.path.parent.parent / UPSTREAM_FILES
    tests = {}
    for path in patch.trailer_values("Upstream-Test"):
        patchfile.check_path(path, patch.path.name)
        try:
            tests[path] = (files / path).read_text()
        except OSError:
            raise PatchFormatError(
                f"patch {patch.path.name} names Upstream-Test {path}, which is not in "
                f"{files}; add the file or remove the trailer"
            ) from None
    docs = tuple(patch.trailer_values("Upstream-Docs"))
    for path in docs:
        patchfile.check_path(path, patch.path.name)
    return Upstreaming(
        tag=patch.trailer("Upstream-Tag") or "[Misc]",
        depends=tuple(patch.trailer_values("Upstream-Depends")),
        tests=tests,
        docs=docs,
        results=tuple(patch.trailer_values("Upstream-Results")),
        benchmarks=patch.trailer_values("Upstream-Benchmark"),
        assisted_by=patch.trailer_values("Assisted-by"),
    )


def dependency_problems(patches: list[Patch]) -> list[str]:
    """What is wrong with the series' ``Upstream-Depends`` trailers: each names one earlier
    patch of the same series, and a patch names at most one."""
    problems = []
    seen: list[str] = []
    for patch in patches:
        named = patch.trailer_values("Upstream-Depends")
        if len(named) > 1:
            problems.append(
                f"{patch.path.name} names {len(named)} Upstream-Depends; a branch stacks on "
                "one (name the last, which carries the others)"
            )
        for dependency in named:
            if dependency not in seen:
                problems.append(
                    f"{patch.path.name}: Upstream-Depends {dependency} is not an earlier patch "
                    "of this series"
                )
        seen.append(patch.id)
    return problems


def title_for(patch: Patch) -> str:
    """The upstream commit's title: ``Upstream-Title``, else the tag and the subject."""
    explicit = patch.trailer("Upstream-Title")
    if explicit:
        return explicit
    tag = upstreaming(patch).tag
    subject = re.sub(r"^[\w./-]+:\s+", "", patch.subject)  # "fused_moe: do x" -> "do x"
    return f"{tag} {subject[:1].upper()}{subject[1:]}"


def body_for(patch: Patch) -> str:
    """The patch's message without the series' own trailers."""
    paragraphs = [p for p in patch.message.strip().split("\n\n") if p.strip()]
    if paragraphs:
        kept = [
            line
            for line in paragraphs[-1].splitlines()
            if line.split(":", 1)[0].strip().lower() not in SERIES_TRAILERS
        ]
        if kept:
            paragraphs[-1] = "\n".join(kept)
        else:
            paragraphs.pop()
    return "\n\n".join(paragraphs)
