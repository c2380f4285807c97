"""Turn :mod:`moe_kernels.tune` results into vLLM's tuned-config JSON files.

For each model shape and quantisation the file is the one vLLM looks up on an
H200 (``E=..,N=..,device_name=NVIDIA_H200,dtype=fp8_w8a8[,block_shape=[128,128]].json``,
named by the tree's own ``get_config_file_name``):

* a file the tree already ships keeps every entry, except the token counts
  where the search found a config faster than the shipped one by more than
  ``MIN_GAIN`` (the noise of the search, measured in the same run);
* where the search also timed peers (``tune --peer``: the release as shipped,
  another release's own kernel and dispatch), only configs that *keep pace* are
  chosen, i.e. neither GEMM slower than ``PEER_FLOOR`` times the same GEMM of
  any peer, on every routing the search drew (on their sum for searches that kept
  no per-routing times); the fastest of those replaces the tree's entry when that entry does
  not keep pace itself or is slower by more than ``MIN_GAIN``.  vLLM launches
  both GEMMs with one config, so the fastest pair of GEMMs can hide one GEMM
  that lost to a peer; this trades a little of the pair for neither losing.
  Where nothing keeps pace, the fastest pair is chosen as before.  A search
  with peers given after another one for the same M only vetoes: the earlier
  choice stays unless it falls behind a peer and something searched does not;
* a shipped file without an entry at a searched M (vLLM's CUDA-graph sizes 40 or
  56, say) gets one where the search kept the tree's own: the shipped entry the
  tree launched there (the nearest), so a neighbour the series replaced does not
  take that M over;
* a new file holds the searched token counts (the winner, or the tree's
  default as the search timed it, with the split it offers, when nothing beat
  it by ``MIN_GAIN``);
* above the largest searched token count, every file gets the entries that make
  vLLM's nearest-entry lookup launch what the tree launches without the file (its
  default, or its shipped file's nearest entry) at every M
  (:func:`moe_kernels.lookup.own_beyond_the_search`), so the file changes nothing
  where nothing was measured; between searched token counts the nearest searched
  entry serves (eager-mode sizes: CUDA graphs pad to searched ones).  In the H200 run
  of the launch rules (docs/studies.md; M = 3, 5, 7, 10, 14, two routings), such neighbours
  gave the tuned shapes 1.093x over 0.21.0 and 1.031x over 0.33.0 per GEMM, where
  the rule without a table gave the untuned shapes 1.056x and 1.003x.

Entries are in vLLM's format.  Every entry at a searched M names ``SPLIT_K``, even 1:
the patched launcher splits an entry that does not where its Swap-AB grid leaves SMs
idle (``split_k_to_fill``: tables tuned before the kernel could split), and a search
has decided.  ``SWAP_AB`` appears only when it
differs from the launcher's rule.

    python -m moe_kernels.configs --tree /path/to/vllm tune.json [...] --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from .dispatch import tree_selection
from .loader import FUSED_MOE_REL
from .lookup import own_beyond_the_search
from .measure import SHAPES
from .resultfile import read_report

MIN_GAIN = 0.03
PEER_FLOOR = 0.98
GPU_NAME = "NVIDIA H200"
ENTRY_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)
BLOCK_SHAPE = [128, 128]


def swap_rule(entry: dict) -> bool:
    """The patched launcher's Swap-AB rule for FP8 on SM90."""
    return entry["BLOCK_SIZE_M"] < 64 <= entry["BLOCK_SIZE_N"]


def vllm_entry(config: dict) -> dict:
    """A launch config as a table entry: vLLM's keys, SPLIT_K wherever the config names
    it (even 1: the launcher may split an entry without it), SWAP_AB only where
    it overrides the launcher's rule, and the narrow tile a series default offers its
    launches (NARROW_TILE_STAGES), so an entry that keeps the dispatch's config launches
    as the dispatch did."""
    entry = {key: config[key] for key in ENTRY_KEYS if key in config}
    if "SPLIT_K" in config:
        entry["SPLIT_K"] = config["SPLIT_K"]
    if "NARROW_TILE_STAGES" in config:
        entry["NARROW_TILE_STAGES"] = config["NARROW_TILE_STAGES"]
    swap = config.get("SWAP_AB")
    if swap is not None and bool(swap) != swap_rule(entry):
        entry["SWAP_AB"] = bool(swap)
    return entry


