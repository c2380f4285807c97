"""``moe-patch wheel`` and ``apply --installed`` on the real vLLM 0.21.0 wheel.

The official wheel (≈250 MB) is downloaded once through pip into moe-patch's cache;
with a warm cache this module takes about a minute (two builds, two pip installs,
and hashing ≈550 MB of installed files a few times).
"""

import time
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import __version__, cache
from moe_patch.cli import main
from moe_patch.commands.apply import apply as apply_tree
from moe_patch.commands.wheel import wheel as build_wheel
from support import tree_digest
from wheel_support import pip_install, record_problems, zip_record_problems

pytestmark = [pytest.mark.release, pytest.mark.network]

VERSION = "0.21.0"
_CONFIGS = "vllm/model_executor/layers/fused_moe/configs/"
# Files the series changes in 0.21.0: code, and swap-ab's H200 tables (three of
# them replace entries of tables vLLM ships, five are new); triton-moe-warmup and fused-decode
# add a module each.
PATCHED = sorted(
    [
        "vllm/envs.py",
        "vllm/model_executor/layers/fused_moe/fused_moe.py",
        "vllm/model_executor/layers/fused_moe/modular_kernel.py",
        "vllm/model_executor/layers/fused_moe/oracle/fp8.py",
        "vllm/v1/worker/gpu_worker.py",
        _CONFIGS + "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        _CONFIGS + "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        _CONFIGS + "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
    ]
)
ADDED = sorted(
    [
        *(
            _CONFIGS + name
            for name in (
                "E=128,N=1536,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
                "E=128,N=1536,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
                "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
                "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
                "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
            )
        ),
        "vllm/model_executor/layers/fused_moe/fused_moe_decode.py",
        "vllm/model_executor/warmup/triton_moe_warmup.py",
    ]
)
WARM_LIMIT_S = 60


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The patched wheel, built twice from the same inputs (the second on a warm cache)."""
    first = build_wheel("0.21", tmp_path_factory.mktemp("first"))
    started = time.monotonic()
    second = build_wheel("0.21", tmp_path_factory.mktemp("second"))
    return first, second, time.monotonic() - started


@pytest.fixture(scope="module")
def official(built):
    return cache.root() / "wheels" / built[0].source


def test_warm_build_is_fast_and_named_right(built):
    first, _, warm = built
    assert warm < WARM_LIMIT_S, f"a warm wheel build took {warm:.1f} s"
    assert first.version == f"{VERSION}+moe.{__version__}"
    assert first.source == "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl"
    assert first.path.endswith(
        f"vllm-{VERSION}+moe.{__version__}-1-cp38-abi3-manylinux_2_24_x86_64.whl"
    )
    # every patch of the series that serves 0.21 (v0.20.0/), in its order
    served = (Path(__file__).resolve().parents[2] / "patches" / "v0.20.0" / "series").read_text()
    assert [p["id"] for p in first.patches] == [
        line.removesuffix(".patch") for line in served.split() if not line.startswith("#")
    ]
    assert [p["status"] for p in first.patches] == ["applied"] * len(first.patches)
    assert sorted(f["path"] for f in first.files if f["change"] == "modified") == PATCHED
    assert sorted(f["path"] for f in first.files if f["change"] == "added") == ADDED


def test_same_inputs_give_the_same_bytes(built):
    first, second, _ = built
    assert first.sha256 == second.sha256
    with open(first.path, "rb") as a, open(second.path, "rb") as b:
        assert a.read() == b.read()


def test_every_record_hash_verifies_and_compiled_files_are_untouched(built, official):
    path = built[0].path
    assert zip_record_problems(path) == []
    with zipfile.ZipFile(official) as before, zipfile.ZipFile(path) as after:
        old = {i.filename: i for i in before.infolist()}
        new = {i.filename: i for i in after.infolist()}
        for name, info in old.items():
            if ".dist-info/" in name or name in PATCHED or name == "vllm/_version.py":
                continue
            moved = new[name]
            assert (moved.CRC, moved.file_size, moved.compress_size) == (
                info.CRC,
                info.file_size,
                info.compress_size,
            ), name
        assert any(n.endswith(".so") for n in old)


def test_installs_with_pip_and_holds_the_patched_files(built, tmp_path):
    site = pip_install(built[0].path, tmp_path / "site")
    assert record_problems(site) == []
    apply_tree(VERSION, tmp_path / "tree")  # the tree `moe-patch apply` makes
    for path in PATCHED:
        assert (site / path).read_bytes() == (tmp_path / "tree" / path).read_bytes(), path
    assert f"'{VERSION}+moe.{__version__}'" in (site / "vllm/_version.py").read_text()


def test_installed_apply_and_revert_round_trip(official, tmp_path):
    site = pip_install(official, tmp_path / "site")
    before = tree_digest(site)
    runner = CliRunner()
    result = runner.invoke(main, ["apply", "--installed", "--target", str(site)])
    assert result.exit_code == 0, result.output
    assert record_problems(site) == []
    status = runner.invoke(main, ["status", "--installed", "--target", str(site)])
    assert f"vLLM {VERSION} at {site}/vllm-{VERSION}.dist-info: patched" in status.stdout
    assert "VLLM_FP8_MOE_BACKEND" in (site / "vllm/envs.py").read_text()
    result = runner.invoke(main, ["revert", "--installed", "--target", str(site)])
    assert result.exit_code == 0, result.output
    assert tree_digest(site) == before
