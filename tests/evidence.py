"""The figures the README and docs/ quote, recomputed from the result files they come from.

``docs/evidence.json`` lists each quoted figure (a "claim"): the text as the pages print it,
the pages that print it, the result file under ``kernels/results/`` it comes from, how to
recompute it (``method`` and ``args``, the functions below) and whether it was measured on the
data it was chosen on (``sample``: ``in-sample`` claims must say so where they are quoted).

:func:`problems` is every way the pages and the index disagree:

* a figure on a page (a number with ×, µs, ms, s or %) that no claim for that page covers
  and that is not listed under ``not_results`` (limits, thresholds, sizes: not measurements);
* a claim whose text is missing from a page it names, or not labelled in-sample there;
* a claim whose numbers are not what its method computes from its file, at the precision
  the page prints them;
* a claim whose file is not in ``kernels/results/index.json`` (which names the series
  version and commit that measured it).

A claim about exploration whose files have left the tree (``docs/studies.md``) names the
commit that still holds them (``commit``): its files and the index are read from there with
``git show``, so the check needs the repository's history (a shallow clone fails it, naming
the commit).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "kernels" / "results"
INDEX = ROOT / "docs" / "evidence.json"

NUMBER = r"\d+(?:\.\d+)?"
# A figure: a number or a range, with the unit of a measurement.  "128×128" is a tile shape.
FIGURE = re.compile(
    rf"(?<![\w.×/])(?:{NUMBER}(?:\s*[–-]\s*{NUMBER})?)\s*(?:×(?!\s?\d)|µs\b|ms\b|s\b|%)"
)


def parse_result(name: str, data: bytes):
    """A result file's content: JSON (gzip-compressed where the name ends in ``.gz``), else
    text."""
    if name.endswith(".gz"):
        return json.loads(gzip.decompress(data))
    if name.endswith(".json"):
        return json.loads(data)
    return data.decode()


def read_result(path: Path):
    return parse_result(path.name, path.read_bytes())


@functools.cache
def _at_commit(root: Path, commit: str, path: str) -> bytes:
    try:
        shown = subprocess.run(
            ["git", "-C", str(root), "show", f"{commit}:{path}"], capture_output=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        raise OSError(
            f"{path} is not in commit {commit} here (a shallow clone lacks the history: "
            "git fetch --unshallow)"
        ) from None
    return shown.stdout


def load(claim: dict, name: str, root: Path = ROOT):
    """The result file ``name`` a claim cites: from the working tree, or as it was at the
    claim's ``commit`` where its files have left the tree."""
    if "commit" in claim:
        return parse_result(name, _at_commit(root, claim["commit"], f"kernels/results/{name}"))
    return read_result(root / "kernels" / "results" / name)


def results_index(claim: dict, root: Path = ROOT) -> dict:
    """``kernels/results/index.json`` where the claim's files are: now, or at its commit."""
    return load(claim, "index.json", root)


# --- how figures are recomputed -----------------------------------------------------------


def _e2e_pairs(report: dict, kind: str):
    sys.path.insert(0, str(ROOT / "kernels"))
    from moe_e2e.report import kind_pairs, pair_results

    wheels, pairs, _ = kind_pairs(report)[kind]
    return pair_results(pairs)


def e2e_speedup(report: dict, kind: str, metric: str, batches=()) -> list[float]:
    """Official ÷ patched per FP8 kind (time per token at each of ``batches``; or
    ``throughput``: patched ÷ official output tokens/s), medians over the engine pairs
    that ran on one machine, as ``moe_e2e.report`` pairs them."""
    official, patched = _e2e_pairs(report, kind)

    def median(results, value):
        return statistics.median(value(r) for r in results)

    if metric == "throughput":
        tokens = lambda r: r["throughput"]["output_tokens_per_s"]  # noqa: E731
        return [median(patched, tokens) / median(official, tokens)]
    speedups = []
    for batch in batches:
        per_token = lambda r, b=batch: r["decode"][b]["median_ms"]  # noqa: E731
        speedups.append(median(official, per_token) / median(patched, per_token))
    return speedups


def _engines(report: dict, names: list[str]) -> list[dict]:
    by_name = {v["name"]: v for v in report["variants"]}
    return [by_name[name] for name in names]


