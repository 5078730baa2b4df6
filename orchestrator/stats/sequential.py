"""Sequential stopping for `--blocks auto`: Lan–DeMets α-spending boundaries and repeated confidence intervals."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

SPENDINGS = ("pocock", "obf")
DEFAULT_MIN_BLOCKS = 3  # the first look has 2 degrees of freedom; with 1, Student's t is hopeless (see statistics.md)
DEFAULT_MAX_BLOCKS = 8
MAX_MAX_BLOCKS = 50  # the boundary integration is O(looks x grid²) in pure Python
_GRID = 201  # Simpson points per look (odd); densities are smooth, so the error is far below 1e-6
_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


def spent(t: float, alpha: float, spending: str) -> float:
    """Cumulative two-sided α spent by information fraction t (Lan & DeMets 1983)."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if spending == "obf":  # O'Brien–Fleming-like: almost nothing early, nearly the full α at the end
        return 2.0 - 2.0 * NormalDist().cdf(NormalDist().inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t))
    if spending == "pocock":  # Pocock-like: roughly equal nominal levels at every look
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    raise ValueError(f"spending must be one of {', '.join(SPENDINGS)}, got {spending!r}")


def _cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / _SQRT2)


def _simpson(lo: float, hi: float, n: int = _GRID) -> list[tuple[float, float]]:
    """Points and weights of Simpson's rule on [lo, hi]."""
    h = (hi - lo) / (n - 1)
    return [(lo + i * h, h / 3.0 * (1 if i in (0, n - 1) else 4 if i % 2 else 2)) for i in range(n)]


@functools.lru_cache(maxsize=64)
def boundaries(fractions: tuple[float, ...], alpha: float = 0.05, spending: str = "pocock") -> tuple[float, ...]:
    """Two-sided z boundaries at increasing information fractions for a Lan–DeMets spending function."""
    return boundaries_for_spending(fractions, tuple(spent(t, alpha, spending) for t in fractions))


def boundaries_for_spending(fractions: Sequence[float], cumulative: Sequence[float]) -> tuple[float, ...]:
    """Symmetric two-sided z boundaries c_k such that, under no effect, the chance that |Z_j| first reaches c_j at
    look k is cumulative[k] − cumulative[k−1] (recursive numerical integration: Armitage, McPherson & Rowe 1969;
    Jennison & Turnbull 2000, ch. 19)."""
    if not fractions or any(b <= a for a, b in itertools.pairwise(fractions)) or not 0 < fractions[0] <= 1:
        raise ValueError(f"information fractions must increase from above 0, got {tuple(fractions)}")
    out: list[float] = []
    pts: list[tuple[float, float]] = []  # Z_{k-1} on the continuation region: (value, sub-density x Simpson weight)
    prev_t, prev_spent = 0.0, 0.0
    for k, (t, total) in enumerate(zip(fractions, cumulative, strict=True)):
        target = total - prev_spent
        r, s = math.sqrt(prev_t / t), math.sqrt((t - prev_t) / t)  # Z_k = r Z_{k-1} + s N(0, 1)
        if target <= 0:
            c = math.inf
        elif k == 0:
            c = NormalDist().inv_cdf(1.0 - target / 2.0)
        else:
            lo, hi = 0.0, 40.0
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if _crossing(pts, r, s, mid) > target else (lo, mid)
            c = (lo + hi) / 2
        out.append(c)
        edge = min(c, 12.0)  # beyond 12 sd the density is zero to double precision
        grid = _simpson(-edge, edge)
        if k == 0:
            pts = [(z, w * math.exp(-z * z / 2) / _SQRT2PI) for z, w in grid]
        else:
            pts = [(z, w * _density(pts, r, s, z)) for z, w in grid]
        prev_t, prev_spent = t, max(total, prev_spent)
    return tuple(out)


def _crossing(pts: Sequence[tuple[float, float]], r: float, s: float, c: float) -> float:
    """P(|Z_k| >= c and no earlier crossing), from Z_{k-1}'s sub-density."""
    return sum(d * (_cdf((-c - r * u) / s) + _cdf((r * u - c) / s)) for u, d in pts)


def _density(pts: Sequence[tuple[float, float]], r: float, s: float, z: float) -> float:
    """Z_k's sub-density at z (paths that have not crossed before look k)."""
    return sum(d * math.exp(-(((z - r * u) / s) ** 2) / 2) for u, d in pts) / (s * _SQRT2PI)


