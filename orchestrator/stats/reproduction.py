"""Reproduction statistics (pure): one arm's absolute estimate, and whether two estimates of one quantity agree."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.stats.estimates import Z_80, RatioEstimate, launch_value, quantile, t_975

DEFAULT_TOLERANCE = 0.03  # ±3 %: above restart noise on a quiet host (1-2 %), below any change worth a ticket

Z_95 = 1.6448536269514722  # one-sided 95 % (the bounds of a two-sided 90 % CI: TOST at α = 5 %)
# Student t 0.95 quantiles for 1..30 degrees of freedom.
T_95 = (
    6.314,
    2.920,
    2.353,
    2.132,
    2.015,
    1.943,
    1.895,
    1.860,
    1.833,
    1.812,
    1.796,
    1.782,
    1.771,
    1.761,
    1.753,
    1.746,
    1.740,
    1.734,
    1.729,
    1.725,
    1.721,
    1.717,
    1.714,
    1.711,
    1.708,
    1.706,
    1.703,
    1.701,
    1.699,
    1.697,
)


def t_95(df: int) -> float:
    return T_95[df - 1] if df <= len(T_95) else Z_95


REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


@dataclass(frozen=True, kw_only=True)
class ArmEstimate:
    """One arm's absolute value (e.g. tok/s): the geometric mean of its launch values, with a 95 % CI across
    launches (None with one launch: a single launch says nothing about restart noise)."""

    value: float
    lo: float | None
    hi: float | None
    launches: int
    method: str
    log_sd: float | None  # spread of the log launch values (None with one launch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arm_estimate(
    per_launch: Sequence[Sequence[float]], *, n_boot: int = 4000, seed: int = 0, hierarchical: bool | None = None
) -> ArmEstimate:
    """per_launch[i] holds the valid run values of launch i (launches without runs are skipped).

    The point estimate is exp(mean of log launch values), not the median of launch values: the reproduction test
    works on the log scale, where a mean has Student's t behind it, and the median of three launches has no usable
    interval. At restart noise of a few % the two differ by far less than the CI. The CI is built like ratio_ci's:
    bootstrap over launches (and runs within them below 5 launches), never narrower than Student's t."""
    launches = [list(v) for v in per_launch if v]
    if not launches:
        raise ValueError("an arm without valid runs has no estimate")
    if any(x <= 0 for v in launches for x in v):
        raise ValueError("values must be positive to be compared on the log scale")
    n = len(launches)
    logs = [math.log(launch_value(v)) for v in launches]
    mean = statistics.fmean(logs)
    if n < 2:
        return ArmEstimate(
            value=math.exp(mean), lo=None, hi=None, launches=1, method="one launch: no interval", log_sd=None
        )
    hier = n < 5 if hierarchical is None else hierarchical
    rng = random.Random(seed)
    draws = []
    for _ in range(n_boot):
        total = 0.0
        for _ in range(n):
            i = rng.randrange(n)
            total += math.log(statistics.median([rng.choice(launches[i]) for _ in launches[i]])) if hier else logs[i]
        draws.append(total / n)
    draws.sort()
    lo, hi = quantile(draws, 0.025), quantile(draws, 0.975)
    method = "bootstrap over launches" + (" + runs within launches" if hier else "")
    sd = statistics.stdev(logs)
    half = t_975(n - 1) * sd / math.sqrt(n)
    if mean - half < lo or mean + half > hi:
        lo, hi = min(lo, mean - half), max(hi, mean + half)
        method += ", widened to Student's t on launches"
    return ArmEstimate(value=math.exp(mean), lo=math.exp(lo), hi=math.exp(hi), launches=n, method=method, log_sd=sd)


@dataclass(frozen=True)
class _Log:
    """An estimate on the log scale: point, standard error (0 for a claim) and degrees of freedom."""

    mean: float
    se: float | None  # None: no interval (one launch or block)
    n: int  # replicates (launches or blocks); 0 for a bare claim

    @property
    def df(self) -> int:
        return max(self.n - 1, 1)


Estimate = ArmEstimate | RatioEstimate | float


def _log_view(x: Estimate) -> _Log:
    """The standard error is read back from the 95 % CI (so a bootstrap that widened it widens this too)."""
    if isinstance(x, (int, float)):
        if not x > 0:
            raise ValueError(f"a recorded or claimed value must be positive, got {x}")
        return _Log(math.log(x), 0.0, 0)
    value, n = (x.value, x.launches) if isinstance(x, ArmEstimate) else (x.ratio, x.blocks)
    if value <= 0:
        raise ValueError(f"an estimate must be positive, got {value}")
    if n < 2 or x.lo is None or x.hi is None:
        return _Log(math.log(value), None, n)
    return _Log(math.log(value), math.log(x.hi / x.lo) / (2 * t_975(n - 1)), n)


