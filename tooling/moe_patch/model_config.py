"""A MoE layer's shape from a Hugging Face ``config.json`` and a tensor-parallel size.

What ``moe-patch tune`` needs to know of a model: its experts, top-k, hidden size and
the expert intermediate size one tensor-parallel rank holds, and whether its FP8
weights carry 128x128 block scales.  Needs no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

CONFIG_NAME = "config.json"
# The key each field goes by, in the order models name it (DeepSeek, Qwen, Mixtral).
EXPERTS_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
INTERMEDIATE_KEYS = ("moe_intermediate_size", "intermediate_size")


@dataclass(frozen=True)
class MoeShape:
    """One tensor-parallel rank's MoE layer: ``intermediate`` is already divided by tp."""

    name: str
    experts: int
    topk: int
    hidden: int
    intermediate: int
    quant: str  # "block" where config.json's quantization_config has weight_block_size
    # calibrated activation scales (quantization_config's activation_scheme "static")
    static_activations: bool = False


def config_path(model: Path) -> Path:
    """``model`` itself, or the config.json in the folder ``model``."""
    path = model / CONFIG_NAME if model.is_dir() else model
    if not path.is_file():
        raise UsageError(f"no {CONFIG_NAME} at {path}: name a model's config.json or its folder")
    return path


def _positive_int(config: dict, keys: tuple[str, ...], path: Path) -> int:
    for key in keys:
        if key in config:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{path}: {key} is {value!r}, not a positive integer")
            return value
    raise UsageError(f"{path} has no {' or '.join(keys)}: is it a MoE model's {CONFIG_NAME}?")


def moe_shape(model: Path, tp: int) -> MoeShape:
    """The MoE shape one of ``tp`` tensor-parallel ranks runs; a one-line UsageError naming
    the key for a config.json that is not a MoE model's."""
    path = config_path(model)
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} is not a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict) and not any(key in config for key in EXPERTS_KEYS):
        # A multimodal model keeps its language model's MoE shape under text_config.
        config = {"quantization_config": config.get("quantization_config"), **text}
    if tp < 1:
        raise UsageError(f"--tp {tp}: the tensor-parallel size is 1 or more")
    intermediate = _positive_int(config, INTERMEDIATE_KEYS, path)
    if intermediate % tp:
        raise UsageError(
            f"{path}: the intermediate size {intermediate} does not split into {tp} "
            "tensor-parallel ranks; pick a --tp that divides it"
        )
    quantization = config.get("quantization_config")
    block = isinstance(quantization, dict) and "weight_block_size" in quantization
    return MoeShape(
        name=f"{path.parent.name or 'model'}-tp{tp}",
        experts=_positive_int(config, EXPERTS_KEYS, path),
        topk=_positive_int(config, ("num_experts_per_tok",), path),
        hidden=_positive_int(config, ("hidden_size",), path),
        intermediate=intermediate // tp,
        quant="block" if block else "tensor",
        static_activations=isinstance(quantization, dict)
        and quantization.get("activation_scheme") == "static",
    )
