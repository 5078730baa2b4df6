"""Where a speculative arm stops paying: the load at which its ratio to the baseline crosses 1, with a CI (pure).

The design's blocks cover every level, so each block gives one paired log ratio per level. Between measured levels
each block's log ratio is interpolated by the quadratic through the three nearest levels — per block, so the spread
between blocks is known at every point — twice: in log(level) and in the level itself, since a speculative gain
may fall off either way (a verify cost growing with the batch is linear in the load). The crossover is where the
mean of the two interpolated means crosses 0. Its confidence interval inverts the level-wise test: a load x is in
it when, under either interpolant, the Student-t interval (over blocks, df = blocks − 1) of the mean log ratio at x
contains 0. Under normal block noise and a truth either interpolant follows that covers at least 95 %; the union
costs width, and docs/statistics.md measures both by simulation. An interval that
reaches the end of the measured range is open on that side: the data cannot say how far beyond it goes.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.stats.estimates import t_975

GRID = 400  # points between the lowest and highest level at which the interval is evaluated
METHOD = (
    "per-block quadratic interpolation of log ratios, in log(level) and in the level; Student-t test inversion "
    "over blocks (a load is in the CI when either interpolant cannot exclude a crossing there)"
)

# An SLO capacity, per arm (capacity) and in the A/B on it (results/model.CapacityComparison): one number per block.
CAPACITY_METHOD = (
    "per block: where the launch's margin to the SLO (limit / pNN of the tightest percentile objective) first falls "
    "to 1 going up the levels, linear in log(level) and log(margin) (the highest load at or below which every level "
    "measured met the SLO; a block that misses it and meets it again keeps its first miss); geometric mean over "
    "blocks with a Student-t 95 % CI (for the A/B: of the per-block ratios of the two arms' capacities)"
)


@dataclass(frozen=True, kw_only=True)
class Crossover:
    """The answer: `status` is "crosses" (with `at` and its CI), "pays throughout", "never pays" (the whole measured
    range decided one way) or "undecided" (no crossing seen, but the data cannot exclude one within [lo, hi])."""

    status: str
    levels: tuple[float, ...]
    blocks: int
    at: float | None = None  # the level where the mean log ratio is 0
    lo: float | None = None  # the CI's ends; None where it reaches past the measured range on that side
    hi: float | None = None
    pays_below: bool | None = None  # True: the arm is faster below the crossover and slower above it
    # the mean crosses 0 more than once in the range (only the first is reported); for a capacity, a block's margin
    # curve met the SLO again after its first miss
    crosses_again: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "at": self.at,
            "ci": [self.lo, self.hi],
            "pays_below": self.pays_below,
            "levels": list(self.levels),
            "blocks": self.blocks,
            "crosses_again": self.crosses_again,
            "method": METHOD,
        }


def crossover(
    levels: Sequence[float], ratios: Sequence[Sequence[float | None]], *, interpolants: Sequence[str] = ("log", "level")
) -> Crossover:
    """`levels` (rates or concurrencies, increasing, > 0) and `ratios[i][b]`: the arm's ratio to the baseline at
    level i in block b. Blocks missing a level's ratio (None) are left out at every level, so each remaining block
    stays paired across the range. Needs two levels and two complete blocks. `interpolants` (both by default; one of
    them for the coverage study): "log" interpolates in log(level), "level" in the level."""
    if not interpolants or not set(interpolants) <= {"log", "level"}:
        raise ValueError(f"interpolants must be 'log' and/or 'level', got {list(interpolants)}")
    if len(levels) < 2 or len(levels) != len(ratios):
        raise ValueError("a crossover needs a ratio at two or more levels")
    if any(b <= a for a, b in itertools.pairwise(levels)) or levels[0] <= 0:
        raise ValueError(f"levels must be positive and increasing, got {list(levels)}")
    d: list[list[float]] = []  # per complete block: its log ratio at each level
    for b in range(min(len(r) for r in ratios)):
        column = [r[b] for r in ratios]
        if all(v is not None and v > 0 for v in column):
            d.append([math.log(v) for v in column if v is not None])
    if len(d) < 2:
        raise ValueError("a crossover needs two or more blocks with a ratio at every level")
    u = [math.log(x) for x in levels]
    t = t_975(len(d) - 1)
    x = [float(v) for v in levels]
    grid = _grid(u)
    # Two interpolants between the measured levels, quadratic in log(level) and in the level itself: a crossover is
    # placed between them, and a load is in the CI when either cannot exclude a crossing there.
    curves = [
        [[_at(row, u, g) if kind == "log" else _at(row, x, math.exp(g)) for row in d] for g in grid]
        for kind in dict.fromkeys(interpolants)
    ]  # per interpolant, per grid point: every block's log ratio there
    measured, blocks = tuple(float(v) for v in levels), len(d)
    found = [_one(grid, c, t) for c in curves]
    crossing = [f for f in found if f[0] is not None]
    if not crossing:
        if not any(any(f[3]) for f in found):
            positive = statistics.fmean(curves[0][0]) > 0
            return Crossover(status="pays throughout" if positive else "never pays", levels=measured, blocks=blocks)
        spans = [_span(grid, f[3], f[3].index(True)) for f in found if any(f[3])]
        lo, hi = _hull(spans)
        return Crossover(status="undecided", lo=lo, hi=hi, levels=measured, blocks=blocks)
    # The interpolants' crossings, and the accepted run around each: the answer spans them all.
    at = math.exp(statistics.fmean(f[0] for f in crossing if f[0] is not None))
    spans = []
    for root, _, _, accept in crossing:
        assert root is not None
        j = min(range(len(grid)), key=lambda k: abs(grid[k] - root))
        spans.append(_span(grid, accept, j) if accept[j] else (math.exp(root), math.exp(root)))
        spans.append((math.exp(root), math.exp(root)))
    lo, hi = _hull(spans)
    again = any(f[1] for f in crossing)
    return Crossover(
        status="crosses",
        at=at,
        lo=lo,
        hi=hi,
        pays_below=crossing[0][2],
        levels=measured,
        blocks=blocks,
        crosses_again=again,
    )


def _one(grid: list[float], curve: list[list[float]], t: float) -> tuple[float | None, bool, bool, list[bool]]:
    """One interpolant: its first crossing (log level), whether it crosses again, whether it pays below the
    crossing, and where 0 is inside the t interval."""
    mean = [statistics.fmean(values) for values in curve]
    accept = [_accepts(values, t) for values in curve]
    roots = [_root(grid[j], grid[j + 1], mean[j], mean[j + 1]) for j in range(len(grid) - 1) if _changes(mean, j)]
    return (roots[0] if roots else None), len(roots) > 1, mean[0] > 0, accept


def _hull(spans: list[tuple[float | None, float | None]]) -> tuple[float | None, float | None]:
    """The smallest interval holding every span; open (None) on a side where any span is."""
    los, his = [s[0] for s in spans], [s[1] for s in spans]
    return (None if None in los else min(v for v in los if v is not None)), (
        None if None in his else max(v for v in his if v is not None)
    )


def _grid(u: list[float]) -> list[float]:
    step = (u[-1] - u[0]) / GRID
    return sorted({*(u[0] + k * step for k in range(GRID + 1)), *u})


def _at(row: list[float], u: list[float], g: float) -> float:
    """One block's log ratio at log-level g: the quadratic through the three measured levels nearest g (the line
    through both, with only two), so a curve that bends between levels is followed rather than cut straight."""
    if len(u) == 2:
        w = (g - u[0]) / (u[1] - u[0])
        return row[0] + w * (row[1] - row[0])
    i = min(range(len(u) - 2), key=lambda k: abs((u[k] + u[k + 2]) / 2 - g))
    xs, ys = u[i : i + 3], row[i : i + 3]
    total = 0.0
    for j in range(3):
        term = ys[j]
        for k in range(3):
            if k != j:
                term *= (g - xs[k]) / (xs[j] - xs[k])
        total += term
    return total


def _accepts(values: list[float], t: float) -> bool:
    """Whether 0 is inside the t interval of these blocks' mean."""
    m = statistics.fmean(values)
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return abs(m) <= half


