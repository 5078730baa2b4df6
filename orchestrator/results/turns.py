"""Multi-turn sessions' numbers by turn: each arm's TTFT, tok/s and prefix-cache share at turn 1, 2, …"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.results.run import Level, RunResult

if TYPE_CHECKING:
    from orchestrator.results.model import ABResult, ArmResult


def arm_turns(runs: Sequence[RunResult]) -> list[dict[str, Any]] | None:
    """Per turn over the given runs: requests and tokens pooled, TTFT (p50) and tok/s per stream as the median of
    the runs' values (as the headline numbers are), the prefix cache's share of the turn's prompt tokens; None
    when no run was multi-turn."""
    per_run = [t for r in runs if isinstance(t := r.metrics.get("turns"), list)]
    if not per_run:
        return None
    out = []
    for turn in sorted({int(t["turn"]) for ts in per_run for t in ts}):
        rows = [t for ts in per_run for t in ts if int(t["turn"]) == turn]
        ttft = [float(t["ttft_s"]) for t in rows if t.get("ttft_s") is not None]
        rates = [float(t["tok_s"]) for t in rows if t.get("tok_s") is not None]
        prompt = sum(int(t.get("prompt_tokens") or 0) for t in rows)
        known = all(t.get("cached_tokens") is not None for t in rows)
        cached = sum(int(t["cached_tokens"]) for t in rows) if known else None
        out.append(
            {
                "turn": turn,
                "requests": sum(int(t.get("requests") or 0) for t in rows),
                "runs": len(rows),
                "ttft_s": statistics.median(ttft) if ttft else None,
                "tok_s": statistics.median(rates) if rates else None,
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "cache_hit_rate": cached / prompt if cached is not None and prompt > 0 else None,
            }
        )
    return out


def arm_turns_at(arm: ArmResult, level: Level | None = None) -> list[dict[str, Any]] | None:
    """The arm's numbers by turn over its valid timed runs at one level (default: the headline level)."""
    return arm_turns(arm.timed_at(level))


def turn_line(label: str, turns: list[dict[str, Any]]) -> str:
    def ms(v: Any) -> str:
        return "-" if v is None else f"{1000 * v:.0f}"

    def rate(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"

    said = [
        f"TTFT ms {' / '.join(ms(t['ttft_s']) for t in turns)}",
        f"tok/s {' / '.join(rate(t['tok_s']) for t in turns)}",
    ]
    if any(t["cache_hit_rate"] is not None for t in turns):
        shown = ["-" if t["cache_hit_rate"] is None else f"{100 * t['cache_hit_rate']:.0f} %" for t in turns]
        said.append(f"prefix cache {' / '.join(shown)}")
    return f"{label} by turn 1-{turns[-1]['turn']}: {'; '.join(said)}"


def turn_lines(result: ABResult, level: Level | None = None) -> list[str]:
    """One line per arm with its numbers by turn (medians over runs); [] for a workload without sessions."""
    found = [(arm.label, arm_turns_at(arm, level)) for arm in result.arms]
    return [turn_line(label, turns) for label, turns in found if turns]
