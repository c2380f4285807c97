"""A made-up ``moe_e2e.run`` result file, for the report and staging tests."""

from __future__ import annotations


def fake_report(variants: list[dict]) -> dict:
    """A result file of one model holding ``variants``."""
    return {
        "command": "python -m moe_e2e.run",
        "vllm": "0.21.0",
        "series_version": "0.1.0",
        "environment": {"gpu": "H200"},
        "model": "m",
        "spec": {"decode_batches": [1], "max_num_seqs": 64, "max_model_len": 4096},
        "official_wheel": {"file": "o.whl", "sha256": "aa", "dropped": []},
        "patched_wheel": {"file": "p.whl", "sha256": "bb", "version": "0.21.0+moe.0.1.0"},
        "variants": variants,
    }
