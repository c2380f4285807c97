"""The end-to-end benchmark's host-side parts: model configs, bundle, staging, measurement logic.

The engine itself only runs on a GPU (tests/e2e); here a fake engine stands in for vLLM's
AsyncLLM so the measurement code is exercised on any machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from moe_e2e import bundle, engine, models, run, stage
from moe_e2e import report as e2e_report
from moe_e2e.profile import KINDS
from moe_e2e.report import markdown
from moe_patch import __version__


def test_every_model_and_kind_writes_a_config(tmp_path):
    for model in models.MODELS:
        for kind in models.FP8_KINDS:
            directory = models.write_model(tmp_path, model, kind)
            config = json.loads((directory / "config.json").read_text())
            assert config["architectures"] == models.MODELS[model]["architectures"]
            quant = config.get("quantization_config")
            if kind == "fp8-dynamic":
                assert quant is None and models.FP8_KINDS[kind].engine_quantization == "fp8"
            elif kind == "fp8-static":
                assert quant == {"quant_method": "fp8", "activation_scheme": "static"}
            elif kind == "fp8-block":
                assert quant["weight_block_size"] == [128, 128]
            else:
                assert quant["quant_method"] == "compressed-tensors"


def test_published_shapes_are_the_benchmarked_ones():
    qwen, mixtral = models.MODELS["qwen3-30b-a3b"], models.MODELS["mixtral-8x7b"]
    assert (qwen["num_experts"], qwen["num_experts_per_tok"]) == (128, 8)
    assert (qwen["hidden_size"], qwen["moe_intermediate_size"]) == (2048, 768)
    assert (mixtral["num_local_experts"], mixtral["num_experts_per_tok"]) == (8, 2)
    assert (mixtral["hidden_size"], mixtral["intermediate_size"]) == (4096, 14336)
    # Mixtral-8x22B's MoE is the harness's TP-4 shape at a quarter of its intermediate size
    from moe_kernels.measure import SHAPES

    big, shard = models.MODELS["mixtral-8x22b"], SHAPES["mixtral-8x22b-tp4"]
    assert (big["num_local_experts"], big["num_experts_per_tok"]) == (shard.experts, shard.topk)
    assert (big["hidden_size"], big["intermediate_size"]) == (shard.hidden, 4 * shard.intermediate)


def test_unknown_model_or_kind_is_refused():
    with pytest.raises(ValueError, match="unknown model"):
        models.model_config("llama", "fp8-block")
    with pytest.raises(ValueError, match="unknown FP8 kind"):
        models.model_config("mixtral-8x7b", "int4")


def _wheel(path: Path, members: dict[str, bytes], dist_info: str) -> Path:
    record = [f"{name},{bundle.record_digest(data)},{len(data)}" for name, data in members.items()]
    record.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def wheels(tmp_path):
    rng = __import__("random").Random(1)
    big = bytes(rng.randrange(256) for _ in range(50_000))
    official = {
        "vllm/__init__.py": b"version = 'official'\n",
        "vllm/big.so": big,
        "vllm/kernel.py": b"def kernel(): return 1\n",
        "vllm-1.0.dist-info/METADATA": b"Version: 1.0\n",
    }
    patched = dict(official)
    del patched["vllm-1.0.dist-info/METADATA"]
    patched["vllm/kernel.py"] = b"def kernel(): return 2\n"
    patched["vllm/new.json"] = b"{}\n"
    patched["vllm-1.0+moe.dist-info/METADATA"] = b"Version: 1.0+moe\n"
    return (
        _wheel(tmp_path / "official.whl", official, "vllm-1.0.dist-info"),
        _wheel(tmp_path / "patched.whl", patched, "vllm-1.0+moe.dist-info"),
    )


def test_segments_leave_out_exactly_the_dropped_member(wheels, tmp_path):
    official, _ = wheels
    segments, dropped = bundle.kept_segments(official, ("vllm/big.so",))
    assert dropped == ["vllm/big.so"]
    kept = sum(length for _, length in segments)
    with zipfile.ZipFile(official) as archive:
        info = archive.getinfo("vllm/big.so")
        start, end = bundle.member_span(archive, info, official.stat().st_size)
    assert kept == official.stat().st_size - (end - start)
    assert end - start > info.compress_size  # the local header goes with the data


def test_members_the_gpu_machines_python_never_loads_are_left_out(tmp_path):
    members = {
        f"vllm/third_party/deep_gemm/_C.cpython-{tag}-x86_64-linux-gnu.so": b"so"
        for tag in (310, 312, 314)
    }
    members["vllm/_C.abi3.so"] = b"abi3"
    members["vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js"] = b"js"
    wheel = _wheel(tmp_path / "v.whl", members, "vllm-1.0.dist-info")
    assert sorted(bundle.unused_members(wheel, "3.12")) == [
        "vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js",
        "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
    ]
    assert "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so" in (
        bundle.unused_members(wheel, "3.10")
    )


def test_dropping_a_member_the_wheel_lacks_is_an_error(wheels):
    with pytest.raises(SystemExit, match="no member"):
        bundle.kept_segments(wheels[0], ("vllm/absent.so",))


def test_overlay_holds_changed_members_and_dist_info(wheels):
    official, patched = wheels
    _, names = bundle.patched_overlay(official, patched)
    assert names == sorted(
        [
            "vllm/kernel.py",
            "vllm/new.json",
            "vllm-1.0+moe.dist-info/METADATA",
            "vllm-1.0+moe.dist-info/RECORD",
        ]
    )


def _payload_without_pip(monkeypatch, wheels, tmp_path, drop=("vllm/big.so",), prebuilt=()):
    official, patched = wheels
    segments, dropped = bundle.kept_segments(official, drop)
    overlay, changed = bundle.patched_overlay(official, patched)
    manifest = {
        "vllm": "1.0",
        "series_version": "0.0.0",
        "official_wheel": {
            "file": official.name,
            "sha256": bundle.sha256_file(official),
            "index_sha256": None,
            "size": official.stat().st_size,
            "segments": segments,
            "dropped": dropped,
        },
        "patched_wheel": {
            "file": patched.name,
            "sha256": bundle.sha256_file(patched),
            "version": "1.0+moe",
            "overlay_members": changed,
        },
        "dependencies": {},
    }
    payload = tmp_path / "payload.tar"
    manifest["flashinfer_aot"] = {library.name: bundle.sha256_file(library) for library in prebuilt}
    manifest["flashinfer_aot_builds"] = {
        library.name: json.loads(library.with_suffix(".json").read_text())
        for library in prebuilt
        if library.with_suffix(".json").is_file()
    }
    bundle.write_payload(payload, official, segments, overlay, [], manifest, prebuilt)
    out = tmp_path / "parts"
    out.mkdir(exist_ok=True)
    parts = bundle.split(payload, out, 20_000)
    (out / "bundle.json").write_text(
        json.dumps({"parts": parts, "payload_sha256": bundle.sha256_file(payload)})
    )
    monkeypatch.setattr(stage, "install_dependencies", lambda *a: None)
    return out


def test_stage_installs_both_sides_checked_against_their_records(monkeypatch, wheels, tmp_path):
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path)
    into = tmp_path / "staged"
    summary = stage.stage(parts, into)
    official, patched = into / "site-official", into / "site-patched"
    assert (official / "vllm/kernel.py").read_bytes() == b"def kernel(): return 1\n"
    assert (patched / "vllm/kernel.py").read_bytes() == b"def kernel(): return 2\n"
    assert (patched / "vllm/new.json").exists() and not (official / "vllm/new.json").exists()
    assert not (official / "vllm/big.so").exists()  # dropped: never installed
    assert not (patched / "vllm-1.0.dist-info").exists()
    assert summary["patched_files_checked"] == 4  # __init__, kernel, new.json, METADATA
    # Bytecode compiled at staging, as pip installs, each side from its own source.
    (official_pyc,) = (official / "vllm/__pycache__").glob("kernel.*.pyc")
    (patched_pyc,) = (patched / "vllm/__pycache__").glob("kernel.*.pyc")
    assert official_pyc.read_bytes() != patched_pyc.read_bytes()
    assert stage.stage(parts, into) == summary  # done once, not redone


def test_stage_records_absolute_sites_from_a_relative_folder(monkeypatch, wheels, tmp_path):
    """Staged with ``--into staged`` from kernels/, the engines and the GPU test read the
    sites from other working directories (on the H200 a relative one made the test's
    engines fail to import vLLM)."""
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path)
    monkeypatch.chdir(tmp_path)
    summary = stage.stage(parts, Path("staged"))
    for site in summary["sites"].values():
        assert Path(site).is_absolute() and Path(site).parent == tmp_path / "staged"
    assert Path(summary["sites"]["patched"], "vllm/kernel.py").is_file()


def test_stage_waits_for_missing_parts_and_refuses_a_damaged_one(monkeypatch, wheels, tmp_path):
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path)
    held = tmp_path / "held"
    held.mkdir()
    (parts / "part-02").rename(held / "part-02")
    assert stage.stage(parts, tmp_path / "staged") is None
    data = bytearray((held / "part-02").read_bytes())
    data[10] ^= 0xFF
    (parts / "part-02").write_bytes(bytes(data))
    with pytest.raises(stage.StageError, match="does not match bundle.json"):
        stage.stage(parts, tmp_path / "staged")


def test_a_changed_member_fails_the_record_check(monkeypatch, wheels, tmp_path):
    official, patched = wheels
    target = tmp_path / "site"
    broken = tmp_path / "broken.whl"
    with zipfile.ZipFile(official) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info.filename, b"tampered" if info.filename == "vllm/kernel.py" else data)
    with pytest.raises(stage.StageError, match="does not match the wheel's RECORD"):
        stage.extract_checked(broken, target, set())


class FakeEngine:
    """AsyncLLM's generate(): one delta per step, a fixed step time, a prefill delay; its
    profiler writes a trace with one MoE GEMM kernel per generated token."""

    def __init__(self, step_s=0.002, prefill_s=0.004, profile_dir=None):
        self.step_s, self.prefill_s = step_s, prefill_s
        self.profile_dir, self.profiling, self.kernels = profile_dir, False, []

    async def start_profile(self):
        self.profiling, self.kernels = True, []

    async def stop_profile(self):
        self.profiling = False
        trace = {"traceEvents": self.kernels}
        count = len(list(self.profile_dir.iterdir()))
        name = f"dp0_pp0_tp0_rank0.{count}.pt.trace.json"
        (self.profile_dir / name).write_text(json.dumps(trace))
        # vLLM's front end writes a CPU-only trace of its own, later than the worker's.
        cpu_only = {"traceEvents": [{"cat": "cpu_op", "name": "generate", "dur": 9.0}]}
        frontend = f"vm_1.async_llm.{count + 1}.pt.trace.json"
        (self.profile_dir / frontend).write_text(json.dumps(cpu_only))

    async def generate(self, prompt, params, request_id):
        assert all(100 <= t for t in prompt["prompt_token_ids"])
        await asyncio.sleep(self.prefill_s)
        for _ in range(params.max_tokens):
            await asyncio.sleep(self.step_s)
            if self.profiling:
                self.kernels.append({"cat": "kernel", "name": "fused_moe_kernel", "dur": 5.0})
            yield types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[7])])


@pytest.fixture
def fake_vllm(monkeypatch):
    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = types.SimpleNamespace(DELTA=1)
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)


def test_measure_reports_every_phase_from_streamed_tokens(fake_vllm):
    spec = {
        **run.DEFAULT_SPEC,
        "decode_batches": [1, 4],
        "decode_tokens": 24,
        "repeats": 2,
        "prefill_lens": [32, 64],
        "throughput": {"requests": 6, "prompt_lens": [16], "output_lens": [8, 16]},
        "trace": {**run.DEFAULT_SPEC["trace"], "bursts": 3, "interval_s": 0.01, "max_prompt": 64},
    }
    client = engine.Client(FakeEngine(), vocab_size=1000, seed=0)
    out = asyncio.run(engine.measure(client, spec))
    for length in ("32", "64"):
        prefill = out["prefill"][length]
        assert len(prefill["ttft_ms"]) == 2  # the unmeasured request is reported on its own
        assert 6 <= prefill["median_ms"] < 60  # prefill delay + first step: 4 + 2 ms
        assert prefill["first_ms"] >= 6
    for batch in ("1", "4"):
        tpot = out["decode"][batch]
        assert len(tpot["tpot_ms"]) == 2
        assert 1.5 < tpot["median_ms"] < 20  # 2 ms steps, loop overhead allowed
    assert out["throughput"]["output_tokens"] == 3 * 8 + 3 * 16
    assert out["trace"]["requests"] == sum(out["trace"]["burst_sizes"])
    assert out["trace"]["ttft_p50_ms"] >= 4  # the prefill delay comes before the first token
    assert out["first_ttft_s"] > 0


def test_time_per_token_skips_batch_forming_and_needs_enough_tokens():
    arrivals = [(0.0, 1), (1.0, 1), (1.1, 1), (1.2, 1)] + [(1.2 + 0.1 * i, 1) for i in range(1, 11)]
    assert engine.time_per_token({"arrivals": arrivals}) == pytest.approx(0.1)
    assert engine.time_per_token({"arrivals": arrivals[:6]}) is None


def test_percentile_is_an_order_statistic():
    values = [float(v) for v in range(1, 101)]
    assert engine.percentile(values, 50) in (50.0, 51.0)
    assert engine.percentile(values, 99) == 99.0
    assert engine.percentile([3.0], 99) == 3.0


# Lines as vLLM 0.21.0 (patched) wrote them on the H200 (kernels/results/e2e logs).
LOG = """\
(EngineCore pid=3960) INFO 11-30 20:51:13 [fp8.py:478] Using TRITON Fp8 MoE backend out of potential backends: ['TRITON', 'AITER', 'FLASHINFER_CUTLASS'], because it is the first supported one; Hopper FP8 MoE without expert parallelism tries TRITON first (VLLM_FP8_MOE_BACKEND=auto).
(EngineCore pid=3960) INFO 11-30 20:51:17 [gpu_model_runner.py:4959] Model loading took 29.03 GiB memory and 3.455353 seconds
(EngineCore pid=3960) INFO 11-30 20:52:08 [monitor.py:53] torch.compile took 50.56 s in total
(EngineCore pid=711) INFO 12-03 08:03:56 [triton_moe_warmup.py:55] Warmed up Triton fused MoE for batches of 129, 193, 769 tokens in 1.08 s.
(EngineCore pid=3960) INFO 11-30 20:52:35 [gpu_model_runner.py:6243] Graph capturing finished in 10 secs, took 0.21 GiB
(EngineCore pid=3960) INFO 11-30 20:52:35 [core.py:299] init engine (profile, create kv cache, warmup model) took 78.20 s (compilation: 50.56 s)
(EngineCore pid=3960) WARNING 11-30 20:52:37 [jit_monitor.py:103] Triton kernel JIT compilation during inference: fused_moe_kernel. This causes a latency spike
"""
OFFICIAL = (
    "(EngineCore pid=4389) INFO 11-30 20:53:41 [fp8.py:407] Using TRITON Fp8 MoE backend out of "
    "potential backends: ['AITER', 'FLASHINFER_TRTLLM', 'TRITON'].\n"
)


def test_log_facts_name_the_backend_its_reason_and_the_stalls():
    facts = run.parse_log(LOG)
    assert facts["moe_backend"] == "TRITON"
    assert facts["moe_backend_candidates"] == "['TRITON', 'AITER', 'FLASHINFER_CUTLASS']"
    assert facts["moe_backend_reason"].startswith("it is the first supported one; Hopper")
    assert facts["torch_compile_s"] == 50.56 and facts["graph_capture_s"] == 10.0
    assert facts["engine_init_s"] == 78.2 and facts["model_load_s"] == 3.455353
    assert facts["triton_moe_warmup_s"] == 1.08
    assert facts["jit_during_inference"] == ["fused_moe_kernel"]
    official = run.parse_log(OFFICIAL)
    assert official["moe_backend"] == "TRITON" and official["moe_backend_reason"] is None
    assert "jit_during_inference" not in official


def test_variants_alternate_the_wheel_order_and_add_head_to_heads():
    todo = run.variants(
        "m",
        ["a", "b"],
        ["official", "patched"],
        ["patched:a:cutlass", "patched:b:env=flashinfer_cutlass", "official:c:auto"],
    )
    # Each kind's head-to-heads follow its two wheels, so what one comparison needs runs back
    # to back; those of kinds not benchmarked end the round.
    assert [(v["kind"], v["wheel"]) for v in todo] == [
        ("a", "official"),
        ("a", "patched"),
        ("a", "patched"),
        ("b", "patched"),
        ("b", "official"),
        ("b", "patched"),
        ("c", "official"),
    ]
    assert todo[2]["requested_backend"] == "cutlass" and "fp8_env" not in todo[2]
    assert todo[5]["fp8_env"] == "flashinfer_cutlass" and "requested_backend" not in todo[5]
    assert [todo[i]["name"] for i in (2, 5, 6)] == [
        "m-a-patched-cutlass",
        "m-b-patched-env-flashinfer_cutlass",
        "m-c-official-auto",
    ]
    # A kind's two wheels are a pair that starts only together; a head-to-head is alone.
    assert [run.pair_size(todo, i) for i in range(len(todo))] == [2, 1, 1, 2, 1, 1, 1]
    assert len({v["name"] for v in todo}) == len(todo)
    # A fourth field turns on boolean engine arguments (FlashInfer's autotuner, say).
    (tuned,) = run.variants(
        "m", [], ["official"], ["official:fp8-static:auto:enable_flashinfer_autotune,x"]
    )
    assert tuned["requested_backend"] == "auto" and tuned["kind"] == "fp8-static"
    assert tuned["engine_flags"] == ["enable_flashinfer_autotune", "x"]
    assert tuned["name"] == "m-fp8-static-official-auto-enable_flashinfer_autotune-x"
    two = run.variants("m", ["a", "b"], ["official", "patched"], [], rounds=2)
    assert [(v["kind"], v["wheel"], v["round"]) for v in two] == [
        ("a", "official", 1),
        ("a", "patched", 1),
        ("b", "patched", 1),
        ("b", "official", 1),
        ("a", "patched", 2),
        ("a", "official", 2),
        ("b", "official", 2),
        ("b", "patched", 2),
    ]
    assert two[4]["name"] == "m-a-patched-r2"
    # Round 1 keeps the one-round names, so --rounds 2 --resume extends a one-round file.
    one = run.variants("m", ["a", "b"], ["official", "patched"], [], rounds=1)
    assert [v["name"] for v in two[:4]] == [v["name"] for v in one]


def test_a_malformed_head_to_head_is_refused_in_one_line(staged_dir, tmp_path, capsys):
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--out", str(tmp_path / "h")]
    for item in ("patched:fp8-static", "patched:fp8-static:cutlass:", "a:b:c:d:e"):
        with pytest.raises(SystemExit) as exit_:
            run.main([*args, "--head-to-head", item])
        assert exit_.value.code == 2
        assert f"--head-to-head {item}: expected WHEEL:KIND:BACKEND" in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists()


def test_engine_flags_reach_the_engine_arguments(fake_vllm, monkeypatch, tmp_path):
    seen = {}
    fake = FakeEngine()
    fake.shutdown = lambda: None
    modules = {
        "vllm.engine.arg_utils": {"AsyncEngineArgs": lambda **kwargs: seen.update(kwargs)},
        "vllm.usage.usage_lib": {"UsageContext": types.SimpleNamespace(OPENAI_API_SERVER=0)},
        "vllm.v1.engine.async_llm": {
            "AsyncLLM": types.SimpleNamespace(from_engine_args=lambda args, **_: fake)
        },
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["vllm"].__version__, sys.modules["vllm"].__file__ = "0.21.0", "vllm/__init__.py"
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    spec = {
        **run.DEFAULT_SPEC,
        "model_dir": str(tmp_path),
        "smoke": 4,
        "engine_flags": ["enable_flashinfer_autotune"],
    }
    result = asyncio.run(engine.main_async(spec))
    assert result["smoke_tokens"] == 4
    assert seen["enable_flashinfer_autotune"] is True and seen["moe_backend"] == "auto"
    del spec["engine_flags"]
    seen.clear()
    asyncio.run(engine.main_async(spec))
    assert "enable_flashinfer_autotune" not in seen


def test_gpu_slots_split_the_gpus_by_tensor_parallel_size():
    assert run.gpu_slots(None, 1) == [None]
    assert run.gpu_slots("0,1", 1) == ["0", "1"]
    assert run.gpu_slots("0,1,2,3", 2) == ["0,1", "2,3"]
    assert run.gpu_slots("3, 2", 2) == ["3,2"]
    with pytest.raises(ValueError, match="not a multiple"):
        run.gpu_slots("0,1,2", 2)
    with pytest.raises(ValueError, match="names a GPU twice"):
        run.gpu_slots("0,0", 1)


def test_side_by_side_variants_swap_gpus_between_kinds(monkeypatch, tmp_path):
    started = []

    def fake_run_variant(staged, variant, spec, logs, timeout, gpus=None):
        started.append((variant["name"], gpus))
        return {**variant, "gpus": gpus, "returncode": 0}

    monkeypatch.setattr(run, "run_variant", fake_run_variant)
    todo = run.variants("m", ["a", "b"], ["official", "patched"], [])
    slots = run.gpu_slots("0,1", 1)
    records = []
    for group in run.groups(todo, len(slots)):
        records += run.run_group({}, group, {}, tmp_path, 1.0, slots)
    placed = {(r["kind"], r["wheel"]): r["gpus"] for r in records}
    assert placed == {
        ("a", "official"): "0",
        ("a", "patched"): "1",
        ("b", "patched"): "0",
        ("b", "official"): "1",
    }
    assert records[0]["alongside"] == ["m-a-patched"]
    assert sorted(started) == sorted((r["name"], r["gpus"]) for r in records)


def test_engines_never_use_nvlink_multicast(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    staged = {"sites": {"official": "o", "deps": str(tmp_path / "d")}, "dependencies": []}
    env = run.variant_env(staged, "official", tmp_path / "caches", None, "0,1")
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.fixture
def staged_dir(tmp_path, monkeypatch):
    staged = {
        "vllm": "0.21.0",
        "series_version": "0.1.0",
        "official_wheel": {"file": "o.whl", "sha256": "aa", "dropped": []},
        "patched_wheel": {"file": "p.whl", "sha256": "bb", "version": "0.21.0+moe.0.1.0"},
        "sites": {},
    }
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "staged.json").write_text(json.dumps(staged))
    monkeypatch.setattr(run, "environment", lambda: {"gpu": "H200"})
    return tmp_path / "staged"


def fake_result() -> dict:
    """An engine's result with every figure the report reads."""
    return {
        "startup_s": 1.0,
        "first_ttft_s": 0.1,
        "decode": {str(b): {"tpot_ms": [1.0], "median_ms": 1.0} for b in (1, 4, 16, 64)},
        "throughput": {"output_tokens_per_s": 1.0},
        "trace": {"ttft_p50_ms": 1.0, "ttft_p99_ms": 1.0, "triton_kernels_compiled": 0},
    }


