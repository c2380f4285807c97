"""The H200 config tables and split-K rule of swap-ab (0.20-0.24) and swap-ab-split-k
(0.25+), checked against their sources.

* The JSON files each patch ships are what ``moe_kernels.configs`` makes from the
  committed searches on the unpatched release (kernels/results/provenance/h200-tune-joint.json
  with h200-tune-decode-0.21.json, its M <= 8 re-run, and h200-tune-peers-0.21.json,
  the M <= 8 search that also timed 0.21.0 and 0.33.0 as released, on 0.21.0;
  h200-tune-split-k-0.33.json on 0.33.0, and on 0.34.0 for the 0.34 series): each
  table is reproducible from the measurements, byte for byte.
* ``moe_kernels.configs`` keeps shipped entries unless a search beat them by
  more than its noise margin, and fills new files with the tree's defaults.
* The harness's split-K and pipeline-depth rules are the patches' own
  ``split_k_for`` and ``pipeline_depth_for``, run from the patched tree's source.
"""

from __future__ import annotations

import ast
import itertools
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton
from moe_kernels import configs, load_fused_moe_kernel
from moe_kernels.launch import patched_pipeline_depth, patched_resident_depth, patched_split_k
from moe_kernels.loader import FUSED_MOE_REL, tree_constants

RESULTS = Path(__file__).resolve().parents[2] / "kernels" / "results" / "provenance"
CONFIGS_REL = FUSED_MOE_REL.parent / "configs"
# vLLM's CUDA-graph sizes between the searched powers of two (24, 40, 48, 56)
CAPTURE_SEARCHES = [
    "h200-tune-capture-tensor.json",
    "h200-tune-capture-block.json",
    "h200-tune-capture-48-56.json",
]
# Later files win for the cells they searched.
SEARCHES = {
    "0.21.0": [
        "h200-tune-joint.json",
        "h200-tune-decode-0.21.json",
        "h200-tune-peers-0.21.json",
        *CAPTURE_SEARCHES,
        "h200-tune-between-0.21.json",
    ],
    "0.33.0": [
        "h200-tune-split-k-0.33.json",
        "h200-tune-capture-0.33.json",
        "h200-tune-between-0.33.json",
    ],
}
# the 0.34 series carries the same tables (0.34.0 ships the same files and defaults)
SEARCHES["0.34.0"] = SEARCHES["0.33.0"]


@pytest.mark.parametrize("release", list(SEARCHES))
def test_shipped_tables_are_the_committed_search(release_trees, release):
    base, patched = release_trees(release), release_trees(f"{release}+moe")
    files = configs.build_files(
        base, configs.load_results([RESULTS / n for n in SEARCHES[release]])
    )
    assert len(files) == 8  # four shapes, per-tensor and block
    for name, (table, newline, _log) in files.items():
        shipped = (patched / CONFIGS_REL / name).read_text()
        assert shipped == json.dumps(table, indent=4) + ("\n" if newline else ""), name


def _row(shape, quant, M, own_us, best_us, best_config):
    own = {"us": own_us, "config": {"BLOCK_SIZE_M": 64}}
    return {
        "shape": shape,
        "quant": quant,
        "M": M,
        "dispatch": own,
        "best": {"us": best_us, "config": best_config},
    }


SWAP_TILE = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
    "SWAP_AB": True,
}


def assert_lookup_as_shipped(table: dict, shipped: dict, token_counts) -> None:
    """At each M, vLLM's nearest-entry lookup gives from ``table`` what it gave from the
    file the release ships."""
    for M in token_counts:
        ours = table[configs.nearest_entry(table, M)]
        assert ours == shipped[configs.nearest_entry(shipped, M)], M


