"""SIGKILL at chosen points of each command; the next run of the same command succeeds.

A run of each command is first made uninterrupted with the test-only hook of
:mod:`killhook` counting its boundaries: every git or pip child it starts, and every change it
makes to the file system itself.  Then, for each of ``POINTS`` boundaries spread over that
run, the command is started again and its whole process group is SIGKILLed there (children
included; at a child boundary both just before the child starts and while it runs, git holding
its locks), and the same command is run once more.  That next run must succeed and
give what an uninterrupted run gives (the same commits, files, wheel bytes, installed bytes),
and nothing may be left behind: no scratch folder beside the target, in the cache or in the
temporary folder, no half-written file, no git lock.

Points are chosen from the boundaries deterministically (each git command that writes, killed
while it holds its locks; then evenly over the other child boundaries and the file-system
ones), so a failure names its point and reproduces: run the command with
``MOE_PATCH_KILL_AT=<n>`` (and ``MOE_PATCH_KILL_DURING=1``) through ``killhook``.  The apply
and rebase sweeps also check that many of their kills left git's own lock files in the tree.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from killhook import run_killed
from support import KERNEL_MODULE, git, make_sdist, release_files, tree_digest
from wheel_support import add_wheel, make_wheel, pip_install, record_problems

CLI = [sys.executable, "-c", "from moe_patch.cli import main; main()"]
POINTS = int(os.environ.get("MOE_PATCH_KILL_POINTS", "50"))


@dataclass(frozen=True)
class Point:
    at: int  # the boundary, counted from 1
    during: bool  # a child boundary: killed while the child runs (else just before it)
    what: str  # the boundary as the hook logged it

    def __str__(self) -> str:
        return f"kill {'during' if self.during else 'before'} boundary {self.at} ({self.what})"


def boundaries(args: list[str], env: dict, log: Path) -> list[str]:
    """The boundaries of an uninterrupted ``moe-patch ARGS`` (which must succeed)."""
    log.unlink(missing_ok=True)
    done = run_killed(args, env, log=log)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


def _spread(items: list, count: int) -> list:
    if count <= 0 or not items:
        return []
    if count >= len(items):
        return list(items)
    step = (len(items) - 1) / max(count - 1, 1)
    return [items[round(i * step)] for i in range(count)]


# git commands that write the index, refs or objects: each is also killed while it runs (and
# holds index.lock, where it writes the index), before the points spread over the rest.
_WRITES = re.compile(r"^child git (-c \S+ )*(am|checkout|cherry-pick|clone|commit|reset|add)\b")


def choose(lines: list[str], count: int, first: int = 1, last: int | None = None) -> list[Point]:
    """``count`` points over boundaries ``first``..``last``: every git command that writes,
    killed while it runs; then three in five of the rest at child boundaries (before and
    during), the others at file-system ones."""
    window = list(enumerate(lines, 1))[first - 1 : last]
    writing = [Point(n, True, line) for n, line in window if _WRITES.match(line)]
    chosen = _spread(writing, count)
    children = [
        Point(n, during, line)
        for n, line in window
        if line.startswith("child ")
        for during in (False, True)
        if Point(n, during, line) not in chosen
    ]
    files = [Point(n, False, line) for n, line in window if line.startswith("fs ")]
    left = count - len(chosen)
    on_children = min(len(children), max(left - len(files), math.ceil(left * 0.6)))
    chosen += _spread(children, on_children) + _spread(files, left - on_children)
    assert len(set(chosen)) == count, f"only {len(set(chosen))} of {count} points to choose from"
    return sorted(set(chosen), key=lambda p: (p.at, p.during))


def kill(args: list[str], env: dict, point: Point) -> None:
    done = run_killed(args, env, at=point.at, during=point.during)
    assert done.returncode == -signal.SIGKILL, f"{point} did not land: {done.stderr}"


def cli(args: list[str], env: dict, point: Point | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"after {point}: {done.stderr}"
    assert "Traceback" not in done.stderr
    return done


def left_behind(*, beside=(), cache: Path | None = None, temporary=None, trees=()) -> list[str]:
    """Every scratch or half-written name a run may leave: beside each of ``beside``, under
    ``cache``, in ``temporary``; and git locks, moe-patch's lock record and half-written
    files in each of ``trees``' git directory."""
    found = []
    for path in beside:
        found += [p.name for p in path.parent.iterdir() if p.name.startswith(".tmp")]
        if path.is_dir():
            found += [p.name for p in path.iterdir() if p.name.startswith(".") and "part" in p.name]
    if cache is not None:
        for path in cache.rglob("*"):
            if path.name.startswith((".tmp", "tmp")) or ".part" in path.name:
                found.append(str(path.relative_to(cache)))
        if (cache / "scratch").is_dir():
            found += [f"scratch/{p.name}" for p in (cache / "scratch").iterdir()]
    if temporary is not None:
        found += [f"TMPDIR/{p.name}" for p in Path(temporary).iterdir()]
    for tree in trees:
        for path in (tree / ".git").rglob("*"):
            name = path.name
            if (name.endswith(".lock") and name != "moe-patch.lock") or ".part-" in name:
                found.append(str(path.relative_to(tree)))
            elif name == "moe-patch-owner.json" or name.startswith("tmp_"):
                found.append(str(path.relative_to(tree)))
    return found


