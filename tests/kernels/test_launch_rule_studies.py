"""The assumptions behind the series' resident_depth_for, checked without a GPU:
a swapped tile's shared memory is what the rule counts (compiled for SM90 by Triton's
own ptxas), and the committed config searches favour three stages exactly where the
rule picks them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from moe_kernels.launch import patched_resident_depth
from studies import resident_depth

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "kernels" / "results" / "resident-depth"


def test_committed_stage_pairs_are_the_studys():
    pairs = resident_depth.stage_pairs(resident_depth.SEARCHES)
    committed = (RESULTS / "h200-stage-pairs.md").read_text()
    assert committed == resident_depth.pairs_markdown(pairs, resident_depth.SEARCHES)


def test_three_stages_win_where_the_rule_picks_them():
    pairs = resident_depth.stage_pairs(resident_depth.SEARCHES)
    picked = [p for p in pairs if resident_depth.group(p) == "three stages resident, four not"]
    assert len(picked) >= 30
    assert sum(p["ratio"] > 1 for p in picked) >= 0.9 * len(picked)
    assert min(p["ratio"] for p in picked) > 0.98
    for p in picked:  # and the rule, given four stages, does pick three there
        block_m, block_n, block_k = p["tile"]
        if p["cell"][1] == "block":  # the launcher clamps the K tile to the scale block
            block_k = min(block_k, 128)
        stage_bytes = (block_m + block_n) * block_k
        assert patched_resident_depth(4, p["programs"], stage_bytes, 132) == 3
    kept = [p for p in pairs if resident_depth.group(p) == "four stages resident"]
    assert resident_depth._geomean(p["ratio"] for p in kept) < 1.0


def _occupancy_rows(tree: Path, tmp_path: Path) -> list[list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    out = tmp_path / "occupancy.md"
    done = subprocess.run(
        [sys.executable, "-m", "studies.resident_depth", "--occupancy", str(tree), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode and "ptxas" in done.stderr:
        pytest.skip(f"Triton cannot compile for SM90 here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    lines = [
        line
        for line in out.read_text().splitlines()
        if line.startswith("| tensor") or line.startswith("| block")
    ]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_a_swapped_tile_takes_the_shared_memory_the_rule_counts(release_trees, tmp_path):
    rows = _occupancy_rows(release_trees("0.21.0+moe"), tmp_path)
    swapped = [r for r in rows if r[3] == "True"]
    assert len(swapped) == 8
    for scales, block_n, stages, _, _registers, shared, per_sm, _ in swapped:
        counted = int(stages) * (16 + int(block_n)) * 128
        # block scales add a few hundred bytes, well inside the per-program reserve
        assert 0 <= int(shared) - counted <= (1024 if scales == "block" else 0)
        assert int(per_sm) == resident_depth.programs_per_sm(counted)
    # the case behind the rule: four stages of 16 x 64 tiles hold 660 programs, three 924
    by = {(r[0], r[1], r[2], r[3]): r for r in rows}
    assert int(by[("tensor", "64", "4", "True")][7]) == 660
    assert int(by[("tensor", "64", "3", "True")][7]) == 924


def test_committed_tile_widths_are_the_studys_and_favour_64_for_block_fp8():
    from studies import tile_width

    pairs = tile_width.width_pairs(resident_depth.SEARCHES)
    committed = (
        ROOT / "kernels" / "results" / "tile-width" / "h200-tile-width-pairs.md"
    ).read_text()
    assert committed == tile_width.markdown(pairs, resident_depth.SEARCHES)
    block = [p["ratio"] for p in pairs if p["cell"][1] == "block"]
    assert len(block) >= 150 and resident_depth._geomean(block) > 1.01
    assert sum(r > 1 for r in block) >= 0.75 * len(block)
    idle = [p["ratio"] for p in pairs if p["cell"][1] == "block" and p["programs_128"] < 132]
    assert idle and min(idle) > 1.0
