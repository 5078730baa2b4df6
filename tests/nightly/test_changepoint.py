"""The nightly regression detector on synthetic histories with known steps (seeded, deterministic)."""

from __future__ import annotations

import math
import random
import time

import pytest

from orchestrator.nightly.changepoint import Night, assess, assess_each


def _noise(rng: random.Random, n: int, sd: float = 0.01, level: float = 100.0, env: str = "a") -> list[Night]:
    return [Night(level * math.exp(rng.gauss(0.0, sd)), env) for _ in range(n)]


def _flat(n: int, level: float = 100.0, env: str = "a") -> list[Night]:
    return [Night(level, env) for _ in range(n)]


def test_flat_noise_is_ok_every_night() -> None:
    history = _noise(random.Random(1), 80, sd=0.005)
    said = assess_each(history, threshold=0.02)
    assert [a.status for a in said[6:]] == ["ok"] * 74
    last = said[-1]
    assert last.steps == () and last.new is None and last.outliers == ()
    assert last.baseline == pytest.approx(100.0, rel=0.005)
    assert last.noise is not None and 0.003 < last.noise < 0.008  # the true night-to-night noise is 0.5 %


def test_noise_estimate_follows_the_series() -> None:
    for sd in (0.005, 0.01, 0.03):
        noise = assess(_noise(random.Random(2), 100, sd=sd), threshold=0.2).noise
        assert noise is not None and 0.75 * sd < noise < 1.25 * sd


def test_five_percent_drop_is_a_regression_on_the_night() -> None:
    history = [*_noise(random.Random(3), 30), Night(95.0, "a")]
    a = assess(history, threshold=0.02)
    assert a.status == "regression"
    assert a.new is not None and a.new.index == 30 and a.new.kind == "regression" and a.new.nights_after == 1
    assert a.new.change == pytest.approx(-0.05, abs=0.01)
    assert a.baseline == pytest.approx(100.0, rel=0.01) and a.change == pytest.approx(-0.05, abs=0.01)
    assert a.steps == (a.new,)


def test_three_percent_drop_is_a_regression_by_the_second_night() -> None:
    # The first night of the step alone is beyond the threshold but within noise (z ≈ 2.3): no verdict yet.
    base = _noise(random.Random(4), 30)
    first = assess([*base, Night(97.7, "a")], threshold=0.02)
    assert first.status == "ok" and first.steps == ()
    second = assess([*base, Night(97.7, "a"), Night(96.6, "a")], threshold=0.02)
    assert second.status == "regression"
    assert second.new is not None and second.new.index == 30 and second.new.nights_after == 2
    assert second.new.change == pytest.approx(-0.028, abs=0.01)


def test_a_reported_regression_is_ok_the_next_nights_and_stays_in_steps() -> None:
    rng = random.Random(5)
    history = [*_noise(rng, 30), *_noise(rng, 10, level=94.0)]
    said = assess_each(history, threshold=0.02)
    assert said[30].status == "regression"
    for a in said[31:]:
        assert a.status == "ok"
        assert [(s.index, s.kind) for s in a.steps] == [(30, "regression")]
        assert a.baseline is not None and a.baseline < 97  # the current level, not the old one
    assert said[-1].steps[0].nights_after == 10 and said[-1].baseline == pytest.approx(94.0, rel=0.01)


def test_one_bad_night_is_an_outlier_not_a_change_point() -> None:
    rng = random.Random(6)
    history = [*_noise(rng, 30, sd=0.005), Night(92.0, "a"), *_noise(rng, 10, sd=0.005)]
    said = assess_each(history, threshold=0.02)
    assert said[30].status == "regression"  # alone and 8 % off, it cannot be told from a step on the night
    for a in said[32:]:
        assert a.status == "ok" and a.steps == () and a.outliers == (30,)
        assert a.baseline == pytest.approx(100.0, rel=0.005)  # the bad night is not in the level


