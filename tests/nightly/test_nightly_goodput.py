"""Nightly `metrics: [goodput@N]` with an item's `slo:`: the suite's grammar and the series a night records."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config.slo import parse_slo
from orchestrator.nightly import history
from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.report import fmt_value, metric_label
from orchestrator.nightly.suite import Metric, SuiteError
from orchestrator.results.goodput import CONTINUITY
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from tests.conftest import WriteProfile
from tests.nightly.test_nightly_parts import _item
from tests.nightly.test_suite import write_suite

SLO = parse_slo("ttft_p99=100ms,tpot_p99=20ms")


@pytest.fixture
def suite_dir(write_profile: WriteProfile, profile_dir: Path) -> Path:
    write_profile("plain", engine="sglang", model_path="/m", tp_size=1, port=31111, sim={"load_s": 0.1})
    write_profile("other", extends="plain")
    return profile_dir.parent


def _suite(**item: Any) -> dict[str, Any]:
    base = {"name": "load", "ab": ["plain", "other"], "sim": True, "workload": {"concurrency": [1, 4], "runs": 2}}
    return {"suite": "box", "items": [{**base, **item}]}


def test_goodput_at_a_level_with_the_item_s_slo(suite_dir: Path) -> None:
    s = suite_mod.load(write_suite(suite_dir, _suite(metrics=["tok_s", "goodput@4"], slo="ttft_p99=500ms")))
    (item,) = s.items
    assert [m.key for m in item.metrics] == ["tok_s", "goodput@4"] and item.metrics[1].higher_is_better
    assert item.slo == parse_slo("ttft_p99=500ms")


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"metrics": ["goodput@4"]}, "item 'load': metrics: goodput counts requests within an SLO: add slo:"),
        (
            {"metrics": ["goodput@4"], "slo": "ttft_p99=500"},
            "item 'load': slo: 'ttft_p99=500': expected a duration from 1ms to 1d",
        ),
        ({"metrics": ["goodput"], "slo": {"ttft_p99": 0.5}}, "item 'load': slo: expected objectives such as"),
        ({"metrics": ["goodput@8"], "slo": "ttft=1s"}, "metrics: goodput@8: the workload runs concurrency 1, 4"),
    ],
)
def test_goodput_mistakes_name_the_item_and_field(suite_dir: Path, item: dict[str, Any], expected: str) -> None:
    with pytest.raises(SuiteError) as e:
        suite_mod.load(write_suite(suite_dir, _suite(**item)))
    assert expected in str(e.value)


def _run(i: int, good: int, level: int = 4) -> RunResult:
    rows = [
        {"index": k, "tokens": 11, "ttft_s": 0.05 if k < good else 0.5, "e2e_s": 0.15 if k < good else 0.6}
        for k in range(8)
    ]
    return RunResult(
        index=i, warmup=False, tokens=88, seconds=2.0, tok_s=80.0, prompt_tokens=10, ttft_s=0.05,
        concurrency=level, aggregate_tok_s=320.0, requests=8, per_request=tuple(rows),
    )  # fmt: skip


def test_a_night_records_each_arm_s_goodput_and_the_ratio() -> None:
    launches = [
        LaunchResult(
            profile=name,
            launch_id=f"l{b}{arm}",
            runs=(_run(0, good), _run(1, good)),
            ready_s=1.0,
            env_report={"ok": True},
            teardown={},
            spec_steps=None,
            block=b,
            position=arm,
            arm_index=arm,
        )
        for b in range(3)
        for arm, (name, good) in enumerate((("baseline", 8), ("eagle3", 0)))
    ]
    design = Design(blocks=3, order="fixed", seed=0, schedule=tuple((0, 1) for _ in range(3)))
    result = ABResult(
        experiment_id="e",
        simulated=True,
        host="local",
        profiles=("baseline", "eagle3"),
        launches=tuple(launches),
        host_facts={},
        design=design,
        slo=SLO,
    )
    item = dataclasses.replace(_item(Metric("goodput", 4, 0.05)), slo=SLO)
    by = {s.series: s for s in history.measure(item, result)[0]}
    assert set(by) == {"baseline:goodput@4", "eagle3:goodput@4", "eagle3/baseline:goodput@4"}
    assert by["baseline:goodput@4"].value == pytest.approx((8 + CONTINUITY) / 2.0)
    # No request within the SLO is a value (half a request a run), so a collapse shows as a regression.
    assert by["eagle3:goodput@4"].value == pytest.approx(CONTINUITY / 2.0)
    assert by["eagle3/baseline:goodput@4"].value == pytest.approx(CONTINUITY / (8 + CONTINUITY))
    assert fmt_value(by["baseline:goodput@4"].value, "goodput@4") == "4.25"
    assert metric_label("goodput@4") == "goodput req/s @4"
    assert yaml.safe_dump(by["eagle3/baseline:goodput@4"].to_dict())  # storable as it is
