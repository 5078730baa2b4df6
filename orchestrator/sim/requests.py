"""Request bodies read as the imitated servers read them; each refusal an HttpError with the server's message."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.sim.engine import PrefixHit, count_chat_tokens, count_text_tokens
from orchestrator.sim.httpio import HttpError


@dataclass(kw_only=True)
class Body:
    """One generation request, checked: what the engine's Req and the response writer are built from."""

    prompt: int
    max_new: int
    min_new: int
    ignore_eos: bool
    stop: list[str]
    stream: bool
    rid: str | None = None
    include_usage: bool = False
    continuous_usage: bool = False
    greedy: bytes | None = None  # temperature 0: the prompt's key, from which its output follows (greedy_key)
    prompt_key: bytes | None = None  # the prompt's digest at any temperature: the simulated prefix cache's key
    # Given which keys the prefix cache holds, the tokens of the longest shorter prefix of the prompt it holds, cut
    # at a message (chat) or line (text) boundary; None when it holds none. Called only when the cache is on and the
    # whole prompt missed: hashing prefixes costs.
    prefix_hit: PrefixHit | None = None
    # Chat only: the key and tokens of the conversation with the generated reply appended, which the cache keeps
    # once the request finishes (as a radix cache keeps generated tokens): a next turn that sends the reply back
    # finds it.
    reply_key: Callable[[str], tuple[bytes, int]] | None = None
    prefix_blocks: tuple[bytes, ...] = ()  # its prefixes block by block (prefix_blocks): shared prefixes hit too


# At most this many line boundaries of a text prompt are looked up as prefixes (the last ones).
MAX_TEXT_PREFIXES = 256


def text_prefix_hit(text: str) -> PrefixHit:
    def hit(held: Callable[[bytes], bool]) -> int | None:
        at, tries = len(text), 0
        while tries < MAX_TEXT_PREFIXES and (at := text.rfind("\n", 0, at)) > 0:
            tries += 1
            if held(prompt_key(text[:at])):
                return count_text_tokens(text[:at])
        return None

    return hit


def chat_prefix_hit(messages: list[Any]) -> PrefixHit:
    def hit(held: Callable[[bytes], bool]) -> int | None:
        for j in range(len(messages) - 1, 0, -1):
            if held(prompt_key(messages[:j])):
                return count_chat_tokens(messages[:j])
        return None

    return hit


def prefix_hit(material: Any, *, chat: bool) -> PrefixHit | None:
    """How a prompt's prefixes are looked up in the cache: at message boundaries (chat) or line breaks (text)."""
    if chat:
        return chat_prefix_hit(material) if isinstance(material, list) else None
    return text_prefix_hit(material) if isinstance(material, str) else None


def chat_reply_key(messages: list[Any]) -> Callable[[str], tuple[bytes, int]]:
    def key(reply: str) -> tuple[bytes, int]:
        whole = [*messages, {"role": "assistant", "content": reply}]
        return prompt_key(whole), count_chat_tokens(whole)

    return key


def prompt_key(prompt: Any) -> bytes:
    """A digest of the prompt (text, token ids or chat messages): equal prompts hit the simulated prefix cache."""
    return hashlib.blake2b(json.dumps(prompt, sort_keys=True, default=str).encode(), digest_size=16).digest()


# A block of the simulated prefix cache: this many characters of text (about 16 tokens of the stand-in tokenizer) or
# token ids, as vLLM and SGLang cache fixed-size pages of a prompt's KV.
TEXT_BLOCK_CHARS = 64
ID_BLOCK = 16


def prefix_blocks(prompt: Any) -> tuple[bytes, ...]:
    """One chained digest per whole block of the prompt (text, token ids, or a chat's messages as JSON): two prompts
    that share their first k blocks share their first k digests, so the cache finds a shared system prompt."""
    material: Any = prompt if isinstance(prompt, str | list) else json.dumps(prompt, sort_keys=True, default=str)
    if isinstance(material, list) and not all(isinstance(t, int) for t in material):
        material = json.dumps(material, sort_keys=True, default=str)  # chat messages
    size = TEXT_BLOCK_CHARS if isinstance(material, str) else ID_BLOCK
    out: list[bytes] = []
    digest = hashlib.blake2b(digest_size=16)
    for start in range(0, len(material) - size + 1, size):
        piece = material[start : start + size]
        digest.update(piece.encode() if isinstance(piece, str) else json.dumps(piece).encode())
        out.append(digest.copy().digest())
    return tuple(out)


