"""vLLM's engine with the fused decode path (a tree with the fused-decode patch on
``PYTHONPATH``): it starts on a small FP8 MoE model (``moe_e2e``'s tiny Qwen3-MoE, dummy
weights), decodes batches of 1, 3, 8 and 16 sequences, and every call the fused path takes
is checked against the unfused path on the same inputs and against float64.

    python engine_check.py --kind fp8-block --mode eager --out OUT.json
    python engine_check.py --kind fp8-block --mode graphs --out OUT.json

``eager``: no CUDA graphs; the modular kernel's ``apply`` is wrapped so that each call that
reaches the fused path runs the unfused path first on a copy of its inputs.  ``graphs``: the
engine as served (torch.compile and CUDA graphs); the fused path runs during capture and
replays, and the greedy tokens are written for comparison with ``eager``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model in this process
# vLLM 0.25.1's sampler imports FlashInfer whenever this is on (its default), and the bundle
# brings no FlashInfer: the engine failed to start on the H100 of 2026-12-07 without it.
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import torch  # noqa: E402
from moe_e2e.models import write_model  # noqa: E402

BATCHES = (1, 3, 8, 16)
PROMPT_TOKENS = 24
OUTPUT_TOKENS = 12
# The two paths differ in where they quantise to FP8 (the unfused path's activation scale is
# per tensor or per 128 columns, the fused path's per token and 128 columns): each within
# the layer bound of float64, so within twice it of each other (the upstream test's bound;
# the first engine run, H100 2026-12-07, had 0.046 and 0.050 against float64 and 0.066
# between them, which the single bound this used to apply called a failure).
PATH_BOUND = 6e-2


def dequantized(weight, scale, block):
    """float64 weights [E, N, K] from FP8 and their scales (per tensor, channel or block)."""
    E, N, K = weight.shape
    w = weight.double()
    s = scale.double()
    if block is not None:
        s = s.repeat_interleave(block[0], 1)[:, :N].repeat_interleave(block[1], 2)[:, :, :K]
        return w * s
    if s.numel() == E:
        return w * s.view(E, 1, 1)
    return w * s.reshape(E, N, 1)


def float64_layer(x, w1, w2, topk_weights, topk_ids):
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    inter = w2.shape[-1]
    for t in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            h = w1[e] @ x[t].double()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(topk_weights[t, k]) * (w2[e] @ act)
    return out


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def instrument(record):
    """Wrap the modular kernel so each fused call is checked and counted."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    fused = mk.fused_moe_decode
    apply = mk.FusedMoEKernelModularImpl.apply

    def counted(*args, **kwargs):
        record["fused_calls"] += 1
        record["fused_tokens"][str(args[0].shape[0])] = (
            record["fused_tokens"].get(str(args[0].shape[0]), 0) + 1
        )
        return fused(*args, **kwargs)

    def checked(self, hidden_states, w1, w2, topk_ids, topk_weights, *args, **kwargs):
        if not (record["check"] and self.fused_decode):
            return apply(self, hidden_states, w1, w2, topk_ids, topk_weights, *args, **kwargs)
        before = record["fused_calls"]
        self.fused_decode = False
        try:
            unfused = apply(
                self, hidden_states.clone(), w1, w2, topk_ids, topk_weights, *args, **kwargs
            ).clone()
        finally:
            self.fused_decode = True
        out = apply(self, hidden_states, w1, w2, topk_ids, topk_weights, *args, **kwargs)
        if record["fused_calls"] == before:
            return out  # the rule kept this batch on the unfused path
        quant = self.fused_experts.quant_config
        block = quant.block_shape
        ref = float64_layer(
            hidden_states,
            dequantized(w1, quant.w1_scale, block),
            dequantized(w2, quant.w2_scale, block),
            topk_weights,
            topk_ids,
        )
        record["checks"].append(
            {
                "tokens": hidden_states.shape[0],
                "fused_vs_unfused": rel(out, unfused),
                "fused_vs_float64": rel(out, ref),
                "unfused_vs_float64": rel(unfused, ref),
                "finite": bool(torch.isfinite(out).all()),
            }
        )
        return out

    mk.fused_moe_decode = counted
    mk.FusedMoEKernelModularImpl.apply = checked


def stub_flashmla() -> None:
    """The pack's tree is the release's source with the wheel's compiled extensions; the
    wheel also ships FlashMLA's Python interface (``vllm/third_party/flashmla``), which
    vLLM imports at start-up and these engines never call: a stub stands in for it."""
    import importlib
    import types

    name = "vllm.third_party.flashmla.flash_mla_interface"
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        stub = types.ModuleType(name)
        stub.__file__ = "<stub>"

        def placeholder(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {})

        stub.__getattr__ = placeholder
        sys.modules[name] = stub


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", default="fp8-block")
    parser.add_argument("--mode", choices=("eager", "graphs"), default="eager")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    record = {"kind": args.kind, "mode": args.mode, "fused_calls": 0, "fused_tokens": {}}
    record["check"] = args.mode == "eager"
    record["checks"] = []
    stub_flashmla()
    instrument(record)
    from vllm import LLM, SamplingParams

    model = write_model(Path(tempfile.mkdtemp()), "tiny-qwen3-moe", args.kind)
    quantization = "fp8" if args.kind == "fp8-dynamic" else None
    started = time.time()
    llm = LLM(
        model=str(model),
        quantization=quantization,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=1024,
        max_num_seqs=16,
        gpu_memory_utilization=0.3,
        enforce_eager=args.mode == "eager",
        seed=0,
    )
    record["startup_s"] = time.time() - started
    record["calls_after_startup"] = record["fused_calls"]
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, detokenize=False)
    gen = torch.Generator().manual_seed(0)
    record["tokens"] = {}
    for batch in BATCHES:
        prompts = [
            {"prompt_token_ids": torch.randint(3, 8000, (PROMPT_TOKENS,), generator=gen).tolist()}
            for _ in range(batch)
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        record["tokens"][str(batch)] = [list(o.outputs[0].token_ids) for o in outputs]
    checks = record["checks"]
    record["summary"] = {
        "fused_calls": record["fused_calls"],
        "checked": len(checks),
        "max_fused_vs_unfused": max((c["fused_vs_unfused"] for c in checks), default=None),
        "max_fused_vs_float64": max((c["fused_vs_float64"] for c in checks), default=None),
        "max_unfused_vs_float64": max((c["unfused_vs_float64"] for c in checks), default=None),
        "all_finite": all(c["finite"] for c in checks),
        "lengths_ok": all(len(t) == OUTPUT_TOKENS for ts in record["tokens"].values() for t in ts),
    }
    s = record["summary"]
    ok = s["fused_calls"] > 0 and s["lengths_ok"]
    if args.mode == "eager":
        ok = ok and s["checked"] > 0 and s["all_finite"]
        ok = (
            ok
            and s["max_fused_vs_unfused"] < 2 * PATH_BOUND
            and s["max_fused_vs_float64"] < PATH_BOUND
        )
    record["passed"] = ok
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(s), "PASSED" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