# ---------------------------------------------------------------- Student's t for any level (few degrees of freedom)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
            last = d * c
        if abs(last - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(x: float, df: int) -> float:
    """P(T > x) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + x * x))
    return tail if x >= 0 else 1.0 - tail


def t_quantile(p: float, df: int) -> float:
    """The p quantile (p > 0.5) of Student's t with df degrees of freedom, by bisection on the tail."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, df) > 1.0 - p else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


# ---------------------------------------------------------------- the plan of an auto experiment


@dataclass(frozen=True)
class SequentialPlan:
    """`--blocks auto`: look after every block from min_blocks to max_blocks (information fraction n / max_blocks),
    spending α over those looks; the interval at each look is a repeated confidence interval."""

    min_blocks: int = DEFAULT_MIN_BLOCKS
    max_blocks: int = DEFAULT_MAX_BLOCKS
    alpha: float = 0.05
    spending: str = "pocock"

    def __post_init__(self) -> None:
        if not 2 <= self.min_blocks <= self.max_blocks <= MAX_MAX_BLOCKS:
            raise ValueError(
                f"need 2 <= min blocks <= max blocks <= {MAX_MAX_BLOCKS}, got {self.min_blocks} and {self.max_blocks}"
            )
        if self.spending not in SPENDINGS or not 0 < self.alpha < 0.5:
            raise ValueError(f"bad sequential plan: alpha {self.alpha}, spending {self.spending!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SequentialPlan:
        return cls(int(d["min_blocks"]), int(d["max_blocks"]), float(d["alpha"]), str(d["spending"]))

    @property
    def looks(self) -> tuple[int, ...]:
        return tuple(range(self.min_blocks, self.max_blocks + 1))

    def z(self, blocks: int) -> float:
        """The normal-theory boundary at the look with this many blocks (before the first look: the first's)."""
        n = min(max(blocks, self.min_blocks), self.max_blocks)
        bounds = boundaries(tuple(k / self.max_blocks for k in self.looks), self.alpha, self.spending)
        return bounds[n - self.min_blocks]

    def t_crit(self, blocks: int) -> float:
        """The boundary on the scale of Student's t with blocks − 1 degrees of freedom (before the first look: the
        first look's, with its own degrees of freedom)."""
        if blocks < 2:
            return math.inf
        n = min(max(blocks, self.min_blocks), self.max_blocks)
        return t_boundaries(self)[n - self.min_blocks]

    def nominal_alpha(self, blocks: int) -> float:
        """The two-sided nominal level of the look: the chance of |t| beyond its boundary at that look alone."""
        if blocks < 2:
            return 0.0
        return 2.0 * t_sf(self.t_crit(blocks), blocks - 1)

    def describe(self) -> str:
        name = {"pocock": "Pocock-like", "obf": "O'Brien-Fleming-like"}[self.spending]
        return (
            f"repeated {1 - self.alpha:.0%} CI: group-sequential, Lan-DeMets {name} alpha-spending over looks at "
            f"blocks {self.min_blocks}-{self.max_blocks}"
        )


T_PATHS = 200_000  # simulated A/A sequences: α is exact to about ±0.0005
T_SEED = 20_240_613


@functools.lru_cache(maxsize=32)
def t_boundaries(plan: SequentialPlan) -> tuple[float, ...]:
    """The sequential t-test's boundaries of `plan` (see simulate_t_boundaries); the default plan's are known."""
    return KNOWN_T_BOUNDARIES.get(plan) or simulate_t_boundaries(plan)


def simulate_t_boundaries(plan: SequentialPlan) -> tuple[float, ...]:
    """The sequential t-test's boundaries: at the look with n blocks, |t| (n − 1 degrees of freedom) beyond b_n stops
    with "the CI excludes the true ratio" so that, with no effect, the chance of first crossing at that look is the
    α spent since the last look, exactly as `boundaries` does for a known variance.

    With an estimated variance the t statistics of successive looks are less correlated than the z statistics, so
    converting each normal boundary to Student's t at the same nominal level (Jennison & Turnbull 1991) lets more
    paths cross: with 2–7 degrees of freedom we measured 5.7–6 % instead of 5 %. The t statistic is pivotal (its law
    under no effect does not depend on the noise), so the exact boundaries come from one fixed, seeded simulation
    of normal block log-ratios, computed once per plan (about 0.1 s)."""
    import numpy as np

    rng = np.random.default_rng(T_SEED)
    total = np.zeros(T_PATHS)
    squares = np.zeros(T_PATHS)
    alive = np.ones(T_PATHS, dtype=bool)
    out: list[float] = []
    before = 0.0
    for n in range(1, plan.max_blocks + 1):
        x = rng.standard_normal(T_PATHS)
        total += x
        squares += x * x
        if n < plan.min_blocks:
            continue
        mean = total / n
        sd = np.sqrt(np.maximum(squares - n * mean * mean, 1e-300) / (n - 1))
        t = np.abs(mean) / (sd / math.sqrt(n))
        spend = spent(n / plan.max_blocks, plan.alpha, plan.spending)
        k = round((spend - before) * T_PATHS)  # paths that may cross here, among those that have not crossed yet
        if not out:  # the first look has no past: Student's t itself, free of simulation error
            bound = t_quantile(1.0 - spend / 2.0, n - 1)
        else:
            live = np.sort(t[alive])
            bound = math.inf if k <= 0 else float(live[len(live) - k]) if k < len(live) else 0.0
        out.append(bound)
        alive &= t < bound
        before = spend
    return tuple(out)


# `orch ab`'s default plan (--blocks auto, 3 to 8 blocks, Pocock-like α = 0.05), as simulate_t_boundaries gives it:
# every `orch show` of such an experiment would otherwise import numpy and simulate 200,000 paths (~0.15 s) for these
# same six numbers. tests/experiment/test_auto.py simulates them again.
KNOWN_T_BOUNDARIES: dict[SequentialPlan, tuple[float, ...]] = {
    SequentialPlan(): (6.222502368544156, 5.376651198947975, 4.47274482472512, 3.937084516211764, 3.605768226802812,
                       3.406801894074012),
}  # fmt: skip
