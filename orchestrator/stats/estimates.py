"""Statistics as pure functions: no I/O, no clocks, unit-tested on known data."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from orchestrator.common.acceptance import alpha_for_accept_length, alpha_needed


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class BreakEven:
    """Why a speculative arm is as fast as it is, and what it would need. From an A/B the inputs are estimates, and
    the intervals (over blocks and launches, `breakeven_interval`) say how far the explanation can be trusted."""

    baseline_tps: float
    baseline_token_ms: float
    cycle_ms: float
    steps: int
    breakeven_tau: float
    # α* (alpha_needed): 0 when breakeven_tau <= 1 (always reached); None: not reachable with `steps` draft steps
    breakeven_alpha: float | None
    measured_tau: float | None = None
    measured_alpha: float | None = None
    target_tps: float | None = None
    target_tau: float | None = None
    target_alpha: float | None = None
    breakeven_tau_ci95: tuple[float, float] | None = None  # over blocks; None: exact inputs, or one block
    measured_tau_ci95: tuple[float, float] | None = None  # over launches; None: exact input, or one launch
    # measured / break-even accept length, which is the arm's tok/s over the baseline's (cycle = τ / tok/s), with the
    # verdict's CI over blocks; None: exact inputs (`orch breakeven`)
    margin: RatioEstimate | None = None

    @property
    def tau_range(self) -> tuple[float, float]:
        """The break-even accept length's 95 % interval, or the point itself when the inputs are exact."""
        return self.breakeven_tau_ci95 or (self.breakeven_tau, self.breakeven_tau)

    @property
    def reach(self) -> str:
        """Whether the break-even can be reached: "always" (even its upper end is <= 1 token per cycle, which every
        cycle yields), "never" (even its lower end is beyond k + 1 tokens), "cannot tell" (the interval straddles
        k + 1), else "reachable" (with the acceptance breakeven_alpha)."""
        lo, hi = self.tau_range
        if hi <= 1.0:
            return "always"
        if lo > self.steps + 1:
            return "never"
        return "cannot tell" if hi > self.steps + 1 else "reachable"

    @property
    def alpha_range(self) -> tuple[float | None, float | None] | None:
        """α* at the ends of the break-even's interval (None at an end beyond reach); None without an interval."""
        if self.breakeven_tau_ci95 is None:
            return None
        lo, hi = self.breakeven_tau_ci95
        return alpha_needed(lo, self.steps), alpha_needed(hi, self.steps)

    @property
    def position(self) -> str | None:
        """The measured accept length against the break-even: "above", "below", "at" (exact inputs only) or "cannot
        tell" (the interval of measured / break-even contains 1, or one block); None without a measurement."""
        if self.measured_tau is None:
            return None
        if self.margin is None:
            if self.measured_tau == self.breakeven_tau:
                return "at"
            return "above" if self.measured_tau > self.breakeven_tau else "below"
        m = self.margin
        if m.blocks < 2:
            return "cannot tell"
        return "above" if m.lo > 1.0 else "below" if m.hi < 1.0 else "cannot tell"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        alphas, m = self.alpha_range, d.pop("margin")
        return {
            **d,
            # the same ratio, CI and method as the tok/s comparison (no CI from one block, as there)
            "measured_over_breakeven": None
            if m is None
            else {
                "ratio": m["ratio"],
                "ci95": [m["lo"], m["hi"]] if m["blocks"] >= 2 else None,
                "blocks": m["blocks"],
                "ci_method": m["method"],
            },
            "breakeven_reach": self.reach,
            "breakeven_alpha_ci95": list(alphas) if alphas is not None else None,
            "measured_vs_breakeven": self.position,
        }


