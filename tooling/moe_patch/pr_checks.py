"""``moe-patch pr --check``: each machine-checkable item of vLLM's pull-request checklist.

Every item is judged against the target tree's own rules (:mod:`moe_patch.contribution`)
where the tree states one, and says which file the rule came from; items that are
moe-patch's own reading of a rule ("a few bullets" is five, "concise" is
:data:`VISIBLE_LIMIT` characters) say so in their detail.  One branch, one list of
:class:`Item`; any ``fail`` makes ``pr`` exit 8.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from .contribution import Rules
from .report import FAIL, PASS

# moe-patch's readings of vLLM's words, stated in each item's detail.
VISIBLE_LIMIT = 4000  # characters outside <details> blocks and the template's checklist
TOTAL_LIMIT = 20000  # characters in all
MAX_CLAIMS = 5  # "a few concrete bullets"
MAX_TABLE_ROWS = 12  # "compact tables"
MAX_OVERVIEW_LINE = 300  # characters in one line of a 1-2 line Overview
MAX_BODY_LINES = 12  # a commit message's body: "what and why in a few lines"
REPEAT_MIN = 40  # a repeated sentence or line this long is a repeated block

ITEMS = (
    "commit",
    "template",
    "overview",
    "claims",
    "evidence",
    "size",
    "repeats",
    "complexity",
    "ruff",
    "docs",
    "tests",
    "placeholders",
    "agents",
)


@dataclass
class Item:
    name: str
    status: str  # PASS or FAIL
    detail: str


@dataclass
class Branch:
    """What the check needs to know about one branch."""

    name: str
    base_name: str  # the ref the branch sits on: --onto, or the branch it depends on
    message: str  # its commit's message
    commits: int  # commits between its parent and it
    expected_parent: bool  # its parent is --onto or the branch it depends on
    description: str | None  # None: no description file
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (added, removed)
    added: dict[str, list[str]] = field(default_factory=dict)  # path -> added lines
    new_texts: dict[str, str] = field(default_factory=dict)  # path -> text on the branch
    depends_on: str | None = None
    docs: tuple[str, ...] = ()  # Upstream-Docs pages
    assisted: bool = False  # the patch declares AI assistance
    lint_ok: bool | None = None  # None: nothing to lint
    lint: list[str] = field(default_factory=list)
    tests: list[tuple[str, bool | None, str]] = field(default_factory=list)
    local_paths: tuple[str, ...] = ()  # paths of this machine that must not appear
    # path -> the added lines that lie inside a Triton kernel (``@triton.jit``)
    triton_kernel_lines: dict[str, int] = field(default_factory=dict)


def check_branch(branch: Branch, rules: Rules) -> list[Item]:
    text = branch.description
    items = [_commit(branch, rules)]
    if text is None:
        missing = "no description file: run moe-patch pr to write it"
        items += [Item(n, FAIL, missing) for n in ("template", "overview", "claims")]
        items += [Item(n, FAIL, missing) for n in ("evidence", "size", "repeats")]
    else:
        items += [
            _template(text, rules),
            _overview(text, rules, branch),
            _claims(text, rules),
            _evidence(text),
            _size(text, rules),
            _repeats(text, rules),
        ]
    items += [
        _complexity(branch, rules, text or ""),
        _ruff(branch),
        _docs(branch, rules),
        _tests(branch, rules),
        _placeholders(branch),
    ]
    items.append(
        _agents(text, rules) if text is not None else Item("agents", FAIL, "no description")
    )
    return items


# --- markdown helpers ---------------------------------------------------------------


def _without_checklist(text: str, rules: Rules) -> str:
    """The description without the template's checklist and footer (kept as given)."""
    if rules.checklist:
        head, rule, _ = text.partition("\n---\n")
        if rule:
            return head
    return text


def visible(text: str) -> str:
    """What a reader sees before expanding anything: no ``<details>`` blocks, no comments."""
    text = re.sub(r"<details>.*?</details>", "", text, flags=re.S)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def sections(text: str) -> dict[str, list[str]]:
    """``## `` heading -> the bodies under it (a heading given twice has two)."""
    found: dict[str, list[str]] = {}
    fenced = False
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = line.strip()
            found.setdefault(current, []).append("")
            continue
        if current is not None:
            found[current][-1] += line + "\n"
    return found


def _section_of(text: str, words: tuple[str, ...]) -> tuple[str, str] | None:
    for heading, bodies in sections(text).items():
        if any(w in heading.lower() for w in words):
            return heading, bodies[0].split("\n---\n", 1)[0].strip()
    return None


# --- the items ----------------------------------------------------------------------


