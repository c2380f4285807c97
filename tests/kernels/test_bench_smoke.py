"""The GPU benchmark's code paths, run end to end on a tiny shape.

On a CPU machine this goes through Triton's interpreter: the times are
meaningless, but dispatch, routing, the floor, the poisoned-output check
against the float64 reference and the JSON report are all exercised.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from moe_kernels import bench, measure, spread
from moe_kernels.dispatch import config_for
from moe_kernels.report import bench_markdown, combine_routings, fixed_cost_section
from moe_kernels.report import main as render_report
from moe_kernels.resultfile import markdown_path, read_report


@pytest.mark.network
@pytest.mark.release
def test_bench_runs_and_checks_every_variant(tmp_path):
    from moe_patch import __version__
    from moe_patch.harness_trees import harness_trees

    out = tmp_path / "bench.json"
    labels = ("0.21.0", "0.21.0+moe")
    harness_trees(list(labels), tmp_path / "trees")  # as for a GPU run, with trees.json
    args = [f"--tree={label}={tmp_path / 'trees' / label}" for label in labels]
    code = bench.main(
        [*args, "--shape", "tiny-smoke-test", "--gemm", "down", "--quant", "block",
         "--M", "3", "--out", str(out)]
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert code == 0
    # The series the numbers belong to: what moe-patch wrote into trees.json for the trees
    assert report["series_version"] == __version__
    assert " -m moe_kernels.bench --tree=" in report["command"]
    rows = report["rows"]
    assert [r["variant"] for r in rows] == ["0.21.0", "0.21.0+moe"]
    for row in rows:
        assert row["correct"] and max(row["rel_error"]) < measure.FP8_ERROR_BOUND
        assert row["floor_us"] > 0 and row["experts_hit"] >= 1
        assert 0 < row["first_launch_s"] <= row["wall_s"]  # where the run's time went
    assert rows[0]["swap_ab"] is None  # 0.21.0 has no SWAP_AB parameter


def test_variants_of_a_case_take_turns_so_a_slower_gpu_state_reaches_them_alike(monkeypatch):
    """Two graphs of equal cost on a GPU that turns slower halfway through the timing: taken
    in turn they measure alike; one after the other (as bench did before) the second would
    have looked twice as slow.  CUDA events are stood in for by a clock the replays move."""
    clock = [0.0]
    replays_made = []

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self):
            self.at = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):  # ms, as torch's
            return end.at - self.at

    total = 2 * (measure.WARMUP_REPLAYS + measure.REPLAYS)
    slower_after = 2 * (measure.WARMUP_REPLAYS + measure.REPLAYS // 2)  # mid-timing

    def replay(name):
        def run():
            replays_made.append(name)
            clock[0] += 1.0 if len(replays_made) <= slower_after else 2.0

        return run

    monkeypatch.setattr(measure, "DEVICE", "cuda")
    monkeypatch.setattr(measure.torch.cuda, "Event", Event)
    first, second = measure.interleaved_times_us([replay("a"), replay("b")])
    assert replays_made[:4] == ["a", "b", "a", "b"] and len(replays_made) == total
    assert len(first) == len(second) == measure.REPLAYS
    assert sorted(first) == sorted(second)  # the same mix of fast and slow replays
    assert min(first) == 1000.0 and max(first) == 2000.0


def test_graph_length_sets_whole_rotations_of_launches():
    """--graph-us: at large M a few rotations over the weight copies make a long enough
    graph; small calls keep the full 64 launches, and every copy is read equally often."""
    assert measure.launches_for(10.0, None) == measure.LAUNCHES
    assert measure.launches_for(10.0, 2000.0) == measure.LAUNCHES  # 25 rotations, capped at 8
    assert measure.launches_for(100.0, 2000.0) == 24  # 2000 / (100 x 8) -> 3 rotations
    assert measure.launches_for(1500.0, 2000.0) == measure.COPIES  # never below one rotation
    for call_us in (3.0, 40.0, 333.0, 5000.0):
        assert measure.launches_for(call_us, 2000.0) % measure.COPIES == 0
    # Layers: at most bench.LAYER_CALLS (two rotations) per graph, one rotation past 2000 µs
    assert measure.launches_for(50.0, 2000.0, bench.LAYER_CALLS) == bench.LAYER_CALLS
    assert measure.launches_for(400.0, 2000.0, bench.LAYER_CALLS) == measure.COPIES
    assert measure.launches_for(400.0, None, bench.LAYER_CALLS) == bench.LAYER_CALLS


def test_layer_graphs_follow_graph_us_too(release_trees, tmp_path):
    out = tmp_path / "layer.json"
    args = [f"--tree=0.21.0+moe={release_trees('0.21.0+moe')}", "--shape", "tiny-smoke-test"]
    args += ["--gemm", "layer", "--quant", "tensor", "--M", "2", "--graph-us", "2000"]
    # A fixed draw: through the interpreter this tiny layer's error against the float64
    # reference is 0.009-0.032 by the draw (seeds 1-6), about the 0.03 bound (the H200 runs'
    # real shapes: at most 0.004); this test is about the graph's size, not that.
    assert bench.main([*args, "--seed", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["launches"] for row in report["rows"]] == [1]  # the interpreter: one layer
    assert "as many layers per graph as last about 2000 µs" in bench_markdown(report)


def test_bench_records_the_graph_length_and_refuses_to_resume_with_another(release_trees, tmp_path):
    out = tmp_path / "bench.json"
    args = [f"--tree=0.21.0+moe={release_trees('0.21.0+moe')}", "--shape", "tiny-smoke-test"]
    args += ["--gemm", "up", "--quant", "tensor", "--M", "2", "--out", str(out)]
    assert bench.main([*args, "--graph-us", "2000"]) == 0
    report = json.loads(out.read_text())
    assert report["method"]["graph_us"] == 2000.0
    assert "about 2000 µs" in bench_markdown(report)
    with pytest.raises(SystemExit):
        bench.main([*args, "--resume"])  # measured with another graph length


def test_dispatch_reads_the_trees_own_configs(release_trees):
    tree = release_trees("0.21.0")
    # vLLM 0.21.0 ships an H200 FP8 table for Mixtral's shape, none for Qwen3-30B per-tensor.
    config, source = config_for(tree, 1, 8, 14336, 4096, 2, gpu_name="NVIDIA H200")
    assert source.startswith("tuned:E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json")
    config, source = config_for(tree, 300, 128, 768, 2048, 8, gpu_name="NVIDIA H200")
    assert source == "default"
    assert config["BLOCK_SIZE_M"] == 64 and config["num_warps"] == 8


RESULTS = Path(__file__).resolve().parents[2] / "kernels" / "results"
# What moe_kernels.report and the claims (tests/evidence.py) read of a row.
BENCH_ROW = {"shape", "gemm", "quant", "M", "variant", "us", "floor_us", "correct"}


def _bench_reports() -> list[str]:
    """Every committed moe_kernels.bench result (JSON, or gzip-compressed JSON)."""
    found = []
    for path in sorted([*RESULTS.rglob("*.json"), *RESULTS.rglob("*.json.gz")]):
        if "-m moe_kernels.bench " in str(read_report(path).get("command", "")):
            found.append(path.relative_to(RESULTS).as_posix())
    return found


@pytest.mark.parametrize("name", _bench_reports())
def test_a_committed_bench_result_is_one_the_report_reads(name):
    """The schema, not the numbers: the measurements are what the GPU gave, and each one's
    Markdown stays as it was made (a later report may render the same file otherwise)."""
    report = read_report(RESULTS / name)
    assert report["command"] and report["environment"]["gpu"].startswith("NVIDIA H")
    assert report["method"]["replays"] > 0 and report["bandwidth"]["read_gbps"] > 0
    assert report["rows"] and all(BENCH_ROW <= set(row) for row in report["rows"])
    assert all(row["correct"] for row in report["rows"])  # every timing checked first
    assert markdown_path(RESULTS / name).exists()
    assert bench_markdown(report).startswith("# fused_moe_kernel on ")


def test_every_bench_result_is_checked():
    indexed = json.loads((RESULTS / "index.json").read_text())
    reports = {name for name in indexed if name.endswith(("-bench.json", "-bench.json.gz"))}
    assert set(_bench_reports()) == reports and reports


def test_fixed_cost_section_bounds_the_fraction():
    def row(variant, us, floor):
        return {"variant": variant, "us": us, "floor_us": floor}

    cases = {
        ("s", "up", "tensor", 1): {"a": row("a", 6.0, 2.0), "b": row("b", 5.0, 2.0)},
        ("s", "down", "tensor", 2): {"a": row("a", 20.0, 12.0), "b": row("b", 22.0, 12.0)},
        ("s", "up", "tensor", 8): {"a": row("a", 90.0, 10.0), "b": row("b", 95.0, 10.0)},
    }
    text = "\n".join(fixed_cost_section(cases))
    assert "Over 2 cases" in text and "3.0–8.0 µs" in text  # M = 8 is left out
    assert "F / (F + 3.0)" in text and "0.80 needs F ≥ 12 µs" in text
    assert "| s | up | tensor | 1 | 2.0 | 5.0 | 3.0 | 0.40 |" in text


def test_tune_scores_both_gemms_against_the_trees_own_dispatch(
    release_trees, tmp_path, monkeypatch
):
    from moe_kernels import tune

    # One tile shape per token tile, no split: the interpreter has no bf16 atomics.
    for name, values in {"TILE_N": (64,), "TILE_K": (128,), "STAGES": (3,), "SPLITS": (1,)}.items():
        monkeypatch.setattr(tune, name, values)
    out = tmp_path / "tune.json"
    tree = release_trees("0.21.0+moe")
    args = [f"--tree=x={tree}", "--shape", "tiny-smoke-test", "--quant", "tensor", "--M", "1"]
    assert tune.main([*args, "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["tried"] == 1 + len(tune.token_tiles(1)) and result["incorrect"] == 0
    for timed in result["all"]:
        assert timed["correct"] and timed["us"] == timed["up_us"] + timed["down_us"]
    assert result["best"]["us"] == min(t["us"] for t in result["all"])
    assert result["dispatch"]["config_source"] == "default"


def test_seeded_tune_retimes_an_earlier_searchs_best_on_another_tree(
    release_trees, tmp_path, monkeypatch
):
    from moe_kernels import tune

    for name, values in {
        "TILE_N": (64, 128),
        "TILE_K": (128,),
        "STAGES": (3,),
        "SPLITS": (1,),
    }.items():
        monkeypatch.setattr(tune, name, values)
    monkeypatch.setattr(tune, "token_tiles", lambda M: (16,))  # the twin must be new
    args = ["--shape", "tiny-smoke-test", "--quant", "tensor", "--M", "1"]
    earlier = tmp_path / "earlier.json"
    assert tune.main([f"--tree=a={release_trees('0.21.0+moe')}", *args, "--out", str(earlier)]) == 0
    (first,) = json.loads(earlier.read_text())["results"]
    ranked = sorted(
        (t for t in first["all"] if t["config"]["BLOCK_SIZE_M"] < 64), key=lambda t: t["us"]
    )
    best = {k: v for k, v in ranked[0]["config"].items() if k != "SWAP_AB"}

    out = tmp_path / "seeded.json"
    seeded = [f"--tree=b={release_trees('0.33.0+moe')}", *args, "--seeded-by", str(earlier)]
    assert tune.main([*seeded, "--top", "1", "--routings", "2", "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert len(result["experts_hit"]) == 2  # two routings, each config timed on both
    # the tree's own dispatch, the earlier best, and at M <= 8 its 8-token twin
    configs = [t["config"] for t in result["all"][1:]]
    assert configs == [best, {**best, "BLOCK_SIZE_M": 8}]
    assert result["incorrect"] == 0 and result["tried"] == 3


def test_tune_times_peers_on_the_same_routings(release_trees, tmp_path, monkeypatch):
    from moe_kernels import tune

    for name, values in {"TILE_N": (64,), "TILE_K": (128,), "STAGES": (3,), "SPLITS": (1,)}.items():
        monkeypatch.setattr(tune, name, values)
    monkeypatch.setattr(tune, "token_tiles", lambda M: (16,))
    out = tmp_path / "tune.json"
    args = [
        f"--tree=x={release_trees('0.21.0+moe')}",
        f"--peer=released={release_trees('0.21.0')}",
        f"--peer=upstream={release_trees('0.33.0')}",
        *("--shape", "tiny-smoke-test", "--quant", "tensor", "--M", "1", "--routings", "2"),
    ]
    assert tune.main([*args, "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert set(result["peers"]) == {"released", "upstream"}
    for peer in result["peers"].values():
        assert peer["correct"] and peer["us"] == peer["up_us"] + peer["down_us"]
        assert peer["config_source"] == "default"
    for timed in [*result["peers"].values(), *result["all"]]:  # each routing's times, kept
        assert len(timed["per_routing"]) == 2
        for gemm in ("up", "down"):
            each = [r[f"{gemm}_us"] for r in timed["per_routing"]]
            assert all(t > 0 for t in each) and sum(each) == pytest.approx(timed[f"{gemm}_us"])
    # tried: this tree's default (which offers split-K), the one candidate, and the peers'
    # default, which both releases share (no split): each config once
    assert result["tried"] == 3 and result["incorrect"] == 0
    splits = sorted(t["config"].get("SPLIT_K", 1) for t in result["all"])
    assert splits[-1] == 4 and splits[0] == 1


def test_peer_configs_join_the_candidates_once():
    from moe_kernels import tune

    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3}  # fmt: skip
    own = {"config": {**tile, "BLOCK_SIZE_M": 64, "SPLIT_K": 1}}
    pool = [{**tile, "SPLIT_K": 1}]
    peers = [
        {"config": {**tile, "num_stages": 5}},  # new: joins, with SPLIT_K
        {"config": dict(tile)},  # the pool's, written without SPLIT_K: not again
        {"config": {**tile, "BLOCK_SIZE_M": 64}},  # the tree's own: not again
        None,  # a peer that did not compile
    ]
    assert tune.with_peer_configs(pool, peers, own) == [
        {**tile, "SPLIT_K": 1},
        {"SPLIT_K": 1, **tile, "num_stages": 5},
    ]


def _cell(shape, quant, M, *timed):
    return {"shape": shape, "quant": quant, "M": M,
            "all": [{"config": c, "us": us, "correct": True} for c, us in timed]}  # fmt: skip


def test_widened_seeds_keep_the_token_tile_and_vary_the_rest(tmp_path):
    from moe_kernels import configs, tune

    seed = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}  # fmt: skip
    slower = {**seed, "BLOCK_SIZE_N": 128}
    first, later = tmp_path / "first.json", tmp_path / "later.json"
    first.write_text(json.dumps({"results": [_cell("deepseek-v3-tp8", "block", 32, (seed, 9.0))]}))
    # The later search of the same cell replaces the first one's: its best is `slower`.
    later.write_text(json.dumps({"results": [
        _cell("deepseek-v3-tp8", "block", 32, (slower, 5.0), (seed, 6.0))]}))  # fmt: skip
    earlier = list(configs.load_results([first, later]).values())
    pool = tune.seeded_candidates(earlier, "deepseek-v3-tp8", "block", 32, top=1, widen=True)
    assert pool[0] == slower
    # block scales fix K; every stage depth for every (tile, warps) pair, no duplicates
    assert len(pool) == len(tune.WIDE_TILES_N) * len(tune.WIDE_STAGES)
    assert {(c["BLOCK_SIZE_N"], c["num_warps"]) for c in pool} == set(tune.WIDE_TILES_N)
    assert {c["num_stages"] for c in pool} == set(tune.WIDE_STAGES)
    assert all(c["BLOCK_SIZE_M"] == 16 and c["BLOCK_SIZE_K"] == 128 for c in pool)
    tensor = tune.widened(seed, "tensor")
    assert {c["BLOCK_SIZE_K"] for c in tensor} == set(tune.TILE_K)
    assert tune.seeded_candidates(earlier, "deepseek-v3-tp8", "block", 32, top=1) == [slower]


def test_widen_without_seeds_is_refused(tmp_path, capsys):
    from moe_kernels import tune

    with pytest.raises(SystemExit) as exit_info:
        tune.main(["--tree=x=/nowhere", "--widen", "--out", str(tmp_path / "t.json")])
    assert exit_info.value.code == 2
    assert "--widen widens the seeds of --seeded-by" in capsys.readouterr().err


def test_recorded_commands_name_no_machine_path(monkeypatch, tmp_path):
    from moe_kernels.measure import command_line

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    argv = ["--tree", f"0.21.0={tmp_path}/trees/a", "--out", f"{tmp_path}/out/r.json", "--M", "1"]
    assert command_line("moe_kernels.bench", argv).endswith(
        "-m moe_kernels.bench --tree 0.21.0=trees/a --out $OUT/r.json --M 1"
    )


def test_routings_and_resume_measure_each_case_once_from_its_own_seed(release_trees, tmp_path):
    out = tmp_path / "bench.json"
    args = [f"--tree=0.21.0+moe={release_trees('0.21.0+moe')}", "--shape", "tiny-smoke-test"]
    args += ["--gemm", "down", "--quant", "tensor", "--M", "1,3", "--routings", "2"]
    assert bench.main([*args, "--seed", "7", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["method"]["routings"] == 2
    keys = [(r["M"], r["routing"]) for r in report["rows"]]
    assert keys == [(1, 0), (1, 1), (3, 0), (3, 1)]
    # A run cut short after two cases: --resume measures the other two, with the same draws.
    full = {(r["M"], r["routing"]): r for r in report["rows"]}
    report["rows"] = report["rows"][:2]
    out.write_text(json.dumps(report))
    assert bench.main([*args, "--resume", "--out", str(out)]) == 0
    resumed = json.loads(out.read_text())
    assert [(r["M"], r["routing"]) for r in resumed["rows"]] == keys
    for row in resumed["rows"][2:]:
        earlier = full[(row["M"], row["routing"])]
        same_draws = ("bytes", "experts_hit", "config")  # the floor's bytes: its routing
        assert {k: row[k] for k in same_draws} == {k: earlier[k] for k in same_draws}
    with pytest.raises(SystemExit):  # another seed is another measurement
        bench.main([*args, "--resume", "--seed", "8", "--out", str(out)])
    # The report: one row per case, the routings' geometric mean.
    text = bench_markdown(resumed)
    assert "measured on 2 routings" in text
    assert text.count("| tiny-smoke-test | down | tensor |") == 0  # the smoke shape is skipped
    combined = combine_routings(resumed["rows"])
    assert len(combined) == 2 and all(r["routings"] == 2 for r in combined)
    m1 = [r["us"] for r in resumed["rows"] if r["M"] == 1]
    assert combined[0]["us"] == pytest.approx((m1[0] * m1[1]) ** 0.5)


def test_shape_groups_and_the_vllm_grid():
    assert bench.shape_names(None) == measure.SHAPE_GROUPS["tuned"]
    assert bench.shape_names(["untuned", "glm-4.5-air"]) == measure.SHAPE_GROUPS["untuned"]
    assert len(bench.shape_names(["all"])) == len(measure.SHAPES) - 1  # not the smoke shape
    grid = bench.token_counts("vllm-grid")
    assert grid[:16] == list(range(1, 17)) and {24, 40, 48, 56, 256, 272, 512} <= set(grid)
    assert max(grid) == 512 and len(grid) == len(set(grid))
    assert bench.token_counts("1,3") == [1, 3]


def test_an_m_the_earlier_search_skipped_is_seeded_from_its_nearest_neighbours():
    """vLLM's CUDA-graph sizes (24, 40, ...) fall between the searched powers of two: such
    an M takes the best configs of the nearest searched M on each side, once each."""
    from moe_kernels import tune

    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}  # fmt: skip
    wide, deep, far = (
        {**tile, "BLOCK_SIZE_N": 128},
        {**tile, "num_stages": 4},
        {**tile, "num_warps": 8},
    )
    earlier = [
        _cell("deepseek-v3-tp8", "tensor", 8, (far, 1.0)),  # not the nearest below
        _cell("deepseek-v3-tp8", "tensor", 16, (tile, 2.0), (wide, 3.0)),
        _cell("deepseek-v3-tp8", "tensor", 32, (tile, 4.0), (deep, 5.0)),
        _cell("deepseek-v3-tp8", "block", 24, (far, 1.0)),  # another quantisation
    ]
    assert tune.seeded_candidates(earlier, "deepseek-v3-tp8", "tensor", 24, top=2) == [
        tile,
        wide,
        deep,
    ]
    # an M that was searched keeps its own cell; past the last one, the nearest below
    assert tune.seeded_candidates(earlier, "deepseek-v3-tp8", "tensor", 16, top=1) == [tile]
    assert tune.seeded_candidates(earlier, "deepseek-v3-tp8", "tensor", 64, top=2) == [tile, deep]
    assert tune.seeded_candidates(earlier, "qwen3-30b-a3b", "tensor", 24, top=2) == []


def test_bench_spreads_weight_sets_over_gpus_and_merges_them(release_trees, tmp_path):
    """``--gpus``: one process per weight set on the next free GPU, the parts merged into
    ``--out``; each row says which GPU timed it, and the cases are those one process measures."""
    out = tmp_path / "spread.json"
    trees = {label: release_trees(label) for label in ("0.21.0", "0.21.0+moe")}
    args = [f"--tree={label}={path}" for label, path in trees.items()]
    args += ["--shape", "tiny-smoke-test", "--gemm", "down", "--quant", "block"]
    args += ["--quant", "tensor", "--M", "3", "--seed", "5", "--out", str(out)]
    assert bench.main([*args, "--gpus", "0,1"]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert sorted((r["quant"], r["variant"]) for r in rows) == [
        ("block", "0.21.0"), ("block", "0.21.0+moe"), ("tensor", "0.21.0"), ("tensor", "0.21.0+moe"),
    ]  # fmt: skip
    assert all(r["correct"] for r in rows)
    # The two weight sets started together, one on each GPU.
    assert {r["quant"]: r["gpu"] for r in rows} in ({"block": "0", "tensor": "1"},
                                                   {"block": "1", "tensor": "0"})  # fmt: skip
    assert report["method"]["seed"] == 5 and report["method"]["gpus"] == ["0", "1"]
    assert set(report["bandwidth"]["per_gpu"]) == {"0", "1"}
    assert "--gpus" in report["command"]
    # Resumed with everything measured: nothing runs again, the same rows stay.
    assert bench.main([*args, "--gpus", "0,1", "--resume"]) == 0
    assert json.loads(out.read_text())["rows"] == rows
    # Parts lost (or a file written without --gpus): the parts start from --out's rows.
    shutil.rmtree(spread.parts_dir(out))
    assert bench.main([*args, "--gpus", "0,1", "--resume"]) == 0
    assert json.loads(out.read_text())["rows"] == rows


def test_stop_after_leaves_cases_for_resume(release_trees, tmp_path):
    out = tmp_path / "results" / "evidence" / "cut.json"  # a folder the run makes itself
    tree = release_trees("0.21.0")
    args = [f"--tree=0.21.0={tree}", "--shape", "tiny-smoke-test", "--gemm", "down"]
    args += ["--quant", "tensor", "--M", "3,5", "--out", str(out)]
    assert bench.main([*args, "--stop-after", "0"]) == 3  # no case starts
    assert json.loads(out.read_text())["rows"] == []
    assert bench.main([*args, "--resume"]) == 0
    assert sorted(r["M"] for r in json.loads(out.read_text())["rows"]) == [3, 5]


def test_a_gz_out_is_compressed_resumed_and_rendered(release_trees, tmp_path):
    """A run filled over several device sessions is kept compressed: --out X.json.gz is gzip
    (the same bytes for the same report), --resume continues it, and its Markdown goes beside
    it as X.md (the committed evidence file's is checked with the other reports)."""
    out = tmp_path / "evidence-bench.json.gz"
    tree = release_trees("0.21.0")
    args = [f"--tree=0.21.0={tree}", "--shape", "tiny-smoke-test", "--gemm", "down"]
    args += ["--quant", "tensor", "--M", "3,5", "--seed", "4", "--out", str(out)]
    assert bench.main([*args, "--M", "3"]) == 0
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic number
    assert bench.main([*args, "--resume"]) == 0
    rows = read_report(out)["rows"]
    assert sorted(r["M"] for r in rows) == [3, 5] and all(r["correct"] for r in rows)
    assert gzip.decompress(out.read_bytes()) == json.dumps(read_report(out), indent=1).encode()
    assert markdown_path(out) == tmp_path / "evidence-bench.md"
    assert render_report([str(out)]) == 0  # the smoke shape alone: Markdown, and no plot
    assert "| tiny-smoke-test |" not in markdown_path(out).read_text()
    assert markdown_path(out).exists() and not (tmp_path / "evidence-bench.png").exists()

    out.write_bytes(out.read_bytes()[:100])  # cut short in transfer
    with pytest.raises(SystemExit):
        bench.main([*args, "--resume"])


def _small_search(monkeypatch):
    from moe_kernels import tune

    for name, values in {"TILE_N": (64,), "TILE_K": (128,), "STAGES": (3,), "SPLITS": (1,)}.items():
        monkeypatch.setattr(tune, name, values)
    monkeypatch.setattr(tune, "token_tiles", lambda M: (16,))
    return tune


def test_tune_resumes_a_cut_short_search_on_the_routings_it_would_have_drawn(
    release_trees, tmp_path, monkeypatch
):
    tune = _small_search(monkeypatch)
    tree = release_trees("0.21.0+moe")
    args = [f"--tree=x={tree}", "--shape", "tiny-smoke-test", "--quant", "tensor", "--seed", "7"]
    whole, cut = tmp_path / "whole.json", tmp_path / "cut.json"
    assert tune.main([*args, "--M", "1,2", "--out", str(whole)]) == 0
    assert tune.main([*args, "--M", "1,2", "--stop-after", "0", "--out", str(cut)]) == 3
    assert json.loads(cut.read_text())["results"] == []
    assert tune.main([*args, "--M", "1", "--out", str(cut)]) == 0
    assert tune.main([*args, "--M", "1,2", "--resume", "--out", str(cut)]) == 0
    resumed = json.loads(cut.read_text())["results"]
    uninterrupted = json.loads(whole.read_text())["results"]
    assert [r["M"] for r in resumed] == [1, 2]
    # Each cell draws from its own seed: the routing and what was tried match the whole run.
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert a["experts_hit"] == b["experts_hit"]
        assert [t["config"] for t in a["all"]] == [t["config"] for t in b["all"]]
    # Another seed (or tree, peers, routings) does not continue the file.
    with pytest.raises(SystemExit):
        tune.main([*args[:-1], "8", "--M", "1,2", "--resume", "--out", str(cut)])


def test_tune_draws_auto_routings_per_m_and_refuses_other_words(
    release_trees, tmp_path, monkeypatch
):
    tune = _small_search(monkeypatch)
    monkeypatch.setattr(tune, "routings_for", lambda shape, M: 3 if M == 2 else 1)
    out = tmp_path / "auto.json"
    args = [f"--tree=x={release_trees('0.21.0+moe')}", "--shape", "tiny-smoke-test"]
    args += ["--quant", "tensor", "--M", "1,2", "--routings", "auto", "--out", str(out)]
    assert tune.main(args) == 0
    report = json.loads(out.read_text())
    one, two = report["results"]
    assert isinstance(one["experts_hit"], int) and len(two["experts_hit"]) == 3
    assert all(len(t["per_routing"]) == 3 for t in two["all"])
    for word in ("some", "0"):
        with pytest.raises(SystemExit):
            tune.main([*args[:-4], "--routings", word, "--out", str(out)])


def test_tune_spreads_shapes_and_quantisations_over_gpus(release_trees, tmp_path, monkeypatch):
    """``tune --gpus``: a process per shape and quantisation (here re-timing an earlier
    search's best, as a seeded search on a GPU does), merged into ``--out``."""
    tune = _small_search(monkeypatch)
    tree = release_trees("0.21.0+moe")
    args = [f"--tree=x={tree}", "--shape", "tiny-smoke-test", "--quant", "tensor"]
    args += ["--quant", "block", "--M", "1", "--seed", "3"]
    earlier = tmp_path / "earlier.json"
    assert tune.main([*args, "--out", str(earlier)]) == 0
    out = tmp_path / "spread.json"
    seeded = [*args, "--seeded-by", str(earlier), "--top", "1", "--out", str(out)]
    assert tune.main([*seeded, "--gpus", "0,1"]) == 0
    report = json.loads(out.read_text())
    results = report["results"]
    assert sorted((r["quant"], r["M"]) for r in results) == [("block", 1), ("tensor", 1)]
    assert sorted(r["gpu"] for r in results) == ["0", "1"]
    assert all(r["incorrect"] == 0 for r in results)
    assert report["method"]["seed"] == 3 and report["method"]["tree"] == f"x={tree}"
