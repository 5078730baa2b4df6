"""Nightly regression detection: change points (ruptures' PELT) in one series' history, per environment."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Tuned by benchmarks/nightly_study.py at 1 % night-to-night noise and a 2 % threshold; docs/nightly.md has the rates.
BETA = 6.0  # PELT penalty in sigma²: low enough to propose a 2-night step of ~2 sigma (a 3 % step by its 2nd night)
Z_ONE = 3.0  # tonight alone is a new level only if this many sigma off (and beyond the threshold): 5 % on the night
Z_MIN = 2.5  # a longer new level: its shift in standard errors (≈ what BETA asks of one split; kept for merged ones)
SIGMA_FLOOR = 0.25  # × threshold: a near-constant series must not make every 0.1 % wobble significant
LEVEL_NIGHTS = 20  # the level before a step is the median of its last nights, not of its whole past
MATCH_NIGHTS = 2  # a change point within ±2 nights of an earlier night's is the same one
LOOKBACK = 20  # ... and is news only if none of the last 20 nights had it: a step near the threshold comes and goes
MASK_PASSES = 4  # rounds of "mask one-night segments, segment again"; each round masks at least one night


@dataclass(frozen=True)
class Night:
    value: float  # > 0 (tok/s, seconds, accept length)
    env: str  # environment key; differs from the previous night's => an environment step at this night


@dataclass(frozen=True, kw_only=True)
class Step:
    index: int  # the first night of the new level (index into the given history)
    kind: str  # "regression" | "improvement" | "environment"
    before: float  # typical level before (median of the previous segment, its last <= 20 nights)
    after: float  # typical level from `index` on (median of the nights so far in the new segment)
    change: float  # after / before - 1 (signed: negative = the value went down)
    nights_after: int  # nights in the new segment (from index to the next step or the end)


@dataclass(frozen=True, kw_only=True)
class Assessment:
    status: str  # "ok" | "regression" | "improvement" | "environment" | "building"
    steps: tuple[Step, ...]  # every step over the whole history, in order (env steps and retained change points)
    new: Step | None  # the step that set `status` when it is new tonight (regression/improvement/env)
    baseline: float | None  # typical level of the current segment before tonight (None when there is none)
    change: float | None  # tonight's value / baseline - 1
    noise: float | None  # robust estimate of night-to-night relative noise in the current environment
    outliers: tuple[int, ...]  # single nights beyond the threshold that did not persist (not change points)
    nights: int  # nights in the current environment, tonight included
    needed: int  # nights the current environment needs before a regression can be called (min_history + 1)


@dataclass(frozen=True)
class _Levels:
    """One environment's nights cut into levels: retained change points, masked single nights, the noise."""

    cuts: tuple[int, ...]  # first night of each level after the first, relative to the environment's start
    masked: frozenset[int]  # one-night segments in the middle: excluded from every level's median
    sigma: float | None  # night-to-night noise of the log values (None: fewer than 2 differences before tonight)


def assess(
    nights: Sequence[Night], *, threshold: float, higher_is_better: bool = True, min_history: int = 5
) -> Assessment:
    """Tonight's status (the last night of `nights`, oldest first) against the history before it.

    Each environment (a run of nights with the same key) is segmented on its own, on log values: PELT (l2 cost,
    penalty BETA·σ², σ the night-to-night noise) proposes change points; a one-night segment before tonight is a bad
    night, masked, and the rest segmented again; then the weakest change point is dropped (Otava-style) until each
    left shifts the median by ≥ threshold and by ≥ Z_MIN standard errors (Z_ONE when tonight alone is the new level).
    Tonight is a regression/improvement when the step into the current level is one that none of the last LOOKBACK
    nights had retained (±MATCH_NIGHTS). Deterministic; the tuning and its measured rates are in docs/nightly.md.
    """
    return assess_cached(nights, threshold, higher_is_better, min_history, {})