_TITLE = re.compile(r"^((?:\[[^\]]+\])+) \S")
# A measurement: a number with a unit of time, a speed-up or a share, or "before -> after".
_FIGURE = re.compile(
    r"\d+(?:\.\d+)?\s?(?:µs|us|ms)\b|\d+(?:\.\d+)?\s(?:s|seconds)\b|\d+(?:\.\d+)?(?:x\b|×)"
    r"|\d+(?:\.\d+)?\s?(?:%|[GT]B/s|tok/s)|\d+(?:\.\d+)?\s?(?:->|→)(?=\s?\d)"
)


def _commit(branch: Branch, rules: Rules) -> Item:
    problems = []
    if branch.commits != 1:
        problems.append(f"{branch.commits} commits on {branch.base_name} (expected one)")
    if not branch.expected_parent:
        problems.append(f"not based on {branch.base_name}")
    lines = branch.message.rstrip("\n").splitlines()
    title = lines[0] if lines else ""
    tags = _TITLE.match(title)
    if not tags:
        problems.append(f"the title {title!r} does not start with bracketed tags and a space")
    elif rules.title_tags:
        unknown = [t for t in re.findall(r"\[[^\]]+\]", tags.group(1)) if t not in rules.title_tags]
        if unknown:
            problems.append(f"{', '.join(unknown)} is not a tag {rules.source['title']} lists")
    trailers = [ln for ln in lines if re.match(r"^[A-Za-z][A-Za-z0-9-]*: \S", ln)]
    if not any(t.startswith("Signed-off-by: ") for t in trailers):
        problems.append("no Signed-off-by (DCO)")
    if branch.assisted and not any(
        t.startswith(("Assisted-by: ", "Co-authored-by: ", "Generated-by: ")) for t in trailers
    ):
        problems.append("AI assistance is not attributed in a trailer")
    body = [ln for ln in lines[1:] if ln.strip() and ln not in trailers]
    if len(body) > MAX_BODY_LINES:
        problems.append(f"the body has {len(body)} lines (at most {MAX_BODY_LINES}: what and why)")
    figures = _FIGURE.findall("\n".join(body))
    if figures:
        problems.append(
            f"the body quotes measurements ({', '.join(figures[:3])}): they belong in the "
            "description"
        )
    if problems:
        return Item("commit", FAIL, "; ".join(problems))
    return Item("commit", PASS, f"one commit, {title.split(' ', 1)[0]} title, signed off, "
                f"{len(body)}-line body")  # fmt: skip


def _template(text: str, rules: Rules) -> Item:
    if not rules.template:
        wanted = ["## Purpose", "## Test Plan", "## Test Result"]
        source = "the sections vLLM asked for before it had a template"
    else:
        wanted = rules.sections
        source = rules.source["template"]
    found = sections(text)
    problems = []
    for heading in wanted:
        bodies = found.get(heading, [])
        if len(bodies) != 1:
            problems.append(f"{heading} appears {len(bodies)} times")
            continue
        body = bodies[0].split("\n---\n", 1)[0]
        if not body.strip() or "<!--" in body:
            problems.append(f"{heading} is not filled in")
    if rules.checklist:
        given = _normalise_boxes(text.partition("\n---\n")[2].strip())
        if _normalise_boxes(rules.checklist) not in given:
            problems.append("the template's checklist is not kept as given")
    if "PLEASE FILL IN" in text:
        problems.append("the template's instruction line is still there")
    if problems:
        return Item("template", FAIL, f"{'; '.join(problems)} ({source})")
    kept = ", checklist kept" if rules.checklist else ""
    return Item("template", PASS, f"{len(wanted)} sections ({source}), each once{kept}")


def _normalise_boxes(text: str) -> str:
    return text.replace("- [x] ", "- [ ] ")


def _overview(text: str, rules: Rules, branch: Branch) -> Item:
    section = _section_of(text, ("overview", "purpose", "summary"))
    if section is None:
        return Item("overview", FAIL, "no Overview (or Purpose) section")
    heading, body = section
    problems = []
    if rules.overview_lines:
        lines = [ln for ln in body.splitlines() if ln.strip()]
        if len(lines) > rules.overview_lines:
            problems.append(
                f"{len(lines)} lines (at most {rules.overview_lines}, {rules.source['overview']})"
            )
        long = [ln for ln in lines if len(ln) > MAX_OVERVIEW_LINE]
        if long:
            problems.append(f"a line of {len(long[0])} characters (moe-patch: at most "
                            f"{MAX_OVERVIEW_LINE})")  # fmt: skip
    if branch.depends_on and branch.depends_on not in body:
        problems.append(f"does not name {branch.depends_on}, the branch it depends on")
    if problems:
        return Item("overview", FAIL, f"{heading}: " + "; ".join(problems))
    asked = (
        f" ({rules.source['overview']} asks {rules.overview_lines})" if rules.overview_lines else ""
    )
    return Item("overview", PASS, f"{heading}: {len(body.splitlines())} line(s){asked}")


