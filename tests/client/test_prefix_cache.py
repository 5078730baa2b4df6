"""Prefix-cache attestation: cached prompt tokens from responses or /metrics counters, per run and per arm, in every
format, and the warning when arms' hit rates differ by more than results.cache.CACHE_GAP_POINTS."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from orchestrator import engines
from orchestrator.client.metrics import prefix_cache
from orchestrator.client.request import BadAnswer, Record, count_openai_chunk
from orchestrator.client.summary import summarize_run
from orchestrator.experiment import failon
from orchestrator.launch.benchmark import RunCall, with_engine_counters
from orchestrator.report import html, jsondoc, markdown, text
from orchestrator.results.cache import arm_prefix_cache, cache_warnings
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult


def test_llamacpp_timings_cache_n_and_openai_cached_tokens_are_read() -> None:
    rec = Record(index=0, start=0.0, max_tokens=8)
    count_openai_chunk({"choices": [], "timings": {"cache_n": 12, "prompt_n": 3}}, rec, [])
    assert rec.cached_tokens == 12
    rec = Record(index=0, start=0.0, max_tokens=8)
    usage = {"completion_tokens": 4, "prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}
    count_openai_chunk({"choices": [], "usage": usage}, rec, [])
    assert (rec.cached_tokens, rec.prompt_tokens) == (32, 40)
    with pytest.raises(BadAnswer, match=r"timings\.cache_n=-1"):
        count_openai_chunk({"choices": [], "timings": {"cache_n": -1}}, Record(index=0, start=0.0, max_tokens=8), [])


def test_a_runs_hit_rate_comes_from_responses_else_from_the_engines_counters() -> None:
    assert prefix_cache([30, 0], [40, 40]) == {
        "cached_tokens": 30,
        "prompt_tokens": 80,
        "hit_rate": 0.375,
        "source": "responses",
    }
    assert prefix_cache([None, 30], [40, 40]) is None  # one response did not say: the counters may

    def counted(engine: str, deltas: dict[str, float]) -> dict[str, Any] | None:
        """What a run whose responses said nothing about the cache records, through the engine's adapter."""
        summary = {"prefix_cache": prefix_cache([None], [40]), "counter_deltas": deltas}
        return with_engine_counters(lambda _call: dict(summary), engines.get(engine))(
            RunCall(bodies=[], max_tokens=[], concurrency=1, probe_gpus=False)
        )["prefix_cache"]

    vllm = {"vllm:prefix_cache_hits_total": 48.0, "vllm:prefix_cache_queries_total": 64.0}
    got = counted("vllm", vllm)
    assert got is not None and got["hit_rate"] == 0.75 and got["source"].startswith("metrics (vllm:prefix_cache_hits")
    sgl = {"sglang:cached_tokens_total": 10.0, "sglang:prompt_tokens_total": 40.0}
    assert (counted("sglang", sgl) or {})["hit_rate"] == 0.25
    assert counted("sglang", vllm) is None  # another engine's counters are not this one's
    assert counted("vllm", {}) is None  # an engine that says nothing: no attestation, not 0 %
    assert counted("llamacpp", vllm) is None  # it has no such counters (its responses say, timings.cache_n)
    zero = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 64.0}
    assert (counted("vllm", zero) or {})["hit_rate"] == 0.0


def test_the_run_summary_keeps_the_cache_counters_and_the_rate() -> None:
    recs = []
    for i, cached in enumerate((0, 39)):
        r = Record(
            index=i, start=0.0, max_tokens=2, first=0.1, end=0.2, tokens=2, prompt_tokens=40, cached_tokens=cached
        )
        r.arrivals = [(0.1, 1), (0.2, 1)]
        recs.append(r)
    deltas = {"vllm:prefix_cache_hits_total": 39.0, "vllm:prefix_cache_queries_total": 80.0, "other_total": 1.0}
    s = summarize_run(recs, 0.2, 1, deltas, 0.0)
    assert s["prefix_cache"]["hit_rate"] == pytest.approx(39 / 80) and s["prefix_cache"]["source"] == "responses"
    assert s["counter_deltas"] == deltas  # every counter: which ones mean what is the engine adapter's to say
    # A counter that did not move is kept: no cache hit in a run is a count the engine's adapter reads.
    flushed = summarize_run(recs, 0.2, 1, {**deltas, "vllm:prefix_cache_hits_total": 0.0}, 0.0)
    assert flushed["counter_deltas"]["vllm:prefix_cache_hits_total"] == 0.0
    assert RunResult.from_summary(0, False, s).metrics["prefix_cache"] == s["prefix_cache"]


def _run(k: int, cache: dict[str, Any] | None) -> RunResult:
    return RunResult(
        index=k,
        warmup=False,
        tokens=2048,
        seconds=25.0,
        tok_s=82.0 + k,
        prompt_tokens=30,
        ttft_s=0.02,
        aggregate_tok_s=82.0,
        metrics={"prefix_cache": cache} if cache is not None else {},
    )