def e2e_first_request_ms(report: dict, variants: list[str]) -> list[float]:
    """The first request's time to first token of the named engines, in ms."""
    return [v["result"]["first_ttft_s"] * 1000 for v in _engines(report, variants)]


def e2e_field(report: dict, variants: list[str], field: str) -> list[float]:
    """A field of the named engines' records (a dotted path, e.g. ``triton_moe_warmup_s``
    or ``result.trace.ttft_p99_ms``)."""
    values = []
    for engine in _engines(report, variants):
        for key in field.split("."):
            engine = engine[key]
        values.append(engine)
    return values


def e2e_time_ratio(report: dict, engine: str, against: str, batches: list[str]) -> list[float]:
    """``engine``'s time per output token over ``against``'s at each decode batch."""
    new, old = (v["result"]["decode"] for v in _engines(report, [engine, against]))
    return [new[b]["median_ms"] / old[b]["median_ms"] for b in batches]


def e2e_throughput_ratio(report: dict, engine: str, against: str) -> list[float]:
    new, old = (v["result"]["throughput"] for v in _engines(report, [engine, against]))
    return [new["output_tokens_per_s"] / old["output_tokens_per_s"]]


def e2e_moe_gemm(report: dict, variants: list[str], batch: str, share: bool = False):
    """What the MoE GEMMs took per decode step of the named engines' profile at ``batch``: ms,
    or (``share``) percent of the step's GPU kernel time."""
    values = []
    for engine in _engines(report, variants):
        window = engine["result"]["profile"][batch]
        us = window["us_per_step"]["moe_gemm"]
        values.append(100 * us / window["kernel_us_per_step"] if share else us / 1000)
    return values


def e2e_kernels_compiled(report: dict, variants: list[str], after: str, until: str):
    """Triton kernels an engine compiled between two phases (``triton_kernels`` counts)."""
    return [
        v["result"]["triton_kernels"][until] - v["result"]["triton_kernels"][after]
        for v in _engines(report, variants)
    ]


def bench_cases(report: dict) -> dict[tuple, dict[str, float]]:
    """(shape, gemm, quant, M) -> variant -> µs, the geometric mean over the case's routings."""
    timed: dict = defaultdict(lambda: defaultdict(list))
    for row in report["rows"]:
        timed[(row["shape"], row["gemm"], row["quant"], row["M"])][row["variant"]].append(row["us"])
    return {
        key: {v: math.exp(statistics.fmean(map(math.log, us))) for v, us in by.items()}
        for key, by in timed.items()
    }


def bench_speedup(
    report: dict, new: str, old: str, shapes=(), gemms=(), quants=(), Ms=(), max_m=None
) -> list[float]:
    """``old`` ÷ ``new`` µs per case of a bench run, for the cases the filters keep."""
    ratios = []
    for (shape, gemm, quant, M), by in sorted(bench_cases(report).items()):
        if (shapes and shape not in shapes) or (gemms and gemm not in gemms):
            continue
        if (quants and quant not in quants) or (Ms and M not in Ms):
            continue
        if max_m is not None and M > max_m:
            continue
        if new in by and old in by:
            ratios.append(by[old] / by[new])
    return ratios


def bench_us(report: dict, variants: list[str], shape: str, gemm: str, quant: str, M: int):
    """The µs of each of ``variants`` in one case."""
    case = bench_cases(report)[(shape, gemm, quant, M)]
    return [case[v] for v in variants]


def layer_speedup(report: dict, new: str, old: str, quants=(), Ms=()) -> list[float]:
    """``old`` ÷ ``new`` µs of a whole-layer run (one row per shape, kind, M, routing and
    variant), per case and routing, for the kinds and M the filters keep."""
    timed: dict = defaultdict(dict)
    for row in report["rows"]:
        if (quants and row["quant"] not in quants) or (Ms and row["M"] not in Ms):
            continue
        timed[(row["shape"], row["quant"], row["M"], row["routing"])][row["variant"]] = row["us"]
    return [by[old] / by[new] for _, by in sorted(timed.items()) if new in by and old in by]


def jit_sweep(report: dict, trees: list[str], field: str = "variants", run="sweep"):
    """A ``jit_sweep`` run's compiled ``fused_moe_kernel`` variants (or ``stall_seconds``)
    per tree."""
    return [report["results"][tree][run][field] for tree in trees]