def fake_engines(monkeypatch, failing=(), wall_s=1.0, clock=None):
    """Engines that take ``wall_s`` each (moving ``clock[0]`` on by as much, if given)."""
    started = []

    def fake_run_variant(staged, variant, spec, logs, timeout, gpus=None):
        started.append(variant["name"])
        if clock is not None:
            clock[0] += wall_s
        record = {**variant, "gpus": gpus, "returncode": 0, "log": "x.log", "wall_s": wall_s}
        record["moe_backend"] = "TRITON"
        if variant["name"] in failing:
            return {**record, "returncode": 1}
        return {**record, "result": fake_result()}

    monkeypatch.setattr(run, "run_variant", fake_run_variant)
    return started


def test_resume_runs_only_what_is_missing_or_failed(monkeypatch, staged_dir, tmp_path):
    out = tmp_path / "res"
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--kinds", "fp8-static"]
    args += ["--out", str(out)]
    started = fake_engines(monkeypatch, failing={"tiny-qwen3-moe-fp8-static-patched"})
    assert run.main(args) == 1
    assert started == ["tiny-qwen3-moe-fp8-static-official", "tiny-qwen3-moe-fp8-static-patched"]

    started = fake_engines(monkeypatch)
    assert run.main([*args, "--resume"]) == 0
    assert started == ["tiny-qwen3-moe-fp8-static-patched"]
    report = json.loads((tmp_path / "res.json").read_text())
    assert [v["wheel"] for v in report["variants"]] == ["official", "patched"]
    assert len(report["sessions"]) == 2
    assert "measured by 2 runs of the command" in (tmp_path / "res.md").read_text()

    # A call that runs none of the file's engines leaves it as it was: no third session.
    before = {p.name: p.read_bytes() for p in (tmp_path / "res.json", tmp_path / "res.md")}
    started = fake_engines(monkeypatch)
    assert run.main([*args, "--resume"]) == 0
    assert started == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "res.json", tmp_path / "res.md")} == before

    # Other wheels or another measurement: refused, the file left as it was.
    before = (tmp_path / "res.json").read_text()
    with pytest.raises(SystemExit):
        run.main([*args, "--resume", "--decode-batches", "1"])
    staged = json.loads((staged_dir / "staged.json").read_text())
    staged["patched_wheel"]["sha256"] = "cc"
    (staged_dir / "staged.json").write_text(json.dumps(staged))
    with pytest.raises(SystemExit):
        run.main([*args, "--resume"])
    assert (tmp_path / "res.json").read_text() == before


