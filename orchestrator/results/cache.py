"""Prefix-cache attestation: each arm's prefix-cache hit rate from its runs, and the gap that holds back a verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.results.run import Level, RunResult, level_name

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult, ArmResult

# A comparison whose two arms' hit rates differ by more than this many percentage points (absolute) has no verdict
# unless the cache is part of what is measured (--cache-measured). A fixed margin, not a statistical test: the rate is
# pooled over runs and a few points move with a handful of repeated prompts, while vLLM issue 52884 saw +86 %
# throughput from a cache left warm; a gap of 5 points is already a different workload.
CACHE_GAP_POINTS = 5.0


@dataclass(frozen=True, kw_only=True)
class CacheGap:
    """Two compared arms' prefix-cache hit rates at one level, more than CACHE_GAP_POINTS apart. Unless `measured`
    (--cache-measured: the cache is part of what is compared), the comparison's verdict is held back: inconclusive,
    whatever its CI says, since the cache, not the arm's setting, may make the difference."""

    vs_label: str
    arm_label: str
    vs_rate: float
    arm_rate: float
    measured: bool = False

    @property
    def points(self) -> float:
        return 100 * abs(self.arm_rate - self.vs_rate)

    @property
    def rates(self) -> str:
        return f"{self.vs_label} {100 * self.vs_rate:.0f} %, {self.arm_label} {100 * self.arm_rate:.0f} %"

    @property
    def reason(self) -> str:
        return f"prefix-cache hit rates differ ({self.rates})"

    @property
    def advice(self) -> str:
        """What would give the comparison a verdict (more blocks would not: the gap is the workload's, not noise)."""
        return (
            "more blocks would not close it: run with --flush-cache (every timed run from an empty cache; if it was "
            "on, the gap is reuse within a run or how the engines count cached tokens: a workload that repeats no "
            "prompt within a run), or give --cache-measured if the cache is part of what is compared"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "vs_hit_rate": self.vs_rate,
            "arm_hit_rate": self.arm_rate,
            "points": self.points,
            "threshold_points": CACHE_GAP_POINTS,
            "measured": self.measured,
        }


def cache_gap(base: ArmResult, arm: ArmResult, level: Level, *, measured: bool = False) -> CacheGap | None:
    """The gap between two arms' hit rates at a level when it exceeds CACHE_GAP_POINTS; None when it does not, or
    when either server did not say (an unknown rate holds nothing back: "not reported" is shown per arm)."""
    got = [arm_cache_at(a, level) for a in (base, arm)]
    rates = [pc.get("hit_rate") if pc else None for pc in got]
    if rates[0] is None or rates[1] is None:
        return None
    if 100 * abs(float(rates[1]) - float(rates[0])) <= CACHE_GAP_POINTS:
        return None
    return CacheGap(
        vs_label=base.label, arm_label=arm.label, vs_rate=float(rates[0]), arm_rate=float(rates[1]), measured=measured
    )


def arm_prefix_cache(runs: Sequence[RunResult]) -> dict[str, Any] | None:
    """Cached prompt tokens / prompt tokens over the given runs (pooled), with the per-run rates; None when no run
    knew its cache use (an engine that says nothing, or results stored before attestation)."""
    known = [pc for r in runs if isinstance(pc := r.metrics.get("prefix_cache"), dict)]
    if not known:
        return None
    cached = sum(int(pc.get("cached_tokens") or 0) for pc in known)
    prompt = sum(int(pc.get("prompt_tokens") or 0) for pc in known)
    return {
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "hit_rate": cached / prompt if prompt > 0 else None,
        "runs": len(known),
        "run_hit_rates": [pc.get("hit_rate") for pc in known],
        "source": ", ".join(sorted({str(pc.get("source")) for pc in known})),
    }


def arm_cache_at(arm: ArmResult, level: Level | None = None) -> dict[str, Any] | None:
    """The arm's prefix-cache use over its valid timed runs at one level (default: the headline level)."""
    return arm_prefix_cache(arm.timed_at(level))


def cache_line(label: str, pc: dict[str, Any] | None) -> str:
    if pc is None or pc.get("hit_rate") is None:
        return f"{label}: prefix cache not reported by the server"
    return (
        f"{label}: prefix cache {100 * pc['hit_rate']:.1f} % of prompt tokens "
        f"({pc['cached_tokens']} of {pc['prompt_tokens']}, {pc['runs']} runs; from {pc['source']})"
    )


def cache_lines(result: ABResult, level: Level | None = None) -> list[str]:
    """One line per arm with its hit rate; [] when no arm's server reported any (nothing to attest)."""
    values = [(arm.label, arm_cache_at(arm, level)) for arm in result.arms]
    if all(pc is None for _, pc in values):
        return []
    return [cache_line(label, pc) for label, pc in values]


def cache_warnings(result: ABResult) -> list[str]:
    """Per comparison with a cache gap: a verdict held back (the rule), or one kept because --cache-measured."""
    out: list[str] = []
    for level in result.levels:
        for c in result.comparisons_at(level):
            gap = c.cache_gap
            if gap is None:
                continue
            at = f" @ {level_name(level)}" if len(result.levels) > 1 else ""
            if gap.measured:
                out.append(
                    f"{gap.arm_label} vs {gap.vs_label}{at}: {gap.reason}, more than {CACHE_GAP_POINTS:.0f} points "
                    "apart; the verdict stands because the cache is part of what is measured (--cache-measured)"
                )
            else:
                out.append(
                    f"{gap.arm_label} vs {gap.vs_label}{at}: verdict held back (inconclusive): {gap.reason}, more than "
                    f"{CACHE_GAP_POINTS:.0f} points apart, so the cache, not the arm's setting, may make the "
                    f"difference; {gap.advice}"
                )
    return out