def breakeven(
    baseline_tps: float,
    cycle_ms: float,
    steps: int,
    *,
    measured_tau: float | None = None,
    target_tps: float | None = None,
) -> BreakEven:
    """A speculative cycle of cycle_ms yields τ tokens; it beats a baseline of baseline_tps only if
    τ > cycle_ms / baseline token time. 82.2 tok/s and a 30 ms cycle need τ ≈ 2.46. A cycle yields at least one
    token (the verifier's own), so a break-even at or below 1 is always reached: α* = 0."""
    if baseline_tps <= 0 or cycle_ms <= 0:
        raise ValueError("baseline tok/s and cycle time must be positive")
    if not all(math.isfinite(x) for x in (baseline_tps, cycle_ms, measured_tau or 0.0, target_tps or 0.0)):
        # An infinite baseline makes its token time 0 and the break-even a division by zero.
        raise ValueError("baseline tok/s, cycle time, accept length and target tok/s must be finite")
    token_ms = 1000.0 / baseline_tps
    tau = cycle_ms / token_ms
    target_tau = target_tps * cycle_ms / 1000.0 if target_tps else None
    return BreakEven(
        baseline_tps=baseline_tps,
        baseline_token_ms=token_ms,
        cycle_ms=cycle_ms,
        steps=steps,
        breakeven_tau=tau,
        breakeven_alpha=alpha_needed(tau, steps),
        measured_tau=measured_tau,
        measured_alpha=alpha_for_accept_length(measured_tau, steps) if measured_tau else None,
        target_tps=target_tps,
        target_tau=target_tau,
        target_alpha=alpha_needed(target_tau, steps) if target_tau else None,
    )


def spec_from_run(
    baseline_tps: float,
    spec_tps: float,
    accept_length: float,
    steps: int,
    target_tps: float | None = None,
    *,
    breakeven_ci95: tuple[float, float] | None = None,
    measured_ci95: tuple[float, float] | None = None,
    margin: RatioEstimate | None = None,
) -> BreakEven:
    """The same arithmetic from measurements: the spec arm's cycle time is accept length / its tok/s. The intervals
    (breakeven_interval, launch_mean, the tok/s comparison) come with it from an A/B: its inputs are estimates."""
    if spec_tps <= 0 or accept_length <= 0:
        raise ValueError("the speculative arm's tok/s and accept length must be positive")
    cycle_ms = 1000.0 * accept_length / spec_tps
    be = breakeven(baseline_tps, cycle_ms, steps, measured_tau=accept_length, target_tps=target_tps)
    return replace(be, breakeven_tau_ci95=breakeven_ci95, measured_tau_ci95=measured_ci95, margin=margin)


def breakeven_interval(
    base_tps: Sequence[Sequence[float]],
    arm_runs: Sequence[Sequence[tuple[float, float]]],
    *,
    seed: int = 0,
    paired: bool = False,
) -> RatioEstimate:
    """The break-even accept length over blocks. base_tps[b]: the tok/s of block b's baseline runs; arm_runs[b]: the
    (tok/s, accept length) of its speculative launch's runs. Per run the baseline's token time is 1000 / tok/s and
    the arm's cycle time 1000 · accept / tok/s; τ* = cycle / token time is a ratio of the two launches' values, so
    the verdict's ratio_ci estimates it: the geometric mean over blocks, a bootstrap CI with the Student-t floor."""
    token_ms = [[1000.0 / v for v in runs] for runs in base_tps]
    cycle_ms = [[1000.0 * tau / v for v, tau in runs] for runs in arm_runs]
    return ratio_ci(token_ms, cycle_ms, seed=seed, paired=paired)


# ---------------------------------------------------------------- launch-level comparison (the unit is a launch)

