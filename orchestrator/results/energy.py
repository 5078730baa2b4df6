"""Joules per output token: an arm's estimate over launches, and its ratio to the baseline's."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.results.run import Level, Rate
from orchestrator.stats.estimates import (
    DEFAULT_MIN_EFFECT,
    RatioEstimate,
    launch_mean,
    verdict,
)

if TYPE_CHECKING:
    from orchestrator.results.run import RunResult


@dataclass(frozen=True, kw_only=True)
class EnergyEstimate:
    """One arm's joules per output token at one level: the geometric mean of its launch values (each the median of
    its measured runs), with a 95 % Student's t interval on their logs from two launches on (restart to restart
    is the noise that matters, as for tok/s; one launch has no interval)."""

    j_per_token: float
    lo: float | None
    hi: float | None
    launches: int
    runs: int
    mean_w: float | None  # median over the runs of the mean power, summed over the GPUs
    gpus: int | None  # GPUs summed (the most any run summed)
    fields: tuple[str, ...]  # the nvidia-smi power field(s) the samples came from

    def to_dict(self) -> dict[str, Any]:
        return {
            "j_per_token": self.j_per_token,
            "ci95": [self.lo, self.hi] if self.lo is not None and self.hi is not None else None,
            "ci_method": ENERGY_CI_METHOD if self.lo is not None else None,
            "launches": self.launches,
            "runs": self.runs,
            "mean_w": self.mean_w,
            "gpus": self.gpus,
            "power_fields": list(self.fields),
        }


ENERGY_CI_METHOD = "geometric mean of launch values; Student's t on their logs"


def energy_estimate(launch_values: Sequence[float], runs: Sequence[RunResult]) -> EnergyEstimate:
    """EnergyEstimate from the launch values (joules per token, > 0) and the runs behind them."""
    mean = launch_mean(launch_values)  # geometric, with its interval over launches, like every arm's value
    watts = [float(w) for r in runs if isinstance(w := (r.energy or {}).get("mean_w"), (int, float))]
    gpus = [len(g) for r in runs if isinstance(g := (r.energy or {}).get("gpus"), list)]
    fields = sorted({str(f) for r in runs if (f := (r.energy or {}).get("field"))})
    return EnergyEstimate(
        j_per_token=mean.value,
        lo=mean.lo,
        hi=mean.hi,
        launches=mean.launches,
        runs=len(runs),
        mean_w=statistics.median(watts) if watts else None,
        gpus=max(gpus) if gpus else None,
        fields=tuple(fields),
    )


@dataclass(frozen=True, kw_only=True)
class EnergyComparison:
    """An arm's joules per output token against the baseline's: below 1 the arm spends less energy per token."""

    arm_label: str
    vs_label: str
    concurrency: Level
    arm_index: int
    estimate: RatioEstimate | None
    min_effect: float = DEFAULT_MIN_EFFECT

    @property
    def verdict(self) -> str | None:
        """less / more energy per token, no difference or inconclusive, by the same rule as tok/s's verdicts."""
        if self.estimate is None:
            return None
        said = verdict(self.estimate, self.min_effect)
        return {"faster": "more", "slower": "less"}.get(said, said)

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "arm_label": self.arm_label,
            "vs_label": self.vs_label,
            "arm_index": self.arm_index,
            # An open-loop level has no concurrency: "rate" says which level it is, as in the comparisons.
            "concurrency": None if isinstance(self.concurrency, Rate) else self.concurrency,
            **({"rate": float(self.concurrency)} if isinstance(self.concurrency, Rate) else {}),
            "ratio": est.ratio if est else None,
            "blocks": est.blocks if est else 0,
            "ci95": [est.lo, est.hi] if est and est.blocks >= 2 else None,
            "ci_method": est.method if est else None,
            "verdict": self.verdict,
        }
