"""moe-patch: a versioned patch series for vLLM's FP8 fused-MoE path on Hopper."""

__version__ = "0.1.0"
