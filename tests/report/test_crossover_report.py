"""The crossover in the results model and every report: an arm that wins alone and loses under load."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.report.jsondoc import ab_json
from orchestrator.report.lines import crossover_lines
from orchestrator.report.markdown import ab_markdown
from orchestrator.report.text import ab_text
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from tests.levelresults import gain_result

LEVELS = (1, 4, 16)


def test_an_arm_that_wins_alone_and_loses_under_load_crosses_between() -> None:
    result = gain_result({1: 1.4, 4: 1.1, 16: 0.7})
    ((arm, x),) = result.crossovers()
    assert arm.label == "spec" and x.status == "crosses" and x.pays_below and x.at is not None and 4 < x.at < 16
    (line,) = crossover_lines(result)
    assert line.startswith("crossover: spec vs base: pays below concurrency ~") and "over 4 blocks" in line
    assert line in ab_text(result) and line in ab_markdown(result)
    from orchestrator.report.html import ab_html

    page = ab_html(result)
    assert '<section id="crossover">' in page and '<figure id="fig-load">' in page and "crosses 1 at ~" in page
    figure = page[page.index('<figure id="fig-load">') :].split("</figure>")[0]
    assert "ratio of tok/s per stream (arm / baseline)" in figure and "SIMULATED (orch" in figure
    (doc,) = ab_json(result)["crossovers"]
    assert doc["status"] == "crosses" and doc["arm_label"] == "spec" and doc["ci"][0] < doc["at"] < doc["ci"][1]


def test_no_crossing_in_the_range_is_said_and_one_block_says_nothing() -> None:
    (line,) = crossover_lines(gain_result({1: 1.4, 4: 1.3, 16: 1.2}))
    assert "does not cross in the range measured (concurrency 1 to concurrency 16): faster throughout" in line
    assert crossover_lines(gain_result({1: 1.4, 4: 1.3, 16: 1.2}, blocks=1)) == []  # one block: no interval to give


def _slo_result(p99_at: dict[int, float], blocks: int = 4) -> ABResult:
    """One arm whose p99 TTFT grows with the load (seconds at each level), with a little noise per launch."""
    from orchestrator.config.slo import parse_slo

    rng = random.Random(5)
    launches = []
    for b in range(blocks):
        runs = tuple(
            RunResult(
                index=i,
                warmup=False,
                tokens=256,
                seconds=3.2,
                tok_s=80.0,
                prompt_tokens=20,
                ttft_s=0.02,
                concurrency=c,
                aggregate_tok_s=80.0 * c,
                metrics={"ttft": {"p50": p / 3, "p90": p / 2, "p99": p * math.exp(rng.gauss(0, 0.02))}},
            )
            for c, p in p99_at.items()
            for i in range(2)
        )
        launches.append(
            LaunchResult(
                profile="base",
                launch_id=f"L{b}",
                runs=runs,
                ready_s=1.0,
                env_report={"ok": True},
                teardown={},
                spec_steps=None,
                block=b,
                position=0,
                arm_index=0,
            )
        )
    design = Design.make(1, blocks, "fixed", 1)
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base",),
        launches=tuple(launches),
        host_facts={},
        design=design,
        slo=parse_slo("ttft_p99=500ms"),
    )


def test_the_highest_load_within_the_slo_is_where_the_percentile_meets_its_limit() -> None:
    from orchestrator.report.lines import slo_capacity_lines

    result = _slo_result({1: 0.1, 4: 0.3, 16: 1.2})  # 500 ms is met at 4, missed at 16
    ((arm, x),) = result.max_within_slo()
    assert arm.label == "base"
    assert x.status == "crosses" and x.pays_below and x.at is not None and 4 < x.at < 16
    head, line = slo_capacity_lines(result)
    assert head.startswith("highest load within the SLO (TTFT p99 <= 500 ms)")
    assert line.startswith("  base: concurrency ~") and "over 4 blocks" in line
    assert ab_json(result)["max_within_slo"][0]["status"] == "crosses"
    within = _slo_result({1: 0.1, 4: 0.2, 16: 0.3})
    assert "within the SLO at every level measured" in slo_capacity_lines(within)[1]


def test_an_undecided_slo_capacity_names_where_leaving_it_cannot_be_excluded(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.report.lines import slo_capacity_lines
    from orchestrator.stats.crossover import Crossover

    result = _slo_result({1: 0.1, 4: 0.2, 16: 0.3})
    undecided = Crossover(
        status="undecided", at=None, lo=4.2, hi=6.2345, pays_below=None, levels=(1.0, 4.0, 16.0), blocks=3
    )
    monkeypatch.setattr(ABResult, "max_within_slo", lambda self: [(self.arms[0], undecided)])
    line = slo_capacity_lines(result)[1]
    assert line == (
        "  base: not decided within the range measured (concurrency 1 to 16): in some of its 3 blocks the capacity "
        "lies outside the levels (past the last, or over the SLO at the first); its 95% CI lies within concurrency "
        "4.2 to 6.23: more blocks or levels would say"
    )


def _two_arm_slo_result(base_p99: dict[int, float], arm_p99: dict[int, float], blocks: int = 4) -> ABResult:
    """base and spec, each with its p99 TTFT at each level (a little noise per launch)."""
    from orchestrator.config.slo import parse_slo

    rng = random.Random(9)
    launches = []
    for b in range(blocks):
        for arm, p99_at in enumerate((base_p99, arm_p99)):
            runs = tuple(
                RunResult(
                    index=i,
                    warmup=False,
                    tokens=256,
                    seconds=3.2,
                    tok_s=80.0,
                    prompt_tokens=20,
                    ttft_s=0.02,
                    concurrency=c,
                    aggregate_tok_s=80.0 * c,
                    metrics={"ttft": {"p50": p / 3, "p99": p * math.exp(rng.gauss(0, 0.03))}},
                )
                for c, p in p99_at.items()
                for i in range(2)
            )
            name = ("base", "spec")[arm]
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"L{b}{arm}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={"ok": True},
                    teardown={},
                    spec_steps=None,
                    block=b,
                    position=arm,
                    arm_index=arm,
                )
            )
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, blocks, "fixed", 1),
        slo=parse_slo("ttft_p99=500ms"),
    )


def test_the_ab_on_the_highest_load_within_the_slo_gives_a_ratio_with_its_ci_and_verdict() -> None:
    from orchestrator.report.lines import slo_capacity_lines
    from orchestrator.stats.crossover import first_crossing

    # base meets 500 ms up to ~8 (0.25 s at 4, 1.0 s at 16); spec misses it from ~3 on (0.4 s at 1... 1.6 s at 4)
    result = _two_arm_slo_result({1: 0.1, 4: 0.25, 16: 1.0}, {1: 0.3, 4: 0.9, 16: 3.0})
    (c,) = result.capacity_comparisons()
    assert c.arm == "spec" and c.base == "base" and c.blocks == 4 and c.censored == 0
    assert c.verdict == "lower" and c.ratio is not None and c.lo is not None and c.hi is not None
    assert c.lo < c.ratio < c.hi < 1
    # the ratio is that of the two interpolated crossings (noise aside)
    base_at = first_crossing([1, 4, 16], [5.0, 2.0, 0.5])[1]
    spec_at = first_crossing([1, 4, 16], [5 / 3, 5 / 9, 5 / 30])[1]
    assert base_at is not None and spec_at is not None and c.ratio == pytest.approx(spec_at / base_at, rel=0.1)
    line = slo_capacity_lines(result)[-1]
    assert line.startswith("  spec vs base, highest load within the SLO: ") and "-> LOWER" in line
    assert line.strip() in ab_text(result) and line.strip() in ab_markdown(result)
    (doc,) = ab_json(result)["max_within_slo_comparisons"]
    assert doc["verdict"] == "lower" and doc["ci95"][0] < doc["ratio"] < doc["ci95"][1] and doc["censored_blocks"] == 0


def test_a_capacity_past_the_range_bounds_the_ratio_from_below_and_decides_higher() -> None:
    from orchestrator.report.lines import slo_capacity_lines

    # spec is within the SLO at every level: its capacity is past the last level (16), base's is ~8, so each
    # block's ratio is at least 16 / ~8: only the CI's lower end is known, and it is above 1
    result = _two_arm_slo_result({1: 0.1, 4: 0.25, 16: 1.0}, {1: 0.1, 4: 0.2, 16: 0.3})
    (c,) = result.capacity_comparisons()
    assert c.ratio is None and c.bound == "lower" and c.verdict == "higher" and c.hi is None
    assert c.blocks == 4 and c.censored == 4 and c.lo is not None and 1.5 < c.lo < 2.0
    line = slo_capacity_lines(result)[-1]
    assert f"above {c.lo:.3f}x (the lower end of its 95% CI over 4 blocks; in 4 of them" in line
    assert "can only understate the ratio) -> HIGHER" in line
    (doc,) = ab_json(result)["max_within_slo_comparisons"]
    assert doc["ratio"] is None and doc["ci95"] == [c.lo, None] and doc["bound"] == "lower"
    # The bound decides only past the minimum effect, the rule of every verdict: a lower end of 1.5-2x does not
    # show a 100 % gain, and no block crossed within the range to say more.
    import dataclasses

    (strict,) = dataclasses.replace(result, min_effect=1.0).capacity_comparisons()
    assert strict.bound is None and strict.verdict is None and strict.censored == 4


def test_a_capacity_past_the_range_of_the_baseline_bounds_the_ratio_from_above_and_decides_lower() -> None:
    # the mirror: base within the SLO everywhere (past 16), spec out of it from ~3: each ratio is at most ~3 / 16
    result = _two_arm_slo_result({1: 0.1, 4: 0.2, 16: 0.3}, {1: 0.3, 4: 0.9, 16: 3.0})
    (c,) = result.capacity_comparisons()
    assert c.bound == "upper" and c.verdict == "lower" and c.lo is None and c.hi is not None and c.hi < 0.25


def test_capacities_both_past_the_range_are_censored_and_not_compared() -> None:
    from orchestrator.report.lines import slo_capacity_lines

    # both within the SLO at every level: each ratio could be anything, so neither end is bounded
    result = _two_arm_slo_result({1: 0.1, 4: 0.2, 16: 0.3}, {1: 0.1, 4: 0.2, 16: 0.35})
    (c,) = result.capacity_comparisons()
    assert c.ratio is None and c.verdict is None and c.bound is None and c.blocks == 0 and c.censored == 4
    line = slo_capacity_lines(result)[-1]
    assert "not compared: 0 block(s)" in line and "4 block(s) left out" in line


def test_without_a_censored_block_the_ratio_is_the_plain_one() -> None:
    # spec crosses at ~14, base at ~8, in every block: no bound, the ratio and its two-sided CI
    result = _two_arm_slo_result({1: 0.1, 4: 0.25, 16: 1.0}, {1: 0.1, 4: 0.3, 16: 0.55})
    (c,) = result.capacity_comparisons()
    assert c.censored == 0 and c.bound is None and c.verdict == "higher" and c.ratio is not None


def test_a_bound_is_given_only_where_every_block_has_one() -> None:
    from orchestrator.stats.crossover import bounded_ratio_end, capacity_log_bounds

    levels = [1.0, 4.0, 16.0]
    assert capacity_log_bounds(levels, ("crosses", 8.0)) == (math.log(8), math.log(8))
    assert capacity_log_bounds(levels, ("above", None)) == (math.log(16), math.inf)
    assert capacity_log_bounds(levels, ("below", None)) == (-math.inf, 0.0)
    with pytest.raises(ValueError):
        capacity_log_bounds(levels, ("missing", None))
    upper = bounded_ratio_end([math.log(0.3), math.log(0.35), math.log(0.32)], "upper")
    assert upper is not None and 0.3 < upper < 0.5
    lower = bounded_ratio_end([math.log(2.0), math.log(2.1)], "lower")
    assert lower is not None and lower < 2.0
    # one block whose ratio is unbounded on that side (both capacities past the range): no end can be given
    assert bounded_ratio_end([math.log(0.3), math.inf, math.log(0.3)], "upper") is None
    assert bounded_ratio_end([math.log(0.3)], "upper") is None


def test_first_crossing_says_which_side_a_curve_stays_on() -> None:
    from orchestrator.stats.crossover import first_crossing, ratio_interval

    assert first_crossing([1, 10], [2.0, 0.5]) == ("crosses", pytest.approx(math.sqrt(10)))
    assert first_crossing([1, 10], [2.0, 1.5]) == ("above", None)
    assert first_crossing([1, 10], [0.9, 0.5]) == ("below", None)
    assert first_crossing([1, 10], [2.0, None]) == ("missing", None)
    mean, lo, hi = ratio_interval([math.log(0.5), math.log(0.5)])
    assert mean == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)


def _per_block_slo_result(base: list[dict[int, float]], spec: list[dict[int, float]]) -> ABResult:
    """base and spec with each block's p99 TTFT at each level given exactly (no noise)."""
    from orchestrator.config.slo import parse_slo

    launches = []
    for b, pair in enumerate(zip(base, spec, strict=True)):
        for arm, p99_at in enumerate(pair):
            runs = tuple(
                RunResult(
                    index=i,
                    warmup=False,
                    tokens=256,
                    seconds=3.2,
                    tok_s=80.0,
                    prompt_tokens=20,
                    ttft_s=0.02,
                    concurrency=c,
                    aggregate_tok_s=80.0 * c,
                    metrics={"ttft": {"p50": p / 3, "p99": p}},
                )
                for c, p in p99_at.items()
                for i in range(2)
            )
            name = ("base", "spec")[arm]
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"L{b}{arm}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={"ok": True},
                    teardown={},
                    spec_steps=None,
                    block=b,
                    position=arm,
                    arm_index=arm,
                )
            )
    return ABResult(
        experiment_id="exp",
        simulated=True,
        host="local",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, len(base), "fixed", 1),
        slo=parse_slo("ttft_p99=500ms"),
    )


