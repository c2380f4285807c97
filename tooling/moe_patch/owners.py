"""Which run left a scratch name or a lock behind, and whether that run is still alive.

A run killed hard (SIGKILL, the OOM killer, a reboot) cannot clean up; the next run removes
what it left, but only once the run that made it is gone.  A run is named by its process id
and that process's start time (process ids are reused): ``12345.678901`` in scratch names,
both numbers in lock records.  Where the start time cannot be read (no ``/proc``), the
process id alone is used.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

# "<pid>" or "<pid>.<start>", then "-": what a scratch name carries after its prefix.
_TAG = r"(?P<pid>\d+)(?:\.(?P<start>\d+))?-"


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, from ``/proc``), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None


def tag() -> str:
    """This process, as scratch names carry it."""
    pid = os.getpid()
    start = start_time(pid)
    return f"{pid}" if start is None else f"{pid}.{start}"


def record() -> dict:
    """This process, as lock records carry it (``since``: the wall clock now, when it takes
    what the record is for)."""
    pid = os.getpid()
    return {"pid": pid, "start": start_time(pid), "since": time.time()}


def alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` (started at ``start``, when known) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    if start is None:
        return True
    now = start_time(pid)
    return now is None or now == start


def held_open(paths: list[Path]) -> set[Path]:
    """Which of ``paths`` a running process has open (read from ``/proc``; none where there
    is no ``/proc``).  git keeps a lock file open while it works under it."""
    wanted = {str(path): path for path in paths}
    held: set[Path] = set()
    try:
        processes = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return held
    for pid in processes:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone meanwhile, or another user's
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target in wanted:
                    held.add(wanted[target])
    return held


def tagged(directory: Path, head: str) -> list[tuple[Path, bool]]:
    """The entries of ``directory`` named ``head`` (a regular expression) + a run's tag +
    ``-…``, each with whether its run is alive.  Symbolic links are never listed: moe-patch
    makes none, so one is not its leftover."""
    pattern = re.compile(head + _TAG)
    found = []
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    for path in entries:
        match = pattern.match(path.name)
        if match and not path.is_symlink():
            start = match.group("start")
            found.append((path, alive(int(match.group("pid")), int(start) if start else None)))
    return found


def stale(directory: Path, prefix: str) -> list[Path]:
    """The entries of ``directory`` named ``prefix`` + a run's tag + ``-…`` whose run is gone."""
    return [path for path, live in tagged(directory, re.escape(prefix)) if not live]


def remove(path: Path) -> None:
    """Delete a leftover file or folder, whatever is in it."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def sweep(directory: Path, prefix: str) -> list[Path]:
    """Remove :func:`stale` entries; the removed paths."""
    removed = stale(directory, prefix)
    for path in removed:
        remove(path)
    return removed
