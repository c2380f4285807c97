"""``moe-patch tune``'s engine on a tiny model, through Triton's interpreter on a CPU.

The times are wall-clock and meaningless here; what is checked is that the file it
writes is the one the tree's own lookup reads, that a re-run resumes, and that the
report never keeps a config slower than the tree's dispatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from moe_kernels import model_tune
from moe_kernels.configs import vllm_entry
from moe_kernels.dispatch import config_for, device_name
from moe_kernels.measure import Shape
from moe_kernels.trees import fingerprint
from moe_kernels.tune import candidates
from moe_patch.model_config import moe_shape

UNTUNED_RESULTS = Path(__file__).resolve().parents[2] / "kernels" / "results" / "untuned"
TINY_MODEL = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 256,
    "moe_intermediate_size": 128,
}


def one_tile(quant, M, shape):
    """One unsplit candidate: the interpreter has no bf16 atomics for split-K."""
    return [c for c in candidates(quant, M, shape) if c["SPLIT_K"] == 1][:1]


def tiny_file_name() -> str:
    gpu = device_name().replace(" ", "_")
    return f"E=8,N=128,device_name={gpu},dtype=fp8_w8a8.json"  # N: the intermediate size


@pytest.fixture
def tiny_shape(tmp_path) -> Shape:
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY_MODEL))
    parsed = moe_shape(tmp_path / "tiny", tp=1)
    assert parsed.quant == "tensor"
    return Shape(parsed.name, parsed.experts, parsed.topk, parsed.hidden, parsed.intermediate)


@pytest.fixture
def tree(release_trees):
    return release_trees("0.21.0+moe")


def test_the_written_file_is_what_the_trees_own_lookup_reads(tree, tiny_shape, tmp_path):
    out = tmp_path / "tuned"
    report = model_tune.tune_model(
        tree, tiny_shape, "tensor", [1, 2], out, routings=1, candidates_for=one_tile
    )
    assert report["config_file"] == tiny_file_name()
    assert (out / report["config_file"]).is_file()
    for M in (1, 2):
        row = report["results"][str(M)]
        config, source = config_for(
            tree, M, 8, 128, 256, 2, "fp8_w8a8", None, config_folder=str(out)
        )
        assert source == f"tuned:{report['config_file']}[{M}]"
        assert config == row["config"]
        assert row["candidates"] == 1 and row["rejected"] == 0
    # M values nobody tuned keep the tree's own dispatch, through vLLM's nearest-entry
    # lookup in the written file
    for M in [*range(3, 700), 1031, 1032, 1033, 4096, 65536]:
        tuned, _ = config_for(tree, M, 8, 128, 256, 2, config_folder=str(out))
        own = vllm_entry(model_tune.dispatch_config(tree, tiny_shape, "tensor", M))
        assert vllm_entry(tuned) == own, M


def test_a_rerun_resumes_after_the_m_values_it_holds(tree, tiny_shape, tmp_path, monkeypatch):
    out = tmp_path / "tuned"
    model_tune.tune_model(tree, tiny_shape, "tensor", [1], out, routings=1, candidates_for=one_tile)
    first = json.loads((out / model_tune.STATE_NAME).read_text())["results"]["1"]

    timed = []
    real = model_tune.tune_one_m

    def counted(variant, shape, quant, M, *rest):
        timed.append(M)
        return real(variant, shape, quant, M, *rest)

    monkeypatch.setattr(model_tune, "tune_one_m", counted)
    seen = []
    report = model_tune.tune_model(
        tree, tiny_shape, "tensor", [1, 2], out, routings=1, candidates_for=one_tile,
        on_result=lambda row: seen.append(row["M"]),
    )  # fmt: skip
    assert timed == [2] and seen == [1, 2]
    assert report["results"]["1"] == first
    state = json.loads((out / model_tune.STATE_NAME).read_text())
    assert sorted(state["results"]) == ["1", "2"]

    timed.clear()  # another seed is another run: nothing is reused
    model_tune.tune_model(
        tree, tiny_shape, "tensor", [1], out, routings=1, seed=1, candidates_for=one_tile
    )
    assert timed == [1]


def test_no_m_keeps_a_config_slower_than_the_dispatch(tree, tiny_shape, tmp_path):
    out = tmp_path / "tuned"
    report = model_tune.tune_model(
        tree, tiny_shape, "tensor", [1, 2], out, routings=1, candidates_for=one_tile,
        series_version="9.8.7",
    )  # fmt: skip
    assert report["inputs"]["series_version"] == "9.8.7"  # as the caller names it
    for row in report["results"].values():
        assert row["dispatch_correct"]
        assert row["us"] <= row["dispatch"]["us"] and row["speedup"] >= 1.0
        if row["chosen"] == "dispatch":
            assert row["us"] == row["dispatch"]["us"]
            assert row["config"] == vllm_entry(row["dispatch"]["config"])


def test_the_command_prints_the_gain_per_m_and_the_folder_for_vllm(tree, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from moe_patch.cli import main

    real = model_tune.tune_model

    def one_tile_each(*args, **kwargs):
        return real(*args, **{**kwargs, "candidates_for": one_tile})

    monkeypatch.setattr(model_tune, "tune_model", one_tile_each)
    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL))
    out = tmp_path / "tuned"
    args = ["--model", str(tmp_path), "--tree", str(tree), "--M", "2,1", "--routings", "1"]
    result = CliRunner().invoke(main, ["tune", *args, "--release", "none", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["M", "dispatch", "µs", "tuned", "µs", "speed-up"]
    assert [line.split()[0] for line in lines[1:3]] == ["1", "2"]
    # the tree's fused decode rule takes this small per-tensor dynamic layer up to 8 tokens
    assert lines[3] == (
        "at M <= 8 vLLM runs this layer's fused decode path on Hopper (the tree's rule), not "
        "these configs: they serve there with VLLM_FUSED_MOE_DECODE=0"
    )
    assert lines[4] == f"wrote {out / tiny_file_name()}"
    assert lines[5] == f"export VLLM_TUNED_CONFIG_FOLDER={out}"
    from moe_patch import __version__  # the command names its own series to the harness

    assert json.loads((out / model_tune.STATE_NAME).read_text())["inputs"]["series_version"] == (
        __version__
    )
    # By default the release the tree was made from (0.21.0, through moe-patch's cache) is
    # timed beside it: a new input, so every M is timed again, and the gain over it shown.
    result = CliRunner().invoke(main, ["tune", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert (
        lines[0] == f"{out}: the earlier run there had another --release tree; tuning every M again"
    )
    assert lines[1].split() == ["M", "release", "µs", "dispatch", "µs", "tuned", "µs", "vs",
                                "dispatch", "vs", "release"]  # fmt: skip
    report = json.loads((out / model_tune.STATE_NAME).read_text())
    for line, M in zip(lines[2:4], ("1", "2"), strict=True):
        row = report["results"][M]
        assert line.split() == [
            M, f"{row['release']['us']:.1f}", f"{row['dispatch']['us']:.1f}", f"{row['us']:.1f}",
            f"{row['speedup']:.2f}x", f"{row['speedup_over_release']:.2f}x",
        ]  # fmt: skip
    # Run again with another seed: the earlier results are not passed off as this run's.
    result = CliRunner().invoke(main, ["tune", *args, "--M", "1", "--seed", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        f"{out}: the earlier run there had another --seed; tuning every M again"
    )


def test_the_release_is_timed_beside_the_tree_and_its_config_tried(
    tree, release_trees, tiny_shape, tmp_path
):
    release = release_trees("0.21.0")
    report = model_tune.tune_model(
        tree, tiny_shape, "tensor", [1], tmp_path / "t", routings=1, candidates_for=one_tile,
        release=release,
    )  # fmt: skip
    row = report["results"]["1"]
    assert report["inputs"]["release_fingerprint"] == fingerprint(release)
    assert row["release_correct"] and row["release"]["config_source"] == "default"
    assert row["speedup_over_release"] == pytest.approx(row["release"]["us"] / row["us"])
    # The release's config joins the candidates on the tree's kernel where it is not the
    # tree's own (0.21.0's default names no split; the series' default offers one).
    assert vllm_entry(row["release"]["config"]) != vllm_entry(row["dispatch"]["config"])
    assert row["candidates"] == 2
    # Nothing the release launches is kept where the search saw it more than 3% faster.
    assert row["us"] <= row["dispatch"]["us"]


def with_version(tree, into, version: str | None):
    """A copy of ``tree``'s harness files that says it is ``version`` (None: says nothing)."""
    from moe_kernels.trees import copy_harness_files

    copy_harness_files(tree, into)
    version_file = into / "vllm" / "_version.py"
    version_file.unlink()
    if version is not None:
        version_file.write_text(f"__version__ = version = {version!r}\n")
    return into


