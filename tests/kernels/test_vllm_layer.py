"""``moe_kernels.vllm_layer`` without vLLM's build: a case measured on the CPU with the tree's
fused decode kernels (Triton's interpreter) beside a float64 stand-in for vLLM's layer, the
floor's bytes, and the comparison that finds where the rule takes a slower path."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
from moe_kernels import measure, vllm_layer
from moe_kernels.decode import has_fused_decode, load_fused_moe_decode
from moe_kernels.reference import dequantize_weights, ref_moe_layer_float
from moe_testdata import LAYER_FLOAT_TOL

SHAPE = measure.SHAPES["tiny-smoke-test"]  # 8 experts, top-2, H = 256, I = 128


@pytest.fixture(autouse=True)
def small_cases(monkeypatch):
    """Two weight copies and calls per graph; and the harness's loose FP8 bound for a layer
    against float64: a shape this small averages over few terms, so its FP8 error spreads
    wider than the 0.06 the real shapes keep to."""
    monkeypatch.setattr(measure, "COPIES", 2)
    monkeypatch.setattr(vllm_layer, "CALLS", 2)
    monkeypatch.setattr(vllm_layer, "LAYER_BOUND", LAYER_FLOAT_TOL)


def _stand_in_layer(quant):
    """vLLM's ``fused_experts`` as float64 from the dequantised weights (no FP8 error)."""
    block = [128, 128] if quant == "block" else None

    def fused_experts(x, w1, w2, tw, ids, quant_config):
        mode = vllm_layer.WEIGHT_QUANT[quant]
        w1d = dequantize_weights(w1, quant_config.w1_scale, mode, block)
        w2d = dequantize_weights(w2, quant_config.w2_scale, mode, block)
        ref = ref_moe_layer_float(x.double(), w1d, w2d, ids.long(), tw.double())
        return ref.to(x.dtype)

    return fused_experts


@pytest.mark.parametrize("quant", ["tensor", "block"])
def test_a_case_times_the_layer_and_the_fused_path_each_checked(vllm_tree, quant):
    if not has_fused_decode(vllm_tree):
        pytest.skip("this tree has no fused decode path")
    decode = load_fused_moe_decode(vllm_tree)
    asked = []

    def rule(experts, x, w1, activation, expert_map, on_input):
        asked.append((experts.quant_config.block_shape, x.shape[0], activation))
        return x.shape[0] <= 1

    v = SimpleNamespace(
        on_hopper=True,
        quant_config=lambda **fields: SimpleNamespace(**fields),
        fused_experts=_stand_in_layer(quant),
        decode=SimpleNamespace(
            fused_moe_decode=functools.partial(decode.fused_moe_decode, sm_count=4),
            use_fused_moe_decode=rule,
        ),
        silu="silu",
    )
    gen = measure.case_generator(7, SHAPE.name, quant)
    weights = {g: measure.make_weights(SHAPE, g, quant, gen) for g in ("up", "down")}
    bandwidth = {"read_gbps": 1000.0}
    for M, route in [(1, "uniform"), (3, "shared")]:
        gen = measure.case_generator(7, SHAPE.name, quant, M, route)
        rows = vllm_layer.run_case(v, SHAPE, quant, M, route, weights, gen, bandwidth, 1)
        by = {r["variant"]: r for r in rows}
        assert set(by) == {"layer", "fused"}
        # the stand-in is float64 itself; the fused path carries FP8 activations
        assert by["layer"]["rel_error_float"] < 1e-3
        assert 1e-4 < by["fused"]["rel_error_float"] < vllm_layer.LAYER_BOUND
        assert all(r["correct"] for r in rows)
        assert by["fused"]["rule_picks"] is (M == 1)
        hit = by["fused"]["experts_hit"]
        assert 1 <= hit <= min(SHAPE.experts, M * SHAPE.topk)
        w1, w2 = weights["up"][0][0], weights["down"][0][0]
        scales = 2 * 4 if quant == "tensor" else 4 * (2 * 2 * 1 + 2 * 1)
        expected = hit * (w1[0].numel() + w2[0].numel() + scales) + 2 * M * SHAPE.hidden * 2
        assert by["fused"]["bytes"] == expected == by["layer"]["bytes"]
        assert by["fused"]["floor_us"] == pytest.approx(expected / 1e6)
    assert [a[1] for a in asked] == [1, 3] and all(a[2] == "silu" for a in asked)
    assert all(a[0] == ([128, 128] if quant == "block" else None) for a in asked)


