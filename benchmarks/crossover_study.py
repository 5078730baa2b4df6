"""The crossover's confidence interval: how often it covers the true crossing load, how wide it is, and how often the
answer is "crosses" at all — by simulation, for docs/statistics.md.

Each synthetic experiment measures a speculative arm against its baseline at a few load levels (rates or
concurrencies) in B blocks. The true log ratio at load x is a curve with a known zero x* (the crossover); every
block adds a restart draw per level (what one launch pair of a block gets) and a block effect shared by its levels
(a host's state at that time), both normal on the log scale. `stats.crossover` then estimates x* and its 95 % CI from
the per-level, per-block ratios. Three truths: linear and quadratic in log(load), and linear in the load itself
(what a verify cost growing with the batch gives), to see what interpolating between measured levels costs; once
with orch's two interpolants, once with the log one alone. A few minutes on one core:

    python benchmarks/crossover_study.py --experiments 400 --seed 1
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

from orchestrator.stats.crossover import Crossover, crossover

LEVELS = (1.0, 2.0, 4.0, 8.0, 16.0)
TRUE_AT = 6.0  # where the speculative arm stops paying, in the levels' unit


def linear(x: float) -> float:
    """+40 % alone, crossing 1 at 6: linear in log(load)."""
    return math.log(1.4) * (1 - math.log(x) / math.log(TRUE_AT))


def curved(x: float) -> float:
    """The same ends, but the gain holds at light load and falls off fast past ~3 (quadratic in log load)."""
    v = math.log(x) / math.log(TRUE_AT)
    return math.log(1.4) * (1 - v * v)


def batch_cost(x: float) -> float:
    """Linear in the load itself, as the simulator's verify cost grows with the batch: the log ratio bends down
    ever faster on a log axis (no polynomial in log load is exact)."""
    return math.log(1.4) * (1 - x / TRUE_AT)


TRUTHS: dict[str, Callable[[float], float]] = {
    "linear in log(load)": linear,
    "quadratic in log(load)": curved,
    "linear in load": batch_cost,
}


def experiment(
    rng: random.Random, truth: Callable[[float], float], blocks: int, noise: float, args: argparse.Namespace
) -> Crossover:
    shared = [rng.gauss(0, args.block_sd) for _ in range(blocks)]
    ratios = [[math.exp(truth(x) + shared[b] + rng.gauss(0, noise)) for b in range(blocks)] for x in LEVELS]
    return crossover(LEVELS, ratios, interpolants=args.interpolants)


def covers(r: Crossover) -> bool:
    """Whether the answer leaves the true crossover possible: inside the CI (open ends reach past the range)."""
    if r.status in ("pays throughout", "never pays"):
        return False
    return (r.lo is None or r.lo <= TRUE_AT) and (r.hi is None or r.hi >= TRUE_AT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--experiments", type=int, default=400, help="experiments per cell")
    ap.add_argument("--blocks", type=int, nargs="+", default=[3, 5, 8])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.02, 0.05], help="per-level restart noise (log sd)")
    ap.add_argument("--block-sd", type=float, default=0.01, help="a block's shared effect on every level (log sd)")
    ap.add_argument("--interpolants", nargs="+", default=["log", "level"], help="orch's default: both")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a few experiments per cell: that it runs, not its figures")
    args = ap.parse_args()
    n = 5 if args.smoke else args.experiments
    rng = random.Random(args.seed)
    print(
        f"levels {', '.join(f'{x:g}' for x in LEVELS)}; true crossover {TRUE_AT:g}; interpolants "
        f"{' + '.join(args.interpolants)}; {n} experiments per row\n"
    )
    print("| truth | restart noise | blocks | crosses | covers x* | CI open on a side | median CI (x*/lo, hi/x*) |")
    print("|---|---|---|---|---|---|---|")
    for name, truth in TRUTHS.items():
        for noise in args.noise:
            for blocks in args.blocks:
                results = [experiment(rng, truth, blocks, noise, args) for _ in range(n)]
                crossed = [r for r in results if r.status == "crosses"]
                covered = sum(
                    1
                    for r in results
                    if (r.lo is None or r.lo <= TRUE_AT)
                    and (r.hi is None or r.hi >= TRUE_AT)
                    and r.status != "never pays"
                    and r.status != "pays throughout"
                )
                open_side = sum(1 for r in crossed if r.lo is None or r.hi is None)
                lo = statistics.median(TRUE_AT / r.lo for r in crossed if r.lo) if crossed else float("nan")
                hi = statistics.median(r.hi / TRUE_AT for r in crossed if r.hi) if crossed else float("nan")
                print(
                    f"| {name} | {noise:.0%} | {blocks} | {len(crossed) / n:.0%} | {covered / n:.1%} | "
                    f"{open_side / max(len(crossed), 1):.0%} | {lo:.2f}, {hi:.2f} |"
                )


if __name__ == "__main__":
    main()
