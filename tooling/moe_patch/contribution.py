"""What the target tree's own contribution files ask of a pull request.

vLLM ships its reviewers' rules in the tree, and they change between releases: the
pull-request template (``.github/PULL_REQUEST_TEMPLATE.md``), ``AGENTS.md``,
``docs/contributing/README.md``, ``tests/AGENTS.md`` and the ``pr-checklist`` skill
(``.agents/skills/pr-checklist/SKILL.md``).  :func:`read_rules` reads them at the ``--onto``
commit and keeps, for each rule ``moe-patch pr --check`` can check by machine, its value
and the file it came from.  A rule a release does not state is None (or empty), and the
check that depends on it says so instead of inventing it.

:func:`answers` answers what ``AGENTS.md`` says "PR descriptions for AI-assisted work must
include", from what ``pr`` knows.  An item it has no answer for stays an unticked box, which
the check reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import git

from . import gitutil

TEMPLATE_PATH = ".github/PULL_REQUEST_TEMPLATE.md"
RULES_PATH = "AGENTS.md"
CONTRIBUTING_PATH = "docs/contributing/README.md"
TESTS_RULES_PATH = "tests/AGENTS.md"
CHECKLIST_PATH = ".agents/skills/pr-checklist/SKILL.md"
RULE_FILES = (TEMPLATE_PATH, RULES_PATH, CONTRIBUTING_PATH, TESTS_RULES_PATH, CHECKLIST_PATH)

_MUST_INCLUDE = re.compile(r"PR descriptions?\b.*\bmust\b\W*include", re.IGNORECASE)
_SUB_BULLET = re.compile(r"^(\s+)[-*]\s+(.+)$")
_SUMMARY_LINES = re.compile(r"summar\w*[^.\n]*?\b(\d+)\s*-\s*(\d+)\s*lines?", re.IGNORECASE)
_BAND_LOW = re.compile(r"Low complexity:\s*<\s*(\d+)\s*lines", re.IGNORECASE)
_BAND_HIGH = re.compile(r"High complexity:\s*>\s*(\d+)\s*lines", re.IGNORECASE)
_RFC = re.compile(r">\s*(\d+)\s*LOC\s+excluding\s+([\w/ ]+?)\)", re.IGNORECASE)
_PR_CAP = re.compile(r"cap is (\d+) open PRs", re.IGNORECASE)
_TAG = re.compile(r"`(\[[^`\]]+\](?:\[[^`\]]+\])*)`")


@dataclass
class Rules:
    """The machine-checkable rules of one vLLM tree; ``source`` names the file of each."""

    template: str | None = None
    sections: list[str] = field(default_factory=list)  # the template's "## " headings
    checklist: str | None = None  # the template's text after its first "---" line
    overview_lines: int | None = None  # "Summarize the change in 1-2 lines" -> 2
    claims_as_bullets: bool = False  # "Keep Claims to a few concrete bullets"
    bands: tuple[int, int] | None = None  # complexity bands: (low below, high above)
    rfc_lines: int | None = None  # an RFC above this many added lines ...
    rfc_excludes: tuple[str, ...] = ()  # ... not counting these kinds of file
    docs_rule: bool = False  # "Documenting User-Visible Changes"
    must_include: list[str] = field(default_factory=list)  # AGENTS.md's list
    failing_test_first: bool = False  # "show the new test failing without the fix"
    title_tags: tuple[str, ...] | None = None  # the tags a title must use; () = any tag
    pr_cap: int | None = None  # open pull requests per contributor
    source: dict[str, str] = field(default_factory=dict)  # rule -> file it came from


def read_rules(repo: Path, commit: str) -> Rules:
    """The rules of the tree at ``commit`` of ``repo`` (nothing is checked out)."""
    return rules_from({path: _file_at(repo, commit, path) for path in RULE_FILES})


def _file_at(repo: Path, commit: str, path: str) -> str | None:
    try:
        return gitutil.run(repo, "show", f"{commit}:{path}", strip_newline_in_stdout=False)
    except git.GitCommandError:
        return None


def rules_from(files: dict[str, str | None]) -> Rules:
    """:class:`Rules` from the texts of :data:`RULE_FILES` (None: the tree lacks it)."""
    rules = Rules()
    template = files.get(TEMPLATE_PATH)
    if template:
        rules.template = template
        head, rule, footer = template.partition("\n---\n")
        rules.sections = [line for line in head.splitlines() if line.startswith("## ")]
        rules.checklist = footer.strip() if rule else None
        rules.source["template"] = TEMPLATE_PATH
        summary = _SUMMARY_LINES.search(head)
        if summary:
            rules.overview_lines = int(summary.group(2))
            rules.source["overview"] = TEMPLATE_PATH
        if any("claim" in s.lower() for s in rules.sections) and "bullet" in head.lower():
            rules.claims_as_bullets = True
            rules.source["claims"] = TEMPLATE_PATH
    skill = files.get(CHECKLIST_PATH) or ""
    if skill:
        low, high = _BAND_LOW.search(skill), _BAND_HIGH.search(skill)
        if low and high:
            rules.bands = (int(low.group(1)), int(high.group(1)))
            rules.source["complexity"] = CHECKLIST_PATH
        if re.search(r"Claims to a few concrete bullets", skill, re.IGNORECASE):
            rules.claims_as_bullets = True
            rules.source["claims"] = CHECKLIST_PATH
        if rules.overview_lines is None:
            summary = re.search(r"short (\d+)\s*-\s*(\d+) line summary", skill)
            if summary:
                rules.overview_lines = int(summary.group(2))
                rules.source["overview"] = CHECKLIST_PATH
        if re.search(r"new test failing without the fix", skill, re.IGNORECASE):
            rules.failing_test_first = True
            rules.source["tests"] = CHECKLIST_PATH
    if not rules.failing_test_first and re.search(
        r"failure before the fix", files.get(TESTS_RULES_PATH) or "", re.IGNORECASE
    ):
        rules.failing_test_first = True
        rules.source["tests"] = TESTS_RULES_PATH
    contributing = files.get(CONTRIBUTING_PATH) or ""
    if contributing:
        rfc = _RFC.search(contributing)
        if rfc:
            rules.rfc_lines = int(rfc.group(1))
            rules.rfc_excludes = tuple(k.strip() for k in rfc.group(2).split("/") if k.strip())
            rules.source["rfc"] = CONTRIBUTING_PATH
        if "Documenting User-Visible Changes" in contributing:
            rules.docs_rule = True
            rules.source["docs"] = CONTRIBUTING_PATH
        cap = _PR_CAP.search(contributing)
        if cap:
            rules.pr_cap = int(cap.group(1))
            rules.source["pr_cap"] = CONTRIBUTING_PATH
        rules.title_tags = _title_tags(contributing)
        if rules.title_tags is not None:
            rules.source["title"] = CONTRIBUTING_PATH
    agents = files.get(RULES_PATH) or ""
    rules.must_include = required_items(agents)
    if rules.must_include:
        rules.source["agents"] = RULES_PATH
    if not rules.docs_rule and re.search(r"User-visible changes.*must update", agents, re.S):
        rules.docs_rule = True
        rules.source["docs"] = RULES_PATH
    return rules


def _title_tags(contributing: str) -> tuple[str, ...] | None:
    """The PR title tags of the "PR Title and Classification" section: () where it accepts
    any bracketed tag, the listed ones where it says to use one of them, None without it."""
    at = contributing.find("### PR Title")
    if at < 0:
        return None
    section = contributing[at:].split("\n### ", 1)[0]
    if re.search(r"any descriptive tag is accepted", section, re.IGNORECASE):
        return ()
    tags = []
    for found in _TAG.findall(section):
        tags += re.findall(r"\[[^\]]+\]", found)
    return tuple(dict.fromkeys(tags)) or ()


def required_items(rules: str) -> list[str]:
    """The bullets under the rules' "PR descriptions ... must include" line."""
    lines = rules.splitlines()
    for at, line in enumerate(lines):
        if _MUST_INCLUDE.search(line):
            items = []
            for following in lines[at + 1 :]:
                bullet = _SUB_BULLET.match(following)
                if not bullet:
                    break
                items.append(bullet.group(2).strip())
            return items
    return []


