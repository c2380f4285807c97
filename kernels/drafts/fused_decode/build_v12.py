"""v12 built for sm_90a on the CPU: registers, shared memory, SASS instructions.

python kernels/drafts/fused_decode/build_v12.py [SCALE_KIND: 0 tensor, 1 channel, 2 block]
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # a build, not an interpreted run
import triton  # noqa: E402
from load import load_module  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

HERE = Path(__file__).resolve().parent
mod = load_module(HERE / "fused_v12.py", "fused_v12")
k = mod._moe_decode_kernel
ptrs = dict(
    x_ptr="*bf16",
    w1_desc="tensordesc<fp8e4nv[64, 128]>",
    w1_scale_ptr="*fp32",
    w2_desc="tensordesc<fp8e4nv[128, 64]>",
    w2_scale_ptr="*fp32",
    topk_ids_ptr="*i32",
    topk_weights_ptr="*fp32",
    aq_ptr="*fp8e4nv",
    as_ptr="*fp32",
    partial_ptr="*fp32",
    counters_ptr="*i32",
    out_ptr="*bf16",
)
const = dict(
    TOP_K=8,
    TOP_K_PAD=8,
    EXPERT_BINS=128,
    SCALE_KIND=int(sys.argv[1]) if len(sys.argv) > 1 else 0,
    BLOCK_TOKENS=16,
    BLOCK_I=64,
    BLOCK_H=128,
    GROUP=128,
    ZERO_BLOCK=1024,
    FP8_MAX=448.0,
)
types = {n: ("constexpr" if n in const else ptrs.get(n, "i32")) for n in k.arg_names}
order = {n: i for i, n in enumerate(k.arg_names)}
c = triton.compile(
    ASTSource(k, types, {(order[n],): v for n, v in const.items()}),
    target=GPUTarget("cuda", 90, 64),
    options={"num_warps": 4, "num_stages": 3},
)
cuobj = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
with tempfile.TemporaryDirectory() as d:
    p = Path(d) / "k.cubin"
    p.write_bytes(c.asm["cubin"])
    usage = subprocess.run(
        [str(cuobj), "--dump-resource-usage", str(p)], capture_output=True, text=True
    ).stdout
    sass = subprocess.run(
        [str(cuobj), "--dump-sass", str(p)], capture_output=True, text=True
    ).stdout
print(
    re.search(r"REG:(\d+)", usage).group(0),
    "smem",
    c.metadata.shared,
    {
        o: len(re.findall(o, sass))
        for o in ("QGMMA", "UTMALDG", "LDGSTS", "ATOM", "RED", "LDL", "SYNCS")
    },
)
