"""The end-to-end benchmark's measurement logic without a GPU (``moe_e2e.run``,
``moe_e2e.engine``, ``moe_e2e.routing``): a fake engine stands in for vLLM's AsyncLLM, so
phases, variants, resuming, deadlines, routing and caches are exercised on any machine."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import types
import zipfile
from pathlib import Path

import pytest
from moe_e2e import bundle, engine, run


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
