"""Where a decode step's GPU time goes: kernels of a torch-profiler trace, by kind.

vLLM writes one Chrome trace per profiled window (``ProfilerConfig.torch_profiler_dir``); the
GPU kernels in it (events of category ``kernel``) are summed per kind:

* ``moe_gemm``: the expert GEMMs (Triton ``fused_moe_kernel``, CUTLASS grouped / FlashInfer MoE
  GEMMs: CUTLASS 3's grouped kernels carry ``GroupProblemShape`` in their name, and FlashInfer's
  per-launch stride set-up goes with them);
* ``moe_routing``: top-k, alignment and sorting of tokens to experts, the weighted sum
  (FlashInfer's CUTLASS MoE: building the expert maps, expanding the input rows, the
  finalize that un-permutes and sums);
* ``attention``: attention kernels and the KV-cache writes;
* ``linear``: the dense projections (QKV, output, LM head, router) and other GEMMs;
* ``quantization``: activation quantisation and scale kernels;
* ``other``: norms, rotary embedding, activations, sampling, copies, everything else.

Kernels that torch.compile (Inductor) generates, ``triton_{poi,red,per}_fused_...``, are named
after the graph nodes they fuse, which may include the GEMM they feed (``..._scaled_mm_...``):
they are elementwise or reduction kernels, so they count as ``quantization`` when they compute
a scale (abs / max / clamp / reciprocal) and as ``other`` otherwise.  For the rest, the first
matching rule wins, in the order of ``RULES``; FlashInfer's fused SiLU-and-mul (which also
quantises for the second GEMM) is ``other``, as vLLM's own ``act_and_mul`` is.  A window keeps
every kernel's time by name, so a result can be sorted again when the rules learn a name
(``moe_e2e.report --refresh``).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

KINDS = ("moe_gemm", "moe_routing", "attention", "linear", "quantization", "other")
RULES = (
    # FlashInfer's (TensorRT-LLM's) CUTLASS MoE around its grouped GEMM, before the broad
    # "cutlass" and "moe" rules below catch them.
    ("moe_routing", re.compile(r"buildexpertmaps|expandinputrows|finalizemoerouting")),
    ("other", re.compile(r"cutlass_kernels::doactivationkernel")),
    (
        "moe_gemm",
        re.compile(
            r"fused_moe_kernel|groupproblemshape|computestridestmawarpspecialized|"
            r"moe.*(gemm|mm)|group(ed)?_?(gemm|mm)|cutlass.*moe"
        ),
    ),
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
INDUCTOR = re.compile(r"^triton_(poi|red|per)_fused")
SCALE_MATH = re.compile(r"quant|fp8|abs.*(max|clamp)|clamp.*reciprocal|reciprocal")


def classify(kernel_name: str) -> str:
    name = kernel_name.lower()
    if INDUCTOR.search(name):
        return "quantization" if SCALE_MATH.search(name) else "other"
    for kind, pattern in RULES:
        if pattern.search(name):
            return kind
    return "other"


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


TOP = 12
NAME_CHARS = 240  # enough to tell kernels apart (template arguments), short enough to read


def breakdown(trace: dict, steps: int) -> dict:
    """GPU kernel time per kind (µs per step and share) and per kernel, from one trace."""
    per_kernel: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel" or "dur" not in event:
            continue
        name = event.get("name", "")[:NAME_CHARS]
        per_kernel[name] = per_kernel.get(name, 0.0) + event["dur"]
        calls[name] = calls.get(name, 0) + 1
    if not per_kernel:
        return {"steps": steps, "error": "no GPU kernels in the trace"}
    kernels = [
        {"name": name, "us_per_step": us / steps, "calls_per_step": calls[name] / steps}
        for name, us in sorted(per_kernel.items(), key=lambda item: -item[1])
    ]
    return {"steps": steps, **by_kind(kernels), "kernels": kernels}


def by_kind(kernels: list[dict]) -> dict:
    """Totals per kind and the top kernels, from a window's per-kernel times."""
    totals = dict.fromkeys(KINDS, 0.0)
    for kernel in kernels:
        totals[classify(kernel["name"])] += kernel["us_per_step"]
    total = sum(totals.values())
    return {
        "kernel_us_per_step": total,
        "us_per_step": totals,
        "share": {kind: totals[kind] / total for kind in KINDS},
        "top_kernels": [
            {"name": k["name"][:120], "kind": classify(k["name"]), "us_per_step": k["us_per_step"]}
            for k in kernels[:TOP]
        ],
    }


def resorted(window: dict) -> dict:
    """``window`` with its kinds computed again by the current rules.  A window that kept every
    kernel is sorted exactly; one that kept only its top kernels has each of those moved to its
    kind now, the rest left where they were counted (``resorted_from_top``)."""
    if "error" in window:
        return window
    if "kernels" in window:
        return {**window, **by_kind(window["kernels"])}
    totals = dict(window["us_per_step"])
    top = []
    for kernel in window["top_kernels"]:
        kind = classify(kernel["name"])
        totals[kernel["kind"]] -= kernel["us_per_step"]
        totals[kind] += kernel["us_per_step"]
        top.append({**kernel, "kind": kind})
    total = sum(totals.values())
    return {
        **window,
        "us_per_step": totals,
        "share": {kind: totals[kind] / total for kind in KINDS},
        "top_kernels": top,
        "resorted_from_top": True,
    }
