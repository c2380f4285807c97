"""One benchmark variant in one fresh process: start a vLLM engine, measure it, write JSON.

    python -m moe_e2e.engine SPEC.json

Started by ``moe_e2e.run`` with the variant's vLLM first on PYTHONPATH and empty compile caches;
the spec names the model directory, the quantisation, the MoE backend and what to measure.
Everything is measured as a client of vLLM's ``AsyncLLM`` (the engine behind ``vllm serve``),
streaming every token:

* ``startup_s``: from the process's start (``MOE_E2E_LAUNCHED``, set by run) until the engine
  accepts requests: imports, dummy weights, torch.compile, Triton JIT and CUDA-graph capture;
* ``first_ttft_s``: the first request on the new engine (512-token prompt);
* ``prefill``: per prompt length, the TTFT of one request alone on the engine (the prefill's
  speed), after one unmeasured request of that length (``first_ms``: where a new token count
  meets a kernel not yet compiled, it shows there);
* ``decode``: per batch size B, B requests of 128 prompt tokens sent together, time per output
  token of each request from its 5th token to its last, median over requests, per repeat;
* ``throughput``: a fixed mix of prompt/output lengths sent at once, output tokens per second;
* ``trace``: bursts of 1..32 requests with random prompt lengths every ``interval_s``, the TTFT
  of each request (where a new token count compiles a Triton kernel, a burst waits for it);
* ``triton_kernels``: compiled kernels in the Triton cache after each phase;
* ``profile`` (when the spec names ``profile_batches`` or ``profile_prompts``): per batch size,
  the GPU time of a batch's steps (16-token prompts, ``profile_tokens`` output tokens), and per
  prompt length the GPU time of one prefill, by kernel kind, from the GPU worker's
  torch-profiler trace (``moe_e2e.profile``), measured last.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

LAUNCHED = float(os.environ.get("MOE_E2E_LAUNCHED", time.time()))


def triton_kernels() -> int:
    """Compiled kernels in this process tree's Triton cache (one directory per kernel variant)."""
    cache = os.environ.get("TRITON_CACHE_DIR")
    if not cache or not Path(cache).is_dir():
        return 0
    return sum(1 for entry in Path(cache).iterdir() if entry.is_dir())


