"""Multi-turn sessions (--turns N): a dataset's conversations as the user's turns, replies left to the server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import datasets, prompts
from orchestrator.errors import PromptFileError

# A session is at most this many turns: every turn resends the whole conversation, so the prompt grows with each one.
MAX_TURNS = 100
# The request item's key for its place in its session (0: the first turn). The client sends the turn with the
# conversation so far (client/request.session_body), the assistant messages being the server's own replies.
TURN_KEY = "turn_index"
USER = ("human", "user")
SOURCES = 'a ShareGPT .json file, a JSONL file whose lines have "messages", or mt-bench'


@dataclass(frozen=True)
class Session:
    """One conversation's user turns (the dataset's replies are not used: the server's own are fed back), with any
    system messages that came before the first user turn."""

    category: str
    turns: tuple[str, ...]
    context: tuple[dict[str, str], ...] = ()
    output_len: int | None = None

    def items(self, turns: int) -> list[dict[str, Any]]:
        """The request items of the session's first `turns` turns: each its new messages only (the first turn's
        system messages included), marked with its turn index."""
        out = []
        for k, text in enumerate(self.turns[:turns]):
            new = [*(self.context if k == 0 else ()), {"role": "user", "content": text}]
            item: dict[str, Any] = {"category": self.category, "text": None, "input_ids": None, "messages": new}
            if self.output_len is not None:
                item["output_len"] = self.output_len
            out.append({**item, TURN_KEY: k})
        return out


def _sharegpt(path: str) -> Iterator[Session | None]:
    for n, obj in datasets.json_elements(path):
        turns = obj.get("conversations") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise PromptFileError(
                f'{path}:{n}: expected an object with "conversations": a list of {{"from": "human"|"gpt", "value": '
                "text}"
            )
        category = prompts.category_of(path, n, obj)
        said = [t.get("value") for t in turns if t.get("from") in USER]
        if not all(isinstance(v, str) for v in said):
            raise PromptFileError(f'{path}:{n}: a human turn\'s "value" is not text')
        if not said or not all(str(v).strip() for v in said):
            yield None  # no human turn, or an empty one: skipped, as ShareGPT has some
            continue
        yield Session(category=category, turns=tuple(str(v) for v in said))


def _jsonl(path: str) -> Iterator[Session | None]:
    for n, _, line in prompts.file_lines(path):
        obj = prompts.json_object(path, n, line, '"messages" or "prompt"')
        if obj is None:
            yield None
            continue
        output_len = prompts.output_len_of(path, n, obj)
        category = prompts.category_of(path, n, obj)
        if isinstance(obj.get("prompt"), str):
            # A one-turn conversation: a session only under --turns 1, which is not a multi-turn workload.
            yield Session(category, (obj["prompt"],), output_len=output_len) if obj["prompt"].strip() else None
            continue
        messages = obj.get("messages")
        if not (
            isinstance(messages, list)
            and messages
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
            and all(isinstance(m.get("content"), str) for m in messages)
        ):
            raise PromptFileError(f'{path}:{n}: needs "messages" (a list of {{role, content}}) or "prompt" (text)')
        said = [m["content"] for m in messages if m["role"] == "user"]
        if not said or not all(s.strip() for s in said):
            yield None
            continue
        first = next(i for i, m in enumerate(messages) if m["role"] == "user")
        context = tuple({"role": m["role"], "content": m["content"]} for m in messages[:first] if m["role"] == "system")
        yield Session(category, tuple(said), context, output_len)


def _shipped(name: str) -> Iterator[Session | None]:
    info = datasets.SHIPPED[name]
    for row in datasets.shipped_rows(name):
        turns = row.get("turns") or ([row["prompt"]] if "prompt" in row else [])
        yield Session(category=info["category"] or str(row.get("category", "")), turns=tuple(turns))


def reader(source: str) -> Callable[[str], Iterator[Session | None]]:
    """How a --prompts value's conversations are read; PromptFileError for a source that has none."""
    if source in datasets.SHIPPED:
        return _shipped
    suffix = Path(source).suffix.lower()
    if suffix == ".json":
        return _sharegpt
    if suffix == ".jsonl" and source not in prompts.BUNDLED_SETS:
        return _jsonl
    raise PromptFileError(
        f"--turns runs the conversations of a dataset as sessions; --prompts {source} has none: give {SOURCES}"
    )


def sequence(source: str, sessions: int, turns: int, *, seed: int) -> list[dict[str, Any]]:
    """The request items of `sessions` sessions of exactly `turns` turns each, in the seeded order of
    prompts.sample_order over the dataset's conversations that have at least `turns` user turns (shorter ones are
    skipped, so every session, and every turn index, has the same number of requests in every run). A file is read
    twice: a first pass checks every record and counts the sessions, a second keeps only the chosen ones."""
    if sessions <= 0:
        return []
    read = reader(source)
    found_turns = [len(s.turns) for s in read(source) if s is not None]
    pool = sum(1 for n in found_turns if n >= turns)
    if not pool:
        most = max(found_turns, default=0)
        raise PromptFileError(
            f"{source}: no conversation with {turns} user turns (the longest has {most}); lower --turns or give "
            "longer conversations"
        )
    chosen = prompts.sample_order(pool, sessions, seed)
    wanted = set(chosen)
    kept: dict[int, Session] = {}
    index = 0
    for s in read(source):
        if s is not None and len(s.turns) >= turns:
            if index in wanted:
                kept[index] = s
            index += 1
    if index != pool:
        raise PromptFileError(f"{source}: changed while it was read; run again")
    return [item for i in chosen for item in kept[i].items(turns)]
