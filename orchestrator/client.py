"""The benchmark client: stdlib-only asyncio HTTP/1.1 streaming, shipped to hosts with the agent.

It runs next to the server (through the host-side agent) by default, or on the orch machine (`--client local`).
Token accounting is per token, not per chunk: under speculative decoding one stream chunk carries several tokens,
and a chunk of k tokens after a gap g contributes k inter-token latencies of g/k.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

ENDPOINTS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
# The last "completion_tokens" in a /generate event is meta_info's (text and output_ids come first); reading it
# with a regex instead of parsing the whole cumulative event keeps the client's cost per token flat.
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_FINISH_NULL = re.compile(rb'"finish_reason"\s*:\s*null')


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
    token_source: str = "meta_info"
    reported_tokens: int | None = None  # an OpenAI server's final usage total
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start


def _count_openai(event: dict[str, Any], rec: Record, text_chunks: list[int]) -> int:
    """Tokens this OpenAI chunk added: from cumulative usage when the server sends it per chunk, else 1 per delta."""
    usage = event.get("usage")
    choices = event.get("choices") or []
    content = ""
    if choices:
        c = choices[0]
        content = c.get("text") or (c.get("delta") or {}).get("content") or ""
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
        new = int(usage["completion_tokens"]) - rec.tokens
        if choices:
            rec.token_source = "usage (per chunk)"
            return max(new, 0)
        # The final usage-only chunk: the true total, which may exceed the chunks counted one token each.
        rec.reported_tokens = int(usage["completion_tokens"])
        return 0
    if content:
        text_chunks.append(len(rec.arrivals))
        return 1
    return 0


async def fetch(host: str, port: int, path: str, body: dict[str, Any], rec: Record, t0: float, timeout: float) -> None:
    """Stream one request, filling rec; errors are recorded on rec, never raised."""
    text_chunks: list[int] = []
    streams: list[asyncio.StreamWriter] = []
    try:
        await asyncio.wait_for(_stream(host, port, path, body, rec, t0, streams, text_chunks), timeout)
    except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11 on; distinct on 3.10
        rec.error = f"timed out after {timeout:.0f}s with {rec.tokens} tokens"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e} after {rec.tokens} tokens"
    finally:
        for w in streams:
            w.close()
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
    streams: list[asyncio.StreamWriter],
    text_chunks: list[int],
) -> None:
    payload = json.dumps(body).encode()
    openai = path != "/generate"
    reader, writer = await asyncio.open_connection(host, port)
    streams.append(writer)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    status_line = await reader.readline()
    parts = status_line.split()
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if status != 200:
        text = (await reader.read(2000)).decode(errors="replace")
        rec.error = f"HTTP {status}: {text.strip()[:300]}"
        return
    buffer = b""
    done = False
    final_meta: dict[str, Any] | None = None
    while not done:
        if chunked:
            size_line = await reader.readline()
            if not size_line:
                break
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            piece = data[:-2]
        else:
            piece = await reader.read(65536)
            if not piece:
                break
        now = time.perf_counter() - t0
        if b"\r" in piece:
            piece = piece.replace(b"\r\n", b"\n")
        buffer = buffer + piece if buffer else piece  # no copy in the usual case: one event per chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            # /generate events are cumulative (they grow with every token): avoid copying them line by line.
            lines = (event,) if b"\n" not in event else event.split(b"\n")
            for line_b in lines:
                if not line_b.startswith(b"data:"):
                    continue
                data_b = line_b[5:].strip()
                if data_b == b"[DONE]":
                    done = True
                    break
                if openai:
                    added = _count_openai(json.loads(data_b), rec, text_chunks)
                else:
                    matches = _COMPLETION_TOKENS.findall(data_b, max(0, len(data_b) - 4096))
                    if not matches or not _FINISH_NULL.search(data_b, max(0, len(data_b) - 4096)):
                        # The final event (or an unusual one): parse it fully.
                        final_meta = json.loads(data_b).get("meta_info") or {}
                        cumulative = int(final_meta.get("completion_tokens", rec.tokens))
                    else:
                        cumulative = int(matches[-1])
                    added = cumulative - rec.tokens
                if added > 0:
                    if rec.first is None:
                        rec.first = now
                    rec.tokens += added
                    rec.arrivals.append((now, added))
                    rec.chunks += 1
                rec.end = now
            if done:
                break
    if not done:
        rec.error = f"the stream ended without [DONE] after {rec.tokens} tokens"
    if final_meta is not None:
        rec.prompt_tokens = int(final_meta.get("prompt_tokens", 0))
        if final_meta.get("spec_verify_ct"):
            rec.verify_ct = int(final_meta["spec_verify_ct"])
            rec.accept_length = float(final_meta.get("spec_accept_length") or rec.tokens / rec.verify_ct)


async def _scrape(host: str, port: int) -> dict[str, float] | None:
    """Counters from /metrics (only with --enable-metrics); None when there is no such endpoint."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=5)
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    except (OSError, asyncio.TimeoutError):
        return None
    head, _, text = raw.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n")[0]:
        return None
    if b"chunked" in head.lower():
        text = _dechunk(text)
    out: dict[str, float] = {}
    for line in text.decode(errors="replace").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{")[0].split()[0]
        try:
            out[name] = out.get(name, 0.0) + float(line.rsplit(None, 1)[-1])
        except ValueError:
            continue
    return out


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


async def run_requests(
    host: str,
    port: int,
    endpoint: str,
    bodies: list[dict[str, Any]],
    max_tokens: list[int],
    concurrency: int,
    timeout: float,
) -> tuple[list[Record], float, dict[str, Any]]:
    """c workers take requests in order until none is left. Returns records, the busy window and metric deltas.

    The busy window ends when the first worker finds no request left: until then all c streams were busy, so
    tokens received inside it measure throughput at concurrency c, without the drain at the end.
    """
    path = ENDPOINTS[endpoint]
    before = await _scrape(host, port)
    t0 = time.perf_counter()
    records = [Record(index=i, start=0.0, max_tokens=max_tokens[i]) for i in range(len(bodies))]
    next_index = 0
    window_end: float | None = None

    async def worker() -> None:
        nonlocal next_index, window_end
        while True:
            if next_index >= len(bodies):
                if window_end is None:
                    window_end = time.perf_counter() - t0
                return
            i = next_index
            next_index += 1
            rec = records[i]
            rec.start = time.perf_counter() - t0
            await fetch(host, port, path, bodies[i], rec, t0, timeout)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    after = await _scrape(host, port) if before is not None else None
    deltas: dict[str, Any] = {}
    if before is not None and after is not None:
        deltas = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("sglang:") and k.endswith("_total")}
    return records, window_end if window_end is not None else time.perf_counter() - t0, deltas


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
    records: list[Record], window: float, concurrency: int, deltas: dict[str, Any], min_duration_s: float
) -> dict[str, Any]:
    """Reduce one run to its metrics and validity; what is stored and compared."""
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
    verified = [r for r in ok if r.verify_ct]
    if verified:
        accept = sum(r.tokens for r in verified) / sum(r.verify_ct or 0 for r in verified)
        source = "meta_info (completion_tokens / spec_verify_ct of this run's requests)"
    elif deltas.get("sglang:spec_verify_calls_total"):
        accept = deltas.get("sglang:generation_tokens_total", 0.0) / deltas["sglang:spec_verify_calls_total"]
        source = "metrics (counter deltas across this run)"
    reasons = []
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
        "valid": not reasons,
        "invalid_reason": "; ".join(reasons) or None,
        "per_request": [
            {
                "index": r.index,
                "tokens": r.tokens,
                "prompt_tokens": r.prompt_tokens,
                "ttft_s": r.ttft,
                "e2e_s": r.e2e,
                "chunks": r.chunks,
                "accept_length": r.accept_length,
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
) -> dict[str, Any]:
    """One benchmark run, measured and summarised where this code runs (the host, or the orch machine)."""
    records, window, deltas = _run_interruptibly(
        run_requests(host, port, endpoint, bodies, max_tokens, concurrency, timeout)
    )
    return summarize_run(records, window, concurrency, deltas, min_duration_s)


T = TypeVar("T")


def _run_interruptibly(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, except that Ctrl-C always ends the run promptly with KeyboardInterrupt.

    From Python 3.11 asyncio.run turns the first SIGINT into one cancellation of the main task, and
    asyncio.wait_for swallows a cancellation that races with its inner task finishing (seen in CI: a Ctrl-C at the
    start of a run was lost and the benchmark went on). Here a Ctrl-C cancels the run again every 50 ms until it
    ends, and the run then always ends in KeyboardInterrupt, whatever the coroutine made of the cancellation.
    Raising inside the loop instead would leave tasks holding a KeyboardInterrupt nobody retrieves.
    """
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    interrupted = False

    def keep_cancelling() -> None:
        if not task.done():
            task.cancel()
            loop.call_later(0.05, keep_cancelling)

    def on_sigint(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        loop.call_soon_threadsafe(keep_cancelling)

    install = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    previous = signal.signal(signal.SIGINT, on_sigint) if install else None
    try:
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
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
