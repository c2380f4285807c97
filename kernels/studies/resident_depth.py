"""How many Swap-AB programs an SM holds, and what that did to three- against four-stage launches.

Two parts, both without a GPU:

* ``--occupancy TREE``: compiles the tree's ``fused_moe_kernel`` for SM90 with Triton's own
  ``ptxas`` (as a launch would, pointers and strides 16-divisible, unit strides
  specialised), swapped and unswapped, at decode tiles and pipeline depths, and reads
  registers and shared memory back from the cubin: the programs one H200 SM holds at once
  follow (shared memory is the limit for every swapped tile).
* the config searches (``--search FILE``, default the committed H200 searches behind the
  shipped tables, which timed several pipeline depths of the same tile on the same routing):
  every pair of three- and four-stage launches of one tile, grouped by whether three
  stages make the grid resident where four do not (what the series' ``resident_depth_for``
  changes), both need several rounds, or four already fit.  Launches whose K loop the
  pipeline cap shortens are left out (the depth is not the config's there).

A one-off study, not part of the installed package; from the repository root:

    PYTHONPATH=kernels python -m studies.resident_depth --out resident-depth.md
    PYTHONPATH=kernels python -m studies.resident_depth --occupancy vllm-0.21.0 --out occupancy.md
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
from pathlib import Path

from moe_kernels import sm90
from moe_kernels.measure import SHAPES, command_line, gemm_dims
from moe_kernels.resultfile import read_report
from moe_kernels.tune import launch_programs

PROVENANCE = Path(__file__).resolve().parents[1] / "results" / "provenance"
SEARCHES = (
    PROVENANCE / "h200-tune-joint.json",
    PROVENANCE / "h200-tune-decode-0.21.json",
    PROVENANCE / "h200-tune-peers-0.21.json",
)
SM_COUNT = 132  # an H200's, the GPU the searches ran on


def resident(programs: int, stages: int, stage_bytes: int) -> bool:
    return programs <= sm90.programs_per_sm(stages * stage_bytes) * SM_COUNT


def stage_pairs(searches) -> list[dict]:
    """Three- against four-stage timings of one swapped tile, per GEMM of a search cell."""
    pairs = []
    for path in searches:
        for cell in read_report(Path(path))["results"]:
            shape, M, block = SHAPES[cell["shape"]], cell["M"], cell["quant"] == "block"
            by_tile: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
            for timed in cell["all"]:
                config = timed["config"]
                if not timed.get("swap_ab") or config.get("SPLIT_K", 1) != 1:
                    continue
                tile = tuple(config[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
                by_tile[tile + (config.get("GROUP_SIZE_M", 1), config["num_warps"])][
                    config["num_stages"]
                ] = timed
            for key, depths in by_tile.items():
                if 3 not in depths or 4 not in depths:
                    continue
                block_m, block_n, block_k = key[:3]
                if block:
                    block_k = min(block_k, 128)
                stage_bytes = (block_m + block_n) * block_k
                for gemm in ("up", "down"):
                    if -(-gemm_dims(shape, gemm)[1] // block_k) <= 4:
                        continue  # the pipeline cap, not the config, sets the depth
                    programs = launch_programs(shape, gemm, M, block_m, block_n)
                    pairs.append(
                        {
                            "cell": (cell["shape"], cell["quant"], M, gemm),
                            "tile": key[:3],
                            "programs": programs,
                            "resident_3": resident(programs, 3, stage_bytes),
                            "resident_4": resident(programs, 4, stage_bytes),
                            "ratio": depths[4][f"{gemm}_us"] / depths[3][f"{gemm}_us"],
                        }
                    )
    return pairs


def group(pair: dict) -> str:
    if pair["resident_4"]:
        return "four stages resident"
    if pair["resident_3"]:
        return "three stages resident, four not"
    return "several rounds either way"


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def pairs_markdown(pairs: list[dict], searches) -> str:
    groups = collections.defaultdict(list)
    for pair in pairs:
        groups[group(pair)].append(pair["ratio"])
    lines = [
        "# Three against four pipeline stages of one Swap-AB tile",
        "",
        "From " + ", ".join(f"`{Path(s).name}`" for s in searches) + ": time at four stages "
        "over time at three, same tile, GEMM and routing (> 1: three stages faster).",
        "",
        "| grid | launches | geomean 4 / 3 | three faster in | slowest, fastest |",
        "|---|---|---|---|---|",
    ]
    for name in (
        "three stages resident, four not",
        "several rounds either way",
        "four stages resident",
    ):
        ratios = groups.get(name, [])
        if ratios:
            lines.append(
                f"| {name} | {len(ratios)} | {_geomean(ratios):.3f} | "
                f"{sum(r > 1 for r in ratios)} | {min(ratios):.3f}, {max(ratios):.3f} |"
            )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- occupancy


def compile_for_sm90(loaded, swap: bool, block_n: int, stages: int, block: bool) -> tuple[int, int]:
    """(registers per thread, shared bytes) of the tree's kernel at a 16 x block_n x 128 tile."""
    import triton.language as tl

    pointers = {
        "a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "b_bias_ptr": "*bf16",
        "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32", "topk_weights_ptr": "*fp32",
        "sorted_token_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
        "num_tokens_post_padded_ptr": "*i32",
    }  # fmt: skip
    constants = {
        "group_n": 128 if block else 0, "group_k": 128 if block else 0,
        "naive_block_assignment": True, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": block_n,
        "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "SPLIT_K": 1, "MUL_ROUTED_WEIGHT": False,
        "top_k": 8, "compute_type": tl.bfloat16, "use_fp8_w8a8": True, "use_int8_w8a8": False,
        "use_int8_w8a16": False, "per_channel_quant": False, "HAS_BIAS": False, "SWAP_AB": swap,
        # unit strides, which a launch specialises
        "stride_ak": 1, "stride_bk": 1, "stride_cn": 1,
    }  # fmt: skip
    unspecialised = set(loaded.decorator_kwargs.get("do_not_specialize", ()))
    signature = {
        name: pointers.get(name, "i32") for name in loaded.param_names if name not in constants
    }
    built = sm90.build(
        loaded.kernel, signature, constants, set(signature) - unspecialised, 4, stages
    )
    return built.registers, built.shared