def _changes(mean: list[float], j: int) -> bool:
    a, b = mean[j], mean[j + 1]
    return (a > 0 >= b) or (a < 0 <= b) if a != 0 else False


def _root(g0: float, g1: float, m0: float, m1: float) -> float:
    return g0 if m1 == m0 else g0 + (g1 - g0) * m0 / (m0 - m1)


def _span(grid: list[float], accept: list[bool], j: int) -> tuple[float | None, float | None]:
    """The accepted run of grid points around j, as levels; None where it reaches the grid's end."""
    a = b = j
    while a > 0 and accept[a - 1]:
        a -= 1
    while b < len(grid) - 1 and accept[b + 1]:
        b += 1
    return (None if a == 0 else math.exp(grid[a]), None if b == len(grid) - 1 else math.exp(grid[b]))


def first_crossing(levels: Sequence[float], values: Sequence[float | None]) -> tuple[str, float | None]:
    """Where one block's margin curve (above 1: within the objective) first falls to 1 going up the levels,
    interpolated linearly in log(level) and log(margin): ("crosses", level), or ("above", None) when it stays above 1
    over the whole range (right-censored: the capacity is past the last level), ("below", None) when it is at or
    below 1 at the first level (left-censored), ("missing", None) when a level has no value."""
    if any(v is None or v <= 0 for v in values):
        return "missing", None
    m = [math.log(float(v)) for v in values if v is not None]
    if m[0] <= 0:
        return "below", None
    for i in range(1, len(m)):
        if m[i] <= 0:
            u0, u1 = math.log(levels[i - 1]), math.log(levels[i])
            return "crosses", math.exp(u0 + (u1 - u0) * m[i - 1] / (m[i - 1] - m[i]))
    return "above", None