def assess_each(
    nights: Sequence[Night], *, threshold: float, higher_is_better: bool = True, min_history: int = 5
) -> list[Assessment]:
    """assess() of every prefix (what the nightly runner said each night), sharing the segmentations between them."""
    cache: dict[tuple[int, int], _Levels] = {}
    return [assess_cached(nights[: i + 1], threshold, higher_is_better, min_history, cache) for i in range(len(nights))]


def assess_cached(
    nights: Sequence[Night],
    threshold: float,
    higher_is_better: bool,
    min_history: int,
    cache: dict[tuple[int, int], _Levels],
) -> Assessment:
    """assess() keeping each environment's segmentation in cache by (first, end) night index, for a caller that
    assesses many prefixes of one history; one that changes a night must drop the keys whose end lies past it."""
    _validate(nights, threshold, min_history)
    values = [n.value for n in nights]
    logs = [math.log(v) for v in values]
    needed = min_history + 1
    envs = _environments(nights)

    def levels(start: int, end: int) -> _Levels:
        # A cache key of (start, end) is sound because every prefix of one history shares the same nights.
        if (start, end) not in cache:
            too_short = end - start < needed  # an environment starts its own history; too few nights: no verdict
            cache[start, end] = _levels(logs[start:end], threshold, segment=not too_short)
        return cache[start, end]

    per_env = [levels(s, e) for s, e in envs]
    steps: list[Step] = []
    outliers: list[int] = []
    for k, ((start, end), lv) in enumerate(zip(envs, per_env, strict=True)):
        if k:
            prev_start, prev_end = envs[k - 1]
            prev = per_env[k - 1]
            before = _level(values, prev_start, prev_end, prev, len(prev.cuts), last=True)
            after = _level(values, start, end, lv, 0)
            steps.append(
                Step(
                    index=start,
                    kind="environment",
                    before=before,
                    after=after,
                    change=after / before - 1,
                    nights_after=_level_end(start, end, lv, 0) - start,
                )
            )
        steps.extend(_cut_steps(values, start, end, lv, higher_is_better))
        outliers.extend(_outliers(values, start, end, lv, threshold))

    cur_start, end = envs[-1]
    cur = per_env[-1]
    in_env = end - cur_start
    tonight = values[-1]

    def verdict(status: str, new: Step | None, baseline: float | None) -> Assessment:
        change = tonight / baseline - 1 if baseline else None
        return Assessment(
            status=status,
            steps=tuple(steps),
            new=new,
            baseline=baseline,
            change=change,
            noise=cur.sigma,
            outliers=tuple(outliers),
            nights=in_env,
            needed=needed,
        )

    if in_env == 1 and cur_start > 0:
        env_step = next(s for s in steps if s.index == cur_start and s.kind == "environment")
        return verdict("environment", env_step, env_step.before)
    if in_env < needed:
        return verdict("building", None, statistics.median(values[cur_start:-1]) if in_env > 1 else None)

    # Only the step into the current level can be news: a dip that has already come back (a regression followed by
    # an improvement) is history re-read with more nights, not a persistent change tonight.
    mine = [s for s in steps if s.index > cur_start]
    last = mine[-1] if mine else None
    seen = [
        o
        for e in range(max(cur_start + 1, end - LOOKBACK), end)
        for o in _cut_steps(values, cur_start, e, levels(cur_start, e), higher_is_better)
    ]
    if last is not None and not any(o.kind == last.kind and abs(o.index - last.index) <= MATCH_NIGHTS for o in seen):
        return verdict(last.kind, last, last.before)
    return verdict("ok", None, _baseline(values, cur_start, end, cur))


