"""The end-to-end benchmark's reports without a GPU (``moe_e2e.report``,
``moe_e2e.profile``): pairs of engines per FP8 kind and machine, profiles, plot and targets,
from made-up result files."""

from __future__ import annotations

import json
import statistics

import pytest
from fake_reports import fake_report
from moe_e2e import report as e2e_report
from moe_e2e.profile import KINDS
from moe_e2e.report import markdown


def _report_with_profile(profile: dict) -> dict:
    """A one-variant result file whose engine was profiled in ``profile``'s windows."""
    result = {
        "startup_s": 60.0,
        "first_ttft_s": 0.5,
        "decode": {"1": {"tpot_ms": [5.0], "median_ms": 5.0}},
        "throughput": {"output_tokens_per_s": 1000.0},
        "trace": {"ttft_p50_ms": 40.0, "ttft_p99_ms": 400.0, "triton_kernels_compiled": 0},
        "profile": profile,
    }
    return fake_report(
        [{"name": "p", "kind": "fp8-static", "wheel": "patched", "log": "p.log", "result": result}]
    )


def _served(name, kind, wheel, decode, ttft_p50=40.0, tokens_per_s=1000.0, **fields) -> dict:
    """An engine record that served: ``decode`` maps a batch to its repeats' ms per token."""
    result = {
        "startup_s": 60,
        "first_ttft_s": 0.5,
        "decode": {
            b: {"tpot_ms": repeats, "median_ms": statistics.median(repeats)}
            for b, repeats in decode.items()
        },
        "throughput": {"output_tokens_per_s": tokens_per_s},
        "trace": {"ttft_p50_ms": ttft_p50, "ttft_p99_ms": 400, "triton_kernels_compiled": 0},
    }
    return {"name": name, "kind": kind, "wheel": wheel, "log": "l", "result": result, **fields}


def test_report_compares_the_wheels_per_kind():
    def result(scale):
        return {
            "startup_s": 60 * scale,
            "first_ttft_s": 0.5 * scale,
            "decode": {"1": {"tpot_ms": [5 * scale] * 3, "median_ms": 5 * scale}},
            "throughput": {"output_tokens_per_s": 1000 / scale},
            "trace": {
                "ttft_p50_ms": 40 * scale,
                "ttft_p99_ms": 400 * scale,
                "triton_kernels_compiled": 2,
            },
        }

    report = fake_report(
        [
            {
                "name": "o",
                "kind": "fp8-block",
                "wheel": "official",
                "moe_backend": "TRITON",
                "log": "o.log",
                "result": result(1.0),
            },
            {
                "name": "p",
                "kind": "fp8-block",
                "wheel": "patched",
                "moe_backend": "TRITON",
                "log": "p.log",
                "result": result(0.9),
            },
            {
                "name": "x",
                "kind": "fp8-block",
                "wheel": "patched",
                "moe_backend": None,
                "log": "x.log",
                "returncode": 1,
            },
        ]
    )
    shares = dict.fromkeys(
        ("moe_gemm", "moe_routing", "attention", "linear", "quantization", "other"), 0.0
    )
    report["variants"][1]["result"]["profile"] = {
        "16": {
            "kernel_us_per_step": 100.0,
            "us_per_step": {**shares, "moe_gemm": 60.0, "attention": 40.0},
            "share": {**shares, "moe_gemm": 0.6, "attention": 0.4},
        }
    }
    text = markdown(report)
    assert "| fp8-block | 1 + 1 | 0.900 | 0.900 | 1.111 | 0.900 | 0.900 | 0.900 |" in text
    assert "| p | 16 | 100 | 60 (60%) | 0 (0%) | 40 (40%) |" in text
    assert "failed (1), see `x.log`" in text


