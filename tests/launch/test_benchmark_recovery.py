"""launch/benchmark's recovery from failed requests: a run is repeated only where a repeat may go otherwise, never
when the server refused the requests themselves (a client error, HTTP 4xx)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import engines
from orchestrator.client.request import Record
from orchestrator.client.summary import summarize_run
from orchestrator.config.workload import BenchConfig
from orchestrator.launch.benchmark import MAX_RECOVERIES, RunCall, refused_by_server, run_benchmark
from orchestrator.results.run import RunResult
from orchestrator.ui.events import Lines

TOO_LONG = 'HTTP 400 Bad Request: {"error": {"message": "The input (1000000 tokens) is longer than the context"}}'


class FailingRunner:
    """Answers every run with its requests failed as `errors` says (None: that request succeeds)."""

    def __init__(self, errors: list[str | None]) -> None:
        self.errors = errors
        self.calls = 0

    def __call__(self, call: RunCall) -> dict[str, Any]:
        self.calls += 1
        records = []
        for i in range(len(call.bodies)):
            error = self.errors[i % len(self.errors)]
            r = (
                Record(index=i, start=0.0, max_tokens=2, error=error)
                if error
                else Record(index=i, start=0.0, max_tokens=2, first=0.1, end=1.5, tokens=2)
            )
            r.arrivals = [] if error else [(0.1, 1), (1.5, 1)]
            records.append(r)
        return summarize_run(records, 1.5, call.concurrency, {}, 0.0)


def _bench(errors: list[str | None]) -> tuple[FailingRunner, list[str], list[str], list[RunResult]]:
    runner, checked, said, stored = FailingRunner(errors), [], [], []
    config = BenchConfig(runs=1, warmup=0, max_tokens=2, concurrency=(2,), min_run_s=0)
    run_benchmark(
        runner,
        config,
        model="m",
        engine=engines.get("sglang"),
        on_run=stored.append,
        recover=lambda what: checked.append(what) or True,
        events=Lines(said.append),
    )
    return runner, checked, said, stored


def test_a_run_the_server_refused_with_a_client_error_is_kept_invalid_not_repeated() -> None:
    """A prompt longer than the context is refused with HTTP 400 every time: the run was checked and repeated three
    times over (each a full run of the trace's long prompts). It is kept at once, invalid, with the server's answer,
    and the line says why it is not repeated."""
    runner, checked, said, stored = _bench([TOO_LONG, "HTTP 413 Payload Too Large (no body)"])
    assert runner.calls == 1 and not checked
    assert len(stored) == 1 and not stored[0].valid
    assert stored[0].invalid_reason is not None and "longer than the context" in stored[0].invalid_reason
    line = next(s for s in said if "requests failed" in s)
    assert "run 1/1 at concurrency 2: 2 of 2 requests failed (first: HTTP 400 Bad Request:" in line
    assert "the server refused them (an HTTP 4xx client error, which a repeat would not change)" in line
    assert line.endswith("keeping the run, invalid, without repeating it")


@pytest.mark.parametrize(
    "errors",
    [
        ["HTTP 429 Too Many Requests (no body)"],
        ["HTTP 408 Request Timeout (no body)"],
        ["HTTP 503 Service Unavailable: overloaded"],
        ["stalled: no token for 60s"],
        [TOO_LONG, "HTTP 429 Too Many Requests (no body)"],  # not every failure the request's own
    ],
)
def test_other_failures_are_checked_and_repeated_as_before(errors: list[str | None]) -> None:
    runner, checked, _, stored = _bench(errors)
    assert runner.calls == 1 + MAX_RECOVERIES and len(checked) == 1 + MAX_RECOVERIES
    assert len(stored) == 1 and not stored[0].valid


def test_which_failures_are_the_requests_own() -> None:
    def summary(*errors: str | None) -> dict[str, Any]:
        return {"per_request": [{"error": e} for e in errors]}

    assert refused_by_server(summary(TOO_LONG, None, "HTTP 422 Unprocessable Entity: bad field"))
    assert not refused_by_server(summary(TOO_LONG, "HTTP 429 Too Many Requests (no body)"))
    assert not refused_by_server(summary(TOO_LONG, "stalled: no token for 60s"))
    assert not refused_by_server(summary("HTTP 500 Internal Server Error (no body)"))
    assert not refused_by_server(summary(None, None))
    assert not refused_by_server(summary("not an HTTP answer ('HTTP/1.1 4')"))
