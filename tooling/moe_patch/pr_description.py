"""The pull-request description of one ``moe-patch pr`` branch.

Written into the target's own template (``.github/PULL_REQUEST_TEMPLATE.md`` at ``--onto``:
its sections in its order, its checklist and footer kept; without one, vLLM's older
``## Purpose`` / ``## Test Plan`` / ``## Test Result``) from three sources:

* the patch's description source, ``upstream/descriptions/<patch id>.md`` beside the series
  (``## Overview`` in one or two lines, ``## Claims`` as a few bullets, ``## Details``, and
  ``## Supporting material``, which goes into a collapsed ``<details>`` block); without one,
  the patch's commit message;
* what ``pr`` did: the branch's new tests on the base and on the branch, the commands a
  reviewer runs inside vLLM (the tests, ``pre-commit``, the patch's ``Upstream-Benchmark:``
  lines), the branch it depends on;
* the measurements its ``Upstream-Results:`` trailers name (files under ``kernels/results/``):
  the first as the one compact table (configuration, baseline, changed, runs, spread), the
  others in the collapsed block.  Each table says which release it was measured on: the
  pull request's base release where the run has it, else the release it had.

A trailer ``Upstream-Results: FILE key=value ...`` picks the rows: ``shape=``, ``quant=``,
``gemm=``, ``M=`` for a kernel benchmark; ``baseline=`` and ``changed=`` (engine-name
suffixes), ``kind=`` (checkpoint kinds), ``batch=`` and ``metric=first_ttft`` (the first
request instead of the time per output token) for an end-to-end run; values are
comma-separated.  A kernel benchmark's table ends with the geometric mean and the range
over every case of the run, so the rows shown are not the only evidence.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .contribution import Rules, answers
from .patchfile import Patch
from .upstreaming import body_for, title_for, upstreaming

DESCRIPTIONS = "descriptions"  # under the series' upstream/ folder
# Which of our sections fills a heading of the target's template, by its words.
_HEADING_KINDS = (
    (("purpose", "overview", "summary"), "overview"),
    (("claim",), "claims"),
    (("test plan",), "plan"),
    (("test result",), "results"),
    (("validation", "testing"), "validation"),
    (("detail", "motivation", "design"), "details"),
)
_COMMENT = re.compile(r"<!--(?!\s*markdownlint).*?-->\s*", re.S)
DEFAULT_M = (1, 8, 64)
DEFAULT_BATCHES = (1, 16)


@dataclass
class Source:
    """What a description says in the patch author's words."""

    overview: str
    claims: str
    details: str
    more: str = ""


@dataclass
class BranchFacts:
    """What ``pr`` knows about one branch when it writes the description."""

    title: str
    base_name: str  # --onto as given, e.g. v0.33.0
    base_commit: str
    base_version: str | None  # the release --onto is or contains
    depends_on: str | None = None  # the branch this one is stacked on
    depends_title: str | None = None
    tests: list[str] = field(default_factory=list)
    test_results: list[str] = field(default_factory=list)  # one line per test file
    untested: list[str] = field(default_factory=list)  # left to a GPU machine
    lint: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # what the branch changes


def source_for(patch: Patch) -> Source:
    """The patch's description source, or one made from its commit message."""
    path = patch.path.parent.parent / "upstream" / DESCRIPTIONS / f"{patch.id}.md"
    try:
        text = path.read_text()
    except OSError:
        return _from_message(patch)
    parts = _sections(text)
    return Source(
        overview=parts.get("overview", ""),
        claims=parts.get("claims", ""),
        details=parts.get("details", ""),
        more=parts.get("supporting material", ""),
    )