def _claims(text: str, rules: Rules) -> Item:
    section = _section_of(text, ("claim",))
    if section is None:
        if rules.claims_as_bullets and any("claim" in s.lower() for s in rules.sections):
            return Item("claims", FAIL, "no Claims section")
        return Item("claims", PASS, "the template has no Claims section")
    heading, body = section
    bullets = [ln for ln in body.splitlines() if re.match(r"^[-*] \S", ln)]
    other = [ln for ln in body.splitlines() if ln.strip() and not re.match(r"^([-*] \S|\s+\S)", ln)]
    problems = []
    if not bullets:
        problems.append("no bullets")
    if len(bullets) > MAX_CLAIMS:
        problems.append(f"{len(bullets)} bullets (moe-patch reads 'a few' as at most {MAX_CLAIMS})")
    if other:
        problems.append(f"text that is not a bullet: {other[0][:60]!r}")
    source = f" ({rules.source['claims']})" if rules.claims_as_bullets else ""
    if problems:
        return Item("claims", FAIL, "; ".join(problems) + source)
    return Item("claims", PASS, f"{len(bullets)} bullet(s){source}")


_TABLE_WORDS = {
    "configuration": ("configuration", "config", "model", "shape", "case"),
    "baseline": ("baseline", "before"),
    "changed": ("with this", "after", "changed", "patched"),
    "runs": ("runs", "run count", "replays", "repeats"),
    "spread": ("spread", "variability", "iqr", "stdev", "±"),
}


def tables(text: str) -> list[list[str]]:
    """The markdown tables of ``text``, each as its lines."""
    found, current = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            current.append(line.strip())
        elif current:
            found.append(current)
            current = []
    if current:
        found.append(current)
    return [t for t in found if len(t) >= 2 and re.match(r"^\|[\s:|-]+\|$", t[1])]


def _evidence(text: str) -> Item:
    shown = tables(visible(text))
    if not shown:
        return Item("evidence", PASS, "no table outside <details>")
    problems = []
    if len(shown) > 1:
        problems.append(f"{len(shown)} tables outside <details> (one compact table)")
    for table in shown:
        header = table[0].lower()
        missing = [k for k, words in _TABLE_WORDS.items() if not any(w in header for w in words)]
        if missing:
            problems.append(f"a table without {', '.join(missing)} columns")
        if len(table) - 2 > MAX_TABLE_ROWS:
            problems.append(f"a table of {len(table) - 2} rows (at most {MAX_TABLE_ROWS})")
    if problems:
        return Item(
            "evidence",
            FAIL,
            "; ".join(problems) + " (pr-checklist: compact tables "
            "with configuration, baseline, changed result, run count and variability)",
        )
    return Item("evidence", PASS, f"one table of {len(shown[0]) - 2} rows with configuration, "
                "baseline, changed result, runs and spread")  # fmt: skip


def _size(text: str, rules: Rules) -> Item:
    body = _without_checklist(text, rules)
    seen = len(visible(body))
    if seen > VISIBLE_LIMIT or len(body) > TOTAL_LIMIT:
        return Item(
            "size",
            FAIL,
            f"{seen} characters outside <details>, {len(body)} in all (moe-patch: at most "
            f"{VISIBLE_LIMIT} and {TOTAL_LIMIT}; collapse or link lengthy material)",
        )
    return Item("size", PASS, f"{seen} characters outside <details>, {len(body)} in all")


def _repeats(text: str, rules: Rules) -> Item:
    body = re.sub(r"<!--.*?-->", "", _without_checklist(text, rules), flags=re.S)
    pieces: dict[str, int] = {}
    for paragraph in re.split(r"\n\s*\n", body):
        for line in paragraph.splitlines():
            if line.lstrip().startswith("|"):
                continue  # table rows are checked as data, not prose
            for sentence in re.split(r"(?<=[.!?])\s+", line.strip()):
                key = " ".join(sentence.lower().split())
                if len(key) >= REPEAT_MIN:
                    pieces[key] = pieces.get(key, 0) + 1
    repeated = [k for k, n in pieces.items() if n > 1]
    if repeated:
        return Item("repeats", FAIL, f"{len(repeated)} sentence(s) appear more than once, e.g. "
                    f"{repeated[0][:80]!r}")  # fmt: skip
    return Item("repeats", PASS, "no sentence of 40 characters or more appears twice")


