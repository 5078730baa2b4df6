"""One arm against the baseline at one level: its ratio, CI, verdict and what would decide it (`Comparison`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.config.slo import DEFAULT_METRIC, METRICS
from orchestrator.results.cache import CacheGap
from orchestrator.results.run import Level, Rate, level_name
from orchestrator.stats.estimates import (
    DEFAULT_MIN_EFFECT,
    MAX_CI_SPAN,
    MAX_MDE,
    RatioEstimate,
    bounded,
    mde_meaningful,
    open_question,
)
from orchestrator.stats.family import Adjustment


@dataclass(frozen=True, kw_only=True)
class Comparison:
    arm: str  # profile names (the JSON contract); labels tell two arms of one profile apart
    vs: str
    ratio: float | None  # geometric mean over blocks of the launch-value ratios
    concurrency: Level = 1  # the level: a concurrency, or a Rate (open loop)
    aggregate_ratio: float | None = None
    estimate: RatioEstimate | None = None
    verdict: str | None = None  # faster | slower | no difference | inconclusive; None without paired launches
    mde: float | None = None
    blocks_needed: int | None = None
    min_effect: float = DEFAULT_MIN_EFFECT
    arm_label: str = ""
    vs_label: str = ""
    arm_index: int = 1
    sequential: dict[str, Any] | None = None  # --blocks auto: the look this interval belongs to
    metric: str = DEFAULT_METRIC  # what the ratio and the verdict are on (config/slo.METRICS)
    note: str | None = None  # what a reader must know about this comparison's numbers
    # The arms' prefix-cache hit rates, when more than results/cache.CACHE_GAP_POINTS apart; unless measured
    # (--cache-measured) the verdict is then "inconclusive" and ci_verdict keeps what the CI alone said.
    cache_gap: CacheGap | None = None
    ci_verdict: str | None = None
    # One of a family of verdicts printed together (several levels or arms): its CI is at Holm's level for it
    # (stats/family); None for a family of one, whose CI is the plain 95 %.
    adjustment: Adjustment | None = None

    @property
    def held_back(self) -> bool:
        """Whether a prefix-cache gap between the arms holds back the verdict the CI gave (results/cache)."""
        return self.cache_gap is not None and not self.cache_gap.measured

    @property
    def higher_is_better(self) -> bool:
        """Whether a ratio above 1 is the arm doing better: throughput and goodput; not latency (faster is lower)."""
        return METRICS[self.metric].higher_is_better

    @property
    def advice(self) -> str | None:
        """For an inconclusive comparison, what would decide it, phrased for the question it asks."""
        est = self.estimate
        if self.held_back and self.cache_gap is not None:
            return self.cache_gap.advice
        if self.verdict != "inconclusive" or est is None or est.blocks < 2 or self.ratio is None:
            return None
        pct, me = abs(self.ratio - 1) * 100, self.min_effect * 100
        if open_question(est, self.min_effect) == "sign":
            gain = self.ratio >= 1 if self.higher_is_better else self.ratio <= 1
            what = f"whether the observed {pct:.1f}% {'gain' if gain else 'loss'} is real"
        else:
            what = f"whether the difference (observed {pct:.1f}%) lies within ±{me:.1f}%"
        if self.blocks_needed is None:
            return f"at this noise no practical number of blocks would show {what}"
        if self.blocks_needed <= est.blocks:  # the bootstrap or a sequential look's wider interval held it back
            return f"a few more blocks would likely show {what}"
        return f"about {self.blocks_needed} blocks would likely show {what} (at this noise, 80% power)"

    @property
    def mde_note(self) -> str | None:
        """Said instead of a minimal detectable effect too large to mean anything (stats/estimates.MAX_MDE)."""
        if self.mde is None or mde_meaningful(self.mde) or self.estimate is None:
            return None
        return f"cannot be bounded with {self.estimate.blocks} blocks at this noise (over {MAX_MDE * 100:.0f}%)"

    @property
    def ci_note(self) -> str | None:
        """Said instead of a CI too wide to mean anything (stats/estimates.bounded): ends over MAX_CI_SPAN apart."""
        est = self.estimate
        if est is None or est.blocks < 2 or bounded(est):
            return None
        return f"too wide to bound with {est.blocks} blocks at this noise (its ends over {MAX_CI_SPAN:g}x apart)"

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "arm": self.arm,
            "vs": self.vs,
            "arm_label": self.arm_label or self.arm,
            "vs_label": self.vs_label or self.vs,
            "arm_index": self.arm_index,
            # An open-loop level has no concurrency: "rate" says which level it is (the key only appears there).
            "concurrency": None if isinstance(self.concurrency, Rate) else self.concurrency,
            **({"rate": float(self.concurrency)} if isinstance(self.concurrency, Rate) else {}),
            "ratio": self.ratio,
            "aggregate_ratio": self.aggregate_ratio,
            "blocks": est.blocks if est else 0,
            # One block's interval holds only run-to-run noise: publishing it would invite the very mistake
            # (trusting one launch per arm) that orch exists to prevent.
            "ci95": [est.lo, est.hi] if est and est.blocks >= 2 else None,
            "ci_method": est.method if est else None,
            # ci95 stays for programs that recompute from it; a reader is told the interval is too wide to use.
            **({"ci_note": self.ci_note} if self.ci_note else {}),
            # In a family of verdicts ci95 is at the member's Holm level: the method, the family and that level.
            **({"adjustment": self.adjustment.to_dict()} if self.adjustment is not None else {}),
            "verdict": self.verdict,
            "min_effect": self.min_effect,
            # An MDE past stats/estimates.MAX_MDE is no number a reader can use: null, and the reason beside it.
            "mde": self.mde if mde_meaningful(self.mde) else None,
            **({"mde_note": self.mde_note} if self.mde_note else {}),
            "blocks_needed": self.blocks_needed,
            "advice": self.advice,
            **({"sequential": self.sequential} if self.sequential is not None else {}),
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            **({"note": self.note} if self.note else {}),
            # Only where the arms' prefix-cache hit rates differ (results/cache): the gap, whether it held the verdict
            # back ("verdict" is then inconclusive) and what the CI alone said.
            **(
                {"cache_gap": self.cache_gap.to_dict(), "held_back": self.held_back, "ci_verdict": self.ci_verdict}
                if self.cache_gap is not None
                else {}
            ),
        }


def why_undecided(c: Comparison) -> str:
    """One undecided comparison: its numbers, what keeps it open, and what would decide it."""
    head = f"{c.arm_label or c.arm} vs {c.vs_label or c.vs} @ {level_name(c.concurrency)}"
    est = c.estimate
    if c.held_back and c.cache_gap is not None:
        return f"{head}: {c.cache_gap.reason}; {c.cache_gap.advice}"
    if est is None or c.ratio is None:
        return f"{head}: no block in which both have valid runs"
    if est.blocks < 2:
        return f"{head}: one paired block, which cannot separate restart noise from a real difference"
    numbers = f"{c.ratio:.3f}x, CI [{est.lo:.3f}, {est.hi:.3f}] over {est.blocks} blocks"
    noise = f"block-to-block spread {est.log_sd * 100:.1f}%" if est.log_sd is not None else "no spread estimate"
    if open_question(est, c.min_effect) == "sign":
        why = f"the CI still includes 1 ({noise})"
    else:
        why = f"the CI reaches beyond ±{c.min_effect * 100:.1f}% ({noise})"
    return f"{head}: {numbers}: {why}" + (f"; {c.advice}" if c.advice else "")
