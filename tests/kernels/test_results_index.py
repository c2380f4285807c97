"""The committed results: plain checks, no kernel or GPU.

* ``kernels/results/index.json`` has an entry for every result file and none for a file
  that is not there (``results_index.py`` beside this test writes new entries).
* Every patch's ``Upstream-Results:`` names a file of ``kernels/results/provenance/``.
"""

from __future__ import annotations

import re

from results_index import RESULTS, ROOT, dump_index, is_indexed, load_index, result_files


def test_every_result_file_has_an_entry_and_every_entry_a_file():
    index = load_index()
    files = result_files()
    assert [f for f in files if f not in index] == [], (
        "not in kernels/results/index.json: run python tests/kernels/results_index.py"
    )
    assert [n for n in index if n not in files] == [], "index.json names files that are not there"


def test_index_entries_are_complete_and_written_canonically():
    index = load_index()
    for name, entry in index.items():
        assert is_indexed(name), name
        assert set(entry) == {"series", "commit", "study"}, name
        assert re.fullmatch(r"\d+\.\d+\.\d+\S*", entry["series"]), name
        assert re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"]), name
        assert entry["study"] == name.split("/")[0], name
    assert (ROOT / RESULTS / "index.json").read_text() == dump_index(index)


def test_patches_cite_results_kept_in_provenance():
    cited = []
    for patch in sorted((ROOT / "patches").rglob("*.patch")):
        message = patch.read_text().split("\ndiff --git ", 1)[0]
        # The file, then optional row selectors (key=value) for pr's table.
        cited += re.findall(r"^Upstream-Results:\s*(\S+)(?:\s+\S+=\S+)*\s*$", message, re.MULTILINE)
    assert cited, "no patch names its results: the trailer's spelling changed?"
    for name in cited:
        assert name.startswith("provenance/") and (ROOT / RESULTS / name).is_file(), name
