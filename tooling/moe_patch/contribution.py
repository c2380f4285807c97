"""What the target's contribution rules ask a pull request's description to state.

vLLM's ``AGENTS.md`` lists what "PR descriptions for AI-assisted work must include".  Each
item is answered from what moe-patch knows: whether the target has the change, the checks
``pr`` ran and those it could not run, and the patch's own ``Assisted-by:`` trailer.  An
item it has no answer for stays an unticked box for the submitter.
"""

from __future__ import annotations

import re

RULES_PATH = "AGENTS.md"
_MUST_INCLUDE = re.compile(r"PR descriptions?\b.*\bmust\b\W*include", re.IGNORECASE)
_SUB_BULLET = re.compile(r"^(\s+)[-*]\s+(.+)$")


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
    untested: list[str],
    assisted_by: list[str],
) -> list[str]:
    """One markdown bullet per required item."""
    out = []
    for item in items:
        words = item.lower()
        if "duplicat" in words:
            out.append(
                f"- {item} {target} does not have this change (moe-patch's upstream check: its "
                "probe, else a clean reverse-apply, found it missing). Open pull requests were "
                "not searched from here; before opening: `gh pr list --repo vllm-project/vllm "
                f'--state open --search "{search}"`.'
            )
        elif "test" in words and "command" in words:
            ran = "; ".join(checks) if checks else "no checks"
            pending = (
                " Not run here (moe-patch builds no vLLM: run them with this branch installed,"
                f" on a GPU where they need one): "
                f"{', '.join(f'`{t}`' for t in untested)}."
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
