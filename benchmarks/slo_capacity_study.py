"""The A/B on the highest load within an SLO: how often its CI covers the true ratio of two arms' capacities, how
wide it is, and how often blocks are censored — by simulation, for docs/statistics.md.

Each synthetic experiment measures two arms at a few load levels in B blocks. An arm's true margin to the SLO
(limit / its pNN; above 1 within the SLO) falls with the load and crosses 1 at its true capacity; every launch adds
a restart draw per level and a block effect shared by its levels (a host's state at that time), both normal on the
log scale. `ABResult.capacity_comparisons` takes, per block, where each launch's margin falls through 1
(`stats.crossover.first_crossing`, linear between levels in log(level) and log(margin)) and the Student-t interval
of the per-block log ratios (`ratio_interval`). Two truths: log margin linear in log(load) (the interpolation is
exact) and quadratic (it is not). Then the censored case: the baseline's true capacity past the last level, so
every block's ratio is known only as an upper bound (the baseline counted at the last level) and the comparison's
answer is the upper end of the interval over those bounds (`bounded_ratio_end`): how often that end lies at or
above the true ratio (it must, at least 97.5 % of the time) and how often it decides (below 1). A minute on one core:

    python benchmarks/slo_capacity_study.py --experiments 1000 --seed 1
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.stats.crossover import bounded_ratio_end, capacity_log_bounds, first_crossing, ratio_interval

LEVELS = (1.0, 2.0, 4.0, 8.0, 16.0)
CAPACITY = {"base": 7.0, "arm": 4.5}  # where each arm's margin crosses 1, in the levels' unit


def linear(x: float, capacity: float) -> float:
    """Log margin linear in log(load): 3x headroom alone (log 3 at load 1), 1 at the capacity."""
    return math.log(3.0) * (1 - math.log(x) / math.log(capacity))


def curved(x: float, capacity: float) -> float:
    """The same ends, but the margin holds at light load and falls off fast near the capacity."""
    v = math.log(x) / math.log(capacity)
    return math.log(3.0) * (1 - v * v)


TRUTHS: dict[str, Callable[[float, float], float]] = {"linear in log(load)": linear, "quadratic in log(load)": curved}


def experiment(
    rng: random.Random, truth: Callable[[float, float], float], blocks: int, noise: float, block_sd: float
) -> tuple[tuple[float, float, float] | None, int]:
    """One experiment: the interval (ratio, lo, hi) or None, and the blocks censored."""
    logs, censored = [], 0
    for _ in range(blocks):
        shared = rng.gauss(0, block_sd)
        found = []
        for name in ("base", "arm"):
            margins = [math.exp(truth(x, CAPACITY[name]) + shared + rng.gauss(0, noise)) for x in LEVELS]
            found.append(first_crossing(LEVELS, margins)[1])
        if found[0] is None or found[1] is None:
            censored += 1
            continue
        logs.append(math.log(found[1] / found[0]))
    return (ratio_interval(logs) if len(logs) >= 2 else None), censored


CENSORED = ((24.0, 4.5), (24.0, 12.0), (17.0, 14.0))  # (base, arm) true capacities, the base's past the last level


def bounded_experiment(
    rng: random.Random, capacities: tuple[float, float], blocks: int, noise: float, block_sd: float
) -> float | None:
    """One experiment with censoring: the upper end of the ratio's interval over every block's upper bound, or None
    where a block has none (the arm past the range too)."""
    highs = []
    for _ in range(blocks):
        shared = rng.gauss(0, block_sd)
        bounds = []
        for capacity in capacities:
            margins = [math.exp(linear(x, capacity) + shared + rng.gauss(0, noise)) for x in LEVELS]
            bounds.append(capacity_log_bounds(LEVELS, first_crossing(LEVELS, margins)))
        (base_lo, _), (_, arm_hi) = bounds
        highs.append(arm_hi - base_lo)
    return bounded_ratio_end(highs, "upper")


def censored_table(n: int, seed: int, block_sd: float) -> None:
    """The bounded comparison's table: holds (its end at or above the truth), decides (below 1), no bound."""
    print(f"\n{'capacities base/arm':20} {'noise':>5} {'blocks':>6} {'end holds':>9} {'decided':>8} {'no bound':>8}")
    for capacities in CENSORED:
        truth = capacities[1] / capacities[0]
        for noise in (0.05, 0.15):
            for blocks in (3, 5):
                rng = random.Random(f"{seed}/censored/{capacities}/{noise}/{blocks}")
                ends = [bounded_experiment(rng, capacities, blocks, noise, block_sd) for _ in range(n)]
                got = [e for e in ends if e is not None]
                holds = sum(e >= truth for e in got) / max(1, len(got))
                decided = sum(e < 1 for e in got) / max(1, len(got))
                label = f"{capacities[0]:g} / {capacities[1]:g} ({truth:.3f})"
                print(f"{label:20} {noise:5.2f} {blocks:6d} {holds:9.1%} {decided:8.1%} {1 - len(got) / n:8.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--block-sd", type=float, default=0.03)
    parser.add_argument("--smoke", action="store_true", help="a few experiments, to check the script runs")
    args = parser.parse_args(argv)
    n = 20 if args.smoke else args.experiments
    true_ratio = CAPACITY["arm"] / CAPACITY["base"]
    print(
        f"true capacities: base {CAPACITY['base']:g}, arm {CAPACITY['arm']:g} (ratio {true_ratio:.3f}); levels {LEVELS}"
    )
    print(f"{'truth':24} {'noise':>5} {'blocks':>6} {'covered':>8} {'decided':>8} {'median width':>12} {'censored':>8}")
    for label, truth in TRUTHS.items():
        for noise in (0.05, 0.15):
            for blocks in (3, 5, 10):
                rng = random.Random(f"{args.seed}/{label}/{noise}/{blocks}")
                covered = decided = intervals = censored = 0
                widths = []
                for _ in range(n):
                    found, cut = experiment(rng, truth, blocks, noise, args.block_sd)
                    censored += cut
                    if found is None:
                        continue
                    intervals += 1
                    _, lo, hi = found
                    covered += lo <= true_ratio <= hi
                    decided += hi < 1 or lo > 1
                    widths.append(hi / lo)
                width = f"{statistics.median(widths):.3f}x" if widths else "-"
                print(
                    f"{label:24} {noise:5.2f} {blocks:6d} {covered / max(1, intervals):8.1%} "
                    f"{decided / max(1, intervals):8.1%} {width:>12} {censored / (n * blocks):8.1%}"
                )
    censored_table(n, args.seed, args.block_sd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
