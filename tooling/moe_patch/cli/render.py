"""How each command's result reads on a terminal: the text ``moe-patch`` prints.

The library (:mod:`moe_patch.commands` and the engines) returns reports; the command line
prints them with these, or as JSON with ``--json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..report import APPLIED, APPLIED_3WAY, FAIL, FAILED, PASS, SKIP, UPSTREAM, ApplyReport

if TYPE_CHECKING:
    from ..commands.clean import CleanReport
    from ..commands.release import ReleaseResult
    from ..commands.tune import Tuned
    from ..installed import InstalledReport
    from ..pr import PrReport
    from ..rebase import RebaseResult, RebaseState
    from ..releases import Comparison
    from ..verify import VerifyReport
    from ..wheel import WheelResult
    from ..workflow import CheckoutResult, ExportResult

_COLOURS = {APPLIED: "green", APPLIED_3WAY: "green", UPSTREAM: "cyan", FAILED: "red"}


def show(result, as_json: bool, render) -> None:
    """Print ``result``: its JSON with ``--json``, else ``render(result)``."""
    click.echo(result.to_json() if as_json else render(result))


def render_table(
    headers: list[str],
    rows: list[list[str]],
    colour_column: int | None = None,
    *,
    colour_columns: set[int] | None = None,
    colours: dict[str, str] | None = None,
) -> str:
    """A plain aligned table; cells of the coloured columns are styled by value."""
    coloured = set(colour_columns or ()) | ({colour_column} if colour_column is not None else set())
    palette = _COLOURS if colours is None else colours
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            text = cell.ljust(width)
            if i in coloured and cell in palette:
                text = click.style(text, fg=palette[cell])
            cells.append(text)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def render_apply(report: ApplyReport) -> str:
    rows = [
        [o.id, o.status, (o.commit or "")[:12], o.detail or o.upstream_status]
        for o in report.outcomes
    ]
    table = render_table(["patch", "status", "commit", "detail"], rows, colour_column=1)
    state = "unchanged (already applied)" if report.unchanged else (report.head or "")[:12]
    return (
        f"vLLM {report.vllm} in {report.tree} (series base v{report.series_base})\n"
        f"{table}\n"
        f"branch {report.branch}: {state}"
    )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def render_clean(report: CleanReport) -> str:
    """``moe-patch clean``'s table: what was (or would be) removed, and what was in use."""
    verb = "would remove" if report.dry_run else "removed"
    if not report.removed and not report.in_use:
        return "nothing to clean"
    lines = [
        f"{verb} {item['path']} ({item['what']}, {_mib(item['bytes'])})" for item in report.removed
    ]
    lines += [f"kept {path}: another moe-patch run is using it" for path in report.in_use]
    lines.append(f"{verb} {len(report.removed)} item(s), {_mib(report.bytes)}")
    return "\n".join(lines)


def render_installed(report: InstalledReport) -> str:
    lines = [f"vLLM {report.vllm} at {report.location}: {report.state}"]
    if report.series_base:
        lines[0] += f" (series v{report.series_base}"
        lines[0] += f", moe-patch {report.moe_patch})" if report.moe_patch else ")"
    if report.patches:
        rows = [[p["id"], p.get("status", "")] for p in report.patches]
        lines.append(render_table(["patch", "status"], rows, colour_column=1))
    if report.files:
        rows = [[f["path"], f["change"], f["now"]] for f in report.files]
        lines.append(
            render_table(
                ["file", "change", "now"],
                rows,
                colour_column=2,
                colours={"patched": "green", "release": "cyan", "changed": "red"},
            )
        )
    for path in report.skipped:
        lines.append(f"skipped (not installed, not needed at run time): {path}")
    if report.detail:
        lines.append(report.detail)
    return "\n".join(lines)


def render_wheel(result: WheelResult) -> str:
    rows = [[p["id"], p["status"], p["detail"]] for p in result.patches]
    changed = ", ".join(f["path"] for f in result.files) or "none"
    lines = [
        f"{result.path}",
        f"  vLLM {result.version} ({result.method}), {result.size / 1e6:.1f} MB, "
        f"sha256 {result.sha256}",
        f"  from {result.source} (sha256 {result.source_sha256[:16]}…), "
        f"series base v{result.series_base}",
        render_table(["patch", "status", "detail"], rows, colour_column=1),
        f"files changed: {changed}",
    ]
    for item in result.skipped:
        lines.append(f"skipped (not in the wheel, not needed at run time): {item['path']}")
    lines.append(f"done in {result.seconds:.1f} s")
    return "\n".join(lines)


def render_rebase_steps(state: RebaseState) -> str:
    rows = [
        [
            s.id,
            s.result,
            (s.commit or "")[:12],
            (
                f"Applied-Upstream: {s.applied_upstream} ({s.detail})"
                if s.applied_upstream
                else s.detail
            ),
        ]
        for s in state.steps
    ]
    header = f"rebase of series v{state.base} onto vLLM {state.onto} in {state.tree}"
    return header + "\n" + render_table(["patch", "result", "commit", "detail"], rows)