def _sections(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in re.split(r"(?m)^(?=## )", text):
        head, _, body = block.partition("\n")
        if head.startswith("## "):
            found[head[3:].strip().lower()] = body.strip()
    return found


def _from_message(patch: Patch) -> Source:
    paragraphs = [p for p in body_for(patch).split("\n\n") if p.strip()]
    overview = " ".join(paragraphs[0].split()) if paragraphs else title_for(patch)
    claims = "- " + title_for(patch).split("] ", 1)[-1]
    return Source(overview, claims, "\n\n".join(paragraphs[1:]))


# --- the results table --------------------------------------------------------------


@dataclass
class Table:
    label: str  # what was measured, where, on which release
    header: list[str]
    rows: list[list[str]]
    command: str = ""

    def markdown(self) -> str:
        lines = [
            "| " + " | ".join(self.header) + " |",
            "|" + "---|" * len(self.header),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


HEADER = ["configuration", "baseline", "with this change", "change", "runs", "spread"]


def results_tables(patch: Patch, results_dir: Path, base_version: str | None) -> list[Table]:
    """One compact table per ``Upstream-Results:`` trailer, in order."""
    tables = []
    for entry in upstreaming(patch).results:
        name, *selectors = entry.split()
        picks = dict(s.split("=", 1) for s in selectors if "=" in s)
        tables.append(result_table(name, results_dir, base_version, picks))
    return tables


def _load(path: Path) -> dict:
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def result_table(
    name: str, results_dir: Path, base_version: str | None, picks: dict[str, str] | None = None
) -> Table:
    picks = picks or {}
    try:
        data = _load(results_dir / name)
    except (OSError, ValueError):
        return Table(f"The results file {name} was not found; run the benchmark.", [], [])
    if "rows" in data:
        table = _bench_table(data, base_version, picks)
    elif "variants" in data:
        table = _e2e_table(data, base_version, picks)
    else:
        table = _jit_table(data, base_version)
    made = _made_at(results_dir, name)
    if made and table.rows:
        table.label += f" Changed tree: the moe-patch series at commit {made}."
    return table


def _made_at(results_dir: Path, name: str) -> str | None:
    """The commit of the moe-patch series a results file was made with (its index entry)."""
    try:
        entry = json.loads((results_dir / "index.json").read_text()).get(name) or {}
    except (OSError, ValueError, AttributeError):
        return None
    return entry.get("commit")


def _gpu(env: dict) -> str:
    parts = [env.get("gpu", "GPU ?").split(",")[0]]  # the name, not the driver or memory
    for key, label in (("torch", "torch"), ("triton", "Triton"), ("cuda", "CUDA")):
        if env.get(key):
            parts.append(f"{label} {env[key]}")
    return ", ".join(parts)


def _engine(variant: dict) -> str:
    """An end-to-end engine in words: which wheel, and what it was asked for."""
    what = (
        "the official wheel"
        if variant.get("wheel") == "official"
        else "the wheel with the moe-patch series"
    )
    if variant.get("fp8_env"):
        what += f" with `VLLM_FP8_MOE_BACKEND={variant['fp8_env']}`"
    if variant.get("requested_backend") not in (None, "auto"):
        what += f" with `--moe-backend {variant['requested_backend']}`"
    for flag in variant.get("engine_flags") or []:
        what += f" with `--{flag.replace('_', '-')}`"
    return what


def _release_note(measured: str, base_version: str | None) -> str:
    """Where a run was measured, against the pull request's base release."""
    if base_version and measured == base_version:
        return f"Measured on vLLM {measured}, this pull request's base."
    if base_version:
        return f"Measured on vLLM {measured} (no run on {base_version}, this pull request's base)."
    return f"Measured on vLLM {measured}."


def _speedup(before: float, after: float) -> str:
    ratio = before / after
    if ratio >= 1.005:
        return f"{ratio:.2f}× faster"
    if ratio <= 0.995:
        return f"{1 / ratio:.2f}× slower"
    return "level"


def _chosen_release(releases: list[str], base_version: str | None) -> str:
    """The base release where the run has it, else the newest run not newer than it."""

    def key(v: str):
        try:
            return Version(v)
        except InvalidVersion:
            return Version("0")

    ordered = sorted(releases, key=key)
    if base_version in ordered:
        return base_version
    older = [v for v in ordered if base_version and key(v) <= key(base_version)]
    return (older or ordered)[-1]


def _spread(values: list[float]) -> float | None:
    """The interquartile range as a fraction of the median."""
    if len(values) < 4:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _choices(picks: dict[str, str], key: str) -> list[str] | None:
    return picks[key].split(",") if key in picks else None


def _bench_table(data: dict, base_version: str | None, picks: dict[str, str]) -> Table:
    rows = data["rows"]
    releases = sorted({r["variant"] for r in rows if "+" not in r["variant"]})
    paired = [v for v in releases if any(r["variant"] == f"{v}+moe" for r in rows)]
    if not paired:
        return Table("The benchmark has no before/after pair.", [], [])
    release = _chosen_release(paired, base_version)
    times = {
        (r["shape"], r["gemm"], r["quant"], r["M"], r["variant"]): r.get("us_all") or [r["us"]]
        for r in rows
    }
    wanted_m = [int(m) for m in _choices(picks, "M") or DEFAULT_M]
    cells = sorted(
        {
            k[:4]
            for k in times
            if k[4] == release
            and k[3] in wanted_m
            and all(
                _choices(picks, field_) is None or value in _choices(picks, field_)
                for field_, value in (("shape", k[0]), ("gemm", k[1]), ("quant", k[2]))
            )
        },
        key=lambda c: (c[0], c[1], c[2], c[3]),
    )
    table_rows = []
    for cell in cells:
        before, after = times.get((*cell, release)), times.get((*cell, f"{release}+moe"))
        if not before or not after:
            continue
        b, a = statistics.median(before), statistics.median(after)
        shape, gemm, quant, m = cell
        spread = [s for s in (_spread(before), _spread(after)) if s is not None]
        table_rows.append(
            [
                f"{shape}, {quant} FP8, {gemm}, M = {m}",
                f"{b:.1f} µs",
                f"{a:.1f} µs",
                _speedup(b, a),
                str(min(len(before), len(after))),
                _percent(max(spread) if spread else None),
            ]
        )
    ratios = [
        statistics.median(times[(*k[:4], release)])
        / statistics.median(times[(*k[:4], f"{release}+moe")])
        for k in times
        if k[4] == release and (*k[:4], f"{release}+moe") in times
    ]
    if len(ratios) > len(table_rows):
        table_rows.append(
            [
                f"all {len(ratios)} cases of the run (shapes, scales, M)",
                "",
                "",
                f"{statistics.geometric_mean(ratios):.2f}× geometric mean, "
                f"{min(ratios):.2f}–{max(ratios):.2f}×",
                "",
                "",
            ]
        )
    method = data.get("method", {})
    label = (
        f"{_release_note(release, base_version)} {_gpu(data.get('environment', {}))}. Median "
        f"time per call, vLLM {release} as released against the same tree with the change, in "
        "one run (CUDA-graph replays"
        + (f", seed {method['seed']}" if "seed" in method else "")
        + "); runs: replays per case; spread: interquartile range / median."
    )
    return Table(label, HEADER, table_rows, data.get("command", ""))


def _e2e_table(data: dict, base_version: str | None, picks: dict[str, str]) -> Table:
    baseline_suffix = picks.get("baseline", "official")
    changed_suffix = picks.get("changed", "patched")
    batches = _choices(picks, "batch") or [str(b) for b in DEFAULT_BATCHES]
    engines = {v.get("name", ""): v for v in data.get("variants", []) if v.get("result")}
    first_request = picks.get("metric") == "first_ttft"
    table_rows = []
    for name, before in sorted(engines.items()):
        if not name.endswith("-" + baseline_suffix):
            continue
        stem = name[: -len(baseline_suffix) - 1]
        after = engines.get(f"{stem}-{changed_suffix}")
        kinds = _choices(picks, "kind")
        if after is None or (kinds and not stem.endswith(tuple(f"-{k}" for k in kinds))):
            continue
        if first_request:
            b, a = before["result"].get("first_ttft_s"), after["result"].get("first_ttft_s")
            if b and a:
                table_rows.append(
                    [
                        f"{stem}, first request ({before.get('moe_backend')} → "
                        f"{after.get('moe_backend')})",
                        f"{b * 1000:.0f} ms",
                        f"{a * 1000:.0f} ms",
                        _speedup(b, a),
                        "1",
                        "–",
                    ]
                )
            continue
        for batch in batches:
            b = (before["result"].get("decode") or {}).get(batch)
            a = (after["result"].get("decode") or {}).get(batch)
            if not b or not a:
                continue
            samples = [b.get("tpot_ms") or [b["median_ms"]], a.get("tpot_ms") or [a["median_ms"]]]
            spread = max((max(s) - min(s)) / statistics.median(s) for s in samples)
            table_rows.append(
                [
                    f"{stem}, batch {batch} ({before.get('moe_backend')} → "
                    f"{after.get('moe_backend')})",
                    f"{b['median_ms']:.2f} ms",
                    f"{a['median_ms']:.2f} ms",
                    _speedup(b["median_ms"], a["median_ms"]),
                    str(min(len(s) for s in samples)),
                    f"{spread * 100:.1f}%",
                ]
            )
    what = (
        "Time to first token of the first request after start-up, empty compile caches, one "
        "request per engine."
        if first_request
        else "Time per output token, median of the decode runs of each engine; spread: "
        "(max - min) / median."
    )
    pair = next(
        (
            (engines[n], engines.get(f"{n[: -len(baseline_suffix) - 1]}-{changed_suffix}"))
            for n in sorted(engines)
            if n.endswith("-" + baseline_suffix)
        ),
        None,
    )
    who = (
        f" Baseline: {_engine(pair[0])}; with this change: {_engine(pair[1])}."
        if pair and pair[1]
        else ""
    )
    label = (
        f"{_release_note(data.get('vllm', '?'), base_version)} "
        f"{_gpu(data.get('environment', {}))}; {data.get('model', '?')}, dummy weights, each "
        f"engine in a fresh process. {what}{who}"
    )
    return Table(label, HEADER, table_rows, data.get("command", ""))


def _jit_table(data: dict, base_version: str | None) -> Table:
    results = data.get("results", {})
    sweep = data.get("sweep_token_counts") or []
    releases = [label for label in results if "+" not in label and f"{label}+moe" in results]
    release = _chosen_release(releases, base_version) if releases else None
    table_rows = []
    for label in [release] if release else []:
        for run in ("sweep", "trace"):
            b, a = results[label].get(run), results[f"{label}+moe"].get(run)
            if not b or not a:
                continue
            what = (
                f"{len(sweep)} batch sizes, {min(sweep)}-{max(sweep)} tokens"
                if run == "sweep"
                else f"a {data.get('trace', {}).get('steps', '?')}-step serving trace"
            )
            table_rows.append(
                [
                    f"{what}: kernels compiled / seconds compiling",
                    f"{b['variants']} / {b['stall_seconds']:.1f} s",
                    f"{a['variants']} / {a['stall_seconds']:.1f} s",
                    f"{b['stall_seconds'] / max(a['stall_seconds'], 1e-9):.1f}× less",
                    "1",
                    "–",
                ]
            )
    label = (
        f"{_release_note(release or '?', base_version)} {_gpu(data.get('environment', {}))}. "
        f"Compilation of `fused_moe_kernel` ({data.get('shape', '?')}, FP8 "
        f"{data.get('quant', '?')}, vLLM's own config choice), each run in a fresh process with "
        "an empty Triton cache."
    )
    return Table(label, HEADER, table_rows, data.get("command", ""))


# --- the description ----------------------------------------------------------------


def _new_sentences(label: str, said: set[str]) -> str:
    """``label`` without the sentences an earlier table's label already gave."""
    kept = []
    for sentence in re.split(r"(?<=[.)])\s+(?=[A-Z])", label):
        if sentence not in said:
            kept.append(sentence)
            said.add(sentence)
    return " ".join(kept) or "The same conditions as above."


def sections(patch: Patch, facts: BranchFacts, results_dir: Path) -> dict[str, str]:
    """What the description says, by kind of section."""
    source = source_for(patch)
    plan = upstreaming(patch)
    overview = " ".join(source.overview.split("\n")) if source.overview else facts.title
    if facts.depends_on:
        overview += (
            f"\nDepends on the pull request from `{facts.depends_on}` "
            f"({facts.depends_title or 'the branch before it'}): merge that one first; this "
            "branch carries its commit."
        )
    commands = [f"- `pytest {t} -v`" for t in facts.tests]
    if facts.files:  # the pull request's one commit, whatever the reviewer's remotes
        commands.append("- `pre-commit run --from-ref HEAD~1 --to-ref HEAD`")
    if plan.benchmarks:
        commands += ["", "Benchmarks, on the base branch and on this one:", ""]
        commands += [f"- `{c}`" for c in plan.benchmarks]
    outcome = [f"- {line}" for line in facts.test_results]
    tables = [t for t in results_tables(patch, results_dir, facts.base_version) if t.rows]
    said: set[str] = set()
    evidence = (
        f"{_new_sentences(tables[0].label, said)}\n\n{tables[0].markdown()}" if tables else ""
    )
    more = [source.more] if source.more else []
    for table in tables[1:]:
        more.append(f"{_new_sentences(table.label, said)}\n\n{table.markdown()}")
    details = source.details
    if more:
        details += (
            "\n\n<details>\n<summary>Supporting material</summary>\n\n"
            + "\n\n".join(more)
            + "\n\n</details>"
        )
    validation = ["Tests and lint, inside vLLM:", "", *commands]
    if outcome:
        validation += ["", "Results while preparing this branch:", "", *outcome]
    if evidence:
        validation += ["", evidence]
    results = outcome + ([evidence] if evidence else [])
    return {
        "overview": overview,
        "claims": source.claims,
        "validation": "\n".join(validation),
        "plan": "\n".join(commands),
        "results": "\n\n".join(results) if results else "No measurements are recorded.",
        "details": details.strip(),
    }


def describe(patch: Patch, facts: BranchFacts, rules: Rules, results_dir: Path) -> str:
    """The description in the target's template (see the module's docstring)."""
    parts = sections(patch, facts, results_dir)
    asked = _agents_section(patch, facts, rules)
    if not rules.template:
        purpose = "\n\n".join(p for p in (parts["overview"], parts["claims"]) if p)
        if parts["details"]:
            purpose += "\n\n" + parts["details"]
        text = (
            f"## Purpose\n\n{purpose}\n\n## Test Plan\n\n{parts['plan']}\n\n"
            f"## Test Result\n\n{parts['results']}\n"
        )
        return text + (f"\n{asked}\n" if asked else "")
    head, rule, footer = rules.template.partition("\n---\n")
    kinds_present = set()
    blocks = []
    for block in re.split(r"(?m)^(?=## )", _COMMENT.sub("", head)):
        first, _, _ = block.partition("\n")
        if first.startswith("## "):
            heading = first[3:].strip().lower()
            kind = next(
                (k for words, k in _HEADING_KINDS if any(w in heading for w in words)), None
            )
            kinds_present.add(kind)
            blocks.append((first, kind))
        else:  # keep directives, drop the template's instructions
            kept = [line for line in block.splitlines() if line.strip().startswith("<!--")]
            blocks.append(("\n".join(kept), "directive"))
    if "claims" not in kinds_present and parts["claims"]:
        parts["overview"] += "\n\n" + parts["claims"]  # a template without a Claims section
    if "details" not in kinds_present and parts["details"]:
        parts["overview"] += "\n\n" + parts["details"]
    out = []
    for first, kind in blocks:
        if kind == "directive":
            out.append(first)
        else:
            out.append(f"{first}\n\n{parts.get(kind or '') or 'Not applicable.'}")
    if asked:
        out.append(asked)
    text = "\n\n".join(part for part in out if part) + "\n"
    if rule:
        if upstreaming(patch).assisted_by:
            footer = re.sub(r"- \[ \] (AI assistance was used)", r"- [x] \1", footer)
        text += rule + footer
    return text.rstrip("\n") + "\n"


def _results_heading(rules: Rules) -> str:
    """The heading under which the description shows the tests' results."""
    for heading in rules.sections:
        words = heading[3:].strip().lower()
        if "validation" in words or "test result" in words or "testing" in words:
            return heading[3:].strip()
    return "Test Result"


def _agents_section(patch: Patch, facts: BranchFacts, rules: Rules) -> str | None:
    if not rules.must_include:
        return None
    title = facts.title.split("] ", 1)[-1]
    lines = answers(
        rules.must_include,
        target=f"`{facts.base_name}` ({facts.base_commit[:12]})",
        search=" ".join(title.split()[:6]).replace('"', ""),
        checks=[line.split(" (", 1)[0] for line in facts.lint],
        tests=[_results_heading(rules)] if facts.test_results else [],
        untested=[f"`{t}`" for t in facts.untested]
        + (
            ["the benchmarks under " + _results_heading(rules)]
            if upstreaming(patch).benchmarks
            else []
        ),
        assisted_by=upstreaming(patch).assisted_by,
    )
    return (
        f"## What {rules.source.get('agents', 'AGENTS.md')} asks a description to state\n\n"
        + "\n".join(lines)
    )
