"""The deployments the oracle tests put to ``select_fp8_moe_backend``.

Every scenario runs in the patched tree and in the same release with the rest
of the series but without ``backend-selector`` ("upstream"), each once with
FlashInfer installed and once without.
"""

from __future__ import annotations

import itertools

# label -> (weight QuantKey, activation QuantKey), names in
# vllm/model_executor/layers/quantization/utils/quant_utils.py
FP8_SCHEMES = {
    # Fp8MoEMethod / ModelOpt with static activation scales (the case FlashInfer
    # CUTLASS takes upstream)
    "tensor-static": ("kFp8StaticTensorSym", "kFp8StaticTensorSym"),
    # Fp8MoEMethod with dynamic activation scales
    "tensor-dynamic": ("kFp8StaticTensorSym", "kFp8DynamicTensorSym"),
    # per-tensor weights, per-token dynamic activations (batch-invariant mode)
    "tensor-token": ("kFp8StaticTensorSym", "kFp8DynamicTokenSym"),
    # compressed-tensors channel-wise weights, per-token dynamic activations
    "channel-token": ("kFp8StaticChannelSym", "kFp8DynamicTokenSym"),
    # 128x128 block weights, dynamic per-128-group activations (DeepSeek style)
    "block": ("kFp8Static128BlockSym", "kFp8Dynamic128Sym"),
}
OTHER_SCHEMES = {
    # compressed-tensors per-tensor weights with its dynamic activation key:
    # an FP8 pair that Triton's experts do not take, so the policy moves Triton
    # first but the choice falls through to upstream's
    "tensor-group128": ("kFp8StaticTensorSym", "kFp8Dynamic128Sym"),
    # FP8 weights with 16-bit activations (Marlin's W8A16)
    "weight-only": ("kFp8StaticTensorSym", None),
    # MXFP8, another quantisation that goes through the FP8 oracle
    "mxfp8": ("kMxfp8Static", "kMxfp8Dynamic"),
}
SCHEMES = {**FP8_SCHEMES, **OTHER_SCHEMES}

# SM90 = Hopper (H100/H200); SM100 = Blackwell; SM89 = Ada; SM80 = Ampere
CAPABILITIES = (90, 100, 89, 80)
# no expert parallelism; EP with the all-gather/reduce-scatter all2all (standard
# activation format); EP with DeepEP low-latency (batched activation format)
EPS = ("none", "allgather", "deepep_ll")
ENV = "VLLM_FP8_MOE_BACKEND"


def scenario(
    scheme: str,
    capability: int = 90,
    ep: str = "none",
    allow_vllm_cutlass: bool = False,
    env: str | None = None,
    moe_backend: str = "auto",
) -> dict:
    weight, activation = SCHEMES[scheme]
    sid = f"{scheme}/sm{capability}/ep-{ep}/{'cutlass' if allow_vllm_cutlass else 'no-cutlass'}"
    sid += f"/env-{env if env is not None else 'unset'}/flag-{moe_backend}"
    return {
        "id": sid,
        "scheme": scheme,
        "capability": capability,
        "weight": weight,
        "activation": activation,
        "ep": ep,
        "allow_vllm_cutlass": allow_vllm_cutlass,
        "env": {ENV: env},
        "moe_backend": moe_backend,
    }


def automatic() -> list[dict]:
    """Every scheme x GPU x parallelism x caller, with neither the variable nor
    --moe-backend set: the automatic choice."""
    return [
        scenario(s, c, e, a)
        for s, c, e, a in itertools.product(SCHEMES, CAPABILITIES, EPS, (False, True))
    ]


def env_auto() -> list[dict]:
    """The variable set to "auto" (any case) means the automatic choice."""
    return [
        scenario(s, c, e, a, env=value)
        for value in ("auto", "AUTO")
        for s, c, e, a in itertools.product(FP8_SCHEMES, (90, 100), ("none", "allgather"), (False,))
    ]


