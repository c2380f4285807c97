"""Which series have run on a GPU: ``v<base>/gpu-runs.json``, what ``list`` shows of it,
the one line ``apply`` and ``wheel`` print without it, and every recorded run checked
against the committed result file it names."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import gpu_runs, pr_tests, series
from moe_patch.cli import main
from moe_patch.errors import UsageError
from wheel_support import add_wheel

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "kernels" / "results"
UNVERIFIED = "has not run on a GPU yet"

RUN = {
    "kind": "served",
    "vllm": "1.0.0",
    "gpu": "NVIDIA H200",
    "date": "2026-12-03",
    "series_version": "0.1.0",
    "result": "provenance/x.json",
}


def run(*args):
    return CliRunner().invoke(main, list(args))


def record(series_root: Path, *entries: dict) -> None:
    (series_root / "v1.0.0" / gpu_runs.RUNS_FILE).write_text(json.dumps({"runs": list(entries)}))


def test_without_a_record_apply_and_wheel_say_so_in_one_line(fake_index, series_root, tmp_path):
    (series_root / "v1.0.0" / gpu_runs.RUNS_FILE).unlink()
    fake_index.add("1.0.0")
    add_wheel(fake_index, "1.0.0")
    applied = run("apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t"), "--json")
    built = run("wheel", "--vllm", "1.0.0", "-o", str(tmp_path / "dist"), "--json")
    for result in (applied, built):
        assert result.exit_code == 0, result.output
        warned = [line for line in result.stderr.splitlines() if UNVERIFIED in line]
        assert warned == [
            "moe-patch: warning: the series for vLLM 1.0.0 (v1.0.0/) has not run on a GPU yet: "
            "it passes verify and the kernel tests on a CPU only"
        ]
        json.loads(result.stdout)  # the report on stdout stays machine-readable


def test_with_a_record_they_do_not_and_list_shows_it(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    record(series_root, {**RUN, "kind": "kernel-tests", "date": "2026-11-30"}, RUN)
    applied = run("apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t"))
    assert applied.exit_code == 0, applied.output
    assert UNVERIFIED not in applied.stderr
    listed = run("list")
    assert "v1.0.0  1.0.0 ≤ v" in listed.stdout
    assert "served a model on an H200 (vLLM 1.0.0, series 0.1.0, 2026-12-03)" in listed.stdout
    rows = json.loads(run("list", "--json").stdout)
    assert {r["gpu"] for r in rows} == {
        "served a model on an H200 (vLLM 1.0.0, series 0.1.0, 2026-12-03)"
    }


def test_a_branch_test_run_alone_does_not_count_as_the_series_on_a_gpu(
    fake_index, series_root, tmp_path
):
    record(series_root, {**RUN, "kind": "branch-tests", "result": "branch-tests/x.json"})
    fake_index.add("1.0.0")
    applied = run("apply", "--vllm", "1.0.0", "--into", str(tmp_path / "t"))
    assert applied.exit_code == 0, applied.output
    assert UNVERIFIED in applied.stderr
    assert "not run on a GPU yet" in run("list").stdout


def test_list_names_the_series_that_never_ran_on_a_gpu(series_root):
    (series_root / "v1.0.0" / gpu_runs.RUNS_FILE).unlink()
    assert "not run on a GPU yet" in run("list").stdout


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "is not a list of GPU runs"),
        ('{"runs": [{"kind": "served"}]}', "is not a list of GPU runs"),
        (json.dumps({"runs": [{**RUN, "kind": "benchmarked"}]}), "unknown kind benchmarked"),
    ],
)
def test_a_damaged_record_is_a_one_line_error(series_root, text, words):
    (series_root / "v1.0.0" / gpu_runs.RUNS_FILE).write_text(text)
    with pytest.raises(UsageError, match=words):
        gpu_runs.runs(series_root / "v1.0.0")
    result = run("list")
    assert result.exit_code == 2 and words in result.stderr and "Traceback" not in result.output


def test_the_port_to_0_34_has_never_run_on_a_gpu():
    """Only its pr branch's GPU test has: the series as a whole never served or ran tests."""
    assert {r.kind for r in gpu_runs.runs(ROOT / "patches" / "v0.34.0")} == {"branch-tests"}
    assert "not run on a GPU" in gpu_runs.summary(ROOT / "patches" / "v0.34.0")
    assert gpu_runs.runs(ROOT / "patches" / "v0.20.0") and gpu_runs.runs(
        ROOT / "patches" / "v0.25.0"
    )


