"""Child processes that end when moe-patch ends.

A run killed hard (SIGKILL, the OOM killer) cannot clean up; the next run removes its scratch
under the cache entry's lock. A pip child that outlived its parent would keep writing into
that scratch after the sweep (pip re-creates its ``--dest``), leaking it into the cache.
On Linux, children are therefore started with the parent-death signal set to SIGKILL."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def _end_with(parent: int):
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork; the child only calls it

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` whose child is killed if this process dies first."""
    if sys.platform.startswith("linux"):
        kwargs.setdefault("preexec_fn", _end_with(os.getpid()))
    return subprocess.run(command, **kwargs)
