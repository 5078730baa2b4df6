"""The simulator's prefix cache: a repeated prompt or a shared prefix reports cached_tokens and moves the cache
counters (SGLang's, vLLM's); the flush routes empty it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.sim.engine import count_text_tokens
from orchestrator.sim.knobs import read_knobs
from tests.engines.test_vllm import _vllm_sim
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


def test_a_shared_prefix_is_found_and_flush_cache_empties_the_cache(tmp_path: Path) -> None:
    system = "You are a careful assistant who answers questions about the history of European printing. " * 2
    with sim(tmp_path, "--enable-metrics", knobs={"prefix_cache_entries": "8"}) as s:
        _wait_healthy(s)
        with httpx.Client(timeout=30) as client:

            def ask(text: str) -> dict[str, Any]:
                body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
                meta: dict[str, Any] = client.post(s.url("/generate"), json=body).json()["meta_info"]
                return meta

            first = ask(system + "Who built the first press?")
            other = ask(system + "When did printing reach England?")
            flushed = client.post(s.url("/flush_cache"))
            after = ask(system + "When did printing reach England?")
    assert first["cached_tokens"] == 0
    # The system prompt's whole 64-character blocks, as their share of the prompt's tokens; not the question.
    assert 0 < other["cached_tokens"] < other["prompt_tokens"] - 1
    assert other["cached_tokens"] >= 0.6 * count_text_tokens(system)
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    assert after["cached_tokens"] == 0
    assert "Cache flushed successfully!" in s.log()


def test_the_vllm_mode_resets_its_cache_only_in_dev_mode_and_counts_hits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"model": "/models/kimi", "prompt": "one two three four five six seven eight nine ten", "max_tokens": 2}

    def counters(c: httpx.Client, port: int) -> tuple[float, float]:
        text = c.get(f"http://127.0.0.1:{port}/metrics").text
        got = [re.search(rf"^vllm:prefix_cache_{n}_total\{{[^}}]*\}} (\S+)$", text, re.M) for n in ("hits", "queries")]
        assert got[0] and got[1], text
        return float(got[0].group(1)), float(got[1].group(1))

    with _vllm_sim(tmp_path, prefix_cache_entries="4") as (_, port, _log), httpx.Client(timeout=30) as c:
        _wait_vllm(c, port)
        assert c.post(f"http://127.0.0.1:{port}/reset_prefix_cache").status_code == 404  # not a dev server
        c.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        c.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        hits, queries = counters(c, port)
        assert queries > 0 and hits == queries / 2 - 1  # the second: all but its last token
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    with _vllm_sim(tmp_path, prefix_cache_entries="4") as (_, port, _log), httpx.Client(timeout=30) as c:
        _wait_vllm(c, port)
        c.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        assert c.post(f"http://127.0.0.1:{port}/reset_prefix_cache").status_code == 200
        c.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        assert counters(c, port)[0] == 0  # emptied in between: the second found nothing


def _wait_vllm(c: httpx.Client, port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if c.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("the vLLM-mode simulator never became healthy")
