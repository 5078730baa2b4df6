"""Statistics as pure functions: no I/O, no clocks, unit-tested on known data."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of one sample (e.g. the tok/s of an arm's timed runs)."""

    n: int
    mean: float
    median: float
    min: float
    max: float
    stdev: float

    @property
    def cv(self) -> float:
        """Coefficient of variation; 0 for a single value or a zero mean."""
        return self.stdev / self.mean if self.mean else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cv": self.cv}


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("cannot summarise an empty sample")
    if any(math.isnan(v) for v in values):
        raise ValueError("sample contains NaN")
    return Summary(
        n=len(values),
        mean=statistics.fmean(values),
        median=statistics.median(values),
        min=min(values),
        max=max(values),
        stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
    )


def ratio(value: float, reference: float) -> float:
    """value / reference, the A/B comparison's headline number (1.0 = same speed)."""
    if reference <= 0:
        raise ValueError(f"reference must be positive, got {reference}")
    return value / reference
