"""Open-loop arrival schedules: seeded, identical for every arm and launch, the rate and burstiness asked for."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from orchestrator.config import arrivals
from orchestrator.config.workload import BenchConfig, request_items
from orchestrator.experiment.resume import requests_digest


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_a_schedule_is_a_pure_function_of_the_seed_and_run() -> None:
    one = arrivals.schedule(4.0, "poisson", seed=7, run=0, requests=200)
    assert one == arrivals.schedule(4.0, "poisson", seed=7, run=0, requests=200)  # every arm, every launch
    assert one != arrivals.schedule(4.0, "poisson", seed=8, run=0, requests=200)
    assert one != arrivals.schedule(4.0, "poisson", seed=7, run=1, requests=200)  # each run of a level its own
    assert one[0] == 0.0 and one == sorted(one) and len(one) == 200
    assert all(t == round(t, 6) for t in one)  # microseconds: the digest does not hang on a logarithm's last bit


def test_levels_are_the_same_draws_at_another_speed() -> None:
    slow = arrivals.schedule(2.0, "gamma:2", seed=3, run=0, requests=100)
    fast = arrivals.schedule(8.0, "gamma:2", seed=3, run=0, requests=100)
    assert [round(t / 4, 6) for t in slow] == pytest.approx(fast, abs=2e-6)


def test_constant_is_exact() -> None:
    times = arrivals.schedule(4.0, "constant", seed=0, run=0, duration_s=5)
    assert times == [i / 4 for i in range(20)]
    assert arrivals.schedule(3.0, "constant", seed=9, run=4, requests=4) == [0.0, 0.333333, 0.666667, 1.0]


@pytest.mark.parametrize(("spec", "cv"), [("poisson", 1.0), ("gamma:1", 1.0), ("gamma:2", 2.0), ("gamma:0.5", 0.5)])
def test_rate_and_cv_over_many_draws(spec: str, cv: float) -> None:
    gaps = [g for run in range(20) for g in _gaps(arrivals.schedule(5.0, spec, seed=1, run=run, requests=1000))]
    mean = statistics.fmean(gaps)
    assert 1 / mean == pytest.approx(5.0, rel=0.03)  # ~20,000 gaps: the rate within 3 %
    assert statistics.pstdev(gaps) / mean == pytest.approx(cv, rel=0.06)


def test_a_duration_holds_every_arrival_before_it() -> None:
    counts = [len(arrivals.schedule(10.0, "poisson", seed=2, run=r, duration_s=20)) for r in range(40)]
    assert statistics.fmean(counts) == pytest.approx(200, rel=0.03)  # Poisson(200): mean 200, sd ~14
    times = arrivals.schedule(10.0, "poisson", seed=2, run=0, duration_s=20)
    assert max(times) < 20


def test_parse_and_burstiness() -> None:
    assert arrivals.parse("poisson") == ("poisson", 1.0)
    assert arrivals.parse(" Constant ") == ("constant", 0.0)
    assert arrivals.parse("gamma:2") == ("gamma", 2.0)
    assert arrivals.burstiness(2.0) == 0.25 and arrivals.burstiness(1.0) == 1.0  # vLLM's: 1/CV²
    assert math.isinf(arrivals.burstiness(0.0))
    for bad in ("gamma", "gamma:0", "gamma:-1", "gamma:nan", "gamma:11", "gamma:x", "uniform", ""):
        with pytest.raises(ValueError, match=r"gamma|poisson"):
            arrivals.parse(bad)


def test_request_items_carry_the_schedule_and_the_digest_covers_it() -> None:
    bench = BenchConfig(runs=2, warmup=1, seed=5, rate=(2.0, 8.0), duration_s=3.0)
    items = request_items(bench)
    assert "scheduled_s" not in items[0]  # the warmup
    expected = [bench.schedule(r, i) for r in bench.rate for i in range(bench.runs)]
    assert [it["scheduled_s"] for it in items[1:]] == [t for s in expected for t in s]
    assert request_items(bench) == items
    other = BenchConfig(runs=2, warmup=1, seed=5, rate=(2.0, 8.0), duration_s=3.0, arrivals="gamma:2")
    assert requests_digest(other) != requests_digest(bench)


def test_a_closed_loop_config_is_stored_as_before() -> None:
    closed = BenchConfig(concurrency=(1, 4))
    assert "rate" not in closed.to_dict() and "arrivals" not in closed.to_dict()
    assert all("scheduled_s" not in it for it in request_items(closed))
    opened = BenchConfig(rate=[2, 4], requests_per_level=10)  # type: ignore[arg-type]  # as read back from JSON
    assert opened.rate == (2, 4) and opened.to_dict()["rate"] == [2, 4] and opened.open_loop
