"""studies.stream_n: the short-K study kernel computes the fused-MoE GEMM (checked against the
float64 reference on fresh random data through Triton's interpreter), and the study times it
beside a tree's own kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from moe_kernels.measure import FP8_ERROR_BOUND, Shape, make_case, make_weights
from studies import stream_n

# Short K with a partial last step (160 = 128 + 32) and N that no tile width divides (192),
# so every mask of the kernel is exercised; 8 experts, top-2, as Mixtral routes.
SHORT_K = Shape("short-k-test", 8, 2, 192, 160)


ROOT = Path(__file__).resolve().parents[2]


def _tiny_run(release_trees, out, quant: str) -> list[str]:
    """The study's arguments for one routing of the smoke shape beside 0.33.0+moe."""
    tree = release_trees("0.33.0+moe")
    argv = [f"--tree=0.33.0+moe={tree}", "--shape", "tiny-smoke-test", "--quant", quant]
    return argv + ["--routings", "1", "--replays", "2", "--out", str(out)]


@pytest.mark.parametrize("quant", ["tensor", "block"])
@pytest.mark.parametrize("gemm", ["down", "up"])
@pytest.mark.parametrize("loop", ["unrolled", "flat"])
def test_every_tile_count_and_width_computes_the_gemm(gen, quant, gemm, loop):
    weights = make_weights(SHORT_K, gemm, quant, gen)
    case = make_case(SHORT_K, gemm, quant, 3, gen)
    refs: dict = {}
    for n_tiles in (1, 2, 4):
        for block_n in (64, 128):
            config = {"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": block_n, "N_TILES": n_tiles,
                      "LOOP": loop, "num_stages": 2, "num_warps": 4}  # fmt: skip
            row, call, launches = stream_n.checked_stream_n(case, weights, refs, config, None)
            assert row["correct"], (config, row["rel_error"])
            assert max(row["rel_error"]) < FP8_ERROR_BOUND and launches == 1
            # one row block per routed pair at most, each covering n_tiles tiles of N
            assert row["grid"][1] == -(-case["N"] // (block_n * n_tiles))
            call()


@pytest.mark.parametrize("quant", ["tensor", "block"])
@pytest.mark.parametrize("gemm", ["down", "up"])
def test_the_persistent_grid_walks_every_pair(gen, quant, gemm):
    """Three programs (the interpreter's persistent grid) walk all (row block, weight tile)
    pairs with a stride of three, crossing row blocks and experts."""
    weights = make_weights(SHORT_K, gemm, quant, gen)
    case = make_case(SHORT_K, gemm, quant, 3, gen)
    refs: dict = {}
    for block_n in (64, 128):
        config = {"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": block_n, "N_TILES": 0,
                  "LOOP": "persistent", "num_stages": 3, "num_warps": 4}  # fmt: skip
        row, call, _ = stream_n.checked_stream_n(case, weights, refs, config, None)
        assert row["correct"], (config, row["rel_error"])
        assert row["grid"] == [stream_n.INTERPRETER_PROGRAMS]
        call()


def test_an_unwritten_tile_fails_the_check(gen, monkeypatch):
    """The check is not vacuous: a grid one program short leaves NaN rows, which fail."""
    weights = make_weights(SHORT_K, "down", "tensor", gen)
    case = make_case(SHORT_K, "down", "tensor", 3, gen)
    real = stream_n.triton.cdiv

    def one_short(a, b):  # the grid's N axis only: 2 programs for 3 tiles
        return real(a, b) - (1 if (a, b) == (case["N"], 64) else 0)

    monkeypatch.setattr(stream_n.triton, "cdiv", one_short)
    config = {"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 64, "N_TILES": 1, "LOOP": "flat",
              "num_stages": 2, "num_warps": 4}  # fmt: skip
    row, _, _ = stream_n.checked_stream_n(case, weights, {}, config, None)
    assert not row["correct"]


def test_the_study_times_the_sweep_beside_a_trees_kernel(release_trees, tmp_path, monkeypatch):
    sweep = [("unrolled", 1, 64, 2), ("flat", 2, 64, 3), ("persistent", 0, 64, 3)]
    monkeypatch.setattr(stream_n, "SWEEP", sweep)
    out = tmp_path / "stream-n.json"
    argv = [*_tiny_run(release_trees, out, "block"), "--M", "2"]
    assert stream_n.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["0.33.0+moe"] + ["stream-n"] * 3
    assert all(r["correct"] and r["us"] > 0 for r in rows)
    assert [(r["config"]["LOOP"], r["config"]["N_TILES"]) for r in rows[1:]] == [
        ("unrolled", 1),
        ("flat", 2),
        ("persistent", 0),
    ]


def test_a_config_that_fails_is_recorded_and_fails_the_run(release_trees, tmp_path, monkeypatch):
    monkeypatch.setattr(stream_n, "SWEEP", [("flat", 2, 64, 3), ("persistent", 0, 64, 3)])
    real = stream_n.checked_stream_n

    def persistent_breaks(case, weights_q, refs, config, graph_us):
        if config["LOOP"] == "persistent":
            raise RuntimeError("no launcher for this build")
        return real(case, weights_q, refs, config, graph_us)

    monkeypatch.setattr(stream_n, "checked_stream_n", persistent_breaks)
    out = tmp_path / "stream-n.json"
    argv = [*_tiny_run(release_trees, out, "tensor"), "--M", "2"]
    assert stream_n.main(argv) == 1
    report = json.loads(out.read_text())
    assert [r["config"].get("LOOP") for r in report["rows"]] == [None, "flat"]
    assert [(f["M"], f["config"]["LOOP"]) for f in report["failed"]] == [(2, "persistent")]
    assert "no launcher for this build" in report["failed"][0]["error"]


# What the pipeliner buffers per stage, from builds for SM90 without a GPU (in a process of
# their own: the interpreter this suite runs under cannot build).  Unrolled, a stage holds a
# tile's whole K; flat, one 128-deep K step; both the weight tile and the token tile.
BUILD_SCRIPT = """
import json, sys
from studies import stream_n
out = []
for loop, tiles, width, stages, k in json.loads(sys.argv[1]):
    config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": width, "N_TILES": tiles, "LOOP": loop,
              "num_stages": stages, "num_warps": 4}
    built = stream_n.sm90_build(config, True, k)
    out.append([built.shared, built.registers, built.ttgir.count("scf.for")])
print(json.dumps(out))
"""


def test_each_loop_form_buffers_what_the_sweep_assumes():
    builds = [
        ("unrolled", 4, 64, 3, 384),
        ("unrolled", 4, 64, 2, 256),
        ("flat", 4, 64, 3, 384),
        ("flat", 8, 128, 4, 256),
        ("persistent", 0, 64, 3, 384),
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", BUILD_SCRIPT, json.dumps(builds)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode and "ptxas" in done.stderr:
        pytest.skip(f"Triton cannot compile for SM90 here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    for (loop, _, width, stages, k), (shared, registers, loops) in zip(
        builds, json.loads(done.stdout), strict=True
    ):
        steps = -(-k // 128) if loop == "unrolled" else 1
        buffered = stages * steps * (width + 16) * 128
        # block scales and the barriers add a few KB at most
        assert buffered <= shared <= buffered + 4096, (loop, width, stages, k, shared)
        assert 0 < registers <= 255
        # unrolled: the loop over tiles alone; flat and persistent: the fused loop beside
        # the nest it replaces where the K loop could run no step
        assert loops == (1 if loop == "unrolled" else 2)


def test_the_committed_builds_are_the_sweeps():
    """results/short-k/sm90-stream-n-builds.md lists every config of SWEEP (two K each):
    regenerate it with ``--builds`` when the sweep changes."""
    table = ROOT / "kernels" / "results" / "short-k" / "sm90-stream-n-builds.md"
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.read_text().splitlines()
        if line.startswith(("| unrolled", "| flat", "| persistent"))
    ]
    listed = [(r[0], 0 if r[1] == "grid stride" else int(r[1]), int(r[2]), int(r[3])) for r in rows]
    assert listed == [config for config in stream_n.SWEEP for _ in (256, 384)]
    # the reason unrolled tiles stay 64 wide: nowhere more than three programs per SM at K = 384
    assert all(int(r[7]) <= 3 for r in rows if r[0] == "unrolled" and r[4] == "384" and r[1] != "1")


def test_a_long_k_is_not_unrolled():
    """Past UNROLL_MAX_STEPS an unrolled stage would not fit beside another program."""
    loops = {c["LOOP"] for c in stream_n.stream_n_config_sweep(16, 3072)}
    assert loops == {"flat", "persistent"}
    short = stream_n.stream_n_config_sweep(16, 384)
    assert len(short) == len(stream_n.SWEEP) and {c["BLOCK_SIZE_M"] for c in short} == {16}
    assert {c["BLOCK_SIZE_M"] for c in stream_n.stream_n_config_sweep(8, 384)} == {8}


def _row(variant, us, M=16, routing=0, correct=True, **config):
    row = {"shape": "s", "gemm": "down", "quant": "block", "M": M, "variant": variant,
           "us": us, "routing": routing, "correct": correct, "fraction_of_floor": 11.0 / us}  # fmt: skip
    if variant == "stream-n":
        row["config"] = {"BLOCK_SIZE_M": 16, "num_warps": 4, **config}
    return row


def test_the_summary_ranks_forms_per_case_and_entries_over_all_cases():
    flat = {"LOOP": "flat", "N_TILES": 4, "BLOCK_SIZE_N": 64, "num_stages": 3}
    persistent = {"LOOP": "persistent", "N_TILES": 0, "BLOCK_SIZE_N": 64, "num_stages": 3}
    rows = []
    for routing, scale in ((0, 1.0), (1, 4.0)):  # geometric means over the two routings: x2
        rows += [
            _row("0.33.0", 20.0 * scale, routing=routing),
            _row("0.33.0+moe", 16.0 * scale, routing=routing),
            _row("stream-n", 12.5 * scale, routing=routing, **flat),
            _row("stream-n", 8.0 * scale, routing=routing, **persistent),
            _row("stream-n", 1.0, routing=routing, correct=False, **persistent),  # left out
            _row("0.33.0", 10.0 * scale, M=64, routing=routing),
            _row("0.33.0+moe", 10.0 * scale, M=64, routing=routing),
            _row("stream-n", 20.0 * scale, M=64, routing=routing, **flat),
            _row("stream-n", 12.5 * scale, M=64, routing=routing, **persistent),
        ]
    text = stream_n.summary_markdown({"rows": rows, "failed": [{}]}, "r.json")
    assert "2 incorrect (left out), 1 configs failed" in text
    # M = 16: trees 40 and 32 µs, flat 25, persistent 16: 2x over the faster tree
    assert "| s | down | block | 16 | 40.0 | 32.0 | 25.0 | 16.0 | 2.000 |" in text
    assert "0.34 → 0.69 | persistent stridex64 s3 |" in text  # an 11 µs floor: 11/32, 11/16
    assert "| s | down | block | 64 | 20.0 | 20.0 | 40.0 | 25.0 | 0.800 |" in text
    # per entry over both cases: persistent sqrt(2 x 0.8) = 1.265 first, flat sqrt(1.28 x 0.5)
    entries = text.split("## Each sweep entry")[1]
    assert entries.index("persistent stridex64 s3 | 2 | 1.265 | 0.800 | 2.000") < entries.index(
        "flat 4x64 s3 | 2 | 0.800 | 0.500 | 1.280"
    )


def test_a_timed_sweep_summarises_to_markdown_beside_it(release_trees, tmp_path, monkeypatch):
    monkeypatch.setattr(stream_n, "SWEEP", [("flat", 2, 64, 3)])
    out = tmp_path / "stream-n.json"
    argv = [*_tiny_run(release_trees, out, "block"), "--M", "2"]
    assert stream_n.main(argv) == 0
    assert stream_n.main(["--summarise", str(out)]) == 0
    text = (tmp_path / "stream-n.md").read_text()
    assert "| tiny-smoke-test | down | block | 2 |" in text and "flat 2x64 s3 | 1 |" in text


def test_a_build_naming_a_parameter_the_kernel_lacks_is_refused():
    from moe_kernels import sm90

    with pytest.raises(TypeError, match="stream_n_moe_kernel has no parameter BLOCK_SIZE_Q"):
        sm90.build(stream_n.stream_n_moe_kernel, {"N": "i32"}, {"BLOCK_SIZE_Q": 1}, set(), 4, 3)


def test_resume_times_only_the_cases_the_file_lacks(release_trees, tmp_path, monkeypatch):
    monkeypatch.setattr(stream_n, "SWEEP", [("flat", 2, 64, 3)])
    out = tmp_path / "stream-n.json"
    argv = _tiny_run(release_trees, out, "tensor")
    assert stream_n.main([*argv, "--M", "2"]) == 0
    first = json.loads(out.read_text())
    assert stream_n.main([*argv, "--M", "2,3", "--resume"]) == 0
    resumed = json.loads(out.read_text())
    assert resumed["command"] == first["command"]  # the run's own header is kept
    assert resumed["rows"][: len(first["rows"])] == first["rows"]
    assert [(r["M"], r["variant"]) for r in resumed["rows"][len(first["rows"]) :]] == [
        (3, "0.33.0+moe"),
        (3, "stream-n"),
    ]
