"""Run vLLM's fused-MoE Triton kernel straight from a vLLM source tree.

Only torch and triton are needed; vLLM is never imported.  See kernels/README.md.
"""

from .align import (
    moe_align_block_size,
    naive_block_assignment,
    prepare_expert_assignment,
    use_naive_block_assignment,
)
from .launch import (
    GemmRun,
    fused_moe_gemm,
    invoke_fused_moe_kernel,
    is_interpreted,
    upstream_swap_ab_default,
)
from .layer import LayerRun, fused_moe_layer
from .loader import FUSED_MOE_REL, KernelLoadError, LoadedKernel, load_fused_moe_kernel
from .quant import QUANT_MODES, QuantMode, quantize_activations, quantize_weights
from .reference import (
    dequantize_activations,
    dequantize_weights,
    ref_fp8_moe_gemm,
    ref_moe_gemm,
    ref_moe_layer_float,
    ref_moe_layer_quantized,
    silu_and_mul,
)
from .stats import rel_frobenius_error

__all__ = [
    "FUSED_MOE_REL",
    "QUANT_MODES",
    "GemmRun",
    "KernelLoadError",
    "LayerRun",
    "LoadedKernel",
    "QuantMode",
    "dequantize_activations",
    "dequantize_weights",
    "fused_moe_gemm",
    "fused_moe_layer",
    "invoke_fused_moe_kernel",
    "is_interpreted",
    "load_fused_moe_kernel",
    "moe_align_block_size",
    "naive_block_assignment",
    "prepare_expert_assignment",
    "quantize_activations",
    "quantize_weights",
    "ref_fp8_moe_gemm",
    "ref_moe_gemm",
    "ref_moe_layer_float",
    "ref_moe_layer_quantized",
    "rel_frobenius_error",
    "silu_and_mul",
    "upstream_swap_ab_default",
    "use_naive_block_assignment",
]