def git_locks(tree: Path) -> list[str]:
    """The lock files git has in ``tree`` (moe-patch's own lock file is not git's)."""
    if not (tree / ".git").is_dir():
        return []
    found = (tree / ".git").rglob("*.lock")
    return sorted(p.name for p in found if p.name != "moe-patch.lock")


@pytest.fixture
def world(fake_index, series_root, cache_dir, tmp_path):
    """Releases 1.0.0 (sdist and wheel) and 1.1.0 on the index; a private temporary folder."""
    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    moved = "# a new header comment\n" + KERNEL_MODULE.replace("return 1\n", "return 2\n")
    fake_index.add("1.1.0", make_sdist("1.1.0", release_files("1.1.0", moved)))
    temporary = tmp_path / "tmpdir"
    temporary.mkdir()
    env = dict(os.environ, TMPDIR=str(temporary))
    return {"env": env, "cache": cache_dir, "series": series_root, "tmp": temporary}


def _fresh_cache(env: dict, path: Path, template: Path | None = None) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    if template is not None:
        shutil.copytree(template, path, symlinks=True)
    env["MOE_PATCH_CACHE"] = str(path)
    return path


def work_files(tree: Path) -> str:
    """Digest of the checked-out files (not .git, whose packing may differ)."""
    scratch = tree.parent / f"{tree.name}-files"
    shutil.copytree(tree, scratch, ignore=shutil.ignore_patterns(".git"))
    try:
        return tree_digest(scratch)
    finally:
        shutil.rmtree(scratch)


