"""The server's /metrics counters, read before and after a run: Prometheus text summed per metric name."""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

from orchestrator.client.request import MAX_EVENT_BYTES


async def scrape_metrics(host: str, port: int) -> dict[str, float] | None:
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


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Every counter's change across a run: the engine adapter decides which ones describe speculative decoding (orch
    side). Only counters in both scrapes: one that appears mid-run has no known starting value."""
    return {k: after[k] - before[k] for k in after if (k.endswith("_total") or "_total[" in k) and k in before}


# The engines' prefix-cache counters (cached prompt tokens, prompt tokens), both read as deltas across the run.
# vLLM counts tokens looked up in / found in its prefix cache; SGLang counts cached and all prompt tokens (its
# cached_tokens_total carries a cache_source label, summed here like every label).
CACHE_COUNTERS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("sglang:cached_tokens_total", "sglang:prompt_tokens_total"),
)


def prefix_cache(cached: list[int | None], prompt: list[int], deltas: dict[str, float]) -> dict[str, Any] | None:
    """A run's prefix-cache use: cached prompt tokens / prompt tokens, from the responses when every request said
    how many of its prompt tokens came from the cache, else from the /metrics counters; None when neither did.
    `cached` and `prompt`: per successful request."""
    if cached and all(c is not None for c in cached):
        hit, total, source = sum(c or 0 for c in cached), sum(prompt), "responses"
    else:
        pair = next(((h, q) for h, q in CACHE_COUNTERS if h in deltas and q in deltas), None)
        if pair is None:
            return None
        hit, total, source = round(deltas[pair[0]]), round(deltas[pair[1]]), f"metrics ({pair[0]} / {pair[1]})"
    return {
        "cached_tokens": hit,
        "prompt_tokens": total,
        "hit_rate": hit / total if total > 0 else None,
        "source": source,
    }
