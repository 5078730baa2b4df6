"""One benchmark request's data: its JSON body, its Record, and the server's token counts checked before use."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.client.streamparse import BadAnswer

# The kinds of benchmark endpoint (--endpoint): generate, the engine's native API; completions and chat, the OpenAI
# API's. Where each is and how it is spoken is the engine's to say (engines/base.Engine.wire, request_body).
ENDPOINT_NAMES = ("generate", "completions", "chat")
# How the answer streams: OpenAI chunks (choices, usage; llama.cpp's timings beside them), or one cumulative JSON
# object per event carrying its counts in meta_info (SGLang's native /generate).
STREAM_FORMATS = ("openai", "cumulative")


@dataclass(frozen=True, kw_only=True)
class Wire:
    """How the client speaks to one server on one benchmark endpoint, as its engine says (engines/base.Engine.wire):
    where requests go, how their answers stream, and where its counters are. JSON-able: it travels to the host with
    every run."""

    path: str
    stream: str = "openai"  # one of STREAM_FORMATS
    metrics_path: str | None = None  # Prometheus text, read before and after a run; None: it has none
    # Which metric names to keep the deltas of (any name, labels summed; a `position` label kept apart as NAME[i]);
    # None: every counter named as Prometheus names counters (`*_total`).
    counters: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.stream not in STREAM_FORMATS:
            raise ValueError(f"unknown stream format {self.stream!r}; expected one of {', '.join(STREAM_FORMATS)}")
        if not self.path.startswith("/") or (self.metrics_path is not None and not self.metrics_path.startswith("/")):
            raise ValueError(f"a wire's paths start with '/': {self.path!r}, {self.metrics_path!r}")

    @classmethod
    def of(cls, spec: Wire | dict[str, Any]) -> Wire:
        """A wire from what a run was given: itself, or its JSON form (to_dict)."""
        if isinstance(spec, Wire):
            return spec
        counters = spec.get("counters")
        return cls(
            path=str(spec["path"]),
            stream=str(spec.get("stream", "openai")),
            metrics_path=None if spec.get("metrics_path") is None else str(spec["metrics_path"]),
            counters=None if counters is None else tuple(str(c) for c in counters),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "stream": self.stream,
            "metrics_path": self.metrics_path,
            "counters": None if self.counters is None else list(self.counters),
        }


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
# A body key for the client alone, never sent: keep this request's generated output (orch ab --check-outputs).
KEEP_OUTPUT = "orch_keep_output"
# A body key for the client alone, never sent: the request is turn `turn` of a multi-turn session, with this turn's
# new `messages`; the client sends it with the conversation so far (session_body), the replies being the server's.
SESSION_TURN = "orch_turn"


def whole_count(value: Any, what: str, limit: int) -> int:
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


def completion_tokens(value: Any, rec: Record) -> int:
    """A completion-token count from the server, bounded by what rec's max_tokens allows."""
    number = _from_bytes(value)
    if isinstance(number, int) and not isinstance(number, bool) and number > token_limit(rec.max_tokens):
        raise BadAnswer(f"server claimed {number} tokens for max_tokens {rec.max_tokens}")
    return whole_count(value, "completion_tokens", token_limit(rec.max_tokens))


def with_markers(body: dict[str, Any], item: dict[str, Any], *, keep_output: bool = False) -> dict[str, Any]:
    """An engine's request body (engines/base.Engine.request_body) with the client's own keys, never sent:
    keep_output (KEEP_OUTPUT: keep what the request generated) and a multi-turn session's turn (SESSION_TURN)."""
    body = dict(body)
    if isinstance(item.get("turn_index"), int):  # config/sessions.TURN_KEY: a multi-turn session's turn, from 0
        body[SESSION_TURN] = {"turn": item["turn_index"], "messages": list(item.get("messages") or [])}
    return {**body, KEEP_OUTPUT: True} if keep_output else body


def session_turn(body: dict[str, Any]) -> int | None:
    """The turn a body is in its session (0: the first), or None outside multi-turn sessions."""
    marker = body.get(SESSION_TURN)
    return int(marker["turn"]) if isinstance(marker, dict) else None


