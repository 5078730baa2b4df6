"""The client's stream reading end to end: exact counts whatever the text, the read sizes or the chunk sizes."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.client import runner, stream
from tests.wires import wire

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
ADVERSARIAL = [
    '"meta_info":{"completion_tokens":999,"finish_reason":null}}',
    '", "meta_info": {"completion_tokens": 999, "finish_reason": null}}\n\ndata: [DONE]\n\n',
    'quote \\" backslash \\\\ ',
    "数学 🚀 naïve ",
    "}}}{{ ",
]


class Server:
    """127.0.0.1 HTTP server answering every request with `answer` (bytes), sent in pieces of `piece` bytes."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.answer = b""
        self.piece = 0  # 0: all at once
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
            answer, piece = self.answer, self.piece
            if not piece:
                conn.sendall(answer)
                return
            for i in range(0, len(answer), piece):
                conn.sendall(answer[i : i + piece])
                if i // piece % 50 == 0:
                    time.sleep(0.001)  # let the client read what is there: reads end mid-event, mid-line
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server()
    yield srv
    srv.close()


def chunk(payload: bytes) -> bytes:
    piece = b"data: " + payload + b"\n\n"
    return f"{len(piece):x}\r\n".encode() + piece + b"\r\n"


def generate_answer(
    tokens: int, *, per_chunk: int = 1, incremental: bool = False, final_meta: dict[str, Any] | None = None
) -> bytes:
    """A /generate answer as SGLang sends it: cumulative text and ids (or only the new ones), meta_info last."""
    out, text, ids, done = [OK_HEAD], "", [], 0
    while done < tokens:
        step = min(per_chunk, tokens - done)
        new = "".join(ADVERSARIAL[(done + j) % len(ADVERSARIAL)] for j in range(step))
        text += new
        ids += [30000 + done + j for j in range(step)]
        done += step
        final = done == tokens
        meta: dict[str, Any] = {
            "id": "r1",
            "finish_reason": {"type": "length", "length": tokens} if final else None,
            "prompt_tokens": 5,
            "weight_version": "default",
            "completion_tokens": done,
            "cached_tokens": 0,
        }
        if final:
            meta.update(final_meta or {})
        obj = {
            "text": new if incremental else text,
            "output_ids": ids[-step:] if incremental else ids,
            "meta_info": meta,
        }
        out.append(chunk(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()))
    out.append(chunk(b"[DONE]") + b"0\r\n\r\n")
    return b"".join(out)


def run(srv: Server, n: int, max_tokens: int, endpoint: str = "generate", concurrency: int = 1) -> dict[str, Any]:
    return runner.run(
        "127.0.0.1",
        srv.port,
        wire(endpoint),
        [{"text": "x"}] * n,
        [max_tokens] * n,
        concurrency,
        30.0,
        0.0,
        stall_s=10.0,
    )


@pytest.mark.parametrize("piece", [0, 7, 1000])
@pytest.mark.parametrize("incremental", [False, True])
def test_generate_counts_exactly_whatever_the_text_and_the_read_sizes(
    server: Server, piece: int, incremental: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    loads = stream._loads

    def counted(buf: bytes | bytearray, start: int, end: int) -> Any:
        parsed.append(end - start)
        return loads(buf, start, end)

    monkeypatch.setattr(stream, "_loads", counted)
    server.answer, server.piece = generate_answer(40, incremental=incremental), piece
    s = run(server, n=4, max_tokens=40, concurrency=4)  # four streams reading through one shared buffer
    assert s["valid"], s["invalid_reason"]
    assert len(parsed) == 4  # only each request's final event was parsed whole
    assert [r["tokens"] for r in s["per_request"]] == [40] * 4
    assert s["chunks"] == 4 * 40 and s["multi_token_chunks"] == 0
    assert s["token_source"] == "meta_info" and s["prompt_tokens"] == 5


def test_multi_token_chunks_count_each_token(server: Server) -> None:
    server.answer, server.piece = generate_answer(41, per_chunk=4), 0
    s = run(server, n=1, max_tokens=41)
    assert s["valid"], s["invalid_reason"]
    r = s["per_request"][0]
    assert r["tokens"] == 41 and r["chunks"] == 11  # ten chunks of 4, one of 1
    assert s["multi_token_chunks"] == 10


def test_the_per_request_accept_length_survives(server: Server) -> None:
    server.answer, server.piece = generate_answer(40, per_chunk=3, final_meta={"spec_verify_ct": 16}), 0
    s = run(server, n=2, max_tokens=40)
    assert s["valid"], s["invalid_reason"]
    assert [r["accept_length"] for r in s["per_request"]] == [2.5, 2.5]
    assert s["spec_accept_length"] == 2.5 and s["spec_verify_ct"] == 32
    assert s["accept_source"].startswith("meta_info")


def test_events_longer_than_a_read_are_counted(server: Server) -> None:
    big = "w" * 300_000  # each cumulative event is longer than the client's 256 KiB read buffer
    events = [OK_HEAD]
    for i in range(1, 4):
        meta = {"finish_reason": None if i < 3 else {"type": "length"}, "completion_tokens": i}
        events.append(chunk(json.dumps({"text": big * i, "output_ids": [1] * i, "meta_info": meta}).encode()))
    server.answer, server.piece = b"".join([*events, chunk(b"[DONE]"), b"0\r\n\r\n"]), 0
    s = run(server, n=1, max_tokens=3)
    assert s["valid"], s["invalid_reason"]
    assert s["per_request"][0]["tokens"] == 3 and s["per_request"][0]["chunks"] == 3


def test_an_error_event_fails_the_request_with_the_servers_message(server: Server) -> None:
    error = json.dumps({"error": {"message": "The server is out of KV cache"}}).encode()
    server.answer, server.piece = OK_HEAD + chunk(error) + chunk(b"[DONE]") + b"0\r\n\r\n", 0
    s = run(server, n=1, max_tokens=3)
    assert s["per_request"][0]["error"] == "server reported an error: The server is out of KV cache (after 0 tokens)"


@pytest.mark.parametrize("piece", [0, 5])
def test_openai_usage_per_chunk_counts_exactly(server: Server, piece: int) -> None:
    events = [OK_HEAD]
    for i in range(1, 21):
        usage = {"prompt_tokens": 5, "completion_tokens": 2 * i, "total_tokens": 5 + 2 * i}
        events.append(chunk(json.dumps({"choices": [{"index": 0, "text": "ab"}], "usage": usage}).encode()))
    usage = {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45}
    events += [chunk(json.dumps({"choices": [], "usage": usage}).encode()), chunk(b"[DONE]"), b"0\r\n\r\n"]
    server.answer, server.piece = b"".join(events), piece
    s = run(server, n=2, max_tokens=40, endpoint="completions", concurrency=2)
    assert s["valid"], s["invalid_reason"]
    assert s["tokens"] == 80 and s["multi_token_chunks"] == 40
    assert s["token_source"] == "usage (per chunk)" and s["prompt_tokens"] == 5


def test_live_progress_counts_the_tokens_of_the_run_in_flight(server: Server) -> None:
    server.answer, server.piece = generate_answer(30), 0
    stream._LIVE.update(active=0.0, tokens=0.0, started=0.0)
    s = run(server, n=3, max_tokens=30)
    assert s["valid"] and stream._LIVE["tokens"] == 90 and runner.live()["active"] == 0.0
