"""The read-ceiling study (kernels/studies/read_ceiling.py), run end to end through
Triton's interpreter on CPU.

Times are meaningless there; what is checked is that every geometry reads each
byte exactly once (its sum is verified before timing), that rows keep the
bench file's identity and kernel time, and that the ceiling is floor / read.
"""

from __future__ import annotations

import json

import pytest
import torch
from studies import read_ceiling


def _bench_file(tmp_path, rows):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"bandwidth": {"read_gbps": 1.0, "copy_gbps": 1.0}, "rows": rows}))
    return path


def _row(M, gemm, variant="ours", nbytes=8 * 1024 + 6):
    return {"shape": "tiny-smoke-test", "gemm": gemm, "quant": "tensor", "M": M,
            "variant": variant, "bytes": nbytes, "us": 12.5}  # fmt: skip


@pytest.fixture
def small_sweep(monkeypatch):
    monkeypatch.setattr(read_ceiling, "PROGRAMS_PER_SM", (1, 3))
    monkeypatch.setattr(read_ceiling, "WORDS_PER_LOAD", (64,))
    monkeypatch.setattr(read_ceiling, "SCREEN_REPLAYS", 1)
    monkeypatch.setattr(read_ceiling, "RETIMED", 1)


def test_ceiling_rows_cover_the_variant_up_to_max_m(tmp_path, small_sweep):
    rows = [_row(1, "up"), _row(2, "down"), _row(128, "up"), _row(1, "layer"),
            {**_row(1, "up", variant="peer"), "us": 25.0},
            {**_row(2, "down", variant="peer"), "us": 25.0}]  # fmt: skip
    bench = _bench_file(tmp_path, rows)
    out = tmp_path / "ceiling.json"
    assert read_ceiling.main(
        ["--bench", str(bench), "--variant", "ours", "--variant", "peer", "--max-m", "64",
         "--out", str(out)]
    ) == 0  # fmt: skip
    report = json.loads(out.read_text())
    assert [(r["M"], r["gemm"]) for r in report["rows"]] == [(1, "up"), (2, "down")]
    for r in report["rows"]:
        assert r["bytes_read"] == 8 * 1024 + 4  # whole words only: never more than the row
        assert r["ceiling"] == pytest.approx(r["floor_us"] / r["read_us"])
        assert r["kernel_us"] == {"ours": 12.5, "peer": 25.0}
        assert r["kernel_over_read"]["peer"] == pytest.approx(25.0 / r["read_us"])
        assert r["geometry"]["programs"] in (1, 3) and r["geometry"]["words_per_load"] == 64
    assert set(report["summary"]) == {"up", "down"}
    assert report["summary"]["up"]["cases"] == 1
    assert "| tiny-smoke-test | down | tensor | 2 |" in out.with_suffix(".md").read_text()


def test_unknown_variant_is_an_error(tmp_path, small_sweep):
    bench = _bench_file(tmp_path, [_row(1, "up")])
    with pytest.raises(SystemExit, match="no GEMM rows of variant 'nope'"):
        read_ceiling.main(
            ["--bench", str(bench), "--variant", "nope", "--out", str(tmp_path / "o")]
        )


def test_a_variant_without_every_case_is_an_error_before_timing(tmp_path, monkeypatch):
    bench = _bench_file(tmp_path, [_row(1, "up"), _row(2, "up"), _row(1, "up", variant="peer")])
    monkeypatch.setattr(read_ceiling, "best_read", lambda *a: pytest.fail("timed a read"))
    with pytest.raises(SystemExit, match="no 'peer' row for tiny-smoke-test up tensor M=2"):
        read_ceiling.ceiling_rows(json.loads(bench.read_text()), ["ours", "peer"], 64, {})


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("programs", [1, 5, 40])
def test_every_geometry_reads_each_word_once(programs, strided):
    words = 1000  # not a multiple of any geometry's step: the masks matter
    x = torch.randint(-9, 9, (words,), dtype=torch.int32)
    geometry = read_ceiling.Geometry(programs, 64, strided)
    # time_read raises unless the per-program sums add up to the buffer's sum.
    times = read_ceiling.time_read([x] * read_ceiling.COPIES, words, geometry, replays=1)
    assert len(times) == 1 and times[0] > 0


def test_a_geometry_that_misses_words_is_refused(monkeypatch):
    x = torch.ones(1000, dtype=torch.int32)
    # Read only half the buffer: the sum check must notice the missing words.
    geometry = read_ceiling.Geometry(4, 64, False)
    with pytest.raises(RuntimeError, match="summed wrongly"):
        read_ceiling.time_read([x] * read_ceiling.COPIES, 500, geometry, replays=1)
