"""The benchmark client: stdlib-only asyncio HTTP/1.1 streaming, shipped to hosts with the agent.

It runs next to the server (through the host-side agent) by default, or on the orch machine (`--client local`).
Token accounting is per token, not per chunk: under speculative decoding one stream chunk carries several tokens,
and a chunk of k tokens after a gap g contributes k inter-token latencies of g/k. Each read is parsed where it lands
(`streamparse`), with one timestamp for every event it brought; see docs/client.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from orchestrator.streamparse import BadAnswer, EventStream, generate_count

ENDPOINTS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


# A server's numbers are checked before they are used: a token count drives per-token lists, so a lying server
# (`completion_tokens: 1e18`) would otherwise exhaust memory. Speculative decoding may overshoot max_tokens by a
# few draft tokens; more than this slack is a lie.
def token_limit(max_tokens: int) -> int:
    """The most tokens a request for max_tokens may plausibly report."""
    return max_tokens + 16 + max_tokens // 8


# No SSE event (and no chunk) orch needs is this large; a server sending one is broken or hostile.
MAX_EVENT_BYTES = 64 * 1024 * 1024
# Prompt token counts above this are not believed (no model has such a context).
MAX_PROMPT_TOKENS = 1 << 31


# The run in flight in this process, for live progress (read from another thread; plain floats, no lock needed).
_LIVE: dict[str, float] = {"active": 0.0, "tokens": 0.0, "started": 0.0}


def live() -> dict[str, float]:
    """Output tokens received so far by the run in flight here, and for how long it has run."""
    active = _LIVE["active"]
    return {
        "active": active,
        "tokens": _LIVE["tokens"],
        "elapsed": time.monotonic() - _LIVE["started"] if active else 0.0,
    }


def _whole(value: Any, what: str, limit: int) -> int:
    """value as a whole number in [0, limit]; BadAnswer naming what the server sent otherwise."""
    raw, value = value, _from_bytes(value)
    if isinstance(value, bool) or not isinstance(value, int):
        shown = raw.decode("ascii", "replace") if isinstance(raw, bytes) else json.dumps(value, default=str)
        raise BadAnswer(f"server sent {what}={shown[:40]}, not a whole number")
    if value < 0:
        raise BadAnswer(f"server sent {what}={value}, a negative count")
    if value > limit:
        raise BadAnswer(f"server claimed {value} for {what} (more than {limit} is impossible)")
    return value


def _from_bytes(value: Any) -> Any:
    """A number the fast path cut out of an event, as JSON would read it (digits only; anything else as text)."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
        if value.isdigit() and len(value) < 4000:  # int() refuses longer digit strings
            return int(value)
    return value


def _tokens(value: Any, rec: Record) -> int:
    """A completion-token count from the server, bounded by what rec's max_tokens allows."""
    number = _from_bytes(value)
    if isinstance(number, int) and not isinstance(number, bool) and number > token_limit(rec.max_tokens):
        raise BadAnswer(f"server claimed {number} tokens for max_tokens {rec.max_tokens}")
    return _whole(value, "completion_tokens", token_limit(rec.max_tokens))


def build_body(endpoint: str, item: dict[str, Any], max_tokens: int, model: str) -> dict[str, Any]:
    """The JSON body of one streamed request with ignore_eos, so every request yields exactly max_tokens."""
    if endpoint == "generate":
        body: dict[str, Any] = {
            "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
            "stream": True,
        }
        if item.get("input_ids") is not None:
            body["input_ids"] = item["input_ids"]
        else:
            body["text"] = item.get("text") or _flatten(item.get("messages") or [])
        return body
    common = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        # continuous_usage_stats: cumulative usage in every chunk, so multi-token chunks are counted exactly.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if endpoint == "completions":
        prompt: Any = (
            item["input_ids"]
            if item.get("input_ids") is not None
            else (item.get("text") or _flatten(item.get("messages") or []))
        )
        return {**common, "prompt": prompt}
    if endpoint == "chat":
        messages = item.get("messages") or [{"role": "user", "content": item.get("text") or _ids_text(item)}]
        return {**common, "messages": messages}
    raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {', '.join(ENDPOINTS)}")


