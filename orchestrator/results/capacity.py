"""The A/B on the highest load within the SLO, and the blocks whose margin to it dipped and recovered."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.stats.crossover import CAPACITY_METHOD, ratio_interval
from orchestrator.stats.estimates import (
    RatioEstimate,
    verdict,
)


@dataclass(frozen=True, kw_only=True)
class CapacityComparison:
    """An arm's highest load within the SLO against the baseline's: the geometric mean of the per-block ratios with
    its 95 % CI (None with fewer than two blocks where both crossed in the range), and a verdict on it."""

    arm: str
    base: str
    ratio: float | None
    lo: float | None
    hi: float | None
    blocks: int  # blocks where both arms' capacities lay within the levels measured (with a bound: every block)
    censored: int  # blocks where one of them did not (past the last level, or over the SLO at the first)
    verdict: str | None  # higher | lower | no difference | inconclusive; None: not enough blocks
    # "upper"/"lower": censored blocks were counted at the range's edge, which bounds the ratio on one side only, so
    # only that end of the CI is known (ratio None) and it alone decided the verdict
    bound: str | None = None

    @classmethod
    def bounded(cls, arm: str, base: str, side: str, end: float, blocks: int, censored: int) -> CapacityComparison:
        """A verdict from one end of the CI (stats/crossover.bounded_ratio_end) over `blocks` blocks, `censored` of
        them counted at the range's edge."""
        verdict = "lower" if side == "upper" else "higher"
        lo, hi = (None, end) if side == "upper" else (end, None)
        return cls(
            arm=arm, base=base, ratio=None, lo=lo, hi=hi, blocks=blocks, censored=censored, verdict=verdict, bound=side
        )

    @classmethod
    def of(cls, arm: str, base: str, logs: Sequence[float], censored: int, min_effect: float) -> CapacityComparison:
        if len(logs) < 2:
            return cls(
                arm=arm, base=base, ratio=None, lo=None, hi=None, blocks=len(logs), censored=censored, verdict=None
            )
        ratio, lo, hi = ratio_interval(logs)
        est = RatioEstimate(
            ratio=ratio, lo=lo, hi=hi, blocks=len(logs), method=CAPACITY_METHOD, log_sd=statistics.stdev(logs)
        )
        # The rule every comparison follows (a CI past 1 is not enough: the effect must reach min_effect too), in
        # a capacity's words.
        said = verdict(est, min_effect)
        word = {"faster": "higher", "slower": "lower"}.get(said, said)
        return cls(arm=arm, base=base, ratio=ratio, lo=lo, hi=hi, blocks=len(logs), censored=censored, verdict=word)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "base": self.base,
            "ratio": self.ratio,
            "ci95": None if self.lo is None and self.hi is None else [self.lo, self.hi],
            "blocks": self.blocks,
            "censored_blocks": self.censored,
            "verdict": self.verdict,
            "bound": self.bound,
            "method": CAPACITY_METHOD
            + (
                "; a capacity outside the levels measured is counted at the range's edge, which bounds its block's "
                f"ratio on one side: ci95 has only its {self.bound} end, and the verdict is on it"
                if self.bound
                else ""
            ),
        }


@dataclass(frozen=True, kw_only=True)
class SloRecovery:
    """A block whose margin to the SLO fell to 1 or below at one level and rose above 1 again at a higher one: its
    capacity is taken at the first miss (stats/crossover.capacity), for the arm's own estimate and the A/B alike."""

    arm: str
    block: int  # 0-based, as stored
    missed_at: float  # the first level at or over a percentile objective's limit
    met_again_at: float  # the first higher level within every one again
    rates: bool  # levels are req/s (open loop), not concurrencies

    def text(self) -> str:
        def load(x: float) -> str:
            return f"{x:g} req/s" if self.rates else f"concurrency {x:g}"

        return (
            f"{self.arm} block {self.block + 1} missed the SLO at {load(self.missed_at)} and met it again at "
            f"{load(self.met_again_at)}: capacity taken at the first miss"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm_label": self.arm,
            "block": self.block,
            "block_number": self.block + 1,
            "missed_at": self.missed_at,
            "met_again_at": self.met_again_at,
            "text": self.text(),
        }
