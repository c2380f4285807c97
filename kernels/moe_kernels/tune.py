"""Search launch configs for one tree's fused_moe_kernel on the GPU at decode sizes.

vLLM launches both GEMMs of a MoE layer with the one config its tuned file (or
default) gives for M, so a config is scored by the sum of its first-GEMM and
second-GEMM times on the same routing, as vLLM's own ``benchmark_moe`` scores
the whole ``fused_experts``.  Every candidate is checked against the float64
reference and timed as in :mod:`moe_kernels.bench` (fewer replays); the tree's
own dispatch is timed in the same run, and the fastest correct config per M is
kept.  :mod:`moe_kernels.configs` turns the result into vLLM's JSON files.

    python -m moe_kernels.tune --tree 0.21.0+moe=/path --out tune.json

``--routings R`` scores each config by its time summed over R routings drawn per
M: where few experts are hit, which and how many vary from batch to batch, and a
config that wins on one draw can lose on the next (``auto``: :func:`routings_for`).

``--seeded-by EARLIER.json`` re-times, instead of the whole grid, the ``--top``
fastest correct configs each cell had in an earlier search (another tree's
kernel, say), with their 8-token twins at M <= 8: a few minutes instead of an
hour, for a kernel that computes the same tiles the same way.  An M the earlier
search did not cover is seeded from its nearest searched M on either side.

    python -m moe_kernels.tune --tree 0.33.0+moe=/path --seeded-by tune-0.21.json --out t.json

``--seeded-by`` may be given more than once; for a cell, a later file's search
replaces an earlier one's (as :mod:`moe_kernels.configs` reads them).  With
``--widen`` every seed is also re-timed with its neighbours outside the grid:
each pipeline depth in ``WIDE_STAGES`` and weight tiles of up to 256 rows with
a second warp group (``WIDE_TILES_N``), same token tile and split.

``--peer LABEL=PATH`` (repeatable) also times another tree's own dispatch, its
kernel with its config, on the same routings (``peers`` in each row), and adds that
config to the candidates: :mod:`moe_kernels.configs` then prefers configs whose
every GEMM keeps pace with every peer.

    python -m moe_kernels.tune --tree 0.21.0+moe=/path --peer 0.21.0=/a --peer 0.33.0=/b ...

Each cell (shape, quantisation, M) draws its weights and routings from its own seed (``--seed``
and the cell), so ``--resume`` continues a cut-short ``--out`` as an uninterrupted search would
have gone on; ``--stop-after SECONDS`` starts no cell after SECONDS; ``--gpus 0,1,2,3`` runs each
shape and quantisation in a process of its own on the next free GPU (:mod:`moe_kernels.spread`).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from . import spread
from .align import max_num_tokens_padded, use_naive_block_assignment
from .configs import as_launch, load_results
from .launch import patched_split_k, token_rows_launched
from .loader import CPU_SM_COUNT, load_fused_moe_kernel
from .measure import (
    DEVICE,
    SHAPE_GROUPS,
    SHAPES,
    WARMUP_REPLAYS,
    Variant,
    case_generator,
    checked_variant,
    dispatch_config,
    gemm_dims,
    make_case,
    make_weights,
    measure_bandwidth,
    record_header,
    routing,
    sm_count,
    time_variants,
    write_report,
)
from .resultfile import read_report
from .trees import fingerprint_changes, fingerprints_of

DECODE_M = (1, 2, 4, 8, 16, 32, 64)
GEMMS = ("up", "down")
TUNE_REPLAYS = 6

# The search space: weight tiles of 64 or 128 rows on the MMA's M side, 8 to 32
# tokens on its N side (token_tiles), K tiles deep enough to keep HBM busy,
# 3-4 stage pipelines, and split-K when the grid alone cannot fill the GPU.
TILE_N = (64, 128)
TILE_K = (128, 256)
STAGES = (3, 4)
SPLITS = (1, 2, 4)
# --widen: a seed's neighbours.  Where K is short (DeepSeek-V3's second GEMM runs
# two 128-deep K steps) a deep pipeline only adds prologue; wide weight tiles
# amortise each program's fixed cost over more bytes; a 128- or 256-row tile
# can give each of two warp groups its own 64 or 128 rows.
WIDE_STAGES = (2, 3, 4)
WIDE_TILES_N = ((64, 4), (128, 4), (128, 8), (256, 8))


def launched_rows(shape, gemm: str, M: int, block_m: int) -> int:
    """The token rows vLLM's launcher sizes one GEMM's grid for at M tokens (``EM``)."""
    rows = M if gemm == "up" else M * shape.topk
    top_k = shape.topk if gemm == "up" else 1
    naive = use_naive_block_assignment(M, shape.topk, shape.experts)
    sorted_len = None if naive else max_num_tokens_padded(M * shape.topk, block_m, shape.experts)
    return token_rows_launched(rows, top_k, block_m, sorted_len)


def launch_programs(shape, gemm: str, M: int, block_m: int, block_n: int) -> int:
    """Programs vLLM's launcher starts for one GEMM of the layer at M tokens."""
    em = launched_rows(shape, gemm, M, block_m)
    return -(-em // block_m) * -(-gemm_dims(shape, gemm)[0] // block_n)


def splits_anywhere(shape, M: int, config: dict) -> bool:
    """Whether the launcher splits K for either GEMM of the layer with this config (the
    swap-ab patch's rule: a small or unevenly loaded grid, the latter only with a long K
    loop).  Elsewhere a SPLIT_K candidate would time the same launches as its unsplit
    twin."""
    sms = sm_count(CPU_SM_COUNT)  # an H200's without a GPU: split where it would
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    block_k = config["BLOCK_SIZE_K"]  # block scales clamp it to 128: candidates use 128
    return any(
        patched_split_k(
            True,
            config.get("SPLIT_K", 1),
            launch_programs(shape, g, M, block_m, block_n),
            -(-gemm_dims(shape, g)[1] // block_k),
            sms,
        )
        > 1
        for g in GEMMS
    )


def token_tiles(M: int) -> tuple[int, ...]:
    """BLOCK_SIZE_M values worth trying: the tokens sit on the MMA's N side, which
    wgmma allows down to 8, so at M <= 8 an 8-token tile wastes less than 16."""
    if M <= 8:
        return (8, 16)
    return (16,) if M <= 16 else (32,)


def candidates(quant: str, M: int, shape) -> list[dict]:
    """Swap-AB tiles for decode: 8 to 32 tokens on the MMA's N side.

    Split-K is tried only where the patched launcher honours it
    (:func:`splits_anywhere`)."""
    block_ks = (128,) if quant == "block" else TILE_K  # one K tile per 128x128 scale block
    out = []
    for block_m, block_n, block_k, stages, split_k in itertools.product(
        token_tiles(M), TILE_N, block_ks, STAGES, SPLITS
    ):
        config = {
            "BLOCK_SIZE_M": block_m,
            "BLOCK_SIZE_N": block_n,
            "BLOCK_SIZE_K": block_k,
            "GROUP_SIZE_M": 1,
            "SPLIT_K": split_k,
            "num_warps": 4,
            "num_stages": stages,
            "SWAP_AB": True,
        }
        if split_k == 1 or splits_anywhere(shape, M, config):
            out.append(config)
    return out


def _config_key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def widened(config: dict, quant: str) -> list[dict]:
    """``config`` and its neighbours: every WIDE_STAGES depth, every WIDE_TILES_N
    tile, and for per-tensor scales every TILE_K depth (block scales fix K at 128)."""
    block_ks = (config["BLOCK_SIZE_K"],) if quant == "block" else TILE_K
    return [
        {**config, "BLOCK_SIZE_N": block_n, "num_warps": warps, "BLOCK_SIZE_K": block_k,
         "num_stages": stages}
        for (block_n, warps), block_k, stages in itertools.product(
            WIDE_TILES_N, block_ks, WIDE_STAGES
        )
    ]  # fmt: skip


def seeded_candidates(
    earlier: list[dict], shape_name: str, quant: str, M: int, top: int, widen: bool = False
):
    """The ``top`` fastest correct configs of cell (shape, quant, M) in an earlier
    search, and at M <= 8 the same configs with 8-token tiles.  Where the earlier
    search has no cell at M, the ``top`` of each of its nearest cells below and
    above M: a table without an entry at M launches one of theirs (vLLM takes the
    nearest entry), and vLLM's CUDA-graph sizes (24, 40, 48, 56, ...) fall between
    the searched powers of two.  ``SWAP_AB`` keys are dropped: every seed is a
    Swap-AB tile, which the launcher's rule swaps anyway, and upstream's launcher
    (0.25+) takes no such key from a config."""
    shape = SHAPES[shape_name]
    searched = {
        cell["M"] for cell in earlier if (cell["shape"], cell["quant"]) == (shape_name, quant)
    }
    if M in searched:
        seed_ms = [M]
    else:
        below, above = [m for m in searched if m < M], [m for m in searched if m > M]
        seed_ms = ([max(below)] if below else []) + ([min(above)] if above else [])
    seeds: dict[tuple, dict] = {}
    for seed_m in seed_ms:
        timed = [
            t
            for cell in earlier
            if (cell["shape"], cell["quant"], cell["M"]) == (shape_name, quant, seed_m)
            for t in cell["all"]
            if t["correct"]
        ]
        taken = 0
        for t in sorted(timed, key=lambda t: t["us"]):
            config = {k: v for k, v in t["config"].items() if k != "SWAP_AB"}
            if not config["BLOCK_SIZE_M"] < 64 <= config["BLOCK_SIZE_N"]:
                continue
            if _config_key(config) not in seeds:
                seeds[_config_key(config)] = config
                taken += 1
            if taken == top:
                break
    out = dict(seeds)
    if M <= 8:
        for config in seeds.values():
            twin = {**config, "BLOCK_SIZE_M": 8}
            out.setdefault(_config_key(twin), twin)
    if widen:
        for config in list(out.values()):
            for neighbour in widened(config, quant):
                out.setdefault(_config_key(neighbour), neighbour)
    return [c for c in out.values() if c.get("SPLIT_K", 1) == 1 or splits_anywhere(shape, M, c)]


def with_peer_configs(pool: list[dict], peer_timings, own: dict) -> list[dict]:
    """``pool`` plus each peer's own config (as this tree's launcher runs it), each
    config once and none that is this tree's own."""
    seen = {_config_key(as_launch(own["config"]))} if own is not None else set()
    out = {}
    for config in pool:
        out.setdefault(_config_key(as_launch(config)), config)
    for timed in peer_timings:
        if timed is not None:
            config = as_launch(timed["config"])
            if _config_key(config) not in seen:
                out.setdefault(_config_key(config), config)
    return list(out.values())


def joint_times(entries: list[tuple], draws, weights) -> list[dict | None]:
    """Time each ``(variant, config)`` of a cell (config None: the variant's own dispatch)
    on both GEMMs, summed over the routings in ``draws`` (pairs of cases and reference
    caches) and kept per routing too (``per_routing``: a config can keep pace on the sum and
    lose on the routing that hits fewer experts), all of them taking turns replay by replay
    (:func:`time_variants`), so a change of the GPU's state during the cell reaches every
    one alike; None for one that does not fit the SM or does not compile."""
    sums: list[dict | None] = [
        {"up_us": 0.0, "down_us": 0.0, "correct": True, "per_routing": []} for _ in entries
    ]
    up_rows: list[dict | None] = [None] * len(entries)
    for cases, refs in draws:
        for total in sums:
            if total is not None:
                total["per_routing"].append({})
        for gemm in GEMMS:
            checked = []
            for i, (variant, config) in enumerate(entries):
                if sums[i] is None:
                    continue
                try:
                    row = checked_variant(variant, cases[gemm], weights[gemm], refs[gemm], config)
                except (OutOfResources, CompilationError):  # too big for the SM, or rejected
                    sums[i] = None
                    continue
                checked.append((i, row))
            if not checked:
                continue
            for (i, _), row in zip(
                checked, time_variants([c for _, c in checked], TUNE_REPLAYS), strict=True
            ):
                sums[i][f"{gemm}_us"] += row["us"]
                sums[i]["per_routing"][-1][f"{gemm}_us"] = row["us"]
                sums[i]["correct"] = sums[i]["correct"] and row["correct"]
                if gemm == "up":
                    up_rows[i] = row
    timed = []
    for (_, config), total, up in zip(entries, sums, up_rows, strict=True):
        if total is None:
            timed.append(None)
            continue
        timed.append(
            {
                "config": config if config is not None else up["config"],
                "config_source": up["config_source"],
                "swap_ab": up["swap_ab"],
                **total,
                "us": total["up_us"] + total["down_us"],
            }
        )
    return timed


# Routings per M where ``routings`` is "auto": more where the number of experts a batch hits
# varies much from batch to batch (few experts, small top-k, a handful of tokens), since a
# config scored on a few such draws can lose on the next (the evidence run: Mixtral-8x7B at
# 2 and 3 tokens, where that number varies by 16-17%; 4-5% for 128 experts of top-8).
ROUTINGS = 2
ROUTINGS_VARIED = 6
ROUTING_SPREAD = 0.08


def experts_hit_spread(shape, M: int) -> float:
    """Coefficient of variation of the number of distinct experts M tokens hit, each token
    choosing ``topk`` distinct experts of ``experts`` uniformly (the harness's routing)."""
    E, k = shape.experts, shape.topk
    missed = (1 - k / E) ** M  # one given expert, by every token
    both_missed = ((E - k) * (E - k - 1) / (E * (E - 1))) ** M if E > 1 else 0.0
    mean = E * (1 - missed)
    variance = E * missed * (1 - missed) + E * (E - 1) * (both_missed - missed**2)
    return max(variance, 0.0) ** 0.5 / mean


def routings_for(shape, M: int) -> int:
    """How many routings "auto" draws at M: ``ROUTINGS_VARIED`` where the experts hit vary by
    more than ``ROUTING_SPREAD``, else ``ROUTINGS``."""
    return ROUTINGS_VARIED if experts_hit_spread(shape, M) > ROUTING_SPREAD else ROUTINGS


def _routings_arg(value: str) -> int | str:
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is neither auto nor a number of routings")
    return int(value)


def draw_routings(shape, quant: str, M: int, routings: int, gen) -> tuple[list, list[int]]:
    """``routings`` routings of M tokens, each with both GEMMs' cases and an empty reference
    cache (the ``draws`` :func:`joint_times` scores configs over), and the experts each hits."""
    draws, hit = [], []
    for _ in range(routings):
        route = routing(M, shape, gen)
        cases = {g: make_case(shape, g, quant, M, gen, route) for g in GEMMS}
        draws.append((cases, {g: {} for g in GEMMS}))
        hit.append(int(torch.unique(route[0]).numel()))
    return draws, hit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, metavar="LABEL=PATH")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES))
    parser.add_argument("--quant", action="append", choices=["tensor", "block"])
    parser.add_argument("--M", default=",".join(map(str, DECODE_M)))
    parser.add_argument("--seed", type=int, default=None, help="default: the time, or --resume's")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--seeded-by",
        type=Path,
        action="append",
        metavar="EARLIER.json",
        help="re-time an earlier search's best (repeatable: a later file's cell wins)",
    )
    parser.add_argument("--top", type=int, default=6, help="configs per cell with --seeded-by")
    parser.add_argument(
        "--widen", action="store_true", help="with --seeded-by: also time each seed's neighbours"
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="also time this tree's own dispatch per cell, and try its config (repeatable)",
    )
    parser.add_argument(
        "--routings",
        type=_routings_arg,
        default=1,
        help="routings drawn per M, or auto (routings_for); a config's time is the sum over them",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the cells --out already holds (same tree, peers, seed and routings) and "
        "search the rest",
    )
    spread.add_arguments(parser, unit="shape and quantisation", what="cell")
    args = parser.parse_args(argv)
    began = time.monotonic()
    if args.widen and not args.seeded_by:
        parser.error("--widen widens the seeds of --seeded-by: name an earlier search")
    gpus = spread.gpu_ids(parser, args)
    # What a resumed file must share with this run for its cells to count.
    same = {"tree": args.tree, "peers": args.peer, "routings": args.routings}
    try:
        args.fingerprints = fingerprints_of([args.tree, *args.peer])
    except FileNotFoundError as error:
        parser.error(f"--tree/--peer: {error}")
    results = []
    if args.resume and args.out.exists():
        try:
            earlier_run = read_report(args.out)
        except ValueError as error:
            parser.error(f"cannot resume from {args.out}: {error}")
        method = earlier_run.get("method", {})
        if any(method.get(k) != v for k, v in same.items()) or args.seed not in (
            None,
            method.get("seed"),
        ):
            parser.error(f"cannot resume {args.out}: another tree, peers, seed or routings")
        changed = fingerprint_changes(method.get("fingerprints"), args.fingerprints)
        if changed:
            parser.error(f"cannot resume {args.out}: {changed}; give another --out")
        args.seed, results = method["seed"], earlier_run.get("results", [])
    args.seed = spread.run_seed(args, gpus)
    if gpus:
        return spread.run(spread_job(args), gpus, args.resume, args.stop_after, argv)
    # configs.load_results merges searches as the tables are built: a later file's cell wins.
    earlier = list(load_results(args.seeded_by).values()) if args.seeded_by else None

    label, _, path = args.tree.partition("=")
    variant = Variant(label, Path(path), load_fused_moe_kernel(Path(path)))
    peer_variants = []
    for spec in args.peer:
        peer_label, _, peer_path = spec.partition("=")
        peer_variants.append(
            Variant(peer_label, Path(peer_path), load_fused_moe_kernel(Path(peer_path)))
        )
    bandwidth = measure_bandwidth()
    done = {(r["shape"], r["quant"], r["M"]) for r in results}
    gpu_id = os.environ.get("CUDA_VISIBLE_DEVICES")
    for shape_name in args.shape or SHAPE_GROUPS["tuned"]:
        shape = SHAPES[shape_name]
        for quant in args.quant or ["tensor", "block"]:
            todo = [M for M in map(int, args.M.split(",")) if (shape_name, quant, M) not in done]
            if not todo:
                continue
            gen = case_generator(args.seed, shape_name, quant)
            weights = {g: make_weights(shape, g, quant, gen) for g in ("up", "down")}
            for M in todo:
                if args.stop_after is not None and time.monotonic() - began > args.stop_after:
                    _write(args, argv, bandwidth, results)
                    print(f"stopped after {args.stop_after:.0f} s; the rest runs with --resume")
                    return 3
                gen = case_generator(args.seed, shape_name, quant, M)
                count = routings_for(shape, M) if args.routings == "auto" else args.routings
                draws, hit = draw_routings(shape, quant, M, count, gen)
                if earlier is None:
                    pool = candidates(quant, M, shape)
                else:
                    pool = seeded_candidates(earlier, shape_name, quant, M, args.top, args.widen)
                case = draws[0][0]["up"]
                pool = with_peer_configs(
                    pool,
                    [{"config": dispatch_config(p, case)[0]} for p in peer_variants],
                    {"config": dispatch_config(variant, case)[0]},
                )
                # The tree's dispatch, the peers' and every candidate, timed together.
                own, *rest = joint_times(
                    [(variant, None)]
                    + [(p, None) for p in peer_variants]
                    + [(variant, c) for c in pool],
                    draws,
                    weights,
                )
                peers = dict(zip((p.label for p in peer_variants), rest, strict=False))
                tried = [own, *(t for t in rest[len(peer_variants) :] if t is not None)]
                good = [t for t in tried if t["correct"]]
                winner = min(good, key=lambda t: t["us"])
                results.append(
                    {
                        "shape": shape_name,
                        "quant": quant,
                        "M": M,
                        "experts_hit": hit[0] if count == 1 else hit,
                        "dispatch": own,
                        **({"peers": peers} if peer_variants else {}),
                        "best": winner,
                        "tried": len(tried),
                        "incorrect": len(tried) - len(good),
                        "all": tried,
                        **({"gpu": gpu_id} if gpu_id is not None else {}),
                    }
                )
                c = winner["config"]
                print(
                    f"{shape_name:16s} {quant:6s} M={M:<3d} dispatch={own['us']:.1f}us "
                    f"({own['up_us']:.1f}+{own['down_us']:.1f}) best={winner['us']:.1f}us "
                    f"({winner['up_us']:.1f}+{winner['down_us']:.1f}) "
                    f"{c['BLOCK_SIZE_M']}x{c['BLOCK_SIZE_N']}x{c['BLOCK_SIZE_K']} "
                    f"w{c.get('num_warps')} s{c.get('num_stages')} split{c.get('SPLIT_K', 1)}",
                    flush=True,
                )
                _write(args, argv, bandwidth, results)
            del weights
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    _write(args, argv, bandwidth, results)
    return 0


