"""The README is a front page and docs/ the manual: a page per command and per patch, the
exit codes each page gives are the command's own, and every relative link leads somewhere."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from moe_patch import series
from moe_patch.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 10 * 1024
    first_screen = "\n".join(text.splitlines()[:45])
    # "How do I get a faster vLLM 0.33 on my H100?" is answered there.
    assert "moe-patch wheel --vllm 0.33" in first_screen
    assert "pip install dist/vllm-0.33.0+moe" in first_screen
    assert "moe-patch apply --installed" in first_screen and "H100" in text


@pytest.mark.parametrize("name", list(main.commands))
def test_every_command_has_a_page_with_its_exit_codes(name):
    page = DOCS / "commands" / f"{name}.md"
    text = page.read_text()
    assert text.startswith(f"# `moe-patch {name}`"), name
    assert f"({name}.md)" in (DOCS / "commands" / "README.md").read_text()
    help_text = CliRunner().invoke(main, [name, "--help"]).output
    codes = re.findall(r"^\s+(\d+)  ", help_text.split("Exit codes:")[1], re.MULTILINE)
    line = re.search(r"^Exit codes: (\d+(?:, \d+)*)", text, re.MULTILINE)
    assert line and line.group(1).split(", ") == codes, (name, codes)


def test_every_patch_has_a_page_that_says_what_why_measured_upstream_and_releases():
    ids = {
        p.id
        for base in series.bases(ROOT / "patches")
        for p in series.load(base, ROOT / "patches").patches
    }
    for patch_id in ids:
        text = (DOCS / "patches" / f"{patch_id}.md").read_text()
        for part in ("**What.**", "**Why.**", "## Measured", "**Upstream.**", "**Releases.**"):
            assert part in text, (patch_id, part)
        assert f"({patch_id}.md)" in (DOCS / "patches" / "README.md").read_text()


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def _links():
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if not re.match(r"[a-z]+:", target):
                yield pytest.param(page, target, id=f"{page.relative_to(ROOT)}:{target}")


@pytest.mark.parametrize("page, target", list(_links()))
def test_every_relative_link_leads_somewhere(page, target):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if resolved == (DOCS / "commands" / "pr.md").resolve() and not resolved.exists():
        pytest.skip("docs/commands/pr.md comes with another branch")
    assert resolved.exists(), target
    if anchor and resolved.suffix == ".md":
        assert anchor in _anchors(resolved), (target, sorted(_anchors(resolved)))
