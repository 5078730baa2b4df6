"""The crossover (pure): where an arm's ratio to the baseline crosses 1 over load levels, and its CI over blocks."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.stats.crossover import crossover

LEVELS = (1.0, 2.0, 4.0, 8.0, 16.0)


def _ratios(truth: float, blocks: int, noise: float, rng: random.Random, at: float = 6.0) -> list[list[float | None]]:
    """+`truth` (log) alone, falling linearly in log(load) to cross 1 at `at`, with per-block noise."""
    return [
        [math.exp(truth * (1 - math.log(x) / math.log(at)) + rng.gauss(0, noise)) for _ in range(blocks)]
        for x in LEVELS
    ]


def test_a_noiseless_line_crosses_where_it_was_drawn() -> None:
    got = crossover(LEVELS, _ratios(math.log(1.4), 3, 0.0, random.Random(1)))
    assert got.status == "crosses" and got.pays_below is True
    # The two interpolants (in log load, exact here; in load, a little low) bracket it: the answer spans both.
    assert got.at == pytest.approx(6.0, rel=0.05) and got.lo is not None and got.hi is not None
    assert got.lo <= got.at <= got.hi and got.lo <= 6.0 <= got.hi * 1.0001 and got.hi / got.lo < 1.1


def test_noise_widens_the_interval_around_the_truth() -> None:
    got = crossover(LEVELS, _ratios(math.log(1.4), 5, 0.03, random.Random(7)))
    assert got.status == "crosses" and got.lo is not None and got.hi is not None
    assert got.lo < got.at < got.hi and got.lo < 6.0 < got.hi and got.hi / got.lo < 2
    assert got.to_dict()["ci"] == [got.lo, got.hi] and "Student-t" in str(got.to_dict()["method"])


def test_an_arm_that_gains_with_load_pays_above_the_crossing() -> None:
    flipped = [[1 / v for v in row if v is not None] for row in _ratios(math.log(1.4), 4, 0.0, random.Random(2))]
    got = crossover(LEVELS, flipped)  # type: ignore[arg-type]
    assert got.status == "crosses" and got.pays_below is False and got.at == pytest.approx(6.0, rel=0.05)


def test_no_crossing_in_range_is_said_as_such() -> None:
    rng = random.Random(3)
    always = [[1.3 * math.exp(rng.gauss(0, 0.01)) for _ in range(4)] for _ in LEVELS]
    assert crossover(LEVELS, always).status == "pays throughout"  # type: ignore[arg-type]
    never = [[0.7 * math.exp(rng.gauss(0, 0.01)) for _ in range(4)] for _ in LEVELS]
    assert crossover(LEVELS, never).status == "never pays"  # type: ignore[arg-type]
    # Close to 1 at the top with much noise: no crossing seen, but one past 8 cannot be excluded.
    edge = [[math.exp(0.3 - 0.28 * k / 4 + rng.gauss(0, 0.05)) for _ in range(3)] for k in range(5)]
    got = crossover(LEVELS, edge)  # type: ignore[arg-type]
    assert got.status in ("undecided", "crosses")
    assert got.hi is None  # the interval reaches past the highest level measured: open on that side


def test_a_block_missing_a_level_is_left_out_everywhere() -> None:
    ratios = _ratios(math.log(1.4), 4, 0.02, random.Random(4))
    ratios[2][1] = None
    assert crossover(LEVELS, ratios).blocks == 3


@pytest.mark.parametrize(
    ("levels", "ratios", "message"),
    [
        ((1.0,), [[1.0, 1.1]], "two or more levels"),
        ((2.0, 1.0), [[1.0, 1.1], [1.0, 1.1]], "increasing"),
        ((1.0, 2.0), [[1.0, None], [1.0, 1.1]], "two or more blocks"),
    ],
)
def test_too_little_to_go_on_is_refused(
    levels: tuple[float, ...], ratios: list[list[float | None]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        crossover(levels, ratios)


def test_the_interval_covers_about_as_often_as_it_claims() -> None:
    """A small version of benchmarks/crossover_study.py (docs/statistics.md): on a truth linear in log(load) the
    95 % interval holds the true crossing in at least 90 % of 200 seeded experiments (the union of two interpolants
    is conservative: about 98 % in the study)."""
    rng = random.Random(11)
    hits = 0
    for _ in range(200):
        got = crossover(LEVELS, _ratios(math.log(1.4), 4, 0.03, rng))
        hits += got.status == "crosses" and (got.lo is None or got.lo <= 6.0) and (got.hi is None or got.hi >= 6.0)
    assert hits >= 180
