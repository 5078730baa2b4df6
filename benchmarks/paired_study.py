"""Paired vs unpaired within-launch resampling when both arms send the same prompts: coverage, width, verdicts.

Monte Carlo with synthetic launches. Every launch runs the same prompts in the same order (orch's request sequence
is a pure function of the workload, so run i of every launch sends the same request); each prompt has its own
speed (a prompt that the output copies decodes faster under prompt lookup), every launch draws a lognormal speed
factor (restart noise) and every run a lognormal jitter (run noise). For each scenario and number of blocks: how
often the 95 % CI covers the true ratio, its median width, and the verdict shares — once with the runs of the two
launches of a block resampled independently per arm (the interval orch used before), once paired (the same run
positions for both arms, what orch uses when both launches sent the same requests). With 5 or more blocks orch
resamples blocks only and the two coincide, so the study looks at 2 to 4 blocks. Results go into
docs/statistics.md. About two minutes on one core with the defaults:

    python benchmarks/paired_study.py --experiments 400 --seed 1

`--bundle FILE` computes both intervals on a real recording instead (a result bundle of a two-arm A/B, its first
level): the per-run tok/s by run position, the block ratios, and the CI paired and unpaired at the default 4000
resamples, the interval orch reports being the paired one:

    python benchmarks/paired_study.py --bundle docs/examples/llamacpp-lookup-friendly.orch.json
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.results.bundle import result_from_bundle
from orchestrator.results.bundleformat import read_bundle
from orchestrator.results.pairing import paired_blocks
from orchestrator.stats.estimates import ratio_ci, verdict


@dataclass(frozen=True)
class Scenario:
    name: str
    base: tuple[float, ...]  # the baseline's tok/s per prompt, in run order
    effect: tuple[float, ...]  # the arm's speed-up per prompt

    @property
    def true_ratio(self) -> float:
        """What the point estimate estimates: the ratio of the noise-free launch values (medians over the runs)."""
        arm = [b * e for b, e in zip(self.base, self.effect, strict=True)]
        return statistics.median(arm) / statistics.median(self.base)


# Speeds shaped like the README's lookup-friendly prompts on llama.cpp (accept length 6.1 / 3.1 / 1.6 gave about
# 88 / 72 / 47 tok/s with prompt lookup): prompt-to-prompt differences of 20-50 %, far beyond restart noise.
SCENARIOS = (
    Scenario("A/A, alike prompts", (60.0, 60.0, 60.0), (1.0, 1.0, 1.0)),
    Scenario("A/A, heterogeneous prompts", (88.0, 72.0, 47.0), (1.0, 1.0, 1.0)),
    Scenario("+20 %, alike prompts", (60.0, 60.0, 60.0), (1.2, 1.2, 1.2)),
    Scenario("+20 %, heterogeneous prompts", (88.0, 72.0, 47.0), (1.2, 1.2, 1.2)),
    Scenario("+20 % on the median prompt, effect varies by prompt", (60.0, 55.0, 45.0), (1.45, 1.2, 1.0)),
)


def launch(rng: random.Random, speeds: list[float], restart_sd: float, run_sd: float) -> list[float]:
    factor = math.exp(rng.gauss(0.0, restart_sd))
    return [s * factor * math.exp(rng.gauss(0.0, run_sd)) for s in speeds]


def experiment(
    rng: random.Random, sc: Scenario, blocks: int, restart_sd: float, run_sd: float
) -> tuple[list[list[float]], list[list[float]]]:
    arm_speeds = [b * e for b, e in zip(sc.base, sc.effect, strict=True)]
    base = [launch(rng, list(sc.base), restart_sd, run_sd) for _ in range(blocks)]
    arm = [launch(rng, arm_speeds, restart_sd, run_sd) for _ in range(blocks)]
    return base, arm


@dataclass
class Tally:
    covered: int = 0
    widths: list[float] | None = None
    verdicts: dict[str, int] | None = None

    def __post_init__(self) -> None:
        self.widths = []
        self.verdicts = {"faster": 0, "slower": 0, "no difference": 0, "inconclusive": 0}


def cell(rng: random.Random, sc: Scenario, blocks: int, args: argparse.Namespace) -> dict[bool, Tally]:
    tallies = {False: Tally(), True: Tally()}
    truth = sc.true_ratio
    for _ in range(args.experiments):
        base, arm = experiment(rng, sc, blocks, args.restart_sd, args.run_sd)
        seed = rng.randrange(2**31)
        for paired, tally in tallies.items():
            est = ratio_ci(base, arm, n_boot=args.boot, seed=seed, paired=paired)
            tally.covered += est.lo <= truth <= est.hi
            assert tally.widths is not None and tally.verdicts is not None
            tally.widths.append(est.hi / est.lo - 1.0)
            tally.verdicts[verdict(est, args.min_effect)] += 1
    return tallies


def recorded(path: str) -> tuple[list[str], list[list[float]], list[list[float]]]:
    """A bundle's two arms as the study's blocks: each launch's timed tok/s in run order at the first level, paired
    block by block as orch pairs them for its verdict (results/model.paired_blocks)."""
    result = result_from_bundle(read_bundle(path))
    if len(result.arms) != 2:
        sys.exit(f"{path}: a two-arm A/B is needed ({len(result.arms)} arms)")
    base, arm = result.arms
    values, _ = paired_blocks(base, arm, result.levels[0], ("tok_s",))
    return [base.label or base.profile, arm.label or arm.profile], *values["tok_s"]


def on_bundle(path: str, min_effect: float, seed: int) -> None:
    names, base, arm = recorded(path)
    print(f"{path}: {names[1]} vs {names[0]}, {len(base)} blocks, tok/s per run (run i sent prompt i)")
    print()
    print(
        "| block | "
        + " | ".join(f"{names[0]} run {i + 1}" for i in range(len(base[0])))
        + " | "
        + " | ".join(f"{names[1]} run {i + 1}" for i in range(len(arm[0])))
        + " |"
    )
    print("|---" * (1 + len(base[0]) + len(arm[0])) + "|")
    for k, (b, a) in enumerate(zip(base, arm, strict=True)):
        print(f"| {k + 1} | " + " | ".join(f"{v:.1f}" for v in b + a) + " |")
    print()
    block_ratios = ", ".join(
        f"{statistics.median(a) / statistics.median(b):.3f}" for b, a in zip(base, arm, strict=True)
    )
    print(f"block ratios (median run over median run): {block_ratios}")
    for paired in (True, False):
        est = ratio_ci(base, arm, seed=seed, paired=paired)
        print(
            f"{'paired' if paired else 'unpaired'}: {est.ratio:.3f}x, 95% CI [{est.lo:.3f}, {est.hi:.3f}] "
            f"(width {pct(est.hi / est.lo - 1.0)}) -> {verdict(est, min_effect)}"
        )


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--experiments", type=int, default=400, help="experiments per cell")
    ap.add_argument("--blocks", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--restart-sd", type=float, default=0.03, help="launch-to-launch noise (log sd)")
    ap.add_argument("--run-sd", type=float, default=0.02, help="run-to-run noise within a launch (log sd)")
    ap.add_argument("--min-effect", type=float, default=0.02)
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples per CI (orch uses 4000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a few experiments per cell: that it runs, not its figures")
    ap.add_argument("--bundle", metavar="FILE", help="both intervals on a recorded two-arm A/B instead of the study")
    args = ap.parse_args()
    if args.bundle:
        on_bundle(args.bundle, args.min_effect, args.seed)
        return
    if args.smoke:
        args.experiments, args.blocks, args.boot = 3, [3], 100
    rng = random.Random(args.seed)
    print(
        f"{args.experiments} experiments per cell; restart noise {pct(args.restart_sd)}, run noise "
        f"{pct(args.run_sd)}, 3 prompts = 3 runs per launch, minimum effect {pct(args.min_effect)}, "
        f"{args.boot} bootstrap resamples, seed {args.seed}"
    )
    print()
    print(
        "| scenario | blocks | true ratio | CI | coverage | median width | faster | slower | no difference "
        "| inconclusive |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sc in SCENARIOS:
        for blocks in args.blocks:
            tallies = cell(rng, sc, blocks, args)
            for paired, t in tallies.items():
                assert t.widths is not None and t.verdicts is not None
                n = args.experiments
                v = {k: pct(c / n) for k, c in t.verdicts.items()}
                print(
                    f"| {sc.name} | {blocks} | {sc.true_ratio:.3f} | {'paired' if paired else 'unpaired'} "
                    f"| {pct(t.covered / n)} | {pct(statistics.median(t.widths))} | {v['faster']} | {v['slower']} "
                    f"| {v['no difference']} | {v['inconclusive']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