def test_a_wrong_fused_path_is_marked_incorrect(vllm_tree):
    if not has_fused_decode(vllm_tree):
        pytest.skip("this tree has no fused decode path")
    decode = load_fused_moe_decode(vllm_tree)

    def negated(*args, **kwargs):  # e.g. a sign lost in the down kernel
        return decode.fused_moe_decode(*args, sm_count=4, **kwargs).neg_()

    v = SimpleNamespace(
        on_hopper=True,
        quant_config=lambda **fields: SimpleNamespace(**fields),
        fused_experts=_stand_in_layer("tensor"),
        decode=SimpleNamespace(fused_moe_decode=negated, use_fused_moe_decode=lambda *a: True),
        silu="silu",
    )
    gen = measure.case_generator(3, SHAPE.name, "tensor")
    weights = {g: measure.make_weights(SHAPE, g, "tensor", gen) for g in ("up", "down")}
    rows = vllm_layer.run_case(
        v, SHAPE, "tensor", 2, "uniform", weights, gen, {"read_gbps": 1.0}, 1
    )
    fused = next(r for r in rows if r["variant"] == "fused")
    assert fused["rel_error_float"] > 1.9 and fused["correct"] is False


def _report(label, cases):
    rows = []
    for (shape, quant, M, route), times in cases.items():
        for variant, us in times.items():
            row = {"shape": shape, "quant": quant, "M": M, "routing": route}
            row.update(variant=variant, us=us, floor_us=10.0)
            if variant == "fused":
                row["rule_picks"] = M <= 8
            rows.append(row)
    return {"label": label, "rows": rows}


def test_compare_takes_the_geometric_mean_over_routings_and_finds_a_slower_pick():
    series = _report(
        "series",
        {
            ("s", "tensor", 1, "uniform"): {"layer": 40.0, "fused": 20.0},
            ("s", "tensor", 1, "shared"): {"layer": 10.0, "fused": 20.0},
            ("s", "tensor", 8, "uniform"): {"layer": 30.0, "fused": 31.0},
            ("s", "tensor", 8, "shared"): {"layer": 30.0, "fused": 30.0},
            ("s", "tensor", 16, "uniform"): {"layer": 30.0, "fused": 40.0},
            ("s", "tensor", 16, "shared"): {"layer": 30.0, "fused": 40.0},
        },
    )
    release = _report(
        "release",
        {
            ("s", "tensor", 1, "uniform"): {"layer": 44.0},
            ("s", "tensor", 1, "shared"): {"layer": 11.0},
        },
    )
    table = vllm_layer.compare([release, series])
    by_m = {row["M"]: row for row in table}
    m1 = by_m[1]
    assert m1["us"]["series:layer"] == pytest.approx(20.0)  # sqrt(40 x 10)
    assert m1["speedup"] == {"series": pytest.approx(1.0), "release": pytest.approx(1.1)}
    assert m1["fused_fraction_of_floor"] == pytest.approx(0.5)
    assert m1["rule_picks"] is True and by_m[16]["rule_picks"] is False
    # M = 8: 30 / sqrt(31 x 30) = 0.984 passes; a pick at 0.97 does not
    assert vllm_layer.never_worse_violations(table, "series") == []
    for row in series["rows"]:  # the fused path at M = 8: 3% slower than the layer
        if row["M"] == 8 and row["variant"] == "fused":
            row["us"] = 30.0 / 0.97
    slower = vllm_layer.never_worse_violations(vllm_layer.compare([series]), "series")
    assert [(row["M"]) for row in slower] == [8]
    text = vllm_layer.markdown(table)
    assert "| s | tensor | 16 |" in text and text.count("\n") == 2 + len(table)


def test_compare_leaves_out_a_case_a_routing_lacks_a_path_for():
    report = _report(
        "series",
        {
            ("s", "block", 1, "uniform"): {"layer": 10.0, "fused": 5.0},
            ("s", "block", 1, "shared"): {"layer": 10.0},
        },
    )
    (row,) = vllm_layer.compare([report])
    assert set(row["us"]) == {"series:layer"} and "speedup" not in row


def test_token_counts_and_geomean():
    assert vllm_layer.token_counts("decode") == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert vllm_layer.token_counts("1,5") == [1, 5]
    assert vllm_layer.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isclose(vllm_layer.geomean([3.0]), 3.0)


def test_compare_command_prints_the_table_and_fails_on_a_slower_pick(tmp_path, capsys):
    import json

    cases = {("s", "tensor", 2, route): {"layer": 10.0, "fused": 12.0} for route in ("u", "v")}
    path = tmp_path / "series.json"
    path.write_text(json.dumps(_report("series", cases)))
    assert vllm_layer.main(["--compare", str(path)]) == 1
    out = capsys.readouterr().out
    assert "| s | tensor | 2 | 10.0 | 10.0 | 12.0 | 0.83 | 0.83 | yes |" in out
    assert "rule takes a slower path: s tensor M=2" in out
    with pytest.raises(SystemExit) as stopped:
        vllm_layer.main(["--label", "series"])
    assert stopped.value.code == 2