def test_report_pairs_engines_only_on_one_machine_and_marks_the_rest():
    """Hosts differ (one H200 machine's CPU moved throughput by 10% and trace TTFT by 30% for
    the same backend): a ratio comes from engines that ran on one machine, else it is marked."""

    def engine(name, kind, wheel, machine, tpot, **asked):
        return _served(
            name,
            kind,
            wheel,
            {"1": [tpot]},
            tokens_per_s=1000 / tpot,
            machine=machine,
            moe_backend="B",
            **asked,
        )

    report = fake_report(
        [
            engine("o1", "fp8-block", "official", "m1", 5.0),
            engine("p1", "fp8-block", "patched", "m1", 4.5),
            engine("o2", "fp8-block", "official", "m2", 6.0),
            engine("p3", "fp8-block", "patched", "m3", 3.0),
            engine("os", "fp8-static", "official", "m1", 8.0),
            engine("ps", "fp8-static", "patched", "m2", 4.0),
            engine("fi", "fp8-static", "patched", "m2", 6.0, fp8_env="flashinfer_cutlass"),
            engine("cu", "fp8-block", "patched", "m1", 9.0, requested_backend="cutlass"),
        ]
    )
    text = markdown(report)
    rows: dict[str, str] = {}  # the first row of each name: the ratio table's, for a kind
    for line in text.splitlines():
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0][2:], line)
    # Block: only o1 and p1 ran on one machine; o2 and p3 (4.5/5.0 against 3.0/6.0) left out.
    assert "| 1 + 1 (of 2 + 2) | 1.000 | 0.900 | 1.111 |" in rows["fp8-block"]
    # Static: no pair on one machine, so compared across machines and marked.
    assert "| 1 + 1 ‡ | 1.000 | 0.500 | 2.000 |" in rows["fp8-static"]
    assert "‡ no engine to compare with ran on the same machine" in text
    # Head to head: against each default engine of its kind on its machine, and only those.
    table = text.split("## Backends head to head")[1].split("\n\n")[1].splitlines()
    assert [line for line in table if line.startswith("| cu |")] == [
        "| cu | B | o1 | B | 1.800 | 0.556 | 1.000 | 1.000 |",
        "| cu | B | p1 | B | 2.000 | 0.500 | 1.000 | 1.000 |",
    ]
    assert [line for line in table if line.startswith("| fi |")] == [
        "| fi | B | ps | B | 1.500 | 0.667 | 1.000 | 1.000 |"
    ]


def test_profile_sorts_kernels_into_the_kinds_of_a_decode_step():
    from moe_e2e import profile

    names = {
        "fused_moe_kernel": "moe_gemm",
        "void vllm::moe::topkGatingSoftmax<8, 128>(float const*, ...)": "moe_routing",
        "void vllm::moe::moe_align_block_size_kernel<int>": "moe_routing",
        "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>": "attention",
        "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>": "attention",
        "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128": "linear",
        "void cutlass::device_kernel<cutlass_3x_gemm<...>>": "linear",
        "void vllm::scaled_fp8_quant_kernel<c10::BFloat16>": "quantization",
        "triton_red_fused_add_rms_norm_0": "other",
        "void cutlass::device_kernel<(anonymous namespace)::cutlass_3x_group_gemm<e4m3>>": "moe_gemm",
        "triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_div_rms_norm_max_reciprocal_2": (
            "quantization"
        ),
        "triton_poi_fused_cat_mm_3": "other",
        # FlashInfer's CUTLASS MoE (vLLM's FLASHINFER_CUTLASS backend), as its profile names them
        "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShapeIN4cute"
        "5tupleIJlllEEEEENS1_10collective13CollectiveMmaINS1_39MainloopSm90ArrayTmaGmma": "moe_gemm",
        "void tensorrt_llm::kernels::cutlass_kernels::computeStridesTmaWarpSpecializedKernel"
        "<__nv_fp8_e4m3, __nv_fp8_e4m3, __nv_bfloat16>": "moe_gemm",
        "void tensorrt_llm::kernels::cutlass_kernels::fusedBuildExpertMapsSortFirstTokenKernel"
        "<32, 8, 8>(int const*, int*)": "moe_routing",
        "void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<__nv_fp8_e4m3>": (
            "moe_routing"
        ),
        "void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<__nv_bfloat16>": (
            "moe_routing"
        ),
        "void tensorrt_llm::kernels::cutlass_kernels::doActivationKernel<__nv_fp8_e4m3, "
        "__nv_bfloat16, tensorrt_llm::kernels::cutlass_kernels::GLUAdaptor<SiLu>>": "other",
    }
    assert profile.KINDS == (
        "moe_gemm",
        "moe_routing",
        "attention",
        "linear",
        "quantization",
        "other",
    )
    for name, kind in names.items():
        assert profile.classify(name) == kind, name
    trace = {
        "traceEvents": [
            {"cat": "kernel", "name": "fused_moe_kernel", "dur": 30.0},
            {"cat": "kernel", "name": "fused_moe_kernel", "dur": 10.0},
            {"cat": "kernel", "name": "void flash::flash_fwd_kernel", "dur": 40.0},
            {"cat": "kernel", "name": "triton_poi_fused_mul_0", "dur": 20.0},
            {"cat": "cpu_op", "name": "aten::mm", "dur": 500.0},  # host side: not GPU time
        ]
    }
    assert profile.breakdown({"traceEvents": [{"cat": "cpu_op", "dur": 3.0}]}, steps=2) == {
        "steps": 2,
        "error": "no GPU kernels in the trace",
    }
    out = profile.breakdown(trace, steps=2)
    assert out["kernel_us_per_step"] == 50.0
    assert out["us_per_step"]["moe_gemm"] == 20.0 and out["share"]["attention"] == 0.4
    assert out["top_kernels"][0] == {
        "name": "fused_moe_kernel",
        "kind": "moe_gemm",
        "us_per_step": 20.0,
    }
    assert [(k["name"], k["calls_per_step"]) for k in out["kernels"]] == [
        ("fused_moe_kernel", 1.0),
        ("void flash::flash_fwd_kernel", 0.5),
        ("triton_poi_fused_mul_0", 0.5),
    ]


