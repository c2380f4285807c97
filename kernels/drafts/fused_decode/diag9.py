"""v6's and v9's distance to their own quantisation points on a GPU (vllm_layer.py measured
4e-3..2.3e-2 for v9 on an H200 with an emulation that divided short, see README): on the harness's
weights and routing, the output in bf16 (the atomic adds round each partial sum) and in
float32, each launched twice (bitwise equal if the result does not depend on the order of
the atomics).

    python3 kernels/drafts/fused_decode/diag9.py [SHAPES] [M]
"""

import os
import sys

import torch
from bench import FORMS, HERE, SMS
from emu import emulate, group_width
from load import load_module
from moe_kernels.measure import BLOCK_SHAPE, DEVICE, SHAPES, make_weights, routing
from moe_kernels.reference import dequantize_weights

HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # no bf16 atomics on the CPU


def main() -> None:
    names = os.environ.get("FORMS", "v6,v9").split(",")
    for name in names:  # forms outside bench's list: fused_<name>.py beside it
        FORMS.setdefault(name, load_module(HERE / f"fused_{name}.py", f"fused_{name}"))
    shapes = (sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b,deepseek-v3-tp8").split(",")
    tokens = [int(m) for m in (sys.argv[2] if len(sys.argv) > 2 else "1,4").split(",")]
    for name in shapes:
        shape = SHAPES[name]
        for quant in ("tensor", "block"):
            gen = torch.Generator(device=DEVICE).manual_seed(4301)
            (w1q, s1), (w2q, s2) = (make_weights(shape, g, quant, gen)[0] for g in ("up", "down"))
            block = BLOCK_SHAPE if quant == "block" else None
            for M in tokens:
                for seed in range(3):
                    ids, tw = routing(M, shape, gen)
                    x = torch.randn(
                        M, shape.hidden, generator=gen, device=DEVICE, dtype=torch.bfloat16
                    )
                    hit, remapped = torch.unique(ids.to(torch.int64), return_inverse=True)
                    w1d = dequantize_weights(w1q[hit], s1[hit], quant, block)
                    w2d = dequantize_weights(w2q[hit], s2[hit], quant, block)
                    shown = []
                    for form in names:
                        config = {"block_h": 128}
                        group = group_width(FORMS[form], config, M, shape.topk, shape.experts,
                                            shape.intermediate, SMS)  # fmt: skip
                        own = emulate(
                            x, w1d, w2d, remapped.view(ids.shape), tw.double(), group, False
                        )
                        for dtype in (HALF, torch.float32):
                            outs = []
                            for _ in range(2):
                                out = torch.full(
                                    (M, shape.hidden), float("nan"), dtype=dtype, device=DEVICE
                                )
                                FORMS[form].fused_moe_decode(
                                    x.to(dtype), w1q, w2q, s1, s2, tw, ids,
                                    out, block_shape=list(block) if block else None, sm_count=SMS, **config,
                                )  # fmt: skip
                                outs.append(out)
                            err = float((outs[0].double() - own).norm() / own.norm())
                            same = bool(torch.equal(outs[0], outs[1]))
                            tag = str(dtype).split(".")[1]
                            shown.append(f"{form}/{tag} {err:.4f}{'' if same else '~'}")
                    print(name, quant, M, seed, f"group={group}", " ".join(shown), flush=True)


if __name__ == "__main__":
    main()
