"""The split-depth probe, run through Triton's interpreter on the tiny shape: every named
K split launches as named (the tree's split rule bypassed), and every launch matches the
float64 reference, so its GPU numbers compare the splits they say they compare."""

from __future__ import annotations

import json

import pytest
from moe_kernels import measure
from studies import split_depth_probe


def test_every_named_split_launches_and_is_correct(release_trees, tmp_path):
    out = tmp_path / "probe.json"
    base, tree = release_trees("0.33.0"), release_trees("0.33.0+moe")
    code = split_depth_probe.main(
        [f"--base=0.33.0={base}", f"--tree=0.33.0+moe={tree}",
         "--case", "tiny-smoke-test:block", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["variant"] == "0.33.0" and rows[0]["speedup_over_base"] == 1.0
    probed = rows[1:]
    launched = {(r["launched"]["BLOCK_SIZE_N"], r["split_k"]) for r in probed}
    expected = {(n, s) for n in split_depth_probe.TILES_N for s in split_depth_probe.SPLITS}
    assert launched == expected
    for row in rows:
        assert row["correct"] and max(row["rel_error"]) < measure.FP8_ERROR_BOUND
        assert row["floor_us"] > 0


def test_the_probe_leaves_the_trees_own_split_rule_alone(release_trees, tmp_path):
    """The loader shares one kernel object per tree with every later user in the process."""
    from moe_kernels.loader import load_fused_moe_kernel

    tree = release_trees("0.33.0+moe")
    shared = load_fused_moe_kernel(tree)
    rule = shared.split_k_rule
    split_depth_probe.main(
        [f"--base=0.33.0={release_trees('0.33.0')}", f"--tree=0.33.0+moe={tree}",
         "--case", "tiny-smoke-test:tensor", "--out", str(tmp_path / "probe.json")]
    )  # fmt: skip
    assert load_fused_moe_kernel(tree).split_k_rule is rule
    assert rule is not split_depth_probe.named_split_rule


@pytest.mark.parametrize("case", ["llama-4-scout-tp2", "no-such-model:block", "qwen3-30b-a3b:fp4"])
def test_a_case_it_cannot_probe_is_refused_in_one_line(case, capsys):
    with pytest.raises(SystemExit) as stopped:
        split_depth_probe.main(["--base=a=.", "--tree=b=.", "--case", case, "--out", "x.json"])
    assert stopped.value.code == 2
    assert "give SHAPE:QUANT" in capsys.readouterr().err