def _validate(nights: Sequence[Night], threshold: float, min_history: int) -> None:
    if not nights:
        raise ValueError("the history is empty: at least tonight's value is needed")
    for i, n in enumerate(nights):
        if not (math.isfinite(n.value) and n.value > 0):
            raise ValueError(f"night {i}: value must be a finite number > 0, got {n.value!r}")
    if not (math.isfinite(threshold) and 0 < threshold < 0.5):
        raise ValueError(f"threshold is a fraction in (0, 0.5) (0.02 = 2 %), got {threshold!r}")
    if min_history < 2:
        raise ValueError(
            f"min_history must be >= 2 (the noise is estimated from night-to-night steps), got {min_history}"
        )


def _environments(nights: Sequence[Night]) -> list[tuple[int, int]]:
    """[start, end) of each run of nights with the same environment key."""
    starts = [0] + [i for i in range(1, len(nights)) if nights[i].env != nights[i - 1].env]
    return list(itertools.pairwise([*starts, len(nights)]))


def _levels(logs: Sequence[float], threshold: float, *, segment: bool) -> _Levels:
    if not segment:
        return _Levels((), frozenset(), _rms(logs, (), frozenset()))
    floor = threshold * SIGMA_FLOOR
    # Two passes: the first, with the robust but imprecise MAD, only finds the big steps and bad nights that must
    # not inflate the precise estimate; the second segments with that estimate.
    s = max(_mad(logs), floor)
    cuts, masked = _pelt(logs, BETA * s * s)
    sigma = _rms(logs, _merge(logs, cuts, masked, threshold, s), masked)
    if sigma is not None:
        s = max(sigma, floor)
        cuts, masked = _pelt(logs, BETA * s * s)
    return _Levels(_merge(logs, cuts, masked, threshold, s), masked, sigma)


def _mad(logs: Sequence[float]) -> float:
    """Robust night-to-night noise: MAD of first differences / √2; a step or a bad night moves only 1–2 of them.

    Robust but imprecise (about 37 % efficient): with 30 nights it is off by ±25 %, too loose for a z-test."""
    diffs = [abs(b - a) for a, b in itertools.pairwise(logs)]
    return statistics.median(diffs) / (0.6744897501960817 * math.sqrt(2)) if diffs else 0.0


def _rms(logs: Sequence[float], cuts: Sequence[int], masked: frozenset[int]) -> float | None:
    """Night-to-night noise from the RMS of first differences / √2, leaving out the differences across a retained
    step or touching a masked night, and tonight's: tonight is what is tested against this noise, so it must not
    widen it (a 5 % drop would otherwise hide itself)."""
    d2 = [
        (logs[i] - logs[i - 1]) ** 2
        for i in range(1, len(logs) - 1)
        if i not in masked and i - 1 not in masked and i not in cuts
    ]
    return math.sqrt(sum(d2) / (2 * len(d2))) if len(d2) >= 2 else None


def _pelt(logs: Sequence[float], pen: float) -> tuple[list[int], frozenset[int]]:
    """PELT (l2 cost) change points; a one-night segment that is not the last night is a bad night, masked.

    KernelCPD with the linear kernel is ruptures' compiled PELT for exactly Pelt(model="l2")'s cost: the same
    breakpoints (checked on 450 random series) in 20 µs instead of 40 ms for 100 nights, and an assessment runs it
    for tonight and each of the LOOKBACK nights before.
    """
    import numpy as np
    import ruptures as rpt

    n = len(logs)
    masked: set[int] = set()
    cuts: list[int] = []
    for _ in range(MASK_PASSES):
        keep = [i for i in range(n) if i not in masked]
        if len(keep) < 2:
            return [], frozenset(masked)
        signal = np.asarray([logs[i] for i in keep], dtype=float)
        bkps = [int(b) for b in rpt.KernelCPD(kernel="linear", min_size=1, jump=1).fit(signal).predict(pen=pen)]
        bounds = [0, *bkps]
        singles = [
            bounds[j] for j in range(len(bounds) - 1) if bounds[j + 1] - bounds[j] == 1 and bounds[j + 1] < len(keep)
        ]
        cuts = [keep[b] for b in bkps[:-1] if b not in singles and b - 1 not in singles]
        if not singles:
            return cuts, frozenset(masked)
        masked.update(keep[b] for b in singles)
    # Still isolating nights after MASK_PASSES rounds: keep the rounds' masks and the last cuts that isolate none.
    return [c for c in cuts if c not in masked], frozenset(masked)


