"""How a patch of the series goes upstream, read from the patch's own ``Upstream-*`` trailers.

``Upstream-Tag``        the vLLM PR title's tag (``[Perf]``, ``[Kernel]``); default ``[Misc]``
``Upstream-Test``       a test file the pull request adds, by its path in vLLM; the file is
                        kept under the series root's ``upstream/`` folder at that path
``Upstream-Results``    a results file under ``kernels/results/`` for the Test Result section
                        (repeated: several, shown in order)
``Upstream-Benchmark``  a command a reviewer runs inside vLLM, on the base and on the branch
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import patchfile
from .errors import PatchFormatError
from .patchfile import Patch


@dataclass(frozen=True)
class Upstreaming:
    """How one patch goes upstream (see the module's docstring)."""

    tag: str = "[Misc]"
    tests: dict[str, str] = field(default_factory=dict)  # path in vLLM -> content
    results: tuple[str, ...] = ()  # results files under kernels/results/
    benchmarks: list[str] = field(default_factory=list)


UPSTREAM_FILES = "upstream"  # beside the series directories


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
    return Upstreaming(
        tag=patch.trailer("Upstream-Tag") or "[Misc]",
        tests=tests,
        results=tuple(patch.trailer_values("Upstream-Results")),
        benchmarks=patch.trailer_values("Upstream-Benchmark"),
    )