def test_start_before_leaves_the_rest_for_resume(monkeypatch, staged_dir, tmp_path, capsys):
    clock = iter(range(0, 1000, 100))  # each look at the clock: 100 s later
    monkeypatch.setattr(run.time, "monotonic", lambda: next(clock))
    out = tmp_path / "cut"
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--out", str(out)]
    args += ["--kinds", "fp8-static,fp8-block"]
    started = fake_engines(monkeypatch)
    assert run.main([*args, "--start-before", "150"]) == 3
    assert started == ["tiny-qwen3-moe-fp8-static-official"]
    assert "left for --resume" in capsys.readouterr().out
    started = fake_engines(monkeypatch)
    assert run.main([*args, "--resume"]) == 0
    assert len(started) == 3 and "tiny-qwen3-moe-fp8-static-official" not in started


def test_finish_before_starts_only_engines_that_can_end_in_time(
    monkeypatch, staged_dir, tmp_path, capsys
):
    now = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    started = fake_engines(monkeypatch, wall_s=120.0, clock=now)
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--out", str(tmp_path / "f")]
    args += ["--kinds", "fp8-static,fp8-block"]
    # Before any engine has run, the estimate decides: 300 s do not fit in 250.
    assert run.main([*args, "--finish-before", "250", "--engine-estimate", "300"]) == 3
    assert started == [] and "left for --resume (out of time)" in capsys.readouterr().out
    # A kind's two wheels start only together (never split across device calls, and so
    # machines): at 0 s the static pair (2 x 120 s) ends by 400 s; at 240 s the block pair
    # would end at 480 s, so neither of its engines starts.
    now[0] = 0.0
    assert run.main([*args, "--finish-before", "400", "--engine-estimate", "120", "--resume"]) == 3
    assert started == ["tiny-qwen3-moe-fp8-static-official", "tiny-qwen3-moe-fp8-static-patched"]
    assert now[0] == 240
    # Then the longest engine so far (120 s) is the estimate, not --engine-estimate's 300 s.
    now[0] = 0.0
    assert run.main([*args, "--finish-before", "250", "--resume"]) == 0 and len(started) == 4


