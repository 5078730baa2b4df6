"""The warning that a level's seeded schedule strays from the rate offered: said of the whole schedule, whether or
not a run stopped sending early."""

from __future__ import annotations

from typing import Any

from orchestrator.client.request import Record
from orchestrator.client.summary import summarize_run
from orchestrator.results.model import ABResult, LaunchResult
from orchestrator.results.run import RunResult

RATE = 200.0
# Its first 12 requests 1/300 s apart (a dense start of a draw), then 1/200 s apart: 2000 requests over 10 s.
SCHEDULE = [i / 300 for i in range(12)] + [12 / 300 + i / RATE for i in range(1988)]


def _run(schedule: list[float], sent: int, stopped: bool) -> RunResult:
    records = []
    for i, at in enumerate(schedule[:sent]):
        r = Record(index=i, start=at, max_tokens=2, first=at + 0.01, end=at + 0.02, tokens=2, sent=at)
        r.arrivals = [(at + 0.01, 1), (at + 0.02, 1)]
        records.append(r)
    info: dict[str, Any] = {"schedule": schedule, "rate": RATE, "arrivals": "poisson", "peak_in_flight": 3}
    if stopped:
        info["stopped"] = {"at_s": schedule[sent - 1], "sent": sent, "of": len(schedule), "reason": "over-saturated"}
    window = schedule[sent - 1]
    return RunResult.from_summary(0, False, summarize_run(records, window, 0, {}, 0.0, open_loop=info))


def _warnings(run: RunResult) -> list[str]:
    launch = LaunchResult(
        profile="baseline", launch_id="l0", runs=(run,), ready_s=1.0, env_report={"ok": True}, teardown={}
    )
    return ABResult(
        experiment_id="e", simulated=True, host="local", profiles=("baseline",), launches=(launch,), host_facts={}
    ).schedule_warnings()


def test_a_run_stopped_early_is_not_taken_for_a_stray_schedule() -> None:
    """--stop-oversaturated ended a run after 12 of its 1957 requests; the warning said "the seeded schedule's own
    rate was 267 req/s (+34%; about 12 requests per run) … a longer --duration …" from the 12 sent. The schedule's
    own rate is the whole schedule's (here 200 req/s, as offered): no warning."""
    run = _run(SCHEDULE, 12, stopped=True)
    assert run.open_loop["scheduled_rate"] > 1.3 * RATE  # of the part sent, as goodput counts it
    assert run.open_loop["schedule"] == {"requests": 2000, "rate": run.open_loop["schedule"]["rate"]}
    assert abs(run.open_loop["schedule"]["rate"] / RATE - 1) < 0.05
    assert _warnings(run) == []


def test_a_whole_schedule_that_strays_is_still_said_with_its_own_size() -> None:
    short = SCHEDULE[:12]  # a run of 12 requests whose draw came out dense: said, as before
    (said,) = _warnings(_run(short, 12, stopped=False))
    assert said.startswith("@ 200 req/s the seeded schedule's own rate was 300 req/s (+50%; about 12 requests per ")
    stopped = [*short, *(short[-1] + (i + 1) / 300 for i in range(12))]  # 24 due, dense throughout; 12 sent
    (said,) = _warnings(_run(stopped, 12, stopped=True))
    assert "(+50%; about 24 requests per run)" in said
