"""Trace replay: a Mooncake-format JSONL trace as an open-loop schedule with prompts that share its prefix blocks."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from orchestrator.config import arrivals, prompts
from orchestrator.config.prompts import MAX_PROMPT_TOKENS, PromptItem
from orchestrator.errors import PromptFileError
from orchestrator.fields import seconds_text

# Mooncake's block: each hash id stands for this many prompt tokens, shared by every request that lists the id.
BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# Token ids of the synthesised prompts lie above the special-token range, as --prompts random's do.
LOW_ID, VOCAB = 1000, 32000
# A line asks for at most as many tokens as --max-tokens may (config/limits).
MAX_OUTPUT_TOKENS = 1_000_000


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace: when it is due (ms from the trace's start) and what it asks for."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _field(path: str, n: int, obj: dict[str, object], name: str) -> object:
    if name not in obj:
        raise PromptFileError(f"{path}:{n}: field {name!r} missing; a trace line has {', '.join(FIELDS)}")
    return obj[name]


def _count(path: str, n: int, obj: dict[str, object], name: str, most: int, what: str) -> int:
    value = _field(path, n, obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise PromptFileError(
            f"{path}:{n}: field {name!r} is {value!r}; expected an integer from 1 to {most:,} ({what})"
        )
    return value


def _parse(path: str, n: int, line: bytes) -> TraceRequest | None:
    obj = prompts.json_object(path, n, line, ", ".join(FIELDS))
    if obj is None:
        return None
    ts = _field(path, n, obj, "timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise PromptFileError(f"{path}:{n}: field 'timestamp' is {ts!r}; expected milliseconds from the start, >= 0")
    ids = _field(path, n, obj, "hash_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise PromptFileError(f"{path}:{n}: field 'hash_ids' is {ids!r}; expected a list of integers")
    return TraceRequest(
        timestamp_ms=float(ts),
        input_length=_count(path, n, obj, "input_length", MAX_PROMPT_TOKENS, "prompt tokens, as --input-len"),
        output_length=_count(path, n, obj, "output_length", MAX_OUTPUT_TOKENS, "output tokens, as --max-tokens"),
        hash_ids=tuple(ids),
    )


def load(path: str, requests: int | None = None) -> list[TraceRequest]:
    """The trace's first `requests` requests in file order (every one without it), reading no line past them;
    timestamps must not decrease (a replay keeps the trace's order, so an unsorted file is refused rather than
    silently reordered). A trace of more than arrivals.MAX_REQUESTS is refused without `requests`: a run sends at
    most that many."""
    lines = prompts.capped_lines(
        path, "trace", "a trace is a JSONL file on disk", "replay a part of the trace (--requests N)"
    )
    with contextlib.closing(lines):  # a part replayed: the file is closed now, not when the generator is collected
        return read(path, lines, requests)


def from_text(label: str, text: str, requests: int | None = None) -> list[TraceRequest]:
    """load() of a trace's text (a bundle carries it), its lines named `label`:N."""
    numbered = ((n, 0, line) for n, line in enumerate(text.encode("utf-8").splitlines(keepends=True), 1))
    return read(label, numbered, requests)


def read(path: str, lines: Iterable[tuple[int, int, bytes]], requests: int | None = None) -> list[TraceRequest]:
    """load()'s checks over (line number, byte offset, line) of a trace named `path`."""
    out: list[TraceRequest] = []
    for n, _, line in lines:
        if requests is not None and len(out) >= requests:
            break
        req = _parse(path, n, line)
        if req is None:
            continue
        if len(out) >= arrivals.MAX_REQUESTS:
            raise PromptFileError(
                f"{path}:{n}: more than {arrivals.MAX_REQUESTS:,} requests; a replay sends at most "
                f"{arrivals.MAX_REQUESTS:,} per run: replay the first N (--requests N)"
            )
        if out and req.timestamp_ms < out[-1].timestamp_ms:
            raise PromptFileError(
                f"{path}:{n}: field 'timestamp' is {req.timestamp_ms:g}, before the line above's "
                f"{out[-1].timestamp_ms:g}; a trace's timestamps must not decrease (sort it by timestamp)"
            )
        out.append(req)
    if not out:
        raise PromptFileError(f"{path}: no requests in the trace")
    return out


