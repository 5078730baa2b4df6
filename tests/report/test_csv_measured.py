"""`orch export --format csv`: the goodput and energy columns at the end of every row (the run's, then the arm's
at that level with its CI), empty where not measured, and the columns before them unchanged."""

from __future__ import annotations

import csv
import dataclasses
import io
import statistics

import pytest

from orchestrator.config.slo import parse_slo
from orchestrator.report.csvrows import CSV_FIELDS, MEASURED_FIELDS, OPEN_LOOP_FIELDS, ab_csv, mean_ci
from orchestrator.results.goodput import run_attainment
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.stats.estimates import t_975
from tests.nightly.test_nightly_goodput import _run as goodput_run
from tests.report.test_energy_report import BASE, SPEC
from tests.report.test_energy_report import _result as energy_result

SLO = parse_slo("ttft_p99=100ms")


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_energy_columns_give_the_run_and_the_arm_with_its_ci() -> None:
    result = energy_result({"baseline": BASE, "eagle3-3step": SPEC})
    text = ab_csv(result)
    assert text.splitlines()[0].split(",") == [*CSV_FIELDS, *MEASURED_FIELDS]  # closed loop: no rate column
    got = rows(text)
    assert float(got[0]["j_per_token"]) == pytest.approx(40.0 * 0.99, abs=1e-4)
    spec = [r for r in got if r["label"] == "eagle3-3step"]
    est = result.arms[1].energy_at(1)
    assert est is not None and est.lo is not None and est.hi is not None
    for r in spec:  # the arm's figure on each of its rows, as every report gives it
        assert float(r["arm_j_per_token"]) == pytest.approx(est.j_per_token, abs=1e-4)
        assert float(r["arm_j_per_token_lo"]) == pytest.approx(est.lo, abs=1e-4)
        assert float(r["arm_j_per_token_hi"]) == pytest.approx(est.hi, abs=1e-4)
    # No --slo: the goodput columns are there, empty.
    assert {r[k] for r in got for k in MEASURED_FIELDS if "goodput" in k} == {""}


def test_nothing_measured_leaves_the_new_columns_empty_and_the_old_ones_as_they_were() -> None:
    result = energy_result({"baseline": None, "other": "no nvidia-smi"})
    got = rows(ab_csv(result))
    assert len(got) == 18 and {r[k] for r in got for k in MEASURED_FIELDS} == {""}
    assert got[0]["tok_s"] == "82.0000" and got[0]["run"] == "1" and got[-1]["label"] == "other"


def test_goodput_columns_count_requests_within_the_slo() -> None:
    good = {(0, 0): 8, (0, 1): 6, (1, 0): 8, (1, 1): 4, (2, 0): 7, (2, 1): 0}  # (block, arm) -> requests within
    launches = [
        LaunchResult(
            profile=name,
            launch_id=f"l{b}{arm}",
            runs=(goodput_run(0, good[b, arm]), goodput_run(1, good[b, arm])),
            ready_s=1.0,
            env_report={"ok": True},
            teardown={},
            spec_steps=None,
            block=b,
            position=arm,
            arm_index=arm,
        )
        for b in range(3)
        for arm, name in enumerate(("baseline", "eagle3"))
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
    got = rows(ab_csv(result))
    first = got[0]
    at = run_attainment(launches[0].runs[0], SLO)
    assert at is not None and float(first["goodput_req_s"]) == pytest.approx(at.req_s, abs=1e-4)
    assert float(first["goodput_tok_s"]) == pytest.approx(at.tok_s, abs=1e-4) and first["j_per_token"] == ""
    eagle = next(r for r in got if r["label"] == "eagle3")
    values = [g / 2.0 for g in (6, 4, 0)]  # 8 requests a 2-second run: good ones per second, each launch
    mean = statistics.fmean(values)
    half = t_975(2) * statistics.stdev(values) / 3**0.5
    assert float(eagle["arm_goodput_req_s"]) == pytest.approx(mean, abs=1e-4)
    assert float(eagle["arm_goodput_req_s_lo"]) == pytest.approx(max(0.0, mean - half), abs=1e-4) == 0.0
    assert float(eagle["arm_goodput_req_s_hi"]) == pytest.approx(mean + half, abs=1e-4)
    assert float(eagle["arm_goodput_tok_s"]) == pytest.approx(mean * 11, abs=1e-3)  # 11 tokens a request
    # Open loop: the rate column stays where it was, the new columns after it.
    launches = [dataclasses.replace(la, runs=tuple(dataclasses.replace(r, rate=4.0, concurrency=0) for r in la.runs))
                for la in launches]  # fmt: skip
    text = ab_csv(dataclasses.replace(result, launches=tuple(launches)))
    assert text.splitlines()[0].split(",") == [*CSV_FIELDS, *OPEN_LOOP_FIELDS, *MEASURED_FIELDS]
    assert rows(text)[0]["rate"] == "4" and rows(text)[0]["arm_goodput_req_s"] != ""


def test_mean_ci() -> None:
    assert mean_ci([]) == (None, None, None) and mean_ci([2.0]) == (2.0, None, None)
    mean, lo, hi = mean_ci([4.0, 5.0, 6.0])
    assert mean == 5.0 and lo == pytest.approx(5.0 - t_975(2) / 3**0.5) and hi == pytest.approx(5 + t_975(2) / 3**0.5)
    assert mean_ci([1.0, 2.0, 3.0])[1] == 0.0  # a goodput is never below 0: the interval is cut there