def kind_of(path: str) -> str:
    """How vLLM's rules count a changed file: test, docs, config, data, kernel or code."""
    pure = PurePosixPath(path)
    if pure.parts and pure.parts[0] == "tests":
        return "test"
    if pure.parts and pure.parts[0] in ("docs", "examples") or pure.suffix in (".md", ".rst"):
        return "docs"
    if pure.suffix in (".json", ".yaml", ".yml", ".toml", ".ini", ".cfg"):
        return "config"
    if pure.parts and pure.parts[0] == "csrc" or pure.suffix in (".cu", ".cuh", ".cpp", ".h"):
        return "kernel"
    if pure.suffix in (".csv", ".txt", ".bin"):
        return "data"
    return "code"


def triton_kernel_spans(text: str) -> list[tuple[int, int]]:
    """The 1-based line ranges (decorators included) of a Python file's Triton kernels:
    functions decorated with ``triton.jit`` (or ``jit`` imported from triton); none where
    the file does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []

    def is_jit(node: ast.expr) -> bool:
        node = node.func if isinstance(node, ast.Call) else node
        if isinstance(node, ast.Attribute):
            return (
                node.attr == "jit"
                and isinstance(node.value, ast.Name)
                and (node.value.id == "triton")
            )
        return isinstance(node, ast.Name) and node.id == "jit"

    return [
        (min(d.lineno for d in fn.decorator_list), fn.end_lineno or fn.lineno)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and any(map(is_jit, fn.decorator_list))
    ]


def _complexity(branch: Branch, rules: Rules, text: str) -> Item:
    # vLLM's rule leaves kernels out of a change's size; Triton kernels in Python files
    # are kernels too, so their added lines count as such.
    counts: dict[str, int] = {}
    for path, (added, _) in branch.files.items():
        in_kernels = min(branch.triton_kernel_lines.get(path, 0), added)
        counts[kind_of(path)] = counts.get(kind_of(path), 0) + added - in_kernels
        if in_kernels:
            counts["kernel"] = counts.get("kernel", 0) + in_kernels
    counts = {k: n for k, n in counts.items() if n}
    code = counts.get("code", 0)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing"
    problems = []
    band = ""
    if rules.bands:
        low, high = rules.bands
        band = "low" if code < low else "medium" if code <= high else "high"
        band = (
            f"; {band} complexity ({rules.source['complexity']}: <{low} / {low}-{high} / >{high})"
        )
    if rules.rfc_lines:
        excluded = set(rules.rfc_excludes) | {"docs"}
        counted = sum(n for k, n in counts.items() if k not in excluded)
        rfc = re.search(r"github\.com/vllm-project/vllm/issues/\d+", text)
        if counted > rules.rfc_lines and not rfc:
            problems.append(
                f"{counted} lines besides {'/'.join(rules.rfc_excludes)}: above "
                f"{rules.rfc_lines} vLLM expects an RFC issue, linked from the description "
                f"({rules.source['rfc']})"
            )
    if code and counts.get("config"):
        problems.append(
            f"code ({code} lines) and config tables ({counts['config']} lines) in one branch: "
            "vLLM reviews tables as a config-only pull request"
        )
    if problems:
        return Item("complexity", FAIL, f"added {summary}{band}; " + "; ".join(problems))
    return Item("complexity", PASS, f"added {summary}{band}")


def _ruff(branch: Branch) -> Item:
    if branch.lint_ok is None:
        return Item("ruff", PASS, "no Python file changed")
    status = PASS if branch.lint_ok else FAIL
    return Item("ruff", status, "; ".join(branch.lint))


_ENV_ENTRY = re.compile(r'^\s+"(VLLM_\w+)":')
_CONFIG_FIELD = re.compile(r"^    ([a-z_][a-z0-9_]*): [^=]+=")


def _docs(branch: Branch, rules: Rules) -> Item:
    if not rules.docs_rule:
        return Item("docs", PASS, "this release's rules ask for no documentation change")
    problems, seen = [], []
    envs = branch.new_texts.get("vllm/envs.py")
    for line in branch.added.get("vllm/envs.py", []):
        entry = _ENV_ENTRY.match(line)
        if not entry or envs is None:
            continue
        name = entry.group(1)
        seen.append(name)
        lines = envs.splitlines()
        at = next((i for i, ln in enumerate(lines) if ln == line), None)
        above = lines[at - 1].strip() if at else ""
        if not above.startswith("#"):
            problems.append(f"{name} has no environment_variables comment")
    for path, added in branch.added.items():
        for at, line in enumerate(added):
            if "add_argument(" in line and "help=" not in " ".join(added[at : at + 8]):
                problems.append(f"a CLI argument in {path} without help=")
            field_ = _CONFIG_FIELD.match(line)
            if path.startswith("vllm/config/") and field_:
                following = added[at + 1].strip() if at + 1 < len(added) else ""
                seen.append(field_.group(1))
                if not following.startswith('"""'):
                    problems.append(f"config field {field_.group(1)} in {path} has no docstring")
    for page in branch.docs:
        seen.append(page)
        if page not in branch.files:
            problems.append(f"the patch's Upstream-Docs page {page} is not changed")
    source = rules.source["docs"]
    if problems:
        return Item("docs", FAIL, "; ".join(problems) + f" ({source})")
    if not seen:
        return Item("docs", PASS, f"no user-visible setting or declared docs page ({source})")
    return Item("docs", PASS, f"documented: {', '.join(seen)} ({source})")


