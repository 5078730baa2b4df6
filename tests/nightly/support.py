"""Nightly history rows built in memory for the tests: one series value, one night of an item."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.nightly import history


def series_value(arm: str, metric: str, value: float, *, n: int, env: str, **extra: Any) -> history.SeriesValue:
    """ARM:METRIC's value tonight, with no CI, a 3 % threshold, higher better (override any of them in `extra`)."""
    fields: dict[str, Any] = {"lo": None, "hi": None, "threshold": 0.03, "higher_is_better": True, **extra}
    return history.SeriesValue(
        series=f"{arm}:{metric}", arm=arm, metric=metric, value=value, n=n, env=env, env_arms=(arm,), **fields
    )


def item_night(i: int, series: Sequence[history.SeriesValue], envs: dict[str, Any], **extra: Any) -> history.ItemNight:
    """Night `i` (id n<i>, at time i) of a complete item of suite "s" on the simulator."""
    return history.ItemNight(
        night_id=f"n{i}",
        night_at=float(i),
        suite="s",
        status="complete",
        error=None,
        experiments=(),
        series=tuple(series),
        envs=envs,
        simulated=True,
        **extra,
    )