def _merge(
    logs: Sequence[float], cuts: list[int], masked: frozenset[int], threshold: float, sigma: float
) -> tuple[int, ...]:
    """Drop the weakest change point until every one left is both ≥ threshold and ≥ Z_MIN standard errors (Otava)."""
    cuts = sorted(cuts)
    while cuts:
        bounds = [0, *cuts, len(logs)]
        segs = [[logs[i] for i in range(a, b) if i not in masked] for a, b in itertools.pairwise(bounds)]
        scores = []
        for before, after in itertools.pairwise(segs):
            before = before[-LEVEL_NIGHTS:]
            # The median of the values, as Step reports it (for an even count it is not the median of the logs).
            change = statistics.median(map(math.exp, after)) / statistics.median(map(math.exp, before)) - 1
            se = sigma * math.sqrt(1 / len(before) + 1 / len(after))
            z = abs(statistics.fmean(after) - statistics.fmean(before)) / se
            scores.append(min(abs(change) / threshold, z / (Z_ONE if len(after) == 1 else Z_MIN)))
        weakest = min(range(len(scores)), key=scores.__getitem__)
        if scores[weakest] >= 1:
            break
        del cuts[weakest]
    return tuple(cuts)


def _level_bounds(start: int, end: int, lv: _Levels, j: int) -> tuple[int, int]:
    bounds = [start, *(start + c for c in lv.cuts), end]
    return bounds[j], bounds[j + 1]


def _level_end(start: int, end: int, lv: _Levels, j: int) -> int:
    return _level_bounds(start, end, lv, j)[1]


def _level(values: Sequence[float], start: int, end: int, lv: _Levels, j: int, *, last: bool = False) -> float:
    """Median of level j's unmasked nights (only its last LEVEL_NIGHTS when it is the level before a step)."""
    a, b = _level_bounds(start, end, lv, j)
    xs = [values[i] for i in range(a, b) if i - start not in lv.masked]
    return statistics.median(xs[-LEVEL_NIGHTS:] if last else xs)


def _cut_steps(values: Sequence[float], start: int, end: int, lv: _Levels, higher_is_better: bool) -> list[Step]:
    steps = []
    for j, c in enumerate(lv.cuts, start=1):
        before = _level(values, start, end, lv, j - 1, last=True)
        after = _level(values, start, end, lv, j)
        change = after / before - 1
        kind = "regression" if (change < 0) == higher_is_better else "improvement"
        steps.append(
            Step(
                index=start + c,
                kind=kind,
                before=before,
                after=after,
                change=change,
                nights_after=_level_end(start, end, lv, j) - start - c,
            )
        )
    return steps


def _outliers(values: Sequence[float], start: int, end: int, lv: _Levels, threshold: float) -> list[int]:
    """Masked nights that are beyond the threshold from their own level (masked small wobbles are not news)."""
    found = []
    for i in sorted(lv.masked):
        j = sum(1 for c in lv.cuts if c <= i)
        if abs(values[start + i] / _level(values, start, end, lv, j) - 1) >= threshold:
            found.append(start + i)
    return found


def _baseline(values: Sequence[float], start: int, end: int, lv: _Levels) -> float:
    """Level of the segment that yesterday belongs to, from the nights before tonight."""
    j = sum(1 for c in lv.cuts if c <= end - 2 - start)
    a, _ = _level_bounds(start, end, lv, j)
    xs = [values[i] for i in range(a, end - 1) if i - start not in lv.masked]
    return statistics.median(xs[-LEVEL_NIGHTS:]) if xs else values[end - 2]
