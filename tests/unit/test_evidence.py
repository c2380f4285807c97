"""Every figure the README and docs/ quote is what its result file gives (tests/evidence.py,
docs/evidence.json), and the check fails on a planted wrong figure."""

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import evidence  # noqa: E402  (tests/evidence.py)

INDEX = evidence.load_index()
PAGES = evidence.pages(INDEX)


def planted(page: str, old: str, new: str, count: int = 1) -> dict[str, str]:
    assert old in PAGES[page], (page, old)
    return {**PAGES, page: PAGES[page].replace(old, new, count)}


def test_every_quoted_figure_is_its_result_files():
    assert evidence.problems(INDEX, PAGES) == []


def test_the_readme_and_every_manual_page_are_checked():
    assert "README.md" in PAGES and "docs/results.md" in PAGES and "docs/studies.md" in PAGES
    assert {p for c in INDEX["claims"] for p in c["pages"]} <= set(PAGES)
    assert "docs/patches/swap-ab-split-k.md" in PAGES


@pytest.mark.parametrize(
    "page, old, new, words",
    [
        # the recomputation says 1.10–1.14x: a page printing 1.11 is caught
        ("README.md", "1.10–1.14×", "1.11–1.14×", "'1.11–1.14×' is a figure no claim"),
        # one cell of a table
        ("docs/results.md", "4.41× / 5.84×", "4.41× / 5.94×", "'5.94×' is a figure no claim"),
        # a figure that equals another claim's on the same page, moved to the wrong place
        (
            "docs/commands/tune.md",
            "1.04× over\n  the dispatch",
            "1.05× over\n  the dispatch",
            "'1.05×' is a figure no claim",
        ),
        # a new figure with no result behind it
        (
            "docs/backend.md",
            "To go back to FlashInfer",
            "It is 1.5× faster. To go back to FlashInfer",
            "'1.5×' is a figure no claim",
        ),
        # an in-sample figure that stops saying so
        (
            "docs/patches/swap-ab.md",
            "1.035× over 0.33.0, in-sample\n",
            "1.035× over 0.33.0\n",
            "is in-sample and not labelled so there",
        ),
        # a study's figure, whose file is read from the commit that still holds it
        ("docs/studies.md", "1.052×", "1.062×", "'1.062×' is a figure no claim"),
    ],
)
def test_a_planted_wrong_figure_fails(page, old, new, words):
    found = evidence.problems(INDEX, planted(page, old, new))
    assert any(words in problem for problem in found), found


def test_a_wrong_figure_planted_in_the_page_and_the_index_alike_fails_on_its_file():
    index = copy.deepcopy(INDEX)
    claim = next(c for c in index["claims"] if c["figure"] == "1.10–1.14×")
    claim["figure"] = "1.11–1.14×"
    texts = {page: text.replace("1.10–1.14×", "1.11–1.14×") for page, text in PAGES.items()}
    found = evidence.problems(index, texts)
    assert found == [
        "claim '1.11–1.14×': provenance/h200-split-k-0.33-layer-bench.json gives 1.104, 1.14"
    ]


def test_a_claim_on_a_file_outside_the_results_index_or_without_its_phrase_fails():
    index = copy.deepcopy(INDEX)
    claim = next(c for c in index["claims"] if c["method"] == "in_text")
    claim["args"] = {"phrase": claim["args"]["phrase"] + " and more"}
    other = next(c for c in index["claims"] if c["method"] == "bench_speedup")
    other["file"] = "nowhere/bench.json"
    found = evidence.problems(index, PAGES)
    assert any("is not in the file" in p for p in found), found
    assert any("nowhere/bench.json is not in kernels/results/index.json" in p for p in found)


def test_what_counts_as_a_figure():
    text = "128×128 block, v0.21.0, 2.02–4.84× and 9.6 µs, 849 ms, 0.84–1.08 s, 21%, M = 4"
    assert evidence.figures(text) == ["2.02–4.84×", "9.6 µs", "849 ms", "0.84–1.08 s", "21%"]


def test_a_studys_figure_is_recomputed_from_the_commit_that_holds_its_file():
    """The studies' files left the tree; their claims read them from history."""
    index = copy.deepcopy(INDEX)
    claim = next(c for c in index["claims"] if c["figure"] == "1.141×" and "commit" in c)
    assert not (evidence.RESULTS / evidence.sources(claim)[0][0]).exists()
    assert evidence.problems(index, PAGES) == []
    claim["sources"] = [{**s, "args": {**s["args"], "old": "0.33.0"}} for s in claim["sources"]]
    assert evidence.problems(index, PAGES) == [
        "claim '1.141×': " + ", ".join(n for n, _ in evidence.sources(claim)) + " gives 1.068"
    ]


def test_a_claim_on_a_commit_this_clone_lacks_says_so():
    index = copy.deepcopy(INDEX)
    claim = next(c for c in index["claims"] if "commit" in c)
    claim["commit"] = "0" * 40
    (found,) = evidence.problems(index, PAGES)
    assert f"is not in commit {'0' * 40} here" in found and "git fetch --unshallow" in found


def test_every_json_result_a_claim_cites_records_its_command_and_gpu():
    for claim in INDEX["claims"]:
        for name, _ in evidence.sources(claim):
            data = evidence.load(claim, name)
            if isinstance(data, str):
                continue  # a study's Markdown names its inputs, which carry both
            for run in data.get("runs", [data]):
                # moe-patch tune's report records its inputs (tree, shape, seed, device)
                assert run.get("command") or run.get("inputs"), name
                env = run.get("environment") or {}
                gpu = env.get("gpu") or (run.get("inputs") or {}).get("device")
                assert gpu and ("H200" in gpu or "H100" in gpu), name


def test_the_index_is_written_canonically():
    path = evidence.INDEX
    assert path.read_text() == json.dumps(INDEX, indent=1, ensure_ascii=False) + "\n"