def _flatten(messages: list[dict[str, Any]]) -> str:
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)


def _ids_text(item: dict[str, Any]) -> str:
    return " ".join(f"t{i}" for i in item.get("input_ids") or [])


@dataclass
class Record:
    """One request as the client saw it; times are seconds from the start of the run."""

    index: int
    start: float
    max_tokens: int
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    prompt_tokens: int = 0
    arrivals: list[tuple[float, float]] = field(default_factory=list)  # (time, tokens in that chunk)
    chunks: int = 0
    verify_ct: int | None = None
    accept_length: float | None = None
    drafted: int | None = None  # draft tokens proposed (llama.cpp's timings.draft_n)
    accepted: int | None = None  # ... and accepted (timings.draft_n_accepted)
    timings: bool = False  # the response carried llama.cpp's timings (with or without drafting)
    token_source: str = "meta_info"
    reported_tokens: int | None = None  # an OpenAI server's final usage total
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start


def _count_openai(event: Any, rec: Record, text_chunks: list[int]) -> int:
    """Tokens this OpenAI chunk added: from cumulative usage when the server sends it per chunk, else 1 per delta."""
    if not isinstance(event, dict):
        raise BadAnswer(f"server sent a JSON {type(event).__name__} where an object was expected")
    usage = event.get("usage")
    timings = event.get("timings")
    if isinstance(timings, dict):
        rec.timings = True
    if isinstance(timings, dict) and timings.get("draft_n") is not None:
        # llama-server reports its drafting per request (only when drafting ran): counts for this request alone.
        rec.drafted = _whole(timings["draft_n"], "timings.draft_n", 1 << 31)
        rec.accepted = _whole(timings.get("draft_n_accepted", 0), "timings.draft_n_accepted", rec.drafted)
    choices = event.get("choices") or []
    if not isinstance(choices, list):
        raise BadAnswer(f"server sent choices of type {type(choices).__name__}, not a list")
    content: Any = ""
    if choices:
        c = choices[0]
        if not isinstance(c, dict):
            raise BadAnswer(f"server sent a choice of type {type(c).__name__}, not an object")
        delta = c.get("delta") or {}
        content = c.get("text") or (delta.get("content") if isinstance(delta, dict) else None) or ""
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = _whole(usage["prompt_tokens"], "prompt_tokens", MAX_PROMPT_TOKENS)
        total = _tokens(usage["completion_tokens"], rec)
        if choices:
            rec.token_source = "usage (per chunk)"
            return max(total - rec.tokens, 0)
        # The final usage-only chunk: the true total, which may exceed the chunks counted one token each.
        rec.reported_tokens = total
        return 0
    if content:
        text_chunks.append(len(rec.arrivals))
        if rec.tokens >= token_limit(rec.max_tokens):
            raise BadAnswer(f"server sent more than {rec.tokens} chunks for max_tokens {rec.max_tokens}")
        return 1
    return 0


class _Guard:
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
        if rec.arrivals:
            deadline = rec.arrivals[-1][0] + self.stall_s
            why = f"stalled: no token for {self.stall_s:g}s after {rec.tokens} tokens"
        else:
            deadline = rec.start + self.first_token_s
            why = f"stalled: no first token within {self.first_token_s:g}s"
        if rec.start + self.timeout < deadline:
            deadline, why = rec.start + self.timeout, f"timed out after {self.timeout:.0f}s with {rec.tokens} tokens"
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
        return f"{exc} (after {rec.tokens} tokens)"
    if isinstance(exc, asyncio.IncompleteReadError):
        return f"the connection closed mid-chunk after {rec.tokens} tokens"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc} after {rec.tokens} tokens"
    # Anything else came from parsing what the server sent (bad JSON, wrong types, absurd sizes).
    return f"unreadable answer from the server ({type(exc).__name__}: {str(exc)[:200]}) after {rec.tokens} tokens"


def check_bounds(**bounds: float) -> None:
    """Each named bound (seconds) must be finite and positive."""
    for name, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number of seconds above 0, not {value!r}")


