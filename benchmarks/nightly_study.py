"""How often the nightly regression detector pages on noise, how fast it finds a real step, and environment steps.

Monte Carlo with synthetic nightly series: each night's value is 100 × level × exp(N(0, noise)), independent from
night to night (default 1 % noise), assessed night by night exactly as `orch nightly` does (every prefix, tonight
last). Rows: the threshold (2 %, and 3 %), with and without a confirmation re-run (when tonight looks like a
regression the runner measures once more and reports only if the history with the second value also says
regression; the second value is the one kept). Columns:
- false alarms: nights called "regression" per 100 nights of pure noise (20 warm-up nights, then 100 scored), with a
  95 % interval over trials;
- a 3 % / 5 % drop from night k on (k uniform in 10..40, so histories are short as well as long): the share of trials
  flagged on night k, by k+1 (= within 2 nights), by k+2, and within 10 nights;
- an environment step (a 4 % / 10 % drop together with a new environment key at night k, 30 nights from k on): the
  share of trials where night k says "environment", where any night from k on says "regression" (noise in the new
  environment, a false alarm like any other), the regressions per 100 nights that can have one (the new environment's
  false-alarm rate), and the share where a regression starts at the environment night (the environment step itself
  mistaken for a regression: must be 0).
Results go into docs/nightly.md.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.nightly import changepoint
from orchestrator.nightly.changepoint import Assessment, Night, assess_each

Scenario = Callable[[int], tuple[float, str]]  # night -> (level, environment key)


def step_at(k: int, drop: float, *, new_env: bool) -> Scenario:
    """The level × (1 − drop) from night k on, with a new environment key from night k on when new_env."""
    return lambda i: (1.0 - drop, "new" if new_env else "old") if i >= k else (1.0, "old")


def nightly(
    rng: random.Random, scenario: Scenario, nights: int, args: argparse.Namespace, threshold: float, confirm: bool
) -> list[Assessment]:
    """What the runner said each night."""

    def draw(i: int) -> Night:
        level, env = scenario(i)
        return Night(100.0 * level * math.exp(rng.gauss(0.0, args.noise)), env)

    history = [draw(i) for i in range(nights)]
    if not confirm:
        return assess_each(history, threshold=threshold, min_history=args.min_history)
    # Only a night that looks like a regression is measured again; the second value replaces tonight's, and the
    # night is a regression only if the history with it says so too. The segmentation cache (what assess_each shares
    # between nights) loses the entries that held the first value.
    out = []
    cache: dict[tuple[int, int], Any] = {}
    for i in range(nights):
        said = changepoint.assess_cached(history[: i + 1], threshold, True, args.min_history, cache)
        if said.status == "regression":
            history[i] = draw(i)
            for key in [key for key in cache if key[1] > i]:
                del cache[key]
            said = changepoint.assess_cached(history[: i + 1], threshold, True, args.min_history, cache)
        out.append(said)
    return out


def false_alarms(rng: random.Random, args: argparse.Namespace, threshold: float, confirm: bool) -> tuple[float, float]:
    """Regressions per 100 scored nights of pure noise: mean and the half-width of a 95 % interval over trials."""
    per_trial = []
    for _ in range(args.trials):
        said = nightly(rng, lambda i: (1.0, "a"), args.warmup + args.scored, args, threshold, confirm)
        per_trial.append(100.0 * sum(a.status == "regression" for a in said[args.warmup :]) / args.scored)
    return statistics.fmean(per_trial), 1.96 * statistics.stdev(per_trial) / math.sqrt(len(per_trial))


def step_found(
    rng: random.Random, args: argparse.Namespace, drop: float, threshold: float, confirm: bool
) -> list[float]:
    """Shares of trials whose step (× (1 − drop) from night k on) is flagged on night k, by k+1, by k+2, by k+9."""
    hits = [0, 0, 0, 0]
    for _ in range(args.trials):
        k = rng.randint(10, 40)
        said = nightly(rng, step_at(k, drop, new_env=False), k + 10, args, threshold, confirm)
        flagged = [a.status == "regression" for a in said[k:]]
        for j, last in enumerate((1, 2, 3, 10)):
            hits[j] += any(flagged[:last])
    return [h / args.trials for h in hits]


def environment_step(
    rng: random.Random, args: argparse.Namespace, drop: float, threshold: float, confirm: bool
) -> list[float]:
    """Night k says "environment" (share of trials); some night from k on says "regression" (share of trials);
    regressions per 100 nights that can have one (from k + min_history on: a noise rate, to compare with the false
    alarms); a regression that starts at the environment night itself (share of trials: the step mistaken)."""
    env = any_regression = regressions = at_step = 0
    for _ in range(args.trials):
        k = rng.randint(10, 40)
        said = nightly(rng, step_at(k, drop, new_env=True), k + args.after_env, args, threshold, confirm)
        found = [a for a in said[k:] if a.status == "regression"]
        env += said[k].status == "environment"
        any_regression += bool(found)
        regressions += len(found)
        at_step += any(a.new is not None and a.new.index <= k for a in found)
    eligible = args.trials * (args.after_env - args.min_history)
    return [env / args.trials, any_regression / args.trials, 100.0 * regressions / eligible, at_step / args.trials]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--thresholds", default="0.02,0.03")
    ap.add_argument("--min-history", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--scored", type=int, default=100)
    ap.add_argument("--after-env", type=int, default=30, help="nights scored from an environment step on")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="2 trials per cell, short series: every step, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.trials, args.warmup, args.scored, args.after_env = 2, 10, 10, 8
    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(
        f"{args.trials} trials per cell; night-to-night noise {args.noise:.1%} (lognormal); min_history "
        f"{args.min_history}; detector: PELT penalty {changepoint.BETA:g}·σ², z ≥ {changepoint.Z_ONE:g} for one "
        f"night alone, ≥ {changepoint.Z_MIN:g} for longer segments; not news if one within "
        f"±{changepoint.MATCH_NIGHTS} nights was retained on one of the last {changepoint.LOOKBACK} nights\n"
    )
    print(
        "| threshold | confirmation re-run | false alarms / 100 nights | 3 % step: on the night | within 2 nights "
        "| within 3 | within 10 | 5 % step: on the night | within 2 nights |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    env_rows = []
    for threshold in (float(t) for t in args.thresholds.split(",")):
        for confirm in (False, True):
            fa, half = false_alarms(rng, args, threshold, confirm)
            s3 = step_found(rng, args, 0.03, threshold, confirm)
            s5 = step_found(rng, args, 0.05, threshold, confirm)
            print(
                f"| {threshold:.0%} | {'yes' if confirm else 'no'} | {fa:.2f} ± {half:.2f} | {s3[0]:.1%} | "
                f"{s3[1]:.1%} | {s3[2]:.1%} | {s3[3]:.1%} | {s5[0]:.1%} | {s5[1]:.1%} |",
                flush=True,
            )
            for drop in (0.04, 0.10):
                env_rows.append((threshold, confirm, drop, environment_step(rng, args, drop, threshold, confirm)))
    print(
        f"\n| threshold | confirmation re-run | environment step | night k says environment | any regression, nights "
        f"k..k+{args.after_env - 1} | regressions / 100 nights after the building ones | a regression at the "
        "environment night |"
    )
    print("|---|---|---|---|---|---|---|")
    for threshold, confirm, drop, (env, any_reg, rate, at_step) in env_rows:
        print(
            f"| {threshold:.0%} | {'yes' if confirm else 'no'} | −{drop:.0%} | {env:.1%} | {any_reg:.1%} "
            f"| {rate:.2f} | {at_step:.1%} |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
