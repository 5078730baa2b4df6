"""Joules per output token in the results model and every report format, over hand-built results: the arm's value
and CI over launches, the comparison with the baseline, the not-measured reasons, and silence for old results."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from orchestrator.report import html, jsondoc, markdown, text
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from orchestrator.stats.estimates import t_975

# Per block, the launch's J/token for each arm (runs spread ±1 % around it).
BASE = (40.0, 41.0, 39.5)
SPEC = (30.0, 30.6, 29.7)


def _energy(j: float, tokens: int = 2000) -> dict[str, Any]:
    return {
        "source": "nvidia-smi",
        "interval_ms": 100,
        "joules": j * tokens,
        "tokens": tokens,
        "j_per_token": j,
        "mean_w": 3302.4,
        "seconds": j * tokens / 3302.4,
        "field": "power.draw.instant",
        "coverage": 1.0,
        "max_gap_s": 0.11,
        "gpus": [{"index": i, "joules": j * tokens / 8} for i in range(8)],
        "window_s": [0.02, 10.0],
        "gpus_rule": "the GPUs holding the launch's processes",
    }


def _run(k: int, energy: dict[str, Any] | None) -> RunResult:
    return RunResult(
        index=k,
        warmup=False,
        tokens=2048,
        seconds=25.0,
        tok_s=82.0,
        prompt_tokens=30,
        ttft_s=0.02,
        aggregate_tok_s=82.0,
        metrics={"energy": energy} if energy is not None else {},
    )


def _result(energies: dict[str, tuple[float, ...] | str | None]) -> ABResult:
    """Arms named by `energies`: J/token per block, or an error every run reports, or None (no energy entry)."""
    names = tuple(energies)
    launches = []
    for b in range(3):
        for i, name in enumerate(names):
            what = energies[name]
            runs = []
            for k in range(3):
                if isinstance(what, tuple):
                    runs.append(_run(k, _energy(what[b] * (0.99, 1.0, 1.01)[k])))
                else:
                    runs.append(_run(k, {"source": "nvidia-smi", "error": what} if what else None))
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"L-{b}-{i}",
                    runs=tuple(runs),
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


def test_an_arms_energy_is_the_geometric_mean_of_its_launch_values_with_a_t_interval() -> None:
    result = _result({"baseline": BASE, "eagle3-3step": SPEC})
    base, spec = result.arms
    est = base.energy_at(1)
    assert est is not None and est.launches == 3 and est.runs == 9 and est.gpus == 8
    logs = [math.log(v) for v in BASE]
    half = t_975(2) * statistics.stdev(logs) / math.sqrt(3)
    assert est.j_per_token == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (est.lo, est.hi) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half))
    )
    assert est.mean_w == pytest.approx(3302.4) and est.fields == ("power.draw.instant",)
    assert [launch.energy_at(1) for launch in base.launches] == pytest.approx(list(BASE))
    (cmp,) = result.energy_comparisons_at(1)
    ratios = [s / b for s, b in zip(SPEC, BASE, strict=True)]
    assert cmp.estimate is not None and cmp.estimate.ratio == pytest.approx(
        math.exp(statistics.fmean(map(math.log, ratios)))
    )
    assert cmp.verdict == "less" and cmp.estimate.hi < 1.0
    assert spec.energy_missing_at(1) is None


def test_every_format_shows_joules_per_token_with_the_ci_and_the_power_field() -> None:
    result = _result({"baseline": BASE, "eagle3-3step": SPEC})
    said = text.ab_text(result)
    assert "  energy per output token at concurrency 1 (J/token:" in said
    assert "    baseline: 40.2 J/token, 95% CI [" in said and "over 3 launches (9 runs; 3302 W on 8 GPUs)" in said
    assert "    eagle3-3step vs baseline @ 1: 0.749x the energy per token, 95% CI [0.741, 0.759] over 3 blocks" in said
    assert "-> LESS energy per token by 25.1%" in said
    assert "  energy: from nvidia-smi's power.draw.instant" in said and "SIMULATED" in said
    md = markdown.ab_markdown(result)
    assert "### Energy per output token at concurrency 1" in md and "- baseline: 40.2 J/token" in md
    doc = jsondoc.ab_json(result)
    energy = doc["arms"][0]["energy"]
    assert energy["j_per_token"] == pytest.approx(40.16, abs=0.01) and energy["launch_values"] == pytest.approx(
        list(BASE)
    )
    assert energy["ci_method"] == "geometric mean of launch values; Student's t on their logs"
    assert doc["arms"][0]["by_concurrency"][0]["energy"] == energy
    assert doc["arms"][0]["runs"][0]["j_per_token"] == pytest.approx(40.0 * 0.99)
    (cmp,) = doc["energy_comparisons_by_concurrency"]
    assert cmp["verdict"] == "less" and cmp["blocks"] == 3 and len(cmp["ci95"]) == 2
    assert doc["energy_note"].startswith("energy: from nvidia-smi's power.draw.instant")
    page = html.ab_html(result)
    assert '<section id="energy"><h2>Energy per output token</h2>' in page and "eagle3-3step: 30.1 J/token" in page


def test_an_arm_without_energy_says_why_and_no_energy_anywhere_says_it_once() -> None:
    mixed = _result({"baseline": BASE, "eagle3-3step": "no nvidia-smi at /opt/smi"})
    said = text.ab_text(mixed)
    assert "    eagle3-3step: not measured (no nvidia-smi at /opt/smi)" in said
    assert "eagle3-3step vs baseline @ 1: 0" not in said.split("energy per output token")[1]
    none = _result({"baseline": "no nvidia-smi", "eagle3-3step": "no nvidia-smi"})
    said = text.ab_text(none)
    assert said.splitlines().count("  energy: not measured (no nvidia-smi)") == 1 and "J/token" not in said
    assert "energy: not measured (no nvidia-smi)" in markdown.ab_markdown(none)
    assert jsondoc.ab_json(none)["arms"][1]["energy"] == {"j_per_token": None, "not_measured": "no nvidia-smi"}


def test_results_from_before_energy_say_nothing_about_it() -> None:
    old = _result({"baseline": None, "eagle3-3step": None})
    said = text.ab_text(old)
    assert "energy" not in said and "energy" not in markdown.ab_markdown(old)
    doc = jsondoc.ab_json(old)
    assert (
        doc["energy_note"] is None
        and doc["arms"][0]["energy"] is None
        and doc["energy_comparisons_by_concurrency"] == []
    )
    assert 'id="energy"' not in html.ab_html(old)
