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
    a child boundary is killed while the child runs: a git child is given the hooks of
    ``git_kill_hooks/``, which end the group while git holds ``index.lock`` (its "file system
    monitor", asked when it reads the index under the lock) or the locks of the refs it
    updates (``reference-transaction``); any child that takes no lock is killed the moment
    it exits, before moe-patch reads its answer.  Otherwise the group is killed just before
    the boundary;
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
_GIT_HOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "git_kill_hooks")

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


def _watch(process: subprocess.Popen) -> None:
    """Kill the group when ``process`` has exited (if a kill hook has not ended it first)."""
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    _die()


def _with_kill_hooks(args: list) -> list:
    """``git ARGS`` with the kill hooks of ``git_kill_hooks/`` configured last, so that they
    win over moe-patch's own settings: git ends the run itself while it holds its locks."""
    at = 1
    while at < len(args) and args[at] in ("-c", "-C"):
        at += 2
    hooks = ["-c", f"core.hooksPath={_GIT_HOOKS}", "-c", f"core.fsmonitor={_GIT_HOOKS}/fsmonitor"]
    return [*args[:at], *hooks, *args[at:]]


def install() -> None:
    real_init = subprocess.Popen.__init__

    def popen_init(self, args, *rest, **kwargs):
        text = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
        chosen = _boundary("child", text)
        if chosen and not _DURING:
            _die()
        if chosen and isinstance(args, list) and args[:1] == ["git"]:
            args = _with_kill_hooks(args)
        real_init(self, args, *rest, **kwargs)
        if chosen:
            _watch(self)

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