def test_tables_keep_what_the_search_did_not_beat(release_trees):
    tree = release_trees("0.21.0")
    rows = {
        # Mixtral per-tensor: 0.21.0 ships an H200 table
        ("mixtral-8x7b", "tensor", 1): _row("mixtral-8x7b", "tensor", 1, 100.0, 80.0,
                                            {**SWAP_TILE, "SPLIT_K": 4}),
        ("mixtral-8x7b", "tensor", 2): _row("mixtral-8x7b", "tensor", 2, 100.0, 98.0, SWAP_TILE),
        # Qwen3-30B per-tensor: no table in 0.21.0, so the file is new
        ("qwen3-30b-a3b", "tensor", 8): _row("qwen3-30b-a3b", "tensor", 8, 50.0, 49.5, SWAP_TILE),
    }  # fmt: skip
    rows[("qwen3-30b-a3b", "tensor", 8)]["dispatch"]["config"] = {**SWAP_TILE, "SPLIT_K": 4}
    files = configs.build_files(tree, rows)
    mixtral_name = "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    shipped = json.loads((tree / CONFIGS_REL / mixtral_name).read_text())
    table, _, log = files[mixtral_name]
    # M=1 beat the shipped entry by 20%: replaced; SWAP_AB follows the rule, so it is left out
    assert table["1"] == {k: v for k, v in SWAP_TILE.items() if k != "SWAP_AB"} | {"SPLIT_K": 4}
    # M=2 was within the noise margin: the shipped entry stays, naming the split it was
    # timed with (none), so the launcher does not offer it one; every other entry is as shipped
    assert table["2"] == {**shipped["2"], "SPLIT_K": 1}
    assert all(table[k] == v for k, v in shipped.items() if k not in ("1", "2"))
    assert log[1].startswith("M=2: kept")
    # Above the search, vLLM's lookup launches what it launched from the shipped file: at
    # M=3 the shipped M=2 entry without a SPLIT_K (the launcher may split it), which the
    # kept M=2 entry no longer is, so the file gains it at 3
    assert_lookup_as_shipped(table, shipped, range(3, 5000))
    assert table["3"] == shipped["2"]

    qwen_name = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    table, newline, _ = files[qwen_name]
    assert newline and not (tree / CONFIGS_REL / qwen_name).exists()
    ns = configs.tree_selection(str(tree), configs.GPU_NAME, None)
    # Below and above the one searched M, vLLM's nearest-entry lookup in the new file gives
    # the tree's default at every M (the limit of the check: its last change, 129 tokens
    # per expert), each naming SPLIT_K 1: the launcher offers no split there
    keys = [int(k) for k in table]
    for M in [*range(1, 8), *range(9, 16_600)]:
        default = ns["get_default_config"](M, 128, 768, 2048, 8, "fp8_w8a8", None)
        entry = table[configs.nearest_entry(table, M)]
        assert entry == configs.vllm_entry(default), M
        assert entry["SPLIT_K"] == 1
    assert keys == sorted(keys)  # in vLLM's order
    # M=8 kept the tree's default as the search timed it, with the split the tree offered
    timed_default = rows[("qwen3-30b-a3b", "tensor", 8)]["dispatch"]["config"]
    assert table["8"] == configs.vllm_entry(timed_default)
    assert table["8"]["SPLIT_K"] == 4


def test_a_kept_m_between_shipped_entries_is_pinned_to_the_entry_it_launched(release_trees):
    """vLLM takes the nearest entry (the smaller of two as near): where a search at such an
    M kept the tree's own, the file gets that shipped entry at M, so a neighbour the
    series replaces cannot take the M over; an M the file has stays as shipped."""
    tree = release_trees("0.21.0")
    name = "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    shipped = json.loads((tree / CONFIGS_REL / name).read_text())
    assert {"24", "32", "48"} <= set(shipped) and not {"40", "56"} & set(shipped)
    rows = {
        ("mixtral-8x7b", "tensor", M): _row("mixtral-8x7b", "tensor", M, 100.0, 99.0, SWAP_TILE)
        for M in (32, 40, 56)
    }  # every search within the noise: the tree's own is kept
    table, _, log = configs.build_files(tree, rows)[name]
    # 32 and 48 are as near: vLLM takes the smaller.  Each kept entry names the split it was
    # timed with (none), so the launcher does not offer one where the search decided.
    assert table["40"] == {**shipped["32"], "SPLIT_K": 1}
    assert table["56"] == {**shipped["48"], "SPLIT_K": 1}
    assert table["32"] == {**shipped["32"], "SPLIT_K": 1}
    searched = ("32", "40", "56")
    assert all(table[k] == v for k, v in shipped.items() if k not in searched)
    assert_lookup_as_shipped(table, shipped, [*range(1, 32), *range(57, 5000)])
    assert list(table) == sorted(table, key=int)  # in vLLM's order
    assert "M=40: kept" in log[1] and "shipped M=32 entry pinned" in log[1]
    assert "pinned" not in log[0]
    assert configs.nearest_entry({"1": 0, "2": 0, "4": 0}, 3) == "2"


def _timed(up: float, down: float, stages: int = 3) -> dict:
    return {
        "config": {**SWAP_TILE, "num_stages": stages},
        "up_us": up,
        "down_us": down,
        "us": up + down,
        "correct": True,
    }


