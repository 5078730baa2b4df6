"""One benchmark request's data: its JSON body, its Record, and the server's token counts checked before use."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orchestrator.client.streamparse import BadAnswer

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


def build_body(
    endpoint: str, item: dict[str, Any], max_tokens: int, model: str, *, keep_output: bool = False
) -> dict[str, Any]:
    """The JSON body of one streamed request with ignore_eos, so every request yields exactly max_tokens; greedy
    (temperature 0) on every endpoint. keep_output: the client keeps what the request generated (KEEP_OUTPUT)."""
    body = _body(endpoint, item, max_tokens, model)
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
        out["prompt"] = _flatten(conversation)
    else:
        out["text"] = _flatten(conversation)
    return out, conversation


def _body(endpoint: str, item: dict[str, Any], max_tokens: int, model: str) -> dict[str, Any]:
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