def recovery(levels: Sequence[float], values: Sequence[float | None]) -> tuple[float, float] | None:
    """Where one block's margin curve is not monotone in the way a capacity reads it: (the first level at or below
    1, the first later level above 1 again), or None when it never rises above 1 after its first miss (or a level
    has no value). The capacity stays at the first miss: the load up to which every level measured met the SLO."""
    if any(v is None or v <= 0 for v in values):
        return None
    miss = next((i for i, v in enumerate(values) if v is not None and v <= 1), None)
    if miss is None:
        return None
    again = next((i for i in range(miss + 1, len(values)) if (v := values[i]) is not None and v > 1), None)
    return None if again is None else (float(levels[miss]), float(levels[again]))


def capacity(levels: Sequence[float], margins: Sequence[Sequence[float | None]]) -> Crossover:
    """One arm's highest load within an SLO from `margins[b][i]`, block b's margin (above 1: within the objective)
    at level i: each block's capacity is its first_crossing — the same per-block number the A/B on capacities takes
    its ratios of — and the answer their geometric mean with a Student-t 95 % CI over the blocks ("crosses"; an end
    past the levels measured is open, None). Every block within the SLO at every level: "pays throughout"; over it
    at the first level in every block: "never pays"; some blocks censored either way: "undecided", with the CI's
    ends that the censored blocks counted at the range's edge still bound (bounded_ratio_end), None where none.
    Blocks missing a level are left out; needs two or more blocks. `crosses_again`: some block's curve met the SLO
    again after its first miss (recovery)."""
    found = [f for f in (first_crossing(levels, row) for row in margins) if f[0] != "missing"]
    if len(found) < 2:
        raise ValueError("a capacity needs two or more blocks with a margin at every level")
    measured, blocks = tuple(float(v) for v in levels), len(found)
    again = any(recovery(levels, row) is not None for row in margins)
    statuses = {status for status, _ in found}
    if statuses in ({"above"}, {"below"}):
        status = "pays throughout" if statuses == {"above"} else "never pays"
        return Crossover(status=status, levels=measured, blocks=blocks, crosses_again=again)
    first, last = measured[0], measured[-1]
    if statuses == {"crosses"}:
        at, lo, hi = ratio_interval([math.log(a) for _, a in found if a is not None])
        lo_, hi_ = (None if lo < first else lo), (None if hi > last else hi)
        return Crossover(
            status="crosses",
            at=at,
            lo=lo_,
            hi=hi_,
            pays_below=True,
            levels=measured,
            blocks=blocks,
            crosses_again=again,
        )
    bounds = [capacity_log_bounds(levels, f) for f in found]
    lower, upper = (
        bounded_ratio_end([b[0] for b in bounds], "lower"),
        bounded_ratio_end([b[1] for b in bounds], "upper"),
    )
    lower, upper = (
        (None if lower is None or lower < first else lower),
        (None if upper is None or upper > last else upper),
    )
    return Crossover(
        status="undecided",
        at=None,
        lo=lower,
        hi=upper,
        pays_below=None,
        levels=measured,
        blocks=blocks,
        crosses_again=again,
    )


def capacity_log_bounds(levels: Sequence[float], found: tuple[str, float | None]) -> tuple[float, float]:
    """What first_crossing's answer says of a capacity, as bounds on its log: equal where it crossed, (log of the
    last level, +inf) past the range, (-inf, log of the first level) over the objective already at the first."""
    status, at = found
    if status == "crosses" and at is not None:
        return math.log(at), math.log(at)
    if status == "above":
        return math.log(levels[-1]), math.inf
    if status == "below":
        return -math.inf, math.log(levels[0])
    raise ValueError(f"no bounds for a capacity that is {status}")


def bounded_ratio_end(log_bounds: Sequence[float], side: str) -> float | None:
    """One end of the 95 % interval of a geometric-mean ratio when some blocks' ratios are known only as bounds (a
    capacity outside the levels measured, counted at the range's edge): `side` "upper" takes every block's upper
    bound and gives the interval's upper end, "lower" the lower bounds and the lower end. Each true log ratio lies on
    the safe side of its bound, so the end is conservative. None when a block has no such bound (infinite) or fewer
    than two blocks."""
    if len(log_bounds) < 2 or not all(math.isfinite(v) for v in log_bounds):
        return None
    _, lo, hi = ratio_interval(log_bounds)
    return hi if side == "upper" else lo


def ratio_interval(log_ratios: Sequence[float]) -> tuple[float, float, float]:
    """The geometric mean of per-block ratios (given as logs) and its 95 % Student-t interval over the blocks (two
    or more)."""
    if len(log_ratios) < 2:
        raise ValueError("an interval needs two or more blocks")
    mean = statistics.fmean(log_ratios)
    half = t_975(len(log_ratios) - 1) * statistics.stdev(log_ratios) / math.sqrt(len(log_ratios))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