def test_a_block_that_dips_below_the_slo_and_recovers_gives_one_capacity_to_the_arm_and_the_ab() -> None:
    from orchestrator.report.html import ab_html
    from orchestrator.report.lines import slo_capacity_lines
    from orchestrator.stats.crossover import first_crossing

    # base meets 500 ms up to ~12 in every block but block 2, which misses it at 4 and meets it again at 8; spec
    # meets it up to ~6.6 everywhere
    steady, dip = {1: 0.1, 4: 0.2, 8: 0.3, 16: 1.0}, {1: 0.1, 4: 0.6, 8: 0.3, 16: 1.0}
    spec = {1: 0.1, 4: 0.25, 8: 0.7, 16: 2.0}
    result = _per_block_slo_result([steady, dip, steady, steady], [spec] * 4)
    levels = [1.0, 4.0, 8.0, 16.0]
    ((_, b), (_, s)) = result.max_within_slo()
    # the arm's own estimate is the geometric mean of each block's first crossing: the A/B's per-block number
    firsts = [first_crossing(levels, [0.5 / p for p in row.values()])[1] for row in (steady, dip, steady, steady)]
    assert b.status == "crosses" and b.at == pytest.approx(math.exp(sum(math.log(a or 0) for a in firsts) / 4))
    assert b.crosses_again and not s.crosses_again and b.at is not None and s.at is not None
    (c,) = result.capacity_comparisons()
    assert c.blocks == 4 and c.censored == 0 and c.ratio == pytest.approx(s.at / b.at)
    note = (
        "base block 2 missed the SLO at concurrency 4 and met it again at concurrency 8: capacity taken at the first "
        "miss"
    )
    assert f"  note: {note}" in slo_capacity_lines(result)
    assert note in ab_text(result) and note in ab_markdown(result) and note in ab_html(result)
    (doc,) = ab_json(result)["max_within_slo_notes"]
    assert doc == {
        "arm_label": "base", "block": 1, "block_number": 2, "missed_at": 4.0, "met_again_at": 8.0, "text": note,
    }  # fmt: skip
    # without a dip, no note
    assert _per_block_slo_result([steady] * 2, [spec] * 2).slo_recoveries() == []