def test_finish_before_leaves_out_the_engine_that_filled_the_deepgemm_cache(
    monkeypatch, staged_dir, tmp_path
):
    """The first block engine builds DeepGEMM's kernels (minutes); once the shared cache holds
    them, the next engines are judged by the warm ones, so a second block engine still starts."""
    now = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    started = fake_engines(monkeypatch)
    engine = run.run_variant
    cache = staged_dir / "deep_gemm-cache"

    def building_engine(staged, variant, *args, **kwargs):
        cold = not (cache.is_dir() and any(cache.iterdir()))
        cache.mkdir(exist_ok=True)
        (cache / "kernel.cubin").write_text("built")
        wall_s = 330.0 if cold else 170.0
        now[0] += wall_s
        record = engine(staged, variant, *args, **kwargs)
        return {**record, "wall_s": wall_s, "deepgemm_cache": "cold" if cold else "warm"}

    monkeypatch.setattr(run, "run_variant", building_engine)
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--out", str(tmp_path / "b")]
    args += ["--kinds", "fp8-block", "--share-deepgemm-cache", "--finish-before", "560"]
    args += ["--engine-estimate", "200"]
    # Cold 330 s, then warm 170 s, judged by the estimate until a warm engine has run: both end
    # by 560 s, where judging by the cold engine would have started only one.
    assert run.main(args) == 0
    assert len(started) == 2
    # On a new machine the cache is empty again: the next engine builds it, so the cold
    # engine's 330 s is the estimate, and 300 s are too few (170 s would have been enough).
    for built in cache.iterdir():
        built.unlink()
    now[0] = 0.0
    assert run.main([*args, "--rounds", "2", "--resume", "--finish-before", "300"]) == 3
    assert len(started) == 2