async def fetch(
    host: str,
    port: int,
    path: str,
    body: dict[str, Any],
    rec: Record,
    t0: float,
    timeout: float,
    *,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    guards: set[_Guard] | None = None,
) -> None:
    """Stream one request, filling rec; errors are recorded on rec, never raised.

    The request fails when no token arrives for stall_s (a server whose worker died keeps its socket open and goes
    silent), when the first token takes longer than first_token_s, or after timeout in all. `guards` collects the
    request's guard while it runs, so the run can abort it.
    """
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s)
    text_chunks: list[int] = []
    streams: list[asyncio.BaseTransport] = []
    inner = asyncio.get_running_loop().create_task(_stream(host, port, path, body, rec, t0, streams, text_chunks))
    guard = _Guard(inner, rec, t0, timeout=timeout, stall_s=stall_s, first_token_s=first_token_s)
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
    path: str,
    body: dict[str, Any],
    rec: Record,
    t0: float,
    streams: list[asyncio.BaseTransport],
    text_chunks: list[int],
) -> None:
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    loop = asyncio.get_running_loop()
    exchange = _Exchange(request, rec, t0, path != "/generate", text_chunks, loop.create_future())
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
        elif parser.error_body:
            self._refused()

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
        parser = self.parser
        what = f"HTTP {parser.status}" if parser.status else f"not an HTTP answer ({parser.status_line[:60]!r})"
        self.rec.error = f"{what}: {parser.error_body.decode(errors='replace').strip()[:300]}"
        self._end(None)

    def _end(self, exc: BaseException | None) -> None:
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
            value = self.final_meta.get("completion_tokens", rec.tokens)
        self._count(_tokens(value, rec) - rec.tokens)

    def _openai(self, buf: bytes | bytearray, start: int, end: int) -> None:
        if self._is_done(buf, start, end):
            return
        event = _loads(buf, start, end)
        rec = self.rec
        # The usual chunk of a server sending usage with every chunk, checked as _count_openai would check it.
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
                    self._count(total - rec.tokens)
                    return
        self._count(_count_openai(event, rec, self.text_chunks))

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
            rec.prompt_tokens = _whole(meta.get("prompt_tokens", 0), "prompt_tokens", MAX_PROMPT_TOKENS)
            if meta.get("spec_verify_ct"):
                rec.verify_ct = _whole(meta["spec_verify_ct"], "spec_verify_ct", max(rec.tokens, 1))
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


async def _scrape(host: str, port: int) -> dict[str, float] | None:
    """Counters from /metrics (only with --enable-metrics); None when there is no such endpoint or it is not
    Prometheus text (garbage there must not end a run: the counters only add an accept-length source)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=5)
        try:
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            raw = await asyncio.wait_for(_read_to_eof(reader, MAX_EVENT_BYTES), timeout=10)
        finally:
            writer.close()
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        return _parse_metrics(raw)
    except (ValueError, IndexError):
        return None


async def _read_to_eof(reader: asyncio.StreamReader, limit: int) -> bytes:
    """The whole answer (the server closes the connection): one read() returns only what is buffered, and a
    /metrics page cut short would turn a missing counter's lifetime value into a "delta"."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        piece = await reader.read(min(65536, limit - size))
        if not piece:
            break
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def _parse_metrics(raw: bytes) -> dict[str, float] | None:
    """Prometheus text exposition → summed values per metric name; None unless it is a 200 answer."""
    head, _, text = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].split()
    if len(status) < 2 or status[1] != b"200":
        return None
    if b"chunked" in head.lower():
        text = _dechunk(text)
    out: dict[str, float] = {}
    for line in text.decode(errors="replace").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = line.split("{")[0].split()
        fields = line.rsplit(None, 1)
        if not words or len(fields) < 2:
            continue
        try:
            value = float(fields[-1])
        except ValueError:
            continue
        if math.isfinite(value):
            name = words[0]
            if name.endswith("_per_pos_total") and (pos := _POSITION.search(line)):
                # Per draft position (vLLM, llama.cpp): kept apart, as NAME[i], for the acceptance per position.
                name = f"{name}[{pos.group(1)}]"
            out[name] = out.get(name, 0.0) + value
    return out


