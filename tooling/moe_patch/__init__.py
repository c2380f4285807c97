"""moe-patch: a versioned patch series for vLLM's FP8 fused-MoE path on Hopper."""

__version__ = "0.2.0"
