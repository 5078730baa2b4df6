"""The open-loop client against a local server whose answers take a known time: requests go out on schedule whatever
the answers do, latency counts from the scheduled time (time held by a --max-concurrency cap included), and a
shortfall is told apart (client or server)."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.client import openloop, runner
from orchestrator.client.headroom import RELAYED_FDS, REQUEST_BYTES, RESERVE_FDS, TOKEN_BYTES, Headroom, room
from orchestrator.client.summary import fitted_rate, limit_of
from tests.client.test_client_stream import Server, generate_answer
from tests.wires import wire


class SlowServer(Server):
    """Answers every /generate request after `delay` seconds (a server busy elsewhere, or a long prefill)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        super().__init__()
        self.answer = generate_answer(4)

    def _serve(self, conn: socket.socket) -> None:
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            if request.startswith(b"GET /metrics"):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                return
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            time.sleep(self.delay)
            conn.sendall(self.answer)
        except OSError:
            pass
        finally:
            conn.close()


@pytest.fixture(scope="module")
def slow() -> Iterator[SlowServer]:
    srv = SlowServer(0.4)
    yield srv
    srv.close()


def run(
    srv: Server, schedule: list[float], cap: int | None = None, stop_oversaturated: bool = False, **kw: Any
) -> dict[str, Any]:
    n = len(schedule)
    return runner.run(
        "127.0.0.1",
        srv.port,
        wire("generate"),
        [{"text": "x"}] * n,
        [4] * n,
        0,
        30.0,
        stall_s=10.0,
        open_loop={
            "schedule": schedule,
            "rate": 10.0,
            "arrivals": "constant",
            "max_concurrency": cap,
            **({"stop_oversaturated": True} if stop_oversaturated else {}),
        },
        **kw,
    )


def test_requests_go_out_on_schedule_however_slow_the_answers(slow: SlowServer) -> None:
    schedule = [i * 0.05 for i in range(10)]  # 20 req/s, each answered 0.4 s later: up to 9 in flight
    s = run(slow, schedule)
    assert s["errors"] == 0 and s["concurrency"] == 0
    reqs = s["per_request"]
    assert [r["scheduled_s"] for r in reqs] == schedule
    # Sent within a few ms of schedule (a loaded CI box), not 0.4 s apart as a closed loop would send them.
    assert max(r["send_lag_s"] for r in reqs) < 0.05
    assert all(r["queued_s"] == 0 for r in reqs)
    assert all(0.38 < r["e2e_s"] < 0.6 for r in reqs)  # from the scheduled time: the server's 0.4 s and no more
    ol = s["open_loop"]
    assert ol["requests"] == ol["sent"] == ol["completed"] == 10 and ol["held"] == 0
    assert ol["scheduled_rate"] == pytest.approx(20.0) and ol["achieved_rate"] == pytest.approx(20.0, rel=0.1)
    assert ol["peak_in_flight"] >= 7 and ol["limited"] is None and ol["limit_reason"] is None
    assert s["window_s"] == pytest.approx(0.45)  # the last request's due time


def test_a_capped_request_waits_in_the_client_and_its_latency_counts_from_its_schedule(slow: SlowServer) -> None:
    schedule = [0.0, 0.01, 0.02, 0.03]  # all due at once; one at a time: each waits for the one before
    s = run(slow, schedule, cap=1)
    reqs = s["per_request"]
    assert s["errors"] == 0
    for i, r in enumerate(reqs):
        # the i-th starts when the (i-1)-th ends, about 0.4 s x i after the start
        assert r["send_lag_s"] == pytest.approx(0.4 * i - schedule[i], abs=0.1)
        assert r["queued_s"] == pytest.approx(r["send_lag_s"], abs=0.02)
        # vLLM issue 54101: the wait in the client is part of the latency
        assert r["e2e_s"] >= r["queued_s"] + 0.38
        assert r["ttft_s"] >= r["queued_s"] + 0.38
    ol = s["open_loop"]
    assert ol["held"] == 3 and ol["peak_in_flight"] == 1 and ol["max_concurrency"] == 1
    assert ol["limited"] == "client" and "--max-concurrency 1 cap held 3 of 4 requests" in ol["limit_reason"]


