"""studies.stream_n: the short-K study kernel computes the fused-MoE GEMM (checked against the
float64 reference on fresh random data through Triton's interpreter), and the study times it
beside a tree's own kernel."""

from __future__ import annotations

import json

import pytest
from moe_kernels.measure import FP8_ERROR_BOUND, Shape, make_case, make_weights
from studies import stream_n

# Short K with a partial last step (160 = 128 + 32) and N that no tile width divides (192),
# so every mask of the kernel is exercised; 8 experts, top-2, as Mixtral routes.
SHORT_K = Shape("short-k-test", 8, 2, 192, 160)


@pytest.mark.parametrize("quant", ["tensor", "block"])
@pytest.mark.parametrize("gemm", ["down", "up"])
def test_every_tile_count_and_width_computes_the_gemm(gen, quant, gemm):
    weights = make_weights(SHORT_K, gemm, quant, gen)
    case = make_case(SHORT_K, gemm, quant, 3, gen)
    refs: dict = {}
    for n_tiles in (1, 2, 4):
        for block_n in (64, 128):
            config = {"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": block_n, "N_TILES": n_tiles,
                      "num_stages": 2, "num_warps": 4}  # fmt: skip
            row, call, launches = stream_n.checked_stream_n(case, weights, refs, config, None)
            assert row["correct"], (config, row["rel_error"])
            assert max(row["rel_error"]) < FP8_ERROR_BOUND and launches == 1
            # one row block per routed pair at most, each covering n_tiles tiles of N
            assert row["grid"][1] == -(-case["N"] // (block_n * n_tiles))
            call()


def test_an_unwritten_tile_fails_the_check(gen, monkeypatch):
    """The check is not vacuous: a grid one program short leaves NaN rows, which fail."""
    weights = make_weights(SHORT_K, "down", "tensor", gen)
    case = make_case(SHORT_K, "down", "tensor", 3, gen)
    real = stream_n.triton.cdiv

    def one_short(a, b):  # the grid's N axis only: 2 programs for 3 tiles
        return real(a, b) - (1 if (a, b) == (case["N"], 64) else 0)

    monkeypatch.setattr(stream_n.triton, "cdiv", one_short)
    config = {"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 64, "N_TILES": 1, "num_stages": 2, "num_warps": 4}
    row, _, _ = stream_n.checked_stream_n(case, weights, {}, config, None)
    assert not row["correct"]


def test_the_study_times_the_sweep_beside_a_trees_kernel(release_trees, tmp_path, monkeypatch):
    monkeypatch.setattr(stream_n, "N_TILES", (1, 2))
    monkeypatch.setattr(stream_n, "TILE_N", (64,))
    monkeypatch.setattr(stream_n, "STAGES", (2,))
    out = tmp_path / "stream-n.json"
    tree = release_trees("0.33.0+moe")
    argv = [f"--tree=0.33.0+moe={tree}", "--shape", "tiny-smoke-test", "--quant", "block"]
    argv += ["--M", "2", "--routings", "1", "--replays", "2", "--out", str(out)]
    assert stream_n.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["0.33.0+moe", "stream-n", "stream-n"]
    assert all(r["correct"] and r["us"] > 0 for r in rows)
    assert [r["config"].get("N_TILES") for r in rows[1:]] == [1, 2]