def tune_speedup(report: dict, over: str, Ms: list[int]) -> list[float]:
    """``moe-patch tune``'s own gains (in-sample: the config was chosen on these timings):
    over ``dispatch`` (the tree's own config) or ``release`` (the unpatched release)."""
    key = {"dispatch": "speedup", "release": "speedup_over_release"}[over]
    return [report["results"][str(M)][key] for M in Ms]


def rows_field(report: dict, field: str, **where) -> list[float]:
    """``field`` of every row of a result file whose keys have the values ``where`` names (a
    value or a list of them), e.g. a study's µs per shape and M."""
    allowed = {k: v if isinstance(v, list) else [v] for k, v in where.items()}
    return [
        row[field]
        for row in report["rows"]
        if all(row.get(key) in values for key, values in allowed.items())
    ]


def in_text(data, phrase: str) -> list[float]:
    """A figure a committed report states (a study's own Markdown, made from the raw file by
    the command it names; a note inside a result file): the phrase must be in it, and each
    number the page prints must be one of the phrase's, at the page's precision."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    if phrase not in text:
        raise ValueError(f"{phrase!r} is not in the file")
    return [float(n) for n in re.findall(NUMBER, phrase)]


METHODS = {
    "e2e_speedup": e2e_speedup,
    "e2e_first_request_ms": e2e_first_request_ms,
    "e2e_field": e2e_field,
    "e2e_time_ratio": e2e_time_ratio,
    "e2e_throughput_ratio": e2e_throughput_ratio,
    "e2e_moe_gemm": e2e_moe_gemm,
    "e2e_kernels_compiled": e2e_kernels_compiled,
    "bench_speedup": bench_speedup,
    "bench_us": bench_us,
    "layer_speedup": layer_speedup,
    "jit_sweep": jit_sweep,
    "tune_speedup": tune_speedup,
    "rows_field": rows_field,
    "in_text": in_text,
}

REDUCE = {
    "values": lambda v: list(v),
    "range": lambda v: [min(v), max(v)] if v else [],
    "geomean": lambda v: [math.exp(statistics.fmean(map(math.log, v)))] if v else [],
    "min": lambda v: [min(v)] if v else [],
    "max": lambda v: [max(v)] if v else [],
}


# --- checking ----------------------------------------------------------------------------


def load_index(path: Path = INDEX) -> dict:
    return json.loads(path.read_text())


def pages(index: dict, root: Path = ROOT) -> dict[str, str]:
    """Page (repository path) -> text, for every page the index's ``pages`` patterns name."""
    found = {}
    for pattern in index["pages"]:
        for path in sorted(root.glob(pattern)):
            found[path.relative_to(root).as_posix()] = path.read_text()
    return found


def figures(text: str) -> list[str]:
    """Every figure on a page, as printed (whitespace kept as one space)."""
    return [re.sub(r"\s+", " ", m.group(0)) for m in FIGURE.finditer(text)]


def _numbers(figure: str) -> list[str]:
    return re.findall(NUMBER, figure)


def _same(value: float, printed: str) -> bool:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return f"{value:.{decimals}f}" == printed


def sources(claim: dict) -> list[tuple[str, dict]]:
    """(file, args) pairs a claim is computed from: ``file`` and ``args``, or ``sources``."""
    if "sources" in claim:
        return [(source["file"], source.get("args", {})) for source in claim["sources"]]
    return [(claim["file"], claim.get("args", {}))]


def recompute(claim: dict, root: Path = ROOT) -> list[float]:
    """The numbers a claim's method gives on its files: each source's values (reduced per
    source first where the claim says ``per_source``, e.g. one geometric mean per GEMM),
    then the claim's ``reduce`` over them all; with ``pooled``, the method once over the
    rows of all its files (routings of one run written to a file each)."""
    if claim.get("pooled"):  # one run spread over several files: their rows as one report
        (first, args), *_ = sources(claim)
        rows = [row for name, _ in sources(claim) for row in load(claim, name, root)["rows"]]
        found = METHODS[claim["method"]]({**load(claim, first, root), "rows": rows}, **args)
        return REDUCE[claim.get("reduce", "values")](found)
    values = []
    for name, args in sources(claim):
        found = METHODS[claim["method"]](load(claim, name, root), **args)
        values += REDUCE[claim["per_source"]](found) if "per_source" in claim else found
    return REDUCE[claim.get("reduce", "values")](values)


