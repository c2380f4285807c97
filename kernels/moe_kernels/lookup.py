"""vLLM's nearest-entry lookup in a tuned-config table, and the entries that make it give
the tree's own choice outside the token counts a search covered.

``try_get_optimal_moe_config`` launches the entry whose token count is nearest to the
batch's M, the smaller of two as near (``min`` over the keys in the file's order, which
is ascending in the files this project writes and in vLLM's H200 files it changes).  So an entry tuned for M = 64
also serves M = 65 ... 79, where nothing was measured, and a table that holds the
tree's default only at a few larger sizes (96, 128, 256, ...) launches, at 72 or 104
tokens, a config that the default would not have chosen there.

:func:`own_beyond_the_search` adds to a table, above its largest searched token count
and below its smallest, both ends of every range of M over which the tree's own choice
is one config, then drops each added entry the lookup does not need: with them the
lookup gives the tree's own choice at every M outside the searched range (checked up to
:data:`LOOKUP_LIMIT` tokens; the choice there is taken to hold above), and between the
searched token counts it takes the nearest searched entry as before.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

# Token counts up to which the filled table is exact.  vLLM 0.21.0's and 0.33.0's defaults
# last change at 129 tokens per expert (GROUP_SIZE_M): 33,024 tokens with 256 experts.
LOOKUP_LIMIT = 65536


def nearest_key(keys: list[int], M: int) -> int:
    """The key vLLM's lookup takes for M among ascending ``keys``."""
    i = bisect.bisect_left(keys, M)
    if i == len(keys):
        return keys[-1]
    if i == 0 or keys[i] == M:
        return keys[i]
    below, above = keys[i - 1], keys[i]
    return below if M - below <= above - M else above


def _runs(own: Callable[[int], dict], first: int, last: int) -> list[tuple[int, int]]:
    """The maximal ranges [a, b] of M in [first, last] over which ``own`` is constant."""
    runs: list[tuple[int, int]] = []
    previous = None
    for M in range(first, last + 1):
        choice = own(M)
        if runs and choice == previous:
            runs[-1] = (runs[-1][0], M)
        else:
            runs.append((M, M))
        previous = choice
    return runs


def own_beyond_the_search(
    table: dict[str, dict],
    searched: list[int],
    own: Callable[[int], dict],
    limit: int = LOOKUP_LIMIT,
) -> dict[str, dict]:
    """``table`` (token count as a string -> entry) with the entries that make vLLM's
    lookup give ``own(M)`` at every M below ``min(searched)`` and above
    ``max(searched)`` (up to ``limit``), in ascending order.  Entries the table already
    has there must be ``own``'s and stay (a file vLLM ships keeps all of its own); those
    between are not touched.  ``own`` is called once or more per M in those ranges:
    cache it."""
    lowest, highest = min(searched), max(searched)
    keys = {int(k): v for k, v in table.items() if k.isdigit()}
    other = {k: v for k, v in table.items() if not k.isdigit()}  # e.g. "triton_version"
    outside = [M for M in keys if M < lowest or M > highest]
    for M in outside:
        if keys[M] != own(M):
            raise ValueError(f"the table's entry at M={M} is not the tree's own choice there")

    inside = sorted(k for k in keys if lowest <= k <= highest)

    def wanted(M: int) -> dict:
        return own(M) if M < lowest or M > highest else table[str(nearest_key(inside, M))]

    def exact(ordered: list[int], first: int, last: int) -> bool:
        return all(keys[nearest_key(ordered, M)] == wanted(M) for M in range(first, last + 1))

    ordered = sorted(keys)
    # Both ends of each range over which own is one config: every M of the range is then
    # nearer to one of them than to any other entry.  First only for the ranges the
    # lookup misses; where those entries take token counts from other ranges, for all.
    runs = []
    for first, last, open_ended in ((1, lowest - 1, False), (highest + 1, limit, True)):
        found = _runs(own, first, last) if first <= last else []
        runs += [(a, b, open_ended and i == len(found) - 1) for i, (a, b) in enumerate(found)]
    added: set[int] = set()
    for every in (False, True):
        todo = [run for run in runs if every or not exact(ordered, run[0], run[1])]
        for a, b, last in todo:
            for M in (a,) if last else (a, b):
                if M not in keys:
                    keys[M] = own(M)
                    added.add(M)
        ordered = sorted(keys)
        if all(exact(ordered, a, b) for a, b, _ in runs):
            break
    else:  # both ends of every range always suffice
        raise AssertionError("the lookup still misses the tree's own choice")
    # Drop added entries (alone, or two neighbours together) whose neighbours serve the
    # token counts between them.
    for M in sorted(added):
        if M not in keys:
            continue
        i = ordered.index(M)
        for width in (1, 2):
            dropped = ordered[i : i + width]
            if width == 2 and (len(dropped) < 2 or dropped[1] not in added):
                break
            trial = ordered[:i] + ordered[i + width :]
            first = ordered[i - 1] + 1 if i > 0 else 1
            last = ordered[i + width] - 1 if i + width < len(ordered) else limit
            if exact(trial, first, last):
                ordered = trial
                for gone in dropped:
                    del keys[gone]
                break
    return other | {str(k): keys[k] for k in ordered}