_POSITION = re.compile(r'[{,]position="(\d+)"')


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out


def _in_thread(fn: Callable[[], str | None]) -> asyncio.Future[str | None]:
    """fn() in a daemon thread: a slow check never stalls the event loop, and a hung one never blocks exit."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str | None] = loop.create_future()

    def work() -> None:
        try:
            result, error = fn(), None
        except Exception as e:
            result, error = None, e

        def settle() -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        with contextlib.suppress(RuntimeError):  # the run ended and its loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=work, name="orch-client-watchdog", daemon=True).start()
    return fut


async def run_requests(
    host: str,
    port: int,
    endpoint: str,
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout: float,
    *,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watchdog: Callable[[], str | None] | None = None,
    watchdog_every_s: float = 1.0,
) -> tuple[list[Record], float, dict[str, Any], str | None]:
    """c workers take requests in order until none is left. Returns records, the busy window, metric deltas and
    why the run was aborted (None unless the watchdog said so).

    The busy window ends when the first worker finds no request left: until then all c streams were busy, so
    tokens received inside it measure throughput at concurrency c, without the drain at the end. `watchdog` is
    called every watchdog_every_s while the run is in flight (in a thread); a reason from it cancels every request
    in flight or queued, each recorded with that reason.
    """
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s, watchdog_every_s=watchdog_every_s)
    path = ENDPOINTS[endpoint]
    before = await _scrape(host, port)
    _LIVE.update(active=1.0, tokens=0.0, started=time.monotonic())
    t0 = time.perf_counter()
    records = [Record(index=i, start=0.0, max_tokens=max_tokens[i]) for i in range(len(bodies))]
    next_index = 0
    window_end: float | None = None
    aborted: str | None = None
    guards: set[_Guard] = set()

    def abort(reason: str) -> None:
        nonlocal aborted
        aborted = reason
        for g in list(guards):
            g.stop(f"aborted: {reason}")

    async def worker() -> None:
        nonlocal next_index, window_end
        while True:
            if next_index >= len(bodies) or aborted is not None:
                if window_end is None:
                    window_end = time.perf_counter() - t0
                return
            i = next_index
            next_index += 1
            rec = records[i]
            rec.start = time.perf_counter() - t0
            await fetch(
                host,
                port,
                path,
                bodies[i],
                rec,
                t0,
                timeout,
                stall_s=stall_s,
                first_token_s=first_token_s,
                guards=guards,
            )

    async def watch(check: Callable[[], str | None]) -> None:
        while True:
            await asyncio.sleep(watchdog_every_s)
            try:
                reason = await _in_thread(check)
            except Exception as e:
                reason = f"the watchdog check failed: {type(e).__name__}: {e}"
            if reason:
                abort(str(reason))
                return

    watcher = asyncio.get_running_loop().create_task(watch(watchdog)) if watchdog is not None else None
    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    finally:
        _LIVE["active"] = 0.0
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    if aborted is not None:
        for rec in records[next_index:]:
            rec.error = f"aborted: {aborted} (not sent)"
    # After an abort the server may be the reason: do not wait on its /metrics.
    after = await _scrape(host, port) if before is not None and aborted is None else None
    deltas: dict[str, Any] = {}
    if before is not None and after is not None:
        # Every counter: the engine adapter decides which ones describe speculative decoding (orch side).
        # Only counters in both scrapes: one that appears mid-run has no known starting value.
        deltas = {k: after[k] - before[k] for k in after if (k.endswith("_total") or "_total[" in k) and k in before}
    return records, window_end if window_end is not None else time.perf_counter() - t0, deltas, aborted


# ---------------------------------------------------------------- pure summaries


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for an empty list."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def itl_samples(rec: Record) -> list[float]:
    """Per-token inter-token latencies: a chunk of k tokens after a gap g gives k samples of g/k."""
    out: list[float] = []
    for (t_prev, _), (t, k) in zip(rec.arrivals, rec.arrivals[1:], strict=False):
        n = max(1, round(k))
        out.extend([(t - t_prev) / n] * n)
    return out


def _dist(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def summarize_run(
    records: list[Record],
    window: float,
    concurrency: int,
    deltas: dict[str, Any],
    min_duration_s: float,
    aborted: str | None = None,
) -> dict[str, Any]:
    """Reduce one run to its metrics and validity; what is stored and compared. `aborted`: why the run was cut
    short (the watchdog's reason), if it was."""
    ok = [r for r in records if r.error is None and r.end is not None]
    errors = [r for r in records if r.error is not None]
    short = [r for r in ok if r.tokens < r.max_tokens]
    itl: list[float] = []
    for r in ok:
        itl.extend(itl_samples(r))
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    tpot = [(r.e2e - r.ttft) / (r.tokens - 1) for r in ok if r.e2e and r.ttft is not None and r.tokens > 1]
    per_stream = [r.tokens / r.e2e for r in ok if r.e2e]
    # Steady state: from the moment the first c streams all have their first token (ramp-up over) to the moment
    # the first stream runs out of work (drain begins). Tokens received inside it measure throughput at exactly
    # concurrency c. A run too short to have such an interval falls back to [0, window].
    first_wave = [r.first for r in records[:concurrency]]
    start = max((t for t in first_wave if t is not None), default=0.0)
    if any(t is None for t in first_wave) or start >= window:
        start = 0.0
    steady = window - start
    in_window = sum(k for r in records for t, k in r.arrivals if start < t <= window)
    wall = max((r.end for r in records if r.end is not None), default=window)
    accept, source = None, None
    if any(r.drafted is not None for r in ok):
        # llama-server leaves draft_n out of a response that drafted nothing: on a drafting server, such a request
        # ran one target pass per token (accept length 1), and leaving it out would flatter the run.
        for r in ok:
            if r.timings and r.drafted is None and r.tokens:
                r.drafted, r.accepted, r.verify_ct, r.accept_length = 0, 0, r.tokens, 1.0
    verified = [r for r in ok if r.verify_ct]
    if verified:
        accept = sum(r.tokens for r in verified) / sum(r.verify_ct or 0 for r in verified)
        source = (
            "timings (tokens / (tokens - draft_n_accepted) of this run's requests)"
            if all(r.accepted is not None for r in verified)
            else "meta_info (completion_tokens / spec_verify_ct of this run's requests)"
        )
    drafting = [r for r in ok if r.drafted is not None]
    drafted = sum(r.drafted or 0 for r in drafting)
    accepted = sum(r.accepted or 0 for r in drafting)
    reasons = [f"aborted: {aborted}"] if aborted else []
    if errors:
        reasons.append(f"{len(errors)} of {len(records)} requests failed (first: {errors[0].error})")
    if short:
        reasons.append(
            f"{len(short)} requests stopped early ({short[0].tokens} of {short[0].max_tokens} tokens "
            "despite ignore_eos)"
        )
    if window < min_duration_s:
        reasons.append(f"run lasted {window:.2f}s, shorter than the minimum {min_duration_s:.2f}s")
    sources = sorted({r.token_source for r in ok})
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "errors": len(errors),
        "tokens": sum(r.tokens for r in ok),
        "seconds": wall,
        "window_s": window,
        "tok_s": sum(per_stream) / len(per_stream) if per_stream else 0.0,
        "aggregate_tok_s": in_window / steady if steady > 0 else 0.0,
        "steady_window_s": [start, window],
        "prompt_tokens": round(sum(r.prompt_tokens for r in ok) / len(ok)) if ok else 0,
        "ttft_s": percentile(ttft, 50),
        "ttft": _dist(ttft),
        "itl": _dist(itl),
        "tpot": _dist(tpot),
        "e2e": _dist(e2e),
        "chunks": sum(r.chunks for r in ok),
        "multi_token_chunks": sum(1 for r in ok for _, k in r.arrivals if k > 1),
        "token_source": sources[0] if len(sources) == 1 else ", ".join(sources),
        "spec_accept_length": accept,
        "spec_verify_ct": sum(r.verify_ct or 0 for r in verified) if verified else None,
        "accept_source": source,
        "spec": {
            "drafted": drafted if drafting else None,
            "accepted": accepted if drafting else None,
            "acceptance_rate": accepted / drafted if drafted else None,
        },
        # Deltas of the server's /metrics counters across the run ({} without /metrics): the engine adapter reads
        # its own speculative counters from them when the responses carried no per-request statistics.
        # Per draft position even when 0: positions a run never reached still count (their drafts were rejected).
        "counter_deltas": {
            k: v for k, v in deltas.items() if (v or "_per_pos_" in k) and ("spec" in k or "token" in k)
        },
        "valid": not reasons,
        "invalid_reason": "; ".join(reasons) or None,
        "aborted": aborted or None,
        "per_request": [
            {
                "index": r.index,
                "tokens": r.tokens,
                "prompt_tokens": r.prompt_tokens,
                "ttft_s": r.ttft,
                "e2e_s": r.e2e,
                "chunks": r.chunks,
                "accept_length": r.accept_length,
                "drafted": r.drafted,
                "accepted": r.accepted,
                "error": r.error,
            }
            for r in records
        ],
    }


