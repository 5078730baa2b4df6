"""Incremental HTTP/1.1 and server-sent-events decoding for the benchmark client, in place: nothing skipped is copied.

Shipped to hosts with the client (stdlib only). A payload is handed on as (buffer, start, end), a slice of the bytes
one socket read returned, so an event costs a few index searches however long it is. That matters for SGLang's native
`/generate` stream, where every event repeats all text and token ids so far (about 1 GB at 64 streams x 2048 tokens).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# What a socket read filled; one SSE data payload is handed on as buffer[start:end].
Buffer = bytes | bytearray
OnData = Callable[[Buffer, int, int], None]

HEAD_LIMIT = 64 * 1024  # an HTTP response head longer than this is not from an inference server
SIZE_LINE_LIMIT = 4096
ERROR_BODY_LIMIT = 2000  # how much of a non-200 answer is kept for the error message

HEAD, SIZE, BODY, RAW, ERROR, END = range(6)


class BadAnswer(ValueError):
    """The server answered something the client cannot believe; the request fails with this message."""


class EventStream:
    """One HTTP response, fed as it arrives: parses the head, undoes chunked framing, splits SSE events and calls
    on_data with each event's data payload (several `data:` lines joined with a newline, as the SSE spec says).

    feed() takes the buffer a socket read filled and may be handed the same buffer again for the next read: nothing
    of it is kept once feed returns (a payload is valid only during its on_data call). `status` is 0 until the head
    is complete (and stays 0 for an answer that is not HTTP); a non-200 answer's first bytes go to `error_body`
    instead (`error_complete` says when it has all come). `ended` turns true at the terminal chunk; `cut_mid_chunk`
    tells a connection lost inside a chunk from one lost between chunks.
    """

    def __init__(self, on_data: OnData, limit: int) -> None:
        self.on_data = on_data
        self.limit = limit
        self.state = HEAD
        self.status = 0
        self.status_line = b""
        self.error_body = b""
        self.content_length: int | None = None  # the head's Content-Length, when it has a plain one
        self.ended = False
        self._head = b""
        self._left = 0  # bytes left in the current chunk
        self._size_line = b""  # a chunk-size line cut by the end of a read
        self._line: list[bytes] = []  # an SSE line cut by the end of a read (usually a long event)
        self._line_len = 0
        self._data: tuple[Buffer, int, int] | None = None  # the data of the event being read
        self._parts: list[bytes] = []  # ... when it came in several data lines
        self._parts_len = 0

    @property
    def cut_mid_chunk(self) -> bool:
        return self.state == BODY

    @property
    def error_complete(self) -> bool:
        """A non-200 answer whose body (as much of it as is kept) has all come: nothing more to wait for, even from a
        server that keeps the connection open (an empty `Content-Length: 0` body, a 204 or 304 never has one)."""
        if self.state != ERROR:
            return False
        if self.status in (204, 304):
            return True
        return self.content_length is not None and len(self.error_body) >= min(self.content_length, ERROR_BODY_LIMIT)

    def feed(self, buf: Buffer, end: int | None = None) -> None:
        """What one read put into buf[:end] (all of buf by default)."""
        if end is None:
            end = len(buf)
        state = self.state
        if state in (BODY, SIZE):  # the usual case, tested first
            self._chunks(buf, 0, end)
        elif state == RAW:
            self._sse(buf, 0, end)
        elif state == HEAD:
            self._read_head(bytes(buf[:end]))
        elif state == ERROR:
            self.error_body += bytes(buf[: min(end, ERROR_BODY_LIMIT - len(self.error_body))])
            return
        data = self._data
        if data is not None and data[0] is buf:  # an event whose blank line has not come yet: keep a copy
            self._data = (bytes(buf[data[1] : data[2]]), 0, data[2] - data[1])

    def eof(self) -> None:
        """The server closed the connection: a head it never finished is read as it stands."""
        if self.state == HEAD:
            self._start(self._head, b"")

    def stop(self) -> None:
        """Read no further (the stream said [DONE])."""
        self.state = END

    def _read_head(self, data: bytes) -> None:
        head = self._head + data if self._head else data
        # The head ends at its first empty line; \n alone is tolerated as a line end.
        end, gap = head.find(b"\r\n\r\n"), 4
        bare = head.find(b"\n\n")
        if bare >= 0 and (end < 0 or bare < end):
            end, gap = bare, 2
        if end < 0:
            if len(head) > HEAD_LIMIT:
                raise BadAnswer(f"server sent an HTTP head longer than {HEAD_LIMIT} bytes")
            self._head = head
            return
        self._head = b""
        self._start(head[:end], head[end + gap :])

    def _start(self, head: bytes, rest: bytes) -> None:
        lines = head.replace(b"\r\n", b"\n").split(b"\n")
        self.status_line = lines[0]
        parts = lines[0].split()
        if len(parts) >= 2 and parts[1].isdigit() and len(parts[1]) == 3:
            self.status = int(parts[1])
        headers = [
            (name.strip().lower(), value.strip()) for name, _, value in (line.partition(b":") for line in lines[1:])
        ]
        chunked = any(name == b"transfer-encoding" and b"chunked" in value.lower() for name, value in headers)
        length = next((value for name, value in headers if name == b"content-length"), None)
        self.content_length = int(length) if length is not None and length.isdigit() and len(length) < 19 else None
        if self.status != 200:
            self.state = ERROR
            self.error_body = rest[:ERROR_BODY_LIMIT]
        elif chunked:
            self.state = SIZE
            self._chunks(rest, 0, len(rest))
        else:
            self.state = RAW  # read to the end of the connection
            self._sse(rest, 0, len(rest))

    def _chunks(self, buf: Buffer, pos: int, end: int) -> None:
        while pos < end:
            if self.state == BODY:
                take = min(self._left, end - pos)
                self._sse(buf, pos, pos + take)
                if self.state == END:
                    return
                pos += take
                self._left -= take
                if self._left == 0:
                    self.state = SIZE
                continue
            if self.state != SIZE:
                return  # the terminal chunk came: whatever follows (trailers) is not read
            nl = buf.find(b"\n", pos, end)
            if nl < 0:
                self._size_line += buf[pos:end]
                if len(self._size_line) > SIZE_LINE_LIMIT:
                    raise BadAnswer(f"server sent a chunk-size line longer than {SIZE_LINE_LIMIT} bytes")
                return
            line: Buffer
            if self._size_line:
                line = self._size_line + buf[pos:nl]
                self._size_line = b""
            elif nl == pos or (nl == pos + 1 and buf[pos] == 13):
                pos = nl + 1
                continue  # the line end after a chunk's data
            else:
                line = buf[pos:nl]
            pos = nl + 1
            try:
                size = int(line, 16)  # int() ignores the surrounding whitespace and \r
            except ValueError:
                text = line.split(b";")[0].strip()  # a chunk extension, or a blank line
                if not text:
                    continue
                size = int(text, 16)  # not hexadecimal: ValueError, an unreadable answer
            if size == 0:
                self.state = END
                self.ended = True
                return
            if size < 0 or size > self.limit:
                raise BadAnswer(f"server announced a chunk of {size} bytes")
            self._left = size
            self.state = BODY

    def _sse(self, buf: Buffer, pos: int, end: int) -> None:
        find = buf.find
        while pos < end:
            nl = find(b"\n", pos, end)
            if nl < 0:
                self._line.append(bytes(buf[pos:end]))
                self._line_len += end - pos
                if self._line_len > self.limit:
                    raise BadAnswer(f"server sent an event longer than {self.limit} bytes")
                return
            if self._line:
                self._line.append(bytes(buf[pos:nl]))
                line = b"".join(self._line)
                self._line.clear()
                self._line_len = 0
                self._take(line, 0, len(line))
            elif (nl == pos or (nl == pos + 1 and buf[pos] == 13)) and self._data is not None:
                data, self._data = self._data, None  # a blank line ends the event
                self.on_data(*data)
            else:
                self._take(buf, pos, nl)
            pos = nl + 1
            if self.state == END:
                return

    def _take(self, buf: Buffer, start: int, end: int) -> None:
        """One SSE line, buf[start:end] without its \n."""
        if end > start and buf[end - 1] == 13:  # \r
            end -= 1
        if start == end:  # a blank line ends the event
            if self._parts:
                joined = b"\n".join(self._parts)
                self._parts, self._parts_len = [], 0
                self.on_data(joined, 0, len(joined))
            elif self._data is not None:
                data, self._data = self._data, None
                self.on_data(*data)
            return
        if buf.startswith(b"data:", start, end):
            start += 6 if end > start + 5 and buf[start + 5] == 32 else 5
            if self._data is None and not self._parts:
                self._data = (buf, start, end)
                return
            if self._data is not None:  # a second data line: the payload is their lines joined
                prev, a, b = self._data
                self._parts, self._parts_len, self._data = [bytes(prev[a:b])], b - a, None
            self._parts.append(bytes(buf[start:end]))
            self._parts_len += 1 + end - start
            if self._parts_len > self.limit:
                raise BadAnswer(f"server sent an event longer than {self.limit} bytes")
        # Other fields (event:, id:, retry:) and comments (":") say nothing orch measures.


# ---------------------------------------------------------------- SGLang's /generate events

META_KEY = b'"meta_info":'
# The value is captured up to the next delimiter, not as digits only: `1e18` or `-5` must be seen whole and refused,
# not read as 1 or 5.
COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*([^,}\]\s]+)')
FINISH_NULL = re.compile(rb'"finish_reason"\s*:\s*null')


def generate_count(buf: Buffer, start: int, end: int) -> bytes | None:
    """completion_tokens of an unfinished /generate event, read from its tail alone; None when the tail cannot vouch
    for it (the final event, an error, any unexpected shape), and the caller parses the whole event instead.

    SGLang writes `{"text": ..., "output_ids": [...], "meta_info": {...}}`, meta_info last (its tokenizer manager
    builds the dict in that order; orjson keeps it), and the simulator does the same. The last `"meta_info":` is
    that key: inside a JSON string every quote is escaped, so generated text can never contain the raw bytes
    `"meta_info":`, nor `"completion_tokens"` followed by a colon. The tail must close exactly one brace more than it
    opens (the key sits in the outermost object, not in a nested one), the count must occur exactly once in it and
    finish_reason must be null there, or this returns None. (These checks keep out layouts a real server might
    adopt; a server can always lie in its top-level counts, which is why the counts are bounded by the caller.)
    """
    if end - start < 16 or buf[end - 1] != 125:  # }
        return None
    key = buf.rfind(META_KEY, start, end)
    if key < 0 or buf.count(b"}", key, end) - buf.count(b"{", key, end) != 1:
        return None
    counts = COMPLETION_TOKENS.findall(buf, key, end)
    if len(counts) != 1 or FINISH_NULL.search(buf, key, end) is None:
        return None
    return bytes(counts[0])
