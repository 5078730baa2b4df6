"""The client against hostile or broken servers: every answer gives a summary with reasons, never an exception."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.client import request as client_requests
from orchestrator.client import runner
from tests.wires import wire

# A handler gets the connection and the request line, and answers however it likes.
Handler = Callable[[socket.socket, bytes], None]
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Loopback:
    """A tiny HTTP server on 127.0.0.1 whose answers the test sets; one thread per connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.handler: Handler = lambda conn, line: conn.sendall(NOT_FOUND)
        self.metrics: bytes = NOT_FOUND
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(15)
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                piece = conn.recv(65536)
                if not piece:
                    return
                request += piece
            head, _, body = request.partition(b"\r\n\r\n")
            length = next(
                (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0
            )
            while len(body) < length:
                body += conn.recv(65536)
            line = head.split(b"\r\n")[0]
            if line.startswith(b"GET /metrics"):
                conn.sendall(self.metrics)
            else:
                self.handler(conn, line)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Loopback]:
    srv = Loopback()
    yield srv
    srv.close()


def gen_event(tokens: Any, final: bool = False, **meta: Any) -> bytes:
    """One /generate SSE event, the way SGLang (and the simulator) writes it."""
    info = {"finish_reason": {"type": "length"} if final else None, "prompt_tokens": 5, "completion_tokens": tokens}
    info.update(meta)
    return b"data: " + json.dumps({"text": "x", "output_ids": [1], "meta_info": info}).encode() + b"\n\n"


def stream(*events: bytes, done: bool = True) -> Handler:
    def handle(conn: socket.socket, line: bytes) -> None:
        conn.sendall(OK_HEAD + b"".join(events) + (b"data: [DONE]\n\n" if done else b""))

    return handle


def good_stream(n: int) -> Handler:
    return stream(*(gen_event(i) for i in range(1, n)), gen_event(n, final=True))


def run(srv: Loopback, endpoint: str = "generate", n: int = 1, max_tokens: int = 4, **kw: Any) -> dict[str, Any]:
    kw.setdefault("timeout", 10.0)
    timeout = kw.pop("timeout")
    return runner.run(
        "127.0.0.1", srv.port, wire(endpoint), [{"text": "x"}] * n, [max_tokens] * n, 1, timeout, 0.0, **kw
    )


# ------------------------------------------------------------------ /metrics garbage


@pytest.mark.parametrize(
    "metrics",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\n\r\n{\n  \n}\n[]\n sglang:x_total{ 1\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nsglang:x_total 1\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\nsglang:generation_tokens_total NaN\nsglang:generation_tokens_total inf\n",
        b"garbage without any status line",
    ],
)
def test_garbage_metrics_leaves_the_run_valid(server: Loopback, metrics: bytes) -> None:
    server.metrics = metrics
    server.handler = good_stream(4)
    try:
        s = run(server)
    finally:
        server.metrics = NOT_FOUND
    assert s["valid"], s["invalid_reason"]
    assert s["tokens"] == 4 and s["spec_accept_length"] is None


# ------------------------------------------------------------------ numbers from the server


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ((gen_event(1), gen_event(10**18, final=True)), "server claimed 1000000000000000000 tokens for max_tokens 4"),
        ((gen_event(10**18),), "server claimed 1000000000000000000 tokens for max_tokens 4"),
        ((gen_event(1), gen_event(1e18, final=True)), "completion_tokens=1e+18"),
        ((gen_event(1e18),), "completion_tokens=1e+18, not a whole number"),
        ((gen_event(-5, final=True),), "completion_tokens=-5, a negative count"),
        ((gen_event(2.5, final=True),), "not a whole number"),
        ((gen_event("3", final=True),), "not a whole number"),
        ((gen_event(4, final=True, spec_verify_ct=10**12),), "spec_verify_ct"),
        ((gen_event(4, final=True, spec_verify_ct=2, spec_accept_length=math.inf),), "spec_accept_length"),
        ((gen_event(4, final=True, prompt_tokens=-1),), "prompt_tokens=-1"),
    ],
)
def test_absurd_generate_counts_fail_the_request(server: Loopback, events: tuple[bytes, ...], expected: str) -> None:
    server.handler = stream(*events)
    s = run(server)
    assert not s["valid"] and s["errors"] == 1
    error = s["per_request"][0]["error"]
    assert expected in error, error
    assert expected in s["invalid_reason"]


