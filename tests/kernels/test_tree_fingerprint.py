"""Tree fingerprints: a result file names the content of the trees it measured, and a run
spread over several device sessions (``--resume``) refuses to continue on trees whose
content changed since, so one file never mixes two series."""

from __future__ import annotations

import json

import pytest
from moe_kernels import bench, model_tune, tune
from moe_kernels.loader import FUSED_MOE_REL
from moe_kernels.measure import Shape
from moe_kernels.trees import (
    copy_harness_files,
    fingerprint,
    fingerprint_changes,
    harness_files,
)

CONFIG_REL = FUSED_MOE_REL.parent / "configs" / "E=8,N=128,device_name=X,dtype=fp8_w8a8.json"


def small_tree(root):
    """The files the harness reads, with a compiled-bytecode cache beside them."""
    for rel, text in (
        (FUSED_MOE_REL, "def fused_moe_kernel():\n    pass\n"),
        (CONFIG_REL, '{"1": {"BLOCK_SIZE_M": 16}}\n'),
        ("vllm/_version.py", '__version__ = "0.21.0"\n'),
        (FUSED_MOE_REL.parent / "__pycache__" / "fused_moe.cpython-312.pyc", "bytecode"),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_fingerprint_follows_content_not_place_or_bytecode(tmp_path):
    tree = small_tree(tmp_path / "a")
    print_a = fingerprint(tree)
    assert len(print_a) == 64
    assert "__pycache__" not in " ".join(p.as_posix() for p in harness_files(tree))
    copy_harness_files(tree, tmp_path / "b")
    assert fingerprint(tmp_path / "b") == print_a  # the same files elsewhere
    (tree / FUSED_MOE_REL.parent / "__pycache__" / "fused_moe.cpython-312.pyc").write_text("x")
    assert fingerprint(tree) == print_a  # bytecode is not what the harness reads
    (tree / CONFIG_REL).write_text('{"1": {"BLOCK_SIZE_M": 32}}\n')
    assert fingerprint(tree) != print_a  # a config table changed
    (tree / CONFIG_REL).write_text('{"1": {"BLOCK_SIZE_M": 16}}\n')
    assert fingerprint(tree) == print_a
    (tree / CONFIG_REL).rename(tree / CONFIG_REL.with_name("E=16.json"))
    assert fingerprint(tree) != print_a  # the same bytes under another name
    with pytest.raises(FileNotFoundError, match="is not a vLLM tree"):
        fingerprint(tmp_path / "nowhere")


def test_fingerprint_changes_say_which_tree_changed():
    assert fingerprint_changes({"a": "1", "b": "2"}, {"a": "1", "b": "2"}) is None
    said = fingerprint_changes({"a": "1", "b": "2"}, {"a": "1", "b": "3"})
    assert said.startswith("b changed since it was written")
    assert "no tree fingerprints" in fingerprint_changes(None, {"a": "1"})


@pytest.fixture
def harness_tree(release_trees, tmp_path):
    """A patched 0.21.0 as a device call carries it: only the files the harness reads."""
    copy_harness_files(release_trees("0.21.0+moe"), tmp_path / "tree")
    return tmp_path / "tree"


def touch_a_table(tree):
    """A change to the tree a kernel run would see: one more config table."""
    (tree / CONFIG_REL).write_text('{"1": {"BLOCK_SIZE_M": 16}}\n')


def test_bench_records_fingerprints_and_resumes_only_the_same_trees(harness_tree, tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = [f"--tree=s={harness_tree}", "--shape", "tiny-smoke-test", "--gemm", "down"]
    args += ["--quant", "tensor", "--M", "1", "--seed", "3", "--out", str(out)]
    assert bench.main([*args, "--stop-after", "0"]) == 3  # cut before any case
    written = json.loads(out.read_text())
    assert written["fingerprints"] == {"s": fingerprint(harness_tree)}
    touch_a_table(harness_tree)
    with pytest.raises(SystemExit) as exc:
        bench.main([*args, "--resume"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot resume" in err and "s changed since it was written" in err
    # A file from before the harness kept fingerprints is not continued either.
    del written["fingerprints"]
    out.write_text(json.dumps(written))
    with pytest.raises(SystemExit) as exc:
        bench.main([*args, "--resume"])
    assert exc.value.code == 2 and "no tree fingerprints" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # not a tree at all: one line, not a traceback
        bench.main([f"--tree=s={tmp_path / 'nowhere'}", "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "is not a vLLM tree" in capsys.readouterr().err


def test_tune_resumes_only_the_same_tree_and_peers(harness_tree, tmp_path, capsys):
    out = tmp_path / "search.json"
    args = [f"--tree=s={harness_tree}", "--shape", "tiny-smoke-test", "--quant", "tensor"]
    args += ["--M", "1", "--seed", "3", "--out", str(out)]
    assert tune.main([*args, "--stop-after", "0"]) == 3
    method = json.loads(out.read_text())["method"]
    assert method["fingerprints"] == {"s": fingerprint(harness_tree)}
    touch_a_table(harness_tree)
    with pytest.raises(SystemExit) as exc:
        tune.main([*args, "--resume"])
    assert exc.value.code == 2 and "s changed since it was written" in capsys.readouterr().err


def test_moe_patch_tune_times_every_m_again_on_a_changed_tree(harness_tree, tmp_path):
    shape = Shape("tiny", 8, 2, 256, 128)

    def one_tile(quant, M, shape):  # one unsplit candidate keeps the interpreter quick
        return [c for c in tune.candidates(quant, M, shape) if c["SPLIT_K"] == 1][:1]

    out = tmp_path / "tuned"
    model_tune.tune_model(harness_tree, shape, "tensor", [1], out, candidates_for=one_tile)
    kept, discarded = [], []
    model_tune.tune_model(
        harness_tree, shape, "tensor", [1], out, candidates_for=one_tile,
        on_result=lambda row: kept.append(row["M"]), on_discard=discarded.append,
    )  # fmt: skip
    assert kept == [1] and discarded == []  # the same tree: resumed, nothing timed again
    touch_a_table(harness_tree)
    report = model_tune.tune_model(
        harness_tree, shape, "tensor", [1], out, candidates_for=one_tile,
        on_discard=discarded.append,
    )  # fmt: skip
    assert discarded == [["tree_fingerprint"]]
    assert report["inputs"]["tree_fingerprint"] == fingerprint(harness_tree)


def test_a_result_names_the_series_version_and_commit_of_its_checkout_and_trees(
    harness_tree, tmp_path
):
    """What each tree was made from travels in trees.json beside it (the device's copy of the
    working tree has no git); the checkout that ran the harness is named where it has git."""
    from moe_kernels.measure import checkout_commit
    from moe_kernels.trees import described

    trees = tmp_path / "trees"
    copy_harness_files(harness_tree, trees / "0.21.0+moe")
    made = {"tree": "vLLM 0.21.0 with the series at commit abc1234", "series_version": "0.2.0"}
    (trees / "trees.json").write_text(
        json.dumps({"0.21.0+moe": {**made, "series_commit": "abc1234"}})
    )
    out = tmp_path / "bench.json"
    args = [f"--tree=p={trees / '0.21.0+moe'}", f"--tree=s={harness_tree}"]
    args += ["--shape", "tiny-smoke-test", "--gemm", "down", "--quant", "tensor", "--M", "1"]
    assert bench.main([*args, "--out", str(out), "--stop-after", "0"]) == 3
    written = json.loads(out.read_text())
    assert written["trees"] == {"p": {**made, "series_commit": "abc1234"}, "s": None}
    assert written["series_version"] == "0.2.0"  # what trees.json says, not moe-patch's own
    assert written["series_commit"] == checkout_commit()
    assert described([f"x={tmp_path / 'nowhere'}"]) == {"x": None}
    # Every tool's header names its trees' fingerprints (jit_sweep's too, which keeps no
    # fingerprints of its own).
    from moe_kernels.measure import record_header

    header = record_header("moe_kernels.jit_sweep", [], [f"s={harness_tree}"])
    assert header["fingerprints"] == {"s": fingerprint(harness_tree)}
    assert header["series_version"] is None  # no trees.json names its series


def test_a_run_comparing_two_series_names_both():
    from moe_kernels.measure import series_of

    made = {"tree": "vLLM 0.21.0 with the series at commit abc1234"}
    trees = {
        "new": {**made, "series_version": "0.3.0"},
        "old": {**made, "series_version": "0.2.0"},
        "release": {"tree": "vLLM 0.21.0 as released"},
        "elsewhere": None,
    }
    assert series_of(trees) == "0.2.0, 0.3.0"
    assert series_of({"release": trees["release"], "elsewhere": None}) is None
