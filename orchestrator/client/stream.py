"""One streamed request: its connection, parsed in the event loop's read callback, and its guard against stalls."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from typing import Any, cast

from orchestrator.client.request import (
    KEEP_OUTPUT,
    MAX_EVENT_BYTES,
    MAX_PROMPT_TOKENS,
    Record,
    Wire,
    body_temperature,
    chunk_text,
    completion_tokens,
    count_openai_chunk,
    token_limit,
    whole_count,
)
from orchestrator.client.streamparse import BadAnswer, EventStream, generate_count
from orchestrator.common.printable import visible

# How long an error answer's body may lag its head before the status is reported without it.
ERROR_BODY_WAIT_S = 2.0

# The run in flight in this process, for live progress (read from another thread; plain floats, no lock needed).
_LIVE: dict[str, float] = {"active": 0.0, "tokens": 0.0, "started": 0.0}


def live_begin() -> None:
    """Mark a run in flight here from now on, with no tokens yet (what live() reports)."""
    _LIVE.update(active=1.0, tokens=0.0, started=time.monotonic())


def live_end() -> None:
    """Mark the run in flight here as ended: live() reports it inactive."""
    _LIVE["active"] = 0.0


def live() -> dict[str, float]:
    """Output tokens received so far by the run in flight here, and for how long it has run."""
    active = _LIVE["active"]
    return {
        "active": active,
        "tokens": _LIVE["tokens"],
        "elapsed": time.monotonic() - _LIVE["started"] if active else 0.0,
    }


class Guard:
    """Cancels one request's stream when it stalls, misses its first token, runs past its timeout or is aborted.

    One timer per request, re-armed only when it fires: checking progress costs nothing per token.
    """

    def __init__(
        self,
        task: asyncio.Task[None],
        rec: Record,
        t0: float,
        *,
        timeout: float,
        stall_s: float,
        first_token_s: float,
    ) -> None:
        self.task, self.rec, self.t0 = task, rec, t0
        self.timeout, self.stall_s, self.first_token_s = timeout, stall_s, first_token_s
        self.reason: str | None = None
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self.check)

    def check(self) -> None:
        rec = self.rec
        now = time.perf_counter() - self.t0
        # The server's deadlines run from when the request was sent: time an open-loop request waited in the client
        # is the client's, not a stall of the server's.
        began = rec.sent if rec.sent is not None else rec.start
        if rec.arrivals:
            deadline = rec.arrivals[-1][0] + self.stall_s
            why = f"stalled: no token for {self.stall_s:g}s after {rec.tokens} tokens"
        else:
            deadline = began + self.first_token_s
            why = f"stalled: no first token within {self.first_token_s:g}s"
        if began + self.timeout < deadline:
            deadline, why = began + self.timeout, f"timed out after {self.timeout:.0f}s with {rec.tokens} tokens"
        if now >= deadline:
            self.stop(why)
            return
        # A stall deadline only moves later as tokens arrive, except for the first token, which may bring it
        # forward (stall_s < first_token_s): until then look again within stall_s.
        wake = deadline if rec.arrivals else min(deadline, now + self.stall_s)
        self._handle = self._loop.call_later(wake - now, self.check)

    def stop(self, reason: str) -> None:
        if self.reason is None and not self.task.done():
            self.reason = reason
            self.task.cancel()

    def close(self) -> None:
        self._handle.cancel()


def _describe(exc: BaseException, rec: Record) -> str:
    """A request's error from what ended its stream: what the server did wrong, and how far it got."""
    if isinstance(exc, BadAnswer):
        return f"{visible(str(exc))} (after {rec.tokens} tokens)"  # it may quote the server (its error event)
    if isinstance(exc, asyncio.IncompleteReadError):
        return f"the connection closed mid-chunk after {rec.tokens} tokens"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc} after {rec.tokens} tokens"
    # Anything else came from parsing what the server sent (bad JSON, wrong types, absurd sizes): its text may quote
    # the server's, so it is one field.
    return (
        f"unreadable answer from the server ({type(exc).__name__}: {visible(str(exc)[:200])}) after {rec.tokens} tokens"
    )


def check_bounds(**bounds: float) -> None:
    """Each named bound (seconds) must be finite and positive."""
    for name, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number of seconds above 0, not {value!r}")