def test_profiles_sort_again_by_todays_rules():
    from moe_e2e import profile
    from moe_e2e.report import markdown, resort_profiles

    group_gemm = "void cutlass::device_kernel<cutlass_3x_group_gemm<e4m3>>"
    kept_all = {
        "steps": 1,
        "us_per_step": {kind: 0.0 for kind in profile.KINDS} | {"linear": 30.0},
        "kernels": [
            {"name": group_gemm, "us_per_step": 20.0},
            {"name": "nvjet", "us_per_step": 10.0},
        ],
    }
    old_rules = {
        **kept_all["us_per_step"],
        "linear": 35.0,
        "other": 5.0,
    }
    kept_top = {  # a window from before every kernel was kept: the small one stays in "other"
        "steps": 1,
        "kernel_us_per_step": 40.0,
        "us_per_step": old_rules,
        "share": {kind: us / 40.0 for kind, us in old_rules.items()},
        "top_kernels": [
            {"name": group_gemm, "kind": "linear", "us_per_step": 25.0},
            {"name": "nvjet", "kind": "linear", "us_per_step": 10.0},
        ],
    }
    report = json.loads(json.dumps(_report_with_profile({"1": kept_all, "16": kept_top})))
    resort_profiles(report)
    windows = report["variants"][0]["result"]["profile"]
    assert windows["1"]["us_per_step"]["moe_gemm"] == 20.0
    assert windows["1"]["us_per_step"]["linear"] == 10.0
    assert windows["16"]["us_per_step"]["moe_gemm"] == 25.0
    assert windows["16"]["us_per_step"]["linear"] == 10.0
    assert windows["16"]["us_per_step"]["other"] == 5.0
    assert windows["16"]["share"]["moe_gemm"] == 25.0 / 40.0
    assert windows["16"]["resorted_from_top"] and "resorted_from_top" not in windows["1"]
    assert "16 †" in markdown(report) and "| 1 |" in markdown(report)


def test_report_with_two_engines_per_wheel_gives_the_ratio_range():
    def result(tpot):
        return {
            "startup_s": 60,
            "first_ttft_s": 0.5,
            "decode": {"1": {"tpot_ms": [tpot], "median_ms": tpot}},
            "throughput": {"output_tokens_per_s": 1000},
            "trace": {"ttft_p50_ms": 40, "ttft_p99_ms": 400, "triton_kernels_compiled": 0},
        }

    engines = [("official", 5.0), ("official", 5.2), ("patched", 4.5), ("patched", 4.7)]
    report = {
        "command": "c",
        "vllm": "0.21.0",
        "series_version": "0.1.0",
        "environment": {},
        "model": "m",
        "spec": {"decode_batches": [1], "max_num_seqs": 64, "max_model_len": 4096},
        "official_wheel": {"file": "o", "sha256": "a", "dropped": []},
        "patched_wheel": {"file": "p", "sha256": "b", "version": "v"},
        "variants": [
            {"name": f"{w}{i}", "kind": "fp8-block", "wheel": w, "log": "l", "result": result(t)}
            for i, (w, t) in enumerate(engines)
        ],
    }
    row = next(line for line in markdown(report).splitlines() if line.startswith("| fp8-block"))
    # medians 5.1 and 4.6; pairs 4.5/5.2 .. 4.7/5.0
    assert "| 2 + 2 |" in row and "0.902 (0.865–0.940)" in row