class Client:
    def __init__(self, engine, vocab_size: int, seed: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self.random = random.Random(seed)
        self.vocab = vocab_size
        self.counter = 0
        self.params = lambda tokens: SamplingParams(
            max_tokens=tokens,
            min_tokens=tokens,
            ignore_eos=True,
            temperature=0.0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def prompt(self, length: int) -> dict:
        # Fresh random ids for every request: no prefix-cache hits between requests.
        return {
            "prompt_token_ids": [
                self.random.randrange(100, self.vocab - 100) for _ in range(length)
            ]
        }

    async def request(self, prompt_len: int, output_len: int) -> dict:
        """One streamed request: submit time, and (time, tokens) for every output."""
        self.counter += 1
        arrivals = []
        submitted = time.perf_counter()
        async for out in self.engine.generate(
            self.prompt(prompt_len), self.params(output_len), f"req-{self.counter}"
        ):
            arrivals.append((time.perf_counter(), len(out.outputs[0].token_ids)))
        tokens = sum(n for _, n in arrivals)
        return {"submitted": submitted, "arrivals": arrivals, "tokens": tokens}


def time_per_token(result: dict, skip: int = 4) -> float | None:
    """Seconds per output token after the first ``skip`` tokens (prefill and batch forming)."""
    seen, start = 0, None
    for t, n in result["arrivals"]:
        seen += n
        if start is None and seen >= skip:
            start, start_tokens = t, seen
    if start is None or seen - start_tokens < 8:
        return None
    return (result["arrivals"][-1][0] - start) / (seen - start_tokens)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def measure(client: Client, spec: dict) -> dict:
    out: dict = {"triton_kernels": {"ready": triton_kernels()}}

    first = await client.request(512, 2)
    out["first_ttft_s"] = first["arrivals"][0][0] - first["submitted"]
    out["triton_kernels"]["first_request"] = triton_kernels()

    prefill = {}
    for length in spec.get("prefill_lens", []):
        ttfts = []
        for _ in range(spec["repeats"] + 1):
            result = await client.request(length, 1)
            ttfts.append((result["arrivals"][0][0] - result["submitted"]) * 1e3)
        prefill[str(length)] = {
            "first_ms": ttfts[0],
            "ttft_ms": ttfts[1:],
            "median_ms": statistics.median(ttfts[1:]),
        }
    out["prefill"] = prefill
    out["triton_kernels"]["prefill"] = triton_kernels()

    decode = {}
    for batch in spec["decode_batches"]:
        repeats = []
        for _ in range(spec["repeats"]):
            results = await asyncio.gather(
                *(client.request(128, spec["decode_tokens"]) for _ in range(batch))
            )
            per_request = [t for t in map(time_per_token, results) if t is not None]
            repeats.append(statistics.median(per_request) * 1e3)
        decode[str(batch)] = {"tpot_ms": repeats, "median_ms": statistics.median(repeats)}
    out["decode"] = decode
    out["triton_kernels"]["decode"] = triton_kernels()

    mix = spec["throughput"]
    shapes = [(p, o) for p in mix["prompt_lens"] for o in mix["output_lens"]]
    jobs = [shapes[i % len(shapes)] for i in range(mix["requests"])]
    started = time.perf_counter()
    results = await asyncio.gather(*(client.request(p, o) for p, o in jobs))
    seconds = time.perf_counter() - started
    tokens = sum(r["tokens"] for r in results)
    out["throughput"] = {
        "requests": len(jobs),
        "output_tokens": tokens,
        "prompt_tokens": sum(p for p, _ in jobs),
        "seconds": seconds,
        "output_tokens_per_s": tokens / seconds,
    }
    out["triton_kernels"]["throughput"] = triton_kernels()

    trace = spec["trace"]
    rng = random.Random(trace["seed"])
    bursts = [
        [
            rng.randint(trace["min_prompt"], trace["max_prompt"])
            for _ in range(rng.choice(trace["burst_sizes"]))
        ]
        for _ in range(trace["bursts"])
    ]

    async def burst(delay: float, lengths: list[int]) -> list[dict]:
        await asyncio.sleep(delay)
        return await asyncio.gather(*(client.request(n, trace["output_len"]) for n in lengths))

    before = triton_kernels()
    done = await asyncio.gather(
        *(burst(i * trace["interval_s"], lengths) for i, lengths in enumerate(bursts))
    )
    ttfts = [r["arrivals"][0][0] - r["submitted"] for group in done for r in group]
    out["trace"] = {
        "requests": len(ttfts),
        "burst_sizes": [len(b) for b in bursts],
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3,
        "ttft_p90_ms": percentile(ttfts, 90) * 1e3,
        "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "ttft_max_ms": max(ttfts) * 1e3,
        "ttft_mean_ms": statistics.fmean(ttfts) * 1e3,
        "triton_kernels_compiled": triton_kernels() - before,
    }
    out["triton_kernels"]["trace"] = triton_kernels()

    if spec.get("profile_batches") or spec.get("profile_prompts"):
        out["profile"] = await profile_steps(client, spec)
    return out


async def profile_steps(client: Client, spec: dict) -> dict:
    """Where the GPU time goes (``moe_e2e.profile``), per profiled window: decode batches
    (``B`` requests of 16-token prompts, ``profile_tokens`` output tokens, per step) and single
    prefills (``prefill N``: one request of N prompt tokens and one output token)."""
    tokens = spec.get("profile_tokens", 32)
    out = {}
    for batch in spec.get("profile_batches", []):
        requests = [(16, tokens)] * batch
        out[str(batch)] = await profile_window(client, spec, requests, steps=tokens)
    for length in spec.get("profile_prompts", []):
        out[f"prefill {length}"] = await profile_window(client, spec, [(length, 1)], steps=1)
    return out


async def profile_window(client: Client, spec: dict, requests: list, steps: int) -> dict:
    from .profile import breakdown, load_trace

    traces = Path(spec["profile_dir"])
    before = set(worker_traces(traces))
    await client.engine.start_profile()
    await asyncio.gather(*(client.request(prompt, output) for prompt, output in requests))
    await client.engine.stop_profile()
    for _ in range(120):  # the worker writes its trace after stopping
        new = [path for path in worker_traces(traces) if path not in before]
        if new:
            return {"trace": new[0].name, **breakdown(load_trace(new[0]), steps)}
        await asyncio.sleep(1.0)
    return {"error": "no worker trace written"}


def worker_traces(traces: Path) -> list[Path]:
    """The GPU workers' traces (rank 0 first); the front end's CPU-only ones are left out."""
    return sorted(
        path for path in traces.rglob("*.pt.trace.json*") if ".async_llm." not in path.name
    )


def profiler_args(spec: dict) -> dict:
    if not (spec.get("profile_batches") or spec.get("profile_prompts")):
        return {}
    return {
        "profiler_config": {
            "profiler": "torch",
            "torch_profiler_dir": spec["profile_dir"],
            "torch_profiler_with_stack": False,
            "torch_profiler_use_gzip": True,
            "ignore_frontend": True,
        }
    }


async def main_async(spec: dict) -> dict:
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    config = json.loads((Path(spec["model_dir"]) / "config.json").read_text())
    args = AsyncEngineArgs(
        model=spec["model_dir"],
        load_format="dummy",
        skip_tokenizer_init=True,
        quantization=spec.get("quantization"),
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec.get("max_num_seqs"),
        tensor_parallel_size=spec.get("tensor_parallel_size", 1),
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        seed=spec["seed"],
        moe_backend=spec.get("moe_backend") or "auto",
        **dict.fromkeys(spec.get("engine_flags", []), True),
        disable_log_stats=True,
        **profiler_args(spec),
    )
    engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
    result = {
        "vllm_version": vllm.__version__,
        "vllm_path": str(Path(vllm.__file__).parent),
        "startup_s": time.time() - LAUNCHED,
    }
    try:
        client = Client(engine, config["vocab_size"], spec["seed"])
        if spec.get("smoke"):
            done = await client.request(64, spec["smoke"])
            result["smoke_tokens"] = done["tokens"]
        else:
            result.update(await measure(client, spec))
    finally:
        engine.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    result = asyncio.run(main_async(spec))
    Path(spec["out"]).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
