"""verify, rebase, checkout and export on real release trees."""

import json
import re
import shutil
import time

import pytest
from click.testing import CliRunner
from moe_patch import applier, gitutil, patchfile, probes, series, sources
from moe_patch.cli import main
from moe_patch.settings import default_series_root
from releases import SUPPORTED
from support import tree_digest
from synthetic import CONFLICTING_DECORATOR, FUSED_MOE, RENAMED, next_release

pytestmark = [pytest.mark.release, pytest.mark.network]

NEWEST = SUPPORTED[-1]
NEXT = "0.99.0"  # the synthetic release after NEWEST
JIT = "jit-annotations"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def workshop(tmp_path_factory):
    """The newest real release, two synthetic next releases made from it, and a copy
    of the series that serves the newest release today (the patches that apply to it)."""
    root = tmp_path_factory.mktemp("maintainer")
    newest = sources.from_cache(NEWEST, root / f"vllm-{NEWEST}", None)
    clean = next_release(newest.path, root / "next", NEXT, NEWEST)
    conflicting = next_release(newest.path, root / "next-conflict", NEXT, NEWEST, conflict=True)
    base = series.base_for(NEWEST)
    serving = series.load(base)
    report = applier.apply_series(newest.path, newest.base, NEWEST, serving)
    carried = [
        o.id
        for o in report.outcomes
        if o.status in ("applied", "applied (3-way)", "already upstream")
    ]
    assert JIT in carried, report.outcomes
    patches = root / "patches"
    (patches / f"v{base}").mkdir(parents=True)
    for name in [p.path.name for p in serving.patches if p.id in carried]:
        shutil.copyfile(serving.directory / name, patches / f"v{base}" / name)
    (patches / f"v{base}" / "series").write_text("".join(f"{i}.patch\n" for i in carried))
    return {"root": root, "clean": clean, "conflict": conflicting, "base": base, "ids": carried}


def fresh_series(workshop, name):
    copy = workshop["root"] / name
    shutil.copytree(workshop["root"] / "patches", copy)
    return copy


def results(output: str, ids: list[str]) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0] in ids:
            found[parts[0]] = parts[1]
    return found


def test_rebase_carries_the_series_onto_a_synthetic_next_release(workshop, tmp_path):
    patches = fresh_series(workshop, "carried")
    started = time.perf_counter()
    result = run(
        "rebase", "--onto", NEXT, "--from", workshop["base"], "--source", workshop["clean"],
        "--into", tmp_path / "work", "--patches", patches,
    )  # fmt: skip
    print(f"rebase onto the synthetic {NEXT}: {time.perf_counter() - started:.1f} s")
    assert result.exit_code == 0, result.output
    found = results(result.stdout, workshop["ids"])
    assert found[JIT] == "refreshed"
    assert set(found.values()) <= {"clean", "refreshed", "dropped"}
    new = patches / f"v{NEXT}"
    jit = patchfile.read(new / f"{JIT}.patch")
    assert f"def {RENAMED}(" in jit.hunks[0].header or RENAMED in jit.diff  # context refreshed
    assert "range-diff" in result.stdout
    # the new series applies exactly to the release it was made for
    applied = run(
        "apply", "--vllm", NEXT, "--source", workshop["clean"], "--into", tmp_path / "t",
        "--patches", patches, "--json",
    )  # fmt: skip
    assert applied.exit_code == 0, applied.output
    statuses = {p["id"]: p["status"] for p in json.loads(applied.stdout)["patches"]}
    assert statuses[JIT] == "applied", statuses
    found = probes.triton_no_specialize(
        tmp_path / "t", FUSED_MOE, "fused_moe_kernel", "EM", "num_valid_tokens"
    )
    assert found.found, found.detail
    # and the rebase tree exports to exactly what was written
    assert run("export", tmp_path / "work", "--check").exit_code == 0


def test_rebase_conflict_continue(workshop, tmp_path):
    patches = fresh_series(workshop, "conflict-continue")
    into = tmp_path / "work"
    stopped = run(
        "rebase", "--onto", NEXT, "--from", workshop["base"], "--source", workshop["conflict"],
        "--into", into, "--patches", patches,
    )  # fmt: skip
    assert stopped.exit_code == 9, stopped.output
    assert results(stopped.stdout, workshop["ids"])[JIT] == "conflict"
    assert f"{into}/{FUSED_MOE}" in stopped.stdout and "--continue" in stopped.stdout
    kernel = into / FUSED_MOE
    text = kernel.read_text()
    assert "<<<<<<<" in text and not (patches / f"v{NEXT}").exists()
    merged = CONFLICTING_DECORATOR.replace(
        "launch_metadata=None", 'launch_metadata=None, do_not_specialize=["EM", "num_valid_tokens"]'
    )
    kernel.write_text(re.sub(r"<<<<<<< .*?>>>>>>> [^\n]*\n", merged + "\n", text, flags=re.S))
    gitutil.run(into, "add", FUSED_MOE)
    done = run("rebase", "--continue", "--into", into)
    assert done.exit_code == 0, done.output
    assert "conflict resolved by hand" in done.stdout
    new = (patches / f"v{NEXT}" / f"{JIT}.patch").read_text()
    assert f"+{merged}" in new


def test_rebase_conflict_abort(workshop, tmp_path):
    patches = fresh_series(workshop, "conflict-abort")
    before = tree_digest(patches)
    into = tmp_path / "work"
    stopped = run(
        "rebase", "--onto", NEXT, "--from", workshop["base"], "--source", workshop["conflict"],
        "--into", into, "--patches", patches,
    )  # fmt: skip
    assert stopped.exit_code == 9, stopped.output
    aborted = run("rebase", "--abort", "--into", into)
    assert aborted.exit_code == 0, aborted.output
    assert not into.exists() and tree_digest(patches) == before


def test_verify_on_real_releases():
    chosen = sorted({SUPPORTED[0], "0.25.0", NEWEST})
    started = time.perf_counter()
    result = run("verify", *[a for v in chosen for a in ("--vllm", v)], "--json")
    print(f"verify {', '.join(chosen)}: {time.perf_counter() - started:.1f} s")
    report = json.loads(result.stdout)
    assert [r["version"] for r in report["releases"]] == chosen
    for entry in report["releases"]:
        names = [c["name"] for c in entry["checks"]]
        assert names == ["apply", "compile", "ruff-check", "ruff-format"]
        assert any(p["id"] == JIT for p in entry["patches"])
    failed = [(w, c) for w, c in _all(report) if c["status"] != "pass"]
    assert not failed and result.exit_code == 0, failed


def _all(report):
    for entry in report["series"]:
        for check in entry["checks"]:
            yield f"v{entry['base']}", check
    for entry in report["releases"]:
        for check in entry["checks"]:
            yield entry["version"], check


def test_verify_lists_the_supported_releases():
    assert json.loads(run("verify", "--list").stdout) == SUPPORTED


def test_checkout_export_round_trip_on_the_shipped_series(tmp_path):
    before = tree_digest(default_series_root())
    result = run("checkout", "--vllm", NEWEST, tmp_path / "work")
    assert result.exit_code == 0, result.output
    check = run("export", tmp_path / "work", "--check")
    assert check.exit_code == 0, check.output
    assert "unchanged" in check.stdout and tree_digest(default_series_root()) == before
