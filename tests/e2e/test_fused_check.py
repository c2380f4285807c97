"""``moe_e2e.fused_check``'s parts that need no engine: the float64 layer, the weights it gives
the engine's MoE layers, and the verdict on a record."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moe_e2e.fused_check import (  # noqa: E402
    LAYER_BOUND,
    PATH_BOUND,
    dequantized,
    failures,
    float64_layer,
    randomise_experts,
)


def test_dequantized_block_scales_cover_their_128x128_tiles():
    gen = torch.Generator().manual_seed(1)
    weight = (torch.randn(2, 200, 300, generator=gen) * 50).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 2, 3, generator=gen) + 0.5
    got = dequantized(weight, scale, [128, 128])
    for e, n, k in [(0, 0, 0), (1, 127, 128), (1, 199, 299), (0, 150, 5)]:
        expected = float(weight[e, n, k].double()) * float(scale[e, n // 128, k // 128])
        assert got[e, n, k].item() == pytest.approx(expected, rel=1e-12)


def test_float64_layer_is_the_routed_weighted_sum_of_silu_and_mul_experts():
    gen = torch.Generator().manual_seed(2)
    E, H, inter, M, top_k = 4, 16, 8, 3, 2
    w1 = torch.randn(E, 2 * inter, H, generator=gen, dtype=torch.float64)
    w2 = torch.randn(E, H, inter, generator=gen, dtype=torch.float64)
    x = torch.randn(M, H, generator=gen)
    ids = torch.tensor([[0, 3], [2, 1], [3, 3]])
    weights = torch.rand(M, top_k, generator=gen)
    got = float64_layer(x, w1, w2, weights, ids)
    h = torch.einsum("mknh,mh->mkn", w1[ids], x.double())
    act = torch.nn.functional.silu(h[..., :inter]) * h[..., inter:]
    expected = (torch.einsum("mkhi,mki->mkh", w2[ids], act) * weights.double()[..., None]).sum(1)
    torch.testing.assert_close(got, expected)


def test_randomise_experts_gives_every_fp8_moe_layer_a_signal():
    layer = torch.nn.Module()
    shapes = {"w13_weight": (4, 64, 32), "w2_weight": (4, 32, 32)}
    for name, shape in shapes.items():
        zeros = torch.zeros(shape, dtype=torch.float8_e4m3fn)
        setattr(layer, name, torch.nn.Parameter(zeros, requires_grad=False))
    layer.w13_weight_scale_inv = torch.nn.Parameter(torch.zeros(4, 1, 1), requires_grad=False)
    layer.w2_weight_scale = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    dense = torch.nn.Linear(8, 8)  # not MoE: left as it is
    before = dense.weight.clone()
    assert randomise_experts(torch.nn.Sequential(layer, dense)) == 1
    assert 40 < layer.w13_weight.float().std() < 90 and layer.w2_weight.float().std() > 40
    assert torch.all(layer.w13_weight_scale_inv == 1 / (64 * 32**0.5))
    assert torch.all(layer.w2_weight_scale == 1 / (64 * 32**0.5))
    assert torch.equal(dense.weight, before)


def _record(mode="eager", **changes):
    check = {
        "tokens": 1,
        "fused_vs_unfused": 0.05,
        "fused_vs_float64": 0.04,
        "unfused_vs_float64": 0.045,
        "finite": True,
        "norms": {"input": 10.0, "float64": 3.0},
    }
    record = {
        "mode": mode,
        "moe_layers_randomised": 2,
        "checks": [check],
        "summary": {
            "fused_calls": 1,
            "checked": 1,
            "max_fused_vs_unfused": 0.05,
            "max_fused_vs_float64": 0.04,
            "all_finite": True,
            "lengths_ok": True,
        },
    }
    for key, value in changes.items():
        if key in record["summary"]:
            record["summary"][key] = value
        elif key == "float64_norm":
            check["norms"]["float64"] = value
        else:
            record[key] = value
    return record


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"fused_calls": 0}, "never taken"),
        ({"lengths_ok": False}, "did not decode"),
        ({"moe_layers_randomised": 0}, "no FP8 MoE layer"),
        ({"checked": 0}, "no fused call was checked"),
        ({"all_finite": False}, "not finite"),
        ({"max_fused_vs_float64": LAYER_BOUND}, "fused vs float64"),
        ({"max_fused_vs_unfused": PATH_BOUND}, "fused vs unfused"),
        ({"float64_norm": 0.0}, "next to zero"),
    ],
)
def test_failures_names_what_does_not_hold(changes, words):
    assert failures(_record()) == []
    found = failures(_record(**changes))
    assert len(found) == 1 and words in found[0]


def test_graphs_mode_holds_no_numbers_it_did_not_take():
    record = _record("graphs", checks=[], checked=0, max_fused_vs_float64=None)
    assert failures(record) == []


def test_the_gpu_test_keeps_a_record_with_its_provenance(tmp_path, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path

    import moe_e2e.run

    path = Path(__file__).with_name("test_fused_decode_engine_gpu.py")
    spec = importlib.util.spec_from_file_location("fused_decode_engine_gpu", path)
    gpu_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_test)
    monkeypatch.setattr(moe_e2e.run, "environment", lambda: {"gpu": "NVIDIA H100 80GB HBM3"})
    site = tmp_path / "site-patched"
    staged = {"sites": {"patched": str(site)}, "series_version": "0.4.0", "series_commit": "c0"}
    record = {"summary": {"fused_calls": 3}, "vllm_path": f"{site}/vllm/__init__.py"}
    gpu_test._keep(record, staged, "fp8-block", "eager")  # no MOE_E2E_RECORDS: nothing
    assert not (tmp_path / "kept").exists()
    monkeypatch.setenv("MOE_E2E_RECORDS", str(tmp_path / "kept"))
    gpu_test._keep(record, staged, "fp8-block", "eager")
    kept = json.loads((tmp_path / "kept" / "fp8-block-eager.json").read_text())
    assert kept["vllm_path"] == "<site-packages>/vllm/__init__.py"
    assert kept["series_version"] == "0.4.0" and kept["environment"]["gpu"].startswith("NVIDIA")
    assert kept["command"].endswith(
        "tests/e2e/test_fused_decode_engine_gpu.py -k 'eager and fp8-block'"
    )
    assert kept["summary"] == {"fused_calls": 3}


def test_the_fused_kernels_compiled_are_read_from_tritons_cache(tmp_path, monkeypatch):
    from moe_e2e.fused_check import fused_kernels_compiled

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "nowhere"))
    assert fused_kernels_compiled() == []
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for entry, name in [("a1", "_moe_decode_up_kernel"), ("b2", "fused_moe_kernel"),
                        ("c3", "_moe_decode_down_kernel"), ("d4", "_moe_decode_up_kernel")]:  # fmt: skip
        (tmp_path / entry).mkdir()
        (tmp_path / entry / f"{name}.json").write_text("{}")
        (tmp_path / entry / f"{name}.cubin").write_text("")
    assert fused_kernels_compiled() == [
        "a1/_moe_decode_up_kernel", "c3/_moe_decode_down_kernel", "d4/_moe_decode_up_kernel",
    ]  # fmt: skip
