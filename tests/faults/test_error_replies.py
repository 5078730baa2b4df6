"""A server's error reply (any status but 200) is reported as that status at once, whatever its body, never waited
on as a stall while the server holds the connection open."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import REPO
from tests.faults.support import orch_env

# Far beyond the bound below: a client that waits for the first token instead of reading the status shows as a
# subprocess that times out.
FIRST_TOKEN_S = 170.0
BOUND_S = 60.0


class HoldingServer:
    """Answers every request with `reply` on 127.0.0.1 and then keeps the connection open (as a keep-alive server
    or a proxy may, whatever the client's `Connection: close` said) until the test ends."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(BOUND_S * 2)
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                piece = conn.recv(65536)
                if not piece:
                    return
                request += piece
            if request.startswith(b"GET /metrics"):
                # The client's counter scrape before and after the run: no counters here.
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            conn.sendall(self.reply)
            self.done.wait(BOUND_S * 2)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()


@contextlib.contextmanager
def _serving(reply: bytes) -> Iterator[HoldingServer]:
    srv = HoldingServer(reply)
    try:
        yield srv
    finally:
        srv.close()


CLIENT = """
import json, sys
from orchestrator.client import runner as client
from tests.wires import wire
port, endpoint, first_token_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
s = client.run("127.0.0.1", port, wire(endpoint), [{"text": "x"}], [4], 1, 600.0, 0.0, first_token_s=first_token_s)
print(json.dumps({"valid": s["valid"], "errors": s["errors"], "error": s["per_request"][0]["error"]}))
"""


def _run_client(port: int, endpoint: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(port), endpoint, str(FIRST_TOKEN_S)],
        cwd=REPO,
        env=orch_env(),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", "HTTP 503 Service Unavailable"),
        (
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:1/generate\r\nContent-Length: 0\r\n\r\n",
            "HTTP 307 Temporary Redirect",
        ),
        # No length at all: the body would run to the end of the connection, which the server never closes.
        (b"HTTP/1.1 502 Bad Gateway\r\n\r\n", "HTTP 502 Bad Gateway"),
        # A body that comes with the head: the message quotes it.
        (b'HTTP/1.1 500 Internal Server Error\r\nContent-Length: 15\r\n\r\n{"error":"oom"}', '{"error":"oom"}'),
    ],
    ids=["503-empty", "307-empty", "502-no-length", "500-with-body"],
)
@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_error_reply_is_reported_at_once_not_as_a_stall(reply: bytes, shown: str, endpoint: str) -> None:
    with _serving(reply) as srv:
        result = _run_client(srv.port, endpoint)
    assert result["valid"] is False and result["errors"] == 1, result
    error = str(result["error"])
    assert shown in error, error
    assert "stalled" not in error and "first token" not in error, error


def test_error_status_with_empty_body_says_so() -> None:
    with _serving(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n") as srv:
        result = _run_client(srv.port, "generate")
    assert "no body" in str(result["error"]), result