def test_an_abort_stops_a_dispatcher_asleep_until_the_next_request(slow: SlowServer) -> None:
    calls = threading.Event()

    def watchdog() -> str | None:
        calls.set()
        return "a worker exited"

    t0 = time.perf_counter()
    s = run(slow, [0.0, 30.0], watchdog=watchdog, watchdog_every_s=0.2)
    assert time.perf_counter() - t0 < 5 and calls.is_set()
    assert s["aborted"] == "a worker exited" and not s["valid"]
    assert s["per_request"][1]["error"] == "aborted: a worker exited (not sent)"
    assert s["per_request"][1]["send_lag_s"] is None


def test_a_schedule_out_of_order_is_refused(slow: SlowServer) -> None:
    with pytest.raises(ValueError, match="in order"):
        run(slow, [0.1, 0.0])


def test_fitted_rate_and_who_limited() -> None:
    assert fitted_rate([0.0, 0.5, 1.0, 1.5]) == pytest.approx(2.0)
    assert fitted_rate([3.0, 0.0, 1.0, 2.0]) == pytest.approx(1.0)  # sorted first
    # one slow last completion (2 s late) barely moves it; gaps / span would say 20 / 21 = 0.952
    late = fitted_rate([float(i) for i in range(20)] + [21.0])
    assert late is not None and 0.98 < late < 1.0
    assert fitted_rate([1.0]) is None and fitted_rate([1.0, 1.0]) is None
    assert limit_of(0.97, 1.0, 0.0) is None
    assert limit_of(0.9, 1.0, 0.0) == "server"  # sent on time, answered late
    assert limit_of(0.9, 0.9, 0.0) == "client"  # the client fell behind its schedule
    assert limit_of(0.9, 1.0, 0.2) == "client"  # the cap held requests back
    assert limit_of(None, None, 0.0) is None


# ---------------------------------------------------------------- when the client is the limit (issue 34, item 5)


