"""The server's counters (its wire's metrics path), read before and after a run: Prometheus text summed per name."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.client.request import MAX_EVENT_BYTES, Wire


async def scrape_metrics(host: str, port: int, wire: Wire) -> dict[str, float] | None:
    """Counters from the wire's metrics path (SGLang serves it only with --enable-metrics); None when the engine
    has none, there is no such endpoint or it is not Prometheus text (garbage there must not end a run: the
    counters only add an accept-length source)."""
    if wire.metrics_path is None:
        return None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=5)
        try:
            writer.write(f"GET {wire.metrics_path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
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
            if pos := _POSITION.search(line):
                # Per draft position (vLLM's and llama.cpp's acceptance counters label it so): kept apart, as
                # NAME[i], for the acceptance per position.
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


def counter_deltas(before: dict[str, float], after: dict[str, float], wire: Wire) -> dict[str, float]:
    """The change across a run of every counter the wire keeps (its `counters`, or every `*_total` one): the engine
    adapter decides which describe speculative decoding or the prefix cache (orch side). Only counters in both
    scrapes: one that appears mid-run has no known starting value."""
    return {k: after[k] - before[k] for k in after if k in before and _kept(k.partition("[")[0], wire.counters)}


def _kept(name: str, counters: tuple[str, ...] | None) -> bool:
    return name.endswith("_total") if counters is None else name in counters


def prefix_cache(cached: list[int | None], prompt: list[int]) -> dict[str, Any] | None:
    """A run's prefix-cache use from the responses: cached prompt tokens / prompt tokens, when every request said
    how many of its prompt tokens came from the cache; None when one did not (the engine's own counters may say:
    counted_prefix_cache, orch side). `cached` and `prompt`: per successful request."""
    if not cached or any(c is None for c in cached):
        return None
    return _cache_use(sum(c or 0 for c in cached), sum(prompt), "responses")


def counted_prefix_cache(deltas: Mapping[str, float], hits: str, queries: str) -> dict[str, Any] | None:
    """A run's prefix-cache use from an engine's /metrics counters across the run (engines/base.Engine.
    cache_counters): cached prompt tokens / prompt tokens; None when either counter is missing."""
    if hits not in deltas or queries not in deltas:
        return None
    return _cache_use(round(deltas[hits]), round(deltas[queries]), f"metrics ({hits} / {queries})")


def _cache_use(hit: int, total: int, source: str) -> dict[str, Any]:
    return {
        "cached_tokens": hit,
        "prompt_tokens": total,
        "hit_rate": hit / total if total > 0 else None,
        "source": source,
    }
