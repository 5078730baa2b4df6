"""Prefix-cache attestation: each arm's prefix-cache hit rate from its runs, and the warning when arms differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.results.run import Level, RunResult, level_name

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult, ArmResult

# Arms whose hit rates differ by more than this many percentage points (absolute) are flagged. A fixed margin, not a
# statistical test: the rate is pooled over runs and a few points move with a handful of repeated prompts, while
# vLLM issue 52884 saw +86 % throughput from a cache left warm; a gap of 5 points is already a different workload.
CACHE_GAP_POINTS = 5.0


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
    """Per level: the arms' hit rates when the highest and lowest differ by more than CACHE_GAP_POINTS."""
    out: list[str] = []
    for level in result.levels:
        rates = [(arm.label, pc["hit_rate"]) for arm in result.arms if (pc := arm_cache_at(arm, level))]
        rates = [(label, rate) for label, rate in rates if rate is not None]
        if len(rates) < 2:
            continue
        low, high = min(rates, key=lambda x: x[1]), max(rates, key=lambda x: x[1])
        if 100 * (high[1] - low[1]) > CACHE_GAP_POINTS:
            shown = " vs ".join(f"{label} {100 * rate:.1f} %" for label, rate in rates)
            at = f" @ {level_name(level)}" if len(result.levels) > 1 else ""
            out.append(
                f"a verdict compared arms with different prefix-cache hit rates{at} ({shown}; more than "
                f"{CACHE_GAP_POINTS:.0f} points apart): the cache, not speculation, may explain part of the difference"
            )
    return out
