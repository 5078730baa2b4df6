"""Trace replay: a Mooncake-format JSONL trace as an open-loop schedule with prompts that share its prefix blocks."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from orchestrator.config import prompts
from orchestrator.config.prompts import MAX_FILE_BYTES, PromptItem
from orchestrator.errors import PromptFileError

# Mooncake's block: each hash id stands for this many prompt tokens, shared by every request that lists the id.
BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# Token ids of the synthesised prompts lie above the special-token range, as --prompts random's do.
LOW_ID, VOCAB = 1000, 32000


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


def _count(path: str, n: int, obj: dict[str, object], name: str, least: int) -> int:
    value = _field(path, n, obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise PromptFileError(f"{path}:{n}: field {name!r} is {value!r}; expected an integer of at least {least}")
    return value


def _parse(path: str, n: int, line: bytes) -> TraceRequest | None:
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PromptFileError(f"{path}:{n}: not a JSON object ({e})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(f"{path}:{n}: expected a JSON object with {', '.join(FIELDS)}")
    ts = _field(path, n, obj, "timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise PromptFileError(f"{path}:{n}: field 'timestamp' is {ts!r}; expected milliseconds from the start, >= 0")
    ids = _field(path, n, obj, "hash_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise PromptFileError(f"{path}:{n}: field 'hash_ids' is {ids!r}; expected a list of integers")
    return TraceRequest(
        timestamp_ms=float(ts),
        input_length=_count(path, n, obj, "input_length", 1),
        output_length=_count(path, n, obj, "output_length", 1),
        hash_ids=tuple(ids),
    )


def load(path: str) -> list[TraceRequest]:
    """Every request of a trace in file order; timestamps must not decrease (a replay keeps the trace's order, so
    an unsorted file is refused rather than silently reordered)."""
    f, too_big = prompts.open_capped(
        path, "trace", "a trace is a JSONL file on disk", "replay a part of the trace (--requests N)"
    )
    out: list[TraceRequest] = []
    with f:
        offset, n = 0, 0
        while line := f.readline(MAX_FILE_BYTES + 1 - offset):
            n += 1
            offset += len(line)
            if offset > MAX_FILE_BYTES:
                raise too_big
            req = _parse(path, n, line)
            if req is None:
                continue
            if out and req.timestamp_ms < out[-1].timestamp_ms:
                raise PromptFileError(
                    f"{path}:{n}: field 'timestamp' is {req.timestamp_ms:g}, before the line above's "
                    f"{out[-1].timestamp_ms:g}; a trace's timestamps must not decrease (sort it by timestamp)"
                )
            out.append(req)
    if not out:
        raise PromptFileError(f"{path}: no requests in the trace")
    return out


def head(trace: list[TraceRequest], requests: int | None) -> list[TraceRequest]:
    return trace[:requests] if requests else trace


def schedule(trace: list[TraceRequest], speed: float) -> list[float]:
    """When each request is due, in seconds from the run's start: its timestamp from the first one's, / speed."""
    start = trace[0].timestamp_ms
    return [(r.timestamp_ms - start) / 1000.0 / speed for r in trace]


def mean_rate(trace: list[TraceRequest], speed: float) -> float:
    """The level's name: requests per second over the replay's span, to 4 significant digits (the count, for a trace
    of one instant)."""
    span = schedule(trace, speed)[-1]
    return float(f"{len(trace) / span:.4g}") if span > 0 else float(len(trace))


def _block(hash_id: int) -> list[int]:
    rng = random.Random(f"trace-block:{hash_id}")
    return [rng.randrange(LOW_ID, VOCAB) for _ in range(BLOCK_TOKENS)]


def items(trace: list[TraceRequest]) -> list[PromptItem]:
    """Each request's prompt as token ids: its hash ids' blocks in order (the same ids for the same hash id, so
    requests sharing blocks share that prefix), cut to input_length, or filled past them with tokens of its own."""
    blocks: dict[int, list[int]] = {}
    out = []
    for n, req in enumerate(trace):
        ids: list[int] = []
        for h in req.hash_ids:
            if len(ids) >= req.input_length:
                break
            ids += blocks.setdefault(h, _block(h))
        if len(ids) < req.input_length:
            rng = random.Random(f"trace-fill:{n}")
            ids += [rng.randrange(LOW_ID, VOCAB) for _ in range(req.input_length - len(ids))]
        out.append(PromptItem(category="trace", input_ids=tuple(ids[: req.input_length]), output_len=req.output_length))
    return out