@pytest.mark.parametrize(
    ("release", "version", "said"),
    [
        ("{tmp}/nowhere", None, "is not a vLLM source tree"),
        ("auto", None, "does not say which vLLM it is"),
        ("auto", "0.21.1.dev3+gabcdef", "says it is 0.21.1.dev3+gabcdef, not a vLLM release"),
    ],
)
def test_a_release_that_cannot_be_had_is_one_line(tree, tmp_path, release, version, said):
    from click.testing import CliRunner
    from moe_patch.cli import main

    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL))
    unversioned = with_version(tree, tmp_path / "tree", version)
    args = ["--model", str(tmp_path), "--tree", str(unversioned), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(main, ["tune", *args, "--release", release.format(tmp=tmp_path)])
    assert result.exit_code == 2
    assert said in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_without_m_the_command_tunes_vllms_whole_capture_grid(tree, tmp_path, monkeypatch):
    """Every M to 16 and every CUDA-graph size vLLM pads a decode batch to, up to 512."""
    from click.testing import CliRunner
    from moe_kernels.measure import VLLM_GRID
    from moe_patch.cli import main

    asked = []

    def record(tree, shape, quant, Ms, out, **kwargs):
        asked.append(list(Ms))
        raise KeyboardInterrupt  # stop before any kernel runs

    monkeypatch.setattr(model_tune, "tune_model", record)
    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL))
    args = ["--model", str(tmp_path), "--tree", str(tree), "--out", str(tmp_path / "o")]
    CliRunner().invoke(main, ["tune", *args])
    assert asked == [list(VLLM_GRID)]
    assert {72, 80, 104, 200, 272, 496, 512} <= set(VLLM_GRID) and len(VLLM_GRID) == 62


