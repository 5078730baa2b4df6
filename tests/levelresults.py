"""A/B results built in memory with one tok/s per arm, block and level: the reports' tests of several levels read them
without launching anything."""

from __future__ import annotations

import math
import random

from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult


def level_launch(arm: int, block: int, speeds: dict[int, float]) -> LaunchResult:
    """Arm 0 ("base") or 1 ("spec") in a block: two runs at each concurrency level, at that level's tok/s."""
    runs = tuple(
        RunResult(
            index=i,
            warmup=False,
            tokens=256,
            seconds=256 / v,
            tok_s=v,
            prompt_tokens=20,
            ttft_s=0.02,
            concurrency=c,
            aggregate_tok_s=v * c,
        )
        for c, v in speeds.items()
        for i in range(2)
    )
    return LaunchResult(
        profile="base" if arm == 0 else "spec",
        launch_id=f"L{block}-{arm}",
        runs=runs,
        ready_s=1.0,
        env_report={"ok": True},
        teardown={},
        spec_steps=None,
        block=block,
        position=arm,
        arm_index=arm,
    )


def gain_result(gain_at: dict[int, float], blocks: int = 4, seed: int = 1) -> ABResult:
    """base at 80 tok/s and spec at 80 × gain_at[level] at each level (its keys), with 1 % lognormal launch noise."""
    rng = random.Random(seed)
    launches = []
    for b in range(blocks):
        launches.append(level_launch(0, b, {c: 80.0 * math.exp(rng.gauss(0, 0.01)) for c in gain_at}))
        launches.append(level_launch(1, b, {c: 80.0 * gain_at[c] * math.exp(rng.gauss(0, 0.01)) for c in gain_at}))
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, blocks, "fixed", 1),
    )