def test_environment_step_is_reported_as_such_and_never_as_a_regression() -> None:
    rng = random.Random(7)  # 0.5 % noise: 1 % noise pages about once in 130 nights, which is not this test's subject
    history = [*_noise(rng, 30, sd=0.005, env="v1"), *_noise(rng, 30, sd=0.005, level=95.0, env="v2")]
    said = assess_each(history, threshold=0.02)
    env = said[30]
    assert env.status == "environment" and env.nights == 1
    assert env.new is not None and env.new.kind == "environment" and env.new.index == 30
    assert env.new.before == pytest.approx(100.0, rel=0.01)
    assert env.change == pytest.approx(-0.05, abs=0.01) and env.new.change == env.change
    # The new environment starts its own history: min_history (5) nights before tonight before a verdict.
    assert [a.status for a in said[31:35]] == ["building"] * 4
    assert [a.nights for a in said[31:36]] == [2, 3, 4, 5, 6]
    assert all(a.needed == 6 for a in said)
    assert all(a.status == "ok" for a in said[35:])
    assert all(a.status != "regression" for a in said)
    last = said[-1]
    assert [(s.index, s.kind) for s in last.steps] == [(30, "environment")]
    assert last.steps[0].nights_after == 30 and last.baseline == pytest.approx(95.0, rel=0.01)


def test_building_reports_the_level_so_far() -> None:
    a = assess([Night(100.0, "v1"), Night(102.0, "v1"), Night(90.0, "v1")], threshold=0.02)
    assert a.status == "building" and a.nights == 3 and a.needed == 6 and a.new is None
    assert a.baseline == pytest.approx(101.0) and a.change == pytest.approx(90 / 101 - 1)
    first = assess([Night(100.0, "v1")], threshold=0.02)
    assert first.status == "building" and first.baseline is None and first.change is None and first.noise is None


def test_a_step_inside_the_building_nights_is_reported_when_the_verdicts_start() -> None:
    # Nights 0–1 at 100, then 95: the first night with enough history sees a step nobody has reported yet.
    history = [Night(100.0, "a"), Night(100.1, "a"), *_noise(random.Random(8), 4, sd=0.002, level=95.0)]
    said = assess_each(history, threshold=0.02)
    assert [a.status for a in said[:5]] == ["building"] * 5
    assert said[5].status == "regression" and said[5].new is not None and said[5].new.index == 2


def test_lower_is_better_a_rise_is_the_regression() -> None:
    base = _noise(random.Random(9), 30, level=200.0)  # TTFT p99, ms
    up = assess([*base, Night(212.0, "a")], threshold=0.02, higher_is_better=False)
    assert up.status == "regression" and up.new is not None and up.new.change > 0
    down = assess([*base, Night(188.0, "a")], threshold=0.02, higher_is_better=False)
    assert down.status == "improvement" and down.new is not None and down.new.change < 0


def test_a_rise_is_an_improvement_when_higher_is_better() -> None:
    rng = random.Random(10)
    said = assess_each([*_noise(rng, 30), *_noise(rng, 5, level=106.0)], threshold=0.02)
    assert said[30].status == "improvement"
    assert said[30].new is not None and said[30].new.change == pytest.approx(0.06, abs=0.015)
    assert [a.status for a in said[31:]] == ["ok"] * 4


def test_a_change_below_the_threshold_is_not_a_step_however_clear() -> None:
    # A quiet series (0.1 %) drops by 1.5 % for good: clearly real, but smaller than what is worth waking for.
    rng = random.Random(11)
    said = assess_each([*_noise(rng, 30, sd=0.001), *_noise(rng, 20, sd=0.001, level=98.5)], threshold=0.02)
    assert all(a.status == "ok" for a in said[6:]) and said[-1].steps == ()


