"""``--routing distinct``: each token's top-k experts drawn at random and all different.

Dummy weights give a router that sends almost every token of a batch to the same experts, so
a batch reads far fewer expert weights than a trained model's would.  vLLM's routing simulator
(``VLLM_MOE_ROUTING_SIMULATION_STRATEGY``) spreads the batch, but its ``uniform_random`` draws a
token's k experts independently, so a token can get one expert twice, which no trained
router does; with it, vLLM 0.21.0's FlashInfer CUTLASS MoE stopped on an illegal memory access
on the H200 (docs/studies.md, the end-to-end runs).  This module adds a strategy to that simulator
whose experts are a uniformly random k-subset per token: the k highest of fresh uniform
scores.

vLLM runs the simulator in its engine-core and worker processes, which ``moe_e2e.run`` does
not import; vLLM loads its general plugins (entry points of the group ``vllm.general_plugins``)
in every one of them.  ``write_entry_point`` writes the metadata of a distribution that names
``register`` there, and ``moe_e2e.run`` puts its folder on the engines' ``PYTHONPATH`` for
``--routing distinct`` only.
"""

from __future__ import annotations

from pathlib import Path

STRATEGY = "moe_e2e_distinct"
ENTRY_POINT_GROUP = "vllm.general_plugins"
DISTRIBUTION = "moe_e2e_routing"


def distinct_experts(num_tokens: int, num_experts: int, top_k: int, device, indices_type=None):
    """``[num_tokens, top_k]`` expert ids, each row a uniformly random k-subset of the experts
    (the top k of fresh uniform scores), in ``indices_type`` (int32 if None)."""
    import torch

    scores = torch.rand(num_tokens, num_experts, device=device)
    ids = scores.topk(top_k, dim=-1).indices
    return ids.to(indices_type or torch.int32)


def register() -> None:
    """vLLM's general-plugin hook: add ``STRATEGY`` to the routing simulator (idempotent)."""
    import torch
    from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import (
        RoutingSimulator,
        RoutingStrategy,
    )

    class DistinctExperts(RoutingStrategy):
        def route_tokens(self, hidden_states, router_logits, top_k, indices_type=None):
            num_tokens, num_experts = router_logits.shape
            ids = distinct_experts(
                num_tokens, num_experts, top_k, hidden_states.device, indices_type
            )
            # As uniform_random: every chosen expert counts fully.
            weights = torch.ones(
                (num_tokens, top_k), dtype=torch.float32, device=hidden_states.device
            )
            return weights, ids

    RoutingSimulator.register_strategy(STRATEGY, DistinctExperts())


def write_entry_point(folder: Path) -> Path:
    """A distribution's metadata in ``folder`` (put it on ``PYTHONPATH``) whose entry point in
    ``ENTRY_POINT_GROUP`` is ``register``; returns ``folder``."""
    info = folder / f"{DISTRIBUTION}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{STRATEGY} = moe_e2e.routing:register\n"
    )
    return folder
