"""End-to-end benchmark: vLLM as released against vLLM with the series, serving real MoE models.

Three steps, each a module with its own command (docs/benchmarks.md, "End to end"):

* ``python -m moe_e2e.bundle``: on any machine with the package index, collects what a GPU
  machine without network needs: the official vLLM wheel and the wheel ``moe-patch wheel``
  builds (both made by ``python -m moe_patch.harness_wheels``: this package never imports
  moe-patch), the Python packages vLLM imports that the GPU image lacks, and the model
  configurations.
* ``python -m moe_e2e.stage``: on the GPU machine, checks every byte of the bundle against its
  manifest and installs both vLLMs side by side (``pip install --target`` layouts).
* ``python -m moe_e2e.run``: starts each variant (wheel x model x FP8 kind x backend) in a fresh
  process with empty compile caches and measures start-up, first-request TTFT, decode time per
  token, throughput and TTFT over a trace of changing batch sizes.

Models run with dummy weights (``load_format="dummy"``) from configuration files written from the
models' published ``config.json``; no weights or tokenizer are fetched.
"""