def answers(
    items: list[str],
    *,
    target: str,
    search: str,
    checks: list[str],
    tests: list[str],
    untested: list[str],
    assisted_by: list[str],
) -> list[str]:
    """One markdown bullet per required item.  ``tests``: the section that shows what the
    branch's new tests did on the base and on the branch (empty: none); ``untested``:
    commands left to a GPU machine or to the reviewer."""
    out = []
    for item in items:
        words = item.lower()
        if "duplicat" in words:
            out.append(
                f"- {item} {target} lacks this change (checked by a probe or a reverse-apply). "
                "Open pull requests were not searched; before opening: `gh pr list --repo "
                f'vllm-project/vllm --state open --search "{search}"`.'
            )
        elif "test" in words and "command" in words:
            ran = "; ".join(checks) if checks else "no checks"
            if tests:
                ran += (
                    "; the new tests on the base and on this branch (results under "
                    + tests[0]
                    + ")"
                )
            pending = (
                f" Left to a GPU machine or the reviewer: {', '.join(untested)}."
                if untested
                else ""
            )
            out.append(f"- {item} Run while preparing this branch: {ran}.{pending}")
        elif "evaluation" in words:
            out.append(f"- {item} No model accuracy evaluation was run for this change.")
        elif "ai assistance" in words or "ai-assist" in words:
            if assisted_by:
                out.append(
                    f"- {item} AI assistance was used: {'; '.join(assisted_by)} (the commit's "
                    "`Assisted-by:` trailer). The submitter reviews every changed line."
                )
            else:
                out.append(f"- {item} The patch records no AI assistance (no `Assisted-by:`).")
        else:
            out.append(f"- [ ] {item}")
    return out
