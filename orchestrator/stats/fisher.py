"""Fisher's exact test on a 2×2 table of counts: does one group show an event more often than another."""

from __future__ import annotations

from math import comb


def more_often_p(hits: int, n: int, control_hits: int, control_n: int) -> float:
    """One-sided p-value that a group with `hits` of `n` shows the event more often than a control with
    `control_hits` of `control_n`: the hypergeometric chance, given both margins, of `hits` or more of all the
    events falling in the group (Fisher's exact test)."""
    if not (0 <= hits <= n and 0 <= control_hits <= control_n):
        raise ValueError(f"more_often_p: counts out of range ({hits}/{n}, {control_hits}/{control_n})")
    events, total = hits + control_hits, n + control_n
    if not total:
        return 1.0
    tail = sum(comb(n, k) * comb(control_n, events - k) for k in range(hits, min(n, events) + 1))
    return min(1.0, tail / comb(total, events))
