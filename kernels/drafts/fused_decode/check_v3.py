"""The v3, v4 and v5 forms against the layer in float64, on the CPU (Triton's interpreter)
or a GPU: ``python3 kernels/drafts/fused_decode/check_v3.py [v3|...|v9|PATH]`` (PATH: a
tree's ``fused_moe_decode.py``, held as v9).  v3 and v4 keep
the activations unquantised and are held to the unquantised layer; v5 and v6 quantise them to FP8
(per token and 128 columns in, per token and ``block_i`` columns between the GEMMs) and is
held to the layer with those quantisation points, its distance to the unquantised one shown."""

import inspect
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import fp8fix  # noqa: E402
from emu import emulate, group_width  # noqa: E402
from load import load_module  # noqa: E402
from moe_kernels import interpreter_compat  # noqa: E402
from moe_kernels.quant import quantize_weights  # noqa: E402
from moe_kernels.reference import dequantize_weights, ref_moe_layer_float  # noqa: E402

interpreter_compat.apply()
fp8fix.apply()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # no bf16 atomics on the CPU
UNQUANTISED = ("v3", "v4")  # held to the unquantised layer; later forms to their own points
BEFORE_PADDING = ("v3", "v4", "v5", "v6", "v7", "v8")  # forms that predate padding rows
CASES = [  # experts, top_k, hidden, intermediate, tokens, scales, SMs, options
    (8, 2, 256, 128, 1, "tensor", 4, {}),
    (16, 4, 384, 320, 16, "channel", 64, {}),
    (32, 8, 256, 192, 5, "block", 200, {}),
    (12, 6, 256, 128, 2, "block", 1, {}),
    # K split in both launches (v4: three and two splits of the first launch's K)
    (8, 2, 768, 192, 1, "block", 200, {"min_steps": 2}),
    (16, 4, 640, 320, 3, "tensor", 200, {"min_steps": 2}),
    # v6: the up kernel's K split three and four ways
    (8, 2, 768, 192, 1, "block", 18, {"min_steps": 1}),
    (16, 4, 512, 256, 2, "channel", 128, {"min_steps": 1}),
    # v9: 128-wide tiles of the intermediate (few SMs), a partial last tile
    (16, 4, 384, 320, 16, "channel", 16, {}),
    (16, 4, 512, 320, 4, "block", 8, {}),
    # v9: K shares chosen to balance the waves (7 SMs: 24 up tiles in 2 shares of 3 steps)
    (16, 4, 768, 384, 2, "block", 7, {"balance_waves": True, "min_steps": 2}),
    # v9: padding rows (expert id -1, vLLM's VLLM_MOE_SKIP_PADDING) route nowhere
    (24, 4, 256, 192, 5, "tensor", 32, {"padding_rows": 2}),
    # v10: one launch of a single program (the interpreter's only one-launch case), per
    # tensor and per channel, a partial last tile of the intermediate
    (8, 2, 384, 320, 3, "tensor", 1, {}),
    (16, 4, 256, 192, 4, "channel", 1, {"padding_rows": 1}),
    # v12: 16 KB units (up tiles in three shares of two steps, down in shares of two)
    (8, 2, 768, 256, 3, "block", 200, {"unit_kb": 16}),
    (16, 4, 640, 384, 2, "tensor", 8, {"unit_kb": 16, "padding_rows": 1}),
]


def case_data(experts, top_k, hidden, inter, tokens, mode):
    """One case's inputs (seeded by its sizes): hidden states in ``DTYPE``, FP8 weights
    with their scales and dequantised copies, routing weights and ids, the block shape."""
    gen = torch.Generator().manual_seed(experts * 7 + tokens)
    w1 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    x = torch.randn(tokens, hidden, generator=gen).to(DTYPE)
    logits = torch.randn(tokens, experts, generator=gen)
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k, -1)
    weights = (weights / weights.sum(-1, keepdim=True)).float()
    block = (128, 128) if mode == "block" else None
    w1q, s1 = quantize_weights(w1, mode, block)
    w2q, s2 = quantize_weights(w2, mode, block)
    w1d = dequantize_weights(w1q, s1, mode, block)
    w2d = dequantize_weights(w2q, s2, mode, block)
    return x, w1q, w2q, s1, s2, w1d, w2d, weights, ids, block


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "v3"
    if name.endswith(".py"):  # a tree's fused_moe_decode.py: the patch's form of v9
        form, name = load_module(Path(name), "fused_moe_decode"), "v9"
    else:
        form = load_module(HERE / f"fused_{name}.py", f"fused_{name}")
    failed = 0
    for experts, top_k, hidden, inter, tokens, mode, sms, options in CASES:
        x, w1q, w2q, s1, s2, w1d, w2d, weights, ids, block = case_data(
            experts, top_k, hidden, inter, tokens, mode
        )
        options = dict(options)
        padding = options.pop("padding_rows", 0)
        if padding and name in BEFORE_PADDING:
            continue
        if DEVICE == "cpu" and "one_launch" in inspect.signature(form.fused_moe_decode).parameters:
            # The interpreter runs programs one after another: one launch waits forever on
            # a later program unless there is one program (three launches otherwise).
            options.setdefault("one_launch", sms == 1)
        if not set(options) <= set(inspect.signature(form.fused_moe_decode).parameters):
            continue  # an option of a later form (a tree's module has none of the drafts')
        real = tokens - padding  # the last rows are padding: ids -1, output ignored
        launched = ids.clone()
        launched[real:] = -1
        ref = ref_moe_layer_float(x[:real].double(), w1d, w2d, ids[:real], weights[:real].double())
        out = torch.full((tokens, hidden), float("nan"), dtype=DTYPE)
        args = [t.to(DEVICE) for t in (x, w1q, w2q, s1, s2, weights, launched.to(torch.int32), out)]
        form.fused_moe_decode(
            *args, per_channel=mode == "channel", block_shape=list(block) if block else None,
            sm_count=sms, **options,
        )  # fmt: skip
        got = args[-1].cpu().double()
        failed += bool(padding) and not torch.isfinite(got[real:]).all()
        # Buffers kept between calls must be left zero (a CUDA graph replays on them).
        for kept in (
            *getattr(form, "_ARRIVALS", {}).values(),
            *getattr(form, "_KEPT", {}).values(),
        ):
            if kept.any():
                print("counters left non-zero:", kept.nonzero().flatten().tolist()[:8])
                failed += 1
        launched_tokens = tokens  # what the form's launch-time choices saw
        x, ids, weights, tokens = x[:real], ids[:real], weights[:real], real
        args[-1] = got[:real]
        err = float((args[-1].cpu().double() - ref).norm() / ref.norm())
        shown = f"{err:.5f}"
        if name not in UNQUANTISED:
            group = group_width(form, options, launched_tokens, top_k, experts, inter, sms)
            own = emulate(x, w1d, w2d, ids, weights.double(), group, False)
            shown += f" own {float((args[-1].cpu().double() - own).norm() / own.norm()):.5f}"
            err = float((args[-1].cpu().double() - own).norm() / own.norm())
            if DEVICE == "cuda":  # which quantisation points a GPU's result is nearest
                got = args[-1].cpu().double()
                for label, other in (
                    ("rounded", emulate(x, w1d, w2d, ids, weights.double(), 64, True)),
                    ("group128", emulate(x, w1d, w2d, ids, weights.double(), 128, False)),
                ):
                    shown += f" {label} {float((got - other).norm() / other.norm()):.5f}"
        failed += not err < 1e-2
        print(experts, top_k, hidden, inter, tokens, mode, sms, shown, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