def test_a_client_that_cannot_hold_more_stops_sending_cuts_and_says_client_limited(
    slow: SlowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client with room for 3 requests in flight (its open files, its memory): the 4th due finds it full.
    monkeypatch.setattr(openloop, "headroom", lambda max_tokens, each: Headroom(requests=3, why="room for 3 (test)"))
    s = run(slow, [i * 0.01 for i in range(10)])
    stopped = s["open_loop"]["stopped"]
    assert stopped["limited"] == "client" and stopped["capacity"] == 3 and stopped["cut"] == 3
    assert stopped["sent"] == 3 and stopped["of"] == 10
    assert stopped["reason"].startswith("3 requests in flight at ") and "room for 3 (test)" in stopped["reason"]
    # Invalid, and why: the client's limit, not the server's; the requests cut are neither measured nor failures
    # (a run with failures would have the server checked and the run repeated).
    assert not s["valid"] and s["invalid_reason"].startswith("client-limited: 3 requests in flight")
    assert "not the server's" in s["invalid_reason"] and "ulimit -n" in s["invalid_reason"]
    assert s["errors"] == 0 and s["requests"] == 0
    assert s["open_loop"]["limited"] == "client" and "limited by the client" in s["open_loop"]["limit_reason"]


def test_the_room_is_the_open_file_limit_less_what_is_open_and_a_reserve_or_the_memory() -> None:
    by_files = room(nofile=256, open_now=11, available=None, max_tokens=64)
    assert by_files.requests == 256 - 11 - RESERVE_FDS and "ulimit -n 256" in by_files.why
    by_memory = room(nofile=100_000, open_now=11, available=2**30, max_tokens=2048)
    assert by_memory.requests == 2**29 // (REQUEST_BYTES + TOKEN_BYTES * 2048) and "GiB of memory" in by_memory.why
    relayed = room(nofile=256, open_now=11, available=None, max_tokens=64, descriptors_each=RELAYED_FDS)
    assert relayed.requests == (256 - 11 - RESERVE_FDS) // RELAYED_FDS and "relayed to the host" in relayed.why
    assert room(nofile=16, open_now=10, available=None, max_tokens=1).requests == 1  # always the first request
    assert room(nofile=None, open_now=0, available=None, max_tokens=1).requests >= 2**31 - 1


def test_a_watchdog_check_out_of_descriptors_is_skipped_not_taken_for_the_launch(slow: SlowServer) -> None:
    calls: list[int] = []

    def watchdog() -> str | None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files", "/proc/4242/stat")
        return None

    s = run(slow, [0.0, 0.6], watchdog=watchdog, watchdog_every_s=0.2)
    assert len(calls) >= 2 and s["aborted"] is None and s["valid"] and s["errors"] == 0


@pytest.fixture(scope="module")
def slower() -> Iterator[SlowServer]:
    srv = SlowServer(1.5)
    yield srv
    srv.close()


def test_stop_oversaturated_fires_on_a_backlog_held_in_the_client_and_says_so(slower: SlowServer) -> None:
    # 30 req/s for 6 s against 3 in flight at most, each answered 1.5 s later: 2 req/s go out, the rest wait in the
    # client. The server itself keeps up with what it gets; the backlog is the client's (its --max-concurrency).
    s = run(slower, [i / 30 for i in range(180)], cap=3, stop_oversaturated=True)
    stopped = s["open_loop"]["stopped"]
    assert stopped["limited"] == "client" and "capacity" not in stopped
    assert stopped["reason"].startswith("over-saturated in the client: ")
    assert "held by --max-concurrency 3" in stopped["reason"]
    assert stopped["sent"] < stopped["of"] == 180 and s["valid"]  # those sent were measured
    assert s["open_loop"]["limited"] == "client" and "limited by the client" in s["open_loop"]["limit_reason"]


def test_a_local_client_relayed_to_a_remote_host_counts_the_relays_descriptors(
    slow: SlowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.config.workload import BenchConfig
    from orchestrator.launch.benchmark import RunCall, local_runner

    each: list[int] = []

    def seen(max_tokens: int, descriptors_each: int) -> Headroom:
        each.append(descriptors_each)
        return Headroom(requests=100, why="plenty")

    monkeypatch.setattr(openloop, "headroom", seen)
    call = RunCall(
        bodies=[{"text": "x"}],
        max_tokens=[4],
        concurrency=0,
        probe_gpus=False,
        open_loop={"schedule": [0.0], "rate": 1.0, "arrivals": "constant"},
    )
    for relayed in (False, True):
        summary = local_runner(
            f"http://127.0.0.1:{slow.port}", BenchConfig(endpoint="generate"), relayed=relayed, wire=wire("generate")
        )(call)
        assert summary["valid"] and summary["errors"] == 0
    assert each == [1, RELAYED_FDS]  # the relay's socket and pipes are this process's descriptors too


CLOSED_LOOP_CHILD = """
import json, resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from orchestrator.client import runner
from tests.wires import wire
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4096)  # a server that accepts and never answers: a request sent would be seen here
listener.setblocking(False)
c = int(sys.argv[3])
port = listener.getsockname()[1]
summary = runner.run("127.0.0.1", port, wire("generate"), [{"text": "x"}] * c, [4] * c, c, timeout=5, stall_s=1,
                     first_token_s=1)
try:
    listener.accept()
    sent = True
except BlockingIOError:
    sent = False
print(json.dumps({"client_limited": summary.get("client_limited"), "sent": sent,
                  "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "errors": summary["errors"]}))
"""


def closed_loop_child(soft: int, hard: int, concurrency: int) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", CLOSED_LOOP_CHILD, str(soft), str(hard), str(concurrency)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Too many open files" not in done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_closed_loop_level_beyond_the_clients_open_files_is_client_limited_and_never_sent() -> None:
    """300 busy streams under a hard limit of 256 open files: the client cannot hold them, so the run sends nothing
    and says the client is the limit (it ran into EMFILE halfway through, failing requests as if the server had)."""
    out = closed_loop_child(256, 256, 300)
    assert out["client_limited"] and "client-limited" in out["client_limited"]
    assert "ulimit -n 256" in out["client_limited"] and "--concurrency" in out["client_limited"]
    assert out["sent"] is False and out["errors"] == 300


def test_a_closed_loop_level_raises_a_low_soft_open_file_limit_it_needs_within_the_hard_one() -> None:
    """A soft 256 under a hard 4096 (a common default is 1024 under far more): 300 streams raise the soft limit and
    run; they are sent, not refused."""
    out = closed_loop_child(256, 4096, 300)
    assert out["client_limited"] is None and out["sent"] is True
    assert out["soft"] >= 300 + RESERVE_FDS


def test_a_client_limited_run_is_never_repeated_as_a_server_failure() -> None:
    from orchestrator.launch.benchmark import client_full

    assert client_full({"client_limited": "client-limited: …"})
    assert client_full({"open_loop": {"stopped": {"capacity": 10}}})
    assert not client_full({"errors": 3})
