"""Multi-turn sessions end to end on the simulator: each turn carries the server's own earlier replies."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.faults.support import FAST

TURNS = 3


def conversations(path: Path, sessions: int = 3, turns: int = TURNS) -> str:
    """A ShareGPT file of `sessions` conversations of `turns` human turns (the dataset's replies are never sent)."""
    convs = [
        {
            "category": "chat",
            "conversations": [
                part
                for k in range(turns)
                for part in (
                    {"from": "human", "value": f"session {s} question {k}: tell me more about topic {s * 10 + k}"},
                    {"from": "gpt", "value": f"DATASET-REPLY-{s}-{k}"},
                )
            ],
        }
        for s in range(sessions)
    ]
    path.write_text(json.dumps(convs))
    return str(path)


def test_each_turn_sends_the_servers_replies_back(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The simulator's prefix cache keeps a chat's reply with its conversation: a next turn finds more cached tokens
    # than the previous turn's whole prompt only if it sent that reply back exactly as the server generated it.
    profiles = sim_profiles(sim={"prefix_cache_entries": 64})
    data = conversations(tmp_path / "conv.json")
    args = ["ab", str(profiles["baseline"]), str(profiles["eagle3"]), "--sim", "--dataset", data, "--turns", "3"]
    args += ["--endpoint", "chat", "--blocks", "1", "--runs", "1", "--concurrency", "2", "--max-tokens", "8"]
    rc = main([*args, *FAST, "--db", str(tmp_path / "r.db"), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out)
    for arm in doc["arms"]:
        (run,) = arm["runs"]
        assert run["requests"] == 2 * TURNS  # 2 streams x 1 session x 3 turns
        turns = arm["turns"]
        assert [t["turn"] for t in turns] == [1, 2, 3]
        assert all(t["requests"] == 2 for t in turns)
        assert turns[0]["cached_tokens"] == 0
        for before, after in itertools.pairwise(turns):
            # the conversation grows, and the reply of the turn before is found in the cache
            assert after["prompt_tokens"] > before["prompt_tokens"]
            assert after["cached_tokens"] > before["prompt_tokens"]
    # The HTML report has the same numbers by turn, one row per arm and turn.
    page = tmp_path / "r.html"
    assert main(["export", "last", "--format", "html", "-o", str(page), "--db", str(tmp_path / "r.db")]) == 0
    html = page.read_text()
    assert '<table id="table-by-turn">' in html, html
    assert '<td>eagle3</td><td class="n">3</td><td class="n">2</td>' in html, html


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--rate", "2"], "--turns runs multi-turn sessions on closed-loop streams"),
        (["--trace", "t.jsonl"], "--trace (open loop) excludes it"),
        (["--prompts", "builtin"], "--prompts builtin has none: give a ShareGPT .json file"),
        (["--turns", "4"], "no conversation with 4 user turns (the longest has 3)"),
    ],
)
def test_what_cannot_run_as_sessions_is_refused(
    sim_profiles: Callable[..., dict[str, Path]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    said: str,
) -> None:
    profiles = sim_profiles()
    data = conversations(tmp_path / "conv.json")
    args = ["ab", str(profiles["baseline"]), str(profiles["eagle3"]), "--sim", "--dataset", data, "--turns", "3"]
    rc = main([*args, *extra, "--blocks", "1", "--runs", "1", "--db", str(tmp_path / "r.db")])
    assert rc == 2
    assert said in capsys.readouterr().err