def _peer_row(own, *candidates, peers):
    everything = [own, *candidates]
    return {
        "dispatch": own,
        "peers": peers,
        "best": min(everything, key=lambda t: t["us"]),
        "all": everything,
    }


def test_peers_veto_a_pair_that_hides_a_slower_gemm():
    upstream = {"upstream": _timed(50.0, 25.0)}
    own = _timed(60.0, 30.0, stages=2)
    fastest_pair = _timed(45.0, 26.5, stages=4)  # 71.5 us, but its second GEMM is 0.943x
    keeps_up = _timed(47.0, 25.0, stages=3)  # 72.0 us, neither GEMM slower
    entry, why = configs.chosen(_peer_row(own, fastest_pair, keeps_up, peers=upstream))
    assert entry["num_stages"] == 3 and "fastest pair 71.5 us does not" in why
    # exactly at the floor keeps pace; just past it does not
    floor = 25.0 / configs.PEER_FLOOR
    assert configs.keeps_pace(_timed(50.0, floor), list(upstream.values()))
    assert not configs.keeps_pace(_timed(50.0, floor * 1.001), list(upstream.values()))


def _per_routing(*pairs: tuple[float, float], stages: int = 3) -> dict:
    timed = _timed(sum(u for u, _ in pairs), sum(d for _, d in pairs), stages)
    return {**timed, "per_routing": [{"up_us": u, "down_us": d} for u, d in pairs]}


def test_a_config_must_keep_pace_on_every_routing_not_only_their_sum():
    # The second GEMM of the release's config: 45 us where the routing hits 3 experts,
    # 57 us where it hits 4; the swapped tile gains on 4 and loses on 3, about even summed.
    upstream = {"upstream": _per_routing((96.0, 45.0), (118.0, 57.0))}
    own = _per_routing((97.0, 45.2), (119.0, 57.3), stages=2)
    uneven = _per_routing((82.0, 49.0), (108.0, 53.0), stages=4)  # second GEMM 0.918x on one
    assert configs.keeps_pace(
        {k: v for k, v in uneven.items() if k != "per_routing"},
        [{k: v for k, v in upstream["upstream"].items() if k != "per_routing"}],
    )
    assert not configs.keeps_pace(uneven, list(upstream.values()))
    entry, why = configs.chosen(_peer_row(own, uneven, peers=upstream))
    assert entry is None and "keeps pace with upstream" in why
    # a search without per-routing times is judged on its sums, as before
    summed = {k: v for k, v in upstream["upstream"].items() if k != "per_routing"}
    assert configs.keeps_pace(uneven, [summed])


def test_peers_keep_an_entry_that_keeps_pace_and_replace_one_that_does_not():
    upstream = {"upstream": _timed(50.0, 25.0)}
    own = _timed(50.5, 25.2, stages=2)  # keeps pace; the candidate gains 2% < MIN_GAIN
    entry, why = configs.chosen(_peer_row(own, _timed(49.5, 24.5), peers=upstream))
    assert entry is None and "keeps pace with upstream" in why
    # the same own entry against a faster peer: replaced, even by a slower pair
    faster = {"upstream": _timed(50.0, 24.0)}
    slow_pair = _timed(51.0, 24.0)
    entry, _ = configs.chosen(_peer_row(own, slow_pair, peers=faster))
    assert entry == configs.vllm_entry(slow_pair["config"])


def test_without_a_candidate_that_keeps_pace_the_fastest_pair_wins():
    upstream = {"upstream": _timed(10.0, 10.0), "broken": None}
    own = _timed(30.0, 30.0, stages=2)
    best = _timed(12.0, 12.0, stages=4)
    entry, why = configs.chosen(_peer_row(own, best, peers=upstream))
    assert entry == configs.vllm_entry(best["config"]) and "nothing keeps pace" in why
    # an incorrect peer is no reference
    wrong = {"upstream": {**_timed(1.0, 1.0), "correct": False}}
    entry, why = configs.chosen(_peer_row(own, best, peers=wrong))
    assert entry == configs.vllm_entry(best["config"]) and "pace" not in why


