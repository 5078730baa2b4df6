"""Pure statistics on known data: summaries and ratios."""

from __future__ import annotations

import pytest

from orchestrator.stats.estimates import ratio, summarize


def test_summarize_known_values() -> None:
    s = summarize([82.1, 82.3, 82.2, 82.3, 82.1])
    assert s.n == 5
    assert s.mean == pytest.approx(82.2)
    assert s.median == pytest.approx(82.2)
    assert (s.min, s.max) == (82.1, 82.3)
    assert s.stdev == pytest.approx(0.1)
    assert s.cv == pytest.approx(0.1 / 82.2)
    one = summarize([5.0])
    assert one.stdev == 0.0 and one.cv == 0.0
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="NaN"):
        summarize([1.0, float("nan")])


def test_ratio() -> None:
    assert ratio(60.0, 82.2) == pytest.approx(0.7299, abs=1e-4)
    with pytest.raises(ValueError):
        ratio(1.0, 0.0)


# ------------------------------------------------------------------ speculative decoding arithmetic