async def fetch(
    host: str,
    port: int,
    wire: Wire,
    body: dict[str, Any],
    rec: Record,
    t0: float,
    timeout: float,
    *,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    guards: set[Guard] | None = None,
) -> None:
    """Stream one request, filling rec; errors are recorded on rec, never raised.

    The request fails when no token arrives for stall_s (a server whose worker died keeps its socket open and goes
    silent), when the first token takes longer than first_token_s, or after timeout in all. `guards` collects the
    request's guard while it runs, so the run can abort it.
    """
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s)
    if KEEP_OUTPUT in body:
        body = {k: v for k, v in body.items() if k != KEEP_OUTPUT}  # the client's own key: never sent
        rec.output, rec.temperature = [], body_temperature(body)
    text_chunks: list[int] = []
    streams: list[asyncio.BaseTransport] = []
    inner = asyncio.get_running_loop().create_task(_stream(host, port, wire, body, rec, t0, streams, text_chunks))
    guard = Guard(inner, rec, t0, timeout=timeout, stall_s=stall_s, first_token_s=first_token_s)
    if guards is not None:
        guards.add(guard)
    try:
        try:
            # asyncio.wait, not await: a cancellation of this request by its guard must not look like (or swallow)
            # a cancellation of the whole run by Ctrl-C.
            await asyncio.wait({inner})
        except asyncio.CancelledError:
            inner.cancel()
            raise
        if inner.cancelled():
            rec.error = guard.reason or f"cancelled after {rec.tokens} tokens"
        elif (exc := inner.exception()) is not None:
            rec.error = _describe(exc, rec)
    finally:
        guard.close()
        if guards is not None:
            guards.discard(guard)
        for w in streams:
            w.close()
    if rec.error is None and rec.first is None:
        # Left unflagged, a request without a single token would be neither measured nor counted as failed.
        rec.error = "the server finished the stream without sending a token"
    if rec.error is not None:
        return
    if text_chunks and rec.chunks and rec.reported_tokens and rec.reported_tokens != rec.tokens:
        # Only the final usage told the true count: spread it evenly over the content chunks, and say so.
        scale = rec.reported_tokens / rec.tokens
        rec.arrivals = [(t, k * scale) for t, k in rec.arrivals]
        rec.tokens = rec.reported_tokens
        rec.token_source = "usage (final chunk only: per-chunk counts estimated)"
    elif text_chunks and not rec.reported_tokens:
        rec.token_source = "chunks (no usage from the server: 1 chunk counted as 1 token)"


