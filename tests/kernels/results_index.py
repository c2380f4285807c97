"""kernels/results/index.json: which series version and commit each result file measured.

Each file under ``kernels/results/`` (other than the READMEs and the index itself) has an
entry ``{"series", "commit", "study"}``:

* ``commit``: the commit that added the file (``git log --diff-filter=A --follow``, so a
  later move does not change it);
* ``series``: ``__version__`` of ``tooling/moe_patch/__init__.py`` at that commit, the
  moe-patch version whose series the measurement ran;
* ``study``: the folder under ``kernels/results/`` it sits in.

``test_results_index.py`` fails when a file lacks an entry or an entry names no file.
After adding results, write the entries of the new files from the repository root:

    python tests/kernels/results_index.py

Existing entries are kept; entries of files that are gone are dropped. A file that is
moved but not yet committed takes the history of the tracked file of the same name that
is missing from the working tree; a file not yet committed at all gets the checkout's
HEAD and version (the series it was measured on), and the script says so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path("kernels", "results")
INDEX = RESULTS / "index.json"
VERSION_FILE = "tooling/moe_patch/__init__.py"
_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def is_indexed(name: str) -> bool:
    """Result files have entries; the READMEs and the index itself do not."""
    return name != "index.json" and Path(name).name != "README.md"


def result_files(root: Path = ROOT) -> list[str]:
    """Files under kernels/results/ (relative to it) that the repository holds or will hold:
    tracked or not ignored, present in the working tree; without git, every file there."""
    base = root / RESULTS
    try:
        listed = _git(
            root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", str(RESULTS)
        ).split("\0")
        names = {Path(n).relative_to(RESULTS).as_posix() for n in listed if n}
        names = {n for n in names if (base / n).is_file()}
    except (OSError, subprocess.CalledProcessError):
        names = {p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()}
    return sorted(n for n in names if is_indexed(n))


def load_index(root: Path = ROOT) -> dict[str, dict[str, str]]:
    return json.loads((root / INDEX).read_text())


def dump_index(index: dict) -> str:
    return json.dumps(index, indent=2, sort_keys=True) + "\n"


def series_at(root: Path, commit: str) -> str:
    text = _git(root, "show", f"{commit}:{VERSION_FILE}")
    return _VERSION.search(text).group(1)


def added_by(root: Path, path: str) -> str | None:
    """Short hash of the commit that first added ``path`` (a repository path), if any.

    ``--follow`` crosses moves; with git's default 50% similarity it also takes a new
    file for a copy of a similar one added earlier (native-test logs of two releases,
    two searches in one format), so only near-identical files count as moved."""
    found = _git(
        root, "log", "--diff-filter=A", "--follow", "-M90%", "--format=%h", "--", path
    ).split()
    return found[-1] if found else None


def _moved_from(root: Path, name: str) -> str | None:
    """The tracked results file of the same name that the working tree no longer has."""
    deleted = _git(root, "ls-files", "--deleted", "--", str(RESULTS)).split("\n")
    same = [d for d in deleted if d and Path(d).name == Path(name).name]
    return same[0] if len(same) == 1 else None


def entry_for(root: Path, name: str) -> dict[str, str]:
    path = (RESULTS / name).as_posix()
    commit = added_by(root, path)
    if commit is None:
        old = _moved_from(root, name)
        commit = added_by(root, old) if old else None
    if commit is None:
        commit = _git(root, "rev-parse", "--short", "HEAD").strip()
        series = _VERSION.search((root / VERSION_FILE).read_text()).group(1)
        print(f"{name}: not committed yet; recorded HEAD {commit}, series {series}")
    else:
        series = series_at(root, commit)
    return {"commit": commit, "series": series, "study": name.split("/")[0]}


def update(root: Path = ROOT) -> dict[str, dict[str, str]]:
    index_path = root / INDEX
    old = json.loads(index_path.read_text()) if index_path.exists() else {}
    files = result_files(root)
    index = {
        name: {**old[name], "study": name.split("/")[0]} if name in old else entry_for(root, name)
        for name in files
    }
    index_path.write_text(dump_index(index))
    return index


if __name__ == "__main__":
    os.chdir(ROOT)
    written = update()
    print(f"{INDEX}: {len(written)} files")
    sys.exit(0)
