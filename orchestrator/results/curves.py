"""Each arm over the levels as the load plots draw it: per level, each number's mean and 95 % CI over launches."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.results.goodput import GOODPUT_METRICS
from orchestrator.results.run import Level, Rate
from orchestrator.stats.estimates import LaunchMean, interpolate_log, launch_mean, pareto_front

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult, ArmResult, LaunchResult
    from orchestrator.results.run import RunResult

# The latency percentiles the latency-against-rate plot draws (config/slo.METRICS names, seconds), in panel order.
LATENCIES = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99")
ACHIEVED = "achieved_rate"  # requests completed per second (below)
THROUGHPUT = ("tok_s", "aggregate_tok_s")  # tok/s per user (per stream) and of all streams


def achieved_rate(run: RunResult) -> float | None:
    """Requests completed per second: open loop, the client's fitted completion rate (client.summary.fitted_rate);
    closed loop, the completed requests over the run's seconds (what a concurrency level served)."""
    if run.rate:
        value = run.open_loop.get("achieved_rate")
        return float(value) if isinstance(value, int | float) and value > 0 else None
    done = run.requests - run.errors
    return done / run.seconds if run.seconds > 0 and done > 0 else None


def launch_number(launch: LaunchResult, level: Level, name: str, arm: ArmResult) -> float | None:
    """One launch's value of a number at one level: the median of its valid timed runs (as for tok/s)."""
    if name == ACHIEVED:
        values = [v for r in launch.timed_at(level) if (v := achieved_rate(r)) is not None]
        return statistics.median(values) if values else None
    return launch.value_at(level, name, arm.slo)


@dataclass(frozen=True)
class LevelPoint:
    """One arm at one level: each number's mean over the launches that have it, with its 95 % CI (LaunchMean)."""

    level: Level
    values: Mapping[str, LaunchMean]

    def get(self, name: str) -> LaunchMean | None:
        return self.values.get(name)


@dataclass(frozen=True)
class ArmCurve:
    """One arm over the levels measured, in increasing level order (levels it has no valid run at left out)."""

    label: str
    index: int
    points: tuple[LevelPoint, ...]

    def series(self, name: str) -> list[tuple[Level, LaunchMean]]:
        """(level, estimate) of one number at every level that has it."""
        return [(p.level, m) for p in self.points if (m := p.get(name)) is not None]

    def at_level(self, name: str, level: float) -> float | None:
        """One number at a load between two measured levels (linear in log level): where a crossover lies on it."""
        pairs = self.series(name)
        return interpolate_log([float(lv) for lv, _ in pairs], [m.value for _, m in pairs], level)


def arm_curve(arm: ArmResult, index: int, levels: Sequence[Level], names: Sequence[str]) -> ArmCurve:
    """Each number of `names` (ACHIEVED, or a config/slo.METRICS name: goodput needs the arm's SLO) at every level."""
    points = []
    for level in sorted(levels, key=float):
        values: dict[str, LaunchMean] = {}
        for name in names:
            per_launch = [v for la in arm.launches if (v := launch_number(la, level, name, arm)) is not None]
            if per_launch:
                # A goodput may be 0 at a saturated level: a geometric mean has no room for it.
                values[name] = launch_mean(per_launch, geometric=name not in GOODPUT_METRICS)
        if values:
            points.append(LevelPoint(level, values))
    return ArmCurve(arm.label, index, tuple(points))


def curves(result: ABResult, names: Sequence[str]) -> list[ArmCurve]:
    """arm_curve of every arm of the result over its levels."""
    return [arm_curve(arm, i, result.levels, names) for i, arm in enumerate(result.arms)]


@dataclass(frozen=True, kw_only=True)
class FrontPoint:
    """A point of the Pareto front of tok/s per user against aggregate tok/s: which arm at which level."""

    label: str
    index: int
    level: Level
    aggregate: float
    per_user: float


def front(arms: Sequence[ArmCurve]) -> list[FrontPoint]:
    """The points (every arm at every level) no other beats on both tok/s per user and aggregate tok/s, from the
    highest aggregate tok/s down (the order the front's trade-off reads in)."""
    pts = [
        FrontPoint(label=a.label, index=a.index, level=p.level, aggregate=agg.value, per_user=user.value)
        for a in arms
        for p in a.points
        if (agg := p.get("aggregate_tok_s")) is not None and (user := p.get("tok_s")) is not None
    ]
    keep = pareto_front([(p.aggregate, p.per_user) for p in pts])
    return sorted((pts[i] for i in keep), key=lambda p: -p.aggregate)


def is_rate(levels: Sequence[Level]) -> bool:
    return bool(levels) and isinstance(levels[0], Rate)
