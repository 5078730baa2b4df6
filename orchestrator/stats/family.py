"""A family of verdicts printed together, and Holm's step-down on their confidence intervals that keeps the chance
of any false verdict in the family at or below alpha (docs/statistics.md, "Families of verdicts")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.stats.estimates import RatioEstimate, t_975
from orchestrator.stats.sequential import t_quantile

E = TypeVar("E")

FAMILY_ALPHA = 0.05  # the family-wise error a report's verdicts are held to, as a single verdict's 95 % CI is
METHOD = "holm"


@dataclass(frozen=True, kw_only=True)
class Adjustment:
    """One member of a family of verdicts printed together: Holm's step-down over `size` members (`over` says what
    they are: "8 categories", "3 levels"), this member's CI at the two-sided level 1 − alpha, the level its verdict
    was read at."""

    size: int
    alpha: float
    over: str
    method: str = METHOD

    @property
    def level(self) -> float:
        return 1.0 - self.alpha

    def ci_name(self) -> str:
        """The member's interval ("99.4% CI"), where "95% CI" stands for a verdict of its own."""
        return f"{level_percent(self.level)} CI"

    def family_note(self) -> str:
        """Said beside the interval wherever it is printed ("Holm over 8 categories")."""
        return f"Holm over {self.over}"

    def describe(self) -> str:
        """The interval and its family ("99.4% CI, Holm over 8 categories")."""
        return f"{self.ci_name()}, {self.family_note()}"

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "family_size": self.size, "ci_level": self.level, "family": self.over}


def level_percent(level: float) -> str:
    """A confidence level as a percentage with as many decimals as tell it from 100 % (99.4%, 99.95%)."""
    for digits in range(1, 6):
        said = f"{level * 100:.{digits}f}"
        if float(said) < 100.0:
            return said.rstrip("0").rstrip(".") + "%" if digits > 1 else said + "%"
    return f"{level * 100}%"


def t_crit(alpha: float, df: int) -> float:
    """Student's t two-sided critical value at level 1 − alpha; at 95 % the table stats/estimates uses, so that a
    family of one is exactly the single verdict it always was."""
    return t_975(df) if alpha == FAMILY_ALPHA else t_quantile(1.0 - alpha / 2.0, df)


def excludes_one(est: RatioEstimate) -> bool:
    """Whether the estimate's CI rejects "no effect at all" (ratio 1): what Holm steps down on. A faster or slower
    verdict needs it (and an effect of at least the minimum effect besides)."""
    return est.blocks >= 2 and (est.lo > 1.0 or est.hi < 1.0)


def holm(
    members: Sequence[Callable[[float], E]], rejects: Callable[[E], bool], alpha: float = FAMILY_ALPHA
) -> list[tuple[E, float]]:
    """Holm's step-down on confidence intervals. members[i](a) is member i's estimate with its two-sided CI at level
    1 − a; rejects(estimate) says whether that CI rejects the member's null hypothesis. Each step computes every
    member still open at a = alpha / (how many are open); those it rejects keep that interval and leave the family,
    the rest are tried again at the next, less strict, level; when a step rejects none, the open members keep that
    step's interval. Returns each member's estimate and the a its interval is at, in the order given.

    With intervals nested in a (the same resamples, a lower a never narrower) this is Holm's procedure on the
    p-values the intervals invert: the i-th smallest tested at alpha / (m − i + 1), stopping at the first it keeps.
    A family of one is its member at alpha."""
    done: dict[int, tuple[E, float]] = {}
    open_ = list(range(len(members)))
    while open_:
        a = alpha / len(open_)
        found = {i: members[i](a) for i in open_}
        newly = [i for i in open_ if rejects(found[i])]
        if not newly:
            done |= {i: (found[i], a) for i in open_}
            break
        done |= {i: (found[i], a) for i in newly}
        open_ = [i for i in open_ if i not in newly]
    return [done[i] for i in range(len(members))]