def test_a_later_search_with_peers_only_vetoes_the_earlier_choice(tmp_path):
    cell = {"shape": "qwen3-30b-a3b", "quant": "block", "M": 8}
    own = _timed(60.0, 30.0, stages=2)
    earlier_pick = _timed(45.0, 26.0, stages=4)
    earlier = {**cell, **_peer_row(own, earlier_pick, peers={})}
    del earlier["peers"]

    def merged(*later_timings, peers):
        files = []
        for i, row in enumerate([earlier, {**cell, **_peer_row(*later_timings, peers=peers)}]):
            files.append(tmp_path / f"search-{i}.json")
            files[-1].write_text(json.dumps({"results": [row]}))
        return configs.load_results(files)[("qwen3-30b-a3b", "block", 8)]

    pick = configs.vllm_entry(earlier_pick["config"])
    # the earlier pick keeps pace in the later search: it stays, though a config is faster
    row = merged(own, _timed(45.5, 25.5, 4), _timed(44.0, 25.0, 3), peers={"p": _timed(45, 26)})
    assert configs.chosen(row) == configs.chosen(earlier) and configs.chosen(row)[0] == pick
    # its second GEMM falls behind a peer: the fastest config that keeps pace replaces it
    row = merged(own, _timed(44.0, 27.0, 4), _timed(46.0, 25.0, 3), peers={"p": _timed(46, 25)})
    entry, why = configs.chosen(row)
    assert entry["num_stages"] == 3 and "the earlier choice, 71.0 us, did not" in why
    # nothing keeps pace with a much faster peer: the earlier pick stays
    row = merged(own, _timed(44.0, 27.0, 4), _timed(46.0, 25.0, 3), peers={"p": _timed(10, 10)})
    entry, why = configs.chosen(row)
    assert entry == pick and "nothing searched keeps pace with p" in why
    # a later search that never timed the earlier pick cannot judge it
    row = merged(own, _timed(46.0, 25.0, 3), peers={"p": _timed(46, 25)})
    with pytest.raises(ValueError, match="did not time the earlier choice"):
        configs.chosen(row)


def _patch_function(tree: Path, name: str, namespace: dict):
    """The patched tree's own top-level function ``name``, run from its source in ``namespace``."""
    source = (tree / FUSED_MOE_REL).read_text()
    node = next(
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name
    )
    exec(
        compile(ast.get_source_segment(source, node), str(tree / FUSED_MOE_REL), "exec"), namespace
    )
    return namespace[name]


def _patch_split_k_for(tree: Path, sm_count: int):
    source = (tree / FUSED_MOE_REL).read_text()
    assert "SPLIT_K_MIN_SLICE_STEPS" in tree_constants(source), f"{tree} lacks the constant"
    return _patch_function(
        tree,
        "split_k_for",
        {
            "torch": SimpleNamespace(device=object),
            "current_platform": SimpleNamespace(num_compute_units=lambda device_id=0: sm_count),
            **tree_constants(source),
        },
    )


