"""The client's side of multi-turn sessions: a turn's body carries the conversation so far, replies fed back."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestrator.client.request import KEEP_OUTPUT, SESSION_TURN, Record, session_body, session_turn
from orchestrator.client.runner import send_unit, session_units
from tests.wires import body

TURN_0 = {"category": "c", "messages": [{"role": "user", "content": "first"}], "turn_index": 0}
TURN_1 = {"category": "c", "messages": [{"role": "user", "content": "second"}], "turn_index": 1}
HISTORY = [{"role": "user", "content": "first"}, {"role": "assistant", "content": " the reply"}]


def test_a_turn_is_sent_with_the_conversation_so_far_on_every_endpoint() -> None:
    chat = body("chat", TURN_1, 8, "m")
    assert session_turn(chat) == 1 and session_turn(body("chat", {"text": "x"}, 8, "m")) is None
    sent, conversation = session_body(chat, HISTORY)
    assert SESSION_TURN not in sent
    assert sent["messages"] == conversation == [*HISTORY, {"role": "user", "content": "second"}]
    text, _ = session_body(body("generate", TURN_1, 8, "m"), HISTORY)
    assert text["text"] == "user: first\nassistant:  the reply\nuser: second"
    completions, _ = session_body(body("completions", TURN_1, 8, "m"), HISTORY)
    assert completions["prompt"] == text["text"]


def test_sessions_are_units_and_lone_requests_stay_alone() -> None:
    bodies = [body("chat", it, 8, "m") for it in (TURN_0, TURN_1, TURN_0, TURN_1)]
    assert session_units(bodies) == [(0, 2), (2, 4)]
    plain = [body("chat", {"text": "x"}, 8, "m")] * 3
    assert session_units(plain) == [(0, 1), (1, 2), (2, 3)]


def _run_unit(bodies: list[dict[str, Any]], reply: str, fail_at: int | None = None) -> tuple[list[Record], list[Any]]:
    records = [Record(index=i, start=0.0, max_tokens=8) for i in range(len(bodies))]
    sent_bodies: list[Any] = []

    async def send(body: dict[str, Any], rec: Record) -> None:
        sent_bodies.append(body)
        if rec.index == fail_at:
            rec.error = "stalled"
            return
        assert rec.output == []  # the client listens for the reply it must feed back
        rec.output = [reply, f" {rec.index}"]

    asyncio.run(send_unit(records, bodies, [False] * len(bodies), 0, len(bodies), send, lambda: False))
    return records, sent_bodies


def test_the_servers_reply_is_fed_into_the_next_turn() -> None:
    bodies = [body("chat", it, 8, "m") for it in (TURN_0, TURN_1)]
    records, sent = _run_unit(bodies, " server says")
    assert sent[1]["messages"] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": " server says 0"},
        {"role": "user", "content": "second"},
    ]
    assert [r.turn for r in records] == [0, 1]
    assert all(r.output is None for r in records)  # not kept unless --check-outputs asked
    kept = [body("chat", it, 8, "m", keep_output=True) for it in (TURN_0, TURN_1)]
    records, sent = _run_unit(kept, " x")
    assert all(KEEP_OUTPUT in b for b in sent) and records[1].output == [" x", " 1"]


def test_a_failed_turn_leaves_the_rest_of_its_session_unsent() -> None:
    bodies = [body("chat", it, 8, "m") for it in (TURN_0, TURN_1, TURN_1)]
    records, sent = _run_unit(bodies, "r", fail_at=0)
    assert len(sent) == 1
    assert [r.error for r in records[1:]] == ["not sent: turn 1 of its session failed (stalled)"] * 2
