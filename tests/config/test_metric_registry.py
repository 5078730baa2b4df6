"""One metric registry (config/slo): a latency or a run-level metric added in one place is taken by `--metric`,
`--slo`, the reports and the nightly's items alike (issue 38 item 4)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import slo
from orchestrator.nightly import history
from orchestrator.nightly import suite as suite_mod
from orchestrator.nightly.suite import Metric
from orchestrator.results.goodput import comparable
from orchestrator.results.load import load_result
from orchestrator.results.store import Store
from tests.faults.support import FAST


def _decode(row: Mapping[str, Any]) -> float | None:
    ttft, e2e = row.get("ttft_s"), row.get("e2e_s")
    return None if ttft is None or e2e is None else float(e2e) - float(ttft)


def _prompt_tok_s(run: Any, _slo: slo.SLO | None) -> float | None:
    return run.prompt_tokens / run.seconds if run.prompt_tokens and run.seconds > 0 else None


@pytest.fixture
def registered() -> Iterator[None]:
    """A test-only latency (decode: a request's time from its first token to its last) and a test-only run-level
    metric (prompt tokens per second), each added in one place."""
    slo.register_quantity(slo.Quantity(name="decode", words="time from first token to last", sample=_decode))
    slo.register_metric(
        slo.MetricSpec(
            name="prompt_tok_s", label="prompt tok/s", unit="tok/s", higher_is_better=True, value=_prompt_tok_s
        )
    )
    yield
    slo.unregister("decode")
    slo.unregister("prompt_tok_s")


def test_a_quantity_added_in_one_place_is_an_objective_and_its_percentiles_metrics(registered: None) -> None:
    parsed = slo.parse_slo("decode_p90=2s,ttft_p99=500ms")
    assert [o.key for o in parsed.objectives] == ["ttft_p99", "decode_p90"]
    assert slo.parse_metric("decode_p99") == "decode_p99" and not slo.METRICS["decode_p99"].higher_is_better
    row = {"ttft_s": 0.5, "e2e_s": 1.5, "tokens": 10}
    assert parsed.meets({"ttft": 0.4, "decode": 1.0}) and not parsed.meets({"ttft": 0.4, "decode": 2.5})
    assert slo.QUANTITIES["decode"].under_slo(row) == 1.0
    assert {"decode_p99", "prompt_tok_s"} <= set(suite_mod.metrics())
    assert suite_mod.as_metric("decode_p99") == "decode_p99" and suite_mod.as_metric("agg_tok_s") == "aggregate_tok_s"


def test_it_is_gone_again_once_unregistered() -> None:
    assert "decode" not in slo.QUANTITIES and "decode_p99" not in slo.METRICS and "prompt_tok_s" not in slo.METRICS
    with pytest.raises(slo.InputError, match="unknown objective 'decode_p90'"):
        slo.parse_slo("decode_p90=2s")


def test_orch_ab_judges_on_them_and_the_nightly_takes_the_same_values(
    registered: None,
    sim_profiles: Callable[..., dict[str, Path]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    profiles = sim_profiles()
    db = str(tmp_path / "r.db")
    common = ["--sim", "--blocks", "2", "--runs", "2", "--concurrency", "2", "--max-tokens", "16", *FAST]
    for metric in ("decode_p99", "prompt_tok_s"):
        args = [*common, "--metric", metric, "--slo", "decode_p90=10s", "--db", db, "--json"]
        rc = main(["ab", str(profiles["baseline"]), str(profiles["eagle3"]), *args])
        out = capsys.readouterr().out
        assert rc in (0, 4), out
        doc = json.loads(out)
        assert doc["metric"] == metric and doc["slo"] == {"decode_p90": 10.0}
        (c,) = doc["comparisons"]
        assert c["metric"] == metric and c["ratio"] is not None and c["ratio"] > 0, c
        assert c["higher_is_better"] is (metric == "prompt_tok_s")
        # Goodput counts the new objective: every request decodes 16 tokens well within 10 s, and its p90 is read.
        for arm_doc in doc["arms"]:
            got = arm_doc["by_concurrency"][0]["goodput"]
            assert got["attainment"] == 1.0 and got["slo_met"] is True, got
            (objective,) = got["objectives"]
            assert objective["objective"] == "decode_p90" and 0 < objective["value_s"] < 10, objective
    result = load_result(Store(tmp_path / "r.db"), doc["experiment_id"])
    arm = result.arms[1]
    for metric in ("decode_p99", "prompt_tok_s"):
        nightly = history.run_values(arm, Metric(metric, 2, 0.03), 2)
        ab = [[v for r in launch.timed_at(2) if (v := comparable(r, metric, result.slo))] for launch in arm.launches]
        assert nightly == ab and all(nightly), metric
    suite = {
        "suite": "reg",
        "defaults": {"host": "local", "sim": True, "workload": {"runs": 2, "max_tokens": 16, "min_run_s": 0}},
        "items": [{"name": "it", "bench": str(profiles["baseline"]), "metrics": ["decode_p99@1", "prompt_tok_s"]}],
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    (item,) = suite_mod.load(path).items
    assert [m.key for m in item.metrics] == ["decode_p99@1", "prompt_tok_s"]
    assert [m.higher_is_better for m in item.metrics] == [False, True]


def test_a_metric_registered_without_a_value_function_reads_the_runs_field_of_its_name() -> None:
    from orchestrator.results.goodput import run_value
    from orchestrator.results.run import RunResult

    run = RunResult(index=0, warmup=False, tokens=64, seconds=1.0, tok_s=64.0, prompt_tokens=12, ttft_s=0.5)
    slo.register_metric(slo.MetricSpec(name="prompt_tokens", label="prompt tokens", unit="tok", higher_is_better=True))
    try:
        assert run_value(run, "prompt_tokens") == 12.0
    finally:
        slo.unregister("prompt_tokens")


def test_a_suite_metric_that_needs_an_slo_is_refused_without_one(
    sim_profiles: Callable[..., dict[str, Path]], tmp_path: Path
) -> None:
    profiles = sim_profiles()
    for metric in ("goodput", "goodput_tok_s"):
        suite = {"suite": "s", "defaults": {"host": "local", "sim": True}}
        suite["items"] = [{"name": "it", "bench": str(profiles["baseline"]), "metrics": [metric]}]
        path = tmp_path / "suite.yaml"
        path.write_text(yaml.safe_dump(suite, sort_keys=False))
        with pytest.raises(suite_mod.SuiteError, match=f"metrics: {metric} counts requests within an SLO: add slo:"):
            suite_mod.load(path)
