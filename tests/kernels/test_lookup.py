"""moe_kernels.lookup: vLLM's nearest-entry lookup, and the entries that make a table give
the tree's own choice outside the searched token counts.

Every property is checked by looking up each token count the way vLLM does
(``min(keys, key=|key - M|)`` over the file's keys in order), not with the module's own
``nearest_key``.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moe_kernels.lookup import nearest_key, own_beyond_the_search

LIMIT = 3000  # small enough to check every M; the rule does not depend on it


def vllm_lookup(table: dict, M: int) -> dict:
    configs = {int(k): v for k, v in table.items() if k.isdigit()}
    return configs[min(configs, key=lambda key: abs(key - M))]


def step_function(steps: list[int], values: list[int]):
    """M -> {"tile": value}: a new value after each step, as vLLM's defaults change."""

    @functools.cache
    def own(M: int) -> dict:
        return {"tile": values[sum(M > s for s in steps) % len(values)]}

    return own


@st.composite
def cases(draw):
    searched = sorted(draw(st.sets(st.integers(1, 200), min_size=1, max_size=8)))
    steps = sorted(draw(st.sets(st.integers(1, LIMIT), max_size=8)))
    values = draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    table = {str(M): {"tuned": M} for M in searched}
    # Entries the tree's own file has outside the searched range (they must be own's)
    own = step_function(steps, values)
    shipped = draw(st.sets(st.integers(1, LIMIT), max_size=6))
    for M in shipped:
        if not searched[0] <= M <= searched[-1]:
            table[str(M)] = own(M)
    return dict(sorted(table.items(), key=lambda kv: int(kv[0]))), searched, own


@settings(max_examples=150, deadline=None)
@given(cases())
def test_the_lookup_gives_the_trees_own_choice_outside_the_search(case):
    table, searched, own = case
    filled = own_beyond_the_search(table, searched, own, limit=LIMIT)
    assert list(filled) == sorted(filled, key=int)  # vLLM's order, ascending
    for M in range(1, LIMIT + 200):  # above the limit the last choice holds
        if M < searched[0] or M > searched[-1]:
            assert vllm_lookup(filled, M) == own(min(M, LIMIT)), M
        else:  # between the searched token counts, the lookup is as it was
            assert vllm_lookup(filled, M) == vllm_lookup(table, M), M
    # Nothing the table had is dropped or changed
    assert all(filled[k] == v for k, v in table.items())


def test_a_default_that_changes_at_96_and_128_needs_three_entries():
    """vLLM 0.21.0's per-tensor default: 32-row tiles to 96 tokens, 64 above; 4 warps to
    128, 8 above.  The old tables held it at 96, 128, 256, ...: 104 tokens then took the
    96 entry, and 72 the tuned 64 one.  65 serves to 96, 128 from 97 (as near to 128 as
    96 is to 65, and nearer beyond), 129 from there on."""

    @functools.cache
    def own(M):
        return {"BLOCK_SIZE_M": 32 if M <= 96 else 64, "num_warps": 4 if M <= 128 else 8}

    table = {str(M): {"tuned": M} for M in (1, 2, 4, 8, 16, 32, 64)}
    filled = own_beyond_the_search(table, [1, 2, 4, 8, 16, 32, 64], own, limit=LIMIT)
    assert list(filled)[7:] == ["65", "128", "129"]
    assert vllm_lookup(filled, 72) == own(72) and vllm_lookup(filled, 104) == own(104)


def test_a_shipped_file_gains_only_what_its_own_entries_do_not_give():
    """A file vLLM ships keeps its entries; a tuned 64 entry would also serve 65-80, where
    vLLM's own 64 entry served, so the file gains one entry at 65."""
    shipped = {str(M): {"vllm": M} for M in (1, 2, 4, 8, 16, 32, 64, 96, 128, 256)}
    keys = [int(k) for k in shipped]

    @functools.cache
    def own(M):
        return shipped[str(min(keys, key=lambda k: abs(k - M)))]

    table = {**shipped, "64": {"tuned": 64}}
    filled = own_beyond_the_search(table, [1, 2, 4, 8, 16, 32, 64], own, limit=LIMIT)
    assert list(filled) == ["1", "2", "4", "8", "16", "32", "64", "65", "96", "128", "256"]
    assert filled["65"] == shipped["64"]


def test_an_entry_outside_the_search_that_is_not_the_trees_own_is_refused():
    own = functools.cache(lambda M: {"tile": 1})
    with pytest.raises(ValueError, match="M=512"):
        own_beyond_the_search({"1": {"tile": 2}, "512": {"tile": 2}}, [1], own, limit=LIMIT)


def test_nearest_key_takes_the_smaller_of_two_as_near():
    assert nearest_key([1, 2, 4], 3) == 2
    assert nearest_key([8, 16], 12) == 8 and nearest_key([8, 16], 13) == 16
    assert nearest_key([8, 16], 1) == 8 and nearest_key([8, 16], 100) == 16