# Launch grids around the rule's edges (fewer programs than SMs; up to one and a half
# times as many; more) and K loops of 3 to 56 steps (MiniMax-M2's second GEMM at TP4 to
# DeepSeek-V3's first).
def _grids(sm_count: int) -> tuple[int, ...]:
    return (1, 64, sm_count - 1, sm_count, sm_count * 3 // 2 - 1, sm_count * 3 // 2, 896)


K_STEPS = (3, 8, 31, 32, 56)


@pytest.mark.parametrize("sm_count", [78, 132])
@pytest.mark.parametrize("label", ["0.21.0+moe", "0.33.0+moe"])
def test_harness_split_rule_is_the_patchs(release_trees, label, sm_count):
    split_k_for = _patch_split_k_for(release_trees(label), sm_count)
    device = SimpleNamespace(index=0)
    for fp8 in (False, True):
        for split_k in (1, 2, 4):
            for programs in _grids(sm_count):
                for k_steps in K_STEPS:
                    want = split_k_for(fp8, split_k, programs, k_steps, device)
                    assert patched_split_k(fp8, split_k, programs, k_steps, sm_count) == want
    assert split_k_for(True, 4, sm_count - 1, 3, device) == 4
    assert split_k_for(True, 4, sm_count, 56, device) == 4
    assert split_k_for(True, 4, sm_count, 3, device) == 1
    assert split_k_for(True, 4, sm_count * 3 // 2, 56, device) == 1


def _lifted_rules(release_trees, label, monkeypatch):
    """The harness's kernel of ``label`` with its lifted launcher rules seeing 132 SMs."""
    from moe_kernels import loader

    monkeypatch.setattr(
        loader._SmCountPlatform, "num_compute_units", staticmethod(lambda index=0: 132)
    )
    return loader.load_fused_moe_kernel(release_trees(label)), SimpleNamespace(index=0)


@pytest.mark.parametrize("label", ["0.21.0", "0.21.0+moe", "0.33.0", "0.33.0+moe"])
def test_launches_split_by_the_trees_own_rule(release_trees, label, monkeypatch):
    """On a GPU the harness runs the tree's own split_k_for (lifted), so a tree with
    another rule is measured with that rule; release trees have none."""
    loaded, device = _lifted_rules(release_trees, label, monkeypatch)
    if "+" not in label:
        assert loaded.split_k_rule is None
        return
    for programs in _grids(132):
        for split_k in (1, 4):
            for k_steps in K_STEPS:
                want = patched_split_k(True, split_k, programs, k_steps, 132)
                assert loaded.split_k_rule(True, split_k, programs, k_steps, device) == want
    assert loaded.split_k_rule(False, 4, 1, 56, device) == 1


# Stage bytes of 16- and 8-token tiles against 64- and 128-wide weight tiles, K tiles of
# 128 and 256 (FP8: one byte per element), and grids around what an SM holds.
STAGE_BYTES = ((16 + 64) * 128, (16 + 128) * 128, (8 + 64) * 256, (16 + 64) * 256)


@pytest.mark.parametrize("label", ["0.21.0", "0.21.0+moe", "0.33.0", "0.33.0+moe"])
def test_harness_resident_rule_is_the_patchs(release_trees, label, monkeypatch):
    loaded, device = _lifted_rules(release_trees, label, monkeypatch)
    if "+" not in label:
        assert loaded.resident_depth_rule is None
        return
    rule = loaded.resident_depth_rule
    for stages in (2, 3, 4, 5):
        for stage_bytes in STAGE_BYTES:
            for programs in (1, 132, 660, 661, 704, 924, 925, 2000, 30000):
                want = rule(stages, programs, stage_bytes, device)
                assert patched_resident_depth(stages, programs, stage_bytes, 132) == want
    # GLM-4.5-Air's first GEMM at M = 2: 704 programs, four stages of 10 KB hold 660
    assert rule(4, 704, (16 + 64) * 128, device) == 3
    assert rule(4, 660, (16 + 64) * 128, device) == 4
    assert rule(4, 30000, (16 + 64) * 128, device) == 4  # several rounds either way
    assert rule(3, 30000, (16 + 64) * 128, device) == 3


@pytest.mark.parametrize("label", ["0.21.0+moe", "0.33.0+moe"])
def test_harness_pipeline_rule_is_the_patchs(release_trees, label):
    pipeline_depth_for = _patch_function(
        release_trees(label), "pipeline_depth_for", {"triton": triton}
    )
    for stages, k, block_k, split_k in itertools.product(
        (1, 2, 3, 4, 5), (128, 256, 768, 7168, 14336), (64, 128, 256), (1, 2, 4)
    ):
        want = pipeline_depth_for(stages, k, block_k, split_k)
        assert patched_pipeline_depth(stages, k, block_k, split_k) == want
    assert pipeline_depth_for(4, 256, 128, 1) == 2  # DeepSeek-V3's second GEMM at TP8
    assert pipeline_depth_for(4, 7168, 128, 4) == 4  # its first GEMM, even split four ways
    assert pipeline_depth_for(3, 128, 128, 1) == 2  # never below two


@pytest.mark.parametrize("label", ["0.21.0", "0.21.0+moe", "0.33.0", "0.33.0+moe"])
def test_harness_knows_which_launchers_cap_the_pipeline(release_trees, label):
    loaded = load_fused_moe_kernel(release_trees(label))
    assert loaded.caps_pipeline_depth == label.endswith("+moe")


def test_no_swap_override_in_tables_for_upstreams_launcher(release_trees):
    # 0.33.0's launcher passes SWAP_AB itself: an entry carrying the key would break it.
    tree = release_trees("0.33.0")
    assert configs.decides_swap_itself(tree)
    assert not any(configs.decides_swap_itself(release_trees(t)) for t in ("0.21.0", "0.21.0+moe"))
    no_swap = {**SWAP_TILE, "SWAP_AB": False}
    rows = {("mixtral-8x7b", "tensor", 1): _row("mixtral-8x7b", "tensor", 1, 100.0, 50.0, no_swap)}
    with pytest.raises(ValueError, match="cannot take from a config"):
        configs.build_files(tree, rows)
    follows_rule = {
        ("mixtral-8x7b", "tensor", 1): _row("mixtral-8x7b", "tensor", 1, 100.0, 50.0, SWAP_TILE)
    }
    table = configs.build_files(tree, follows_rule)[
        "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    ][0]
    assert "SWAP_AB" not in table["1"]


@pytest.mark.parametrize("label", ["0.21.0", "0.33.0"])
def test_a_shape_without_a_table_is_offered_split_k(release_trees, label):
    """The series' default config offers SPLIT_K = 4 to FP8 MoE on Hopper where no table
    exists (the launcher takes it only for grids smaller than the GPU); the release's own
    default never splits, and a tuned entry keeps its own SPLIT_K."""
    from moe_kernels.dispatch import config_for
    from moe_kernels.measure import SHAPES

    coder = SHAPES["qwen3-coder-480b-a35b-tp8"]  # no table ships for it
    args = (1, coder.experts, coder.intermediate, coder.hidden, coder.topk)
    for block in (None, [128, 128]):
        config, source = config_for(release_trees(f"{label}+moe"), *args, block_shape=block)
        assert source == "default" and config["SPLIT_K"] == 4
        config, source = config_for(release_trees(label), *args, block_shape=block)
        assert source == "default" and config.get("SPLIT_K", 1) == 1
    config, _ = config_for(release_trees(f"{label}+moe"), *args, dtype=None)
    assert config.get("SPLIT_K", 1) == 1  # not FP8: never split
    qwen = SHAPES["qwen3-30b-a3b"]
    config, source = config_for(
        release_trees(f"{label}+moe"), 1, qwen.experts, qwen.intermediate, qwen.hidden, qwen.topk
    )
    assert source.startswith("tuned:") and config.get("SPLIT_K", 1) == 1


def _takes_narrow_tile(shape, gemm: str, M: int, config: dict, sm_count: int = 132) -> bool:
    """narrow_tile_pays, from the harness's own grid arithmetic: a launch keeps the
    128-wide tile where that grid is below the SM count and keeps a K split (8 steps a
    slice) the 64-wide one loses, or where, at the depth each would launch with, only the
    128-wide grid of working programs (one row block per expert hit, uniform routing)
    fits the GPU at once."""
    import math

    from moe_kernels.launch import SHARED_MEMORY_RESERVED_PER_PROGRAM, SM90_SHARED_MEMORY_PER_SM
    from moe_kernels.measure import gemm_dims
    from moe_kernels.tune import launch_programs

    n, k = gemm_dims(shape, gemm)
    block_m, k_steps = config["BLOCK_SIZE_M"], -(-k // 128)
    pairs = M * shape.topk
    hit = min(pairs, math.ceil(shape.experts * (1 - (1 - 1 / shape.experts) ** pairs)))

    def split(block_n: int) -> int:
        return patched_split_k(
            True, 4, launch_programs(shape, gemm, M, block_m, block_n), k_steps, sm_count
        )

    def fits(block_n: int, stages: int) -> bool:
        slices, stage_bytes = split(block_n), (block_m + block_n) * 128
        stages = patched_pipeline_depth(stages, k, 128, slices)
        launched = launch_programs(shape, gemm, M, block_m, block_n) * slices
        stages = patched_resident_depth(stages, launched, stage_bytes, sm_count)
        per_sm = SM90_SHARED_MEMORY_PER_SM // (
            stages * stage_bytes + SHARED_MEMORY_RESERVED_PER_PROGRAM
        )
        return hit * -(-n // block_n) * slices <= per_sm * sm_count

    wide_programs = launch_programs(shape, gemm, M, block_m, 128)
    if wide_programs < sm_count and split(128) > split(64) and k_steps >= 8 * split(128):
        return False
    return fits(64, config["NARROW_TILE_STAGES"]) or not fits(128, config["num_stages"])


def test_the_backports_default_offers_block_fp8_a_narrow_tile_at_decode(release_trees):
    """Without a table, the 0.20 series' default config for block-scaled FP8 offers its
    launches a 64-wide N tile up to eight tokens (four stages up to four), and each launch
    takes it unless its 128-wide grid keeps a paying K split or only the wide grid fits the
    GPU at once; per-tensor FP8, unswapped launches and the release keep vLLM's tile."""
    import torch
    from moe_kernels.dispatch import config_for
    from moe_kernels.measure import UNTUNED_SHAPES, gemm_dims
    from moe_kernels.tune import GEMMS, launch_programs

    tree = load_fused_moe_kernel(release_trees("0.21.0+moe"))
    assert tree.narrow_block_n == 64
    narrowed = set()
    for shape in UNTUNED_SHAPES:
        for M in (*range(1, 17), 24, 32, 48, 64, 128):
            args = (M, shape.experts, shape.intermediate, shape.hidden, shape.topk)
            patched, source = config_for(release_trees("0.21.0+moe"), *args, block_shape=[128, 128])
            if source != "default":
                continue
            released, _ = config_for(release_trees("0.21.0"), *args, block_shape=[128, 128])
            assert released["BLOCK_SIZE_N"] == 128
            wide = released | {"SPLIT_K": 4}
            if patched["BLOCK_SIZE_M"] >= 64 or M > 8:
                assert patched == wide
                continue
            assert patched == wide | {"NARROW_TILE_STAGES": 4 if M <= 4 else released["num_stages"]}
            for gemm in GEMMS:
                n, k = gemm_dims(shape, gemm)
                weights = torch.empty(
                    (shape.experts, n, k), dtype=torch.float8_e4m3fn, device="meta"
                )
                rows = launch_programs(shape, gemm, M, patched["BLOCK_SIZE_M"], 128) // -(-n // 128)
                rows *= patched["BLOCK_SIZE_M"]
                stages = patched["NARROW_TILE_STAGES"]
                takes = tree.narrow_tile_rule(
                    patched, stages, rows, M * shape.topk, weights, torch.device("cpu")
                )
                assert takes == _takes_narrow_tile(shape, gemm, M, patched), (shape.name, gemm, M)
                if takes:
                    narrowed.add((shape.name, gemm, M))
            tensor, source = config_for(release_trees("0.21.0+moe"), *args)
            if source == "default":
                assert tensor == config_for(release_trees("0.21.0"), *args)[0] | {"SPLIT_K": 4}
    # measured on an H200 (kernels/results/launch-rules/): narrowed, 64 wide was faster;
    # kept wide, 128 wide was (split at M = 3; only the wide grid fit at M = 8)
    assert {("minimax-m2-tp4", "up", 3), ("mixtral-8x22b-tp4", "up", 3)} <= narrowed
    assert ("deepseek-v2-lite", "down", 1) in narrowed
    assert not {("qwen3-coder-480b-a35b-tp8", "up", 3), ("mixtral-8x22b-tp4", "up", 8)} & narrowed


def test_a_lifted_rule_brings_the_functions_it_calls():
    """A launcher rule cut out of a tree's source comes with the module functions it
    calls, directly or through others, and nothing else."""
    from moe_kernels.loader import lifted_functions

    source = """
def helper(x):
    return inner(x) + 1


def inner(x):
    return 2 * x


def unrelated():
    return helper(0)


def rule(x):
    return helper(x) * LIMIT
"""
    lifted = lifted_functions(source, "rule")
    assert [code.split("(")[0] for code in lifted] == ["def rule", "def helper", "def inner"]
    namespace = {"LIMIT": 3}
    exec("\n\n".join(lifted), namespace)
    assert namespace["rule"](5) == 33
    assert lifted_functions(source, "missing") == []


def test_a_table_entry_keeping_the_dispatch_keeps_its_narrow_tile_offer(release_trees, tmp_path):
    """Where moe-patch tune keeps the tree's own dispatch at an M, the entry it writes
    must launch as the dispatch did: a block-FP8 decode default's narrow-tile offer is
    kept, and the tree reads it back from the table unchanged."""
    from moe_kernels.dispatch import config_for
    from moe_kernels.measure import SHAPES

    coder = SHAPES["qwen3-coder-480b-a35b-tp8"]
    args = (4, coder.experts, coder.intermediate, coder.hidden, coder.topk)
    dispatch, source = config_for(release_trees("0.21.0+moe"), *args, block_shape=[128, 128])
    assert source == "default" and dispatch["NARROW_TILE_STAGES"] == 4
    entry = configs.vllm_entry(dispatch)
    assert entry["NARROW_TILE_STAGES"] == 4 and entry["BLOCK_SIZE_N"] == 128
    name = "E=160,N=320,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    (tmp_path / name).write_text(json.dumps({"4": entry}))
    read, source = config_for(
        release_trees("0.21.0+moe"), *args, block_shape=[128, 128], config_folder=str(tmp_path)
    )
    assert source == f"tuned:{name}[4]" and read == entry


def shipped_cells(runs: list[dict], before: str, releases: tuple[str, ...]) -> list[dict]:
    """Per cell of searches with peers: the time of the entry the tables launch there (the
    search's winner, or the tree's own config: :func:`moe_kernels.configs.chosen`) and of
    each peer's own dispatch, both GEMMs summed over the routings; per peer, the entry's
    slower GEMM against that peer's same GEMM."""
    found = []
    for run in runs:
        for row in run["results"]:
            entry, _ = configs.chosen(row)
            timed = row["dispatch"]
            if entry is not None:
                launch = configs.as_launch(entry)
                timed = next(t for t in row["all"] if configs.as_launch(t["config"]) == launch)
            peers = {label: row["peers"][label] for label in (before, *releases)}
            found.append(
                {
                    "cell": (row["shape"], row["quant"], row["M"]),
                    "us": timed["us"],
                    **{label: peer["us"] for label, peer in peers.items()},
                    "gemm": {
                        label: min(peer[f"{g}_us"] / timed[f"{g}_us"] for g in ("up", "down"))
                        for label, peer in peers.items()
                    },
                }
            )
    return found


def summary_row(found: list[dict], peer: str) -> str:
    """The line of a committed search report (capture-sizes/, between-sizes/) that sums up
    the shipped entries against ``peer``: cells, geometric-mean speed-up, slowest."""
    ratios = [c[peer] / c["us"] for c in found]
    geomean = statistics.geometric_mean(ratios)
    return f"| `{peer}` | {len(ratios)} | {geomean:.3f}x | {min(ratios):.3f}x |"


@pytest.mark.parametrize(
    ("report", "searches", "before", "releases", "cells", "geomeans", "slowest_gemm"),
    [
        (  # the 0.20 series at vLLM's CUDA-graph sizes 24, 40, 48, 56 (swap-ab)
            "capture-sizes/h200-capture-sizes.md",
            CAPTURE_SEARCHES,
            "0.21.0+moe",
            ("0.21.0", "0.33.0"),
            32,
            {"0.21.0+moe": 1.016, "0.21.0": 1.101, "0.33.0": 1.029},
            0.990,
        ),
        (  # the 0.25+ series there, on 0.33.0 (swap-ab-split-k)
            "capture-sizes/h200-capture-sizes-0.33.md",
            ["h200-tune-capture-0.33.json"],
            "0.33.0+moe",
            ("0.33.0",),
            32,
            {"0.33.0+moe": 1.018, "0.33.0": 1.029},
            0.992,
        ),
        (  # both series at M = 3, 5-7, 9-15
            "between-sizes/h200-between-sizes-0.21.md",
            ["h200-tune-between-0.21.json"],
            "0.21.0+moe",
            ("0.21.0", "0.33.0"),
            88,
            {"0.21.0+moe": 1.008, "0.21.0": 1.090, "0.33.0": 1.035},
            0.974,
        ),
        (
            "between-sizes/h200-between-sizes-0.33.md",
            ["h200-tune-between-0.33.json"],
            "0.33.0+moe",
            ("0.33.0",),
            88,
            {"0.33.0+moe": 1.004, "0.33.0": 1.031},
            0.995,
        ),
    ],
)
def test_the_committed_search_reports_are_their_searches_and_back_the_patch_messages(
    report, searches, before, releases, cells, geomeans, slowest_gemm
):
    """The reports the patch pages cite (in-sample gains of the tables at the sizes between
    the first searches) sum up what the committed searches give: every timing correct, no
    cell below 0.98x of the tables before or of a release, and the slowest single GEMM
    against a release (the 0.20 series' DeepSeek-V3 block at M = 6, kept: no searched
    config kept both GEMMs within 2% of 0.33.0)."""
    runs = [json.loads((RESULTS / name).read_text()) for name in searches]
    assert all(t["correct"] for run in runs for row in run["results"] for t in row["all"])
    found = shipped_cells(runs, before, releases)
    assert len(found) == cells
    text = (RESULTS.parent / report).read_text()
    for peer, geomean in geomeans.items():
        ratios = [c[peer] / c["us"] for c in found]
        assert round(statistics.geometric_mean(ratios), 3) == geomean
        assert min(ratios) >= 0.98
        assert summary_row(found, peer) in text
    assert round(min(c["gemm"][r] for c in found for r in releases), 3) == slowest_gemm
    if report == "capture-sizes/h200-capture-sizes.md":
        best = max(found, key=lambda c: c[before] / c["us"])
        assert best["cell"] == ("deepseek-v3-tp8", "block", 40)