def run(
    host: str,
    port: int,
    endpoint: str,
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout: float = 600.0,
    min_duration_s: float = 0.0,
    *,
    stall_s: float = 60.0,
    first_token_s: float = 180.0,
    watchdog: Callable[[], str | None] | None = None,
    watchdog_every_s: float = 1.0,
) -> dict[str, Any]:
    """One benchmark run, measured and summarised where this code runs (the host, or the orch machine).

    A request fails when no token arrives for stall_s after its first (or none within first_token_s); `watchdog`,
    polled every watchdog_every_s, aborts the whole run by returning a reason. See docs/client.md.
    """
    check_bounds(timeout=timeout, stall_s=stall_s, first_token_s=first_token_s, watchdog_every_s=watchdog_every_s)
    records, window, deltas, aborted = _run_interruptibly(
        lambda: run_requests(
            host,
            port,
            endpoint,
            bodies,
            max_tokens,
            concurrency,
            timeout,
            stall_s=stall_s,
            first_token_s=first_token_s,
            watchdog=watchdog,
            watchdog_every_s=watchdog_every_s,
        )
    )
    return summarize_run(records, window, concurrency, deltas, min_duration_s, aborted)


T = TypeVar("T")


def _run_interruptibly(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run, except that Ctrl-C (and orch's SIGTERM) always ends the run promptly with KeyboardInterrupt.

    From Python 3.11 asyncio.run turns the first SIGINT into one cancellation of the main task, and
    asyncio.wait_for swallows a cancellation that races with its inner task finishing (seen in CI: a Ctrl-C at the
    start of a run was lost and the benchmark went on). Here a Ctrl-C cancels the run again every 50 ms until it
    ends, and the run then always ends in KeyboardInterrupt, whatever the coroutine made of the cancellation.
    Raising inside the loop instead would leave tasks holding a KeyboardInterrupt nobody retrieves. The handlers are
    in place before the loop is built and until it is closed: a signal raising KeyboardInterrupt half-way through
    building or closing a loop leaves a broken object whose destructor prints a traceback (seen with SIGTERM).
    """
    interrupted = False
    state: dict[str, Any] = {}

    def keep_cancelling() -> None:
        task = state.get("task")
        if task is not None and not task.done():
            task.cancel()
            state["loop"].call_later(0.05, keep_cancelling)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        if "loop" in state:
            state["loop"].call_soon_threadsafe(keep_cancelling)

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(sig)
            # Only handlers that would raise in the middle of the loop (Python's for SIGINT, orch's for SIGTERM).
            if current is signal.default_int_handler or (callable(current) and sig == signal.SIGTERM):
                previous[sig] = signal.signal(sig, on_signal)
    try:
        loop = state["loop"] = asyncio.new_event_loop()
        try:
            if interrupted:
                raise KeyboardInterrupt
            task: asyncio.Task[T] = loop.create_task(make())
            state["task"] = task
            try:
                result = loop.run_until_complete(task)
            except asyncio.CancelledError:
                if interrupted:
                    raise KeyboardInterrupt from None
                raise
            if interrupted:
                raise KeyboardInterrupt
            return result
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
