"""The simulator's prefix cache: a repeated prompt reports cached_tokens and moves SGLang's cache counters."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from orchestrator.sim.knobs import read_knobs
from tests.sim.test_sim import _wait_healthy, sim


def _counter(text: str, name: str) -> float:
    match = re.search(rf"^sglang:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, text
    return float(match.group(1))


def test_the_prefix_cache_is_off_by_default() -> None:
    assert read_knobs({})["prefix_cache_entries"] == 0


def test_a_repeated_prompt_is_served_from_the_cache(tmp_path: Path) -> None:
    with sim(tmp_path, "--enable-metrics", knobs={"prefix_cache_entries": "2"}) as s:
        _wait_healthy(s)
        body = {"text": "one two three four five six seven eight", "sampling_params": {"max_new_tokens": 2}}
        with httpx.Client(timeout=30) as client:
            first = client.post(s.url("/generate"), json=body).json()["meta_info"]
            again = client.post(s.url("/generate"), json=body).json()["meta_info"]
            other = client.post(s.url("/generate"), json={**body, "text": "a different prompt"}).json()["meta_info"]
            metrics = client.get(s.url("/metrics")).text
    assert first["cached_tokens"] == 0 and other["cached_tokens"] == 0
    # All but the last prompt token: that one is computed to give the first output token.
    assert again["cached_tokens"] == again["prompt_tokens"] - 1 > 0
    assert _counter(metrics, "cached_tokens_total") == again["cached_tokens"]
    prompt = _counter(metrics, "prompt_tokens_total")
    assert abs(_counter(metrics, "cache_hit_rate") - again["cached_tokens"] / prompt) < 1e-9
    assert "#cached-token: " + str(again["cached_tokens"]) in s.log()


def test_without_the_knob_nothing_is_cached(tmp_path: Path) -> None:
    with sim(tmp_path, "--enable-metrics") as s:
        _wait_healthy(s)
        body = {"text": "one two three four", "sampling_params": {"max_new_tokens": 2}}
        with httpx.Client(timeout=30) as client:
            metas = [client.post(s.url("/generate"), json=body).json()["meta_info"] for _ in range(2)]
            metrics = client.get(s.url("/metrics")).text
    assert [m["cached_tokens"] for m in metas] == [0, 0]
    assert _counter(metrics, "cached_tokens_total") == 0