def test_finish_before_stops_an_engine_still_running_and_leaves_it_for_resume(
    monkeypatch, staged_dir, tmp_path, capsys
):
    """An engine that outlives the estimate is stopped at --finish-before (a device call's
    limit would kill the whole command, and the results measured before it with it)."""
    now = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    timeouts = []

    def engine(staged, variant, spec, logs, timeout, gpus=None):
        timeouts.append(timeout)
        wall_s = 100.0 if not timeouts[:-1] else 250.0  # the second overruns
        now[0] += min(wall_s, timeout)
        record = {**variant, "gpus": gpus, "log": "x.log", "wall_s": min(wall_s, timeout)}
        if wall_s > timeout:
            return {**record, "returncode": "timeout", "moe_backend": None}
        return {**record, "returncode": 0, "moe_backend": "TRITON", "result": fake_result()}

    monkeypatch.setattr(run, "run_variant", engine)
    out = tmp_path / "cut"
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--out", str(out)]
    args += ["--kinds", "fp8-static", "--timeout", "900", "--finish-before", "300"]
    assert run.main([*args, "--engine-estimate", "100"]) == 3
    assert timeouts == [300.0, 200.0]  # the second engine may run only until 300 s
    assert "stopped at --finish-before" in capsys.readouterr().out
    report = json.loads((tmp_path / "cut.json").read_text())
    assert [v["wheel"] for v in report["variants"]] == ["official"]  # not recorded as failed


def test_an_engine_past_its_timeout_is_killed_with_its_children(tmp_path):
    """vLLM's engine core is a child of the engine process: a timeout ends both."""
    marker = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {marker}; wait"
    with open(tmp_path / "log", "w") as log:
        started = time.monotonic()
        assert run.start_engine(["sh", "-c", script], dict(os.environ), log, 1.0) == "timeout"
    assert time.monotonic() - started < 30
    child = int(marker.read_text())
    for _ in range(50):  # the kill is asynchronous: give the kernel a moment to reap it
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the engine's child outlived the timeout")
    with open(tmp_path / "log", "w") as log:
        assert run.start_engine(["sh", "-c", "exit 7"], dict(os.environ), log, 10.0) == 7


def engines_recording_variants(monkeypatch) -> list[dict]:
    """Fake engines; the list fills with every variant run starts."""
    seen = []
    fake_engines(monkeypatch)
    recorded = run.run_variant
    monkeypatch.setattr(
        run,
        "run_variant",
        lambda staged, v, *a, **k: seen.append(v) or recorded(staged, v, *a, **k),
    )
    return seen


def test_uniform_routing_reaches_every_engine_and_the_spec(monkeypatch, staged_dir, tmp_path):
    seen = engines_recording_variants(monkeypatch)
    out = tmp_path / "uniform"
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--kinds", "fp8-static"]
    assert run.main([*args, "--out", str(out), "--routing", "uniform"]) == 0
    assert [v["env"]["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] for v in seen] == [
        "uniform_random"
    ] * 2
    report = json.loads((tmp_path / "uniform.json").read_text())
    assert report["spec"]["routing"] == "uniform"
    with pytest.raises(SystemExit):  # the model's router is another measurement
        run.main([*args, "--out", str(out), "--resume"])
    # A file from before --routing existed resumes as the model's own router.
    del report["spec"]["routing"]
    (tmp_path / "uniform.json").write_text(json.dumps(report))
    assert run.main([*args, "--out", str(out), "--resume"]) == 0


def test_distinct_routing_gives_each_token_k_different_experts_uniformly():
    torch = pytest.importorskip("torch")
    from moe_e2e import routing

    torch.manual_seed(0)
    ids = routing.distinct_experts(4000, 16, 4, "cpu")
    assert ids.shape == (4000, 4) and ids.dtype == torch.int32
    assert all(len(set(row)) == 4 for row in ids.tolist())  # never one expert twice
    assert int(ids.min()) == 0 and int(ids.max()) == 15
    counts = torch.bincount(ids.flatten().long(), minlength=16).float()
    assert float(counts.min()) > 900 and float(counts.max()) < 1100  # 1000 expected each
    assert routing.distinct_experts(3, 8, 8, "cpu", torch.int64).dtype == torch.int64


def test_distinct_routing_registers_with_vllms_simulator_through_its_plugin_entry_point(
    monkeypatch, tmp_path
):
    torch = pytest.importorskip("torch")
    from importlib.metadata import distributions

    from moe_e2e import routing

    folder = routing.write_entry_point(tmp_path / "plugin")
    points = [
        ep
        for dist in distributions(path=[str(folder)])
        for ep in dist.entry_points
        if ep.group == "vllm.general_plugins"
    ]
    assert [(ep.name, ep.value) for ep in points] == [
        ("moe_e2e_distinct", "moe_e2e.routing:register")
    ]
    # A stand-in for vllm's routing_simulator_router, as the entry point's function sees it.
    registered = {}
    simulator = types.ModuleType("routing_simulator_router")
    simulator.RoutingStrategy = type("RoutingStrategy", (), {})
    simulator.RoutingSimulator = types.SimpleNamespace(
        register_strategy=lambda name, strategy: registered.update({name: strategy})
    )
    name = "vllm.model_executor.layers.fused_moe.router.routing_simulator_router"
    for parent in ("vllm", "vllm.model_executor", "vllm.model_executor.layers"):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    for parent in (
        "vllm.model_executor.layers.fused_moe",
        "vllm.model_executor.layers.fused_moe.router",
    ):
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, name, simulator)
    points[0].load()()
    weights, ids = registered["moe_e2e_distinct"].route_tokens(
        torch.zeros(5, 32), torch.zeros(5, 128), 8
    )
    assert weights.shape == (5, 8) and bool((weights == 1).all())
    assert all(len(set(row)) == 8 for row in ids.tolist())