def greedy_key(temperature: Any, prompt: Any) -> bytes | None:
    """A digest of the prompt when the request decodes greedily (temperature 0), else None (sampled tokens)."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature != 0:
        return None
    return hashlib.blake2b(json.dumps(prompt, sort_keys=True, default=str).encode(), digest_size=16).digest()


def generate_body(body: Any, context_length: int) -> Body:
    """A /generate body (SGLang's native API)."""
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    text, input_ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        text = single(text, "text")
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        input_ids = single(input_ids, "input_ids")
    if text is None and input_ids is None:
        raise HttpError(400, "Either text or input_ids should be provided.")
    if text is not None and not isinstance(text, str):
        raise HttpError(400, "text must be a string")
    if input_ids is not None and not (isinstance(input_ids, list) and all(isinstance(t, int) for t in input_ids)):
        raise HttpError(400, "input_ids must be a list of integers")
    prompt = count_text_tokens(text) if isinstance(text, str) else len(input_ids or [0]) or 1
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise HttpError(400, "sampling_params must be an object")
    max_new = opt_int(sp, "max_new_tokens", 128)
    min_new = opt_int(sp, "min_new_tokens", 0) or 0
    max_new = check_budget(context_length, prompt, max_new)
    return Body(
        prompt=prompt,
        max_new=max_new,
        min_new=min_new,
        ignore_eos=bool(sp.get("ignore_eos", False)),
        stop=stops(sp.get("stop")),
        stream=bool(body.get("stream", False)),
        rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
        greedy=greedy_key(sp.get("temperature"), text if text is not None else input_ids),
        prompt_key=prompt_key(text if text is not None else input_ids),
        prefix_hit=text_prefix_hit(text) if isinstance(text, str) else None,
        prefix_blocks=prefix_blocks(text if text is not None else input_ids),
    )


def openai_body(body: Any, context_length: int, *, chat: bool) -> Body:
    """A /v1/completions or /v1/chat/completions body."""
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    if int(body.get("n") or 1) != 1:
        raise HttpError(400, "the simulator supports n=1 only")
    material: Any
    if chat:
        messages = material = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HttpError(400, "messages must be a non-empty list")
        prompt = count_chat_tokens(messages)
        max_new = opt_int(body, "max_completion_tokens", None)
        if max_new is None:
            max_new = opt_int(body, "max_tokens", None)
    else:
        p = body.get("prompt")
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            p = single(p, "prompt")
        material = p
        if isinstance(p, str):
            prompt = count_text_tokens(p)
        elif isinstance(p, list) and all(isinstance(t, int) for t in p):
            prompt = max(1, len(p))
        else:
            raise HttpError(400, "prompt must be a string or a list of token ids")
        max_new = opt_int(body, "max_tokens", 16)
    max_new = check_budget(context_length, prompt, max_new)
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    continuous = bool(opts.get("continuous_usage_stats")) if isinstance(opts, dict) else False
    return Body(
        prompt=prompt,
        max_new=max_new,
        min_new=opt_int(body, "min_tokens", 0) or 0,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stop=stops(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        greedy=greedy_key(body.get("temperature"), material),
        prompt_key=prompt_key(material),
        prefix_hit=prefix_hit(material, chat=chat),
        reply_key=chat_reply_key(material) if chat else None,
        prefix_blocks=prefix_blocks(material),
    )


def check_budget(ctx: int, prompt: int, max_new: int | None) -> int:
    """The tokens to generate: max_new, or the rest of the context without one; refused past the context length."""
    if prompt >= ctx:
        raise HttpError(400, f"The input ({prompt} tokens) is longer than the model's context length ({ctx} tokens).")
    if max_new is None:
        return ctx - prompt
    if prompt + max_new > ctx:
        raise HttpError(
            400,
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
            f"a total of {prompt + max_new} tokens: {prompt} tokens from the input messages and {max_new} "
            "tokens for the completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit.",
        )
    return max_new


def single(items: list[Any], name: str) -> Any:
    if len(items) != 1:
        raise HttpError(400, f"batched {name} ({len(items)} items) is not supported by the simulator; send one")
    return items[0]


def opt_int(obj: dict[str, Any], key: str, default: int | None) -> int | None:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"{key} must be an integer, got {value!r}")
    if value < 0:
        raise HttpError(400, f"{key} must be >= 0, got {value}")
    return value


def stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise HttpError(400, "stop must be a string or a list of strings")
