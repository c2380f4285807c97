"""Launch a loaded ``fused_moe_kernel`` with keyword arguments built from its signature.

:func:`invoke_fused_moe_kernel` mirrors vLLM's ``invoke_fused_moe_triton_kernel``
(0.20 .. 0.33) but passes every argument by name, so it works with any tree whose
kernel keeps the parameter names, and it fails loudly on a parameter it does not
know instead of shifting positional arguments.

:func:`fused_moe_gemm` is the one-call convenience used by the tests: it quantises
float activations, aligns the routing and launches the kernel into a
NaN-poisoned output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from . import interpreter_compat
from .align import prepare_expert_assignment
from .loader import LoadedKernel
from .quant import QuantMode, quantize_activations

# Launch options Triton takes next to the kernel's own arguments.
LAUNCH_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})


def is_interpreted(loaded: LoadedKernel) -> bool:
    """Whether the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return type(loaded.kernel).__name__ == "InterpretedFunction"


def compute_type_for(dtype: torch.dtype):
    import triton.language as tl

    table = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"unsupported output dtype {dtype}") from None


def upstream_swap_ab_default(
    use_fp8_w8a8: bool, block_size_m: int, block_size_n: int, device: torch.device
) -> bool:
    """vLLM's ``enable_swap_ab`` rule (0.25+): FP8 on SM90 with M < 64 <= N tiles."""
    return (
        use_fp8_w8a8
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device) == (9, 0)
        and block_size_m < 64
        and block_size_n >= 64
    )


def token_rows_launched(rows: int, top_k: int, block_m: int, sorted_len: int | None) -> int:
    """vLLM's ``EM``: padded token rows the grid covers, for ``rows`` rows of A.

    ``sorted_len`` is the length of ``sorted_token_ids`` (None: the naive
    one-token-per-block path)."""
    if sorted_len is None:
        return rows * top_k * block_m
    if rows < block_m:
        # upstream's small-batch shortcut: at most rows * top_k non-empty blocks
        return min(sorted_len, rows * top_k * block_m)
    return sorted_len


# The swap-ab patch's SPLIT_K_MIN_SLICE_STEPS.
SPLIT_K_MIN_SLICE_STEPS = 8


def patched_split_k(
    use_fp8_w8a8: bool, split_k: int, programs: int, k_steps: int, sm_count: int | None
) -> int:
    """The swap-ab patch's ``split_k_for`` rule: a config's SPLIT_K (FP8 only) is
    honoured while the grid has fewer programs than the GPU has SMs, or fewer than
    one and a half times as many with at least ``SPLIT_K_MIN_SLICE_STEPS`` K steps per
    slice.  Without CUDA (``sm_count`` None: the interpreter) it is always honoured.
    On a GPU the launcher runs the tree's own rule instead (``LoadedKernel.split_k_rule``);
    this copy serves trees without one and the tests that compare the two."""
    if not use_fp8_w8a8 or split_k <= 1:
        return 1
    if sm_count is None or programs < sm_count:
        return split_k
    if 2 * programs < 3 * sm_count and k_steps >= SPLIT_K_MIN_SLICE_STEPS * split_k:
        return split_k
    return 1


def patched_pipeline_depth(num_stages: int, k: int, block_k: int, split_k: int) -> int:
    """moe-patch's ``pipeline_depth_for`` rule: a Swap-AB launch pipelines its K
    loop over no more stages than the loop has steps, and never fewer than two."""
    return min(num_stages, max(2, _cdiv(_cdiv(k, block_k), split_k)))


# The swap-ab patch's SM90 shared-memory budget (resident_depth_for).
SM90_SHARED_MEMORY_PER_SM = 228 * 1024
SHARED_MEMORY_RESERVED_PER_PROGRAM = 1024
MIN_RESIDENT_STAGES = 3