def agrees(claim: dict, values: list[float]) -> bool:
    """Are the numbers the page prints for ``claim`` what ``values`` give at that precision?"""
    printed = _numbers(claim["figure"])
    if claim["method"] == "in_text":
        return bool(printed) and all(any(_same(v, p) for v in values) for p in printed)
    return len(values) == len(printed) and all(map(_same, values, printed))


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows, whitespace collapsed: where a figure's label
    (in-sample) must be."""
    found = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("|"):
            found += [_flat(line) for line in block.splitlines()]
        else:
            found += [_flat(item) for item in re.split(r"\n(?=\s*(?:[-*]|\d+\.)\s)", block)]
    return found


def quoted(claim: dict) -> str:
    """The words a claim is printed in: its ``context`` (the figure with the words that say
    what it is), else the figure itself."""
    return _flat(claim.get("context", claim["figure"]))


def _spans(text: str, phrase: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(re.escape(phrase), text)]


def problems(index: dict | None = None, texts: dict[str, str] | None = None, root=ROOT):
    """Every disagreement between the pages, ``docs/evidence.json`` and the result files."""
    index = index if index is not None else load_index()
    texts = texts if texts is not None else pages(index, root)
    found = []
    phrases: dict[str, list[str]] = defaultdict(list)
    for claim in index["claims"]:
        for page in claim["pages"]:
            phrases[page].append(quoted(claim))
    for exempt in index["not_results"]:
        phrases[exempt["page"]].append(_flat(exempt["text"]))
    for page, text in texts.items():
        flat = _flat(text)
        # Every figure must sit inside a claim's (or an exemption's) words on this page.
        covered = [span for phrase in phrases.get(page, []) for span in _spans(flat, phrase)]
        for match in FIGURE.finditer(flat):
            if not any(a <= match.start() and match.end() <= b for a, b in covered):
                found.append(
                    f"{page}: {match.group(0)!r} is a figure no claim in docs/evidence.json covers"
                    f" (…{flat[max(0, match.start() - 40) : match.end() + 10]}…)"
                )
        for exempt in (e for e in index["not_results"] if e["page"] == page):
            if _flat(exempt["text"]) not in flat:
                found.append(f"{page}: not_results entry {exempt['text']!r} is not on the page")
    for claim in index["claims"]:
        figure, words = claim["figure"], quoted(claim)
        if _flat(figure) not in words:
            found.append(f"claim {figure!r}: its context does not contain it")
        for page in claim["pages"]:
            if page not in texts:
                found.append(f"claim {figure!r} names {page}, which is not a page")
                continue
            where = [block for block in _blocks(texts[page]) if words in block]
            if not where:
                found.append(f"{page}: does not print claim {words!r}")
            elif claim["sample"] == "in-sample" and not all("in-sample" in b for b in where):
                found.append(f"{page}: {words!r} is in-sample and not labelled so there")
        if claim["sample"] not in ("in-sample", "out-of-sample"):
            found.append(f"claim {figure!r}: sample is in-sample or out-of-sample")
        names = [name for name, _ in sources(claim)]
        try:
            indexed = results_index(claim, root)
        except OSError as exc:
            found.append(f"claim {figure!r}: {exc}")
            continue
        missing = [name for name in names if name not in indexed]
        if missing:
            found.append(f"claim {figure!r}: {missing[0]} is not in kernels/results/index.json")
            continue
        try:
            values = recompute(claim, root)
        except (KeyError, OSError, ValueError, IndexError, TypeError) as exc:
            found.append(f"claim {figure!r}: cannot recompute from {', '.join(names)}: {exc!r}")
            continue
        if not agrees(claim, values):
            shown = ", ".join(f"{v:.4g}" for v in values) or "nothing"
            found.append(f"claim {figure!r}: {', '.join(names)} gives {shown}")
    return found


if __name__ == "__main__":
    listed = problems()
    print("\n".join(listed) or "every quoted figure is its result file's")
    sys.exit(1 if listed else 0)
