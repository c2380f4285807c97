"""Where a decode step's GPU time goes: kernels of a torch-profiler trace, by kind.

vLLM writes one Chrome trace per profiled window (``ProfilerConfig.torch_profiler_dir``); the
GPU kernels in it (events of category ``kernel``) are summed per kind:

* ``moe_gemm``: the expert GEMMs (Triton ``fused_moe_kernel``, CUTLASS / FlashInfer MoE GEMMs);
* ``moe_routing``: top-k, alignment and sorting of tokens to experts, the weighted sum;
* ``attention``: attention kernels and the KV-cache writes;
* ``linear``: the dense projections (QKV, output, LM head, router) and other GEMMs;
* ``quantization``: activation quantisation and scale kernels;
* ``other``: norms, rotary embedding, activations, sampling, copies, everything else.

The first matching rule wins, in the order of ``RULES``.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

RULES = (
    ("moe_gemm", re.compile(r"fused_moe_kernel|moe.*(gemm|mm)|grouped.*(gemm|mm)|cutlass.*moe")),
    (
        "moe_routing",
        re.compile(
            r"topk|top_k|moe_align|align_block|count_and_sort|sort_tokens|"
            r"moe_sum|expert|gating|routing"
        ),
    ),
    ("attention", re.compile(r"flash|fmha|attn|attention|reshape_and_cache|paged|mla")),
    ("linear", re.compile(r"gemm|gemv|matmul|_mm\b|_mm_|xmma|nvjet|cublas|cutlass|wgmma")),
    ("quantization", re.compile(r"quant|fp8|scale")),
)
KINDS = tuple(kind for kind, _ in RULES) + ("other",)


def classify(kernel_name: str) -> str:
    name = kernel_name.lower()
    for kind, pattern in RULES:
        if pattern.search(name):
            return kind
    return "other"


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def breakdown(trace: dict, steps: int) -> dict:
    """GPU kernel time per kind (µs per step and share), the top kernels, from one trace."""
    totals = dict.fromkeys(KINDS, 0.0)
    per_kernel: dict[str, float] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or "dur" not in event:
            continue
        name = event.get("name", "")
        totals[classify(name)] += event["dur"]
        per_kernel[name] = per_kernel.get(name, 0.0) + event["dur"]
    total = sum(totals.values())
    if not total:
        return {"steps": steps, "error": "no GPU kernels in the trace"}
    top = sorted(per_kernel.items(), key=lambda item: -item[1])[:12]
    return {
        "steps": steps,
        "kernel_us_per_step": total / steps if steps else None,
        "us_per_step": {kind: totals[kind] / steps for kind in KINDS} if steps else None,
        "share": {kind: (totals[kind] / total if total else 0.0) for kind in KINDS},
        "top_kernels": [
            {"name": name[:120], "kind": classify(name), "us_per_step": us / steps if steps else us}
            for name, us in top
        ],
    }