def load_results(paths: list[Path]) -> dict[tuple[str, str, int], dict]:
    """(shape, quant, M) -> result row; a later file wins over an earlier one, except
    that a row timed with peers keeps the row it replaced as ``earlier``: its peers
    then only veto the earlier choice (:func:`chosen`)."""
    rows = {}
    for path in paths:
        for row in read_report(path)["results"]:
            key = (row["shape"], row["quant"], row["M"])
            if row.get("peers") and key in rows:
                row = {**row, "earlier": rows[key]}
            rows[key] = row
    return rows


def as_launch(config: dict) -> dict:
    """``config`` as the patched launcher runs it: SPLIT_K 1 when absent, and no
    SWAP_AB (the launcher's rule decides)."""
    return {"SPLIT_K": 1, **{k: v for k, v in config.items() if k != "SWAP_AB"}}


def _routings(timed: dict) -> list[dict]:
    """A timing's GEMM times per routing (searches since per-routing records), else its
    sums over the routings as one."""
    return timed.get("per_routing") or [timed]


def keeps_pace(timed: dict, peers: list[dict]) -> bool:
    """Neither GEMM of ``timed`` is slower than ``PEER_FLOOR`` x that GEMM of a peer, on
    any routing the search timed both on.  Summed, a config can keep pace with a handful of
    experts hit and lose with fewer (Mixtral-8x7B's second GEMM at 2 tokens: 0.995x of
    0.33.0 over two routings in the search, 0.965x on new ones)."""
    for peer in peers:
        mine, theirs = _routings(timed), _routings(peer)
        if len(mine) != len(theirs):
            mine, theirs = [timed], [peer]
        if any(
            PEER_FLOOR * m[f"{gemm}_us"] > t[f"{gemm}_us"]
            for m, t in zip(mine, theirs, strict=True)
            for gemm in ("up", "down")
        ):
            return False
    return True


def chosen(row: dict) -> tuple[dict | None, str]:
    """The config to ship for one searched M (None: keep the tree's own), and why."""
    own, best = row["dispatch"], row["best"]
    peers = {label: p for label, p in row.get("peers", {}).items() if p and p["correct"]}
    if peers and "earlier" in row:
        entry, why = chosen(row["earlier"])
        config = own["config"] if entry is None else entry
        timed = next((t for t in row["all"] if as_launch(t["config"]) == as_launch(config)), None)
        if timed is None:
            raise ValueError(
                f"{row['shape']} {row['quant']} M={row['M']}: the search with peers did not "
                f"time the earlier choice {config}; seed it with the earlier search"
            )
        refs = list(peers.values())
        if timed["correct"] and keeps_pace(timed, refs):
            return entry, why
        if not any(t["correct"] and keeps_pace(t, refs) for t in row["all"]):
            return entry, f"{why}; nothing searched keeps pace with {', '.join(peers)}"
        row = {k: v for k, v in row.items() if k != "earlier"}
        entry, why = chosen(row)
        return entry, f"{why}; the earlier choice, {timed['us']:.1f} us, did not"
    if peers:
        refs = list(peers.values())
        pace = [t for t in row["all"] if t["correct"] and keeps_pace(t, refs)]
        if pace:
            fastest = min(pace, key=lambda t: t["us"])
            names = ", ".join(peers)
            if keeps_pace(own, refs) and fastest["us"] > (1 - MIN_GAIN) * own["us"]:
                return None, (
                    f"own {own['us']:.1f} us keeps pace with {names}; the fastest that does, "
                    f"{fastest['us']:.1f} us, is within {MIN_GAIN:.0%}"
                )
            return vllm_entry(fastest["config"]), (
                f"{fastest['us']:.1f} us vs own {own['us']:.1f} us, keeps pace with {names}"
                + ("" if fastest == best else f" (fastest pair {best['us']:.1f} us does not)")
            )
    unmatched = "; nothing keeps pace with the peers" if peers else ""
    if best["us"] > (1 - MIN_GAIN) * own["us"]:
        why = f"own {own['us']:.1f} us; best {best['us']:.1f} us is within {MIN_GAIN:.0%}"
        return None, why + unmatched
    return vllm_entry(best["config"]), f"{best['us']:.1f} us vs own {own['us']:.1f} us{unmatched}"


def nearest_entry(table: dict, M: int) -> str:
    """The key of the entry vLLM's lookup takes for M: the nearest token count, the
    smaller one of two as near (``min`` over the keys in the file's order)."""
    keys = [k for k in table if k.isdigit()]
    return min(keys, key=lambda k: abs(int(k) - M))


