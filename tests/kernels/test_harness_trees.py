"""moe_patch.harness_trees: the trees a GPU run of the harness carries, made through
moe-patch's own download path (cached) and applier: each the release's fused-MoE folder and
vllm/_version.py, described in trees.json, which the harness copies into its results."""

from __future__ import annotations

import hashlib
import json

import pytest
from moe_kernels import load_fused_moe_kernel
from moe_kernels.dispatch import config_for
from moe_kernels.loader import FUSED_MOE_REL
from moe_kernels.trees import fingerprint
from moe_patch import __version__
from moe_patch.harness_trees import build_tree, harness_trees, main, split_label

pytestmark = [pytest.mark.network, pytest.mark.release]


def test_each_label_gets_its_fused_moe_folder_and_version_and_nothing_else(tmp_path):
    described = harness_trees(["0.21.0", "0.21.0+moe"], tmp_path / "trees")
    released, patched = tmp_path / "trees" / "0.21.0", tmp_path / "trees" / "0.21.0+moe"
    for tree in (released, patched):
        files = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()}
        assert "vllm/_version.py" in files and FUSED_MOE_REL.as_posix() in files
        assert all(f == "vllm/_version.py" or f.startswith("vllm/model_executor/layers/fused_moe/")
                   for f in files)  # fmt: skip
        load_fused_moe_kernel(tree)  # the harness reads it as it reads a whole tree
    on_disk = json.loads((tmp_path / "trees" / "trees.json").read_text())
    assert on_disk == described
    for label, tree in (("0.21.0", released), ("0.21.0+moe", patched)):
        digest = hashlib.sha256((tree / FUSED_MOE_REL).read_bytes()).hexdigest()
        assert on_disk[label]["fused_moe.py sha256"] == digest
        assert on_disk[label]["fingerprint"] == fingerprint(tree)
    assert on_disk["0.21.0"]["tree"] == "vLLM 0.21.0 as released"
    assert on_disk["0.21.0+moe"]["tree"].startswith("vLLM 0.21.0 with the series at commit ")
    commit = on_disk["0.21.0+moe"]["series_commit"]
    assert on_disk["0.21.0+moe"]["tree"].endswith(commit) and commit != "unknown"
    assert on_disk["0.21.0+moe"]["series_version"] == __version__
    assert "series_commit" not in on_disk["0.21.0"]
    assert on_disk["0.21.0"]["fused_moe.py sha256"] != on_disk["0.21.0+moe"]["fused_moe.py sha256"]
    # The whole tree and its carried part are one tree to a result file
    assert fingerprint(build_tree("0.21.0", tmp_path / "whole")) == on_disk["0.21.0"]["fingerprint"]
    # The patched tree carries the series' H200 tables, the release does not
    args = (72, 128, 768, 2048, 8)
    assert config_for(patched, *args, gpu_name="NVIDIA H200")[1].startswith("tuned:")
    assert config_for(released, *args, gpu_name="NVIDIA H200")[1] == "default"


def test_a_label_is_a_release_or_a_release_with_the_series(capsys):
    assert split_label("0.33.0") == ("0.33.0", "")
    assert split_label("0.33.0+moe") == ("0.33.0", "moe")
    assert split_label("0.33.0+untuned") == ("0.33.0", "untuned")
    with pytest.raises(ValueError, match="X.Y.Z, X.Y.Z\\+moe or X.Y.Z\\+untuned"):
        split_label("0.33.0+mine")
    with pytest.raises(SystemExit) as exc:
        main(["0.33.0+mine", "--out", "unused"])
    assert exc.value.code == 2 and "X.Y.Z+moe or X.Y.Z+untuned" in capsys.readouterr().err


def test_an_untuned_tree_is_the_series_with_the_releases_own_config_files(tmp_path):
    described = harness_trees(["0.21.0", "0.21.0+moe", "0.21.0+untuned"], tmp_path)
    released, patched, untuned = (tmp_path / label for label in described)
    assert (untuned / FUSED_MOE_REL).read_bytes() == (patched / FUSED_MOE_REL).read_bytes()
    configs = FUSED_MOE_REL.parent / "configs"

    def tables(tree):
        return {p.name: p.read_bytes() for p in (tree / configs).iterdir()}

    assert tables(untuned) == tables(released) != tables(patched)
    assert described["0.21.0+untuned"]["tree"].endswith("and 0.21.0's own config files")
    # The series' default configs still serve where the release ships no table
    args = (72, 128, 768, 2048, 8)
    assert config_for(untuned, *args, gpu_name="NVIDIA H200")[1] == "default"
