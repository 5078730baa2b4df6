"""How often a family of per-category verdicts says something false when nothing differs: uncorrected, and with
Holm's step-down as orch applies it.

Monte Carlo A/A: two arms of the same speed, B blocks of one launch each, C prompt categories, a few runs per launch.
The noise is the shape a real A/B has: each launch draws a lognormal restart factor shared by all its categories
(a slow launch is slow on every prompt), each run a prompt effect shared by both arms' launches in the block (run i of
both sent the same prompts), and each (launch, run, category) its own noise (few requests of a category per run).
Each category's paired runs go through the functions `results/categories` uses for its verdicts: `ratio_ci` (the
bootstrap over blocks and runs with the Student-t floor), `bounded`, `verdict`, and for the family `stats/family.holm`
stepping down on `excludes_one`. Any `faster` or `slower` is false; a trial with one or more is a family-wise false
verdict. Results go into docs/statistics.md ("Families of verdicts").
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.stats.estimates import RatioEstimate, bounded, ratio_ci, verdict
from orchestrator.stats.family import FAMILY_ALPHA, excludes_one, holm, t_crit

Runs = list[list[float]]


def category_runs(
    rng: random.Random, categories: int, blocks: int, runs: int, restart_sd: float, noise_sd: float
) -> list[tuple[Runs, Runs]]:
    """Per category, the (baseline, arm) run values of every block: the same true speed on both sides."""
    speeds = [60.0 * math.exp(rng.gauss(0.0, 0.3)) for _ in range(categories)]
    out: list[tuple[Runs, Runs]] = [([], []) for _ in range(categories)]
    for _ in range(blocks):
        launch = [math.exp(rng.gauss(0.0, restart_sd)) for _ in range(2)]
        prompts = [[math.exp(rng.gauss(0.0, noise_sd)) for _ in range(runs)] for _ in range(categories)]
        for c in range(categories):
            for side in range(2):
                values = [
                    speeds[c] * launch[side] * prompts[c][r] * math.exp(rng.gauss(0.0, noise_sd)) for r in range(runs)
                ]
                out[c][side].append(values)
    return out


def judged(est: RatioEstimate, min_effect: float) -> str:
    """A category's verdict as results/categories gives it: none from an interval too wide to print."""
    return verdict(est, min_effect) if bounded(est) else "inconclusive"


def trial(rng: random.Random, categories: int, blocks: int, args: argparse.Namespace) -> tuple[bool, bool]:
    """One A/A experiment: whether any category's verdict was false, uncorrected and with Holm."""
    data = category_runs(rng, categories, blocks, args.runs, args.restart, args.noise)
    seed = rng.randrange(2**31)

    def member(base: Runs, arm: Runs):  # type: ignore[no-untyped-def]
        def at(alpha: float) -> RatioEstimate:
            crit = None if alpha == FAMILY_ALPHA else t_crit(alpha, blocks - 1)
            return ratio_ci(base, arm, n_boot=args.boot, seed=seed, paired=True, alpha=alpha, t_crit=crit)

        return at

    members = [member(base, arm) for base, arm in data]
    plain = [judged(m(FAMILY_ALPHA), args.min_effect) for m in members]
    stepped = [judged(est, args.min_effect) for est, _ in holm(members, lambda e: bounded(e) and excludes_one(e))]
    false = ("faster", "slower")
    return any(v in false for v in plain), any(v in false for v in stepped)


def rates(categories: int, blocks: int, args: argparse.Namespace, seed: int) -> tuple[float, float]:
    """The family-wise false-verdict rate of one cell, uncorrected and with Holm (a seed of its own per cell)."""
    rng = random.Random(seed)
    found = [trial(rng, categories, blocks, args) for _ in range(args.trials)]
    return sum(u for u, _ in found) / args.trials, sum(h for _, h in found) / args.trials


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--boot", type=int, default=200, help="bootstrap resamples per interval")
    ap.add_argument("--runs", type=int, default=3, help="runs per launch")
    ap.add_argument("--restart", type=float, default=0.02, help="restart noise (lognormal sd of a launch's factor)")
    ap.add_argument("--noise", type=float, default=0.05, help="per-category noise of a run (lognormal sd)")
    ap.add_argument("--min-effect", type=float, default=0.02)
    ap.add_argument("--categories", default="2,4,8")
    ap.add_argument("--blocks", default="3,5,10")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="5 trials per cell, 50 resamples: every step, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.trials, args.boot, args.categories, args.blocks = 5, 50, "2,8", "3"
    print(
        f"{args.trials} A/A experiments per cell; restart noise {args.restart:.0%} per launch (shared by its "
        f"categories), per-category run noise {args.noise:.0%}, {args.runs} runs per launch, minimum effect "
        f"{args.min_effect:.0%}, {args.boot} bootstrap resamples, seed {args.seed}\n"
    )
    print("| categories | blocks | any false verdict, uncorrected | any false verdict, Holm |")
    print("|---|---|---|---|")
    for i, categories in enumerate(int(c) for c in args.categories.split(",")):
        for j, blocks in enumerate(int(b) for b in args.blocks.split(",")):
            plain, stepped = rates(categories, blocks, args, args.seed * 1000 + 10 * i + j)
            print(f"| {categories} | {blocks} | {plain:.1%} | {stepped:.1%} |")


if __name__ == "__main__":
    main()