def _result(rates: dict[str, float | None]) -> ABResult:
    names = tuple(rates)
    launches = []
    for b in range(3):
        for i, name in enumerate(names):
            rate = rates[name]
            cache = None if rate is None else {"cached_tokens": round(100 * rate), "prompt_tokens": 100}
            runs = tuple(_run(k, cache and {**cache, "hit_rate": rate, "source": "responses"}) for k in range(3))
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"L-{b}-{i}",
                    runs=runs,
                    ready_s=4.0,
                    env_report={"ok": True},
                    teardown={},
                    block=b,
                    position=i,
                    arm_index=i,
                )
            )
    return ABResult(
        experiment_id="E",
        simulated=True,
        host="local",
        profiles=names,
        launches=tuple(launches),
        host_facts={},
        design=Design.make(len(names), 3, "fixed", 0),
    )


def test_an_arms_rate_pools_its_runs() -> None:
    runs = [_run(0, {"cached_tokens": 10, "prompt_tokens": 100, "hit_rate": 0.1, "source": "responses"})]
    runs.append(_run(1, {"cached_tokens": 90, "prompt_tokens": 300, "hit_rate": 0.3, "source": "responses"}))
    got = arm_prefix_cache([*runs, _run(2, None)])
    assert got is not None and got["hit_rate"] == 0.25 and got["runs"] == 2 and got["run_hit_rates"] == [0.1, 0.3]
    assert arm_prefix_cache([_run(0, None)]) is None


def test_a_cache_gap_holds_back_the_verdict_in_every_format() -> None:
    result = _result({"baseline": 0.0, "pld": 0.5})
    (c,) = result.comparisons_at(1)
    assert c.held_back and c.verdict == "inconclusive" and c.ci_verdict == "no difference"
    assert c.cache_gap is not None and c.cache_gap.reason == "prefix-cache hit rates differ (baseline 0 %, pld 50 %)"
    (warning,) = cache_warnings(result)
    assert warning.startswith(
        "pld vs baseline: verdict held back (inconclusive): prefix-cache hit rates differ (baseline 0 %, pld 50 %), "
        "more than 5 points apart"
    )
    said = text.ab_text(result)
    assert "  pld: prefix cache 50.0 % of prompt tokens (450 of 900, 9 runs; from responses)" in said
    assert (
        "-> inconclusive: prefix-cache hit rates differ (baseline 0 %, pld 50 %); the CI alone says no difference"
        in said
    )
    assert f"WARNING: {warning}" in said
    md = markdown.ab_markdown(result)
    assert "## Prefix cache" in md and "- baseline: prefix cache 0.0 % of prompt tokens" in md
    assert "inconclusive: prefix-cache hit rates differ (baseline 0 %, pld 50 %)" in md
    page = html.ab_html(result)
    assert "inconclusive: prefix-cache hit rates differ (baseline 0 %, pld 50 %)" in page
    assert '<section id="prefix-cache"><h2>Prefix cache</h2><ul><li>baseline: prefix cache 0.0 %' in page
    doc = jsondoc.ab_json(result)
    assert doc["arms"][1]["prefix_cache"]["hit_rate"] == 0.5
    assert doc["arms"][1]["by_concurrency"][0]["prefix_cache"]["cached_tokens"] == 450
    assert doc["arms"][1]["runs"][0]["prefix_cache"]["hit_rate"] == 0.5
    (cmp,) = doc["comparisons"]
    assert cmp["verdict"] == "inconclusive" and cmp["held_back"] and cmp["ci_verdict"] == "no difference"
    assert cmp["cache_gap"] == {
        "vs_hit_rate": 0.0,
        "arm_hit_rate": 0.5,
        "points": 50.0,
        "threshold_points": 5.0,
        "measured": False,
    }


def test_a_held_back_verdict_exits_4_under_any_fail_on_that_judges_speed() -> None:
    result = _result({"baseline": 0.0, "pld": 0.5})
    for mode in ("slower", "different"):
        judged = failon.fail_on_verdict(result, [mode])
        assert judged.exit_code == 4, mode
        assert any("is inconclusive: prefix-cache hit rates differ" in r for r in judged.reasons), judged.reasons
    # --fail-on env judges the environment alone: a cache gap is no part of it.
    env = failon.fail_on_verdict(result, ["env"])
    assert not any("prefix-cache" in r for r in env.reasons), env.reasons
    assert failon.fail_on_verdict(result, ["env", "slower"]).exit_code == 4
    assert failon.fail_on_verdict(_result({"baseline": 0.0, "pld": 0.02}), ["slower"]).exit_code == 0


def test_cache_measured_keeps_the_verdict_and_says_the_gap() -> None:
    result = dataclasses.replace(_result({"baseline": 0.0, "pld": 0.5}), cache_measured=True)
    (c,) = result.comparisons_at(1)
    assert not c.held_back and c.verdict == "no difference" and c.ci_verdict is None
    (warning,) = cache_warnings(result)
    assert "the verdict stands because the cache is part of what is measured (--cache-measured)" in warning
    assert "measured as part of the comparison (--cache-measured)" in text.ab_text(result)
    assert failon.fail_on_verdict(result, ["slower"]).exit_code == 0
    assert jsondoc.ab_json(result)["comparisons"][0]["cache_gap"]["measured"] is True


def test_close_rates_or_silent_servers_give_no_warning_and_no_lines() -> None:
    assert cache_warnings(_result({"baseline": 0.40, "pld": 0.44})) == []
    silent = _result({"baseline": None, "pld": None})
    assert cache_warnings(silent) == [] and "prefix cache" not in text.ab_text(silent)
    half = _result({"baseline": None, "pld": 0.5})
    assert "  baseline: prefix cache not reported by the server" in text.ab_text(half)