def test_a_local_version_label_names_its_release(tree, tmp_path):
    """A patched wheel says 0.21.0+moe..., a local build 0.21.0+cu128: both are 0.21.0."""
    from moe_kernels.loader import tree_version
    from moe_patch.cli.tune import _release_tree

    labelled = with_version(tree, tmp_path / "tree", "0.21.0+moe.0.1.0")
    release = _release_tree("auto", labelled, tmp_path / "scratch")
    assert tree_version(release) == "0.21.0"
    assert fingerprint(release) != fingerprint(labelled)  # the release, not the patched tree


def test_a_release_out_of_reach_says_how_to_go_on(tree, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from moe_patch import harness_trees
    from moe_patch.cli import main
    from moe_patch.errors import EXIT_NETWORK, NetworkError

    def unreachable(label, into, index_url=None):
        assert (label, index_url) == ("0.21.0", "http://index.invalid/simple")
        raise NetworkError("cannot reach the package index http://index.invalid/simple")

    monkeypatch.setattr(harness_trees, "build_tree", unreachable)
    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL))
    args = ["--model", str(tmp_path), "--tree", str(tree), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(main, ["tune", *args, "--index-url", "http://index.invalid/simple"])
    assert result.exit_code == EXIT_NETWORK
    assert len(result.output.strip().splitlines()) == 1
    assert "--release PATH, or --release none" in result.output
    assert not (tmp_path / "o").exists()


def test_the_h200_runs_file_is_what_the_patched_trees_lookup_reads(release_trees, tmp_path):
    """The committed H200 run of ``moe-patch tune`` (GLM-4.5-Air, block FP8, on 0.33.0 with
    the series, timed against 0.33.0 as released): the config file it wrote, under the name
    the report gives it, is what the patched tree's own lookup reads at every M tuned, and
    the report keeps a config only where it beat the dispatch."""
    report = json.loads((UNTUNED_RESULTS / "h200-tune-glm-4.5-air-0.33.json").read_text())
    folder = tmp_path / "tuned"
    folder.mkdir()
    (folder / report["config_file"]).write_text(
        (UNTUNED_RESULTS / "h200-tune-glm-4.5-air-0.33-config.json").read_text()
    )
    shape = report["inputs"]["shape"]
    assert report["environment"]["gpu"] == "NVIDIA H200" and report["inputs"]["quant"] == "block"
    tree = release_trees("0.33.0+moe")
    for M, row in report["results"].items():
        config, source = config_for(
            tree, int(M), shape["experts"], shape["intermediate"], shape["hidden"],
            shape["topk"], "fp8_w8a8", [128, 128], gpu_name="NVIDIA H200",
            config_folder=str(folder),
        )  # fmt: skip
        assert source == f"tuned:{report['config_file']}[{M}]"
        assert config == row["config"]
        assert row["dispatch_correct"] and row["release_correct"]
        if row["chosen"] == "tuned":
            assert row["us"] < row["dispatch"]["us"] / 1.03
        else:
            assert row["us"] == row["dispatch"]["us"]


def _timing(config_stages: int, *per_routing: tuple[float, float]) -> dict:
    up, down = sum(u for u, _ in per_routing), sum(d for _, d in per_routing)
    return {
        "config": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_stages": config_stages},
        "up_us": up,
        "down_us": down,
        "us": up + down,
        "correct": True,
        "per_routing": [{"up_us": u, "down_us": d} for u, d in per_routing],
    }


def test_a_config_whose_gemm_falls_behind_the_release_on_a_routing_is_not_chosen():
    release = _timing(4, (96.0, 45.0), (118.0, 57.0))
    own = _timing(3, (99.0, 47.0), (120.0, 58.0))  # the tree's dispatch: a little behind
    faster_pair = _timing(2, (82.0, 49.0), (108.0, 53.0))  # second GEMM 0.918x on routing 1
    level = _timing(5, (95.0, 45.0), (117.0, 57.0))
    chosen, tuned = model_tune.choose(own, release, [faster_pair, level])
    assert tuned and chosen is level  # not the fastest pair: it loses a GEMM on one routing
    # without the release (or with a broken one) the fastest pair wins, as before
    assert model_tune.choose(own, None, [faster_pair, level]) == (faster_pair, True)
    broken = {**release, "correct": False}
    assert model_tune.choose(own, broken, [faster_pair, level]) == (faster_pair, True)
    # nothing keeps pace: judged on the pair, and the dispatch stays within MIN_GAIN
    assert model_tune.choose(own, release, [faster_pair])[0] is faster_pair
    near = _timing(6, (98.0, 50.0), (119.0, 58.0))
    assert model_tune.choose(own, release, [near]) == (own, False)


@pytest.mark.parametrize(
    ("experts", "topk", "M"),
    [(8, 2, 1), (8, 2, 2), (8, 2, 6), (16, 1, 3), (128, 8, 4), (256, 8, 8)],
)
def test_the_spread_of_experts_hit_is_what_routings_give(gen, experts, topk, M):
    """The closed form against the harness's own routing on fresh draws."""
    from moe_kernels.measure import routing
    from moe_kernels.tune import experts_hit_spread

    shape = Shape("spread", experts, topk, 64, 64)
    hits = torch.tensor(
        [float(torch.unique(routing(M, shape, gen)[0]).numel()) for _ in range(4000)]
    )
    drawn = float(hits.std() / hits.mean())
    assert experts_hit_spread(shape, M) == pytest.approx(drawn, abs=0.01)


def test_auto_draws_more_routings_where_the_experts_hit_vary():
    from moe_kernels.tune import ROUTINGS, ROUTINGS_VARIED, routings_for

    mixtral, qwen3 = Shape("m", 8, 2, 4096, 14336), Shape("q", 128, 8, 2048, 768)
    # one token hits exactly top-k experts; Mixtral's 2-8 tokens hit 3-7 of 8, varying 10-17%
    assert routings_for(mixtral, 1) == ROUTINGS
    assert [routings_for(mixtral, M) for M in (2, 3, 8)] == [ROUTINGS_VARIED] * 3
    assert routings_for(mixtral, 24) == ROUTINGS
    assert all(routings_for(qwen3, M) == ROUTINGS for M in (1, 2, 4, 8, 16, 64))


def test_the_command_takes_auto_or_a_number_of_routings(tmp_path):
    from click.testing import CliRunner
    from moe_patch.cli import main

    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL))
    args = ["tune", "--model", str(tmp_path), "--tree", str(tmp_path), "--out", str(tmp_path)]
    for bad in ("some", "0"):
        result = CliRunner().invoke(main, [*args, "--routings", bad])
        assert result.exit_code == 2 and "--routings" in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("tree_name", "experts_shape", "block", "static", "tokens"),
    [
        ("0.21.0+moe", (2048, 768), False, False, 8),  # Qwen3-30B-A3B, dynamic scales
        ("0.21.0+moe", (2048, 768), True, False, 1),  # block-scaled: one token
        ("0.21.0+moe", (2048, 768), False, True, 0),  # calibrated scales keep the unfused path
        ("0.21.0+moe", (4096, 14336), False, False, 0),  # Mixtral's 176 MB experts
        ("0.21.0", (2048, 768), False, False, 0),  # the release has no fused path
    ],
)
def test_tune_reads_the_fused_decode_rule_from_the_tree(
    release_trees, tree_name, experts_shape, block, static, tokens
):
    from moe_kernels.decode import fused_decode_tokens

    tree = release_trees(tree_name)
    assert fused_decode_tokens(tree, experts_shape, block, static) == tokens


def test_a_static_activation_scheme_is_read_from_the_model(tmp_path):
    config = {**TINY_MODEL, "quantization_config": {"activation_scheme": "static"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert moe_shape(tmp_path, tp=1).static_activations is True
    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL))
    assert moe_shape(tmp_path, tp=1).static_activations is False
