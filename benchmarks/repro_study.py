"""How often orch's reproduction verdict is wrong, and how often it catches a real change.

Monte Carlo with synthetic sessions whose noise is the simulator's: each launch draws a lognormal speed factor (the
restart noise, 1 % or 2 %) and each run a small jitter (0.2 %). A "recorded" session and a "new" session of one arm,
each with N launches, go through stats_repro.arm_estimate and reproduction_verdict at a ±3 % tolerance. With the
same true speed any `not reproduced` is false; with a true 6 % change `not reproduced` is the right answer (power).
Results go into docs/statistics.md ("Reproduction verdicts").
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.stats.reproduction import arm_estimate, reproduction_verdict


def session(rng: random.Random, launches: int, mean: float, restart_sd: float, run_sd: float, runs: int) -> list:
    out = []
    for _ in range(launches):
        factor = math.exp(rng.gauss(0.0, restart_sd))
        out.append([mean * factor * math.exp(rng.gauss(0.0, run_sd)) for _ in range(runs)])
    return out


def shares(rng: random.Random, blocks: int, effect: float, restart_sd: float, args: argparse.Namespace) -> dict:
    counts = {"reproduced": 0, "not reproduced": 0, "inconclusive": 0}
    for _ in range(args.trials):
        rec = arm_estimate(session(rng, blocks, 82.0, restart_sd, args.run_sd, args.runs), n_boot=args.boot)
        new_runs = session(rng, blocks, 82.0 * (1 + effect), restart_sd, args.run_sd, args.runs)
        new = arm_estimate(new_runs, n_boot=args.boot, seed=rng.randrange(2**31))
        counts[reproduction_verdict(82.0 if args.claim else rec, new, args.tolerance).status] += 1
    return {k: v / args.trials for k, v in counts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--boot", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--run-sd", type=float, default=0.002)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--blocks", default="2,3,5,8")
    ap.add_argument("--noise", default="0.01,0.02")
    ap.add_argument("--claim", action="store_true", help="the recorded side is an exact claim (82.0, no CI)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="3 trials per cell, 50 resamples: every step, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.trials, args.boot, args.blocks, args.noise = 3, 50, "2,3", "0.01"
    rng = random.Random(args.seed)
    print(
        f"{args.trials} trials per cell; run noise {args.run_sd:.1%}, {args.runs} runs per launch, tolerance "
        f"±{args.tolerance:.0%}, {args.boot} bootstrap resamples; recorded side: "
        + ("an exact claim\n" if args.claim else "a session like the new one\n")
    )
    print(
        "| restart noise | blocks | same: reproduced | same: not reproduced (false) | same: inconclusive "
        "| +6 %: not reproduced (power) | +6 %: reproduced (false) |"
    )
    print("|---|---|---|---|---|---|---|")
    for noise in (float(x) for x in args.noise.split(",")):
        for blocks in (int(b) for b in args.blocks.split(",")):
            same = shares(rng, blocks, 0.0, noise, args)
            real = shares(rng, blocks, 0.06, noise, args)
            print(
                f"| {noise:.0%} | {blocks} | {same['reproduced']:.1%} | {same['not reproduced']:.1%} "
                f"| {same['inconclusive']:.1%} | {real['not reproduced']:.1%} | {real['reproduced']:.1%} |"
            )


if __name__ == "__main__":
    main()