def _shipped_runs():
    for base in series.bases(ROOT / "patches"):
        for entry in gpu_runs.runs(ROOT / "patches" / f"v{base}"):
            yield pytest.param(base, entry, id=f"v{base}:{entry.result}")


@pytest.mark.parametrize("base, entry", list(_shipped_runs()))
def test_every_recorded_gpu_run_is_what_its_result_file_shows(base, entry):
    """The record is derived from the committed results: the file exists, ran on that GPU,
    on a release this series serves, with this series applied, and passed."""
    assert series.base_for(entry.vllm, ROOT / "patches") == base
    path = RESULTS / entry.result
    index = json.loads((RESULTS / "index.json").read_text())
    assert index[entry.result]["series"] == entry.series_version
    if entry.kind == "served":
        report = json.loads(path.read_text())
        assert report["vllm"] == entry.vllm
        assert report["series_version"] == entry.series_version
        assert report["environment"]["gpu"].startswith(entry.gpu)
        patched = [v for v in report["variants"] if v["wheel"] == "patched"]
        assert patched and all(v["returncode"] == 0 for v in patched)
        assert all(v["result"]["vllm_version"].startswith(f"{entry.vllm}+moe.") for v in patched)
        assert entry.date in {v["started_at"][:10] for v in patched}
    elif entry.kind == "branch-tests":
        shown = json.loads(path.read_text())
        assert shown["parent_describe"] == f"v{entry.vllm}" and shown["gpu"] == entry.gpu
        assert shown["moe_patch_version"] == entry.series_version
        assert entry.date == shown["date"][:10]
        assert _recomputed_verdicts(shown) == shown["verdicts"]
        assert shown["verdicts"] and all(v["shown"] is True for v in shown["verdicts"])
        assert "on a GPU" in shown["python"]
    else:
        text = path.read_text()
        assert text.splitlines()[0].startswith(entry.gpu)
        assert f"MOE_KERNELS_TREES=.gpu/trees/{entry.vllm}+moe " in text
        summary = re.search(r"^(\d+) passed(.*) in [\d.]+s$", text, re.MULTILINE)
        assert summary and "failed" not in summary.group(2) and "error" not in summary.group(2)
        assert text.rstrip().endswith("pytest rc=0")


def _recomputed_verdicts(record: dict) -> list[dict]:
    """What ``moe-patch pr`` makes of a branch-tests record's two runs."""
    runs = {}
    for side in ("on_base", "on_branch"):
        files = {t: pr_tests.FileResult(**r) for t, r in record[side]["files"].items()}
        runs[side] = pr_tests.Run(**{**record[side], "files": files})
    evidence = pr_tests.Evidence(record["tests"], record["parent_describe"], record["python"],
                                 runs["on_base"], runs["on_branch"])  # fmt: skip
    return [{"test": t, "shown": ok, "detail": why} for t, ok, why in evidence.verdicts()]


def test_a_branch_test_run_that_failed_on_the_branch_is_kept_and_not_listed():
    """The split-K test as released in 0.3.0 failed on an H100 on the branch too: its record
    says so (recomputed), and no series lists it as a GPU run."""
    name = "branch-tests/h100-v0.33.0-swap-ab-split-k-0.3.0.json"
    record = json.loads((RESULTS / name).read_text())
    assert _recomputed_verdicts(record) == record["verdicts"]
    [verdict] = record["verdicts"]
    assert verdict["shown"] is False and verdict["detail"].startswith("fails on the branch")
    assert record["on_base"]["files"][verdict["test"]]["failed"] == 4
    assert "on a GPU" in record["python"] and record["gpu"].startswith("NVIDIA H100")
    listed = {e.result for base in series.bases(ROOT / "patches")
              for e in gpu_runs.runs(ROOT / "patches" / f"v{base}")}  # fmt: skip
    assert name not in listed