_CHECK_COLOURS = {PASS: "green", FAIL: "red", SKIP: "yellow"}


def _check_table(headers: list[str], rows: list[list[str]], coloured: set[int]) -> list[str]:
    return render_table(headers, rows, colour_columns=coloured, colours=_CHECK_COLOURS).splitlines()


def render_verify(report: VerifyReport) -> str:
    lines = []
    series_rows = [
        [f"v{s.base}", c.name, c.status, c.detail if c.status != FAIL else "see below"]
        for s in report.series
        for c in s.checks
    ]
    if report.release:
        c = report.release
        series_rows.append(["all", c.name, c.status, c.detail if c.status != FAIL else "see below"])
    lines += _check_table(["series", "check", "result", "detail"], series_rows, {2})
    lines.append("")
    names = list(dict.fromkeys(c.name for r in report.releases for c in r.checks))
    rows = []
    for r in report.releases:
        patches = ", ".join(f"{p['id']}: {p['status']}" for p in r.patches) or "-"
        cells = [(r.check(n).status if r.check(n) else "-") for n in names]
        rows.append([r.version, f"v{r.base}", *cells, f"{r.seconds:.0f}s", patches])
    coloured = set(range(2, 2 + len(names)))
    lines += _check_table(["release", "series", *names, "time", "patches"], rows, coloured)
    failures = [(where, c) for where, c in report.all_checks() if c.status == FAIL]
    if failures:
        lines += ["", "failed:"]
        lines += [f"  {where} {c.name}: {c.detail}" for where, c in failures]
    counts = report.counts()
    lines.append("")
    lines.append(
        f"verify: {len(report.releases)} release(s), {len(report.series)} series; "
        f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped "
        f"in {_duration(report.elapsed_s)} with {report.jobs} job(s)"
    )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f}s"


def render_pr(report: PrReport) -> str:
    lines = [
        f"target: {report.onto} ({report.onto_commit[:12]}), series base v{report.series_base}"
        + (f" ({report.series_reason})" if report.series_reason else ""),
    ]
    if report.python:
        lines.append(f"new tests run with: {report.python}")
    for o in report.outcomes:
        head = f"{o.id}: {o.status}"
        if o.branch:
            head += f" -> {o.branch} {(o.commit or '')[:12]} {o.title!r}"
        if o.stacked_on:
            head += f" (on {o.stacked_on})"
        lines.append(head)
        if o.detail:
            lines.append(f"    {o.detail}")
        width = max((len(c.name) for c in o.checks), default=0)
        for check in o.checks:
            lines.append(f"    {check.name:<{width}}  {check.status}  {check.detail}")
        if o.description:
            lines.append(f"    PR description: {o.description}")
    if report.order:
        lines.append("merge order:")
        by_branch = {o.branch: o for o in report.outcomes if o.branch}
        for number, branch in enumerate(report.order, start=1):
            after = by_branch[branch].stacked_on
            lines.append(f"  {number}. {branch}" + (f" (after {after})" if after else ""))
    lines += [f"note: {note}" for note in report.notes]
    if report.order and not report.checked_only:
        if report.setup:
            lines.append("first, once:")
            lines += [f"  $ {command}" for command in report.setup]
        lines.append("then, in merge order:")
        by_branch = {o.branch: o for o in report.outcomes if o.branch}
        for branch in report.order:
            lines += [f"  $ {command}" for command in by_branch[branch].commands]
        if report.finish:
            lines.append("finally:")
            lines += [f"  $ {command}" for command in report.finish]
    failing = [f"{o.id}: {c.name}" for o in report.outcomes for c in o.checks if c.status == "fail"]
    judged = [o for o in report.outcomes if o.checks]
    if judged:
        lines.append(
            f"checklist: every item passes on {len(judged)} branch(es)"
            if not failing
            else f"checklist: {len(failing)} item(s) fail: {', '.join(failing)}"
        )
    if report.order and not report.checked_only:
        lines.append("nothing was pushed; run the commands above to open the pull requests")
    return "\n".join(lines)


def render_checkout(result: CheckoutResult) -> str:
    rows = [[p["id"], p["commit"][:12], p["subject"]] for p in result.patches]
    return "\n".join(
        [
            f"series v{result.base} checked out in {result.tree} on branch {result.branch}",
            render_table(["patch", "commit", "subject"], rows),
            f"edit with git on top of v{result.base}, then: moe-patch export {result.tree}",
        ]
    )


def export_json(result: ExportResult) -> str:
    return json.dumps({**asdict(result), "changed": result.changed}, indent=2)


