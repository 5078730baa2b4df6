"""Open-loop arrival schedules: when each request of a rate level is sent, a pure function of the seed."""

from __future__ import annotations

import math
import random

ARRIVAL_KINDS = ("poisson", "gamma:CV", "constant")
MAX_CV = 10.0  # beyond it nearly every gap is ~0 and one gap holds the whole run: a burst test, not a rate
MAX_RATE = 10_000.0  # requests/s; above it no Python client keeps a schedule
MAX_LEVELS = 64
# One run at a rate level (or one replay of a trace): at most this long (--duration, a trace's span) and this many
# requests (--requests, a trace's lines); beyond them a run holds a server for days, or is a typo.
MAX_DURATION_S = 86400.0
MAX_REQUESTS = 100_000


def parse(spec: str) -> tuple[str, float]:
    """`poisson`, `constant` or `gamma:CV` → (kind, coefficient of variation of the gaps); ValueError says what is
    valid. poisson has CV 1, constant 0."""
    text = str(spec).strip().lower()
    if text == "poisson":
        return "poisson", 1.0
    if text == "constant":
        return "constant", 0.0
    kind, colon, value = text.partition(":")
    if kind == "gamma":
        try:
            cv = float(value) if colon else math.nan
        except ValueError:
            cv = math.nan
        if not (math.isfinite(cv) and 0 < cv <= MAX_CV):
            raise ValueError(
                f"{spec!r}: gamma needs its coefficient of variation, a number above 0 and at most {MAX_CV:g} "
                "(gamma:1 is Poisson, gamma:2 burstier, gamma:0.5 steadier)"
            )
        return "gamma", cv
    raise ValueError(f"{spec!r}: expected poisson, constant or gamma:CV (e.g. gamma:2)")


def burstiness(cv: float) -> float:
    """vLLM's `--burstiness` for the same gaps: its gamma shape, 1/CV² (1 = Poisson, below 1 burstier)."""
    return math.inf if cv == 0 else 1.0 / (cv * cv)


def _normal(rng: random.Random) -> float:
    # Box-Muller from rng.random() alone: the stdlib's own normal and gamma samplers may change between Python
    # versions, and a recorded schedule must come out the same from the same seed on any of them.
    u1, u2 = rng.random(), rng.random()
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


def _gamma(rng: random.Random, shape: float) -> float:
    """A Gamma(shape, 1) draw (Marsaglia and Tsang; below shape 1 boosted by U^(1/shape))."""
    if shape < 1.0:
        return _gamma(rng, shape + 1.0) * math.pow(1.0 - rng.random(), 1.0 / shape)
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = _normal(rng)
        v = 1.0 + c * x
        v = v * v * v
        if v <= 0:
            continue
        u = 1.0 - rng.random()
        if math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v


def unit_gap(rng: random.Random, kind: str, cv: float) -> float:
    """One gap between arrivals at 1 request/s: mean 1, coefficient of variation cv."""
    if kind == "constant":
        return 1.0
    if kind == "poisson":
        return -math.log(1.0 - rng.random())
    shape = 1.0 / (cv * cv)
    return _gamma(rng, shape) / shape


def schedule(
    rate: float,
    arrivals: str,
    *,
    seed: int,
    run: int,
    duration_s: float | None = None,
    requests: int | None = None,
) -> list[float]:
    """Seconds from the start of a run at which each of its requests is due: the first at 0, then gaps of mean
    1/rate. With `requests`, that many; with `duration_s`, every arrival before it.

    The draws depend on (seed, run) alone, not on the rate: a level's schedule is the unit-rate one divided by its
    rate, so every arm and launch of a level gets the same schedule, and levels differ only in speed (common random
    numbers across levels). Times are rounded to the microsecond so that the recorded digest does not hang on the
    last bit of a logarithm.
    """
    if (duration_s is None) == (requests is None):
        raise ValueError("a schedule needs a duration or a number of requests (one of them)")
    kind, cv = parse(arrivals)
    rng = random.Random(f"orch-arrivals/{seed}/{run}")
    out: list[float] = []
    unit = 0.0
    while True:
        at = unit / rate
        if (requests is not None and len(out) >= requests) or (duration_s is not None and at >= duration_s):
            return out
        out.append(round(at, 6))
        unit = len(out) if kind == "constant" else unit + unit_gap(rng, kind, cv)


def expected_requests(rate: float, duration_s: float | None, requests: int | None) -> int:
    """How many requests one run of the level sends (on average, for a duration): what the plan counts."""
    if requests is not None:
        return requests
    return max(1, math.ceil(rate * (duration_s or 0.0)))


def span_s(rate: float, duration_s: float | None, requests: int | None) -> float:
    """How long a run's arrivals last (on average, for a number of requests)."""
    if duration_s is not None:
        return duration_s
    return max(0, (requests or 1) - 1) / rate