async def _stream(
    host: str,
    port: int,
    wire: Wire,
    body: dict[str, Any],
    rec: Record,
    t0: float,
    streams: list[asyncio.BaseTransport],
    text_chunks: list[int],
) -> None:
    payload = json.dumps(body).encode()
    request = (
        f"POST {wire.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    loop = asyncio.get_running_loop()
    exchange = _Exchange(request, rec, t0, wire.stream == "openai", text_chunks, loop.create_future())
    transport, _ = await loop.create_connection(lambda: exchange, host, port)
    streams.append(transport)
    await exchange.finished
    exchange.conclude()


class _Exchange(asyncio.BufferedProtocol):
    """One streamed request on its own connection, parsed inside the event loop's read callback: a read costs no
    task wake-up and takes one timestamp, shared by every event it brought. `finished` resolves at [DONE], at the end
    of the connection or at the first thing the server got wrong (its exception)."""

    def __init__(
        self,
        request: bytes,
        rec: Record,
        t0: float,
        openai: bool,
        text_chunks: list[int],
        finished: asyncio.Future[None],
    ) -> None:
        self.request, self.rec, self.t0 = request, rec, t0
        self.text_chunks = text_chunks
        self.finished = finished
        self.parser = EventStream(self._openai if openai else self._generate, MAX_EVENT_BYTES)
        self.transport: asyncio.Transport | None = None
        self.now = 0.0
        self.done = False  # [DONE] came
        self.final_meta: dict[str, Any] | None = None
        self.limit = token_limit(rec.max_tokens)
        self.buffer, self.view = _read_buffer()
        self.error_wait: asyncio.TimerHandle | None = None  # reports an error answer whose body never comes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        if self.finished.done():
            return
        self.now = time.perf_counter() - self.t0
        parser = self.parser
        try:
            parser.feed(self.buffer, nbytes)
        except Exception as e:  # what the server sent cannot be read: the request fails with why
            self._end(e)
            return
        if self.done or parser.ended:
            self._end(None)
        elif parser.error_body or parser.error_complete:
            self._refused()
        elif parser.status not in (0, 200) and self.error_wait is None:
            # An error head whose body may still come (no length, or it lags the head): a server that holds the
            # connection open must not turn it into a first-token stall.
            self.error_wait = asyncio.get_running_loop().call_later(ERROR_BODY_WAIT_S, self._refused)

    def eof_received(self) -> bool:
        return False  # close: the answer is complete

    def connection_lost(self, exc: Exception | None) -> None:
        if self.finished.done():
            return
        parser = self.parser
        try:
            parser.eof()
        except Exception as e:
            self._end(e)
            return
        if parser.status not in (0, 200):
            self._refused()
        elif exc is not None:
            self._end(exc)
        elif parser.status == 0:
            self._refused()
        elif parser.cut_mid_chunk:
            self._end(asyncio.IncompleteReadError(b"", None))
        else:
            self._end(None)

    def _refused(self) -> None:
        if self.finished.done():
            return
        parser = self.parser
        if parser.status:
            # The reason phrase too: of an empty answer it is all there is to read (307 Temporary Redirect).
            reason = parser.status_line.split(None, 2)[2:]
            what = f"HTTP {parser.status}" + (f" {visible(reason[0].decode(errors='replace')[:60])}" if reason else "")
        else:
            what = f"not an HTTP answer ({parser.status_line[:60]!r})"
        # The server's words, quoted in an error that is printed, stored and shown in reports: one field on one line
        # (a pretty-printed JSON body keeps its newlines as \n; an escape sequence in it is shown, not obeyed).
        body = visible(parser.error_body.decode(errors="replace").strip()[:300])
        self.rec.error = f"{what}: {body}" if body else f"{what} (no body)"
        self._end(None)

    def _end(self, exc: BaseException | None) -> None:
        if self.error_wait is not None:
            self.error_wait.cancel()
        if self.finished.done():
            return
        if exc is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _count(self, added: int) -> None:
        rec = self.rec
        if added > 0:
            if rec.first is None:
                rec.first = self.now
            rec.tokens += added
            _LIVE["tokens"] += added
            rec.arrivals.append((self.now, added))
            rec.chunks += 1
        rec.end = self.now

    def _generate(self, buf: bytes | bytearray, start: int, end: int) -> None:
        """One /generate event: its count from the tail (see streamparse.generate_count), else the whole event."""
        rec = self.rec
        value = generate_count(buf, start, end)
        if value is not None and value.isdigit() and len(value) < 19:
            count = int(value)
            if count <= self.limit:
                self._count(count - rec.tokens)
                return
        if value is None:
            if self._is_done(buf, start, end):
                return
            event = _loads(buf, start, end)
            if isinstance(event, dict) and "meta_info" not in event and isinstance(event.get("error"), dict):
                raise BadAnswer(f"server reported an error: {str(event['error'].get('message'))[:300]}")
            # The final event (or an unusual one): its meta_info from the whole event.
            self.final_meta = _meta_info(event)
            if rec.output is not None:
                self._keep_generated(event)
            value = self.final_meta.get("completion_tokens", rec.tokens)
        self._count(completion_tokens(value, rec) - rec.tokens)

    def _openai(self, buf: bytes | bytearray, start: int, end: int) -> None:
        if self._is_done(buf, start, end):
            return
        event = _loads(buf, start, end)
        rec = self.rec
        # The usual chunk of a server sending usage with every chunk, checked as count_openai_chunk would check it.
        if type(event) is dict and "timings" not in event:
            usage, choices = event.get("usage"), event.get("choices")
            if type(usage) is dict and type(choices) is list and choices and type(choices[0]) is dict:
                total, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
                if (
                    type(total) is int
                    and 0 <= total <= self.limit
                    and type(prompt) is int
                    and 0 <= prompt <= MAX_PROMPT_TOKENS
                ):
                    rec.prompt_tokens = prompt
                    rec.token_source = "usage (per chunk)"
                    if rec.output is not None and (text := chunk_text(choices[0])):
                        rec.output.append(str(text))
                    self._count(total - rec.tokens)
                    return
        self._count(count_openai_chunk(event, rec, self.text_chunks))

    def _keep_generated(self, event: dict[str, Any]) -> None:
        """The whole output of a /generate request from its final event (text and output_ids so far, as SGLang and
        the simulator send them): kept for --check-outputs."""
        rec = self.rec
        text, ids = event.get("text"), event.get("output_ids")
        rec.output = [text] if isinstance(text, str) else []
        if isinstance(ids, list) and len(ids) <= self.limit and all(type(i) is int for i in ids):
            rec.output_ids = ids

    def _is_done(self, buf: bytes | bytearray, start: int, end: int) -> bool:
        if end - start <= 16 and buf[start:end].strip() == b"[DONE]":
            self.done = True
            self.parser.stop()
            return True
        return False

    def conclude(self) -> None:
        """After the stream: what only its end tells (the error of a cut stream, the accept length)."""
        rec = self.rec
        if rec.error is not None:
            return
        if not self.done:
            rec.error = f"the stream ended without [DONE] after {rec.tokens} tokens"
        if rec.accepted is not None and rec.tokens > rec.accepted:
            # Every target forward pass yields one token of its own plus the drafts it accepted.
            rec.verify_ct = rec.tokens - rec.accepted
            rec.accept_length = rec.tokens / rec.verify_ct
        meta = self.final_meta
        if meta is not None:
            rec.prompt_tokens = whole_count(meta.get("prompt_tokens", 0), "prompt_tokens", MAX_PROMPT_TOKENS)
            if meta.get("cached_tokens") is not None:
                rec.cached_tokens = whole_count(meta["cached_tokens"], "cached_tokens", MAX_PROMPT_TOKENS)
            if meta.get("spec_verify_ct"):
                rec.verify_ct = whole_count(meta["spec_verify_ct"], "spec_verify_ct", max(rec.tokens, 1))
                accept = meta.get("spec_accept_length")
                if accept is None or accept == 0:
                    rec.accept_length = rec.tokens / rec.verify_ct if rec.verify_ct else None
                elif (
                    isinstance(accept, int | float)
                    and not isinstance(accept, bool)
                    and math.isfinite(accept)
                    and 0 < accept <= token_limit(rec.max_tokens)
                ):
                    rec.accept_length = float(accept)
                else:
                    raise BadAnswer(
                        f"server sent spec_accept_length={json.dumps(accept, default=str)[:40]}, not a plausible length"
                    )


_RAW_DECODE = json.JSONDecoder().raw_decode
_THREAD = threading.local()
READ_BUFFER_BYTES = 256 * 1024  # asyncio's own read size


def _read_buffer() -> tuple[bytearray, memoryview]:
    """The buffer every connection of this thread's event loop reads into. One is enough: a read is parsed before
    the loop reads again, and the parser keeps nothing of it. Reading into it saves what asyncio's plain read costs:
    a fresh 256 KiB bytes object per read, which glibc maps and unmaps every time (~8 µs of a ~12 µs read)."""
    shared: tuple[bytearray, memoryview] | None = getattr(_THREAD, "buffer", None)
    if shared is None:
        buffer = bytearray(READ_BUFFER_BYTES)
        shared = _THREAD.buffer = (buffer, memoryview(buffer))
    return shared


def _loads(buf: bytes | bytearray, start: int, end: int) -> Any:
    """json.loads(buf[start:end]) without its per-call detours (encoding detection, the whitespace regexes)."""
    text = buf[start:end].decode()
    try:
        value, stop = _RAW_DECODE(text)
    except ValueError:
        return json.loads(text)  # leading whitespace is fine; anything else raises json's own error
    if stop != len(text) and not text[stop:].isspace():
        return json.loads(text)  # raises "Extra data"
    return value


def _meta_info(event: Any) -> dict[str, Any]:
    """A /generate event's meta_info, checked to be an object."""
    if not isinstance(event, dict):
        raise BadAnswer(f"server sent a JSON {type(event).__name__} where an object was expected")
    meta = event.get("meta_info") or {}
    if not isinstance(meta, dict):
        raise BadAnswer(f"server sent meta_info of type {type(meta).__name__}, not an object")
    return meta