def test_a_series_noisier_than_the_threshold_pages_only_on_shifts_beyond_its_noise() -> None:
    # 3 % noise against a 2 % threshold: two nights 4 % low are beyond the threshold but within the noise.
    rng = random.Random(15)
    base = _noise(rng, 40, sd=0.03)
    level = sorted(n.value for n in base)[20]
    a = assess([*base, Night(0.96 * level, "a"), Night(0.96 * level, "a")], threshold=0.02)
    assert a.status == "ok" and a.steps == ()
    assert a.noise is not None and 0.02 < a.noise < 0.045  # 3 %, estimated from 40 nights
    big = assess([*base, Night(0.75 * level, "a")], threshold=0.02)
    assert big.status == "regression"  # 25 % is 8 sigma


def test_a_constant_series_does_not_explode() -> None:
    # Zero noise: the noise floor (a quarter of the threshold) keeps a 0.5 % wobble from being "infinitely" significant.
    assert assess([*_flat(20), Night(99.5, "a")], threshold=0.02).status == "ok"
    drop = assess([*_flat(20), Night(97.0, "a")], threshold=0.02)
    assert drop.status == "regression" and drop.noise == 0.0


def test_a_dip_that_came_back_is_not_news_later() -> None:
    # Two bad nights, then back: the dip is reported once (regression, then improvement), never again.
    rng = random.Random(12)
    history = [*_noise(rng, 30, sd=0.005), Night(93.0, "a"), Night(93.2, "a"), *_noise(rng, 15, sd=0.005)]
    said = assess_each(history, threshold=0.02)
    assert [a.status for a in said[30:33]] == ["regression", "ok", "improvement"]
    assert [a.status for a in said[33:]] == ["ok"] * 14
    assert [(s.index, s.kind) for s in said[-1].steps] == [(30, "regression"), (32, "improvement")]


def test_a_step_is_reported_once_even_when_its_change_point_comes_and_goes() -> None:
    # 4 % noise against a 2 % threshold: change points near the threshold are retained one night and not the next.
    said = assess_each(_noise(random.Random(15), 60, sd=0.04), threshold=0.02)
    reported = [(a.new.kind, a.new.index) for a in said if a.new is not None and a.status != "environment"]
    assert reported  # the series does flicker
    for j, (kind, index) in enumerate(reported):
        assert not any(k == kind and abs(i - index) <= 2 for k, i in reported[:j]), reported


def test_assess_each_is_assess_of_every_prefix() -> None:
    rng = random.Random(13)
    history = [*_noise(rng, 20, env="x"), *_noise(rng, 15, level=96.0, env="x"), *_noise(rng, 12, env="y")]
    assert assess_each(history, threshold=0.02) == [assess(history[: i + 1], threshold=0.02) for i in range(47)]


@pytest.mark.parametrize(
    ("nights", "threshold", "min_history", "message"),
    [
        ([], 0.02, 5, "empty"),
        ([Night(100.0, "a"), Night(0.0, "a")], 0.02, 5, "night 1: value must be a finite number > 0"),
        ([Night(-1.0, "a")], 0.02, 5, "> 0"),
        ([Night(math.nan, "a")], 0.02, 5, "finite"),
        ([Night(100.0, "a")], 0.0, 5, "threshold"),
        ([Night(100.0, "a")], 0.5, 5, "threshold"),
        ([Night(100.0, "a")], -0.02, 5, "threshold"),
        ([Night(100.0, "a")], math.nan, 5, "threshold"),
        ([Night(100.0, "a")], 0.02, 1, "min_history"),
    ],
)
def test_invalid_input_is_a_clear_error(nights: list[Night], threshold: float, min_history: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        assess(nights, threshold=threshold, min_history=min_history)


def test_fast_enough_for_every_series_every_night() -> None:
    history = _noise(random.Random(14), 100)
    started = time.perf_counter()
    for i in range(1, 101):
        assess(history[:i], threshold=0.02)
    # A bound on pathology (a quadratic blow-up takes minutes), not a speed test: about 0.1 s on an idle machine.
    assert time.perf_counter() - started < 30.0
