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
