"""The split-K rule the series ships, scored on the committed H200 run that timed both of
its choices (kernels/results/untuned/): the rule must not be slower than the rule it
replaced on the cases it changes, and its committed report must be what the study makes."""

from __future__ import annotations

from pathlib import Path

import pytest
from moe_kernels.resultfile import read_report
from studies import split_rule_replay

RESULTS = Path(__file__).resolve().parents[2] / "kernels" / "results" / "untuned"
RUNS = [RESULTS / "h200-untuned-bench.json.gz", RESULTS / "h200-untuned-between-bench.json.gz"]


@pytest.fixture(scope="module")
def replayed():
    rows = [row for run in RUNS for row in read_report(run)["rows"]]
    return split_rule_replay.replay(rows)


def test_the_shipped_rule_never_loses_more_than_noise_to_the_old_one(replayed):
    cases, changed = replayed
    summary = split_rule_replay.summary(cases, "0.21.0+moe")
    assert summary["cases"] == 480
    assert summary["worst"] >= 0.985, summary["below"]
    assert summary["geomean"] >= 1.0
    # it splits where the old rule did not, and those launches are mostly faster
    assert changed
    faster = [c for c in changed if c["split_us"] < c["unsplit_us"]]
    assert len(faster) >= 0.8 * len(changed)


def test_committed_report_is_the_studys(replayed):
    cases, changed = replayed
    names = [str(run.relative_to(RESULTS.parents[2])) for run in RUNS]
    committed = (RESULTS / "h200-split-rule-replay.md").read_text()
    assert committed == split_rule_replay.markdown(names, cases, changed)


def test_a_rule_the_run_cannot_score_is_refused():
    row = {"shape": "deepseek-v3-tp8", "gemm": "up", "quant": "tensor", "M": 3, "routing": 0}
    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "SPLIT_K": 4}
    rows = [
        {**row, "variant": "0.21.0+moe", "config": config, "split_k": 1, "us": 1.0},
        {**row, "variant": "0.21.0+g2", "config": config, "split_k": 1, "us": 1.0},
    ]
    with pytest.raises(ValueError, match="measured neither"):
        split_rule_replay.replay(rows)
