"""Over-saturation (client/openloop.oversaturation): a backlog that grows with time stops a run; one that settles,
however large, does not; and a live run against the simulator far past its capacity stops sending, measures what it
sent and says so."""

from __future__ import annotations

import bisect
import json
import math
import random
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.client import openloop
from orchestrator.client.openloop import oversaturation
from tests.conftest import FAST_SIM, free_port


def checks(rate: float, capacity: float, seconds: float, latency: float, seed: int = 7) -> list[tuple[float, int, int]]:
    """(t, due, finished) every CHECK_S for Poisson arrivals at `rate` served first come first served, each taking
    at least `latency` and the server finishing at most `capacity` per second (infinite: every request after
    `latency`)."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while t < seconds:
        t += rng.expovariate(rate)
        arrivals.append(t)
    ends, free = [], 0.0
    for at in arrivals:
        start = max(at, free)
        free = start + (1.0 / capacity if capacity != math.inf else 0.0)
        ends.append(max(start + latency, free))
    ends.sort()
    out = []
    t = openloop.CHECK_S
    while t <= seconds:
        out.append((t, bisect.bisect_right(arrivals, t), bisect.bisect_right(ends, t)))
        t += openloop.CHECK_S
    return out


def stops(history: list[tuple[float, int, int]], latency: float) -> float | None:
    """When a run with these checks would stop (TIMES in a row), or None."""
    streak = 0
    for i in range(len(history)):
        streak = streak + 1 if oversaturation(history[: i + 1], latency) else 0
        if streak >= openloop.TIMES:
            return history[i][0]
    return None


def test_a_backlog_that_grows_is_over_saturated_and_says_how_much() -> None:
    history = checks(rate=30, capacity=20, seconds=12, latency=0.3)
    at = stops(history, 0.3)
    assert at is not None and at < 8  # 1.5x the capacity: stopped within seconds
    why = oversaturation(history, 0.3)
    assert why is not None and why.startswith("over-saturated: from ")
    assert "fell due and the server finished" in why and "the backlog grew from" in why
    assert stops(checks(rate=60, capacity=20, seconds=12, latency=0.3), 0.3) is not None  # 3x: sooner still


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(
    ("rate", "capacity", "latency"),
    [(5.0, math.inf, 1.0), (20.0, math.inf, 1.5), (50.0, math.inf, 1.0), (18.5, 24.0, 1.0), (23.0, 24.0, 1.0)],
)
def test_a_server_that_keeps_up_is_never_stopped(rate: float, capacity: float, latency: float, seed: int) -> None:
    # Kept up: the backlog settles at rate x latency (Little's law), large at 50 req/s x 1 s, but it does not grow,
    # even at 96 % of a queue's capacity; the early latency seen is lower than the settled one (the first requests
    # finish before the load builds up).
    history = checks(rate=rate, capacity=capacity, seconds=30, latency=latency, seed=seed)
    assert stops(history, latency * 0.6) is None


def test_no_judgement_too_early_without_a_latency_or_with_few_requests() -> None:
    history = checks(rate=40, capacity=10, seconds=8, latency=0.3)
    assert oversaturation(history, None) is None  # nothing finished yet
    assert oversaturation(history[:4], 0.3) is None  # 2 s old: younger than MIN_S
    assert oversaturation(history, 5.0) is None  # younger than LATENCIES typical latencies
    slow = checks(rate=3, capacity=1, seconds=8, latency=0.3)
    assert oversaturation(slow, 0.3) is None  # fewer than MIN_DUE requests fell due in the second half
    assert oversaturation([], 0.3) is None


# ---------------------------------------------------------------- live, against the simulator


def test_a_run_far_past_capacity_stops_sending_and_measures_what_it_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # sim-eagle3-fast serves about 15 req/s of 32 tokens (docs/simulator.md); 50 req/s for 12 s is far past it.
    profile = tmp_path / "spec.yaml"
    sim = {**FAST_SIM, "load_s": 0.1, "verify_base_ms": 14.0, "accept_alpha": 0.7}
    profile.write_text(yaml.safe_dump({"extends": "sim-eagle3-fast", "sim": sim, "port": free_port()}))
    args = ["bench", str(profile), "--sim", "--rate", "50", "--duration", "12", "--runs", "1", "--warmup", "0"]
    args += ["--max-tokens", "32", "--stop-oversaturated", "--grace", "2", "--db", str(tmp_path / "r.db")]
    assert main([*args, "--json", "--workdir", str(tmp_path / "w")]) == 0
    doc = json.loads(capsys.readouterr().out)
    run = doc["arms"][0]["runs"][0]
    stopped = run["open_loop"]["stopped"]
    assert 0 < stopped["sent"] < stopped["of"] and stopped["reason"].startswith("over-saturated: from ")
    assert stopped["at_s"] < 12
    assert run["requests"] == stopped["sent"] and run["valid"]  # those sent were measured; none counted as errors
    level = doc["arms"][0]["by_concurrency"][0]["open_loop"]
    assert level["stopped"] == 1 and level["limited"] == "server" and "stopped sending early" in level["reason"]
    assert any("over-saturated" in w for w in doc["warnings"])


def test_without_the_flag_a_run_sends_its_whole_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "spec.yaml"
    sim = {**FAST_SIM, "load_s": 0.1, "verify_base_ms": 14.0, "accept_alpha": 0.7}
    profile.write_text(yaml.safe_dump({"extends": "sim-eagle3-fast", "sim": sim, "port": free_port()}))
    args = ["bench", str(profile), "--sim", "--rate", "80", "--requests", "120", "--runs", "1", "--warmup", "0"]
    args += ["--max-tokens", "32", "--grace", "2", "--db", str(tmp_path / "r.db"), "--workdir", str(tmp_path / "w")]
    assert main([*args, "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["arms"][0]["runs"][0]
    assert run["requests"] == 120 and "stopped" not in run["open_loop"]


def test_the_flag_needs_open_loop_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["ab", "baseline", "sim-eagle3-fast", "--sim", "--stop-oversaturated", "--db", str(tmp_path / "r")]) == 2
    )
    assert "--stop-oversaturated applies to open-loop levels only" in " ".join(capsys.readouterr().err.split())
