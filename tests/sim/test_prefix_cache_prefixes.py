"""The simulator's prefix cache beyond whole prompts: the longest prefix held, and a chat's reply kept with it."""

from __future__ import annotations

from pathlib import Path

import httpx

from orchestrator.sim.engine import count_chat_tokens, count_text_tokens
from tests.sim.test_sim import _wait_healthy, sim


def test_a_later_turn_finds_the_earlier_turn_and_its_reply(tmp_path: Path) -> None:
    with sim(tmp_path, knobs={"prefix_cache_entries": "8"}) as s:
        _wait_healthy(s)
        with httpx.Client(timeout=30) as client:

            def chat(messages: list[dict[str, str]]) -> dict[str, object]:
                body = {"model": "m", "messages": messages, "max_tokens": 4, "temperature": 0}
                answer: dict[str, object] = client.post(s.url("/v1/chat/completions"), json=body).json()
                return answer

            first = [{"role": "user", "content": "tell me about the sea"}]
            one = chat(first)
            reply = one["choices"][0]["message"]["content"]  # type: ignore[index]
            conversation = [*first, {"role": "assistant", "content": reply}]
            two = chat([*conversation, {"role": "user", "content": "and the sky?"}])
            other = chat(
                [*first, {"role": "assistant", "content": "not what it said"}, {"role": "user", "content": "?"}]
            )
            # text prompts: the longest line-boundary prefix seen as a whole prompt
            gen = {"sampling_params": {"max_new_tokens": 2}}
            client.post(s.url("/generate"), json={**gen, "text": "line one\nline two"})
            longer = client.post(s.url("/generate"), json={**gen, "text": "line one\nline two\nline three"}).json()
    assert one["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # type: ignore[index]
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == count_chat_tokens(conversation)  # type: ignore[index]
    # a different "reply" finds only the first turn's prompt
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == count_chat_tokens(first)  # type: ignore[index]
    assert longer["meta_info"]["cached_tokens"] == count_text_tokens("line one\nline two")
