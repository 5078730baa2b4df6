"""Paired CIs when both arms send the same requests, the noisy-host warning, and the plan's time for a real engine."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.plan import assumed_speed, claimed_speed, plan
from orchestrator.config.workload import BenchConfig
from orchestrator.launch import fingerprint
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.stats.estimates import arm_spread, noisy_host, ratio_ci, verdict
from tests.conftest import run_orch

# The README's lookup-friendly prompts on llama.cpp: prompt lookup gave about 88 / 72 / 47 tok/s on its three
# prompts (accept length 6.1 / 3.1 / 1.6). Run i of every launch sends prompt i.
PROMPTS = (88.0, 72.0, 47.0)


def _experiment(
    rng: random.Random, blocks: int, effect: float, restart_sd: float = 0.03, run_sd: float = 0.02
) -> tuple[list[list[float]], list[list[float]]]:
    def launch(scale: float) -> list[float]:
        factor = math.exp(rng.gauss(0.0, restart_sd))
        return [p * scale * factor * math.exp(rng.gauss(0.0, run_sd)) for p in PROMPTS]

    return [launch(1.0) for _ in range(blocks)], [launch(effect) for _ in range(blocks)]


def test_paired_interval_on_heterogeneous_prompts_is_narrower_and_still_covers() -> None:
    base, arm = _experiment(random.Random(5), blocks=3, effect=1.2)
    unpaired = ratio_ci(base, arm, n_boot=2000)
    paired = ratio_ci(base, arm, n_boot=2000, paired=True)
    assert paired.ratio == unpaired.ratio  # pairing changes the interval, never the estimate
    assert paired.lo <= 1.2 <= paired.hi
    # Drawn independently, one arm's fastest prompt against the other's slowest reads as noise: 88/47 = 1.9x.
    assert paired.hi / paired.lo - 1 < (unpaired.hi / unpaired.lo - 1) / 3
    assert verdict(paired) == "faster" and verdict(unpaired) == "inconclusive"
    assert "paired" in paired.method and "independently per arm" in unpaired.method


def test_aa_on_heterogeneous_prompts_rarely_decides_when_paired() -> None:
    rng = random.Random(7)
    wrong = 0
    for _ in range(60):
        base, arm = _experiment(rng, blocks=3, effect=1.0)
        wrong += verdict(ratio_ci(base, arm, n_boot=300, seed=rng.randrange(2**31), paired=True)) != "inconclusive"
    assert wrong <= 3  # 5 % of 60


def test_paired_needs_as_many_runs_in_both_launches() -> None:
    with pytest.raises(ValueError, match="same number of runs"):
        ratio_ci([[1.0, 2.0], [1.0, 2.0]], [[1.0], [1.0, 2.0]], paired=True)


# ------------------------------------------------------------------ which interval an experiment gets


def _run(i: int, tok_s: float) -> RunResult:
    return RunResult(
        index=i,
        warmup=False,
        tokens=128,
        seconds=128 / tok_s,
        tok_s=tok_s,
        prompt_tokens=30,
        ttft_s=0.02,
        aggregate_tok_s=tok_s,
    )


def _launch(
    arm: int, block: int, values: list[float], digest: str | None, key: str = fingerprint.WORKLOAD_KEY
) -> LaunchResult:
    return LaunchResult(
        profile="baseline" if arm == 0 else "candidate",
        launch_id=f"L{block}-{arm}",
        runs=tuple(_run(i, v) for i, v in enumerate(values)),
        ready_s=1.0,
        env_report={"ok": True},
        teardown={},
        block=block,
        position=arm,
        arm_index=arm,
        fingerprint={key: digest} if digest else None,
    )


def _result(launches: list[LaunchResult], blocks: int) -> ABResult:
    design = Design.make(2, blocks, "fixed", 0)
    return ABResult(
        experiment_id="e",
        simulated=False,
        host="h",
        profiles=("baseline", "candidate"),
        launches=tuple(launches),
        host_facts={},
        design=design,
    )


def _heterogeneous(
    digests: tuple[str | None, str | None] = ("w1", "w1"), key: str = fingerprint.WORKLOAD_KEY
) -> list[LaunchResult]:
    base, arm = _experiment(random.Random(5), blocks=3, effect=1.2)
    return [
        launch
        for b in range(3)
        for launch in (_launch(0, b, base[b], digests[0], key), _launch(1, b, arm[b], digests[1], key))
    ]


def test_an_experiment_pairs_only_launches_that_sent_the_same_requests() -> None:
    (same,) = _result(_heterogeneous(), 3).comparisons
    assert same.estimate is not None and "paired" in same.estimate.method and same.verdict == "faster"
    # Launches stored before the workload digest left out the prompt file's path carry the older field.
    (legacy,) = _result(_heterogeneous(key=fingerprint.LEGACY_WORKLOAD_KEY), 3).comparisons
    assert legacy.estimate is not None and "paired" in legacy.estimate.method
    for digests in (("w1", "w2"), (None, None), ("w1", None)):
        (other,) = _result(_heterogeneous(digests), 3).comparisons
        assert other.estimate is not None and "independently per arm" in other.estimate.method
        assert other.ratio == same.ratio
    # A run invalid in only one arm breaks the run-by-run correspondence of that block.
    launches = _heterogeneous()
    broken = launches[1]
    launches[1] = LaunchResult(**{**broken.__dict__, "runs": broken.runs[:2]})
    (lost,) = _result(launches, 3).comparisons
    assert lost.estimate is not None and "independently per arm" in lost.estimate.method


def test_the_report_says_which_interval_was_used() -> None:
    result = _result(_heterogeneous(), 3)
    assert "    CI: bootstrap over blocks + runs within launches, paired" in ab_text(result)
    assert "- CI: bootstrap over blocks + runs within launches, paired" in ab_markdown(result)
    (c,) = ab_json(result)["comparisons"]
    assert "paired" in c["ci_method"]


# ------------------------------------------------------------------ a noisy host


def test_noisy_host_thresholds() -> None:
    # The busy box of the issue: the baseline swung 2.2-52 tok/s across launches while runs agreed.
    assert noisy_host(arm_spread([[2.2, 2.3, 2.2], [52.0, 51.5, 52.4], [30.0, 30.2, 29.9]]))
    assert not noisy_host(arm_spread([[41.8, 42.0], [44.5, 44.0], [40.1, 40.5]]))  # ~5 %: ordinary restart noise
    # Launches 12 % apart while runs agree to 0.5 %: far more than run-to-run noise.
    assert noisy_host(arm_spread([[60.0, 60.3], [75.0, 75.2], [66.0, 65.8]]))
    # Heterogeneous prompts make the runs of a launch differ a lot: 12 % across is then not beyond them ...
    assert not noisy_host(arm_spread([[88.0, 72.0, 47.0], [99.0, 81.0, 53.0], [80.0, 64.0, 42.0]]))
    # ... but 30 % across is too much whatever the runs do.
    assert noisy_host(arm_spread([[88.0, 72.0, 47.0], [130.0, 110.0, 70.0], [60.0, 48.0, 31.0]]))
    assert not noisy_host(arm_spread([[2.0], [50.0]][:1]))  # one launch: nothing to compare


def test_the_report_warns_about_a_noisy_host_with_numbers_and_what_to_do() -> None:
    values = [([2.2, 2.3, 2.2], [3.0, 3.1, 3.0]), ([52.0, 51.5, 52.4], [60.0, 61.0, 60.5]), ([30.0] * 3, [36.0] * 3)]
    launches = [la for b, (x, y) in enumerate(values) for la in (_launch(0, b, x, "w"), _launch(1, b, y, "w"))]
    result = _result(launches, 3)
    text = "\n".join(result.warnings())
    assert "noisy host: baseline: its 3 launches ranged 2.2-52.0 tok/s" in text
    assert "(CV 89% across launches, 1.6% between runs within a launch)" in text
    assert "quiet the host" in text and "more blocks" in text
    assert "noisy host: candidate" in text
    assert "WARNING: noisy host: baseline" in ab_text(result)
    doc: dict[str, Any] = ab_json(result)
    assert any(w.startswith("noisy host: baseline") for w in doc["warnings"])
    quiet = [([42.0, 42.1, 41.9], [50.0, 50.1, 50.2]), ([43.0, 43.1, 43.0], [51.0] * 3), ([41.5] * 3, [49.8] * 3)]
    calm = [la for b, (x, y) in enumerate(quiet) for la in (_launch(0, b, x, "w"), _launch(1, b, y, "w"))]
    assert not [w for w in _result(calm, 3).warnings() if "noisy host" in w]


# ------------------------------------------------------------------ the plan's time for a real engine


def test_the_plan_does_not_give_a_real_engine_a_useless_lower_bound() -> None:
    # The README's llama.cpp command: 2 arms x 3 blocks, 3 runs of 128 tokens (+2 warmups of 64) per launch.
    config = BenchConfig(runs=3, warmup=2, max_tokens=128)
    work = plan(config, [assumed_speed()] * 2, blocks=3, calibrated=False)
    line = work.line()
    assert work.stream_tokens == 6 * (2 * 64 + 3 * 128)
    assert "at least" not in line and "unknown for this engine until it runs" in line
    assert "3072 output tokens decoded one after another per stream" in line
    assert "about 2 min at 30 tok/s per stream, 10s at 300" in line and "plus loading the server" in line
    claimed = plan(config, [claimed_speed(40.0)] * 2, blocks=3, calibrated=False, claimed=True)
    assert claimed.line().endswith(
        "time about 77s (at each profile's expect.tok_s per stream; server loading not counted)"
    )
    least = plan(config, [assumed_speed()] * 2, blocks=2, calibrated=False)
    assert "2048 to 3072 output tokens" in work.line(least) and "68s to 2 min at 30 tok/s" in work.line(least)


def test_a_simulated_ab_is_paired_end_to_end(sim_profiles: Any, tmp_path: Path) -> None:
    """Both arms of a real (simulated) A/B send the same requests, and the launches' fingerprints say so: the
    interval is the paired one. Guards the link between what a launch records and what the statistics read."""
    sim_profiles()
    proc = run_orch(
        "ab", "baseline", "eagle3", "--sim", "--blocks", "2", "--runs", "2", "--warmup", "0",
        "--max-tokens", "40", "--grace", "2", "--min-run-s", "0", "--json", "--db", str(tmp_path / "r.db"),
        cwd=tmp_path,
    )  # fmt: skip
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (c,) = json.loads(out)["comparisons"]
    assert "paired" in c["ci_method"] and "independently" not in c["ci_method"], c["ci_method"]