def test_the_report_names_the_routing_the_engines_had():
    report = fake_report([])
    assert "the dummy model's own router" in markdown(report)
    report["spec"]["routing"] = "uniform"
    assert "drawn uniformly at random, independently of each other" in markdown(report)
    report["spec"]["routing"] = "distinct"
    assert "a uniformly random set of k different experts" in markdown(report)


def test_the_plot_shows_each_engine_over_the_patched_default_engine(tmp_path):
    """The plot's decode panel: time per token over the kind's patched engine on its default
    backend, with the fastest and slowest repeat as error bars; a kind with no such engine is
    drawn over its first engine; a failed engine is left out."""

    def engine(name, wheel, repeats, **asked):
        return _served(name, "fp8-static", wheel, {"1": repeats}, moe_backend="B", **asked)

    official = engine("o", "official", [9.0, 10.0, 12.0])
    patched = engine("p", "patched", [4.0, 5.0, 5.5])
    forced = engine("f", "patched", [20.0, 20.0, 20.0], fp8_env="flashinfer_cutlass")
    reference, series = e2e_report.tpot_over_reference([official, patched, forced], ["1"])
    assert reference is patched
    (ratio, low, high), _, (forced_ratio, _, _) = series
    assert ratio == [2.0] and low == pytest.approx([0.2]) and high == pytest.approx([0.4])
    assert forced_ratio == [4.0]
    reference, series = e2e_report.tpot_over_reference([forced, official], ["1"])
    assert reference is forced and series[1][0] == [0.5]

    pytest.importorskip("matplotlib")
    failed = {"name": "x", "kind": "fp8-block", "wheel": "patched", "log": "x", "returncode": 1}
    result_file = tmp_path / "r.json"
    result_file.write_text(json.dumps(fake_report([official, patched, forced, failed])))
    assert e2e_report.main([str(result_file)]) == 0
    assert result_file.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| o | B |" in result_file.with_suffix(".md").read_text()


def test_the_target_table_marks_each_kind_met_or_short_with_the_moe_gemms_share():
    """The claim's numbers per kind (decode gain at batch <= 16, trace TTFT cut), from pairs
    on one machine, and what the MoE GEMMs took per step in both wheels; a kind compared
    across machines gets no TTFT verdict."""

    def engine(name, kind, wheel, machine, tpot, ttft, moe_us=None, share=None):
        decode = {b: [t] for b, t in zip(("1", "16", "64"), tpot, strict=True)}
        served = _served(name, kind, wheel, decode, ttft, machine=machine, moe_backend="TRITON")
        if moe_us is not None:
            others = dict.fromkeys(KINDS, 0)
            served["result"]["profile"] = {
                "1": {
                    "kernel_us_per_step": moe_us / share,
                    "us_per_step": {**others, "moe_gemm": moe_us},
                    "share": {**others, "moe_gemm": share},
                }
            }
        return served

    report = fake_report(
        [
            engine("o", "fp8-dynamic", "official", "m1", (5.5, 10.0, 20.0), 100.0, 1000.0, 0.25),
            engine("p", "fp8-dynamic", "patched", "m1", (5.0, 9.5, 10.0), 90.0, 800.0, 0.2),
            engine("ob", "fp8-block", "official", "m1", (5.0, 5.0, 5.0), 100.0),
            engine("pb", "fp8-block", "patched", "m2", (5.0, 5.0, 5.0), 50.0),
        ]
    )
    report["spec"]["decode_batches"] = [1, 16, 64]
    text = markdown(report)
    assert "## Against the target: ≥ 10% decode throughput at batch ≤ 16" in text
    dynamic = [line for line in text.splitlines() if line.startswith("| fp8-dynamic | TRITON")]
    assert dynamic == [
        "| fp8-dynamic | TRITON → TRITON | +10.0% ✓ | +5.3% ✗ | +10.0% ✓ | 1000 → 800 (20%) |"
    ]
    block = [line for line in text.splitlines() if line.startswith("| fp8-block ‡ | TRITON")]
    assert block == ["| fp8-block ‡ | TRITON → TRITON | +0.0% ✗ | +0.0% ✗ | +50.0% ‡ | – |"]
    assert "| decode gain B=16 | trace TTFT p50 cut |" in text and "decode gain B=64" not in text