def _tests(branch: Branch, rules: Rules) -> Item:
    code = [p for p in branch.files if kind_of(p) == "code"]
    source = f" ({rules.source['tests']})" if rules.failing_test_first else ""
    if not branch.tests:
        if code:
            return Item("tests", FAIL, f"code changes ({code[0]}, ...) and no new test{source}")
        return Item("tests", PASS, "no code change: no new test needed")
    failed = [f"{t}: {why}" for t, ok, why in branch.tests if ok is False]
    listed = [f"{t}: {why}" for t, ok, why in branch.tests if ok is None]
    shown = [f"{t}: {why}" for t, ok, why in branch.tests if ok]
    if failed:
        return Item("tests", FAIL, "; ".join(failed) + source)
    if listed and not shown:
        return Item("tests", PASS, "GPU-only, not run here: " + "; ".join(listed))
    detail = "; ".join(shown + [f"GPU-only {x}" for x in listed])
    return Item("tests", PASS, detail + source)


_PLACEHOLDER = re.compile(
    r"<(?!/?(?:details|summary|br|sup|sub|b|i|code|pre|p|img|a|ul|li|ol)\b)"
    r"(?!https?://)[A-Za-z][\w .,:/-]*>"
)
_UNFINISHED = re.compile(r"\b(?:TODO|FIXME|TBD|XXX)\b|PLEASE FILL IN")
_ABSOLUTE = re.compile(
    r"(?<![\w.:/-])(?:~/|/(?:home|root|tmp|work|Users|var|opt|mnt|srv|scratch|private)/)"
)
_THIS_REPOSITORY = re.compile(
    r"\bmoe-patch (?:apply|pr|verify|tune|wheel|rebase|checkout|export)\b|\bmoe_kernels\b|"
    r"\bmoe_e2e\b|(?<![\w/])kernels/(?:studies|results|moe_kernels|moe_e2e)\b|"
    r"(?<![\w])\.gpu/|\bpython -m studies\."
)


def _placeholders(branch: Branch) -> Item:
    problems = []
    for what, text in (("description", branch.description or ""), ("commit", branch.message)):
        if what == "description":
            text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
        for pattern, label in (
            (_PLACEHOLDER, "a placeholder"),
            (_UNFINISHED, "an unfinished marker"),
            (_ABSOLUTE, "a local path"),
            (_THIS_REPOSITORY, "a command or path that needs moe-patch's repository"),
        ):
            found = pattern.search(text)
            if found:
                problems.append(f"{what}: {label} ({found.group(0)!r})")
        for path in branch.local_paths:
            if path and path in text:
                problems.append(f"{what}: a path of this machine ({path})")
    if problems:
        return Item("placeholders", FAIL, "; ".join(problems))
    return Item("placeholders", PASS, "no placeholders, local paths or moe-patch commands")


def _agents(text: str, rules: Rules) -> Item:
    if not rules.must_include:
        return Item("agents", PASS, "the tree's AGENTS.md lists nothing a description must include")
    section = _section_of(text, ("agents.md", "asks a description"))
    if section is None:
        return Item("agents", FAIL, f"no answers to what {rules.source['agents']} asks")
    _, body = section
    open_items = [ln[6:60] for ln in body.splitlines() if ln.startswith("- [ ] ")]
    if open_items:
        return Item("agents", FAIL, f"unanswered: {open_items[0]!r}... ({rules.source['agents']})")
    return Item("agents", PASS, f"{len(rules.must_include)} items of {rules.source['agents']} "
                "answered")  # fmt: skip
