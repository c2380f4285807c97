"""vLLM's own launch-config selection, run from a source tree without importing vLLM.

``config_for(tree, ...)`` answers "which config would this vLLM release launch
fused_moe_kernel with?": the tuned JSON file the tree ships for the device (the
entry nearest to M), else the tree's ``get_default_config``.  The tree's own
``get_config_file_name``, ``get_moe_configs`` and ``get_default_config`` are cut
out of ``fused_moe.py`` with :mod:`ast` and executed against small stand-ins for
``vllm.envs``, ``current_platform`` and the logger (defaults: no batch-invariant
mode, no user config folder, CUDA on Hopper, this process's GPU name).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .loader import CPU_SM_COUNT, FUSED_MOE_REL, lifted_functions, tree_constants

_SELECTION_FUNCTIONS = ("get_config_file_name", "get_moe_configs", "get_default_config")
# Lifted where the tree has them, with the functions they call: the series' changes to
# a default config (the SPLIT_K offer; the narrow weight tile of block-scaled FP8).
_OPTIONAL_FUNCTIONS = ("default_config_split_k", "default_config_decode_tile")


class _QuietLogger:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "NVIDIA H200"


def device_sm_count() -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return CPU_SM_COUNT


@functools.cache
def tree_selection(tree: str, gpu_name: str, config_folder: str | None) -> dict[str, Any]:
    """The tree's own config-selection functions (get_config_file_name, get_moe_configs,
    get_default_config), lifted out of its fused_moe.py and run here for ``gpu_name``."""
    import torch
    import triton

    path = Path(tree) / FUSED_MOE_REL
    source = path.read_text()
    sm_count = device_sm_count()
    lifted = {name: lifted_functions(source, name) for name in _SELECTION_FUNCTIONS}
    missing = [name for name, functions in lifted.items() if not functions]
    if missing:
        raise LookupError(f"{path} has no {', '.join(missing)}")
    for name in _OPTIONAL_FUNCTIONS:
        lifted[name] = lifted_functions(source, name)
    # Decorators (lru_cache) are dropped: ast.get_source_segment starts at "def".
    code = "\n\n".join(dict.fromkeys(f for functions in lifted.values() for f in functions))
    file_name = gpu_name.replace(" ", "_")
    namespace: dict[str, Any] = {
        "__file__": str(path),
        "os": os,
        "json": json,
        "functools": functools,
        "Any": Any,
        "envs": SimpleNamespace(VLLM_BATCH_INVARIANT=False, VLLM_TUNED_CONFIG_FOLDER=config_folder),
        "torch": torch,
        "triton": triton,
        **tree_constants(source),
        "current_platform": SimpleNamespace(
            num_compute_units=lambda *a: sm_count,
            is_rocm=lambda: False,
            is_cuda=lambda: True,
            is_device_capability=lambda capability: capability == 90,  # Hopper, as measured
            get_device_name=lambda *a: gpu_name,
        ),
        "get_device_name_as_file_name": lambda *a: file_name,
        "logger": _QuietLogger(),
    }
    exec(compile(code, str(path), "exec"), namespace)
    # vLLM reads each config file once (get_moe_configs is an lru_cache there; the lifted
    # function lost its decorator): so here too, a file written later is not seen.
    namespace["get_moe_configs"] = functools.cache(namespace["get_moe_configs"])
    return namespace


def config_for(
    tree: str | Path,
    M: int,
    E: int,
    intermediate: int,
    hidden: int,
    topk: int,
    dtype: str | None = "fp8_w8a8",
    block_shape: list[int] | None = None,
    *,
    gpu_name: str | None = None,
    config_folder: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The config vLLM's ``try_get_optimal_moe_config`` picks, and where it came from.

    ``intermediate`` is the down projection's input size (vLLM's ``N`` in config
    file names), ``hidden`` the model's hidden size (the first GEMM's K).
    """
    ns = tree_selection(str(tree), gpu_name or device_name(), config_folder)
    block_n, block_k = (block_shape or (0, 0))[:2]
    configs = ns["get_moe_configs"](E, intermediate, dtype, block_n, block_k)
    if configs:
        nearest = min(configs, key=lambda m: abs(m - M))
        name = ns["get_config_file_name"](E, intermediate, dtype, block_shape)
        return dict(configs[nearest]), f"tuned:{name}[{nearest}]"
    config = dict(ns["get_default_config"](M, E, intermediate, hidden, topk, dtype, block_shape))
    if "default_config_split_k" in ns:  # as the tree's try_get_optimal_moe_config does
        config["SPLIT_K"] = max(config.get("SPLIT_K", 1), ns["default_config_split_k"](dtype))
    if "default_config_decode_tile" in ns:
        config = ns["default_config_decode_tile"](config, dtype, block_shape, M)
    return config, "default"
