"""run7's results as one table: ``python3 kernels/drafts/fused_decode/summarise7.py FILE...``
(``vllm-layer-release.json``, ``vllm-layer-series.json``, gzip or not).

Per case (shape, quant, M, routing): the read floor, vLLM's layer from each tree, each fused
variant (the median over the files that timed it: both trees' runs time the same fused
forms), and the best fused variant's speed-up over each tree's layer, taken within the
file (the process) that timed that layer."""

import gzip
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def main(paths):
    cases = defaultdict(lambda: defaultdict(list))
    floors, gains = {}, defaultdict(dict)
    for path in paths:
        by_case = defaultdict(dict)
        for row in load(path)["rows"]:
            key = (row["shape"], row["quant"], row["M"], row.get("routing", "uniform"))
            floors[key] = row["floor_us"]
            cases[key][row["variant"]].append(row["us"])
            by_case[key][row["variant"]] = row["us"]
        for key, times in by_case.items():
            fused_here = [t for v, t in times.items() if v.startswith("fused-")]
            for v, t in times.items():
                if v.endswith(":vllm-layer") and fused_here:
                    gains[key][v] = t / min(fused_here)
    layers = sorted({v for c in cases.values() for v in c if v.endswith(":vllm-layer")})
    fused = sorted({v for c in cases.values() for v in c if v.startswith("fused-")})
    short = {
        v: v.removeprefix("fused-").replace("block_h=128,", "").replace(":block_h=128", "")
        for v in fused
    }
    print("| shape | quant | M | routing | floor | " + " | ".join(layers + [short[v] for v in fused])
          + " | best | " + " | ".join(f"x {v.split(':')[0]}" for v in layers) + " |")  # fmt: skip
    print("|---" * (6 + len(layers) + len(fused) + len(layers)) + "|")
    for key in sorted(cases):
        times = {v: statistics.median(ts) for v, ts in cases[key].items()}
        best = min((times[v], v) for v in fused if v in times)
        cells = [f"{times[v]:.1f}" if v in times else "" for v in layers + fused]
        shown = [f"{gains[key][v]:.2f}" if v in gains[key] else "" for v in layers]
        print(f"| {' | '.join(map(str, key))} | {floors[key]:.1f} | " + " | ".join(cells)
              + f" | {short[best[1]]} | " + " | ".join(shown) + " |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