def occupancy_markdown(tree: Path, command: str) -> str:
    import triton
    from moe_kernels import load_fused_moe_kernel

    loaded = load_fused_moe_kernel(tree)
    lines = [
        f"# Programs per SM90 SM of `fused_moe_kernel` from `{tree}`",
        "",
        f"Made by `{command}` with Triton {triton.__version__}: 16-token tile, 128-deep K",
        "tile, 4 warps, FP8, compiled for sm_90a by Triton's own ptxas (no GPU needed).",
        "",
        "| scales | BLOCK_SIZE_N | stages | Swap-AB | registers | shared bytes | per SM | on 132 SMs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    swaps = (False, True) if loaded.has_swap_ab else (False,)
    for block in (False, True):
        for block_n, stages in ((64, 3), (64, 4), (128, 3), (128, 4)):
            for swap in swaps:
                registers, shared = compile_for_sm90(loaded, swap, block_n, stages, block)
                per_sm = sm90.programs_per_sm(shared, registers)
                lines.append(
                    f"| {'block' if block else 'tensor'} | {block_n} | {stages} | {swap} | "
                    f"{registers} | {shared} | {per_sm} | {per_sm * SM_COUNT} |"
                )
    return "\n".join(lines) + "\n"


def search_study_parser(description: str) -> argparse.ArgumentParser:
    """The command line of a study over the committed config searches."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--search", type=Path, action="append", help="config search JSON")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def write_report(out: Path, text: str) -> int:
    out.write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = search_study_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--occupancy", type=Path, metavar="TREE", help="compile TREE's kernel")
    args = parser.parse_args(argv)
    if args.occupancy:
        os.environ.pop("TRITON_INTERPRET", None)  # compiling needs the real compiler
        command = command_line("studies.resident_depth", argv)
        return write_report(args.out, occupancy_markdown(args.occupancy, command))
    searches = args.search or list(SEARCHES)
    return write_report(args.out, pairs_markdown(stage_pairs(searches), searches))


if __name__ == "__main__":
    sys.exit(main())
