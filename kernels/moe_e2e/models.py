"""Model configurations for the end-to-end benchmark: published architectures, four FP8 kinds.

The architecture fields are the models' published ``config.json`` values (Hugging Face model
cards of Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1).  Weights are never fetched: vLLM
fills them with ``load_format="dummy"``, so a model directory holds only ``config.json``.

The FP8 kinds are the forms FP8 MoE checkpoints are published in, plus vLLM's online
quantisation; each reaches a different branch of vLLM's FP8 MoE backend choice:

* ``fp8-static``: ``quant_method: fp8`` with per-tensor weight and static per-tensor activation
  scales (``activation_scheme: static``, as AutoFP8 / many published FP8 checkpoints);
* ``compressed-tensors``: an llm-compressor "FP8-dynamic" checkpoint, per-channel weights and
  dynamic per-token activations (vLLM's ``compressed-tensors`` path);
* ``fp8-dynamic``: a bf16 checkpoint quantised at load (``quantization="fp8"``): per-tensor
  weights, dynamic per-tensor activations;
* ``fp8-block``: 128x128 block weights with dynamic per-group activations
  (``weight_block_size``, as Qwen's and DeepSeek's own FP8 releases).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Published config.json of each architecture (fields vLLM and transformers read).
MODELS: dict[str, dict] = {
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "decoder_sparse_step": 1,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 32000,
    },
}

# Mixtral-8x22B-Instruct-v0.1: the model for tensor parallelism (141 B parameters, about 141 GB
# in FP8: two H200s at TP 2; its TP-4 shard is the harness's mixtral-8x22b-tp4 shape).
MODELS["mixtral-8x22b"] = {
    **MODELS["mixtral-8x7b"],
    "hidden_size": 6144,
    "intermediate_size": 16384,
    "max_position_embeddings": 65536,
    "num_attention_heads": 48,
    "num_hidden_layers": 56,
    "router_aux_loss_coef": 0.001,
    "vocab_size": 32768,
}

# A two-layer Qwen3-MoE small enough to start in seconds: the GPU test's model, not a benchmark.
MODELS["tiny-qwen3-moe"] = {
    **MODELS["qwen3-30b-a3b"],
    # Token ids inside the small vocabulary: vLLM indexes the logits with the EOS id.
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "max_position_embeddings": 4096,
    "max_window_layers": 2,
    "moe_intermediate_size": 256,
    "num_attention_heads": 8,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 8192,
}

COMPRESSED_TENSORS_FP8_DYNAMIC = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "float",
                "strategy": "channel",
                "symmetric": True,
                "dynamic": False,
                "observer": "minmax",
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "symmetric": True,
                "dynamic": True,
            },
            "output_activations": None,
        }
    },
    "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"],
    "kv_cache_scheme": None,
}


@dataclass(frozen=True)
class Fp8Kind:
    """One way an FP8 MoE model reaches vLLM."""

    name: str
    # The checkpoint's quantization_config (None: a bf16 checkpoint).
    checkpoint: dict | None
    # What the engine is told (EngineArgs.quantization), None: read from the checkpoint.
    engine_quantization: str | None
    description: str


FP8_KINDS: dict[str, Fp8Kind] = {
    kind.name: kind
    for kind in (
        Fp8Kind(
            "fp8-static",
            {"quant_method": "fp8", "activation_scheme": "static"},
            None,
            "per-tensor weights, static per-tensor activation scales (fp8 checkpoint)",
        ),
        Fp8Kind(
            "compressed-tensors",
            COMPRESSED_TENSORS_FP8_DYNAMIC,
            None,
            "per-channel weights, dynamic per-token activations (compressed-tensors checkpoint)",
        ),
        Fp8Kind(
            "fp8-dynamic",
            None,
            "fp8",
            "per-tensor weights quantised at load, dynamic per-tensor activations",
        ),
        Fp8Kind(
            "fp8-block",
            {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "weight_block_size": [128, 128],
            },
            None,
            "128x128 block weights, dynamic per-group activations (fp8 checkpoint)",
        ),
    )
}


def model_config(model: str, kind: str) -> dict:
    """The config.json of ``model`` published in FP8 ``kind``."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    if kind not in FP8_KINDS:
        raise ValueError(f"unknown FP8 kind {kind!r}; known: {', '.join(FP8_KINDS)}")
    config = dict(MODELS[model])
    checkpoint = FP8_KINDS[kind].checkpoint
    if checkpoint is not None:
        config["quantization_config"] = checkpoint
    return config


def config_json(model: str, kind: str) -> str:
    """The text of ``model``'s config.json in FP8 ``kind`` (stable key order)."""
    return json.dumps(model_config(model, kind), indent=2, sort_keys=True) + "\n"


def write_model(root: Path, model: str, kind: str) -> Path:
    """Write ``root/<model>-<kind>/config.json`` and return the directory."""
    directory = Path(root) / f"{model}-{kind}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(config_json(model, kind))
    return directory
