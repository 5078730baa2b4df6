"""How often orch's launch-level verdict is wrong (A/A) and how often it finds a real effect (power).

Monte Carlo with synthetic launches whose noise is the simulator's: each launch draws a lognormal speed factor
(sigma = restart noise, default 1 %, the simulator's launch_noise) and each run a small jitter (0.2 %). For each
number of blocks: the share of A/A experiments that end in `faster`/`slower` (false verdicts), and the share of
experiments with a true +3 % / +5 % effect that end in `faster` (power). With --auto: `--blocks auto` instead (a
look after every block from the minimum, stopping once the verdict is decided), at 1 % and 3 % restart noise: the
verdict shares and the mean number of blocks for 0 %, 3 %, 5 % and 25 % effects. Results go into
docs/statistics.md.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.stats.estimates import ratio_ci, verdict
from orchestrator.stats.sequential import SequentialPlan


def experiment(
    rng: random.Random, blocks: int, effect: float, restart_sd: float, run_sd: float, runs: int
) -> tuple[list[list[float]], list[list[float]]]:
    def launch(mean: float) -> list[float]:
        factor = math.exp(rng.gauss(0.0, restart_sd))
        return [mean * factor * math.exp(rng.gauss(0.0, run_sd)) for _ in range(runs)]

    return [launch(82.0) for _ in range(blocks)], [launch(82.0 * (1 + effect)) for _ in range(blocks)]


def shares(rng: random.Random, blocks: int, effect: float, args: argparse.Namespace) -> dict[str, float]:
    counts = {"faster": 0, "slower": 0, "no difference": 0, "inconclusive": 0}
    for _ in range(args.experiments):
        base, arm = experiment(rng, blocks, effect, args.restart_sd, args.run_sd, args.runs)
        counts[verdict(ratio_ci(base, arm, n_boot=args.boot, seed=rng.randrange(2**31)), args.min_effect)] += 1
    return {k: v / args.experiments for k, v in counts.items()}


def auto_run(
    rng: random.Random, effect: float, plan: SequentialPlan, args: argparse.Namespace, restart_sd: float
) -> tuple[str, int]:
    """One `--blocks auto` experiment: the verdict it ends with and the blocks it used (what orch's comparisons do
    at each look: a repeated CI at the look's nominal level, then the fixed design's verdict rule on it)."""
    base, arm = experiment(rng, plan.max_blocks, effect, restart_sd, args.run_sd, args.runs)
    seed = rng.randrange(2**31)
    for n in plan.looks:
        est = ratio_ci(
            base[:n], arm[:n], n_boot=args.boot, seed=seed, alpha=plan.nominal_alpha(n), t_crit=plan.t_crit(n)
        )
        v = verdict(est, args.min_effect)
        if v != "inconclusive" or n == plan.max_blocks:
            return v, n
    raise AssertionError("unreachable")


def auto_table(args: argparse.Namespace) -> None:
    plan = SequentialPlan(max_blocks=args.max_blocks, spending=args.spending)
    print(
        f"--blocks auto ({plan.min_blocks} to {plan.max_blocks} blocks, {plan.spending} spending); "
        f"{args.aa_experiments} A/A and {args.experiments} other experiments per row; run noise {args.run_sd:.1%}, "
        f"{args.runs} runs per launch, minimum effect {args.min_effect:.0%}, {args.boot} bootstrap resamples\n"
    )
    print("| restart noise | true effect | faster | slower | no difference | inconclusive | mean blocks | at max |")
    print("|---|---|---|---|---|---|---|---|")
    rng = random.Random(args.seed)
    for noise in (float(x) for x in args.noises.split(",")):
        for effect in (float(x) for x in args.effects.split(",")):
            runs = args.aa_experiments if effect == 0 else args.experiments
            counts = {"faster": 0, "slower": 0, "no difference": 0, "inconclusive": 0}
            blocks = at_max = 0
            for _ in range(runs):
                v, n = auto_run(rng, effect, plan, args, noise)
                counts[v] += 1
                blocks += n
                at_max += n == plan.max_blocks
            share = {k: f"{v / runs:.1%}" for k, v in counts.items()}
            print(
                f"| {noise:.0%} | {effect:+.0%} | {share['faster']} | {share['slower']} | {share['no difference']} | "
                f"{share['inconclusive']} | {blocks / runs:.2f} | {at_max / runs:.0%} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--experiments", type=int, default=200)
    ap.add_argument("--boot", type=int, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--restart-sd", type=float, default=0.01)
    ap.add_argument("--run-sd", type=float, default=0.002)
    ap.add_argument("--min-effect", type=float, default=0.02)
    ap.add_argument("--blocks", default="2,3,5,8,12")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--auto", action="store_true", help="study --blocks auto instead of fixed numbers of blocks")
    ap.add_argument("--aa-experiments", type=int, default=6000, help="with --auto: A/A experiments per noise level")
    ap.add_argument("--max-blocks", type=int, default=8)
    ap.add_argument("--spending", default="pocock", choices=("pocock", "obf"))
    ap.add_argument("--noises", default="0.01,0.03")
    ap.add_argument("--effects", default="0,0.03,0.05,0.25")
    ap.add_argument("--smoke", action="store_true", help="both tables (fixed and --auto) at toy sizes, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.experiments, args.aa_experiments, args.boot, args.blocks = 3, 3, 50, "2,3"
        args.noises, args.effects = "0.01", "0,0.25"
        auto_table(args)
        print()
    elif args.auto:
        auto_table(args)
        return
    rng = random.Random(args.seed)
    print(
        f"{args.experiments} experiments per cell; restart noise {args.restart_sd:.1%}, run noise "
        f"{args.run_sd:.1%}, {args.runs} runs per launch, minimum effect {args.min_effect:.0%}, "
        f"{args.boot} bootstrap resamples\n"
    )
    print("| blocks | A/A faster or slower (false) | A/A no difference | A/A inconclusive | power +3 % | power +5 % |")
    print("|---|---|---|---|---|---|")
    for blocks in (int(b) for b in args.blocks.split(",")):
        aa = shares(rng, blocks, 0.0, args)
        p3 = shares(rng, blocks, 0.03, args)["faster"]
        p5 = shares(rng, blocks, 0.05, args)["faster"]
        print(
            f"| {blocks} | {aa['faster'] + aa['slower']:.1%} | {aa['no difference']:.1%} | "
            f"{aa['inconclusive']:.1%} | {p3:.1%} | {p5:.1%} |"
        )


if __name__ == "__main__":
    main()