def spread_job(args) -> spread.Job:
    """``--gpus``: one process per shape and quantisation (its cells share weights)."""
    units = [
        (shape, quant)
        for shape in args.shape or SHAPE_GROUPS["tuned"]
        for quant in args.quant or ["tensor", "block"]
    ]

    def arguments(unit: tuple) -> list[str]:
        shape, quant = unit
        own = [f"--tree={args.tree}", *(f"--peer={peer}" for peer in args.peer)]
        own += ["--shape", shape, "--quant", quant, "--M", args.M, "--seed", str(args.seed)]
        own += ["--routings", str(args.routings), "--top", str(args.top)]
        own += [f"--seeded-by={path}" for path in args.seeded_by or []]
        return own + (["--widen"] if args.widen else [])

    return spread.Job(
        module="moe_kernels.tune",
        out=args.out,
        units=units,
        rows_key="results",
        fields=("shape", "quant"),
        arguments=arguments,
    )


def _write(args, argv, bandwidth, results) -> None:
    write_report(
        args.out,
        {
            **record_header("moe_kernels.tune", argv, [args.tree, *args.peer]),
            "method": {
                "replays": TUNE_REPLAYS,
                "warmup_replays": WARMUP_REPLAYS,
                "seed": args.seed,
                "tree": args.tree,
                "peers": args.peer,
                "fingerprints": args.fingerprints,
                "routings": args.routings,
            },
            "bandwidth": bandwidth,
            "results": results,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