def patched_resident_depth(num_stages: int, programs: int, stage_bytes: int, sm_count: int) -> int:
    """The swap-ab patch's ``resident_depth_for`` rule: a Swap-AB launch whose grid does
    not fit on the GPU at once drops pipeline stages (never below ``MIN_RESIDENT_STAGES``)
    where fewer make every program resident.  On a GPU the launcher runs the tree's own
    rule (``LoadedKernel.resident_depth_rule``); this copy serves the tests that compare."""

    def resident(stages: int) -> bool:
        per_sm = SM90_SHARED_MEMORY_PER_SM // (
            stages * stage_bytes + SHARED_MEMORY_RESERVED_PER_PROGRAM
        )
        return programs <= per_sm * sm_count

    if resident(num_stages):
        return num_stages
    for stages in range(num_stages - 1, MIN_RESIDENT_STAGES - 1, -1):
        if resident(stages):
            return stages
    return num_stages


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def invoke_fused_moe_kernel(
    loaded: LoadedKernel,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A_scale: torch.Tensor | None,
    B_scale: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    sorted_token_ids: torch.Tensor | None,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    mul_routed_weight: bool,
    top_k: int,
    config: dict[str, Any],
    *,
    compute_type=None,
    use_fp8_w8a8: bool = False,
    use_int8_w8a8: bool = False,
    use_int8_w8a16: bool = False,
    per_channel_quant: bool = False,
    block_shape: list[int] | tuple[int, int] | None = None,
    B_bias: torch.Tensor | None = None,
    swap_ab: bool | None = None,
    use_td: bool | None = None,
    extra_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Launch ``loaded.kernel`` like vLLM's ``invoke_fused_moe_triton_kernel``.

    Shapes: ``A (M, K)``, ``B (E, N, K)``, ``C (M, top_k, N)`` (for the second
    GEMM of a layer ``A`` has ``M * topk`` rows, ``top_k=1`` and ``C`` is
    ``(M, topk, N)``).  ``config`` holds ``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M`` and
    optionally ``num_warps`` / ``num_stages`` and ``SPLIT_K`` (> 1 only on a
    kernel that implements it: :attr:`LoadedKernel.has_split_k`).

    ``swap_ab``: ``None`` applies upstream's rule (FP8, SM90, BLOCK_SIZE_M < 64 and
    BLOCK_SIZE_N >= 64) when the kernel has ``SWAP_AB``; ``True``/``False`` force
    it; ``True`` on a kernel without ``SWAP_AB`` raises.  ``use_td`` likewise for
    0.33's ``USE_TD`` (default: the parameter's default, False).  ``extra_args``
    fills parameters this launcher does not know (added by a patch, say) and may
    override any computed one.

    Returns the keyword arguments the kernel was launched with (tensors included)
    plus ``"grid"``.
    """
    params = loaded.signature.parameters
    extra_args = dict(extra_args or {})

    assert topk_weights is not None or not mul_routed_weight
    assert topk_weights is None or topk_weights.stride(1) == 1
    assert sorted_token_ids is None or sorted_token_ids.stride(0) == 1
    if use_fp8_w8a8 or use_int8_w8a8:
        assert B_scale is not None
        if block_shape is not None:
            assert _cdiv(B.size(-2), block_shape[0]) == B_scale.size(-2)
            assert _cdiv(B.size(-1), block_shape[1]) == B_scale.size(-1)
    elif use_int8_w8a16:
        assert B_scale is not None
    else:
        assert A_scale is None and B_scale is None

    if compute_type is None:
        compute_type = compute_type_for(C.dtype)

    block_m = config["BLOCK_SIZE_M"]
    M = A.size(0)
    num_tokens = M * top_k
    sorted_len = None if sorted_token_ids is None else sorted_token_ids.size(0)
    EM = token_rows_launched(M, top_k, block_m, sorted_len)
    N = B.size(1)

    cfg = dict(config)
    # A default config of the series may offer its launches a narrow weight tile; the
    # tree's own rule takes it or not, per launch, as the tree's launcher does.
    narrow_stages = cfg.pop("NARROW_TILE_STAGES", None)
    rule = loaded.narrow_tile_rule
    if (
        narrow_stages is not None
        and rule is not None
        and rule(cfg, narrow_stages, EM, num_tokens, B, A.device)
    ):
        cfg["BLOCK_SIZE_N"], cfg["num_stages"] = loaded.narrow_block_n, narrow_stages
    block_n = cfg["BLOCK_SIZE_N"]
    block_k = cfg.pop("BLOCK_SIZE_K")
    programs = _cdiv(EM, block_m) * _cdiv(N, block_n)
    named_split = cfg.pop("SPLIT_K", None)
    split_k = 1 if named_split is None else int(named_split)
    if split_k > 1 and not loaded.has_split_k:
        raise ValueError(f"the kernel in {loaded.tree} does not implement SPLIT_K > 1")
    k_steps = _cdiv(B.size(2), block_k)  # the config's K tile, as the patch's launcher counts
    sm_count = (
        torch.cuda.get_device_properties(A.device).multi_processor_count if A.is_cuda else None
    )
    if named_split is None and sm_count is not None and loaded.fill_split_rule is not None:
        # A tuned entry that names no SPLIT_K: on a GPU the tree's launcher splits it only
        # to fill an under-filled GPU, by its own rule.  In the interpreter such a config
        # launches unsplit, as the harness's configs without SPLIT_K always have.
        swaps = "SWAP_AB" in params and (
            swap_ab
            if swap_ab is not None
            else upstream_swap_ab_default(use_fp8_w8a8, block_m, block_n, A.device)
        )
        split_k = loaded.fill_split_rule(use_fp8_w8a8, bool(swaps), programs, A.device)
    elif sm_count is not None and loaded.split_k_rule is not None:
        split_k = loaded.split_k_rule(use_fp8_w8a8, split_k, programs, k_steps, A.device)
    else:
        split_k = patched_split_k(use_fp8_w8a8, split_k, programs, k_steps, sm_count)
    if split_k > 1:
        C.zero_()  # the K slices add their partial tiles atomically
    grid = (programs, split_k)
    if block_shape is not None:
        block_k = min(block_k, min(block_shape[0], block_shape[1]))
    launch_opts = {k: cfg.pop(k) for k in list(cfg) if k in LAUNCH_OPTIONS}

    # vLLM passes a 0-d per-tensor scale as a pointer; Triton would treat it as a scalar.
    if A_scale is not None and A_scale.ndim == 0:
        A_scale = A_scale.reshape(1)

    def s(t: torch.Tensor | None, dim: int, cond: bool = True) -> int:
        return t.stride(dim) if t is not None and cond else 0

    values: dict[str, Any] = {
        "a_ptr": A,
        "b_ptr": B,
        "c_ptr": C,
        "b_bias_ptr": B_bias,
        "a_scale_ptr": A_scale,
        "b_scale_ptr": B_scale,
        "topk_weights_ptr": topk_weights,
        "sorted_token_ids_ptr": sorted_token_ids,
        "expert_ids_ptr": expert_ids,
        "num_tokens_post_padded_ptr": num_tokens_post_padded,
        "N": N,
        "K": B.size(2),
        "EM": EM,
        "num_valid_tokens": num_tokens,
        "stride_am": A.stride(0),
        "stride_ak": A.stride(1),
        "stride_be": B.stride(0),
        "stride_bk": B.stride(2),
        "stride_bn": B.stride(1),
        "stride_cm": C.stride(1),
        "stride_cn": C.stride(2),
        "stride_asm": s(A_scale, 0, A_scale is not None and A_scale.ndim == 2),
        "stride_ask": s(A_scale, 1, A_scale is not None and A_scale.ndim == 2),
        "stride_bse": s(B_scale, 0, B_scale is not None and B_scale.ndim >= 2),
        "stride_bsk": s(B_scale, 2, B_scale is not None and B_scale.ndim == 3),
        "stride_bsn": s(B_scale, 1, B_scale is not None and B_scale.ndim >= 2),
        "stride_bbe": s(B_bias, 0),
        "stride_bbn": s(B_bias, 1),
        "group_n": 0 if block_shape is None else block_shape[0],
        "group_k": 0 if block_shape is None else block_shape[1],
        "naive_block_assignment": sorted_token_ids is None,
        "BLOCK_SIZE_K": block_k,
        "SPLIT_K": split_k,
        "MUL_ROUTED_WEIGHT": mul_routed_weight,
        "top_k": top_k,
        "compute_type": compute_type,
        "use_fp8_w8a8": use_fp8_w8a8,
        "use_int8_w8a8": use_int8_w8a8,
        "use_int8_w8a16": use_int8_w8a16,
        "per_channel_quant": per_channel_quant,
        "HAS_BIAS": B_bias is not None,
    }
    values.update(cfg)  # BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M, ...

    if "SWAP_AB" in params:
        if swap_ab is None:
            swap_ab = upstream_swap_ab_default(use_fp8_w8a8, block_m, block_n, A.device)
        values["SWAP_AB"] = bool(swap_ab)
    elif swap_ab:
        raise ValueError(f"the kernel in {loaded.tree} has no SWAP_AB parameter")
    if values.get("SWAP_AB") and loaded.caps_pipeline_depth and "num_stages" in launch_opts:
        launch_opts["num_stages"] = patched_pipeline_depth(
            launch_opts["num_stages"], B.size(2), block_k, split_k
        )
    rule = loaded.resident_depth_rule if sm_count is not None else None
    if values.get("SWAP_AB") and rule is not None and "num_stages" in launch_opts:
        stage_bytes = (block_m + block_n) * block_k * B.element_size()
        launch_opts["num_stages"] = rule(
            launch_opts["num_stages"], programs * split_k, stage_bytes, A.device
        )
    if "USE_TD" in params:
        if use_td is not None:
            values["USE_TD"] = bool(use_td)
    elif use_td:
        raise ValueError(f"the kernel in {loaded.tree} has no USE_TD parameter")

    # 0.34+: tensor descriptors for the TMA loads of A and B, which vLLM's launcher builds
    # for block FP8 on Hopper; the harness launches the pointer path (USE_TMA_* off).
    for descriptor in ("a_desc", "b_desc"):
        if descriptor in params:
            values[descriptor] = None

    values.update(extra_args)
    kwargs: dict[str, Any] = {}
    missing = []
    for name, p in params.items():
        if name in values:
            kwargs[name] = values[name]
        elif p.default is inspect.Parameter.empty:
            missing.append(name)
    if missing:
        raise TypeError(
            f"fused_moe_kernel in {loaded.tree} has parameters this launcher does "
            f"not fill: {missing}; pass them through extra_args"
        )
    unknown = [k for k in extra_args if k not in params and k not in LAUNCH_OPTIONS]
    if unknown:
        raise TypeError(f"extra_args not in the kernel's signature: {unknown}")
    launch_opts.update({k: v for k, v in extra_args.items() if k in LAUNCH_OPTIONS})

    if is_interpreted(loaded):
        interpreter_compat.apply()
    loaded.kernel[grid](**kwargs, **launch_opts)
    return {**kwargs, **launch_opts, "grid": grid}


@dataclass
class GemmRun:
    """Everything one :func:`fused_moe_gemm` call used and produced."""

    C: torch.Tensor  # (M, top_k, N) kernel output
    A_q: torch.Tensor  # activations as fed to the kernel (fp8 or not)
    A_scale: torch.Tensor | None
    sorted_token_ids: torch.Tensor | None
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    launch_args: dict[str, Any]


def fused_moe_gemm(
    loaded: LoadedKernel,
    A: torch.Tensor,
    B_q: torch.Tensor,
    B_scale: torch.Tensor | None,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    config: dict[str, Any],
    mode: QuantMode,
    *,
    top_k: int | None = None,
    mul_routed_weight: bool = False,
    block_shape: tuple[int, int] | list[int] | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    num_experts: int | None = None,
    expert_map: torch.Tensor | None = None,
    ignore_invalid_experts: bool = False,
    naive: bool | None = None,
    swap_ab: bool | None = None,
    poison: bool = True,
    extra_args: dict[str, Any] | None = None,
) -> GemmRun:
    """Quantise ``A`` (float, ``(M, K)``), align ``topk_ids`` and run one MoE GEMM.

    ``topk_ids`` is ``(T, topk)`` with ``T * topk == M * top_k``: for a layer's
    first GEMM ``T = M`` and ``top_k = topk``; for its second GEMM ``A`` has
    ``T * topk`` rows and ``top_k = 1``.  The output ``C`` is ``(T, topk, N)``,
    filled with NaN before the launch (``poison``), so rows the kernel does not
    write stay NaN.  ``naive=None`` follows vLLM's rule for the one-token-per-block
    path; ``block_shape`` defaults to 128x128 in ``"block"`` mode.
    """
    if top_k is None:
        top_k = topk_ids.size(1)
    if mode == "block" and block_shape is None:
        block_shape = (128, 128)
    if mode != "block":
        block_shape = None
    if num_experts is None:
        num_experts = B_q.size(0) if expert_map is None else expert_map.numel()
    A_q, A_scale = quantize_activations(A, mode, block_shape)
    T, topk = topk_ids.shape
    sorted_ids, expert_ids, num_post = prepare_expert_assignment(
        topk_ids,
        config["BLOCK_SIZE_M"],
        num_experts,
        expert_map,
        naive=naive,
        ignore_invalid_experts=ignore_invalid_experts,
    )
    C = torch.empty((T, topk, B_q.size(1)), dtype=out_dtype, device=A.device)
    if poison:
        C.fill_(float("nan"))
    args = invoke_fused_moe_kernel(
        loaded,
        A_q,
        B_q,
        C,
        A_scale,
        B_scale,
        topk_weights,
        sorted_ids,
        expert_ids,
        num_post,
        mul_routed_weight,
        top_k,
        config,
        use_fp8_w8a8=mode != "none",
        per_channel_quant=mode == "channel",
        block_shape=list(block_shape) if block_shape is not None else None,
        swap_ab=swap_ab,
        extra_args=extra_args,
    )
    return GemmRun(C, A_q, A_scale, sorted_ids, expert_ids, num_post, args)
