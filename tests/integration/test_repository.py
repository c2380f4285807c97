"""The repository itself: its code passes its own ruff configuration, and no tracked file
names the machine it was made on."""

import re
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


# An absolute path under a directory that exists on one machine only. What is not the
# machine's is written with a placeholder instead: <site-packages>/, <scratch>/, <checkout>/.
MACHINE_PATH = re.compile(
    r"(?<![\w.<>])/(root|home|work|check|Users|opt|mnt|scratch|farm|tmp)/[\w.-]+"
)
# A recorded host name (pytest's JUnit XML writes one per test suite).
HOST_NAME = re.compile(r"""\bhostname=["'](?!&lt;host&gt;["'])[^"']+["']""")
# Example values in code and tests that look like machine paths but are the subject of the
# code around them; allowed under tests/ and tooling/ only (tests move between files).
ALLOWED_IN_CODE = {
    "/tmp/absolute-escape.txt": "a hostile archive member or patch path outside the tree",
    "/tmp/outside.py": "a hostile patch that writes outside the tree",
    "/opt/my-ruff": "a ruff configured by path, as a user would give it",
    "/opt/venv": "--help text: an image's site-packages, as an example",
}
CODE = ("tests/", "tooling/")


# Files whose machine-looking strings are all examples: this test's own.
ALLOWED_FILES = {"tests/integration/test_repository.py"}


def _repository_text_files() -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs the repository's git checkout")
    names = [name for name in listed.split("\0") if name and name not in ALLOWED_FILES]
    return [name for name in names if (ROOT / name).is_file()]


def machine_names(name: str, text: str) -> list[str]:
    """``file:line: match`` for each machine path or host name in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in MACHINE_PATH.finditer(line):
            if not (name.startswith(CODE) and match.group(0) in ALLOWED_IN_CODE):
                found.append(f"{name}:{number}: {match.group(0)}")
        found += [f"{name}:{number}: {m.group(0)}" for m in HOST_NAME.finditer(line)]
    return found


def test_no_file_names_the_machine_it_was_made_on():
    offenders = []
    for name in _repository_text_files():
        data = (ROOT / name).read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary: plots
        offenders += machine_names(name, data.decode("utf-8", errors="replace"))
    assert offenders == [], "\n".join(offenders[:20])


# The samples spell each top folder as {name} so that this file itself names no machine.
@pytest.mark.parametrize(
    "line",
    [
        "/{opt}/torch/.venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224: Warning",
        "Using cache directory: /{tmp}/moe-e2e-qwen3-30b-a3b-fp8-static-patched-0wy1y5au/caches",
        '"command": "python -m moe_kernels.bench --tree a=/{root}/trees/a --out /{work}/o.json"',
        '<testsuite name="pytest" hostname="vm">',
        "file:///{home}/someone/vllm/fused_moe.py",
        "/{opt}/venv/lib/python3.12/site-packages/vllm",  # an example value, outside code
    ],
)
def test_machine_names_are_recognised(line):
    folders = {name: name for name in ("opt", "tmp", "root", "work", "home")}
    assert machine_names("kernels/results/x.log", line.format(**folders))


@pytest.mark.parametrize(
    "line",
    [
        "<site-packages>/torch/profiler/profiler.py:224: Warning",
        "Using cache directory: <scratch>/caches/vllm/torch_compile_cache",
        "python -m moe_kernels.bench --tree 0.21.0=.gpu/trees/0.21.0 --out $OUT/bench.json",
        '<testsuite name="pytest" hostname="&lt;host&gt;">',
        "vllm/model_executor/layers/fused_moe/fused_moe.py and https://example.org/{home}/x",
    ],
)
def test_placeholders_and_relative_paths_pass(line):
    assert machine_names("kernels/results/x.log", line.format(home="home")) == []
