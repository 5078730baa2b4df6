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


# ---------------------------------------------------------------- speculative decoding arithmetic


def chain_accept_length(alpha: float, steps: int) -> float:
    """Mean tokens per verify cycle under the chain model: τ = (1 − α^(k+1)) / (1 − α), bonus token included."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if alpha == 1.0:
        return float(steps + 1)
    return (1.0 - alpha ** (steps + 1)) / (1.0 - alpha)


def alpha_for_accept_length(tau: float, steps: int) -> float | None:
    """The per-token acceptance α that gives mean accept length τ with k steps; None when τ is out of reach."""
    if tau < 1.0 or tau > steps + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(100):  # τ(α) is increasing in α: bisection converges to machine precision
        mid = (lo + hi) / 2
        if chain_accept_length(mid, steps) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class BreakEven:
    """Why a speculative arm is as fast as it is, and what it would need."""

    baseline_tps: float
    baseline_token_ms: float
    cycle_ms: float
    steps: int
    breakeven_tau: float
    breakeven_alpha: float | None  # None: break-even is not reachable with `steps` draft steps
    measured_tau: float | None = None
    measured_alpha: float | None = None
    target_tps: float | None = None
    target_tau: float | None = None
    target_alpha: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def breakeven(
    baseline_tps: float,
    cycle_ms: float,
    steps: int,
    *,
    measured_tau: float | None = None,
    target_tps: float | None = None,
) -> BreakEven:
    """A speculative cycle of cycle_ms yields τ tokens; it beats a baseline of baseline_tps only if
    τ > cycle_ms / baseline token time. 82.2 tok/s and a 30 ms cycle need τ ≈ 2.46."""
    if baseline_tps <= 0 or cycle_ms <= 0:
        raise ValueError("baseline tok/s and cycle time must be positive")
    token_ms = 1000.0 / baseline_tps
    tau = cycle_ms / token_ms
    target_tau = target_tps * cycle_ms / 1000.0 if target_tps else None
    return BreakEven(
        baseline_tps=baseline_tps,
        baseline_token_ms=token_ms,
        cycle_ms=cycle_ms,
        steps=steps,
        breakeven_tau=tau,
        breakeven_alpha=alpha_for_accept_length(tau, steps),
        measured_tau=measured_tau,
        measured_alpha=alpha_for_accept_length(measured_tau, steps) if measured_tau else None,
        target_tps=target_tps,
        target_tau=target_tau,
        target_alpha=alpha_for_accept_length(target_tau, steps) if target_tau else None,
    )


def spec_from_run(
    baseline_tps: float, spec_tps: float, accept_length: float, steps: int, target_tps: float | None = None
) -> BreakEven:
    """The same arithmetic from measurements: the spec arm's cycle time is accept length / its tok/s."""
    if spec_tps <= 0 or accept_length <= 0:
        raise ValueError("the speculative arm's tok/s and accept length must be positive")
    cycle_ms = 1000.0 * accept_length / spec_tps
    return breakeven(baseline_tps, cycle_ms, steps, measured_tau=accept_length, target_tps=target_tps)