def _default(ns: dict, shape, block: list[int] | None, M: int) -> dict:
    """The tree's own default config for M, as a table entry."""
    config = ns["get_default_config"](
        M, shape.experts, shape.intermediate, shape.hidden, shape.topk, "fp8_w8a8", block
    )
    return vllm_entry(config)


def _own_choice(ns: dict, shape, block: list[int] | None, released: dict):
    """M -> the entry the tree launches without this file: the entry nearest to M in the
    file it ships, else its default (cached: the lookup fill asks for every M)."""
    if any(k.isdigit() for k in released):
        return functools.cache(lambda M: released[nearest_entry(released, M)])
    return functools.cache(lambda M: _default(ns, shape, block, M))


def decides_swap_itself(tree: Path) -> bool:
    """Whether the tree's launcher is upstream's Swap-AB one (0.25+): it decides with
    ``enable_swap_ab`` alone and passes ``SWAP_AB=`` beside ``**config``, so a table
    entry carrying the key would make every launch fail with a duplicate keyword.
    (The swap-ab patch's launcher reads the key; releases before 0.25 are tuned for
    that patched launcher.)"""
    source = (tree / FUSED_MOE_REL).read_text()
    return "enable_swap_ab(" in source and "def use_swap_ab(" not in source


def build_files(tree: Path, rows: dict) -> dict[str, tuple[dict, bool, list[str]]]:
    """File name -> (table, ends with newline, log lines)."""
    ns = tree_selection(str(tree), GPU_NAME, None)
    swap_fixed = decides_swap_itself(tree)
    configs_dir = tree / FUSED_MOE_REL.parent / "configs"
    files = {}
    for shape_name, quant in sorted({(s, q) for s, q, _ in rows}):
        shape = SHAPES[shape_name]
        block = BLOCK_SHAPE if quant == "block" else None
        name = ns["get_config_file_name"](shape.experts, shape.intermediate, "fp8_w8a8", block)
        shipped = configs_dir / name
        log = []
        if shipped.exists():
            text = shipped.read_text()
            table, newline = json.loads(text), text.endswith("\n")
        else:
            table, newline = {}, True
        released = dict(table)

        searched = sorted(M for s, q, M in rows if (s, q) == (shape_name, quant))
        for M in searched:
            entry, why = chosen(rows[(shape_name, quant, M)])
            if entry is not None and "SWAP_AB" in entry and swap_fixed:
                raise ValueError(
                    f"{shape_name} {quant} M={M}: the winner needs SWAP_AB={entry['SWAP_AB']}, "
                    f"which the launcher in {tree} cannot take from a config; search again "
                    "without candidates that override the swap rule"
                )
            own = rows[(shape_name, quant, M)]["dispatch"]["config"]
            if entry is not None:
                table[str(M)] = entry
            elif not shipped.exists():
                # The tree's default, as the search timed it (with the split it offers).
                table[str(M)] = vllm_entry(own)
            else:
                # The tree launched its nearest shipped entry here: kept with the split
                # it was timed with (SPLIT_K 1 where the search's launcher offered splits
                # to defaults only), and pinned where the file had no entry, so the
                # entries tuned at the neighbouring token counts do not take over this M.
                nearest = nearest_entry(released, M)
                table[str(M)] = {**released[nearest], "SPLIT_K": own.get("SPLIT_K", 1)}
                if nearest != str(M):
                    why += f"; the shipped M={nearest} entry pinned at M={M}"
            log.append(f"M={M}: {'tuned' if entry else 'kept'} ({why})")
        table = own_beyond_the_search(table, searched, _own_choice(ns, shape, block, released))
        table = dict(
            sorted(
                table.items(),
                key=lambda kv: (kv[0] != "triton_version", int(kv[0]) if kv[0].isdigit() else 0),
            )
        )
        files[name] = (table, newline, log)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="the vLLM tree the files are for")
    parser.add_argument("results", type=Path, nargs="+", help="moe_kernels.tune JSON files")
    parser.add_argument("--out", type=Path, required=True, help="the tree's configs folder, say")
    args = parser.parse_args(argv)
    files = build_files(args.tree, load_results(args.results))
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (table, newline, log) in files.items():
        (args.out / name).write_text(json.dumps(table, indent=4) + ("\n" if newline else ""))
        print(name)
        for line in log:
            print("   ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
