"""The in-place HTTP/SSE parser and the /generate tail reader: adversarial text, splits at every byte, bad framing."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.client.streamparse import BadAnswer, EventStream, generate_count

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(
    text: str,
    count: Any,
    *,
    final: bool = False,
    compact: bool = True,
    ascii_only: bool = False,
    **meta: Any,
) -> bytes:
    """A /generate payload laid out as SGLang writes it (orjson: compact, raw UTF-8) or as json.dumps does."""
    info = {
        "id": "b2f7c1d0",
        "finish_reason": {"type": "length", "length": count} if final else None,
        "prompt_tokens": 7,
        "weight_version": "default",
        "completion_tokens": count,
        "cached_tokens": 0,
        **meta,
    }
    obj = {"text": text, "output_ids": list(range(3)), "meta_info": info}
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(obj, separators=separators, ensure_ascii=ascii_only).encode()


def count(payload: bytes) -> bytes | None:
    return generate_count(payload, 0, len(payload))


# ------------------------------------------------------------------ the /generate tail


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize(
    "text",
    [
        "plain words",
        '", "meta_info": {"completion_tokens": 999, "finish_reason": null}}',  # text that looks like the tail
        '"meta_info":{"completion_tokens":999,"finish_reason":null}}',
        'he said \\"hi\\" and left a backslash \\',  # escaped quotes and a trailing backslash
        "naïve 数学 🚀 \u2028 \x00 \ufeff",  # unicode, raw or escaped
        "}}}}{{{ unbalanced braces ]]]",
        "",
    ],
)
def test_the_count_comes_from_meta_info_whatever_the_text(text: str, compact: bool, ascii_only: bool) -> None:
    payload = event(text, 1234, compact=compact, ascii_only=ascii_only)
    assert count(payload) == b"1234"
    assert json.loads(payload)["meta_info"]["completion_tokens"] == 1234  # the same answer as a full parse


def test_the_count_is_read_in_place_inside_a_larger_buffer() -> None:
    payload = event("x" * 100, 42)
    buf = bytearray(b"junk" + payload + b'{"completion_tokens": 7}')
    assert generate_count(buf, 4, 4 + len(payload)) == b"42"


@pytest.mark.parametrize(
    "payload",
    [
        event("x", 5, final=True),  # the final event: parsed whole, for its spec counters
        event("x", 5, final=True, spec_verify_ct=2, spec_accept_length=2.5),
        b'{"error": {"message": "out of memory"}}',
        b"[DONE]",
        event("x", 5)[:-1],  # cut short
        event("x", 5) + b" ",  # trailing bytes after the object
        event("x", 5)[:-1] + b',"extra":{"completion_tokens":9}}',  # a second count after meta_info
        # meta_info nested one level down: the tail closes two braces more than it opens
        event("x", 5)[:-1] + b',"x":{"meta_info":{"completion_tokens":999,"finish_reason":null}}}',
        b'{"text":"x","meta_info":{"finish_reason":null}}',  # no count at all
        b'{"text":"x","meta_info":{"completion_tokens":3,"finish_reason":"stop"}}',
        b'{"text":"x","meta_info" : {"completion_tokens":3,"finish_reason":null}}',  # an unusual spacing
        b"",
    ],
)
def test_whatever_the_tail_cannot_vouch_for_is_left_to_a_full_parse(payload: bytes) -> None:
    assert count(payload) is None


@pytest.mark.parametrize(("value", "raw"), [(10**18, b"1000000000000000000"), (1e18, b"1e+18"), (-5, b"-5")])
def test_odd_counts_are_handed_on_whole_for_the_caller_to_refuse(value: Any, raw: bytes) -> None:
    assert count(event("x", value)) == raw


def test_incremental_streaming_output_events_are_read_the_same_way() -> None:
    """SGLang's --incremental-streaming-output sends only the new text and ids; completion_tokens stays cumulative."""
    payloads = [event(f" w{i}", i) for i in range(1, 5)]
    assert [count(p) for p in payloads] == [b"1", b"2", b"3", b"4"]


# ------------------------------------------------------------------ HTTP framing and SSE events


def chunked(*payloads: bytes, terminal: bool = True) -> bytes:
    body = b""
    for p in payloads:
        piece = b"data: " + p + b"\n\n"
        body += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return HEAD + body + (b"0\r\n\r\n" if terminal else b"")


class Collector:
    def __init__(self, limit: int = 1 << 20) -> None:
        self.events: list[bytes] = []
        self.parser = EventStream(self.on_data, limit)

    def on_data(self, buf: bytes | bytearray, start: int, end: int) -> None:
        self.events.append(bytes(buf[start:end]))

    def feed_through_one_buffer(self, stream: bytes, cuts: list[int]) -> None:
        """Feed the stream cut at these offsets, every piece read into the same (reused, then scribbled) buffer."""
        buf = bytearray(len(stream) + 1)
        bounds = [0, *sorted(set(cuts)), len(stream)]
        for a, b in itertools.pairwise(bounds):
            if a == b:
                continue
            buf[: b - a] = stream[a:b]
            self.parser.feed(buf, b - a)
            buf[:] = b"\xff" * len(buf)  # whatever the parser kept of this read must have been copied


