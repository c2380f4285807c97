"""How often does fused_moe_kernel recompile as the token count varies?

For each tree, with a cold Triton cache and a freshly loaded kernel, the MoE
layer's two GEMMs (Qwen3-30B-A3B shape, FP8, launch configs from the tree's own
dispatch) run for

* a sweep: every token count 1..300, then a spread up to 2048;
* a serving-like trace: prefill chunks with lognormal prompt lengths and decode
  batches of 1..64 requests, in random order (fresh cache again).

A call after which Triton holds more compiled variants than before is a
compile stall on the request path; its wall time is counted as stall time.

    python -m moe_kernels.jit_sweep --tree 0.21.0=/path --tree 0.21.0+moe=/path \
        --out jit.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .align import prepare_expert_assignment
from .dispatch import config_for
from .launch import invoke_fused_moe_kernel
from .loader import load_fused_moe_kernel
from .measure import DEVICE, SHAPES, gemm_dims, record_header
from .quant import quantize_activations, quantize_weights

SWEEP = list(range(1, 301)) + list(range(320, 2049, 64)) + [333, 777, 1000, 1500, 2047]
BLOCK_SHAPE = (128, 128)


def serving_trace(steps: int, seed: int) -> list[int]:
    """Token counts of a mixed prefill/decode stream (chunked prefill at 2048)."""
    rng = random.Random(seed)
    counts = []
    for _ in range(steps):
        if rng.random() < 0.3:
            prompt = int(rng.lognormvariate(6.2, 0.9))  # median ~ 500 tokens
            counts.append(max(1, min(prompt, 2048)))
        else:
            counts.append(rng.randint(1, 64))
    return counts


class Layer:
    """Both GEMMs of one FP8 MoE layer, launched the way vLLM launches them."""

    def __init__(self, tree: Path, shape_name: str, quant: str, seed: int):
        self.tree, self.shape, self.quant = tree, SHAPES[shape_name], quant
        self.block = BLOCK_SHAPE if quant == "block" else None
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.weights = {}
        for gemm in ("up", "down"):
            N, K = gemm_dims(self.shape, gemm)
            w = torch.randn(
                self.shape.experts, N, K, generator=gen, device=DEVICE, dtype=torch.bfloat16
            )
            self.weights[gemm] = quantize_weights(w, quant, self.block)
        self.gen = gen

    def run(self, kernel, M: int) -> None:
        s = self.shape
        logits = torch.randn(M, s.experts, generator=self.gen, device=DEVICE)
        weights, ids = torch.topk(torch.softmax(logits, -1), s.topk, dim=-1)
        ids = ids.to(torch.int32)
        config, _ = config_for(
            self.tree,
            M,
            s.experts,
            s.intermediate,
            s.hidden,
            s.topk,
            "fp8_w8a8",
            list(self.block) if self.block else None,
        )
        config.pop("SPLIT_K", None)
        swap = config.pop("SWAP_AB", None)
        sorted_ids, expert_ids, num_post = prepare_expert_assignment(
            ids, config["BLOCK_SIZE_M"], s.experts
        )
        for gemm in ("up", "down"):
            N, K = gemm_dims(s, gemm)
            rows = M if gemm == "up" else M * s.topk
            a = torch.randn(rows, K, generator=self.gen, device=DEVICE, dtype=torch.bfloat16)
            a_q, a_scale = quantize_activations(a, self.quant, self.block)
            C = torch.empty(M, s.topk, N, dtype=torch.bfloat16, device=DEVICE)
            w_q, w_scale = self.weights[gemm]
            invoke_fused_moe_kernel(
                kernel,
                a_q,
                w_q,
                C,
                a_scale,
                w_scale,
                weights.float(),
                sorted_ids,
                expert_ids,
                num_post,
                gemm == "down",
                s.topk if gemm == "up" else 1,
                config,
                use_fp8_w8a8=True,
                block_shape=list(self.block) if self.block else None,
                swap_ab=swap,
            )


def _synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def measure(tree: Path, layer: Layer, counts: list[int]) -> dict:
    """Run ``counts`` through the kernel; call in a fresh process (see main)."""
    kernel = load_fused_moe_kernel(tree)
    stalls = []
    variants = 0
    for M in counts:
        _synchronize()
        started = time.perf_counter()
        layer.run(kernel, M)
        _synchronize()
        elapsed = time.perf_counter() - started
        now = kernel.compiled_variant_count()
        if now > variants:
            stalls.append({"M": M, "new_variants": now - variants, "seconds": elapsed})
            variants = now
    return {
        "calls": len(counts),
        "variants": variants,
        "stalls": len(stalls),
        "stall_seconds": sum(s["seconds"] for s in stalls),
        "stall_log": stalls,
    }


def _cold_run(spec: str, kind: str, args) -> dict:
    """One measurement in a new process with an empty Triton cache directory, so
    neither Triton's in-memory nor its on-disk cache remembers earlier runs."""
    with tempfile.TemporaryDirectory(prefix="jit-sweep-") as scratch:
        out = Path(scratch) / "result.json"
        env = dict(os.environ, TRITON_CACHE_DIR=str(Path(scratch) / "triton-cache"))
        env["MOE_KERNELS_CACHE"] = str(Path(scratch) / "generated")
        command = [
            sys.executable,
            "-m",
            "moe_kernels.jit_sweep",
            "--tree",
            spec,
            "--shape",
            args.shape,
            "--quant",
            args.quant,
            "--trace-steps",
            str(args.trace_steps),
            "--seed",
            str(args.seed),
            "--only",
            kind,
            "--out",
            str(out),
        ] + (["--limit", str(args.limit)] if args.limit else [])
        subprocess.run(command, env=env, check=True)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--quant", default="tensor", choices=["tensor", "block"])
    parser.add_argument("--trace-steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, help="use only the first N token counts (smoke tests)")
    parser.add_argument("--only", choices=["sweep", "trace"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    trace = serving_trace(args.trace_steps, args.seed)
    if args.only:  # child process: one tree, one run, cold caches
        tree = Path(args.tree[0].partition("=")[2])
        layer = Layer(tree, args.shape, args.quant, args.seed)
        counts = (SWEEP if args.only == "sweep" else trace)[: args.limit]
        args.out.write_text(json.dumps(measure(tree, layer, counts)))
        return 0
    results = {}
    for spec in args.tree:
        label = spec.partition("=")[0]
        results[label] = {kind: _cold_run(spec, kind, args) for kind in ("sweep", "trace")}
        for kind in ("sweep", "trace"):
            r = results[label][kind]
            print(
                f"{label:14s} {kind:5s} calls={r['calls']:5d} variants={r['variants']:3d} "
                f"stalls={r['stalls']:3d} stall_s={r['stall_seconds']:.2f}",
                flush=True,
            )
    report = {
        **record_header("moe_kernels.jit_sweep", argv, args.tree),
        "shape": args.shape,
        "quant": args.quant,
        "sweep_token_counts": SWEEP,
        "trace": {"steps": args.trace_steps, "seed": args.seed, "prefill_share": 0.3},
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
