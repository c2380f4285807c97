"""Test-only: SIGKILL a moe-patch run's process group at a chosen boundary.

The kill tests start moe-patch as ``python -c "import killhook; killhook.main()"``; the
product never imports this.  Boundaries are every child process moe-patch starts (git, pip)
and every change it makes to the file system itself (``os.mkdir``, ``rename``, ``replace``,
``unlink``, ``rmdir``: ``shutil.rmtree``, ``tempfile`` and ``pathlib`` go through them).

Environment:

``MOE_PATCH_KILL_AT=N``
    kill the group at boundary N (1-based);
``MOE_PATCH_KILL_ON=TEXT[#K]``
    kill at the K-th (default first) child whose command line contains TEXT;
``MOE_PATCH_KILL_DURING=1``
    a child boundary is killed while the child runs: as soon as a git lock file appears in
    the repository it works in, else the moment it exits (before moe-patch reads its answer);
    otherwise the group is killed just before the boundary;
``MOE_PATCH_KILL_LOG=FILE``
    append one line per boundary to FILE (``child ARGV`` / ``fs OP PATH``): how a test counts
    them in an uninterrupted run and chooses its points.

The kill is ``os.killpg(0, SIGKILL)``: moe-patch and every child it started die at once, with
no clean-up, as when a user's terminal, a CI runner or the OOM killer ends the job.
"""

from __future__ import annotations

import os
import shutil  # noqa: F401 - imported first, so that it chooses its fd-based rmtree as usual
import signal
import subprocess
import sys
import tempfile  # noqa: F401 - likewise
import time

_AT = int(os.environ.get("MOE_PATCH_KILL_AT") or 0)
_ON, _, _NTH = (os.environ.get("MOE_PATCH_KILL_ON") or "").partition("#")
_DURING = os.environ.get("MOE_PATCH_KILL_DURING") == "1"
_LOG = os.environ.get("MOE_PATCH_KILL_LOG")
_LOCKS = (".git/index.lock", ".git/HEAD.lock", "index.lock", "HEAD.lock")

_count = 0
_matches = 0


def _die() -> None:
    os.killpg(0, signal.SIGKILL)
    time.sleep(60)  # never reached: the signal is delivered before killpg returns


def _boundary(kind: str, text: str) -> bool:
    """Count a boundary; True if this is the one to kill at."""
    global _count, _matches
    _count += 1
    if _LOG:
        with open(_LOG, "a") as log:
            log.write(f"{kind} {text}\n".replace("\n", " ").rstrip() + "\n")
    if _AT:
        return _count == _AT
    if _ON and kind == "child" and _ON in text:
        _matches += 1
        return _matches == int(_NTH or 1)
    return False


def _watch(process: subprocess.Popen, cwd) -> None:
    """Kill the group once ``process`` holds a git lock, or when it has exited."""
    where = os.fspath(cwd) if cwd else os.getcwd()
    locks = [os.path.join(where, name) for name in _LOCKS]
    deadline = time.monotonic() + 5
    while process.poll() is None and time.monotonic() < deadline:
        if any(os.path.exists(lock) for lock in locks):
            break
    _die()


def install() -> None:
    real_init = subprocess.Popen.__init__

    def popen_init(self, args, *rest, **kwargs):
        text = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
        chosen = _boundary("child", text)
        if chosen and not _DURING:
            _die()
        real_init(self, args, *rest, **kwargs)
        if chosen:
            _watch(self, kwargs.get("cwd"))

    subprocess.Popen.__init__ = popen_init

    for name in ("mkdir", "rename", "replace", "unlink", "rmdir"):
        real = getattr(os, name)

        def hooked(*args, _real=real, _name=name, **kwargs):
            if _boundary("fs", f"{_name} {args[0]}"):
                _die()
            return _real(*args, **kwargs)

        setattr(os, name, hooked)


def main() -> None:
    install()
    sys.argv[0] = "moe-patch"
    from moe_patch.cli import main as cli

    cli()


# --- for the tests: start moe-patch with the hook, kill it -------------------------------

COMMAND = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
    "import killhook; killhook.main()",
]


def run_killed(args: list[str], env: dict, **kill: str) -> subprocess.CompletedProcess:
    """Run ``moe-patch ARGS`` in its own process group, to be killed as ``kill`` says
    (``at``, ``on``, ``during``, ``log``: the variables above, lower-cased)."""
    names = {"at": "MOE_PATCH_KILL_AT", "on": "MOE_PATCH_KILL_ON"}
    names.update(during="MOE_PATCH_KILL_DURING", log="MOE_PATCH_KILL_LOG")
    env = {k: v for k, v in env.items() if k not in names.values()}
    env.update({names[key]: "1" if value is True else str(value) for key, value in kill.items()})
    return subprocess.run(
        [*COMMAND, *args],
        env=env,
        capture_output=True,
        text=True,
        start_new_session=True,  # its own process group: the kill takes nothing else with it
        timeout=300,
    )
