"""The load plots' numbers (results/curves and the pure helpers under them) on hand-made launches with known values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.config.slo import parse_slo
from orchestrator.results import curves
from orchestrator.results.load import stored_launches
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import Rate, RunResult
from orchestrator.results.store import Store
from orchestrator.stats.estimates import interpolate_log, launch_mean, pareto_front, t_975


def test_launch_mean_is_geometric_with_t_on_the_logs_and_arithmetic_where_a_value_is_zero() -> None:
    m = launch_mean([2.0, 8.0])
    assert m.value == pytest.approx(4.0) and m.method == "geometric" and m.launches == 2
    half = t_975(1) * (math.log(8) - math.log(2)) / math.sqrt(2) / math.sqrt(2)  # t * sd(logs) / sqrt(n)
    assert m.lo == pytest.approx(4.0 * math.exp(-half)) and m.hi == pytest.approx(4.0 * math.exp(half))
    one = launch_mean([5.0])
    assert (one.value, one.lo, one.hi) == (5.0, None, None)
    zero = launch_mean([0.0, 2.0])
    assert zero.method == "arithmetic" and zero.value == 1.0 and zero.lo == 0.0 and zero.hi is not None
    assert zero.to_dict()["ci_method"] == "mean of launch values; Student's t, floored at 0"
    with pytest.raises(ValueError):
        launch_mean([])


def test_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    points = [(100.0, 50.0), (200.0, 40.0), (150.0, 30.0), (200.0, 40.0), (90.0, 60.0), (50.0, 50.0)]
    assert pareto_front(points) == [0, 1, 3, 4]  # (150, 30) and (50, 50) are beaten; equal points both stay
    assert pareto_front([]) == []


def test_interpolate_log_is_linear_in_log_level_and_none_outside() -> None:
    assert interpolate_log([1.0, 4.0], [10.0, 20.0], 2.0) == pytest.approx(15.0)
    assert interpolate_log([1.0, 4.0], [10.0, 20.0], 4.0) == 20.0
    assert interpolate_log([1.0, 4.0], [10.0, 20.0], 8.0) is None
    assert interpolate_log([2.0], [3.0], 2.0) == 3.0


def _run(rate: float, tok_s: float, agg: float, ttft: float, achieved: float) -> RunResult:
    rows = tuple({"index": j, "tokens": 64, "ttft_s": ttft, "e2e_s": 1.0, "error": None} for j in range(4))
    return RunResult(
        index=0,
        warmup=False,
        tokens=256,
        seconds=4.0,
        tok_s=tok_s,
        prompt_tokens=10,
        ttft_s=ttft,
        concurrency=0,
        aggregate_tok_s=agg,
        requests=4,
        metrics={"ttft": {"p50": ttft, "p99": ttft * 2}, "open_loop": {"achieved_rate": achieved}},
        per_request=rows,
        rate=rate,
    )


def _result(slo: str | None = None) -> ABResult:
    """Two arms, two blocks, rates 2 and 8: arm 1 is faster per user at 2 and slower at 8."""
    launches = []
    for b in range(2):
        for k, name in enumerate(("base", "spec")):
            runs = (
                _run(2.0, 80.0 + 40 * k + b, 160.0 + 10 * k, 0.02 * (b + 1), 1.9 + 0.1 * b),
                _run(8.0, 60.0 - 20 * k + b, 480.0 - 80 * k, 0.5 * (k + 1), 7.5 + 0.1 * b),
            )
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"{name}-{b}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={},
                    teardown={},
                    block=b,
                    position=k,
                    arm_index=k,
                )
            )
    design = Design.make(2, 2, "fixed", 0)
    return ABResult(
        experiment_id="e",
        simulated=True,
        host="box",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=design,
        slo=parse_slo(slo) if slo else None,
    )


def test_curves_give_each_arm_each_number_over_launches_at_every_level() -> None:
    result = _result("ttft_p99=100ms")
    arms = curves.curves(result, [curves.ACHIEVED, "ttft_p99", *curves.THROUGHPUT, "goodput"])
    base, spec = arms
    assert [p.level for p in base.points] == [Rate(2.0), Rate(8.0)] and base.label == "base" and spec.index == 1
    achieved = base.points[0].get(curves.ACHIEVED)
    assert achieved is not None and achieved.value == pytest.approx(math.sqrt(1.9 * 2.0)) and achieved.lo is not None
    ttft = base.points[0].get("ttft_p99")  # from the per-request rows: every request's TTFT the same
    assert ttft is not None and ttft.value == pytest.approx(math.sqrt(0.02 * 0.04))
    good = spec.points[1].get("goodput")  # TTFT 1 s at 8 req/s: nothing within 100 ms, goodput 0 (arithmetic)
    assert good is not None and good.value == 0.0 and good.method == "arithmetic"
    kept = base.points[0].get("goodput")  # 4 good requests in each 4-second run
    assert kept is not None and kept.value == pytest.approx(1.0)
    low, high = (p.get("tok_s") for p in spec.points)
    assert low is not None and high is not None
    assert spec.at_level("tok_s", 4.0) == pytest.approx((low.value + high.value) / 2)  # halfway in log(level)
    front = curves.front(arms)
    # spec at 2 req/s is the fastest per user, base at 8 the most aggregate: both on the front, from aggregate down
    assert [(p.label, float(p.level)) for p in front] == [("base", 8.0), ("spec", 2.0)]


def test_closed_loop_achieved_rate_is_completed_requests_over_the_run() -> None:
    run = RunResult(
        index=0,
        warmup=False,
        tokens=256,
        seconds=4.0,
        tok_s=60.0,
        prompt_tokens=10,
        ttft_s=0.02,
        concurrency=8,
        requests=10,
        errors=2,
    )
    assert curves.achieved_rate(run) == 2.0
    assert (
        curves.achieved_rate(
            RunResult(
                index=0, warmup=False, tokens=0, seconds=0.0, tok_s=0.0, prompt_tokens=0, ttft_s=None, concurrency=8
            )
        )
        is None
    )


def test_a_stored_open_loop_launch_gives_each_rate_its_own_requests(tmp_path: Path) -> None:
    """Every open-loop level's run 0 has concurrency 0 and index 0: read back, each gets its own level's rows (by
    rate), so goodput of a stored open-loop experiment is counted (it was None: no rows matched)."""
    store = Store(tmp_path / "r.db")
    store.create_experiment("e1", kind="ab", simulated=True, host="local", arms=["a"], config={}, orch_version="t")
    store.add_launch(
        "l1", experiment_id="e1", arm_index=0, profile="a", profile_dict={}, argv=["x"], env={}, pid=1, started_at=0.0
    )
    base = {"warmup": False, "tokens": 64, "seconds": 2.0, "tok_s": 60.0, "prompt_tokens": 10, "ttft_s": 0.02}
    base |= {"spec_accept_length": None, "spec_verify_ct": None, "valid": True, "invalid_reason": None}
    for rate, n in ((2.0, 3), (8.0, 5)):
        rows = [{"index": j, "tokens": 16, "ttft_s": 0.02, "e2e_s": 0.5, "error": None} for j in range(n)]
        store.add_run("l1", {**base, "index": 0, "concurrency": 0, "rate": rate, "per_request": rows})
    store.update_launch("l1", status="complete")
    (launch,), _ = stored_launches(store, "e1", requests=True)
    store.close()
    assert [(r.rate, len(r.per_request)) for r in launch.runs] == [(2.0, 3), (8.0, 5)]
    assert launch.value_at(Rate(8.0), "goodput", parse_slo("ttft_p99=100ms")) == 2.5  # 5 good requests in 2 s