def _welch_df(parts: Sequence[tuple[float, int]]) -> int:
    """Welch–Satterthwaite degrees of freedom of a sum of (se, df) terms, rounded down (conservative)."""
    num = sum(se * se for se, _ in parts) ** 2
    den = sum(se**4 / df for se, df in parts if se > 0)
    # Rounded before the floor: one term alone must give its own df, and in floating point (se²)² / (se⁴ / 2) is
    # 1.9999999999999996 for a quarter of all se values, which made 3 launches count as 2 (t 12.7 instead of 4.3).
    return max(1, math.floor(round(num / den, 9))) if den > 0 else max(df for _, df in parts)


@dataclass(frozen=True, kw_only=True)
class ReproVerdict:
    """Whether a new estimate agrees with a recorded one within a relative tolerance (log scale, symmetric)."""

    status: str  # reproduced | not reproduced | inconclusive
    recorded: float
    new: float
    ratio: float  # new / recorded
    ci: tuple[float, float] | None  # 95 % CI of new / recorded (None when the new side has one launch)
    ci90: tuple[float, float] | None  # 90 % CI: the equivalence (TOST) test
    tolerance: float
    blocks_needed: int | None  # when inconclusive: launches per arm (blocks) that would likely decide
    reason: str
    # When the recorded value is too uncertain for any number of new blocks to decide: the blocks a recording (and
    # its re-run, as many) would need at both sides' spread.
    recording_blocks_needed: int | None

    @property
    def change(self) -> float:
        """new / recorded − 1 (−0.353 for 60.8 against a claimed 94)."""
        return self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "change": self.change}


def _se_at(rec: _Log, sd_new: float, n: int) -> tuple[float, int]:
    """Standard error and degrees of freedom of the difference if the new side had n launches (blocks)."""
    parts = [(sd_new / math.sqrt(n), n - 1)] + ([(rec.se, rec.df)] if rec.se else [])
    return math.sqrt(sum(se * se for se, _ in parts)), _welch_df(parts)


def _decides(diff: float, se: float, df: int, band: float) -> bool:
    """Whether a difference would likely (80 % power) be decided at this standard error: inside the band, the 90 %
    CI fits within it (TOST); beyond it, the 95 % CI excludes zero."""
    if abs(diff) < band:
        return abs(diff) + (t_95(df) + Z_80) * se <= band
    return (t_975(df) + Z_80) * se <= abs(diff)


def _blocks_to_decide(diff: float, rec: _Log, sd_new: float, band: float, limit: int = 100) -> int | None:
    """Launches per arm (blocks) of the new side at which the observed difference would likely be decided. The MDE
    arithmetic of stats.minimal_detectable_effect, with the recorded side's fixed error added: that can make it
    never decide."""
    return next((n for n in range(2, limit + 1) if _decides(diff, *_se_at(rec, sd_new, n), band)), None)


MAX_BLOCKS = 1000  # the most --blocks accepts


def _recording_blocks(diff: float, rec: _Log, sd_new: float, band: float) -> int | None:
    """Blocks a recording would need, re-run with as many (what `orch reproduce BUNDLE` does by default), for the
    observed difference to be likely decided at both sides' launch-to-launch spread; None beyond MAX_BLOCKS."""
    sd_rec = (rec.se or 0.0) * math.sqrt(rec.n)

    def se_df(n: int) -> tuple[float, int]:
        parts = [(sd_new / math.sqrt(n), n - 1), (sd_rec / math.sqrt(n), n - 1)]
        return math.sqrt(sum(se * se for se, _ in parts)), _welch_df(parts)

    return next((n for n in range(2, MAX_BLOCKS + 1) if _decides(diff, *se_df(n), band)), None)


def _undecidable(diff: float, rec: _Log, sd_new: float, band: float, tol: str, unit: str) -> tuple[str, int | None]:
    """Why no number of new blocks would decide, and the recording's blocks that would: the recorded value's own
    uncertainty (which new blocks cannot narrow), or a difference too close to the tolerance's edge."""
    if not rec.se or _decides(diff, rec.se, rec.df, band):
        return f"no number of blocks up to 100 would likely decide a difference this close to {tol}", None
    half = t_975(rec.df) * rec.se
    spans = f"{(math.exp(-half) - 1) * 100:+.1f}% to {(math.exp(half) - 1) * 100:+.1f}%"
    need = _recording_blocks(diff, rec, sd_new, band)
    ask = (
        f"ask for a recording of at least {need} blocks (and re-run it with as many)"
        if need
        else f"even a recording of {MAX_BLOCKS} blocks would likely not decide a difference this close to {tol}"
    )
    return (
        f"the recorded value is too uncertain to be reproduced: its own 95% CI spans {spans} over {rec.n} {unit}, "
        f"and more blocks of the new side cannot narrow it; {ask}",
        need,
    )