PAYLOADS = [event("a" * 300, 1), event("é" * 50, 2), event("x", 3, final=True), b"[DONE]"]


def test_a_whole_answer_gives_every_payload() -> None:
    c = Collector()
    c.parser.feed(chunked(*PAYLOADS))
    assert c.events == PAYLOADS and c.parser.status == 200 and c.parser.ended


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(chunked(*PAYLOADS))), max_size=12))
def test_any_split_into_reads_gives_the_same_payloads(cuts: list[int]) -> None:
    c = Collector()
    c.feed_through_one_buffer(chunked(*PAYLOADS), cuts)
    assert c.events == PAYLOADS and c.parser.ended


def test_a_split_at_every_single_byte_gives_the_same_payloads() -> None:
    stream = chunked(*PAYLOADS)
    c = Collector()
    c.feed_through_one_buffer(stream, list(range(len(stream))))
    assert c.events == PAYLOADS


def test_sse_details_line_ends_multi_line_data_comments_and_extensions() -> None:
    body = (
        b": a comment\r\n"
        b"event: message\r\ndata:no-space\r\n\r\n"  # CRLF line ends, no space after the colon
        b"data: first\ndata: second\n\n"  # two data lines: one payload joined with \n
        b"id: 7\n\n"  # an event without data: nothing
        b"data: last\n\n"
    )
    stream = HEAD + f"{len(body):x};name=value\r\n".encode() + body + b"\r\n0\r\n\r\n"
    for cuts in ([], list(range(len(stream)))):
        c = Collector()
        c.feed_through_one_buffer(stream, cuts)
        assert c.events == [b"no-space", b"first\nsecond", b"last"]


def test_an_answer_without_chunking_is_read_to_its_end() -> None:
    c = Collector()
    c.parser.feed(b"HTTP/1.1 200 OK\n\ndata: one\n\ndata: two\n\n")
    assert c.events == [b"one", b"two"] and not c.parser.ended


def test_stop_reads_no_further() -> None:
    c = Collector()
    c.parser.on_data = lambda buf, a, b: (c.events.append(bytes(buf[a:b])), c.parser.stop())  # type: ignore[assignment]
    c.parser.feed(chunked(b"[DONE]", b"after"))
    assert c.events == [b"[DONE]"]


def test_a_refusal_keeps_its_status_and_the_start_of_its_body() -> None:
    c = Collector()
    c.parser.feed(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\n")
    assert c.parser.status == 503 and c.parser.error_body == b""
    c.parser.feed(b"too busy" + b"!" * 5000)
    assert c.parser.error_body.startswith(b"too busy") and len(c.parser.error_body) == 2000


@pytest.mark.parametrize("answer", [b"", b"garbage", b"HTTP/1.1 2000 OK", b"HTTP/1.1 OK"])
def test_not_http_leaves_status_zero(answer: bytes) -> None:
    c = Collector()
    c.parser.feed(answer)
    c.parser.eof()  # the head is read as it stands when the server hangs up
    assert c.parser.status == 0 and c.parser.status_line == answer


def test_a_connection_lost_inside_a_chunk_is_told_apart() -> None:
    c = Collector()
    c.parser.feed(chunked(PAYLOADS[0], terminal=False)[:-20])
    assert c.parser.cut_mid_chunk
    c = Collector()
    c.parser.feed(chunked(PAYLOADS[0], terminal=False))
    assert not c.parser.cut_mid_chunk


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (HEAD + b"ffffffffffff\r\n", "server announced a chunk of"),
        (HEAD + b"-5\r\n", "server announced a chunk of -5 bytes"),
        (HEAD + b"1" * 5000, "chunk-size line longer than"),
        (b"HTTP/1.1 200 OK\r\n\r\ndata: " + b"x" * 2000, "server sent an event longer than 1024 bytes"),
        (b"HTTP/1.1 200 OK\r\n\r\n" + b"data: x\n" * 1000, "server sent an event longer than 1024 bytes"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000, "HTTP head longer than"),
    ],
)
def test_absurd_sizes_are_refused(stream: bytes, message: str) -> None:
    c = Collector(limit=1024 if b"event" in message.encode() else 1 << 40)
    with pytest.raises(BadAnswer, match=message):
        c.feed_through_one_buffer(stream, list(range(0, len(stream), 512)))


def test_a_chunk_size_that_is_not_hexadecimal_is_unreadable() -> None:
    c = Collector()
    with pytest.raises(ValueError, match="invalid literal"):
        c.parser.feed(HEAD + b"zz\r\n")
