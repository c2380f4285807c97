"""A child started through ``children.run`` does not outlive a parent killed with SIGKILL."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

PARENT = """
import sys
from moe_patch import children
children.run([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(30)"])
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_child_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child outlived its killed parent"


def test_plain_subprocess_outlives_its_parent():
    """The control: without ``children.run`` the child survives (what leaked pip's scratch)."""
    code = PARENT.replace("children.run(", "__import__('subprocess').run(")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(0.5)
    try:
        assert _alive(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_exit_code_and_output_pass_through():
    from moe_patch import children

    done = children.run(
        [sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"],
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout) == (3, "hi\n")
