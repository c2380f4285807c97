"""``moe-patch tune``'s inputs: the model's config.json and the command's one-line errors.

No torch is needed: every case here fails (or is parsed) before the kernels are imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch.cli import main
from moe_patch.errors import EXIT_USAGE, UsageError
from moe_patch.model_config import MoeShape, moe_shape

DEEPSEEK_LIKE = {
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "hidden_size": 7168,
    "moe_intermediate_size": 2048,
    "intermediate_size": 18432,  # the dense layers': moe_intermediate_size wins
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}
MIXTRAL_LIKE = {
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 4096,
    "intermediate_size": 14336,
}


def write_model(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_shape_from_a_model_folder_divides_the_intermediate_size_by_tp(tmp_path):
    model = write_model(tmp_path / "DeepSeek-V3", DEEPSEEK_LIKE)
    assert moe_shape(model, 8) == MoeShape("DeepSeek-V3-tp8", 256, 8, 7168, 256, "block")


def test_shape_from_a_config_file_without_block_scales_is_per_tensor(tmp_path):
    model = write_model(tmp_path / "Mixtral", MIXTRAL_LIKE)
    assert moe_shape(model / "config.json", 2) == MoeShape(
        "Mixtral-tp2", 8, 2, 4096, 7168, "tensor"
    )


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("num_local_experts", "n_routed_experts or num_experts or num_local_experts"),
        ("num_experts_per_tok", "num_experts_per_tok"),
        ("hidden_size", "hidden_size"),
        ("intermediate_size", "moe_intermediate_size or intermediate_size"),
    ],
)
def test_a_missing_key_is_named(tmp_path, drop, named):
    model = write_model(tmp_path / "m", {k: v for k, v in MIXTRAL_LIKE.items() if k != drop})
    with pytest.raises(UsageError, match=f"has no {named}:"):
        moe_shape(model, 1)


@pytest.mark.parametrize("value", ["8", 0, -2, True, None])
def test_a_bad_value_is_named_with_its_key(tmp_path, value):
    model = write_model(tmp_path / "m", {**MIXTRAL_LIKE, "hidden_size": value})
    with pytest.raises(UsageError, match=r"hidden_size is .*, not a positive integer"):
        moe_shape(model, 1)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_a_config_that_is_not_a_json_object_is_refused(tmp_path, text):
    (tmp_path / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(UsageError, match="is not (JSON|a JSON object)"):
        moe_shape(tmp_path, 1)


def tune(*args):
    return CliRunner().invoke(main, ["tune", *args])


def assert_one_line_usage_error(result, *words):
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line]
    assert line.startswith("moe-patch: error: ")
    for word in words:
        assert word in line


def test_a_model_without_config_json_is_one_line(tmp_path):
    result = tune("--model", str(tmp_path), "--tree", str(tmp_path), "--out", str(tmp_path / "o"))
    assert_one_line_usage_error(result, "no config.json at", str(tmp_path / "config.json"))


def test_a_tp_that_does_not_divide_the_intermediate_size_is_one_line(tmp_path):
    model = write_model(tmp_path / "m", MIXTRAL_LIKE)
    result = tune(
        "--model", str(model), "--tp", "3", "--tree", str(tmp_path), "--out", str(tmp_path / "o")
    )
    assert_one_line_usage_error(result, "intermediate size 14336", "3 tensor-parallel ranks")


def test_without_the_kernels_extra_it_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "moe_kernels", None)  # import moe_kernels: ImportError
    model = write_model(tmp_path / "m", MIXTRAL_LIKE)
    result = tune("--model", str(model), "--tree", str(tmp_path), "--out", str(tmp_path / "o"))
    assert_one_line_usage_error(result, "pip install 'moe-patch[kernels]'")


def test_without_a_gpu_it_says_where_to_run_it(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = write_model(tmp_path / "m", MIXTRAL_LIKE)
    result = tune("--model", str(model), "--tree", str(tmp_path), "--out", str(tmp_path / "o"))
    assert_one_line_usage_error(result, "times kernels on a CUDA GPU and torch sees none here")
    assert not (tmp_path / "o").exists()


def test_a_folder_that_is_not_a_vllm_tree_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # past the GPU check on a CPU machine
    model = write_model(tmp_path / "m", MIXTRAL_LIKE)
    result = tune("--model", str(model), "--tree", str(tmp_path), "--out", str(tmp_path / "o"))
    assert_one_line_usage_error(result, "is not a vLLM source tree")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["1,x", "0,2", ","])
def test_bad_token_counts_are_refused(tmp_path, value):
    model = write_model(tmp_path / "m", MIXTRAL_LIKE)
    result = tune("--model", str(model), "--tree", str(tmp_path), "--M", value, "--out", "o")
    assert result.exit_code == EXIT_USAGE and "Invalid value for '--M'" in result.output


def test_a_multimodal_config_gives_its_language_models_shape(tmp_path):
    nested = {
        "architectures": ["SomeVisionMoeForConditionalGeneration"],
        "text_config": {**MIXTRAL_LIKE, "intermediate_size": 1536, "num_local_experts": 128},
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    shape = moe_shape(write_model(tmp_path / "vl", nested), 2)
    assert (shape.experts, shape.topk, shape.hidden, shape.intermediate, shape.quant) == (
        128, 2, 4096, 768, "block"
    )  # fmt: skip
