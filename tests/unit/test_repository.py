"""The project's own code passes its ruff configuration (pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATHS = ["tooling", "kernels", "tests"]


def _ruff() -> str:
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if not found:
        pytest.fail("ruff is not installed: it is part of the [test] extra")
    return found


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(args):
    result = subprocess.run([_ruff(), *args, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# Where a file of the repository would name the machine it was made on: a home or work
# directory, the GPU machine's output folder, pytest's temporary folders.
MACHINE_PATH = r"(^|[^\w$.])/(root|work|farm|home/[\w.-]+|Users/[\w.-]+|tmp/pytest-of-[\w-]+)/"


def test_no_tracked_file_names_a_machine_path():
    import re

    if not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    pattern = re.compile(MACHINE_PATH.encode())
    offenders = []
    for name in filter(None, listed):
        data = (ROOT / name.decode()).read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (plots)
        for number, line in enumerate(data.splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{name.decode()}:{number}")
    assert offenders == [], offenders[:10]
