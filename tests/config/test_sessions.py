"""Multi-turn sessions built from datasets: which conversations, in which order, as which request items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import sessions
from orchestrator.config.workload import BenchConfig, request_items, run_categories
from orchestrator.errors import PromptFileError


def _sharegpt(path: Path, turns: list[int]) -> str:
    convs = [
        {
            "category": f"c{s}",
            "conversations": [
                part
                for k in range(n)
                for part in ({"from": "human", "value": f"s{s} q{k}"}, {"from": "gpt", "value": f"dataset reply {k}"})
            ],
        }
        for s, n in enumerate(turns)
    ]
    path.write_text(json.dumps(convs))
    return str(path)


def test_a_session_is_its_first_turns_each_with_only_its_new_message(tmp_path: Path) -> None:
    data = _sharegpt(tmp_path / "d.json", [3, 1, 4])
    items = sessions.sequence(data, 2, 3, seed=0)
    assert len(items) == 6
    # the one-turn conversation is skipped; each session's turns are consecutive, from turn_index 0
    assert [it[sessions.TURN_KEY] for it in items] == [0, 1, 2, 0, 1, 2]
    firsts = {items[0]["category"], items[3]["category"]}
    assert firsts == {"c0", "c2"}
    for it in items:
        (message,) = it["messages"]
        assert message["role"] == "user" and message["content"].startswith(f"s{it['category'][1:]} q")
        assert "dataset reply" not in json.dumps(it)  # the dataset's replies are never sent
    first = items[0]["category"][1:]
    assert [it["messages"][0]["content"] for it in items[:3]] == [f"s{first} q{k}" for k in range(3)]


def test_the_order_is_seeded_and_the_same_for_every_call(tmp_path: Path) -> None:
    data = _sharegpt(tmp_path / "d.json", [2] * 5)
    assert sessions.sequence(data, 7, 2, seed=3) == sessions.sequence(data, 7, 2, seed=3)
    assert sessions.sequence(data, 7, 2, seed=3) != sessions.sequence(data, 7, 2, seed=4)


def test_jsonl_messages_keep_their_system_prompt_on_the_first_turn(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [
        {
            "category": "chat",
            "output_len": 5,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "never sent"},
                {"role": "user", "content": "two"},
            ],
        },
        {"prompt": "a single turn"},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    items = sessions.sequence(str(path), 1, 2, seed=0)
    assert [it["messages"] for it in items] == [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}],
        [{"role": "user", "content": "two"}],
    ]
    assert all(it["output_len"] == 5 for it in items)


def test_mt_bench_has_two_turns() -> None:
    items = sessions.sequence("mt-bench", 3, 2, seed=0)
    assert len(items) == 6 and [it[sessions.TURN_KEY] for it in items] == [0, 1] * 3
    assert all(it["category"] for it in items)


def test_sources_without_conversations_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match="--turns runs the conversations of a dataset as sessions"):
        sessions.sequence("builtin", 1, 2, seed=0)
    data = _sharegpt(tmp_path / "d.json", [2, 1])
    with pytest.raises(PromptFileError, match="no conversation with 3 user turns \\(the longest has 2\\)"):
        sessions.sequence(data, 1, 3, seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "hello"}\n')
    with pytest.raises(PromptFileError, match=r'bad\.jsonl:1: needs "messages"'):
        sessions.sequence(str(bad), 1, 2, seed=0)


def test_the_workload_counts_sessions_and_its_digest_covers_turns(tmp_path: Path) -> None:
    data = _sharegpt(tmp_path / "d.json", [3] * 4)
    bench = BenchConfig(runs=2, warmup=1, concurrency=(1, 2), requests_per_stream=2, prompts=data, turns=3)
    assert bench.requests_per_run(2) == 12 and bench.requests_per_warmup == 3
    items = request_items(bench)
    # 1 warmup session, then per run c x 2 sessions of 3 turns: (1 + 2 x (2 + 4)) x 3 requests
    assert len(items) == (1 + 2 * (2 + 4)) * 3
    assert bench.to_dict()["turns"] == 3 and "turns" not in BenchConfig(prompts=data).to_dict()
    plain = request_items(BenchConfig(runs=2, warmup=1, concurrency=(1, 2), requests_per_stream=2, prompts=data))
    assert all(sessions.TURN_KEY not in it for it in plain)  # without --turns: the first human turns, as before
    found = run_categories(bench)
    assert len(found[(1, 0.0, 0)]) == 6 and len(found[(2, 0.0, 1)]) == 12
    with pytest.raises(PromptFileError, match="--input-len"):
        request_items(BenchConfig(prompts=data, turns=2, input_len=8))
