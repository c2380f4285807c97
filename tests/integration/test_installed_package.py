"""moe-patch installed as a plain (non-editable) package and run outside any checkout: it
reads the series it ships, refuses to write into it, and says what needs a checkout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_support import pip_install

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The project's wheel (pip builds it, as a user's ``pip install .`` does) installed
    into a folder of its own."""
    folder = tmp_path_factory.mktemp("moe-patch-package")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "--quiet", "--wheel-dir", str(folder / "dist"), str(ROOT)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"pip could not build moe-patch's wheel: {built.stderr[-2000:]}")
    return pip_install(next((folder / "dist").glob("moe_patch-*.whl")), folder / "site")


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_python(site, cwd, "-m", "moe_patch", *args)


def run_python(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    for name in ("MOE_PATCH_SERIES", "MOE_PATCH_KERNEL_TESTS", "MOE_PATCH_RESULTS"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


@pytest.mark.network  # pip fetches the build backend for its isolated build
def test_the_package_works_outside_a_checkout(installed, tmp_path):
    where = run(installed, tmp_path, "--version")
    assert where.returncode == 0 and "moe-patch, version" in where.stdout
    listed = run(installed, tmp_path, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    shipped = sorted({row["base"] for row in json.loads(listed.stdout)})
    ours = (ROOT / "patches").iterdir()
    assert shipped == sorted(folder.name[1:] for folder in ours if (folder / "series").is_file())
    # The series' GPU runs and release records travel with it: list and verify read them.
    gpu = {row["base"]: row["gpu"] for row in json.loads(listed.stdout)}
    assert gpu["0.34.0"] == "not run on a GPU yet" and gpu["0.20.0"].startswith("served a model")
    checked = run(installed, tmp_path, "release", "--check")
    assert checked.returncode == 0 and "release-version pass" in checked.stdout, checked.stdout

    refused = run(installed, tmp_path, "rebase", "--onto", "0.21.0", "--from", "0.20.0")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"moe-patch: error: rebase writes a series, and {installed / 'moe_patch' / '_series'} "
        "is the copy shipped inside the installed moe-patch: run it from a moe-patch "
        "checkout, or pass --patches DIR"
    ]
    assert not any(tmp_path.iterdir())  # nothing was made


@pytest.mark.network
def test_the_package_carries_the_results_its_patches_cite(installed, tmp_path):
    """pr's descriptions show the measurements a patch's Upstream-Results: names; without a
    checkout they come from the package."""
    cited = sorted(
        {
            line.split(":", 1)[1].split()[0]  # the file; row selectors may follow
            for patch in (ROOT / "patches").glob("v*/*.patch")
            for line in patch.read_text().split("\ndiff --git ", 1)[0].splitlines()
            if line.startswith("Upstream-Results:")
        }
    )
    assert cited
    script = (
        "import json, sys; from moe_patch.settings import Settings; "
        "folder = Settings.resolve().results_dir; "
        "print(json.dumps([str(folder), [(folder / n).is_file() for n in sys.argv[1:]]]))"
    )
    shown = run_python(installed, tmp_path, "-c", script, *cited)
    assert shown.returncode == 0, shown.stderr
    folder, present = json.loads(shown.stdout)
    assert Path(folder).is_relative_to(installed) and present == [True] * len(cited)
