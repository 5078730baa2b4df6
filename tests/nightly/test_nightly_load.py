"""Nightly open-loop items (`workload: {rate: [...]}`) and the metrics taken across levels, `crossover` and
`max_rate_slo`: the suite's grammar and its mistakes, the series a night records (a censored night included), how
each is judged against history, the summary's words, and a real night on the simulator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.slo import parse_slo
from orchestrator.nightly import history, result
from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.report import comparison_text, fmt_series_value, item_line, series_text
from orchestrator.nightly.result import ItemReport
from orchestrator.nightly.suite import Metric, SuiteError
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import Rate, RunResult
from tests.conftest import FAST_SIM, WriteProfile, free_port
from tests.faults.support import assert_plain, run
from tests.nightly.support import item_night
from tests.nightly.test_nightly_parts import _item
from tests.nightly.test_suite import write_suite

SLO = parse_slo("ttft_p99=300ms")
RATES = (1.0, 2.0, 4.0, 8.0)


@pytest.fixture
def suite_dir(write_profile: WriteProfile, profile_dir: Path) -> Path:
    write_profile("plain", engine="sglang", model_path="/m", tp_size=1, port=31111, sim={"load_s": 0.1})
    write_profile("other", extends="plain")
    return profile_dir.parent


OPEN = {"rate": [1, 2, 4], "duration": 5, "runs": 2, "max_tokens": 64}


def _suite(**item: Any) -> dict[str, Any]:
    base = {"name": "load", "ab": ["plain", "other"], "sim": True, "workload": OPEN}
    return {"suite": "box", "items": [{**base, **item}]}


# ---------------------------------------------------------------- the suite


def test_an_open_loop_item_with_the_metrics_across_levels(suite_dir: Path) -> None:
    workload = {**OPEN, "rate": [0.5, 2, 4], "arrivals": "gamma:2", "max_concurrency": 16}
    data = _suite(
        workload=workload,
        slo="ttft_p99=500ms,e2e_p99=10s",
        metrics={"goodput@0.5": None, "crossover": "15%", "max_rate_slo": "20%"},
        fail_on="crossover-below=2, max-rate-slo-below=1.5",
    )
    (item,) = suite_mod.load(write_suite(suite_dir, data)).items
    bench = item.bench
    assert bench.rate == (0.5, 2.0, 4.0) and bench.arrivals == "gamma:2" and bench.max_concurrency == 16
    assert bench.duration_s == 5 and bench.requests_per_level is None and bench.open_loop
    assert item.levels == (Rate(0.5), Rate(2.0), Rate(4.0)) and isinstance(item.levels[0], Rate)
    assert [(m.key, m.threshold) for m in item.metrics] == [("goodput@0.5", 0.03), ("crossover", 0.15),
                                                           ("max_rate_slo", 0.2)]  # fmt: skip
    assert item.fail_on == ("crossover-below=2", "max-rate-slo-below=1.5")
    # Requests per level instead of a duration; without either, orch ab's default duration.
    data = _suite(workload={**OPEN, "requests": 40, "duration": None})
    assert suite_mod.load(write_suite(suite_dir, data)).items[0].bench.requests_per_level == 40
    data = _suite(workload={"rate": [1, 2], "runs": 2})
    assert suite_mod.load(write_suite(suite_dir, data)).items[0].bench.duration_s == 30.0


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"workload": {**OPEN, "concurrency": [1, 2]}}, "workload: concurrency: not with rate: (open loop"),
        ({"workload": {**OPEN, "requests": 10}}, "workload: duration, requests: a run at each rate lasts a time"),
        ({"workload": {"concurrency": [1, 2], "arrivals": "poisson"}}, "workload: arrivals: applies to rate levels"),
        ({"workload": {**OPEN, "rate": [1, 1]}}, "workload: rate: expected up to 64 distinct request rates"),
        ({"workload": {**OPEN, "rate": [0, 1]}}, "workload: rate: expected up to 64 distinct request rates"),
        ({"workload": {**OPEN, "arrivals": "gamma"}}, "workload: arrivals: 'gamma': gamma needs its coefficient"),
        ({"metrics": ["goodput@3"], "slo": "ttft=1s"}, "metrics: goodput@3: the workload runs 1 req/s, 2 req/s, 4"),
        ({"metrics": ["crossover@2"]}, "metrics: 'crossover@2': crossover is taken across every level"),
        ({"metrics": ["crossover"], "workload": {**OPEN, "rate": [2]}},
         "item 'load': metrics: crossover: needs two or more levels to interpolate between, and the workload runs "
         "2 req/s only; give workload.rate: [R1, R2, ...]"),
        ({"metrics": ["crossover"], "ab": None, "bench": "plain"},
         "metrics: crossover: a crossover is where an arm's ratio to the baseline crosses 1; it needs an A/B"),
        ({"metrics": ["max_rate_slo"]}, "metrics: max_rate_slo: the highest load within an SLO needs an slo: with a "
         "percentile objective (e.g. slo: ttft_p99=500ms,tpot_p99=50ms,e2e_p99=10s); the item has no slo:"),
        ({"metrics": ["max_rate_slo"], "slo": "ttft=1s"}, "the item has slo: ttft=1000ms"),
        ({"fail_on": "crossover-below=2", "workload": {"concurrency": [4], "runs": 2}},
         "fail_on: crossover-below=2: needs two or more levels"),
        ({"fail_on": "max-rate-slo-below=2"}, "fail_on: max-rate-slo-below=2: the highest load within an SLO"),
        ({"metrics": ["max_rate_slo"], "slo": "ttft_p99=1s", "ab": None, "bench": "plain"},
         "metrics: max_rate_slo: its 95% CI is taken over blocks and needs two or more; the item has blocks: 1 (the "
         "default for one profile): give blocks: 2 or more"),
        ({"fail_on": "crossover-below=2", "blocks": 1},
         "fail_on: crossover-below=2: its 95% CI is taken over blocks and needs two or more; the item has blocks: 1:"),
        ({"fail_on": "crossover-below=fast"}, "fail_on: 'crossover-below=fast': crossover-below=R needs R, a load"),
        ({"fail_on": "faster"}, "fail_on: unknown mode 'faster'; valid: slower, different, env, crossover-below=R"),
    ],
)  # fmt: skip
def test_mistakes_name_the_item_the_field_and_what_is_valid(
    suite_dir: Path, item: dict[str, Any], expected: str
) -> None:
    with pytest.raises(SuiteError) as e:
        suite_mod.load(write_suite(suite_dir, _suite(**item)))
    assert expected in str(e.value) and "suite.yaml: item 'load'" in str(e.value)


def test_check_lists_each_item_s_slo_and_fail_on(suite_dir: Path) -> None:
    data = _suite(metrics=["crossover"], slo="ttft_p99=300ms,e2e_p99=2s", fail_on="crossover-below=2")
    out = run("nightly", str(write_suite(suite_dir, data)), "--check", cwd=suite_dir)
    assert out.rc == 0, out.text
    assert "; crossover (3 %); slo ttft_p99=300ms,e2e_p99=2000ms; fail_on crossover-below=2; timeout" in out.out


def test_check_warns_of_a_load_metric_at_a_throughput_sized_threshold(suite_dir: Path) -> None:
    tight = _suite(metrics=["crossover"])  # the suite's default threshold, 3 %
    out = run("nightly", str(write_suite(suite_dir, tight)), "--check", cwd=suite_dir)
    assert out.rc == 0 and "WARNING: load: crossover at 3 %: a crossover's or SLO capacity's 95 % CI" in out.out
    own = _suite(metrics={"crossover": "20%", "tok_s@1": "3%"})
    out = run("nightly", str(write_suite(suite_dir, own, "own.yaml")), "--check", cwd=suite_dir)
    assert out.rc == 0 and "WARNING" not in out.out, out.text


def test_a_suite_mistake_exits_2_before_anything_runs(suite_dir: Path) -> None:
    path = write_suite(suite_dir, _suite(metrics=["max_rate_slo"]))
    out = run("nightly", str(path), "--check", cwd=suite_dir)
    assert out.rc == 2 and "metrics: max_rate_slo: the highest load within an SLO needs an slo:" in out.err
    assert_plain(out.text)


# ---------------------------------------------------------------- what a night records


def _run(i: int, rate: float, tok_s: float, ttft_p99: float) -> RunResult:
    return RunResult(
        index=i, warmup=False, tokens=256, seconds=256 / tok_s, tok_s=tok_s, prompt_tokens=30, ttft_s=0.02,
        concurrency=0, aggregate_tok_s=tok_s * rate, rate=rate, metrics={"ttft": {"p50": 0.02, "p99": ttft_p99}},
    )  # fmt: skip


def load_result(gain: dict[float, float], p99: dict[float, float], blocks: int = 3) -> ABResult:
    """baseline at 80 tok/s at every rate; eagle3 at gain[rate] x that; eagle3's TTFT p99 by rate (the baseline's
    half of it). Each block a little off the others, so the CIs are real."""
    launches = []
    for b in range(blocks):
        jitter = 1 + 0.01 * (b - 1)
        for arm, name in enumerate(("baseline", "eagle3")):
            runs = tuple(
                _run(k * 2 + i, r, 80 * (gain[r] if arm else 1) * jitter * (1 + 0.002 * i),
                     p99[r] * (1 if arm else 0.5) * (2 - jitter))
                for k, r in enumerate(RATES)
                for i in range(2)
            )  # fmt: skip
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"l{b}{arm}",
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
    design = Design(blocks=blocks, order="fixed", seed=0, schedule=tuple((0, 1) for _ in range(blocks)))
    return ABResult(
        experiment_id="e",
        simulated=True,
        host="local",
        profiles=("baseline", "eagle3"),
        launches=tuple(launches),
        host_facts={},
        design=design,
        slo=SLO,
    )


CROSSES = {1.0: 1.3, 2.0: 1.15, 4.0: 0.9, 8.0: 0.7}
P99 = {1.0: 0.1, 2.0: 0.2, 4.0: 0.4, 8.0: 0.8}


def _open_item(*metrics: Metric) -> Any:
    item = _item(*metrics)
    return dataclasses.replace(item, bench=dataclasses.replace(item.bench, rate=RATES, concurrency=(1,)), slo=SLO)


def measured(res: ABResult, *metrics: Metric) -> dict[str, history.SeriesValue]:
    return {s.series: s for s in history.measure(_open_item(*metrics), res)[0]}


def test_a_night_records_the_crossover_and_each_arm_s_highest_load_within_the_slo() -> None:
    by = measured(load_result(CROSSES, P99), Metric("crossover", None, 0.1), Metric("max_rate_slo", None, 0.1),
                  Metric("tok_s", 2, 0.03))  # fmt: skip
    cross = by["eagle3/baseline:crossover"]
    assert 2 < cross.value < 4 and cross.censored is None and cross.higher_is_better and cross.n == 3
    assert cross.lo is not None and cross.hi is not None and cross.lo < cross.value < cross.hi
    assert cross.env_arms == ("eagle3", "baseline")
    # eagle3's p99 reaches the 300 ms limit between 2 and 4 req/s; the baseline's (half of it) between 4 and 8.
    assert 2 < by["eagle3:max_rate_slo"].value < 4 and 4 < by["baseline:max_rate_slo"].value < 8
    assert by["eagle3/baseline:tok_s@2"].value == pytest.approx(1.15, rel=0.01)  # an open-loop level by its rate
    assert "eagle3/baseline crossover load" in series_text(_judged(cross))
    assert json.dumps(cross.to_dict())  # storable as it is


def test_a_night_that_does_not_cross_is_censored_at_the_end_of_the_range() -> None:
    pays = measured(load_result(dict.fromkeys(RATES, 1.3), P99), Metric("crossover", None, 0.1))
    never = measured(load_result(dict.fromkeys(RATES, 0.7), P99), Metric("crossover", None, 0.1))
    above, below = pays["eagle3/baseline:crossover"], never["eagle3/baseline:crossover"]
    assert (above.censored, above.value, above.lo, above.hi) == ("above", 8.0, 8.0, None)
    assert (below.censored, below.value, below.lo, below.hi) == ("below", 1.0, None, 1.0)
    assert fmt_series_value(above) == ">8" and fmt_series_value(below) == "<1"
    # Within the SLO at every rate measured: the highest load lies beyond the range.
    fast = measured(load_result(CROSSES, dict.fromkeys(RATES, 0.05)), Metric("max_rate_slo", None, 0.1))
    assert fast["eagle3:max_rate_slo"].censored == "above"


# ---------------------------------------------------------------- judged against history


def _value(v: float, censored: str | None = None, env: str = "e") -> history.SeriesValue:
    return history.SeriesValue(
        series="eagle3/baseline:crossover",
        arm="eagle3/baseline",
        metric="crossover",
        value=v,
        lo=None,
        hi=None,
        n=3,
        threshold=0.1,
        higher_is_better=True,
        env=env,
        env_arms=("eagle3", "baseline"),
        min_history=5,
        censored=censored,
    )


def _night(i: int, v: history.SeriesValue | None) -> history.ItemNight:
    envs = {arm: {"engine version": v.env if v else "e"} for arm in ("eagle3", "baseline")}
    return item_night(i, ((v,) if v else ()), envs)


def _judge(values: list[history.SeriesValue], tonight: history.SeriesValue) -> result.SeriesVerdict:
    past = [_night(i, v) for i, v in enumerate(values)]
    return result.judge(tonight, past, _night(len(values), tonight), 5)


def _judged(v: history.SeriesValue) -> result.SeriesVerdict:
    return _judge([], v)


STEADY = [_value(6.0 * (1 + 0.01 * ((-1) ** i))) for i in range(8)]


def test_crossings_are_judged_like_any_series() -> None:
    assert _judge(STEADY, _value(6.02)).status == "ok"
    v = _judge(STEADY, _value(4.0))  # the arm stops paying a third lower than it did
    assert v.status == "regression" and v.assessment.change == pytest.approx(4.0 / 6.0 - 1, rel=0.02)
    assert _judge(STEADY, _value(9.0)).status == "improvement"


def test_no_crossing_is_judged_by_its_bound_and_only_where_that_is_conclusive() -> None:
    # Worse at every rate (below 1 req/s where it used to cross at 6): at least -83 %, a regression.
    v = _judge(STEADY, _value(1.0, "below"))
    assert v.status == "regression" and "does not cross down to 1: worse at every level measured" in v.note
    assert "-83.3 % or worse" in v.note
    # Better at every rate: an improvement, never a regression.
    up = _judge(STEADY, _value(8.0, "above"))
    assert up.status == "improvement" and "does not cross up to 8: better at every level measured" in up.note
    # Undecided is no number: never judged, whatever the bound it is stored with.
    un = _judge(STEADY, _value(1.5, "undecided"))
    assert un.status == "ok" and un.note.endswith("not judged")
    # A series that never crosses has no numbers: ok every night, not "building history" forever.
    always = [_value(8.0, "above") for _ in range(8)]
    assert _judge(always, _value(8.0, "above")).status == "ok"
    # The first crossing after nights that did not cross: no crossing to compare with, so not judged a regression;
    # the note says what changed.
    first = _judge(always, _value(7.5))
    assert first.status == "building" and "crosses in the range again (the night before: does not cross up to 8" in (
        first.note
    )
    # Censored nights leave the noise of the crossings alone: a crossing after a mix is judged on the crossings.
    mixed = [*STEADY[:4], _value(8.0, "above"), *STEADY[4:]]
    assert _judge(mixed, _value(6.0)).status == "ok" and _judge(mixed, _value(4.0)).status == "regression"


def test_a_censored_night_in_a_new_environment_is_an_environment_step() -> None:
    v = _judge(STEADY, _value(1.0, "below", env="new"))
    assert v.status == "environment" and "engine version: e -> new" in v.note  # never a regression across it
    assert _judge([*STEADY, _value(1.0, "below", env="new")], _value(1.0, "below", env="new")).status == "ok"


def test_hindsight_sees_only_the_nights_that_crossed() -> None:
    from orchestrator.nightly.report import series_history

    # Undecided nights are stored at a placeholder (a geometric mean of where a crossing may lie): 2.15, 2.04, 2.94
    # and 1.14 are no levels the series was at, and must not make a change point in hindsight.
    values = (2.15, 2.04, 2.94, 2.2, 2.1, 2.5, 2.3, 1.14, 1.1, 1.2, 1.15)
    undecided = [_night(i, _value(v, "undecided")) for i, v in enumerate(values)]
    quiet = series_history(undecided, "eagle3/baseline:crossover", None)
    assert quiet.overall is None or not [st for st in quiet.overall.steps if st.kind != "environment"], quiet.overall
    # The crossings around them still are: a step from ~6 to ~4 is found across undecided nights in between.
    mixed = [_night(i, v) for i, v in enumerate([*STEADY, _value(1.2, "undecided"), *(_value(4.0) for _ in range(6))])]
    found = series_history(mixed, "eagle3/baseline:crossover", None)
    assert found.overall is not None and [st.kind for st in found.overall.steps] == ["regression"], found.overall
    # ...placed on the first crossing night after the step, and the undecided night is never a point of it
    assert [found.rows[found.assessed[st.index]].night.night_id for st in found.overall.steps] == ["n9"]
    assert 8 not in found.assessed


# ---------------------------------------------------------------- a real night on the simulator


@pytest.mark.slow
def test_a_night_of_open_loop_levels_on_the_simulator(write_profile: WriteProfile, tmp_path: Path) -> None:
    for name in ("base", "spec"):
        write_profile(
            name, engine="sglang", model_path="/models/m", tp_size=1, port=free_port(), ready_timeout_s=60,
            sim={**FAST_SIM, "launch_noise": 0.003},
        )  # fmt: skip
    suite = write_suite(
        tmp_path,
        {
            "suite": "load", "deadline": "10m", "wait": "5s", "min_history": 3,
            "items": [{
                "name": "open", "ab": ["base", "spec"], "host": "local", "sim": True, "blocks": 2, "gpu_wait": 0,
                "grace": 2, "slo": "ttft_p99=2s",
                "workload": {"rate": [2, 4], "requests": 4, "runs": 1, "warmup": 0, "max_tokens": 16, "min_run_s": 0},
                "metrics": ["goodput@4", "crossover", "max_rate_slo"],
                "fail_on": "max-rate-slo-below=1",
            }],
        },
    )  # fmt: skip
    out = run("nightly", str(suite), "--db", str(tmp_path / "n.db"), "--now", "2026-11-01T02:00", "--json",
              cwd=tmp_path, timeout=300)  # fmt: skip
    assert out.rc == 0, out.text
    doc = json.loads(out.out)
    (item,) = doc["items"]
    assert item["status"] == "building" and item["fail_on"]["status"] in ("ok", "inconclusive"), item
    series = {s["series"]: s for s in item["series"]}
    assert {"base:goodput@4", "spec:goodput@4", "spec/base:goodput@4"} <= set(series)
    # Two identical arms, each within a 2 s TTFT p99 at both rates: no crossing seen, each within the SLO beyond 4.
    cross = series["spec/base:crossover"]
    assert cross["censored"] in ("above", "below", "undecided", None) and cross["n"] == 2
    for arm in ("base", "spec"):
        assert series[f"{arm}:max_rate_slo"]["censored"] == "above" and series[f"{arm}:max_rate_slo"]["value"] == 4
    assert item["fail_on"]["checks"][0]["mode"] == "max-rate-slo-below=1"


def test_tonight_s_comparisons_name_an_open_loop_level_by_its_rate() -> None:
    c = {"arm": "e", "vs": "b", "concurrency": None, "rate": 2.0, "ratio": 1.1, "ci95": [1.0, 1.2], "verdict": "faster"}
    assert comparison_text(c) == "e vs b @2 req/s: 1.100x [1.000, 1.200] faster"


def test_a_censored_night_is_said_on_the_item_s_line_only_when_it_decides_something() -> None:
    down = _judge(STEADY, _value(1.0, "below"))
    assert series_text(down) == (
        "eagle3/baseline crossover load <1: does not cross down to 1: worse at every level measured: -83.3 % or worse "
        "(the level before: 6)"
    )
    same = _judge([_value(8.0, "above")] * 6, _value(8.0, "above"))
    assert (
        series_text(same) == "eagle3/baseline crossover load >8: does not cross up to 8: better at every level measured"
    )
    item = ItemReport(item="load", host="local", kind="ab", simulated=True, status="ok", series=(same,))
    assert item_line(item).startswith("- ok `load` (local, SIMULATED): eagle3/baseline crossover load >8")
    paged = ItemReport(item="load", host="local", kind="ab", simulated=True, status="regression", series=(same, down))
    assert "**REGRESSION** `load` (local, SIMULATED): eagle3/baseline crossover load <1:" in item_line(paged)


def test_an_undecided_bound_is_said_on_the_item_s_line() -> None:
    same = _judge([_value(8.0, "above")] * 6, _value(8.0, "above"))
    reason = "sim-eagle3-fast's crossover vs baseline is ~5.64 req/s (95% CI 1.3 req/s to 7.63 req/s, over 2 blocks)"
    checks = [
        {"mode": "crossover-below=3", "status": "inconclusive", "exit_code": 4, "reason": reason + ": straddles 3"},
        {"mode": "slower", "status": "inconclusive", "exit_code": 4, "reason": "the A/B's own words"},
        {"mode": "max-rate-slo-below=2", "status": "ok", "exit_code": 0, "reason": "held"},
    ]
    item = ItemReport(
        item="load", host="local", kind="ab", simulated=True, status="ok", series=(same,), fail_on={"checks": checks}
    )
    line = item_line(item)
    assert line.endswith(f"; fail_on crossover-below=3 undecided: {reason}: straddles 3"), line
    assert "fail_on slower" not in line and "max-rate-slo-below" not in line  # said elsewhere / held: silent


def test_a_censored_slo_capacity_says_so_in_the_slo_s_words() -> None:
    v = dataclasses.replace(
        _value(12.0, "above"), series="baseline:max_rate_slo", arm="baseline", metric="max_rate_slo"
    )
    assert result.censored_text(v) == "within the SLO at every level measured, up to 12"
    below = dataclasses.replace(v, value=1.0, censored="below")
    assert result.censored_text(below) == "outside the SLO at every level measured, down to 1"


def test_history_metric_takes_a_level_as_the_suite_wrote_it_and_a_whole_series_name() -> None:
    from orchestrator.cli.nightly import metric_matches

    assert metric_matches("baseline:goodput@4", "goodput@4") and metric_matches("baseline:goodput@4", "goodput@4.0")
    assert metric_matches("baseline:goodput@0.5", "goodput@.5") and not metric_matches(
        "baseline:goodput@4", "goodput@2"
    )
    assert metric_matches("baseline:goodput@4", "goodput") and metric_matches(
        "baseline:goodput@4", "baseline:goodput@4"
    )
    assert not metric_matches("spec:goodput@4", "baseline:goodput@4")
    assert metric_matches("spec/baseline:crossover", "spec/baseline:crossover")


def test_the_nightly_and_metric_take_one_value_of_a_run_for_every_name_they_share() -> None:
    """ttft_p99 was the client's stored p99 in a night and the per-request rows' in `--metric ttft_p99`: one run,
    two values. Now every shared name goes through results/goodput.comparable."""
    from orchestrator.config.slo import METRICS as AB_METRICS
    from orchestrator.results.goodput import comparable

    res = load_result(CROSSES, P99)
    rows = tuple({"index": i, "tokens": 10, "ttft_s": 0.5 + 0.01 * i, "e2e_s": 0.9, "error": None} for i in range(4))
    launches = tuple(
        dataclasses.replace(la, runs=tuple(dataclasses.replace(r, per_request=rows) for r in la.runs))
        for la in res.launches
    )
    res = dataclasses.replace(res, launches=launches)
    arm, level = res.arms[1], Rate(2.0)
    shared = {name: as_metric for name in suite_mod.metrics() if (as_metric := suite_mod.as_metric(name))}
    assert {"tok_s", "agg_tok_s", "ttft_p99", "goodput", "tpot_p99", "e2e_p95"} <= set(shared)
    assert set(shared.values()) == set(AB_METRICS)  # every --metric is a nightly metric, under one name each
    for name, as_metric in shared.items():
        assert suite_mod.metrics()[name][1] == AB_METRICS[as_metric].higher_is_better, name
        nightly = history.run_values(arm, Metric(name, 2.0, 0.03), level)
        ab = [[v for r in la.timed_at(level) if (v := comparable(r, as_metric, res.slo))] for la in arm.launches]
        assert nightly == ab, name
    ttft = history.run_values(arm, Metric("ttft_p99", 2.0, 0.03), level)
    assert all(v > 0.5 for launch in ttft for v in launch)  # the rows' p99, not the stored one (P99 at 2 req/s: 0.2)
