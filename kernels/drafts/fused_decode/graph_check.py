"""A fused form under CUDA graphs (v10 by default: each of its variants, one cooperative
launch, one ordinary launch, three launches): captured once and replayed on fresh inputs
copied into the captured buffers; every replay is compared with an eager call on the same
inputs (the form's counters and scratch must be zero again each time).  Prints one line per
variant; exits 1 if any fails.

    python3 kernels/drafts/fused_decode/graph_check.py [SHAPES] [M] [FORM]
"""

import functools
import sys

import torch
from bench import FORMS
from moe_kernels.measure import BLOCK_SHAPE, DEVICE, SHAPES, make_weights, routing

VARIANTS = {  # v10's; other forms run as they are
    "cooperative": {},
    "ordinary": {"cooperative": False},
    "three-launches": {"one_launch": False},
}
REPLAYS = 5


def main() -> int:
    form_name = sys.argv[3] if len(sys.argv) > 3 else "v10"
    form = FORMS[form_name]
    variants = VARIANTS if form_name == "v10" else {"default": {}}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = (sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b").split(",")
    tokens = [int(m) for m in (sys.argv[2] if len(sys.argv) > 2 else "1,4").split(",")]
    failed = 0
    for name in shapes:
        shape = SHAPES[name]
        for quant in ("tensor", "block"):
            gen = torch.Generator(device=DEVICE).manual_seed(4302)
            (w1, s1), (w2, s2) = (make_weights(shape, g, quant, gen)[0] for g in ("up", "down"))
            block = list(BLOCK_SHAPE) if quant == "block" else None
            for M in tokens:
                ids, tw = routing(M, shape, gen)
                x = torch.randn(M, shape.hidden, generator=gen, device=DEVICE, dtype=torch.bfloat16)
                for variant, options in variants.items():
                    out = torch.empty(M, shape.hidden, dtype=torch.bfloat16, device=DEVICE)

                    call = functools.partial(
                        form.fused_moe_decode, x, w1, w2, s1, s2, tw, ids, out,
                        block_shape=block, sm_count=sms, **options,
                    )  # fmt: skip
                    try:
                        call()  # compiles, and allocates the kept buffers outside the capture
                        torch.cuda.synchronize()
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            call()
                        worst = 0.0
                        for _ in range(REPLAYS):
                            x.copy_(torch.randn(x.shape, generator=gen, device=DEVICE))
                            graph.replay()
                            replayed = out.double().clone()
                            call()
                            eager = out.double()
                            worst = max(worst, float((replayed - eager).norm() / eager.norm()))
                        torch.cuda.synchronize()
                        ok = worst < 1e-2
                        shown = f"worst replay vs eager {worst:.2e}"
                    except Exception as error:  # noqa: BLE001 - report and go on
                        ok, shown = False, f"{type(error).__name__}: {str(error)[:200]}"
                    failed += not ok
                    print(name, quant, M, variant, shown, "ok" if ok else "FAILED", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
