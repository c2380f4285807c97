"""Which stage puts check_v3's two small non-block cases off their own quantisation points on a
GPU: ``python3 kernels/drafts/fused_decode/diag_small.py [v5|v6]``.

Runs the form on check_v3's first three cases (per tensor, per channel, block) with its
launches wrapped so the FP8 activations, the FP8 intermediate and their scales come back,
and compares each stage with float64 computed from the stage before it (the GPU's own
inputs), so an error shows up in the stage that makes it.  Then the layer again with
variants that each change one suspect: a float32 output (atomics), 8 warps, one stage.
"""

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import check_v3  # noqa: E402  (applies the interpreter fixes, picks the device)
from load import load_module  # noqa: E402

DEVICE = check_v3.DEVICE


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def grouped_fp8(x, group):
    """Through FP8 and back per row and ``group`` columns, as the kernels quantise."""
    parts = []
    for i in range(0, x.size(-1), group):
        part = x[..., i : i + group].float()
        scale = part.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
        parts.append((part / scale).to(torch.float8_e4m3fn).double() * scale.double())
    return torch.cat(parts, dim=-1)


def captured_launches(form):
    """Wrap the form's kernels so each launch's tensor arguments are kept (after it ran)."""
    seen = {}
    for name in ("_moe_decode_quant_kernel", "_moe_decode_up_kernel", "_moe_decode_down_kernel"):
        kernel = getattr(form, name)

        class Grid:
            def __init__(self, kernel, name):
                self.kernel, self.name = kernel, name

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    self.kernel[grid](*args, **kwargs)
                    seen[self.name] = (grid, args, kwargs)

                return launch

        setattr(form, name, Grid(kernel, name))
    return seen


def stages(case, form, seen, out_dtype, **options):
    experts, top_k, hidden, inter, tokens, mode, sms, extra = case
    x, w1q, w2q, s1, s2, w1d, w2d, tw, ids, block = check_v3.case_data(*case[:6])
    w1d, w2d = w1d.double(), w2d.double()
    out = torch.full((tokens, hidden), float("nan"), dtype=out_dtype)
    args = [t.to(DEVICE) for t in (x, w1q, w2q, s1, s2, tw, ids.to(torch.int32), out)]
    form.fused_moe_decode(
        *args, per_channel=mode == "channel", block_shape=list(block) if block else None,
        sm_count=sms, **{**extra, **options},
    )  # fmt: skip
    got = args[-1].cpu().double()
    _, qargs, _ = seen["_moe_decode_quant_kernel"]
    xq, xs = qargs[1].cpu(), qargs[2].cpu()
    _, uargs, ukw = seen["_moe_decode_up_kernel"]
    aq, a_s = uargs[6].cpu(), uargs[7].cpu()
    block_i = ukw["BLOCK_I"]

    # 1. the activations: the GPU's FP8 points against float64 from x, and against the FP8
    # points computed here (a few one-unit rounding flips at most)
    groups = xs.size(1)
    xd = (xq.double().view(tokens, groups, -1) * xs.double()[:, :, None]).view(tokens, hidden)
    report = {"x": rel(xd, x.double()), "x_vs_fp8": rel(xd, grouped_fp8(x, 128))}
    # 2. the intermediate, from the GPU's own FP8 activations: its FP8 points against float64
    # and against the FP8 points of that float64
    tiles = a_s.size(1)
    ad = torch.cat(
        [aq[:, i * block_i : (i + 1) * block_i].double() * a_s[:, i : i + 1].double()
         for i in range(tiles)], dim=1,
    )  # fmt: skip
    act = torch.empty_like(ad)
    for t in range(tokens):
        for k in range(top_k):
            h = w1d[ids[t, k]] @ xd[t]
            act[t * top_k + k] = torch.nn.functional.silu(h[:inter]) * h[inter:]
    report["act"] = rel(ad, act)
    report["act_vs_fp8"] = rel(ad, grouped_fp8(act, block_i))
    worst = (ad - grouped_fp8(act, block_i)).abs().max(-1).values / act.abs().max(-1).values
    report["act_vs_fp8_worst_pair"] = float(worst.max())
    # 3. the output, from the GPU's own FP8 intermediate
    ref = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for k in range(top_k):
            ref[t] += tw[t, k].double() * (w2d[ids[t, k]] @ ad[t * top_k + k])
    report["out"] = rel(got, ref)
    diff = (got - ref).abs()
    report["out_worst_col"] = int(diff.max(0).values.argmax())
    report["out_bad_cols"] = int((diff > 0.02 * ref.abs().max()).any(0).sum())
    return report


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "v6"
    form = load_module(HERE / f"fused_{name}.py", f"fused_{name}")
    seen = captured_launches(form)
    variants = [
        ("as checked", check_v3.DTYPE, {}),
        ("float32 out", torch.float32, {}),
        ("8 warps", check_v3.DTYPE, {"num_warps": 8}),
        ("1 stage", check_v3.DTYPE, {"up_stages": 1, "down_stages": 1}),
        ("block_i 128", check_v3.DTYPE, {"block_i": 128}),
    ]
    for case in check_v3.CASES[:3]:
        for label, dtype, options in variants:
            report = stages(case, form, seen, dtype, **options)
            shown = " ".join(
                f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in report.items()
            )
            print(f"{case[:6]} {label:12s} {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
