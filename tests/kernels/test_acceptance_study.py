"""studies.acceptance judges issue 18's criteria from a bench run: checked on made-up runs
whose verdicts are known."""

from __future__ import annotations

import json

from moe_kernels.bench import VLLM_GRID
from moe_kernels.measure import SHAPE_GROUPS
from studies import acceptance

SHAPES = [*SHAPE_GROUPS["tuned"], *SHAPE_GROUPS["untuned"][:4]]


def _run(speedup=lambda shape, gemm, quant, M: 1.1, fraction=0.95, ms=VLLM_GRID) -> dict:
    """A run of 0.21.0 and 0.21.0+moe: the series ``speedup`` times as fast per case."""
    rows = []
    for shape in SHAPES:
        for gemm in ("up", "down", "layer"):
            for quant in ("tensor", "block"):
                for M in ms:
                    for routing in (0, 1):
                        base_us = 10.0 + M
                        new_us = base_us / speedup(shape, gemm, quant, M)
                        for variant, us in (("0.21.0", base_us), ("0.21.0+moe", new_us)):
                            rows.append(
                                {
                                    "shape": shape, "gemm": gemm, "quant": quant, "M": M,
                                    "routing": routing, "variant": variant, "us": us,
                                    "floor_us": fraction * new_us, "correct": True,
                                    "config": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64},
                                }
                            )  # fmt: skip
    return {
        "command": "python -m moe_kernels.bench",
        "series_version": "0.1.0",
        "environment": {"gpu": "H200", "sm_count": 132},
        "variants": {"0.21.0": "a", "0.21.0+moe": "b"},
        "rows": rows,
    }


def _verdicts(bench: dict) -> dict[str, tuple[bool, list[str]]]:
    pairs = [("0.21.0+moe", "0.21.0")]
    return {
        name.split(" ")[0]: (ok, details) for name, ok, details in acceptance.judge(bench, pairs)
    }


def split_at_one(shape, gemm, quant, M):
    return 1.6 if (gemm, M) == ("up", 1) else 1.1


def test_a_run_that_meets_every_criterion_passes(tmp_path):
    bench = _run(split_at_one)
    assert all(ok for ok, _ in _verdicts(bench).values())
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    out = tmp_path / "verdict.md"
    assert acceptance.main([str(path), "--out", str(out)]) == 0
    assert out.read_text().count("## PASS") == 5 and "## FAIL" not in out.read_text()


def test_each_shortfall_fails_its_criterion_and_names_the_cases():
    def one_slow_case(shape, gemm, quant, M):
        return (
            0.97
            if (shape, gemm, quant, M) == ("glm-4.5-air", "down", "block", 40)
            else (split_at_one(shape, gemm, quant, M))
        )

    verdicts = _verdicts(_run(one_slow_case))
    ok, details = verdicts["no"]
    assert not ok and "glm-4.5-air down block M=40: 0.970×" in "\n".join(details)
    assert all(v[0] for name, v in verdicts.items() if name != "no")

    verdicts = _verdicts(_run(lambda *case: 1.1))  # no split-K win at M = 1
    assert not verdicts["first"][0] and verdicts["untuned"][0]
    assert "— short" in verdicts["first"][1][0]
    # The base reads at 0.95 / 1.1 of the floor there: no kernel could be 1.5x as fast.
    assert "the read floor allows at most 1.16×" in verdicts["first"][1][0]

    verdicts = _verdicts(_run(lambda *case: 1.04 if case[1] != "layer" else 1.2))
    assert not verdicts["untuned"][0]

    verdicts = _verdicts(_run(split_at_one, fraction=0.85))
    assert not verdicts["median"][0] and verdicts["no"][0]
    # and says which shapes lose it, with the GEMM's K: the three lowest, lowest first
    bench = _run(split_at_one, fraction=0.85)
    for row in bench["rows"]:
        if row["shape"] == "qwen3-coder-480b-a35b-tp8" and row["variant"] == "0.21.0+moe":
            row["floor_us"] = 0.6 * row["us"]
    (down_tensor,) = [d for d in _verdicts(bench)["median"][1] if " down tensor:" in d]
    lowest = down_tensor.split("\n    - ")[1:]
    assert len(lowest) == 3 and lowest[0] == "qwen3-coder-480b-a35b-tp8 (K = 320): 0.600"
    assert lowest[1] == "deepseek-v3-tp8 (K = 256): 0.850"

    verdicts = _verdicts(_run(split_at_one, ms=[m for m in VLLM_GRID if m != 40]))
    ok, details = verdicts["coverage"]
    assert not ok and "not measured: [40]" in "\n".join(details)
    assert "lack a variant" not in "\n".join(details)  # said once, not again per case


def test_a_run_cut_short_fails_coverage_and_says_to_resume():
    """A file that several device sessions fill: every shape and M present somewhere, but the
    last shape's last cases not reached, or one variant missing from a case."""
    bench = _run(split_at_one)
    last = SHAPES[-1]
    bench["rows"] = [
        r
        for r in bench["rows"]
        if not (r["shape"] == last and r["gemm"] == "layer" and r["M"] > 64)
    ]
    ok, details = _verdicts(bench)["coverage"]
    holes = 2 * sum(m > 64 for m in VLLM_GRID)  # both quantisations
    assert not ok and f"{holes} cases of the measured shapes" in "\n".join(details)
    assert "--resume" in "\n".join(details)

    bench = _run(split_at_one)
    bench["rows"] = [
        r
        for r in bench["rows"]
        if not (r["shape"] == last and r["M"] == 1 and r["variant"] == "0.21.0+moe")
    ]
    ok, details = _verdicts(bench)["coverage"]
    assert not ok and "6 cases of the measured shapes lack a variant" in "\n".join(details)


def test_an_incorrect_measurement_fails_coverage():
    bench = _run(split_at_one)
    bench["rows"][7]["correct"] = False
    ok, details = _verdicts(bench)["coverage"]
    assert not ok and "1 incorrect" in details[0]


def test_a_cpu_rehearsal_of_the_run_is_judged_as_an_h200s():
    """The device command rehearsed through the interpreter names no GPU: its launches were
    an H200's (the launcher's assumption there), and the verdicts are the same."""
    bench = _run(split_at_one)
    bench["environment"] = {"gpu": None, "device": "cpu (Triton interpreter)"}
    assert all(ok for ok, _ in _verdicts(bench).values())