def _openai_chunk(usage: dict[str, Any] | None, text: str = "x") -> bytes:
    event: dict[str, Any] = {"choices": [{"index": 0, "text": text}] if text else []}
    if usage is not None:
        event["usage"] = usage
    return b"data: " + json.dumps(event).encode() + b"\n\n"


@pytest.mark.parametrize(
    "usage",
    [
        {"completion_tokens": 10**18, "prompt_tokens": 3},
        {"completion_tokens": 1e18},
        {"completion_tokens": -3},
        {"completion_tokens": "many"},
        {"completion_tokens": 2, "prompt_tokens": 1e300},
    ],
)
@pytest.mark.parametrize("per_chunk", [True, False])
def test_absurd_openai_usage_fails_the_request(server: Loopback, usage: dict[str, Any], per_chunk: bool) -> None:
    chunks = (
        [_openai_chunk({"completion_tokens": 1}), _openai_chunk(usage)]
        if per_chunk
        else [
            _openai_chunk(None),
            _openai_chunk(usage, text=""),
        ]
    )
    server.handler = stream(*chunks)
    s = run(server, "completions")
    assert not s["valid"] and s["errors"] == 1, s
    assert "server " in s["per_request"][0]["error"]


# ------------------------------------------------------------------ fuzzing the stream parser

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_meta = st.fixed_dictionaries(
    {"completion_tokens": _json_values | st.integers(0, 6)},
    optional={"finish_reason": st.none() | _json_values, "spec_verify_ct": _json_values, "prompt_tokens": _json_values},
)
_events = st.one_of(
    _meta.map(lambda m: b"data: " + json.dumps({"text": "x", "meta_info": m}).encode() + b"\n\n"),
    _json_values.map(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n"),
    st.fixed_dictionaries({"choices": _json_values, "usage": _json_values}).map(
        lambda v: b"data: " + json.dumps(v).encode() + b"\n\n"
    ),
    st.binary(max_size=40),
    st.just(b"data: [DONE]\n\n"),
    st.just(b"data: {not json\n\n"),
    st.just(b"data: " + b"[" * 5000 + b"\n\n"),
    st.just(b'data: {"meta_info": {"completion_tokens": ' + b"9" * 5000 + b"}}\n\n"),
)
_status = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 500 Oops",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1",
        b"",
        b"\x00\xff garbage",
        b"ICY 200 OK",
    ]
)


def _chunked(body: bytes, size_token: bytes | None) -> bytes:
    if size_token is not None:  # a hostile chunk size
        return size_token + b"\r\n" + body + b"\r\n0\r\n\r\n"
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if body else b"0\r\n\r\n"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=_status,
    chunked=st.booleans(),
    size_token=st.none() | st.sampled_from([b"zz", b"-5", b"ffffffffffffffff", b"", b"1;ext"]),
    events=st.lists(_events, max_size=6),
    endpoint=st.sampled_from(["generate", "completions", "chat"]),
)
def test_fuzzed_answers_always_give_a_summary(
    server: Loopback, status: bytes, chunked: bool, size_token: bytes | None, events: list[bytes], endpoint: str
) -> None:
    body = b"".join(events)
    head = status + b"\r\n" + (b"Transfer-Encoding: chunked\r\n" if chunked else b"") + b"Connection: close\r\n\r\n"
    answer = head + (_chunked(body, size_token) if chunked else body)

    def handle(conn: socket.socket, line: bytes) -> None:
        conn.sendall(answer)

    server.handler = handle
    server.metrics = answer  # /metrics gets the same garbage
    try:
        s = run(server, endpoint, n=2, max_tokens=4, timeout=5.0, stall_s=2.0, first_token_s=2.0)
    finally:
        server.metrics = NOT_FOUND
    assert isinstance(s, dict) and s["requests"] == 2
    for r in s["per_request"]:
        assert r["error"] is None or isinstance(r["error"], str)
        assert r["tokens"] <= client_requests.token_limit(4)
    if not s["valid"]:
        assert isinstance(s["invalid_reason"], str) and s["invalid_reason"]
    else:
        assert all(r["error"] is None and r["tokens"] >= 4 for r in s["per_request"])
    json.dumps(s)  # what is stored and shipped back from the host must serialise


