"""The v3 form built for sm_90a on the CPU: registers, shared memory, SASS instructions."""

import os
import re
import subprocess
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # a build, not an interpreted run
import triton  # noqa: E402
from load import load_module  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

HERE = Path(__file__).resolve().parent

mod = load_module(HERE / "fused_v3.py")
cuobj = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def build(k, ptrs, ints, const, warps, stages, div):
    sig = dict(ptrs, **{n: "i32" for n in ints})
    order = {n: i for i, n in enumerate(k.arg_names)}
    types = {n: ("constexpr" if n in const else sig[n]) for n in k.arg_names}
    attrs = {(order[n],): [["tt.divisibility", 16]] for n in div}
    c = triton.compile(
        ASTSource(k, types, {(order[n],): v for n, v in const.items()}, attrs),
        target=GPUTarget("cuda", 90, 64),
        options={"num_warps": warps, "num_stages": stages},
    )
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(c.asm["cubin"])
        usage = subprocess.run(
            [str(cuobj), "--dump-resource-usage", str(p)], capture_output=True, text=True
        ).stdout
        sass = subprocess.run(
            [str(cuobj), "--dump-sass", str(p)], capture_output=True, text=True
        ).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    ops = {
        o: len(re.findall(o, sass))
        for o in ("QGMMA", "HMMA", "HGMMA", "LDGSTS", "F2F", "F2FP", "RED", "ATOM", "LDL")
    }
    return regs, c.metadata.shared, ops


for kind in (0, 2):
    for bt in (16, 32):
        common = dict(
            TOP_K=8,
            TOP_K_PAD=8,
            EXPERT_BINS=128,
            SCALE_KIND=kind,
            BLOCK_TOKENS=bt,
            GROUP=128,
            FP8_MAX=448.0,
        )
        for bi, w, s in ((16, 4, 6), (32, 4, 6), (64, 4, 4), (16, 4, 8)):
            up = build(
                mod._moe_decode_up_kernel,
                dict(
                    x_ptr="*bf16",
                    w1_ptr="*fp8e4nv",
                    w1_scale_ptr="*fp32",
                    topk_ids_ptr="*i32",
                    topk_weights_ptr="*fp32",
                    act_ptr="*bf16",
                    out_ptr="*bf16",
                ),
                [
                    "num_tokens",
                    "hidden",
                    "inter",
                    "out_numel",
                    "stride_w1_e",
                    "stride_w1_n",
                    "stride_s1_e",
                    "stride_s1_n",
                    "stride_s1_k",
                ],
                dict(common, BLOCK_I=bi, ZERO_BLOCK=1024),
                w,
                s,
                [
                    "x_ptr",
                    "w1_ptr",
                    "act_ptr",
                    "out_ptr",
                    "hidden",
                    "inter",
                    "stride_w1_e",
                    "stride_w1_n",
                ],
            )
            print(f"up   kind={kind} BT={bt} BI={bi} w={w} s={s}: {up}", flush=True)
        for bh, w, s in ((64, 4, 4), (64, 4, 6), (128, 8, 4)):
            dn = build(
                mod._moe_decode_down_kernel,
                dict(
                    act_ptr="*bf16",
                    w2_ptr="*fp8e4nv",
                    w2_scale_ptr="*fp32",
                    topk_ids_ptr="*i32",
                    topk_weights_ptr="*fp32",
                    out_ptr="*bf16",
                ),
                [
                    "num_tokens",
                    "hidden",
                    "inter",
                    "k_steps_per_split",
                    "stride_w2_e",
                    "stride_w2_n",
                    "stride_s2_e",
                    "stride_s2_n",
                    "stride_s2_k",
                ],
                dict(common, BLOCK_H=bh),
                w,
                s,
                ["act_ptr", "w2_ptr", "out_ptr", "hidden", "inter", "stride_w2_e", "stride_w2_n"],
            )
            print(f"down kind={kind} BT={bt} BH={bh} w={w} s={s}: {dn}", flush=True)
