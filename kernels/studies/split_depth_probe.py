"""How far a K split can take the first GEMM at one token, beyond what the series' rule allows.

Issue 18 asks for >= 1.5x at M = 1 on the first GEMM of every shape whose grid is smaller
than the GPU.  The series splits K at most 4 ways and keeps >= 8 K steps per slice
(``split_k_for``), which on Llama-4-Scout (K = 5120) and Mixtral-8x22B (K = 6144) stops at
1.2-1.3x.  This probe times, for one patched tree, the tree's own config for M = 1 with its
weight tile and K split overridden (the tree's split rule bypassed, so every named split
launches), beside the release's own dispatch, all on one routing, interleaved, and checked
against the float64 reference like every bench row.

A one-off study, not part of the installed package; on a GPU, from the repository root:

    PYTHONPATH=kernels python -m studies.split_depth_probe --base 0.33.0=PATH \\
        --tree 0.33.0+moe=PATH --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

from moe_kernels.loader import load_fused_moe_kernel
from moe_kernels.measure import (
    SHAPES,
    Variant,
    case_generator,
    checked_variant,
    command_line,
    dispatch_config,
    environment,
    floor_bytes,
    make_case,
    make_weights,
    measure_bandwidth,
    time_variants,
)

PROBE_SHAPES = (
    ("llama-4-scout-tp2", "tensor"),
    ("llama-4-scout-tp2", "block"),
    ("mixtral-8x22b-tp4", "block"),
    ("deepseek-v3-tp8", "block"),  # where the series' split already gives > 1.5x
)
SPLITS = (1, 2, 4, 8)
TILES_N = (64, 128)


def named_split_rule(use_fp8_w8a8, split_k, num_programs, k_steps, device):
    """Launch the split a config names, whatever the grid and K loop."""
    return split_k


def probe(
    base: Variant, tree: Variant, shape_name: str, quant: str, seed: int, bandwidth: dict
) -> list[dict]:
    shape = SHAPES[shape_name]
    weights = make_weights(shape, "up", quant, case_generator(seed, shape_name, "up", quant))
    case = make_case(shape, "up", quant, 1, case_generator(seed, shape_name, "up", quant, 1, 0))
    floor_us = (
        floor_bytes(shape, "up", quant, case["ids"], *weights[0], case["a_q"], case["a_scale"],
                    shape.topk) / bandwidth["read_gbps"] / 1e3
    )  # fmt: skip
    refs: dict = {}
    own, _ = dispatch_config(tree, case)
    checked = [checked_variant(base, case, weights, refs)]
    for tile_n, split in itertools.product(TILES_N, SPLITS):
        config = {**own, "BLOCK_SIZE_N": tile_n, "SPLIT_K": split}
        config.pop("NARROW_TILE_STAGES", None)
        checked.append(checked_variant(tree, case, weights, refs, config))
    rows = time_variants(checked)
    for row in rows:
        row.update(floor_us=floor_us, fraction_of_floor=floor_us / row["us"])
        row["speedup_over_base"] = rows[0]["us"] / row["us"]
    return rows


def probe_case(text: str) -> tuple[str, str]:
    """``SHAPE:QUANT`` of ``--case``, checked."""
    shape, _, quant = text.partition(":")
    if shape not in SHAPES or quant not in ("tensor", "block"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give SHAPE:QUANT, SHAPE one of {', '.join(SHAPES)}, QUANT tensor or block"
        )
    return shape, quant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, metavar="LABEL=PATH")
    parser.add_argument("--tree", required=True, metavar="LABEL=PATH")
    parser.add_argument(
        "--case",
        action="append",
        type=probe_case,
        metavar="SHAPE:QUANT",
        help="default: " + ", ".join(f"{shape}:{quant}" for shape, quant in PROBE_SHAPES),
    )
    parser.add_argument("--seed", type=int, default=1818)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    variants = []
    for spec in (args.base, args.tree):
        label, _, path = spec.partition("=")
        variants.append(Variant(label, Path(path), load_fused_moe_kernel(Path(path))))
    base, tree = variants
    # The loader shares one LoadedKernel per tree: override the rule on a copy of it only.
    probed = dataclasses.replace(tree.kernel)
    probed.__dict__["split_k_rule"] = named_split_rule  # a cached property: preset
    tree = Variant(tree.label, tree.tree, probed)
    bandwidth = measure_bandwidth()
    rows = []
    for shape_name, quant in args.case or PROBE_SHAPES:
        for row in probe(base, tree, shape_name, quant, args.seed, bandwidth):
            rows.append(row)
            print(
                f"{shape_name:18s} {quant:6s} {row['variant']:12s} N{row['launched']['BLOCK_SIZE_N']}"
                f" split{row['split_k']} stages{row['launched']['num_stages']}"
                f" {row['us']:7.2f} us  x{row['speedup_over_base']:.2f}"
                f"  floor {row['floor_us']:.2f}{'' if row['correct'] else '  WRONG'}",
                flush=True,
            )
    record = {
        "command": command_line("studies.split_depth_probe", argv),
        "environment": environment(),
        "bandwidth": bandwidth,
        "rows": rows,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
