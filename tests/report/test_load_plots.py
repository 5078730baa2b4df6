"""The HTML report's load figures on hand-built results (no browser): which figures appear for which experiment, what
their captions and numbers tables say, and what is said instead of a figure that cannot be drawn."""

from __future__ import annotations

import dataclasses

from orchestrator.config.slo import parse_slo
from orchestrator.report.html import ab_html
from orchestrator.results import curves
from orchestrator.results.model import ABResult, Design, LaunchResult
from orchestrator.results.run import RunResult
from tests.report.test_report_html import parse
from tests.results.test_curves import _result

LOAD_FIGURES = {"fig-latency-rate", "fig-goodput-rate", "fig-pareto"}


def _figure_text(html: str, fig_id: str) -> str:
    start = html.index(f'<figure id="{fig_id}">')
    return html[start : html.index("</figure>", start)]


def test_open_loop_under_an_slo_draws_all_three_with_the_crossover_marked() -> None:
    result = _result("ttft_p99=100ms")
    (x,) = [x for _, x in result.crossovers()]
    assert x.status == "crosses" and x.at is not None  # spec: faster per user at 2 req/s, slower at 8
    html = ab_html(result)
    dom = parse(html)
    assert {f for f, drawn in dom.figures.items() if drawn} >= LOAD_FIGURES
    assert {"table-latency-rate", "table-goodput-rate", "table-pareto"} <= dom.ids
    mark = f"spec crossover ~{x.at:.3g} req/s"
    for fig in LOAD_FIGURES - {"fig-latency-rate"}:  # on the offered load's axis; the latency figure's is achieved
        assert mark in _figure_text(html, fig), fig
    assert html.index('id="load-plots"') < html.index('id="summary"')  # with the crossover, before the tables
    goodput = _figure_text(html, "fig-goodput-rate")
    assert "Goodput under the SLO ttft_p99=100ms (TTFT p99 &lt;= 100 ms)" in goodput
    assert "rate scheduled (every request good)" not in goodput  # these runs stored no schedule: no ceiling drawn
    assert "SIMULATED (orch&#x27;s simulator, not a measured server): " in goodput
    pareto = _figure_text(html, "fig-pareto")
    assert "The front, from the highest aggregate: base @ 8 req/s" in pareto and "spec @ 2 req/s" in pareto


def test_the_latency_figure_states_its_crossover_on_its_own_axis_and_the_offered_rate_once() -> None:
    # Its x axis is the achieved rate: once the legend read "crossover ~4.48 req/s (drawn at the 5.21 req/s it
    # achieved there)", two rates on one axis.
    result = _result("ttft_p99=100ms")
    (x,) = [x for _, x in result.crossovers()]
    assert x.at is not None
    latency = _figure_text(ab_html(result), "fig-latency-rate")
    (spec,) = [c for c in curves.curves(result, [curves.ACHIEVED]) if c.label == "spec"]
    achieved = spec.at_level(curves.ACHIEVED, x.at)
    assert achieved is not None and f"{achieved:.3g}" != f"{x.at:.3g}"
    assert f"spec crossover ~{achieved:.3g} req/s achieved" in latency  # the legend, in the axis's terms
    assert "drawn at the" not in latency and f"spec crossover ~{x.at:.3g} req/s" not in latency
    assert latency.count(f"~{x.at:.3g} req/s offered") == 1  # the offered load, named once, in the caption


def test_without_an_slo_there_is_no_goodput_figure_and_with_one_level_no_load_figures() -> None:
    dom = parse(ab_html(_result()))
    assert {"fig-latency-rate", "fig-pareto"} <= set(dom.figures) and "fig-goodput-rate" not in dom.figures
    one = _result()
    one = dataclasses.replace(one, launches=tuple(dataclasses.replace(la, runs=la.runs[:1]) for la in one.launches))
    dom = parse(ab_html(one))
    assert not LOAD_FIGURES & set(dom.figures) and "load-plots" not in dom.ids


def test_goodput_without_per_request_rows_is_said_not_drawn() -> None:
    result = _result("ttft_p99=100ms")
    bare = tuple(
        dataclasses.replace(la, runs=tuple(dataclasses.replace(r, per_request=()) for r in la.runs))
        for la in result.launches
    )
    html = ab_html(dataclasses.replace(result, launches=bare))
    dom = parse(html)
    assert "fig-goodput-rate" not in dom.figures and "fig-goodput-rate-missing" in dom.ids
    assert "fig-latency-rate" in dom.figures  # the stored percentiles still draw it


def test_closed_loop_levels_plot_against_concurrency_and_completed_requests_per_second() -> None:
    launches = []
    for b in range(2):
        for k, name in enumerate(("base", "spec")):
            runs = tuple(
                RunResult(
                    index=0,
                    warmup=False,
                    tokens=512,
                    seconds=4.0,
                    tok_s=(90.0 + 40 * k if c == 1 else 60.0 - 20 * k) + b,
                    prompt_tokens=10,
                    ttft_s=0.02,
                    concurrency=c,
                    aggregate_tok_s=(90.0 + 40 * k) if c == 1 else 400.0 - 80 * k,
                    requests=4 * c,
                    metrics={"ttft": {"p50": 0.02 * c, "p99": 0.03 * c}},
                    per_request=tuple({"index": j, "tokens": 64, "ttft_s": 0.02 * c, "e2e_s": 1} for j in range(4 * c)),
                )
                for c in (1, 8)
            )
            launches.append(
                LaunchResult(
                    profile=name,
                    launch_id=f"{name}-{b}",
                    runs=runs,
                    ready_s=1.0,
                    env_report={},
                    teardown={},
                    block=b,
                    position=k,
                    arm_index=k,
                )
            )
    result = ABResult(
        experiment_id="e",
        simulated=False,
        host="box",
        profiles=("base", "spec"),
        launches=tuple(launches),
        host_facts={},
        design=Design.make(2, 2, "fixed", 0),
        slo=parse_slo("ttft_p99=100ms"),
    )
    html = ab_html(result)
    assert set(parse(html).figures) >= LOAD_FIGURES
    goodput = _figure_text(html, "fig-goodput-rate")
    assert "concurrency (streams)" in goodput and "SIMULATED" not in goodput
    latency = _figure_text(html, "fig-latency-rate")
    assert "completed requests / run time at each concurrency" in latency
    # from the per-request rows (every request's TTFT 0.02 x c); 4 or 32 requests in 4 s; no spread between launches
    assert (
        "base: TTFT p99 20 [20, 20] ms at 1.00 [1.00, 1.00] req/s to 160 [160, 160] ms at 8.00 [8.00, 8.00]" in latency
    )
    assert "spec crossover ~" in _figure_text(html, "fig-pareto") and "concurrency" in _figure_text(html, "fig-pareto")