def _interval(center: float, half: float) -> tuple[float, float]:
    return math.exp(center - half), math.exp(center + half)


def reproduction_verdict(recorded: Estimate, new: Estimate, tolerance: float = DEFAULT_TOLERANCE) -> ReproVerdict:
    """Two independent estimates of one quantity (an arm's tok/s from two sessions, a ratio from two experiments).

    On the log scale, d = log(new / recorded), its standard error combines both sides' (read from their 95 % CIs),
    with Welch's degrees of freedom. The band is ±log(1 + tolerance), so swapping the sides keeps the verdict.
    - reproduced: the 90 % CI of d lies within the band (two one-sided tests at 5 %, Schuirmann's TOST);
    - not reproduced: the 95 % CI of d excludes 0 **and** |d| is beyond the band (the difference is real and the
      best estimate of it exceeds the tolerance; a tiny but certain difference still reproduces);
    - inconclusive otherwise, with about how many blocks would decide; when no number of new blocks would (the
      recorded value is too uncertain), how many blocks a recording would need, re-run with as many.
    A recorded value without a CI (a claim, or one block) counts as exact: only the new side's noise counts. A new
    side with one launch cannot estimate restart noise: always inconclusive."""
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be a fraction between 0 and 1 (0.03 for 3 %), got {tolerance}")
    rec, nw = _log_view(recorded), _log_view(new)
    diff = nw.mean - rec.mean
    band = math.log(1 + tolerance)
    base = {
        "recorded": math.exp(rec.mean),
        "new": math.exp(nw.mean),
        "ratio": math.exp(diff),
        "tolerance": tolerance,
    }
    pct, tol = f"{abs(math.exp(diff) - 1) * 100:.1f}%", f"±{tolerance * 100:.1f}%"
    word = "higher" if diff >= 0 else "lower"
    unit = "blocks" if isinstance(recorded, RatioEstimate) else "launches"
    if nw.se is None:
        sd = rec.se * math.sqrt(rec.n) if rec.se else None
        need = _blocks_to_decide(diff, rec, sd, band) if sd else None
        why, recording = _undecidable(diff, rec, sd, band, tol, unit) if sd and not need else ("", None)
        return ReproVerdict(
            status=INCONCLUSIVE,
            **base,
            ci=None,
            ci90=None,
            blocks_needed=need,
            reason=f"the new value is {pct} {word} but comes from one launch, which cannot separate restart noise "
            "from a real difference; " + (why or "measure 3 or more blocks"),
            recording_blocks_needed=recording,
        )
    rec_se = rec.se or 0.0  # a recorded value without an interval counts as exact
    parts = [(nw.se, nw.df)] + ([(rec_se, rec.df)] if rec_se else [])
    se = math.sqrt(nw.se**2 + rec_se**2)
    df = _welch_df(parts)
    ci95, ci90 = _interval(diff, t_975(df) * se), _interval(diff, t_95(df) * se)
    show95 = f"95% CI [{ci95[0]:.3f}, {ci95[1]:.3f}]"
    if math.exp(-band) <= ci90[0] and ci90[1] <= math.exp(band):
        return ReproVerdict(
            status=REPRODUCED,
            **base,
            ci=ci95,
            ci90=ci90,
            blocks_needed=None,
            recording_blocks_needed=None,
            reason=f"new/recorded {math.exp(diff):.3f}: its 90% CI [{ci90[0]:.3f}, {ci90[1]:.3f}] lies within {tol}",
        )
    if (ci95[0] > 1 or ci95[1] < 1) and abs(diff) > band:
        return ReproVerdict(
            status=NOT_REPRODUCED,
            **base,
            ci=ci95,
            ci90=ci90,
            blocks_needed=None,
            recording_blocks_needed=None,
            reason=f"the new value is {pct} {word} (new/recorded {math.exp(diff):.3f}, {show95}), beyond {tol}",
        )
    sd_new = nw.se * math.sqrt(nw.n)
    need = _blocks_to_decide(diff, rec, sd_new, band)
    why, recording = (
        (f"about {need} blocks would likely decide", None) if need else _undecidable(diff, rec, sd_new, band, tol, unit)
    )
    return ReproVerdict(
        status=INCONCLUSIVE,
        **base,
        ci=ci95,
        ci90=ci90,
        blocks_needed=need,
        reason=f"new/recorded {math.exp(diff):.3f}, {show95}: too wide to tell within or beyond {tol}; {why}",
        recording_blocks_needed=recording,
    )