def test_a_capacity_with_blocks_on_both_sides_of_the_range_is_undecided_with_what_bounds_it() -> None:
    from orchestrator.stats.crossover import capacity, recovery

    levels = [1.0, 4.0, 16.0]
    # two blocks cross at ~8, one stays within the SLO past 16: only a lower end is known
    x = capacity(levels, [[5.0, 2.0, 0.5], [5.0, 2.0, 0.5], [5.0, 3.0, 1.5]])
    assert x.status == "undecided" and x.at is None and x.hi is None and x.lo is not None and x.blocks == 3
    assert capacity(levels, [[5.0, 2.0, 1.5], [5.0, 3.0, 1.5]]).status == "pays throughout"
    assert capacity(levels, [[0.5, 2.0, 0.5], [0.9, 0.5, 0.4]]).status == "never pays"
    with pytest.raises(ValueError):
        capacity(levels, [[5.0, 2.0, 0.5], [5.0, None, 0.5]])  # one complete block
    assert recovery(levels, [5.0, 0.8, 1.2]) == (4.0, 16.0)
    assert recovery(levels, [0.8, 1.2, 0.5]) == (1.0, 4.0)
    assert recovery(levels, [5.0, 0.8, 0.5]) is None and recovery(levels, [5.0, None, 1.2]) is None
