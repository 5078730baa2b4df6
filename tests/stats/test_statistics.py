"""Launch-level comparison statistics on synthetic data with known answers."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.stats.estimates import (
    RatioEstimate,
    blocks_needed,
    launch_value,
    mad_outliers,
    minimal_detectable_effect,
    ratio_ci,
    verdict,
)


def _experiment(
    rng: random.Random,
    blocks: int,
    effect: float,
    restart_sd: float = 0.01,
    run_sd: float = 0.002,
    runs: int = 5,
    base_tps: float = 82.0,
) -> tuple[list[list[float]], list[list[float]]]:
    """Blocks of (baseline launch, arm launch); each launch draws its own speed factor, like a server restart."""

    def launch(mean: float) -> list[float]:
        factor = math.exp(rng.gauss(0.0, restart_sd))
        return [mean * factor * math.exp(rng.gauss(0.0, run_sd)) for _ in range(runs)]

    base = [launch(base_tps) for _ in range(blocks)]
    arm = [launch(base_tps * (1 + effect)) for _ in range(blocks)]
    return base, arm


def test_exact_ratio_and_a_clear_verdict() -> None:
    base = [[82.0, 82.1, 81.9]] * 4
    arm = [[60.0, 60.1, 59.9]] * 4
    est = ratio_ci(base, arm, n_boot=500)
    assert est.ratio == pytest.approx(60 / 82)
    assert est.lo <= est.ratio <= est.hi and est.hi < 1
    assert verdict(est) == "slower"
    faster = ratio_ci(arm, base, n_boot=500)
    assert faster.ratio == pytest.approx(82 / 60) and verdict(faster) == "faster"


def test_one_block_is_always_inconclusive() -> None:
    # 89 vs 82 from one launch each: the seed's phantom. One launch per arm cannot tell restart noise apart.
    est = ratio_ci([[82.1, 82.2, 82.3]], [[89.0, 89.1, 89.2]], n_boot=500)
    assert est.blocks == 1 and est.log_sd is None and "runs within launches" in est.method
    assert verdict(est) == "inconclusive"
    assert minimal_detectable_effect(est) is None and blocks_needed(est) is None


def test_no_difference_needs_a_tight_interval_inside_the_minimum_effect() -> None:
    rng = random.Random(3)
    base, arm = _experiment(rng, blocks=12, effect=0.0, restart_sd=0.003)
    est = ratio_ci(base, arm, n_boot=1000)
    assert verdict(est, min_effect=0.02) == "no difference"
    noisy_base, noisy_arm = _experiment(random.Random(4), blocks=3, effect=0.0, restart_sd=0.05)
    assert verdict(ratio_ci(noisy_base, noisy_arm, n_boot=1000), min_effect=0.02) == "inconclusive"


def test_aa_false_verdict_rate_is_at_most_five_percent() -> None:
    rng = random.Random(11)
    wrong = 0
    trials = 200
    for _ in range(trials):
        base, arm = _experiment(rng, blocks=5, effect=0.0)
        if verdict(ratio_ci(base, arm, n_boot=300, seed=rng.randrange(10**6))) in ("faster", "slower"):
            wrong += 1
    assert wrong / trials <= 0.05


def test_mde_and_blocks_needed_follow_the_noise() -> None:
    from orchestrator.stats.estimates import Z_80, t_975

    est = RatioEstimate(ratio=1.0, lo=0.98, hi=1.02, blocks=4, method="x", log_sd=0.02)
    assert minimal_detectable_effect(est) == pytest.approx(math.exp((3.182 + 0.8416) * 0.02 / 2) - 1, rel=1e-3)
    n = blocks_needed(est, min_effect=0.02)
    assert n is not None

    def mde_log(k: int) -> float:
        return (t_975(k - 1) + Z_80) * 0.02 / math.sqrt(k)

    assert mde_log(n) <= math.log(1.02) < mde_log(n - 1)  # the smallest number of blocks that suffices
    quieter = RatioEstimate(ratio=1.0, lo=0.99, hi=1.01, blocks=4, method="x", log_sd=0.002)
    assert blocks_needed(quieter, 0.02) == 2


def test_launch_value_and_outliers() -> None:
    assert launch_value([3.0, 1.0, 2.0]) == 2.0
    with pytest.raises(ValueError):
        launch_value([])
    assert mad_outliers([82.1, 82.2, 82.3, 82.2, 60.0]) == [4]
    assert mad_outliers([82.0, 82.0, 82.0]) == []
    assert mad_outliers([1.0, 2.0]) == []
    with pytest.raises(ValueError, match="same number"):
        ratio_ci([[1.0]], [[1.0], [2.0]])
