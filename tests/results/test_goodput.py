"""Goodput under an SLO from per-request rows, and comparisons (CIs, verdicts, --fail-on) on any metric."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from orchestrator.client.summary import percentile
from orchestrator.config.slo import parse_slo
from orchestrator.experiment.failon import fail_on_verdict
from orchestrator.report.jsondoc import ab_json
from orchestrator.report.lines import comparison_line
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.autostop import auto_look
from orchestrator.results.goodput import (
    CONTINUITY,
    attainment,
    block_values,
    goodput_seconds,
    needs_rows,
    run_attainment,
    run_value,
)
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.stats.estimates import RatioEstimate, verdict
from orchestrator.stats.sequential import SequentialPlan

SLO = parse_slo("ttft_p99=100ms,tpot_p99=20ms")


def row(i: int, ttft: float, e2e: float, tokens: int = 11, error: str | None = None) -> dict[str, Any]:
    return {"index": i, "tokens": tokens, "ttft_s": ttft, "e2e_s": e2e, "error": error}


def test_attainment_counts_requests_within_every_limit() -> None:
    rows = [
        row(0, 0.05, 0.05 + 10 * 0.015),  # good: TTFT 50 ms, TPOT 15 ms
        row(1, 0.15, 0.15 + 10 * 0.010),  # TTFT over
        row(2, 0.05, 0.05 + 10 * 0.025),  # TPOT over
        row(3, 0.10, 0.10 + 10 * 0.019),  # TTFT exactly at its limit: good (<=, as vLLM)
        row(4, 0.05, 0.05, tokens=1),  # one token: no TPOT, which cannot break the limit (vLLM counts it 0)
        row(5, 0.01, 0.02, error="HTTP 500"),  # failed: never good, still a request sent
    ]
    got = attainment(rows, seconds=2.0, slo=SLO)
    assert (got.requests, got.completed, got.good, got.good_tokens) == (6, 5, 3, 11 + 11 + 1)
    assert got.req_s == pytest.approx(1.5) and got.tok_s == pytest.approx(11.5)
    assert got.fraction == pytest.approx(0.5)
    assert got.to_dict()["attainment"] == pytest.approx(0.5)
    # The continuity correction a ratio uses: half a request (and half a good request's tokens) more.
    assert got.corrected("goodput") == pytest.approx((3 + CONTINUITY) / 2.0)
    assert got.corrected("goodput_tok_s") == pytest.approx((23 + CONTINUITY * 23 / 3) / 2.0)


def _run(i: int, rows: list[dict[str, Any]], *, seconds: float = 2.0, level: int = 1, **kw: Any) -> RunResult:
    tokens = sum(r["tokens"] for r in rows)
    return RunResult(
        index=i,
        warmup=False,
        tokens=tokens,
        seconds=seconds,
        tok_s=tokens / seconds,
        prompt_tokens=10,
        ttft_s=0.05,
        concurrency=level,
        aggregate_tok_s=tokens / seconds,
        requests=len(rows),
        per_request=tuple(rows),
        **kw,
    )


def test_open_loop_goodput_is_per_the_time_its_schedule_took_not_until_the_last_end() -> None:
    # two arms sent the same 8 requests on a schedule of 4 req/s; every request good in both; B's last one ended later
    rows = [row(i, 0.05, 0.05 + 10 * 0.015) for i in range(8)]
    sched = {"open_loop": {"requests": 8, "scheduled_rate": 4.0}}
    a = _run(0, rows, seconds=2.2, rate=4.0, metrics=sched)
    b = _run(0, rows, seconds=3.0, rate=4.0, metrics=sched)
    assert goodput_seconds(a) == goodput_seconds(b) == pytest.approx(2.0)
    got_a, got_b = run_attainment(a, SLO), run_attainment(b, SLO)
    assert got_a is not None and got_b is not None
    assert got_a.req_s == got_b.req_s == pytest.approx(4.0)  # every request good: the scheduled rate
    # half of them over the TTFT limit: half the rate, whatever the tail
    half = [row(i, t, t + 10 * 0.015) for i, t in enumerate([0.05, 0.5] * 4)]
    got = run_attainment(_run(0, half, seconds=9.0, rate=4.0, metrics=sched), SLO)
    assert got is not None and got.req_s == pytest.approx(2.0)
    # closed loop: the run's own seconds, start to last end (as vLLM)
    assert goodput_seconds(_run(0, rows, seconds=2.5)) == 2.5


def test_latency_percentiles_match_the_client_s_and_fall_back_to_its_stored_ones() -> None:
    rows = [row(i, 0.01 * (i + 1), 0.01 * (i + 1) + 10 * 0.001 * (i + 2)) for i in range(20)]
    run = _run(0, rows)
    ttfts = [r["ttft_s"] for r in rows]
    tpots = [(r["e2e_s"] - r["ttft_s"]) / 10 for r in rows]
    assert run_value(run, "ttft_p99") == pytest.approx(percentile(ttfts, 99))
    assert run_value(run, "ttft_p95") == pytest.approx(percentile(ttfts, 95))
    assert run_value(run, "tpot_p50") == pytest.approx(percentile(tpots, 50))
    assert run_value(run, "e2e_p90") == pytest.approx(percentile([r["e2e_s"] for r in rows], 90))
    stored = _run(0, [], metrics={"ttft": {"p99": 0.7}, "itl": {"p50": 0.01}})
    assert run_value(stored, "ttft_p99") == 0.7 and run_value(stored, "itl_p50") == 0.01
    assert run_value(stored, "ttft_p95") is None  # the client stores no p95: only the rows give it
    assert run_value(stored, "goodput", SLO) is None and run_attainment(stored, SLO) is None
    assert run_value(run, "goodput") is None  # no SLO, nothing to count
    assert run_value(run, "tok_s") == run.tok_s and run_value(run, "ttft_s") == 0.05
    assert needs_rows(SLO, "tok_s") and needs_rows(None, "e2e_p95") and not needs_rows(None, "ttft_p99")


def test_a_block_where_no_request_of_either_arm_met_the_slo_is_a_tie() -> None:
    bad = [row(0, 0.5, 1.0)]
    good = [row(0, 0.05, 0.15)]
    tie = block_values([_run(0, bad, seconds=1.0)], [_run(0, bad, seconds=3.0)], "goodput", SLO)
    assert tie == ([1.0], [1.0])  # not 3x, which is what the correction alone would make of the run lengths
    one_sided = block_values([_run(0, good, seconds=1.0)], [_run(0, bad, seconds=1.0)], "goodput", SLO)
    assert one_sided == ([1 + CONTINUITY], [CONTINUITY])
    assert block_values([_run(0, [])], [_run(0, good)], "goodput", SLO) is None  # no rows: no value


# ---------------------------------------------------------------- comparisons on goodput and on a latency


def _launch(arm: int, block: int, runs: list[RunResult]) -> LaunchResult:
    return LaunchResult(
        profile="baseline" if arm == 0 else "candidate",
        launch_id=f"L{block}-{arm}",
        runs=tuple(runs),
        ready_s=1.0,
        env_report={"ok": True},
        teardown={},
        block=block,
        position=arm,
        arm_index=arm,
    )


def _requests(n: int, ttft: float, tpot: float, tokens: int = 11) -> list[dict[str, Any]]:
    return [row(i, ttft, ttft + (tokens - 1) * tpot, tokens) for i in range(n)]


def _result(arms: list[dict[int, tuple[float, float, int]]], blocks: int = 4, **kw: Any) -> ABResult:
    """arms[i][level] = (TTFT, TPOT, good share out of 8 requests); block b scales the latencies a little."""
    launches = []
    for b in range(blocks):
        factor = 1 + 0.01 * (b % 3)
        for a, levels in enumerate(arms):
            runs = []
            for level, (ttft, tpot, good) in levels.items():
                for i in range(3):
                    rows = _requests(good, ttft * factor, tpot * factor) + _requests(8 - good, 1.0, 0.05)
                    runs.append(_run(i, rows, seconds=4.0 * factor, level=level))
            launches.append(_launch(a, b, runs))
    design = Design.make(len(arms), blocks, "fixed", 0)
    names = ("baseline", "candidate", "third")[: len(arms)]
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=names,
        launches=tuple(launches),
        host_facts={},
        design=design,
        **kw,
    )


def test_goodput_comparison_has_a_launch_level_ci_and_a_verdict_per_level() -> None:
    result = _result([{1: (0.05, 0.01, 8), 16: (0.05, 0.01, 8)}, {1: (0.04, 0.008, 8), 16: (0.05, 0.01, 2)}], slo=SLO)
    judged = _with(result, metric="goodput")
    (at1,) = judged.comparisons_at(1)
    (at16,) = judged.comparisons_at(16)
    assert at1.metric == "goodput" and at1.ratio == pytest.approx(1.0) and at1.verdict == "no difference"
    assert at16.ratio == pytest.approx((2 + CONTINUITY) / (8 + CONTINUITY))
    assert at16.verdict == "slower" and at16.estimate is not None and at16.estimate.blocks == 4
    assert at16.to_dict()["metric"] == "goodput" and at16.to_dict()["higher_is_better"] is True
    # The table's tok/s ratio stays a tok/s ratio whatever the verdicts are on.
    (tok,) = judged.comparisons_at(16, "tok_s")
    assert tok.metric == "tok_s" and tok.ratio != at16.ratio
    line = comparison_line(at16)
    assert line.startswith("candidate vs baseline @ 16: goodput 0.29") and "SLOWER by" in line
    # Arm-level goodput: req/s and tok/s of good requests, and the share of requests within every limit.
    cand = judged.arms[1]
    assert cand.spread_at(16, "goodput").median == pytest.approx(2 / 4.0, rel=0.02)  # type: ignore[union-attr]
    pooled = cand.attainment_at(16)
    assert pooled is not None and pooled.fraction == pytest.approx(0.25) and pooled.requests == 4 * 3 * 8
    ttft_check, tpot_check = cand.objectives_at(16)
    assert ttft_check[0].key == "ttft_p99" and ttft_check[2] is False  # its slow requests' 1 s TTFT sets the p99
    assert tpot_check[0].key == "tpot_p99" and tpot_check[2] is False


def _with(result: ABResult, **changes: Any) -> ABResult:
    return dataclasses.replace(result, **changes)


def test_a_latency_metric_flips_the_verdict_words_and_fail_on_follows() -> None:
    # The candidate's TTFT is 20 % lower at level 1 (better: faster) and 30 % higher at level 4 (worse: slower).
    result = _result([{1: (0.05, 0.01, 8), 4: (0.05, 0.01, 8)}, {1: (0.04, 0.01, 8), 4: (0.065, 0.01, 8)}])
    judged = _with(result, metric="ttft_p99")
    (at1,), (at4,) = judged.comparisons_at(1), judged.comparisons_at(4)
    assert at1.ratio == pytest.approx(0.8) and at1.verdict == "faster" and not at1.higher_is_better
    assert at4.ratio == pytest.approx(1.3) and at4.verdict == "slower"
    assert "ttft_p99 (lower is better) 0.800x" in comparison_line(at1) and "FASTER by 20.0%" in comparison_line(at1)
    assert "SLOWER by 30.0%" in comparison_line(at4)
    decision = fail_on_verdict(judged, ["slower"])
    assert decision.exit_code == 3
    texts = [c.text for c in decision.checks]
    assert texts[0].startswith("candidate is faster than baseline on ttft_p99 at concurrency 1 (ttft_p99 ratio 0.800")
    assert texts[1].startswith("candidate is slower than baseline on ttft_p99 at concurrency 4 (ttft_p99 ratio 1.300")
    # The same experiment on tok/s: today's words, today's lines (no metric named).
    plain = result.comparisons_at(1)[0]
    assert plain.metric == "tok_s" and comparison_line(plain).startswith("candidate vs baseline @ 1: 1.")


def test_verdict_direction_for_lower_is_better() -> None:
    low = RatioEstimate(ratio=0.8, lo=0.75, hi=0.85, blocks=4, method="m", log_sd=0.01)
    high = RatioEstimate(ratio=1.25, lo=1.2, hi=1.3, blocks=4, method="m", log_sd=0.01)
    assert verdict(low) == "slower" and verdict(high) == "faster"
    assert verdict(low, higher_is_better=False) == "faster" and verdict(high, higher_is_better=False) == "slower"
    same = RatioEstimate(ratio=1.0, lo=0.99, hi=1.01, blocks=4, method="m", log_sd=0.01)
    assert verdict(same, higher_is_better=False) == "no difference"


def test_fail_on_slower_on_goodput() -> None:
    result = _result([{1: (0.05, 0.01, 8)}, {1: (0.05, 0.01, 3)}], slo=SLO)
    decision = fail_on_verdict(_with(result, metric="goodput"), ["slower"])
    assert decision.exit_code == 3
    assert decision.checks[0].text.startswith("candidate is slower than baseline on goodput (goodput ratio 0.4")
    swapped = _result([{1: (0.05, 0.01, 3)}, {1: (0.05, 0.01, 8)}], slo=SLO)
    better = fail_on_verdict(_with(swapped, metric="goodput"), ["slower"])
    assert better.exit_code == 0 and better.checks[0].text.startswith("candidate is faster than baseline on goodput")


def test_no_request_of_either_arm_within_the_slo_is_said() -> None:
    result = _result([{1: (0.5, 0.01, 8)}, {1: (0.6, 0.01, 8)}], slo=SLO)
    (c,) = _with(result, metric="goodput").comparisons_at(1)
    assert c.ratio == 1.0 and c.verdict == "no difference"
    assert c.note is not None and "no request of either arm met the SLO" in c.note
    assert "NOTE: no request of either arm met the SLO" in comparison_line(c)
    one = _result([{1: (0.05, 0.01, 8)}, {1: (0.6, 0.01, 8)}], slo=SLO)
    (c,) = _with(one, metric="goodput").comparisons_at(1)
    assert c.verdict == "slower" and c.note and "no request of candidate met the SLO" in c.note


def test_reports_carry_the_slo_goodput_and_the_metric() -> None:
    result = _with(_result([{16: (0.05, 0.01, 8)}, {16: (0.05, 0.01, 2)}], slo=SLO), metric="goodput")
    doc = json.loads(json.dumps(ab_json(result)))
    assert doc["metric"] == "goodput" and doc["metric_higher_is_better"] is True
    assert doc["slo"] == {"ttft_p99": 0.1, "tpot_p99": 0.02} and doc["slo_text"] == "ttft_p99=100ms,tpot_p99=20ms"
    (level,) = doc["arms"][1]["by_concurrency"]
    gp = level["goodput"]
    assert gp["median_req_s"] == pytest.approx(0.5, rel=0.02) and gp["attainment"] == pytest.approx(0.25)
    assert gp["good_requests"] == 24 and gp["requests"] == 96 and gp["slo_met"] is False
    assert [o["objective"] for o in gp["objectives"]] == ["ttft_p99", "tpot_p99"]
    assert level["metric"]["name"] == "goodput" and len(level["metric"]["launch_values"]) == 4
    assert doc["arms"][1]["runs"][0]["goodput"]["good_requests"] == 2
    assert doc["launches"][1]["values"][0]["goodput_req_s"] == pytest.approx(0.5)  # block 1: factor 1
    assert doc["comparisons_by_concurrency"][0]["metric"] == "goodput"
    assert doc["comparisons_by_concurrency"][0]["verdict"] == "slower"
    text = ab_text(result)
    assert "verdicts on goodput: requests within every SLO limit per second" in text
    assert "SLO ttft_p99=100ms,tpot_p99=20ms (TTFT p99 <= 100 ms, TPOT p99 <= 20 ms)" in text
    assert "goodput req/s  good tok/s  within SLO  TTFT p99 ms  TPOT p99 ms  SLO met  vs baseline" in text
    md = ab_markdown(result)
    assert "### Goodput at concurrency 16" in md and "| candidate | 0.50 |" in md
    # No SLO, no metric: none of it (today's report).
    plain = _result([{16: (0.05, 0.01, 8)}, {16: (0.05, 0.01, 2)}])
    plain_doc = ab_json(plain)
    assert plain_doc["slo"] is None and plain_doc["metric"] == "tok_s"
    assert "goodput" not in plain_doc["arms"][0]["by_concurrency"][0]
    assert "goodput" not in ab_text(plain) and "verdicts on" not in ab_text(plain)


def test_latency_metric_table_in_the_report() -> None:
    result = _with(_result([{1: (0.05, 0.01, 8)}, {1: (0.04, 0.01, 8)}]), metric="ttft_p99")
    text = ab_text(result)
    assert "time to first token, p99 at concurrency 1 (ms, lower is better)" in text
    (cand,) = [ln for ln in text.splitlines() if ln.strip().startswith("candidate") and "ttft" not in ln][-1:]
    assert "40.0" in cand and "0.800" in cand
    assert math.isclose(ab_json(result)["arms"][1]["by_concurrency"][0]["metric"]["median"], 0.04, rel_tol=0.02)


def test_the_html_report_has_the_goodput_table_and_says_what_the_verdicts_are_on() -> None:
    from orchestrator.report.html import ab_html

    page = ab_html(_with(_result([{16: (0.05, 0.01, 8)}, {16: (0.05, 0.01, 2)}], slo=SLO), metric="goodput"))
    assert '<table id="table-goodput-c16">' in page and "<th>within SLO</th>" in page
    assert 'id="verdict-metric">verdicts on goodput' in page and 'id="verdict-slo">SLO ttft_p99=100ms' in page
    assert "candidate vs baseline @ 16: goodput 0.29" in page


def test_blocks_auto_looks_decide_on_the_metric() -> None:
    # Both arms stream alike (tok/s: no difference, decided); their goodput swaps from block to block (undecided).
    goods = [(8, 4), (4, 8), (8, 4)]
    launches = [
        _launch(arm, b, [_run(i, _requests(good, 0.05, 0.01) + _requests(8 - good, 1.0, 0.05)) for i in range(3)])
        for b, pair in enumerate(goods)
        for arm, good in enumerate(pair)
    ]
    design = Design.make(2, 3, "fixed", 0, SequentialPlan(max_blocks=8))
    result = ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("baseline", "candidate"),
        launches=tuple(launches),
        host_facts={},
        design=design,
        slo=SLO,
    )
    assert auto_look(result) == (True, "look after block 3: every comparison is decided; stopping (--blocks auto)")
    stop, line = auto_look(_with(result, metric="goodput"))
    assert not stop and line.startswith("look after block 3: undecided: candidate @ 1; adding block 4")


def test_a_capacity_comparison_follows_the_verdict_rule_of_every_comparison() -> None:
    """A CI above 1 is not enough to call a capacity higher: the effect must reach --min-effect, as for tok/s."""
    from orchestrator.results.capacity import CapacityComparison

    small = CapacityComparison.of("b", "a", [math.log(r) for r in (1.010, 1.012, 1.011)], 0, 0.02)
    assert small.lo is not None and small.lo > 1 and small.verdict == "no difference"  # was "higher"
    large = CapacityComparison.of("b", "a", [math.log(r) for r in (1.30, 1.32, 1.31)], 0, 0.02)
    assert large.verdict == "higher"
    assert CapacityComparison.of("b", "a", [math.log(r) for r in (0.70, 0.72, 0.71)], 0, 0.02).verdict == "lower"