def session_body(body: dict[str, Any], history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A session turn's body as sent, and the conversation it carries: the conversation so far (`history`: earlier
    turns' messages and the server's replies) then this turn's new messages, as chat messages or, on the text
    endpoints, flattened as a prompt built from messages is."""
    marker = body[SESSION_TURN]
    conversation = [*history, *marker["messages"]]
    out = {k: v for k, v in body.items() if k != SESSION_TURN}
    if "messages" in out:
        out["messages"] = conversation
    elif "prompt" in out:
        out["prompt"] = flatten(conversation)
    else:
        out["text"] = flatten(conversation)
    return out, conversation


def flatten(messages: list[dict[str, Any]]) -> str:
    """Chat messages as one prompt text, for an endpoint that takes text (a conversation on a text endpoint)."""
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)


def ids_text(item: dict[str, Any]) -> str:
    """A token-id prompt as text, for an endpoint that takes no token ids (chat)."""
    return " ".join(f"t{i}" for i in item.get("input_ids") or [])


@dataclass(kw_only=True)
class Record:
    """One request as the client saw it; times are seconds from the start of the run. TTFT and E2E count from
    `start`: when the request began (closed loop), or when it was due (open loop)."""

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
    failed: float | None = None  # when the client gave it up (a stall, a timeout, an abort): `end` is its last byte
    # Open loop: `start` is when the request was due (its latency counts from then), `sent` when the client began
    # it (opened its connection), `queued` how long of that it waited for a --max-concurrency slot.
    sent: float | None = None
    queued: float = 0.0
    # --check-outputs: the generated text as it streamed (one piece per chunk), and the token ids where the server
    # sends them (SGLang's /generate); None when the output is not kept.
    output: list[str] | None = None
    output_ids: list[int] | None = None
    temperature: Any = None  # ... and the temperature its body asked for (greedy at 0)
    # Prompt tokens the server reused from its prefix cache (llama.cpp's timings.cache_n, SGLang's
    # meta_info.cached_tokens, OpenAI usage.prompt_tokens_details.cached_tokens); None when it did not say.
    cached_tokens: int | None = None
    turn: int | None = None  # its turn in a multi-turn session (0: the first); None outside sessions

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start


def count_openai_chunk(event: Any, rec: Record, text_chunks: list[int]) -> int:
    """Tokens this OpenAI chunk added: from cumulative usage when the server sends it per chunk, else 1 per delta."""
    if not isinstance(event, dict):
        raise BadAnswer(f"server sent a JSON {type(event).__name__} where an object was expected")
    usage = event.get("usage")
    timings = event.get("timings")
    if isinstance(timings, dict):
        rec.timings = True
        if timings.get("cache_n") is not None:
            rec.cached_tokens = whole_count(timings["cache_n"], "timings.cache_n", MAX_PROMPT_TOKENS)
    if isinstance(timings, dict) and timings.get("draft_n") is not None:
        # llama-server reports its drafting per request (only when drafting ran): counts for this request alone.
        rec.drafted = whole_count(timings["draft_n"], "timings.draft_n", 1 << 31)
        rec.accepted = whole_count(timings.get("draft_n_accepted", 0), "timings.draft_n_accepted", rec.drafted)
    choices = event.get("choices") or []
    if not isinstance(choices, list):
        raise BadAnswer(f"server sent choices of type {type(choices).__name__}, not a list")
    content: Any = ""
    if choices:
        c = choices[0]
        if not isinstance(c, dict):
            raise BadAnswer(f"server sent a choice of type {type(c).__name__}, not an object")
        content = chunk_text(c)
    if rec.output is not None and content:
        rec.output.append(str(content))
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = whole_count(usage["prompt_tokens"], "prompt_tokens", MAX_PROMPT_TOKENS)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            rec.cached_tokens = whole_count(details["cached_tokens"], "cached_tokens", MAX_PROMPT_TOKENS)
        total = completion_tokens(usage["completion_tokens"], rec)
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


def chunk_text(choice: dict[str, Any]) -> Any:
    """The text an OpenAI choice adds: `text` (completions) or `delta.content` (chat); "" when none."""
    delta = choice.get("delta") or {}
    return choice.get("text") or (delta.get("content") if isinstance(delta, dict) else None) or ""


def kept_output(rec: Record) -> dict[str, Any] | None:
    """What a request generated, as stored ({"index", "text", "pieces" or "ids"}); None when it was not kept or the
    request failed (a cut output says nothing about the decoding)."""
    if rec.output is None or rec.error is not None:
        return None
    out: dict[str, Any] = {"index": rec.index, "text": "".join(rec.output), "temperature": rec.temperature}
    if rec.output_ids is not None:
        out["ids"] = rec.output_ids
    else:
        out["pieces"] = rec.output
    return out


def body_temperature(body: dict[str, Any]) -> Any:
    """The temperature a request body asks for (SGLang's /generate: in sampling_params); None when it sets none."""
    params = body.get("sampling_params")
    return params.get("temperature") if isinstance(params, dict) else body.get("temperature")
