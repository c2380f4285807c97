"""Calls a vLLM tree's own ``select_fp8_moe_backend`` for a batch of scenarios.

Not a test module: the oracle tests run it with the Python of a release's test
environment (``venvs.py``) and the vLLM source tree first on ``PYTHONPATH``::

    python driver.py request.json answer.json

request: ``{"flashinfer": bool, "scenarios": [scenario, ...]}``; a scenario:
``{"id", "capability": 90, "weight": "kFp8StaticTensorSym" | null,
"activation": ... | null, "ep": "none" | "allgather" | "deepep_ll",
"moe_backend": "auto", "env": {"VLLM_FP8_MOE_BACKEND": "triton" | null},
"allow_vllm_cutlass": bool}``.  answer: ``{id: {"backend", "experts", "log"}
| {"error", "log"}}``.

The tree is imported from source, without its compiled extensions, on a machine
without a GPU.  Four stand-ins make it see an NVIDIA GPU; each is installed
before vLLM's modules are imported, and nothing else is replaced:

1. ``vllm._C`` and ``vllm._C_stable_libtorch`` (the compiled extensions,
   imported by ``vllm/platforms/cuda.py`` only to register custom ops) and,
   for newer trees, ``vllm.vllm_flash_attn._vllm_fa2_C`` (imported on CUDA by
   the attention modules on the import path) are empty modules.  Of their ops, only the CUTLASS capability queries are
   provided, answering as a CUDA 12.8+ build does (``CUTLASS_SUPPORT``
   below).  Backend selection asks one of them,
   ``cutlass_group_gemm_supported`` (vLLM's own wrapper still refuses < 90 and
   >= 110 before asking); the others are read when modules on the import path
   are loaded, for dense layers.
2. ``vllm.platforms.current_platform`` is vLLM's real CUDA platform class
   (``vllm.platforms.cuda.CudaPlatform``); only its
   ``get_device_capability`` is replaced, to return the scenario's compute
   capability instead of querying a device.  Every capability test vLLM makes
   (``is_device_capability``, ``has_device_capability``, ``supports_fp8``,
   ``is_device_capability_family``) derives from it.
3. FlashInfer present (``"flashinfer": true``): every ``has_flashinfer*``
   availability helper in ``vllm/utils/flashinfer.py`` returns True, as they
   do where vLLM's CUDA requirements installed flashinfer-python and
   flashinfer-cubin.  FlashInfer absent: nothing is replaced (the package is
   not installed here, so the helpers really answer False).
4. None for DeepGEMM: it is not in vLLM's CUDA requirements and not installed
   here, so it is absent, as on a default install.

Scenarios run one after another in this process: the environment variables a
scenario names are set (``null`` unsets), the capability stand-in is switched,
and vLLM's ``*_once`` log de-duplication caches are cleared so that each
scenario logs its own selection line.  (Checked on 0.21.0 and 0.33.0: the
answers equal those of one process per capability, in either order, so no
capability-dependent cache leaks between scenarios.)

Two more settings belong to the harness, not to the GPU: newer trees read
``get_current_vllm_config()`` during selection, so each call runs inside a
default ``VllmConfig`` (an engine without a model), and the oracle's logger is
set to INFO, vLLM's default level, which newer trees only configure when an
engine starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import logging
import os
import sys
import types
import typing

ORACLE = "vllm.model_executor.layers.fused_moe.oracle.fp8"
# 0.34.0 on: the shared oracle base logs a backend requested by name (return_or_raise).
ORACLE_BASE = "vllm.model_executor.layers.fused_moe.oracle.base"
CAPABILITY = [(9, 0)]  # switched per scenario; read by the platform stand-in

COMPILED_EXTENSIONS = (
    "vllm._C",
    "vllm._C_stable_libtorch",
    "vllm.vllm_flash_attn._vllm_fa2_C",
)

# torch.ops._C capability queries -> the lowest compute capability for which a
# CUDA 12.8+ build of vLLM answers True (csrc/quantization/.../scaled_mm_entry.cu).
CUTLASS_SUPPORT = {
    "cutlass_group_gemm_supported": 90,
    "cutlass_scaled_mm_supports_fp8": 89,
    "cutlass_scaled_mm_supports_block_fp8": 90,
    "cutlass_scaled_mm_supports_fp4": 100,
}


class _EmptyExtensions(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stand-in 1: serves the compiled extension modules as empty modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in COMPILED_EXTENSIONS:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        module.__doc__ = "moe-patch oracle test stand-in for a compiled extension"


def install_stand_ins(flashinfer: bool) -> None:
    sys.meta_path.insert(0, _EmptyExtensions())

    import torch

    # Stand-in 1 (continued): the compiled capability queries.
    for op, lowest in CUTLASS_SUPPORT.items():
        setattr(torch.ops._C, op, lambda capability, lowest=lowest: capability >= lowest)

    # Stand-in 2: the real CUDA platform, told which GPU it is on.
    import vllm.platforms
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    def get_device_capability(cls, device_id: int = 0):
        major, minor = CAPABILITY[0]
        return DeviceCapability(major=major, minor=minor)

    cuda.CudaPlatform.get_device_capability = classmethod(get_device_capability)
    vllm.platforms._current_platform = cuda.CudaPlatform()

    # Stand-in 3: FlashInfer installed.
    if flashinfer:
        import vllm.utils.flashinfer as fi

        for name in dir(fi):
            if name.startswith("has_flashinfer") and callable(getattr(fi, name)):
                setattr(fi, name, lambda *args, **kwargs: True)


def clear_log_once_caches() -> None:
    import vllm.logger

    for value in vars(vllm.logger).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


def quant_key(name: str | None):
    if name is None:
        return None
    from vllm.model_executor.layers.quantization.utils import quant_utils

    return getattr(quant_utils, name)


def parallel_config(ep: str):
    from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

    base = FusedMoEParallelConfig.make_no_parallel()
    if ep == "none":
        return base
    # Two data-parallel ranks with --enable-expert-parallel: each holds half
    # of the experts; "deepep_ll" uses the batched activation format.
    backend = {"allgather": "allgather_reducescatter", "deepep_ll": "deepep_low_latency"}[ep]
    return dataclasses.replace(base, dp_size=2, ep_size=2, use_ep=True, all2all_backend=backend)


def moe_config(scenario: dict):
    """A FusedMoEConfig shaped like Qwen3-30B-A3B, built from the tree's own
    field list (the required fields differ between releases)."""
    import torch
    from vllm.model_executor.layers.fused_moe import config as config_module
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig

    parallel = parallel_config(scenario["ep"])
    hints = typing.get_type_hints(FusedMoEConfig, vars(config_module))
    values = {
        "num_experts": 128,
        "experts_per_token": 8,
        "hidden_dim": 2048,
        "intermediate_size": 768,
        "intermediate_size_per_partition": 768,
        "num_local_experts": 128 // parallel.ep_size,
        "num_logical_experts": 128,
        "device": "cuda",
        "moe_parallel_config": parallel,
        "in_dtype": torch.bfloat16,
        "moe_backend": scenario["moe_backend"],
    }
    members = {"activation": "SILU", "routing_method": "Renormalize"}
    kwargs = {}
    for field in dataclasses.fields(FusedMoEConfig):
        if not field.init:
            continue
        if field.name in values:
            kwargs[field.name] = values[field.name]
        elif field.name in members:
            kwargs[field.name] = hints[field.name][members[field.name]]
        elif field.default is dataclasses.MISSING and (
            field.default_factory is dataclasses.MISSING
        ):
            raise TypeError(f"FusedMoEConfig needs a value for {field.name}")
    return FusedMoEConfig(**kwargs)


_VLLM_CONFIG = []


def vllm_config_context():
    """Newer trees ask get_current_vllm_config() during selection, as inside a
    running engine; a default VllmConfig stands for an engine without a model."""
    from vllm.config import VllmConfig, set_current_vllm_config

    if not _VLLM_CONFIG:
        _VLLM_CONFIG.append(VllmConfig())
    return set_current_vllm_config(_VLLM_CONFIG[0])


def run(scenario: dict, log: io.StringIO) -> dict:
    oracle = importlib.import_module(ORACLE)

    CAPABILITY[0] = tuple(divmod(scenario["capability"], 10))
    for name, value in scenario.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    clear_log_once_caches()
    log.seek(0)
    log.truncate()
    try:
        with vllm_config_context():
            backend, experts = oracle.select_fp8_moe_backend(
                config=moe_config(scenario),
                weight_key=quant_key(scenario["weight"]),
                activation_key=quant_key(scenario["activation"]),
                allow_vllm_cutlass=scenario["allow_vllm_cutlass"],
            )
    except Exception as error:  # the answer records what vLLM raised
        return {"error": f"{type(error).__name__}: {error}", "log": log.getvalue()}
    return {
        "backend": backend.value,
        "experts": experts.__name__ if experts is not None else None,
        "log": log.getvalue(),
    }


def main() -> None:
    request_path, answer_path = sys.argv[1:3]
    with open(request_path) as handle:
        request = json.load(handle)
    for name in ("VLLM_FP8_MOE_BACKEND", "VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"):
        os.environ.pop(name, None)
    install_stand_ins(request["flashinfer"])

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    # Only the oracle's own lines: which backend, out of which, and why.  INFO
    # is vLLM's default level; newer trees configure it when an engine starts.
    for name in (ORACLE, ORACLE_BASE):
        oracle_logger = logging.getLogger(name)
        oracle_logger.addHandler(handler)
        oracle_logger.setLevel(logging.INFO)

    answer = {scenario["id"]: run(scenario, log) for scenario in request["scenarios"]}
    with open(answer_path, "w") as handle:
        json.dump(answer, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