def test_kill_apply(world, tmp_path):
    """``apply`` into a new tree from a cold cache (listing, download, unpack, the cache's
    repository), from a warm one (clone, patches, branch), and again over the tree it made."""
    env, log = world["env"], tmp_path / "boundaries"
    reference = tmp_path / "reference"
    cold = boundaries(["apply", "--vllm", "1.0.0", "--into", str(reference)], env, log)
    head, files = git(reference, "rev-parse", "moe-patch/v1.0.0"), work_files(reference)
    warm_cache = Path(env["MOE_PATCH_CACHE"])
    # The cold run's own boundaries up to its first clone; a warm run's after that.
    clone = next(n for n, line in enumerate(cold, 1) if line.startswith("child git clone"))
    warm = boundaries(["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "w")], env, log)
    again = boundaries(["apply", "--vllm", "1.0.0", "--into", str(reference)], env, log)
    plan = [("cold", p) for p in choose(cold, POINTS // 5, last=clone - 1)]
    plan += [("warm", p) for p in choose(warm, POINTS - POINTS // 5)]
    plan += [("again", p) for p in choose(again, POINTS // 2)]

    existing = tmp_path / "existing"
    cli(["apply", "--vllm", "1.0.0", "--into", str(existing)], env)
    caught = 0  # points where the kill left git's own lock files in the tree
    for number, (kind, point) in enumerate(plan):
        template = None if kind == "cold" else warm_cache
        cache = _fresh_cache(env, tmp_path / "cache-point", template)
        into = existing if kind == "again" else tmp_path / f"t-{number}"
        args = ["apply", "--vllm", "1.0.0", "--into", str(into)]
        kill(args, env, point)
        caught += bool(git_locks(into))
        cli(args, env, point)
        assert git(into, "rev-parse", "moe-patch/v1.0.0") == head, point
        assert git(into, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0", point
        assert git(into, "status", "--porcelain") == "", point
        assert work_files(into) == files, point
        assert [p.name for p in (cache / "trees").iterdir()] == ["v1.0.0.git"], point
        assert not list((cache / "sdist").iterdir()), point
        stray = left_behind(beside=[into], cache=cache, temporary=world["tmp"], trees=[into])
        assert stray == [], point
        if kind != "again":
            shutil.rmtree(into)
    assert caught >= 5, f"only {caught} kills left git locks: the sweep misses the case"


def test_kill_apply_installed(world, tmp_path):
    """``apply --installed``: the throwaway release tree, the backups, the package files, its
    bytecode and RECORD.  The next apply finishes the job (an interrupted one is rolled back
    first), and revert still gives back the installed release byte for byte."""
    env, log = world["env"], tmp_path / "boundaries"
    name, data = make_wheel("1.0.0")
    (tmp_path / name).write_bytes(data)
    pristine = pip_install(tmp_path / name, tmp_path / "pristine")
    release = tree_digest(pristine)
    site = tmp_path / "site"
    args = ["apply", "--installed", "--target", str(site)]
    shutil.copytree(pristine, site, symlinks=True)  # copy2 keeps mtimes: the same bytecode
    cli(["apply", "--vllm", "1.0.0", "--into", str(tmp_path / "warm")], env)  # a warm cache
    lines = boundaries(args, env, log)
    patched = installed_digest(site)

    for point in choose(lines, POINTS):
        shutil.rmtree(site)
        shutil.copytree(pristine, site, symlinks=True)
        kill(args, env, point)
        cli(args, env, point)
        assert installed_digest(site) == patched, point
        assert record_problems(site) == [], point
        stray = left_behind(beside=[site], cache=world["cache"], temporary=world["tmp"])
        assert stray == [], point
        cli(["revert", "--installed", "--target", str(site)], env, point)
        assert tree_digest(site) == release, point


def installed_digest(site: Path) -> str:
    """Every file of an install but those that hold the patch time (bytecode of the patched
    files, RECORD's hashes of it, the state file's mtimes); RECORD is checked on its own."""
    scratch = site.parent / f"{site.name}-files"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(site, scratch, ignore=shutil.ignore_patterns("*.pyc", "RECORD", "state.json"))
    try:
        return tree_digest(scratch)
    finally:
        shutil.rmtree(scratch)


def test_kill_rebase(world, tmp_path):
    """``rebase``: the work tree, the series as commits, each patch's 3-way replay, the new
    series directory.  Run again, the same command goes on with (or reports) the rebase."""
    env, log = world["env"], tmp_path / "boundaries"
    cli(["apply", "--vllm", "1.1.0", "--into", str(tmp_path / "warm")], env)  # a warm cache

    def fresh_series(name):
        root = tmp_path / name
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(world["series"], root)
        env["MOE_PATCH_SERIES"] = str(root)
        return root

    root = fresh_series("reference-series")
    reference = tmp_path / "reference"
    lines = boundaries(["rebase", "--onto", "1.1.0", "--into", str(reference)], env, log)
    head = git(reference, "rev-parse", "HEAD")
    written = {p.name: p.read_bytes() for p in (root / "v1.1.0").iterdir()}
    assert set(written) == {"series", "jit.patch", "extra.patch"}

    caught = 0  # points where the kill left git's own lock files in the tree
    for number, point in enumerate(choose(lines, POINTS)):
        root = fresh_series("series")
        into = tmp_path / f"r-{number}"
        args = ["rebase", "--onto", "1.1.0", "--into", str(into)]
        kill(args, env, point)
        caught += bool(git_locks(into))
        cli(args, env, point)
        assert {p.name: p.read_bytes() for p in (root / "v1.1.0").iterdir()} == written, point
        assert git(into, "rev-parse", "HEAD") == head, point
        assert git(into, "status", "--porcelain") == "", point
        assert not (into / ".git" / "moe-patch-rebase").exists(), point
        stray = left_behind(
            beside=[into, root / "v1.1.0"], cache=world["cache"], temporary=world["tmp"]
        )
        assert stray + left_behind(trees=[into]) == [], point
        shutil.rmtree(into)
    assert caught >= 5, f"only {caught} kills left git locks: the sweep misses the case"


def test_kill_wheel(world, tmp_path):
    """``wheel``: pip's download of the official wheel into the cache (cold), the throwaway
    release tree, the carried files, the new wheel's write (warm)."""
    env, log = world["env"], tmp_path / "boundaries"
    reference = tmp_path / "dist-reference"
    cold = boundaries(["wheel", "--vllm", "1.0.0", "-o", str(reference)], env, log)
    (built,) = reference.iterdir()
    warm_cache = Path(env["MOE_PATCH_CACHE"])
    # The cold run's boundaries up to the end of pip's download; a warm run's after that.
    pip = next(n for n, line in enumerate(cold, 1) if " -m pip download " in line)
    done = next(n for n, line in enumerate(cold[pip:], pip + 1) if line.startswith("child git"))
    warm = boundaries(["wheel", "--vllm", "1.0.0", "-o", str(tmp_path / "d")], env, log)
    plan = [("cold", p) for p in choose(cold, POINTS // 5, last=done - 1)]
    plan += [("warm", p) for p in choose(warm, POINTS - POINTS // 5)]

    for number, (kind, point) in enumerate(plan):
        cache = _fresh_cache(env, tmp_path / "cache-point", warm_cache if kind == "warm" else None)
        dist = tmp_path / f"dist-{number}"
        args = ["wheel", "--vllm", "1.0.0", "-o", str(dist)]
        kill(args, env, point)
        cli(args, env, point)
        assert [p.name for p in dist.iterdir()] == [built.name], point
        assert (dist / built.name).read_bytes() == built.read_bytes(), point
        assert left_behind(beside=[dist], cache=cache, temporary=world["tmp"]) == [], point
        shutil.rmtree(dist)


def test_kill_verify(world, tmp_path):
    """``verify`` over both releases, from a warm cache: its throwaway release trees live in
    the cache's scratch, so a killed run's are swept by the next run."""
    env, log = world["env"], tmp_path / "boundaries"
    args = ["verify", "--jobs", "1", "--json"]
    boundaries(["apply", "--vllm", "1.1.0", "--into", str(tmp_path / "warm")], env, log)
    warm_cache = Path(env["MOE_PATCH_CACHE"])
    reference = _verdicts(cli(args, env))
    plan = choose(boundaries(args, env, log), POINTS // 2)

    for point in plan:
        cache = _fresh_cache(env, tmp_path / "cache-point", warm_cache)
        kill(args, env, point)
        assert _verdicts(cli(args, env, point)) == reference, point
        assert left_behind(cache=cache, temporary=world["tmp"]) == [], point


def _verdicts(done: subprocess.CompletedProcess) -> dict:
    """verify's JSON report without its timings."""
    report = json.loads(done.stdout)
    report.pop("elapsed_s")
    for release in report["releases"]:
        release.pop("seconds")
    return report