# (scenario, expected backend or None when an error is expected, text in the
# error or log line)
def env_choices() -> list[tuple[dict, str | None, str]]:
    return [
        # the variable names the backend, whatever the GPU and parallelism
        (scenario("tensor-static", 100, env="triton"), "TRITON", f"{ENV}=triton requests it"),
        (scenario("tensor-static", 90, env="Triton"), "TRITON", f"{ENV}=triton requests it"),
        (scenario("block", 90, "allgather", env="triton"), "TRITON", f"{ENV}=triton"),
        (scenario("tensor-static", 90, "deepep_ll", env="triton"), "BATCHED_TRITON", "triton"),
        (scenario("tensor-static", 90, env="marlin"), "MARLIN", f"{ENV}=marlin requests it"),
        (
            scenario("channel-token", 90, allow_vllm_cutlass=True, env="cutlass"),
            "VLLM_CUTLASS",
            f"{ENV}=cutlass requests it",
        ),
        # as with --moe-backend, a backend the layer cannot use fails
        (
            scenario("tensor-static", 90, env="cutlass"),
            None,
            "vLLM CUTLASS FP8 MoE backend is disabled",
        ),
        (scenario("tensor-dynamic", 90, env="deep_gemm"), None, "does not support"),
    ]


def env_flashinfer() -> list[dict]:
    """The variable names FlashInfer CUTLASS: chosen where FlashInfer is
    installed, an error where it is not."""
    return [scenario("tensor-static", 90, env="flashinfer_cutlass")]


def env_invalid() -> list[tuple[dict, list[str]]]:
    """Invalid values fail, listing the valid ones."""
    return [
        # not a --moe-backend name: vllm/envs.py lists --moe-backend's values
        (
            scenario("tensor-static", 90, env="fastest"),
            [f"Invalid value 'fastest' for {ENV}", "'auto'", "'triton'", "'flashinfer_cutlass'"],
        ),
        # a --moe-backend name without an FP8 backend: the FP8 names are listed
        (
            scenario("tensor-static", 90, env="flashinfer_cutedsl"),
            [f"Invalid {ENV}", "flashinfer_cutedsl", "'triton'", "'deep_gemm'", "'marlin'"],
        ),
        # an explicit --moe-backend does not hide a broken variable
        (
            scenario("tensor-static", 90, env="fastest", moe_backend="triton"),
            [f"Invalid value 'fastest' for {ENV}"],
        ),
    ]


def flag_over_env() -> list[tuple[dict, str, str]]:
    """--moe-backend wins over the variable."""
    return [
        (
            scenario("tensor-static", 90, env="triton", moe_backend="marlin"),
            "MARLIN",
            f"--moe-backend=marlin requests it (overriding {ENV}=triton)",
        ),
        (
            scenario("block", 90, env="marlin", moe_backend="triton"),
            "TRITON",
            f"--moe-backend=triton requests it (overriding {ENV}=marlin)",
        ),
        (
            scenario("tensor-static", 90, env="triton", moe_backend="triton"),
            "TRITON",
            "--moe-backend=triton requests it",
        ),
    ]


def flag_alone() -> list[dict]:
    """--moe-backend without the variable: upstream's explicit path, unchanged."""
    return [
        scenario(s, c, "none", False, moe_backend=flag)
        for flag in ("triton", "flashinfer_cutlass", "marlin", "deep_gemm")
        for s, c in itertools.product(FP8_SCHEMES, (90, 100))
    ]


def env_ignored_upstream() -> dict:
    """Upstream does not know the variable."""
    return scenario("tensor-static", 90, env="triton")


def all_scenarios() -> list[dict]:
    found = automatic() + env_auto() + env_flashinfer() + flag_alone()
    found.append(env_ignored_upstream())
    found += [s for s, _, _ in env_choices()] + [s for s, _ in env_invalid()]
    found += [s for s, _, _ in flag_over_env()]
    unique = {s["id"]: s for s in found}
    return list(unique.values())