Z_975 = 1.959963984540054  # two-sided 95 %
# Student t 0.975 quantiles for 1..30 degrees of freedom (beyond: the normal's 1.96 is within 2 %).
T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t_975(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else Z_975


Z_80 = 0.8416212335729143  # 80 % power
DEFAULT_MIN_EFFECT = 0.02  # differences smaller than 2 % are "no difference" unless the user says otherwise


@dataclass(frozen=True, kw_only=True)
class RatioEstimate:
    """An arm against the baseline: geometric-mean ratio over blocks with a bootstrap 95 % CI."""

    ratio: float
    lo: float
    hi: float
    blocks: int
    method: str
    log_sd: float | None  # spread of the per-block log-ratios (None with one block)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def launch_value(runs: Sequence[float]) -> float:
    """One launch reduced to one number: the median of its valid timed runs."""
    if not runs:
        raise ValueError("a launch without valid runs has no value")
    return statistics.median(runs)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted_values, linearly interpolated between the two nearest ranks."""
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def ratio_ci(
    base: Sequence[Sequence[float]],
    arm: Sequence[Sequence[float]],
    *,
    n_boot: int = 4000,
    seed: int = 0,
    hierarchical: bool | None = None,
    alpha: float = 0.05,
    t_crit: float | None = None,
    paired: bool = False,
) -> RatioEstimate:
    """base[b] and arm[b] are the run values of the two launches in block b.

    The estimate is exp(mean over blocks of log(arm launch value / base launch value)). The CI resamples blocks
    with replacement; with few blocks (< 5, or when asked) it also resamples runs within each launch, so the
    interval carries both levels of noise. Runs are never pooled across launches as if independent.
    `paired`: run i of both launches of a block sent the same request(s) (same request sequence, runs listed in
    run order), so the within-launch resample draws the same run positions for both arms. Drawn independently, a
    resample that gives one arm its fastest prompt three times and the other its slowest reads prompt-to-prompt
    differences as noise, and with heterogeneous prompts that swamps the effect.
    `alpha` and `t_crit` set another two-sided level and its Student t critical value (a sequential look's nominal
    level, stats/sequential); the defaults are the fixed design's 95 %.
    """
    if len(base) != len(arm) or not base:
        raise ValueError("need the same number (>= 1) of blocks for both arms")
    if any(not b for b in base) or any(not a for a in arm):
        raise ValueError("every launch needs at least one valid run")
    if paired and any(len(b) != len(a) for b, a in zip(base, arm, strict=True)):
        raise ValueError("paired runs need the same number of runs in both launches of every block")
    n = len(base)
    logs = [math.log(launch_value(a) / launch_value(b)) for b, a in zip(base, arm, strict=True)]
    point = math.exp(statistics.fmean(logs))
    hier = n < 5 if hierarchical is None else hierarchical
    rng = random.Random(seed)
    draws = []
    for _ in range(n_boot):
        total = 0.0
        for _ in range(n):
            i = rng.randrange(n)
            if hier and paired:
                picks = [rng.randrange(len(base[i])) for _ in base[i]]
                b = [base[i][k] for k in picks]
                a = [arm[i][k] for k in picks]
                total += math.log(statistics.median(a) / statistics.median(b))
            elif hier:
                b = [rng.choice(base[i]) for _ in base[i]]
                a = [rng.choice(arm[i]) for _ in arm[i]]
                total += math.log(statistics.median(a) / statistics.median(b))
            else:
                total += logs[i]
        draws.append(total / n)
    draws.sort()
    lo, hi = quantile(draws, alpha / 2), quantile(draws, 1 - alpha / 2)
    method = "bootstrap over blocks"
    if hier:
        method += " + runs within launches, " + (
            "paired (the same run positions drawn for both arms: they sent the same requests)"
            if paired
            else "drawn independently per arm"
        )
    sd = statistics.stdev(logs) if n > 1 else None
    if sd is not None:
        # With few blocks a percentile bootstrap is too narrow (2 blocks have 3 distinct resamples). The interval is
        # never narrower than Student's t on the block log-ratios: the top level's degrees of freedom decide.
        mean = statistics.fmean(logs)
        half = (t_975(n - 1) if t_crit is None else t_crit) * sd / math.sqrt(n)
        if mean - half < lo or mean + half > hi:
            lo, hi = min(lo, mean - half), max(hi, mean + half)
            method += ", widened to Student's t on blocks"
    return RatioEstimate(ratio=point, lo=math.exp(lo), hi=math.exp(hi), blocks=n, method=method, log_sd=sd)


def verdict(est: RatioEstimate, min_effect: float = DEFAULT_MIN_EFFECT, *, higher_is_better: bool = True) -> str:
    """faster/slower only when the CI excludes 1 and the effect is at least min_effect; no difference when the CI
    lies inside ±min_effect; otherwise inconclusive. One block can never separate restart noise: inconclusive.
    For a metric where lower is better (a latency) the words swap: a ratio below 1 is faster."""
    if est.blocks < 2:
        return "inconclusive"
    above, below = ("faster", "slower") if higher_is_better else ("slower", "faster")
    if est.lo > 1.0 and est.ratio - 1.0 >= min_effect:
        return above
    if est.hi < 1.0 and 1.0 - est.ratio >= min_effect:
        return below
    if est.lo >= 1.0 - min_effect and est.hi <= 1.0 + min_effect:
        return "no difference"
    return "inconclusive"


def minimal_detectable_effect(est: RatioEstimate, t_crit: float | None = None) -> float | None:
    """The relative effect this many blocks detect with 80 % power at 95 % (or at the critical value t_crit, a
    sequential look's) for the observed block-to-block noise."""
    if est.log_sd is None:
        return None
    crit = t_975(est.blocks - 1) if t_crit is None else t_crit
    return math.exp((crit + Z_80) * est.log_sd / math.sqrt(est.blocks)) - 1.0


# Past these an interval or an MDE says nothing a reader can use (docs/statistics.md, "Intervals too wide to
# print"): a CI whose upper end is 10x its lower spans an order of magnitude of speed (e.g. [0.3, 3.0]), wider than
# any effect speculative decoding has; an MDE past sqrt(10) - 1 (216 %) needs the same factor on one side.
MAX_CI_SPAN = 10.0
MAX_MDE = math.sqrt(MAX_CI_SPAN) - 1.0


def bounded(est: RatioEstimate) -> bool:
    """Whether the estimate's CI is narrow enough to be worth printing: two or more blocks, hi/lo below MAX_CI_SPAN."""
    return est.blocks >= 2 and est.lo > 0 and est.hi / est.lo < MAX_CI_SPAN


def mde_meaningful(mde: float | None) -> bool:
    """Whether a minimal detectable effect is small enough to mean something (below MAX_MDE)."""
    return mde is not None and math.isfinite(mde) and mde < MAX_MDE


def open_question(est: RatioEstimate, min_effect: float = DEFAULT_MIN_EFFECT) -> str:
    """What an undecided comparison still has to settle: "sign" when the observed effect is at least min_effect (is
    it real?), "within" when it is smaller (does the CI fit inside ±min_effect?)."""
    return "sign" if abs(math.log(est.ratio)) >= math.log(1.0 + min_effect) else "within"


def blocks_needed(est: RatioEstimate, min_effect: float = DEFAULT_MIN_EFFECT) -> int | None:
    """Blocks a fixed design needs, at the observed noise and 80 % power, to decide the question this comparison
    asks: for an observed effect beyond min_effect, a CI that excludes 1 (its half-width below the observed effect);
    for a smaller one, a CI inside ±min_effect (its half-width below the room between the effect and min_effect).
    A 24 % gap needs the few blocks that show it is real, not the many that would resolve ±2 %. None: one block
    (no noise estimate), or the observed effect sits so close to min_effect that no practical number decides."""
    if est.log_sd is None:
        return None
    effect, bound = abs(math.log(est.ratio)), math.log(1.0 + min_effect)
    goal = effect if open_question(est, min_effect) == "sign" else bound - effect
    if goal <= 0:
        return None
    for n in range(2, 10_000):
        if (t_975(n - 1) + Z_80) * est.log_sd / math.sqrt(n) <= goal:
            return n
    return None


def mad_outliers(values: Sequence[float], threshold: float = 3.5) -> list[int]:
    """Indices whose modified z-score (0.6745 (x − median) / MAD) exceeds threshold: warned about, never dropped."""
    if len(values) < 3:
        return []
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    if mad == 0:
        return [i for i, v in enumerate(values) if v != med] if len(set(values)) > 1 else []
    return [i for i, v in enumerate(values) if abs(0.6745 * (v - med) / mad) > threshold]


# ---------------------------------------------------------------- per-arm spread and warnings


@dataclass(frozen=True, kw_only=True)
class ArmSpread:
    """One arm across its launches: the launch is the unit, runs within a launch are its measurement error."""

    launches: int
    runs: int
    median: float  # median of the launch values
    launch_min: float
    launch_max: float
    cv_within: float | None  # root-mean-square of the per-launch CVs (launches with >= 2 runs)
    cv_across: float | None  # CV of the launch values (>= 2 launches)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arm_spread(per_launch: Sequence[Sequence[float]]) -> ArmSpread:
    """per_launch[i] holds the valid timed run values of launch i."""
    launches = [list(v) for v in per_launch if v]
    if not launches:
        raise ValueError("an arm without valid runs has no spread")
    values = [launch_value(v) for v in launches]
    cvs = [summarize(v).cv for v in launches if len(v) > 1]
    return ArmSpread(
        launches=len(values),
        runs=sum(len(v) for v in launches),
        median=statistics.median(values),
        launch_min=min(values),
        launch_max=max(values),
        cv_within=math.sqrt(statistics.fmean(c * c for c in cvs)) if cvs else None,
        cv_across=summarize(values).cv if len(values) > 1 else None,
    )


# A host that swings its launches this much is busy with something else; above it no block count is cheap.
HOST_NOISE_CV = 0.25
# Launches varying this many times more than runs within a launch: the launches, not the runs, carry the noise ...
HOST_NOISE_FACTOR = 3.0
# ... once that spread is itself large (a 10x ratio of 0.5 % to 0.05 % is an ordinary quiet host).
HOST_NOISE_MIN_CV = 0.10


def noisy_host(spread: ArmSpread) -> bool:
    """Launches of one arm differ far more than a quiet host's restart noise: a CV across launches of at least
    HOST_NOISE_CV, or of at least HOST_NOISE_MIN_CV and HOST_NOISE_FACTOR times the CV between runs within a
    launch. The same configuration launched again should give about the same number; when it does not, something
    other than the configuration moves the numbers."""
    across = spread.cv_across
    if across is None:
        return False
    if across >= HOST_NOISE_CV:
        return True
    within = spread.cv_within
    return across >= HOST_NOISE_MIN_CV and (within is None or across >= HOST_NOISE_FACTOR * within)


def outliers(values: Sequence[float], *, threshold: float = 3.5, min_rel: float = 0.01, min_n: int = 5) -> list[int]:
    """MAD outliers that are also at least min_rel away from the median: a run 0.3 % off in a launch whose runs agree
    to 0.01 % has a huge z-score but is not worth a warning. Below min_n values the MAD is too crude (with three,
    it is the smaller of two deviations), so nothing is flagged."""
    if len(values) < max(3, min_n):
        return []
    med = statistics.median(values)
    return [i for i in mad_outliers(values, threshold) if med and abs(values[i] - med) / abs(med) >= min_rel]


def slow_first_run(values: Sequence[float], *, threshold: float = 3.5, min_rel: float = 0.01) -> bool:
    """True when the first timed run (values in run order) is clearly slower than the rest: warmup was too short.
    Needs four runs: against only two others the MAD cannot tell a cold start from ordinary spread."""
    if len(values) < 4:
        return False
    first, rest = values[0], values[1:]
    med = statistics.median(rest)
    if med <= 0 or (med - first) / med < min_rel:
        return False
    mad = statistics.median(abs(v - med) for v in rest)
    return mad == 0 or 0.6745 * (med - first) / mad > threshold


def relative_range(values: Sequence[float]) -> float:
    """max / min − 1 (0 for fewer than two values): how far apart repeated readings are."""
    vals = [v for v in values if v > 0]
    return max(vals) / min(vals) - 1.0 if len(vals) > 1 else 0.0


# ---------------------------------------------------------------- experimental design

ORDERS = ("random", "fixed", "abba")


def schedule(arms: int, blocks: int, order: str, seed: int) -> list[list[int]]:
    """The launch order of every block: each block launches every arm once.

    random: a seeded shuffle per block (drift and warm-up effects average out, and the order is recorded);
    fixed: 0, 1, … every block; abba: forward, then reversed, alternately (cancels a linear drift in pairs).
    """
    if arms < 1 or blocks < 1:
        raise ValueError("need at least one arm and one block")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    rng = random.Random(seed)
    out = []
    for b in range(blocks):
        seq = list(range(arms))
        if order == "random":
            rng.shuffle(seq)
        elif order == "abba" and b % 2 == 1:
            seq.reverse()
        out.append(seq)
    return out


# ---------------------------------------------------------------- one arm's value at one level, over its launches

LAUNCH_MEAN_METHODS = {
    "geometric": "geometric mean of launch values; Student's t on their logs",
    "arithmetic": "mean of launch values; Student's t, floored at 0",
}


@dataclass(frozen=True, kw_only=True)
class LaunchMean:
    """One arm's value at one level over its launches (each launch one value, the median of its runs): the mean with
    a 95 % Student's t interval over launches (restart to restart is the noise that matters); no interval from one
    launch. Geometric for positive quantities (latencies, rates, tok/s: their spread is relative), arithmetic where
    a launch may be 0 (goodput at a saturated level)."""

    value: float
    lo: float | None
    hi: float | None
    launches: int
    method: str  # a key of LAUNCH_MEAN_METHODS

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "ci95": [self.lo, self.hi] if self.lo is not None and self.hi is not None else None,
            "ci_method": LAUNCH_MEAN_METHODS[self.method],
            "launches": self.launches,
        }


def launch_mean(values: Sequence[float], *, geometric: bool = True) -> LaunchMean:
    """LaunchMean of the launch values; geometric only when every value is positive (else arithmetic)."""
    if not values:
        raise ValueError("no launch values")
    n = len(values)
    if n == 1:
        return LaunchMean(
            value=values[0],
            lo=None,
            hi=None,
            launches=1,
            method="geometric" if geometric and values[0] > 0 else "arithmetic",
        )
    if geometric and all(v > 0 for v in values):
        logs = [math.log(v) for v in values]
        mean = statistics.fmean(logs)
        half = t_975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        return LaunchMean(
            value=math.exp(mean), lo=math.exp(mean - half), hi=math.exp(mean + half), launches=n, method="geometric"
        )
    mean = statistics.fmean(values)
    half = t_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return LaunchMean(value=mean, lo=max(mean - half, 0.0), hi=mean + half, launches=n, method="arithmetic")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the points no other point beats on both coordinates (higher is better on both; a point
    equal to another on both stays): the non-dominated set, in the order given."""
    return [
        i for i, (x, y) in enumerate(points) if not any(ox >= x and oy >= y and (ox > x or oy > y) for ox, oy in points)
    ]


def interpolate_log(xs: Sequence[float], ys: Sequence[float], at: float) -> float | None:
    """ys at `at`, linear in log(x) between the two measured xs around it (xs increasing, > 0); None outside them."""
    for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if x == at:
            return y
        if k and xs[k - 1] < at < x and xs[k - 1] > 0:
            w = (math.log(at) - math.log(xs[k - 1])) / (math.log(x) - math.log(xs[k - 1]))
            return ys[k - 1] + w * (y - ys[k - 1])
    return None