def test_distinct_routing_reaches_every_engine_with_its_plugin(monkeypatch, staged_dir, tmp_path):
    seen = engines_recording_variants(monkeypatch)
    args = ["--staged", str(staged_dir), "--model", "tiny-qwen3-moe", "--kinds", "fp8-static"]
    assert run.main([*args, "--out", str(tmp_path / "d"), "--routing", "distinct"]) == 0
    assert [v["env"]["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] for v in seen] == [
        "moe_e2e_distinct"
    ] * 2
    env = run.variant_env(
        {"sites": {"patched": "p", "deps": "d"}},
        "patched",
        tmp_path / "scratch" / "caches",
        None,
        extra=dict(run.ROUTINGS["distinct"]),
    )
    plugin = env["PYTHONPATH"].split(os.pathsep)[-1]
    assert Path(plugin) == tmp_path / "scratch" / "plugin"
    assert (Path(plugin) / "moe_e2e_routing-1.0.dist-info" / "entry_points.txt").is_file()
    plain = run.variant_env(
        {"sites": {"patched": "p", "deps": "d"}}, "patched", tmp_path / "other" / "caches", None
    )
    assert not (tmp_path / "other" / "plugin").exists() and "plugin" not in plain["PYTHONPATH"]


def test_several_models_write_one_result_each(monkeypatch, staged_dir, tmp_path):
    started = fake_engines(monkeypatch)
    out = tmp_path / "e2e"
    models_arg = "tiny-qwen3-moe,qwen3-30b-a3b"
    args = ["--staged", str(staged_dir), "--model", models_arg, "--kinds", "fp8-block"]
    assert run.main([*args, "--out", str(out)]) == 0
    assert len(started) == 4
    for model in models_arg.split(","):
        report = json.loads((tmp_path / f"e2e-{model}.json").read_text())
        assert report["model"] == model and len(report["variants"]) == 2
    with pytest.raises(SystemExit):
        run.main(["--staged", str(staged_dir), "--model", "gpt-moe", "--out", str(out)])


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
    return _report(
        [{"name": "p", "kind": "fp8-static", "wheel": "patched", "log": "p.log", "result": result}]
    )


def _report(variants: list[dict]) -> dict:
    """A result file of one model holding ``variants``."""
    return {
        "command": "python -m moe_e2e.run",
        "vllm": "0.21.0",
        "series_version": "0.1.0",
        "environment": {"gpu": "H200"},
        "model": "m",
        "spec": {"decode_batches": [1], "max_num_seqs": 64, "max_model_len": 4096},
        "official_wheel": {"file": "o.whl", "sha256": "aa", "dropped": []},
        "patched_wheel": {"file": "p.whl", "sha256": "bb", "version": "0.21.0+moe.0.1.0"},
        "variants": variants,
    }


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

    report = _report(
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

    report = _report(
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


def test_bundle_pins_every_engine_dependency():
    assert all("==" in requirement for requirement in bundle.ENGINE_DEPENDENCIES)
    names = [r.split("==")[0] for r in bundle.ENGINE_DEPENDENCIES]
    assert len(names) == len(set(names))
    assert hashlib.sha256(b"").hexdigest() == bundle.sha256_bytes(b"")
    assert io.BytesIO  # the helpers above write through in-memory buffers


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


def test_measure_profiles_the_named_batches(fake_vllm, tmp_path):
    spec = {
        **run.DEFAULT_SPEC,
        "decode_batches": [1],
        "decode_tokens": 12,
        "repeats": 1,
        "throughput": {"requests": 2, "prompt_lens": [16], "output_lens": [8]},
        "trace": {**run.DEFAULT_SPEC["trace"], "bursts": 1, "interval_s": 0.0},
        "profile_batches": [1, 4],
        "profile_prompts": [64],
        "profile_tokens": 8,
        "profile_dir": str(tmp_path),
    }
    client = engine.Client(FakeEngine(profile_dir=tmp_path), vocab_size=1000, seed=0)
    out = asyncio.run(engine.measure(client, spec))
    # one kernel per token per request: B requests x 8 tokens over 8 steps
    assert out["profile"]["1"]["us_per_step"]["moe_gemm"] == 5.0
    assert out["profile"]["4"]["us_per_step"]["moe_gemm"] == 20.0
    # One prefill of 64 tokens: one step, one output token, one kernel in the fake trace.
    assert out["profile"]["prefill 64"]["steps"] == 1
    assert out["profile"]["prefill 64"]["us_per_step"]["moe_gemm"] == 5.0
    assert out["profile"]["4"]["share"]["moe_gemm"] == 1.0


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


def test_flashinfer_comes_at_the_release_pin_and_changes_the_engine_environment(tmp_path):
    metadata = (
        "Metadata-Version: 2.1\nName: vllm\nRequires-Dist: flashinfer-python==0.6.8.post1\n"
        'Requires-Dist: flashinfer-python>=0.7; extra == "next"\nRequires-Dist: torch==2.11.0\n'
    )
    wheel = tmp_path / "vllm-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-1.0.dist-info/METADATA", metadata)
    assert bundle.pinned_requirement(wheel, "flashinfer-python") == "flashinfer-python==0.6.8.post1"
    with pytest.raises(SystemExit, match="pins no flashinfer-cubin"):
        bundle.pinned_requirement(wheel, "flashinfer-cubin")

    staged = {
        "sites": {"official": "o", "patched": "p", "deps": str(tmp_path / "site-deps")},
        "dependencies": ["pydantic-2.14.4-py3-none-any.whl"],
    }
    without = run.variant_env(staged, "official", tmp_path / "caches", None)
    assert without["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert "FLASHINFER_WORKSPACE_BASE" not in without
    staged["dependencies"].append("flashinfer_python-0.6.8.post1-py3-none-any.whl")
    with_fi = run.variant_env(staged, "patched", tmp_path / "caches", "flashinfer_cutlass")
    assert with_fi["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # same sampler, nothing compiled
    assert with_fi["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "flashinfer")
    assert with_fi["VLLM_FP8_MOE_BACKEND"] == "flashinfer_cutlass"
    assert with_fi["PYTHONPATH"].split(os.pathsep)[:2] == ["p", str(tmp_path / "site-deps")]


def engines_building_deepgemm(monkeypatch) -> list[dict]:
    """Engine processes that build a kernel into their DeepGEMM cache and succeed; the
    environment each was started with."""
    envs = []

    def fake_engine(command, env, log, timeout):
        envs.append(env)
        (Path(env["DG_JIT_CACHE_DIR"]) / "kernel.cubin").write_text("built")
        spec = json.loads(Path(command[-1]).read_text())
        Path(spec["out"]).write_text(json.dumps({"startup_s": 1.0}))
        return 0

    monkeypatch.setattr(run, "start_engine", fake_engine)
    return envs


def test_a_shared_deepgemm_cache_is_marked_cold_for_the_engine_that_fills_it(monkeypatch, tmp_path):
    shared = tmp_path / "deep_gemm-cache"
    envs = engines_building_deepgemm(monkeypatch)
    staged = {"sites": {"patched": "p", "deps": "d"}, "models": str(tmp_path), "dependencies": []}
    variant = {"name": "m-fp8-block-patched", "model": "m", "kind": "fp8-block", "wheel": "patched"}
    variant["env"] = {"DG_JIT_CACHE_DIR": str(shared)}
    first = run.run_variant(staged, variant, dict(run.DEFAULT_SPEC), tmp_path, 10)
    second = run.run_variant(staged, variant, dict(run.DEFAULT_SPEC), tmp_path, 10)
    assert (first["deepgemm_cache"], second["deepgemm_cache"]) == ("cold", "warm")
    assert [env["DG_JIT_CACHE_DIR"] for env in envs] == [str(shared)] * 2
    assert first["result"] == {"startup_s": 1.0}
    # Each record names the machine it ran on (the report pairs engines by it).
    assert first["machine"] == second["machine"] == run.machine_id() != ""


def test_the_shared_deepgemm_cache_is_an_absolute_path(monkeypatch, staged_dir):
    """DeepGEMM's compiler does not run where ``run`` was started: a relative cache path made
    every kernel build fail (``cc1plus: fatal error: staged/deep_gemm-cache/...``,
    both wheels' block-FP8 engines on the H200, results/e2e/h200-e2e-deepgemm-cache-*.log)."""
    seen = engines_recording_variants(monkeypatch)
    monkeypatch.chdir(staged_dir.parent)
    args = ["--staged", "staged", "--model", "tiny-qwen3-moe", "--kinds", "fp8-block"]
    assert run.main([*args, "--out", "r", "--share-deepgemm-cache"]) == 0
    cache = {v["env"]["DG_JIT_CACHE_DIR"] for v in seen}
    assert cache == {str(staged_dir.resolve() / "deep_gemm-cache")}


def test_each_gpu_slot_has_its_own_shared_deepgemm_cache(monkeypatch, tmp_path):
    """Engines side by side never build into one cache at once: each slot has its own, and an
    engine is cold or warm by its own slot's cache."""
    envs = engines_building_deepgemm(monkeypatch)
    staged = {"sites": {"patched": "p", "deps": "d"}, "models": str(tmp_path), "dependencies": []}
    shared = tmp_path / "deep_gemm-cache"
    variant = {"name": "m-fp8-block-patched", "model": "m", "kind": "fp8-block", "wheel": "patched"}
    variant["env"] = {"DG_JIT_CACHE_DIR": str(shared)}
    slots = run.gpu_slots("0,1,2,3", 2)
    assert not run.deepgemm_filled(variant, slots[1])
    records = [
        run.run_variant(staged, variant, dict(run.DEFAULT_SPEC), tmp_path, 10, gpus)
        for gpus in (*slots, slots[0])
    ]
    assert [(env["CUDA_VISIBLE_DEVICES"], env["DG_JIT_CACHE_DIR"]) for env in envs] == [
        ("0,1", f"{shared}-gpu0-1"),
        ("2,3", f"{shared}-gpu2-3"),
        ("0,1", f"{shared}-gpu0-1"),
    ]
    assert [r["deepgemm_cache"] for r in records] == ["cold", "cold", "warm"]
    assert run.deepgemm_filled(variant, slots[1])


def test_a_pair_on_a_cold_cache_is_expected_to_take_one_fill_and_one_warm_engine(monkeypatch):
    report = {
        "variants": [
            {"kind": "fp8-block", "deepgemm_cache": "cold", "wall_s": 420.0},
            {"kind": "fp8-static", "deepgemm_cache": "cold", "wall_s": 150.0},
        ]
    }
    block = {"kind": "fp8-block", "env": {"DG_JIT_CACHE_DIR": "/c"}}
    pair = [block, dict(block)]
    assert run.filled_in_turn(pair, False) == [False, True]
    assert run.filled_in_turn(pair, True) == [True, True]
    clock = run.Deadlines(finish_by=600.0)
    now = [0.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    assert clock.allow(report, pair, run.filled_in_turn(pair, False))  # 420 + 150 <= 600
    now[0] = 40.0
    assert not clock.allow(report, pair, run.filled_in_turn(pair, False))  # 610 > 600
    # Side by side on two slots, each filling its own cache: the longest, not the sum.
    assert clock.allow(report, pair, [False, False], side_by_side=True)


def test_bundle_builds_from_the_wheels_moe_patch_made_and_stages(
    fake_index, series_root, tmp_path, monkeypatch
):
    """``moe_patch.harness_wheels`` through the real wheel command (the synthetic release on
    the fake index), then ``bundle.build`` from its folder; only the engine's extra packages
    are left out (pip cannot fetch them here)."""
    from moe_patch.harness_wheels import harness_wheels
    from moe_patch.settings import Settings
    from wheel_support import add_wheel

    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    made = harness_wheels(
        "1.0", tmp_path / "wheels", None, Settings.resolve(index_url=fake_index.url)
    )
    monkeypatch.setattr(bundle, "download_dependencies", lambda *args: [])
    out = tmp_path / "bundle"
    summary = bundle.build(tmp_path / "wheels", out, 1, "3.12", ())
    assert summary["vllm"] == made["vllm"] == "1.0.0" and summary["parts"]
    # The series is named by version and commit (this synthetic one lies outside git).
    assert (summary["series_version"], summary["series_commit"]) == (__version__, "unknown")
    assert summary["patched_wheel_sha256"] == made["patched"]["sha256"]
    assert summary["official_wheel_sha256"] == made["official"]["sha256"]
    assert made["official"]["sha256"] == made["official"]["index_sha256"]  # as the index says
    assert summary["patched_wheel_sha256"] != summary["official_wheel_sha256"]
    monkeypatch.setattr(stage, "install_dependencies", lambda *args: None)
    staged = tmp_path / "staged"
    assert stage.stage(out, staged)["series_commit"] == "unknown"
    kernel = "vllm/model_executor/layers/fused_moe/fused_moe.py"
    official = (staged / "site-official" / kernel).read_text()
    patched = (staged / "site-patched" / kernel).read_text()
    assert official != patched and "fused_moe_kernel" in patched


def test_bundle_refuses_wheels_it_was_not_given_as_made(wheels, tmp_path, capsys):
    """No wheels.json, or a wheel that is not the one it describes: one line, no bundle."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    with pytest.raises(SystemExit) as exit_:
        bundle.main(["--wheels", str(folder), "--out", str(tmp_path / "b")])
    assert "has no readable wheels.json" in str(exit_.value.code)
    assert "python -m moe_patch.harness_wheels" in str(exit_.value.code)
    official, patched = wheels
    for wheel in (official, patched):
        shutil.copy2(wheel, folder / wheel.name)
    described = {
        "vllm": "0.21.0", "series_version": "0.2.0", "series_commit": "abc1234",
        "official": {"file": official.name, "sha256": hashlib.sha256(official.read_bytes()).hexdigest()},
        "patched": {"file": patched.name, "sha256": "0" * 64},
    }  # fmt: skip
    (folder / "wheels.json").write_text(json.dumps(described))
    with pytest.raises(SystemExit) as exit_:
        bundle.build(folder, tmp_path / "b", 1, "3.12", ())
    assert f"{folder / patched.name} is missing or not the wheel" in str(exit_.value.code)
    assert not (tmp_path / "b").exists()


def test_a_prebuilt_flashinfer_module_lands_in_its_aot_folder(monkeypatch, wheels, tmp_path):
    library = tmp_path / "fused_moe_90.so"
    library.write_bytes(b"\x7fELF prebuilt")
    build = {"kernels": "fp8", "units_built": 32, "units_in_module": 181, "stubbed_symbols": 900}
    (tmp_path / "fused_moe_90.json").write_text(json.dumps(build))
    parts = _payload_without_pip(monkeypatch, wheels, tmp_path, prebuilt=(library,))
    with pytest.raises(stage.StageError, match="FlashInfer is not bundled"):
        stage.stage(parts, tmp_path / "without")

    def pip_installs_flashinfer(payload, manifest, target):
        (target / "flashinfer").mkdir(parents=True)

    parts = _payload_without_pip(monkeypatch, wheels, tmp_path, prebuilt=(library,))
    monkeypatch.setattr(stage, "install_dependencies", pip_installs_flashinfer)
    summary = stage.stage(parts, tmp_path / "staged")
    aot = tmp_path / "staged/site-deps/flashinfer/data/aot/fused_moe_90/fused_moe_90.so"
    assert aot.read_bytes() == b"\x7fELF prebuilt"
    assert summary["flashinfer_aot"] == ["fused_moe_90.so"]
    # How the module was built reaches every result file and its report.
    assert summary["flashinfer_aot_builds"] == {"fused_moe_90.so": build}
    staged = {**summary, "dependencies": ["flashinfer_python-0.6.8.post1-py3-none-any.whl"]}
    facts = run.flashinfer_facts(staged)
    assert facts == {
        "wheel": "flashinfer_python-0.6.8.post1-py3-none-any.whl",
        "prebuilt": {"fused_moe_90.so": build},
    }
    text = markdown({**_report([]), "flashinfer": facts})
    assert "FP8 x FP8 kernels only (32 of 181 translation units" in text
    assert run.flashinfer_facts({"dependencies": []}) is None
    assert "FlashInfer: not installed" in markdown(_report([]))


def test_the_report_names_the_routing_the_engines_had():
    report = _report([])
    assert "the dummy model's own router" in markdown(report)
    report["spec"]["routing"] = "uniform"
    assert "drawn uniformly at random, independently of each other" in markdown(report)
    report["spec"]["routing"] = "distinct"
    assert "a uniformly random set of k different experts" in markdown(report)


def test_a_damaged_prebuilt_module_is_refused_and_leaves_nothing(tmp_path):
    import hashlib
    import lzma

    payload, site = tmp_path / "payload", tmp_path / "site"
    (payload / "flashinfer-aot").mkdir(parents=True)
    (site / "flashinfer").mkdir(parents=True)
    packed = payload / "flashinfer-aot" / "fused_moe_90.so.xz"
    aot = site / "flashinfer/data/aot/fused_moe_90"
    packed.write_bytes(lzma.compress(b"\x7fELF other bytes", preset=1))
    manifest = {"flashinfer_aot": {"fused_moe_90.so": hashlib.sha256(b"\x7fELF").hexdigest()}}
    with pytest.raises(stage.StageError, match="does not match the manifest"):
        stage.install_prebuilt(payload, manifest, site)
    assert not any(aot.iterdir())
    packed.write_bytes(lzma.compress(b"\x7fELF other bytes", preset=1)[:-8])  # cut short
    with pytest.raises(stage.StageError, match="could not be unpacked"):
        stage.install_prebuilt(payload, manifest, site)
    assert not any(aot.iterdir())


def test_flashinfer_aot_needs_a_cuda_13_nvcc(monkeypatch, tmp_path, capsys):
    from moe_e2e import flashinfer_aot

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    assert flashinfer_aot.main(["--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("moe_e2e.flashinfer_aot: no nvcc under") and "\n" not in error
    nvcc = tmp_path / "cuda12/bin/nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda12"))
    assert flashinfer_aot.main(["--out", str(tmp_path / "out")]) == 1
    assert "nvcc 12.8" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bundle_refuses_a_missing_prebuilt_library(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bundle.main(["--out", str(tmp_path / "b"), "--flashinfer-aot", str(tmp_path / "no.so")])
    assert exit_.value.code == 2 and "no.so: no such file" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def _fake_fused_moe_build(tmp_path: Path) -> Path:
    """A FlashInfer-like ninja file: helpers, one runner file per data-type pair, generated
    instantiation units of two data types."""
    sources = {
        "csrc/binding.cu": "// calls MoeGemmRunner<__nv_fp8_e4m3, __nv_fp8_e4m3> and others\n",
        "csrc/moe_gemm/moe_gemm_kernels_fp8_fp8.cu": (
            "template class MoeGemmRunner<__nv_fp8_e4m3, __nv_fp8_e4m3, half>;\n"
        ),
        "csrc/moe_gemm/moe_gemm_kernels_bf16_fp8.cu": (
            "template class MoeGemmRunner<__nv_bfloat16, __nv_fp8_e4m3, __nv_bfloat16>;\n"
        ),
        "gen/gemm_grouped_sm90_M128_group21.generated.cu": (
            "INSTANTIATE(Sm90, __nv_fp8_e4m3,\n  __nv_fp8_e4m3, half, 128, 16, 128);\n"
        ),
        "gen/gemm_grouped_sm90_M128_group0.generated.cu": "INSTANTIATE(Sm90, half, half, half);\n",
    }
    lines = [
        "rule compile\n  command = c++ -c $in -o $out",
        "rule link\n  command = c++ $in -o $out",
    ]
    objects = []
    for name, text in sources.items():
        source = tmp_path / name
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        objects.append(str(tmp_path / "build" / (source.stem + ".o")))
        lines.append(f"build {objects[-1]}: compile {source}")
    lines.append(f"build {tmp_path / 'build' / 'fused_moe_90.so'}: link {' '.join(objects)}")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "build.ninja").write_text("\n".join(lines) + "\n")
    return tmp_path / "build"


def test_an_fp8_only_build_leaves_out_exactly_the_other_data_types_kernel_units(tmp_path):
    from moe_e2e import flashinfer_aot

    build_dir = _fake_fused_moe_build(tmp_path)
    units, library = flashinfer_aot.ninja_units(build_dir)
    assert library.endswith("fused_moe_90.so") and len(units) == 5
    kept, left_out = flashinfer_aot.fp8_units(units)
    assert sorted(Path(o).stem for o in kept) == [
        "binding",
        "gemm_grouped_sm90_M128_group21.generated",
        "moe_gemm_kernels_fp8_fp8",
    ]
    assert sorted(Path(s).name for s in left_out) == [
        "gemm_grouped_sm90_M128_group0.generated.cu",
        "moe_gemm_kernels_bf16_fp8.cu",
    ]


@pytest.mark.skipif(not all(map(shutil.which, ("c++", "nm"))), reason="needs a C++ compiler and nm")
def test_stubs_stand_in_for_left_out_kernels_and_stop_loudly_when_called(tmp_path):
    from moe_e2e import flashinfer_aot

    kept = tmp_path / "kept.cpp"
    kept.write_text(
        "#include <cstdio>\n"
        "namespace tensorrt_llm { template <class T> struct Runner { void run(); };\n"
        '  extern template struct Runner<float>; void helper() { std::puts("ok"); } }\n'
        'extern "C" int fp8_path() { tensorrt_llm::helper(); return 8; }\n'
        'extern "C" void other_type() { tensorrt_llm::Runner<float>().run(); }\n'
    )
    subprocess.run(["c++", "-fPIC", "-c", str(kept), "-o", str(tmp_path / "kept.o")], check=True)
    missing = flashinfer_aot.missing_symbols([str(tmp_path / "kept.o")])
    assert missing == ["_ZN12tensorrt_llm6RunnerIfE3runEv"]  # not puts, not the defined helper
    stubs = tmp_path / "stubs.cpp"
    stubs.write_text(flashinfer_aot.stub_source(missing))
    library = tmp_path / "libmodule.so"
    subprocess.run(
        ["c++", "-shared", "-fPIC", str(tmp_path / "kept.o"), str(stubs), "-o", str(library)],
        check=True,
    )
    undefined = flashinfer_aot.nm_symbols([str(library)], "--dynamic", "--undefined-only")
    assert not [s for s in undefined if flashinfer_aot.TRTLLM_SYMBOL.match(s)]
    call = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); print(lib.{}())"
    fine = subprocess.run(
        [sys.executable, "-c", call.format("fp8_path"), str(library)],
        capture_output=True,
        text=True,
    )
    assert fine.returncode == 0 and sorted(fine.stdout.split()) == ["8", "ok"]
    stopped = subprocess.run(
        [sys.executable, "-c", call.format("other_type"), str(library)],
        capture_output=True,
        text=True,
    )
    assert stopped.returncode != 0
    assert "has no _ZN12tensorrt_llm6RunnerIfE3runEv: rebuild with --kernels all" in stopped.stderr


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
    result_file.write_text(json.dumps(_report([official, patched, forced, failed])))
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

    report = _report(
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