def render_export(result: ExportResult) -> str:
    rows = [[c["patch"], c["change"], (c["commit"] or "")[:12]] for c in result.changes]
    lines = [render_table(["patch", "change", "commit"], rows)]
    if result.written:
        lines.append(f"wrote {result.series_dir}")
    elif not result.changed:
        lines.append(f"{result.series_dir} is up to date")
    return "\n".join(lines)


def render_list(rows: list[dict], serves: dict[str, str]) -> str:
    """The series' patches, then per series the releases it serves and its GPU runs."""
    table = [
        [f"v{r['base']}", str(r["position"]), r["id"], r["upstream_status"], r["subject"]]
        for r in rows
    ]
    gpu = {r["base"]: r["gpu"] for r in rows}
    served = [[f"v{base}", serves[base], facts] for base, facts in gpu.items()]
    return "\n".join(
        [
            render_table(["base", "#", "patch", "upstream", "subject"], table),
            "",
            render_table(["series", "serves vLLM", "on a GPU"], served),
        ]
    )


def render_rebase(result: RebaseResult) -> str:
    """A finished rebase: its steps, the new series and the range-diff against the old."""
    count = sum(1 for s in result.state.steps if s.commit)
    lines = [
        render_rebase_steps(result.state),
        f"new series: {result.series_dir} ({count} patch{'es' if count != 1 else ''})",
    ]
    for entry in result.recorded:
        lines.append(f"recorded Applied-Upstream: {entry['version']} in {entry['path']}")
    lines.append(f"work tree: {result.state.tree} (edit, commit, then moe-patch export)")
    lines.append(f"\nrange-diff v{result.state.base} -> v{result.state.onto}:")
    lines.append(result.range_diff or "(both series are empty)")
    return "\n".join(lines)


def render_rebase_stopped(state: RebaseState) -> str:
    """A rebase stopped at a conflict: its steps, then where the conflicts are and how to go on."""
    step = state.steps[state.current]
    tree = state.tree
    lines = [
        f"rebase onto vLLM {state.onto} stopped at patch {state.current + 1}/"
        f"{len(state.steps)}: {step.id} ({step.name})",
        "conflicts:",
        *[f"    {tree}/{name}" for name in state.conflicts],
        "to resolve:",
        "    edit the files above (look for <<<<<<< and >>>>>>>), then",
        f"    git -C {tree} add {' '.join(state.conflicts)}",
        f"    moe-patch rebase --continue --into {tree}",
        "or:",
        f"    moe-patch rebase --skip --into {tree}     # drop this patch from the new series",
        f"    moe-patch rebase --abort --into {tree}    # give up; removes {tree}",
    ]
    return render_rebase_steps(state) + "\n" + "\n".join(lines)


def render_rebase_aborted(state: RebaseState) -> str:
    return (
        f"rebase onto vLLM {state.onto} aborted: removed {state.tree}; "
        "the series directories were not touched"
    )


def render_release(result: ReleaseResult) -> str:
    since = f"since {result.previous}" if result.previous else "(the first release)"
    return "\n".join(
        [
            f"recorded {result.record}: {result.files} files, {len(result.changed)} changed "
            f"{since}",
            "commit it, then tag the commit that contains it:",
            f"  git tag -a {result.tag} -m 'moe-patch {result.version}'",
        ]
    )


def render_release_check(result: Comparison) -> str:
    return f"release-version {result.status}: {result.detail}"


def render_tune(result: Tuned) -> str:
    """Per M: the release's time (where it was timed), the tree's dispatch, the tuned config,
    and the tuned config's gain over each; then where the config file is and how vLLM finds it."""
    rows = [result.report["results"][str(M)] for M in result.token_counts]
    against_release = all("release" in row for row in rows)
    columns = ["release µs"] if against_release else []
    columns += ["dispatch µs", "tuned µs"]
    columns += ["vs dispatch", "vs release"] if against_release else ["speed-up"]
    lines = ["  ".join([f"{'M':>5}", *(f"{c:>11}" for c in columns)])]
    for M, row in zip(result.token_counts, rows, strict=True):
        cells = [row["release"]["us"]] if against_release else []
        cells = [f"{us:.1f}" for us in [*cells, row["dispatch"]["us"], row["us"]]]
        cells.append(f"{row['speedup']:.2f}x")
        if against_release:
            cells.append(f"{row['speedup_over_release']:.2f}x")
        lines.append("  ".join([f"{M:>5}", *(f"{c:>11}" for c in cells)]))
    fused = result.report.get("fused_decode_tokens") or 0
    if fused and result.token_counts[0] <= fused:
        lines.append(
            f"at M <= {fused} vLLM runs this layer's fused decode path on Hopper (the tree's "
            "rule), not these configs: they serve there with VLLM_FUSED_MOE_DECODE=0"
        )
    out = Path(result.out)
    lines.append(f"wrote {out / result.report['config_file']}")
    lines.append(f"export VLLM_TUNED_CONFIG_FOLDER={out.resolve()}")
    return "\n".join(lines)