def schedule(trace: list[TraceRequest], speed: float) -> list[float]:
    """When each request is due, in seconds from the run's start: its timestamp from the first one's, / speed."""
    start = trace[0].timestamp_ms
    return [(r.timestamp_ms - start) / 1000.0 / speed for r in trace]


def check_span(path: str, trace: list[TraceRequest], speed: float) -> None:
    """A replay lasts at most what an open-loop run may (--duration's bound): one spanning centuries would hold the
    servers until someone stopped it. Refused before anything launches, naming the span and how to shorten it."""
    span = (trace[-1].timestamp_ms - trace[0].timestamp_ms) / 1000.0 / speed
    if not span <= arrivals.MAX_DURATION_S:  # inf and NaN too
        raise PromptFileError(
            f"{path}: the replay would last {span:.4g} s (timestamps {trace[0].timestamp_ms:g} to "
            f"{trace[-1].timestamp_ms:g} ms, at --speed {speed:g}); a run lasts at most "
            f"{seconds_text(arrivals.MAX_DURATION_S)}, as --duration: replay its first N requests (--requests N) or "
            "faster (--speed X)"
        )


def mean_rate(trace: list[TraceRequest], speed: float) -> float:
    """The level's name: requests per second over the replay's span, to 4 significant digits (the count, for a trace
    of one instant)."""
    span = schedule(trace, speed)[-1]
    return float(f"{len(trace) / span:.4g}") if span > 0 else float(len(trace))


# Every id a prompt may hold, as one int object each: a prompt's list refers to these (8 bytes a token) instead of
# holding an int object of its own per token (36 bytes a token; a 1,000,000-token prompt took 36 MB, not 8).
_IDS = tuple(range(LOW_ID, VOCAB))


def token_ids(seed: str, n: int) -> list[int]:
    """The first n draws of `random.Random(seed).randrange(LOW_ID, VOCAB)`, exactly, a few times faster: randrange
    takes the top 15 bits of each 32-bit word the generator gives and draws again when they are out of range, and
    getrandbits(32 * k) is k such words, the first in the lowest bits (tests/config/test_traces.py holds the two
    equal). Recorded digests of the requests depend on these ids. Equal ids are one shared int object."""
    rng = random.Random(seed)
    span = VOCAB - LOW_ID
    shift = 32 - span.bit_length()
    out: list[int] = []
    while len(out) < n:
        words = (n - len(out)) * 33 // 31 + 16  # about 5% of the draws are out of range
        drawn = memoryview(rng.getrandbits(32 * words).to_bytes(4 * words, "little")).cast("I")
        out += [_IDS[r] for w in drawn if (r := w >> shift) < span]
    del out[n:]
    return out


def prompt_ids(req: TraceRequest, n: int) -> list[int]:
    """Request n's prompt as token ids: its hash ids' blocks in order (the same ids for the same hash id, so
    requests sharing blocks share that prefix), cut to input_length, or filled past them with tokens of its own."""
    ids: list[int] = []
    for h in req.hash_ids:
        if len(ids) >= req.input_length:
            break
        ids += token_ids(f"trace-block:{h}", BLOCK_TOKENS)
    del ids[req.input_length :]
    if len(ids) < req.input_length:
        ids += token_ids(f"trace-fill:{n}", req.input_length - len(ids))
    return ids


def item(trace: list[TraceRequest], n: int) -> PromptItem:
    """Request n's prompt (prompt_ids) with its output length."""
    req = trace[n]
    return PromptItem(category="trace", input_ids=tuple(prompt_ids(req, n)), output_len=req.output_length)


def items(trace: list[TraceRequest]) -> Iterator[PromptItem]:
    """Each request's prompt in turn, generated as it is taken: a replay holds the prompts it is sending, never
    every prompt of the trace at once."""
    for n in range(len(trace)):
        yield item(trace, n)