# ------------------------------------------------------------------ stalls and the watchdog


def _silent_after(events: list[bytes]) -> Handler:
    """Sends events, then nothing: the main process of a server whose worker died keeps its socket open."""

    def handle(conn: socket.socket, line: bytes) -> None:
        conn.sendall(OK_HEAD + b"".join(events))
        conn.settimeout(30)
        with contextlib.suppress(OSError):
            conn.recv(1)  # until the client gives up and closes

    return handle


def test_a_stream_that_goes_silent_fails_after_stall_s(server: Loopback) -> None:
    server.handler = _silent_after([gen_event(1), gen_event(2), gen_event(3)])
    started = time.monotonic()
    s = run(server, max_tokens=16, timeout=30.0, stall_s=1.0)
    took = time.monotonic() - started
    assert took >= 1.0, took  # not before stall_s
    # The stall rule ended it, not the 30 s request timeout: the error is the stall's.
    assert s["per_request"][0]["error"] == "stalled: no token for 1s after 3 tokens"
    assert not s["valid"] and "stalled: no token for 1s after 3 tokens" in s["invalid_reason"]
    assert s["aborted"] is None


def test_no_first_token_fails_after_first_token_s(server: Loopback) -> None:
    server.handler = _silent_after([])
    started = time.monotonic()
    s = run(server, max_tokens=16, timeout=30.0, stall_s=10.0, first_token_s=0.5)
    assert time.monotonic() - started < 8.0  # after first_token_s, not stall_s (10 s)
    assert s["per_request"][0]["error"] == "stalled: no first token within 0.5s"
    assert not s["valid"]


def _slow_forever(conn: socket.socket, line: bytes) -> None:
    conn.sendall(OK_HEAD)
    for i in range(1, 1000):
        conn.sendall(gen_event(i))
        time.sleep(0.05)


def test_watchdog_aborts_every_request_promptly(server: Loopback) -> None:
    server.handler = _slow_forever
    started = time.monotonic()
    checks: list[float] = []

    def watchdog() -> str | None:
        checks.append(time.monotonic() - started)
        return "the server process is gone (PID 4242)" if checks[-1] >= 0.5 else None

    s = runner.run(
        "127.0.0.1",
        server.port,
        wire("generate"),
        [{"text": "x"}] * 6,
        [2000] * 6,
        2,
        timeout=60.0,
        watchdog=watchdog,
        watchdog_every_s=0.1,
    )
    reason = "the server process is gone (PID 4242)"
    assert s["aborted"] == reason
    assert not s["valid"] and f"aborted: {reason}" in s["invalid_reason"]
    errors = [r["error"] for r in s["per_request"]]
    assert all(e is not None and reason in e for e in errors), errors
    assert sum(1 for e in errors if e.endswith("(not sent)")) == 4  # queued ones never went out


def test_a_slow_watchdog_does_not_stall_the_run(server: Loopback) -> None:
    server.handler = good_stream(4)

    def slow() -> str | None:
        time.sleep(60)
        return "too late"

    started = time.monotonic()
    s = run(server, n=3, watchdog=slow, watchdog_every_s=0.01)
    assert time.monotonic() - started < 30  # without waiting for the 60 s check
    assert s["valid"] and s["aborted"] is None


def test_a_failing_watchdog_aborts_with_its_error(server: Loopback) -> None:
    server.handler = _slow_forever

    def broken() -> str | None:
        raise RuntimeError("cannot reach the host")

    s = run(server, max_tokens=2000, watchdog=broken, watchdog_every_s=0.1)
    assert s["aborted"] == "the watchdog check failed: RuntimeError: cannot reach the host"


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
@pytest.mark.parametrize("name", ["stall_s", "first_token_s", "watchdog_every_s"])
def test_bounds_must_be_finite_and_positive(server: Loopback, name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a finite number of seconds above 0"):
        bounds: dict[str, Any] = {name: bad}
        run(server, **bounds)


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_a_stream_without_any_token_fails_its_request(server: Loopback, endpoint: str) -> None:
    server.handler = stream()  # 200, then [DONE] at once
    s = run(server, endpoint)
    assert not s["valid"] and s["per_request"][0]["error"] == "the server finished the stream without sending a token"
