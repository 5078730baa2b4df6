"""The nightly runner's pure parts: exit codes, item statuses, series from a result, environments, Markdown lines."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from orchestrator.config.profile import Profile, Speculative
from orchestrator.config.workload import BenchConfig
from orchestrator.launch import fingerprint
from orchestrator.nightly import changepoint, history, report, result
from orchestrator.nightly import night as nightly
from orchestrator.nightly.suite import Item, Metric
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from tests.experiment.test_failon import fingerprint as make_fingerprint
from tests.nightly.support import item_night, series_value


@pytest.mark.parametrize(
    ("status", "items", "code"),
    [
        ("complete", ["ok", "building", "improvement", "environment"], 0),
        ("complete", ["ok", "failed"], 1),
        ("deadline", ["timeout", "skipped"], 1),
        ("complete", ["regression", "failed"], 3),  # the regression is what pages; the summary lists the failure
        ("complete", ["fail_on", "ok"], 3),  # tonight's A/B under fail_on pages too, told apart from a regression
        ("deadline", ["regression", "skipped"], 3),
        ("interrupted", ["regression", "skipped"], 130),
        ("complete", [], 0),
        ("busy", [], 1),  # another night held the machine: this one did not run
        ("failed", ["ok"], 1),  # orch itself failed mid-night
    ],
)
def test_night_exit_codes(status: str, items: list[str], code: int) -> None:
    assert result.night_exit_code(status, items) == code


def _verdict(status: str) -> result.SeriesVerdict:
    value = series_value("a", "tok_s", 1.0, n=1, env="e")
    a = changepoint.Assessment(
        status=status, steps=(), new=None, baseline=None, change=None, noise=None, outliers=(), nights=1, needed=6
    )
    return result.SeriesVerdict(value=value, assessment=a, status=status)


def test_an_items_status_is_its_worst_series() -> None:
    v = _verdict
    assert result.item_status([v("ok"), v("regression"), v("environment")], False) == "regression"
    assert result.item_status([v("ok"), v("environment"), v("improvement")], False) == "environment"
    assert result.item_status([v("ok"), v("improvement")], False) == "improvement"
    assert result.item_status([v("building"), v("building")], False) == "building"
    assert result.item_status([v("building"), v("ok")], False) == "building"  # a metric added lately
    assert result.item_status([v("ok")], True) == "fail_on"  # tonight's A/B under fail_on: no history in it
    assert result.item_status([v("building")], True) == "fail_on"  # night 1 pages, but is no regression
    assert result.item_status([v("regression")], True) == "regression"  # the line says both
    assert result.item_status([], False) == "ok"


def _run(i: int, tok_s: float, ttft: float, accept: float | None, level: int = 1) -> RunResult:
    return RunResult(
        index=i, warmup=False, tokens=256, seconds=256 / tok_s, tok_s=tok_s, prompt_tokens=30, ttft_s=ttft,
        spec_accept_length=accept, concurrency=level, aggregate_tok_s=tok_s * level,
        metrics={"ttft": {"p50": ttft, "p99": ttft * 2}},
    )  # fmt: skip


def _result(base: float, spec: float, blocks: int = 3, seed: int = 7) -> ABResult:
    launches = []
    for b in range(blocks):
        f = 1 + 0.003 * (b - 1)
        for arm, (name, speed) in enumerate((("baseline", base), ("eagle3", spec))):
            accept = 2.0 if arm else None
            runs = tuple(_run(i, speed * f * (1 + 0.001 * i), 0.05 + 0.01 * arm, accept) for i in range(3))
            fp = make_fingerprint(profile__name=name)
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"l{b}{arm}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={"ok": True},
                    teardown={},
                    spec_steps=3 if arm else None,
                    block=b,
                    position=arm,
                    arm_index=arm,
                    fingerprint=fp,
                )
            )
    design = Design(blocks=blocks, order="fixed", seed=seed, schedule=tuple((0, 1) for _ in range(blocks)))
    return ABResult(
        experiment_id="e1",
        simulated=True,
        host="local",
        profiles=("baseline", "eagle3"),
        launches=tuple(launches),
        host_facts={},
        design=design,
    )


def _item(*metrics: Metric) -> Item:
    plain = Profile(
        name="baseline", source="x", chain=("baseline",), engine="sglang", model_path="/m", tp_size=1, port=30000
    )
    spec = dataclasses.replace(plain, name="eagle3", speculative=Speculative(algorithm="EAGLE3"))
    return Item(
        name="ab",
        profiles=(plain, spec),
        host="local",
        sim=True,
        bench=BenchConfig(),
        blocks=3,
        order="fixed",
        metrics=metrics,
        threshold=0.03,
        timeout_s=60.0,
    )


def test_series_of_an_ab_item() -> None:
    item = _item(Metric("tok_s", None, 0.02), Metric("ttft_p99", None, 0.1), Metric("accept_length", None, 0.05))
    series, envs = history.measure(item, _result(80.0, 60.0), min_history=4)
    by = {s.series: s for s in series}
    assert set(by) == {
        "baseline:tok_s", "eagle3:tok_s", "eagle3/baseline:tok_s", "baseline:ttft_p99", "eagle3:ttft_p99",
        "eagle3:accept_length",
    }  # fmt: skip
    assert by["baseline:tok_s"].value == pytest.approx(80.0, rel=0.01) and by["baseline:tok_s"].n == 3
    assert by["baseline:tok_s"].lo is not None and by["baseline:tok_s"].lo < 80.0 < by["baseline:tok_s"].hi
    assert by["eagle3/baseline:tok_s"].value == pytest.approx(0.75, rel=0.01) and by["eagle3/baseline:tok_s"].n == 3
    assert (
        by["baseline:ttft_p99"].value == pytest.approx(0.1, rel=0.01) and not by["baseline:ttft_p99"].higher_is_better
    )
    assert by["eagle3:accept_length"].value == pytest.approx(2.0) and by["eagle3:tok_s"].threshold == 0.02
    assert {s.min_history for s in series} == {4}
    # Arms differ in their profile, so in their environment; a ratio's environment is both arms'.
    assert by["baseline:tok_s"].env != by["eagle3:tok_s"].env
    assert by["eagle3/baseline:tok_s"].env_arms == ("eagle3", "baseline")
    assert envs["baseline"]["profile.name"] == "baseline" and "host.hostname" not in envs["baseline"]
    assert history.SeriesValue.from_dict(by["eagle3/baseline:tok_s"].to_dict()) == by["eagle3/baseline:tok_s"]


def test_a_confirmation_pools_both_experiments_as_more_blocks() -> None:
    first, second = _result(80.0, 60.0), _result(78.0, 58.5)
    pooled = nightly._merge(first, second)
    assert pooled.design.blocks == 6 and pooled.blocks == 6 and len(pooled.launches) == 12
    (c,) = pooled.comparisons
    assert c.estimate is not None and c.estimate.blocks == 6
    item = _item(Metric("tok_s", None, 0.02))
    by = {s.series: s for s in history.measure(item, pooled)[0]}
    assert by["baseline:tok_s"].n == 6 and 78.0 < by["baseline:tok_s"].value < 80.0


def test_an_environment_is_what_moves_numbers_not_names() -> None:
    a = make_fingerprint()
    renamed = make_fingerprint(host__hostname="other", host__boot_id="b-2", orch__git_sha="bbb", collected_at=9.0)
    assert fingerprint.environment(a) == fingerprint.environment(renamed)
    upgraded = make_fingerprint(software__engine_version="0.5.10", gpus__driver="560.1")
    diffs = fingerprint.environment_diff(fingerprint.environment(a), fingerprint.environment(upgraded))
    assert [d.describe() for d in diffs] == ["engine version: 0.5.9 -> 0.5.10", "GPU driver: 550.54 -> 560.1"]
    assert fingerprint.environment(None) == {}


def _report(status: str, **kw: Any) -> result.ItemReport:
    return result.ItemReport(item="check", host="gpu-box", kind="bench", simulated=False, status=status, **kw)


def test_markdown_lines() -> None:
    assert report.item_line(_report("failed", error="server exited 1")) == (
        "- **FAILED** `check` (gpu-box): server exited 1"
    )
    value = history.SeriesValue(
        series="check:tok_s",
        arm="check",
        metric="tok_s",
        value=77.2,
        lo=76.9,
        hi=77.5,
        n=2,
        threshold=0.03,
        higher_is_better=True,
        env="e",
        env_arms=("check",),
    )
    a = changepoint.Assessment(
        status="regression",
        steps=(),
        new=None,
        baseline=82.1,
        change=77.2 / 82.1 - 1,
        noise=0.01,
        outliers=(),
        nights=9,
        needed=6,
    )
    line = report.item_line(
        _report("regression", series=(result.SeriesVerdict(value=value, assessment=a, status="regression"),))
    )
    assert line == "- **REGRESSION** `check` (gpu-box): check tok/s 77.2 [76.9, 77.5]: -6.0 % vs 82.1 (threshold 3 %)"
    env = result.SeriesVerdict(
        value=value,
        assessment=dataclasses.replace(a, status="environment"),
        status="environment",
        note="engine: a -> b",
    )
    line = report.item_line(_report("environment", series=(env,)))
    assert (
        line
        == "- **environment change** `check` (gpu-box): engine: a -> b; check tok/s 77.2 [76.9, 77.5]: -6.0 % vs 82.1 "
        "before"
    )


def test_a_series_too_noisy_for_its_threshold_is_said_on_its_line() -> None:
    value = series_value("spec", "tok_s", 57.7, n=2, env="e")
    steady = changepoint.Assessment(
        status="ok", steps=(), new=None, baseline=57.7, change=0.0, noise=0.01, outliers=(), nights=9, needed=6
    )
    noisy = dataclasses.replace(steady, noise=0.1)
    assert not result.SeriesVerdict(value=value, assessment=steady, status="ok").too_noisy
    assert result.SeriesVerdict(value=value, assessment=noisy, status="ok").too_noisy
    # Building nights have too few differences to say anything about the noise yet.
    assert not result.SeriesVerdict(
        value=value, assessment=dataclasses.replace(noisy, status="building"), status="building"
    ).too_noisy
    line = report.item_line(_report("ok", series=(result.SeriesVerdict(value=value, assessment=noisy, status="ok"),)))
    assert "warning: spec tok/s varies 10.0 % night to night, more than half its 3 % threshold" in line


def test_a_field_a_night_could_not_read_is_no_environment_change() -> None:
    a = {"gpus.driver": "550", "software.engine_version": "0.5.9"}
    unread = {"gpus.driver": None, "software.engine_version": "0.5.9"}
    missing = {"software.engine_version": "0.5.9"}
    upgraded = {"gpus.driver": "560", "software.engine_version": "0.5.9"}
    assert history.environment_ids([a, unread, missing, a]) == ["0", "0", "0", "0"]
    # What a night could not read is still known from before: a change seen after the gap is a change.
    assert history.environment_ids([a, unread, upgraded, upgraded, a]) == ["0", "0", "1", "1", "2"]
    assert history.environment_ids([]) == []
    env = history.series_environment({"b": {"x": 1}, "s": {"x": 2}}, ("s", "b"))
    assert env == {"s\tx": 2, "b\tx": 1}


def test_multi_node_nights_share_one_environment_whatever_port_each_drew() -> None:
    # Nights stored before the init address was left out of the argv carry the port each launch drew; tonight's
    # environment has the placeholder. All are one environment: history builds, nothing says "environment change".
    def argv(port: int) -> list[str]:
        return [
            "-m",
            "sglang.launch_server",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--dist-init-addr",
            f"10.0.0.1:{port}",
        ]

    def night(n: int, value: float, env: dict[str, Any]) -> history.ItemNight:
        key = history.env_key({"a": env}, ("a",))
        v = series_value("a", "tok_s", value, n=1, env=key, min_history=3)
        return item_night(n, [v], {"a": env})

    tonight_env = fingerprint.environment(make_fingerprint(argv=["/py", *argv(31000)]))
    assert tonight_env["argv"][-1] == "<rank 0>:<port>"
    past = [night(n, 80.0 + 0.1 * n, {**tonight_env, "argv": argv(25000 + n)}) for n in range(4)]
    tonight = night(9, 80.2, tonight_env)
    verdict = result.judge(tonight.series[0], past, tonight, 3)
    assert verdict.status == "ok" and verdict.assessment.nights == 5, verdict
    # `orch history` in hindsight sees one environment too (no environment step between the stored nights).
    shown = report.series_history([*past, tonight], "a:tok_s", None)
    assert shown.overall is not None and not [s for s in shown.overall.steps if s.kind == "environment"]
    assert all(r.verdict is not None and r.verdict.status != "environment" for r in shown.rows)


SLOWER = {
    "modes": ["slower"], "status": "fail", "exit_code": 3, "reasons": [],
    "checks": [{"mode": "slower", "status": "fail", "exit_code": 3,
                "reason": "eagle3 is slower than baseline (ratio 0.730, 95% CI 0.722-0.738)"}],
}  # fmt: skip


def test_a_fail_on_hit_is_labelled_fail_on_not_regression() -> None:
    value = history.SeriesValue(
        series="baseline:tok_s",
        arm="baseline",
        metric="tok_s",
        value=82.2,
        lo=82.0,
        hi=82.4,
        n=3,
        threshold=0.03,
        higher_is_better=True,
        env="e",
        env_arms=("baseline",),
    )
    first = changepoint.Assessment(
        status="building", steps=(), new=None, baseline=None, change=None, noise=None, outliers=(), nights=1, needed=6
    )
    r = result.ItemReport(
        item="eagle3-vs-baseline", host="gpu-box", kind="ab", simulated=False, status="fail_on",
        series=(result.SeriesVerdict(value=value, assessment=first, status="building"),), fail_on=SLOWER,
    )  # fmt: skip
    line = report.item_line(r)
    assert line.startswith(
        "- **FAIL-ON slower** `eagle3-vs-baseline` (gpu-box): tonight's A/B: eagle3 is "
        "slower than baseline (ratio 0.730, 95% CI 0.722-0.738); baseline tok/s 82.2"
    ), line
    assert "REGRESSION" not in line
    doc = r.to_dict()
    assert doc["status"] == "fail_on" and doc["fail_on_hit"] == ["slower"]
    night = result.NightReport(
        night_id="n1",
        suite="s",
        suite_path="s.yaml",
        night_at=0.0,
        started_at=0.0,
        finished_at=1.0,
        status="complete",
        items=(r,),
    )
    assert night.exit_code == 3 and night.to_dict()["counts"] == {"fail_on": 1}
    assert "1 item(s): 1 FAIL-ON; exit 3" in report.night_markdown(night)
    # A regression against history and a fail_on hit on one item: REGRESSION, and the line says the hit as well.
    a = changepoint.Assessment(
        status="regression",
        steps=(),
        new=None,
        baseline=82.1,
        change=-0.06,
        noise=0.01,
        outliers=(),
        nights=9,
        needed=6,
    )
    both = dataclasses.replace(
        r, status="regression", series=(result.SeriesVerdict(value=value, assessment=a, status="regression"),)
    )
    line = report.item_line(both)
    assert line.startswith("- **REGRESSION** ") and "FAIL-ON slower, tonight's A/B: eagle3 is slower" in line


def test_history_says_a_night_that_paged_under_fail_on() -> None:
    def night(n: int, decision: dict[str, Any]) -> history.ItemNight:
        v = series_value("a", "tok_s", 80.0 + 0.1 * n, n=1, env="k", min_history=3)
        return item_night(n, [v], {"a": {}}, decisions={"a:tok_s": decision})

    hit = "slower: eagle3 is slower than baseline (ratio 0.730, 95% CI 0.722-0.738)"
    nights = [night(0, {"status": "building", "fail_on": hit}), night(1, {"status": "building"})]
    shown = report.series_history(nights, "a:tok_s", None)
    rows = [x for x in report.history_text("ab", "gpu-box", [shown]).splitlines() if "building" in x]
    assert rows[0].endswith(f"verdicts from night 4; FAIL-ON {hit}") and "FAIL-ON" not in rows[1], rows
    doc = report.history_json("ab", "gpu-box", [shown], nights)
    assert [n["fail_on"] for n in doc["series"][0]["nights"]] == [hit, None]


def test_an_environment_step_says_each_difference_once() -> None:
    def verdict(series: str, arms: tuple[str, ...], change: float) -> result.SeriesVerdict:
        value = history.SeriesValue(
            series=series,
            arm="/".join(arms),
            metric="tok_s",
            value=61.3,
            lo=61.0,
            hi=61.6,
            n=3,
            threshold=0.03,
            higher_is_better=True,
            env="e",
            env_arms=arms,
        )
        a = changepoint.Assessment(
            status="environment",
            steps=(),
            new=None,
            baseline=64.0,
            change=change,
            noise=0.01,
            outliers=(),
            nights=1,
            needed=6,
        )
        changes = tuple((arm, d) for arm in arms for d in ("engine version: 0.5.9 -> 0.5.10", "sglang: 0.5.9 -> "
                                                                 "0.5.10"))  # fmt: skip
        note = result.describe_changes(changes, arms)
        return result.SeriesVerdict(value=value, assessment=a, status="environment", note=note, changes=changes)

    series = (verdict("b:tok_s", ("b",), -0.042), verdict("e:tok_s", ("e",), -0.04),
              verdict("e/b:tok_s", ("e", "b"), 0.002))  # fmt: skip
    assert series[2].note == "engine version: 0.5.9 -> 0.5.10 (both arms); sglang: 0.5.9 -> 0.5.10 (both arms)"
    line = report.item_line(_report("environment", series=series))
    assert line.count("engine version: 0.5.9 -> 0.5.10") == 1 and line.count("sglang") == 1, line
    assert "engine version: 0.5.9 -> 0.5.10 (both arms); sglang: 0.5.9 -> 0.5.10 (both arms); b tok/s 61.3" in line
    assert "b tok/s 61.3 [61.0, 61.6]: -4.2 % vs 64.0 before" in line
    # A difference only one arm had says which; more than three distinct ones are counted, not listed.
    assert result.describe_changes([("e", "profile x: 1 -> 2")], ("b", "e")) == "profile x: 1 -> 2 (e only)"
    many = [("b", f"d{i}: 1 -> 2") for i in range(5)]
    assert result.describe_changes(many, ("b",)).endswith("; and 2 more (orch compare shows them all)")


def test_a_re_run_that_does_not_confirm_says_what_it_measured_and_why() -> None:
    value = series_value("b", "tok_s", 77.0, n=3, env="e")

    def verdict(status: str, change: float, noise: float) -> result.SeriesVerdict:
        return result.SeriesVerdict(
            value=value,
            assessment=changepoint.Assessment(
                status=status,
                steps=(),
                new=None,
                baseline=80.0,
                change=change,
                noise=noise,
                outliers=(),
                nights=10,
                needed=6,
            ),
            status=status,
        )

    first = verdict("regression", -0.061, 0.016)
    status, note = result.rerun_note(first, verdict("regression", -0.059, 0.016))
    assert (status, note) == ("regression", "confirmed by a re-run: -6.1 %, then -5.9 %")
    # -4.0 % against a 3 % threshold, not confirmed: because one night must also be 3 noise units off.
    status, note = result.rerun_note(first, verdict("ok", -0.040, 0.016))
    assert status == "ok", note
    assert note == (
        "not confirmed: the first measurement was -6.1 %, a re-run from fresh state -4.0 %, beyond the 3 % "
        "threshold but not significant: a single night counts only 3 noise units off the level (1.6 % night to "
        "night here, so about -4.9 %); both are kept"
    )
    _, note = result.rerun_note(first, verdict("ok", -0.012, 0.016))
    assert note.endswith("a re-run from fresh state -1.2 %, that is within the 3 % threshold; both are kept")
